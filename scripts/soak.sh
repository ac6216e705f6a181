#!/usr/bin/env bash
# Crash-safety soak (issue 18): a local broker, `dualgp serve` killed with
# SIGKILL at random moments and restarted each time, then the checks of
# pipelines/tests/soak.rs. SOAK_KILLS (default 20), SOAK_RECORDS (20 000)
# and SOAK_SEED (1) change the run; the figures go to target/soak.json.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p dualgp-pipelines --test soak -- --ignored --nocapture "$@"
