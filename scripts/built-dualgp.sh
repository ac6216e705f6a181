#!/usr/bin/env bash
# Prints the path of the dualgp binary an experiment script runs: its
# argument if one is given (a binary built elsewhere), else the release
# build, built first. Run from the project root.
set -euo pipefail
if [ -n "${1:-}" ]; then
  echo "$1"
  exit
fi
cargo build -q --release -p dualgp-pipelines --bin dualgp
echo "${CARGO_TARGET_DIR:-target}/release/dualgp"
