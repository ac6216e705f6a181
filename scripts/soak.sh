#!/usr/bin/env bash
# Crash-safety soaks (issue 18): a local broker, `dualgp serve` killed with
# SIGKILL at random moments and restarted each time, then the checks of
# pipelines/tests/soak.rs; once on one process, once on a cluster of two
# (either process killed). SOAK_KILLS (default 20), SOAK_RECORDS (20 000)
# and SOAK_SEED (1) change both runs; the figures go to soak.json and
# soak-two-processes.json in the target directory. A test name filter picks
# one: `scripts/soak.sh two_process`, `scripts/soak.sh serve_killed`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p dualgp-pipelines --test soak -- --ignored --nocapture "$@"
