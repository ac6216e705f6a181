#!/usr/bin/env bash
# Bounded state (issue 18): `dualgp serve` with the defaults over a million
# records from a local broker, its resident memory at a tenth of the stream
# and at the end (pipelines/tests/rss.rs). RSS_RECORDS (1 000 000) changes
# the run; the figures go to target/rss.json.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p dualgp-pipelines --test rss -- --ignored --nocapture "$@"
