#!/usr/bin/env bash
# Seed 000's Fig. 3, the lunar lander by batch Bayesian optimisation
# (scripts/lunar_lander.py says how). Installs gymnasium, Box2D and pyarrow
# into target/lander-venv on first use (from the Python package registry),
# builds dualgp unless LANDER_BIN names one, and writes the evaluated points
# and lander.json into target/lander (LANDER_OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/lander-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import gymnasium, Box2D, pyarrow" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "gymnasium==1.*" "Box2D==2.3.10" "pyarrow>=15" numpy
fi
bin=$(scripts/built-dualgp.sh "${LANDER_BIN:-}")
exec "$venv/bin/python" scripts/lunar_lander.py "$bin" "${LANDER_OUT:-target/lander}"
