#!/usr/bin/env bash
# The paper-uci grid (../shared/docs/EVALUATION.md) with the release binary:
# bank, mammographic (bernoulli), elevators, bike (gaussian) × folds × orders
# shuffle:0, sorted:x0 × methods dual-memory, osgpr, offline; banana on its
# train/test files; an ablation of dual-memory on bike and bank (shuffle:0).
# Every report goes under target/results/ (kept: a rerun resumes), then
# docs/RESULTS.md is written from whatever reports exist.
#
# Environment:
#   FOLDS="0 1"          folds to run (default 0 … 9); FOLDS=0 is a quick try
#   JOBS=2               runs at a time (default 1; each run uses one core)
#   DATASETS="bank …"    subset of: bank mammographic elevators bike banana
#   ABLATION=0           skip the ablation (default 1)
#   METHODS="osgpr"      subset of: dual-memory osgpr offline (default all)
#   ORDERS="shuffle:0"   subset of: shuffle:0 sorted:x0 (default both)
#   PROFILE=dev          cargo profile of the binary (default release)
#   DUALGP_SHARED=DIR    the shared folder holding data/ (default ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."

FOLDS=${FOLDS:-"0 1 2 3 4 5 6 7 8 9"}
JOBS=${JOBS:-1}
DATASETS=${DATASETS:-"bank mammographic elevators bike banana"}
ABLATION=${ABLATION:-1}
METHODS=${METHODS:-"dual-memory osgpr offline"}
ORDERS=${ORDERS:-"shuffle:0 sorted:x0"}
PROFILE=${PROFILE:-release}
BIN=target/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
DATA=${DUALGP_SHARED:-../shared}/data
OUT=target/results
COMMAND="FOLDS=\"$FOLDS\" JOBS=$JOBS DATASETS=\"$DATASETS\" ABLATION=$ABLATION METHODS=\"$METHODS\" ORDERS=\"$ORDERS\" scripts/results.sh"

cargo build --profile "$PROFILE" --quiet -p dualgp-pipelines --bin dualgp --example results_table
mkdir -p "$OUT"

likelihood() {
  case $1 in
    bank | mammographic | banana) echo bernoulli ;;
    elevators | bike) echo gaussian ;;
    *) echo "unknown data set $1 (choose from bank mammographic elevators bike banana)" >&2; exit 2 ;;
  esac
}

# One line per run still to do: the report path, then the eval flags.
todo=$(mktemp)
trap 'rm -f "$todo"' EXIT
plan() {
  local report=$1
  shift
  [[ -s $report ]] || echo "$report $*" >>"$todo"
}

for data in $DATASETS; do
  lik=$(likelihood "$data")
  for order in $ORDERS; do
    for method in $METHODS; do
      # Offline training sees all rows at once: the order changes nothing.
      [[ $method == offline && $order != shuffle:0 ]] && continue
      if [[ $data == banana ]]; then
        plan "$OUT/banana/${order/:/-}/$method.json" --data "$DATA/banana_train.parquet" \
          --test "$DATA/banana_test.parquet" --likelihood "$lik" --order "$order" --method "$method"
        continue
      fi
      for fold in $FOLDS; do
        plan "$OUT/main/$data/${order/:/-}/$method/fold$fold.json" --data "$DATA/$data.parquet" \
          --fold "$fold" --likelihood "$lik" --order "$order" --method "$method"
      done
    done
  done
  if [[ $ABLATION == 1 && ($data == bike || $data == bank) ]]; then
    for fold in $FOLDS; do
      # VARIANT=FLAG=VALUE: one flag changed from the defaults.
      for variant in memory-bls=memory-policy=bls memory-none=memory-policy=none \
        inducing-fixed=inducing-policy=fixed past-scaled-memory=m-past=scaled-memory; do
        IFS== read -r name flag value <<<"$variant"
        plan "$OUT/ablation/$data/$name/fold$fold.json" --data "$DATA/$data.parquet" --fold "$fold" \
          --likelihood "$lik" --order shuffle:0 --method dual-memory "--$flag" "$value"
      done
    done
  fi
done

# Runs one line of the plan; the report appears only when the run succeeded.
run_one() {
  local report=$1
  shift
  mkdir -p "$(dirname "$report")"
  local start ms
  start=$(date +%s%N)
  if "$BIN/dualgp" eval "$@" --report "$report.tmp" >"${report%.json}.log" 2>&1; then
    mv "$report.tmp" "$report"
    ms=$((($(date +%s%N) - start) / 1000000))
    printf '%s\t%d.%03d\n' "$report" $((ms / 1000)) $((ms % 1000)) >>target/results/timings.tsv
    printf 'done in %d.%03d s: %s\n' $((ms / 1000)) $((ms % 1000)) "$report"
  else
    echo "FAILED: $report (see ${report%.json}.log)"
    return 1
  fi
}
export -f run_one
export BIN

total=$(wc -l <"$todo")
echo "$total runs to do ($JOBS at a time); reports under $OUT/"
status=0
xargs -P "$JOBS" -L 1 bash -c 'run_one "$@"' _ <"$todo" || status=$?

"$BIN/examples/results_table" "$OUT" docs/RESULTS.md "$COMMAND" "$(date -u '+%Y-%m-%d %H:%M UTC')"
echo "wrote docs/RESULTS.md"
exit "$status"
