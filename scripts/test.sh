#!/usr/bin/env bash
# The project's test command (README quick start, CI): everything the tests
# need is set up here, then the whole workspace is tested.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
cargo nextest run --workspace --no-fail-fast "$@"
cargo test --workspace --doc --quiet
