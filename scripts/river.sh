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
bin=$(scripts/built-dualgp.sh "${RIVER_BIN:-}")
exec "$venv/bin/python" scripts/river_yardstick.py "$bin" "${RIVER_OUT:-target/river}"
