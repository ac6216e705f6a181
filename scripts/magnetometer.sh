#!/usr/bin/env bash
# Seed 000's Fig. 5 (magnetic anomalies mapped by a wheeled robot, 9 paths in
# a 6 m × 6 m room) with `dualgp eval`: dual-memory against osgpr (Bui et
# al. 2017) and the offline fit, all at the same m, fold 0 held out (never
# learned from), the field magnitude standardised with the training rows.
#   (a) paths: one batch per path (`--epoch-column path`), the model never
#       sees an earlier path again;
#   (b) exploration: the same rows in the robot's time order cut into
#       MAG_STEPS small batches (default 100, about 680 rows or 14 s of
#       driving each).
# The file's `id` order is path, then `t` within the path (each path is its
# own recording and its `t` restarts), so `--order id` is the order the robot
# drove them in; no other order is needed.
# A fourth learner, "dual-memory-9000", is dual-memory with a memory of
# 9000 points (13 % of the training rows) instead of the default 1000,
# filled evenly over the stream, and in (b) an M-step at every batch
# (--m-every 0): what comes closest to offline at m = 100 (docs/RESULTS.md).
# Writes reports (JSON), RMSE/NLPD/seconds curves and the maps after each
# path into docs/figures/magnetometer/ and prints a markdown table.
# MAG_BIN (a built dualgp; otherwise the release build), MAG_STEPS (100),
# MAG_EXTRA (flags added to every run, e.g. "--inducing 200"),
# MAG_OUT (docs/figures/magnetometer), MAG_PARTS ("a b"), MAG_MAPS (1),
# MAG_RESUME (1: keep the reports already there, run only the missing).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${MAG_STEPS:-100}
out=${MAG_OUT:-docs/figures/magnetometer}
parts=${MAG_PARTS:-a b}
read -r -a extra <<<"${MAG_EXTRA:-}"
bin=$(scripts/built-dualgp.sh "${MAG_BIN:-}")
mkdir -p "$out"
data=../shared/data/magnetometer.parquet
# The paper's prior: a constant plus a Matérn kernel over position, Gaussian
# noise, every hyperparameter learned as the data arrive.
common=(--data "$data" --fold 0 --likelihood gaussian --bias true --order id "${extra[@]}")

run() { # part name method extra-flags…
  local part=$1 name=$2 method=$3
  shift 3
  local report=$out/${part}_$name.json started=$SECONDS
  if [ "${MAG_RESUME:-0}" = 1 ] && [ -f "$report" ]; then
    return
  fi
  "$bin" eval "${common[@]}" --method "$method" "$@" --report "$report" >/dev/null
  echo "$part $name: $((SECONDS - started)) s wall" >&2
}

# Both set-ups learn the same training rows: one offline fit is the line for both.
run both offline offline

for part in $parts; do
  case $part in
    a)
      split=(--epoch-column path) big=(--memory-per-batch 1000 --memory-capacity 9000)
      big_label="dual-memory, memory 9000"
      ;;
    b)
      split=(--batches "$steps") big=(--memory-per-batch $((9000 / steps)) --memory-capacity 9000 --m-every 0)
      big_label="dual-memory, memory 9000, M-step every batch"
      ;;
    *) echo "MAG_PARTS: a or b, not $part" >&2 && exit 2 ;;
  esac
  maps=()
  if [ "${MAG_MAPS:-1}" = 1 ]; then
    # (a): a map after every path; (b): after every fifth of the stream.
    every=$([ "$part" = a ] && echo 1 || echo $((steps / 5 > 0 ? steps / 5 : 1)))
    [ "${MAG_RESUME:-0}" = 1 ] || rm -rf "$out/maps_$part"
    maps=(--maps "$out/maps_$part" --maps-every "$every")
  fi
  run "$part" dual-memory dual-memory "${split[@]}" "${maps[@]}"
  run "$part" osgpr osgpr "${split[@]}"
  run "$part" dual-memory-9000 dual-memory "${split[@]}" "${big[@]}"
  for metric in test_rmse test_nlpd seconds; do
    "$bin" curves --metric "$metric" --output "$out/${part}_$metric.svg" \
      --title "magnetometer ($part), fold 0 held out: $metric after each batch" \
      --report "dual-memory=$out/${part}_dual-memory.json" \
      --report "$big_label=$out/${part}_dual-memory-9000.json" \
      --report "osgpr (Bui et al.)=$out/${part}_osgpr.json" \
      --report "offline, all training rows=$out/both_offline.json" >/dev/null
  done
done

# RMSE back in µT: eval standardises y with the training rows' mean and
# (population) sd, so RMSE scales by that sd.
python3 - "$out" "$parts" "$data" <<'PY'
import json, sys
import pyarrow.compute as pc, pyarrow.parquet as pq
out, parts, data = sys.argv[1], sys.argv[2].split(), sys.argv[3]
table = pq.read_table(data, columns=["fold", "y"])
train_y = table.filter(pc.not_equal(table["fold"], 0))["y"]
sd = pc.stddev(train_y, ddof=0).as_py()
print(f"training rows {len(train_y)}, their field sd {sd:.3f} µT\n")
print("| set-up | learner | batches | final test RMSE | RMSE (µT) | final test NLPD | s per batch (mean) | s learning |")
print("|---|---|---|---|---|---|---|---|")
for part in parts:
    for method in ["dual-memory", "dual-memory-9000", "osgpr", "offline"]:
        r = json.load(open(f"{out}/{'both' if method == 'offline' else part}_{method}.json"))
        f, b = r["final"], r["batches"]
        per = f["seconds_total"] / len(b)
        print(f"| ({part}) | {method} | {len(b)} | {f['test_rmse']:.4f} | {f['test_rmse'] * sd:.2f} "
              f"| {f['test_nlpd']:.4f} | {per:.3f} | {f['seconds_total']:.1f} |")
PY
