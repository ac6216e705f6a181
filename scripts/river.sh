#!/usr/bin/env bash
# Issue 46's yardstick: dualgp against River's online models on drifting
# streams (scripts/river_yardstick.py says which). Installs River and
# pyarrow into target/river-venv on first use (from the Python package
# registry), builds dualgp unless RIVER_BIN names one, and writes the
# streams, the predictions and yardstick.json into target/river.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/river-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import river, pyarrow" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "river==0.26.1" "pyarrow>=15" "numpy"
fi
if [ -n "${RIVER_BIN:-}" ]; then
  bin=$RIVER_BIN
else
  cargo build -q --release -p dualgp-pipelines --bin dualgp
  bin=${CARGO_TARGET_DIR:-target}/release/dualgp
fi
exec "$venv/bin/python" scripts/river_yardstick.py "$bin" "${RIVER_OUT:-target/river}"
