#!/usr/bin/env bash
# Seed 000's Fig. 3, the lunar lander by batch Bayesian optimisation
# (scripts/lunar_lander.py says how). Installs gymnasium, Box2D and pyarrow
# into target/lander-venv on first use (from the Python package registry),
# builds dualgp unless LANDER_BIN names one, and writes the evaluated points
# and lander.json into target/lander (LANDER_OUT), and the reward curves
# with a copy of lander.json to docs/figures/lander.svg (LANDER_FIGURE).
# LANDER_STARTS etc.: see scripts/lunar_lander.py.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/lander-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import gymnasium, Box2D, pyarrow" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "gymnasium==1.*" "Box2D==2.3.10" "pyarrow>=15" numpy
fi
bin=$(scripts/built-dualgp.sh "${LANDER_BIN:-}")
out=${LANDER_OUT:-target/lander}
"$venv/bin/python" scripts/lunar_lander.py "$bin" "$out"
runs=()
for file in "$out"/best.*.json; do # one a method (lunar_lander.py's METHODS)
  method=${file##*/best.}
  method=${method%.json}
  runs+=(--runs "${method//_/ }=$file")
done
"$bin" curves "${runs[@]}" --metric "best reward" --steps "function evaluations" \
  --title "Lunar lander: best reward so far (median and quartiles over the starts)" \
  --output "${LANDER_FIGURE:=docs/figures/lander.svg}"
cp "$out/lander.json" "${LANDER_FIGURE%.svg}.json"
