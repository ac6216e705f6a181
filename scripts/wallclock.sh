#!/usr/bin/env bash
# Seed 000's Fig. 7: test NLPD against the wall-clock time of learning, for
# dual-memory and osgpr (Bui et al. 2017) when only the variational
# parameters are learned (`--m-steps 0`: the kernel's and the likelihood's
# hyperparameters and the inducing inputs' search held; each learner fits
# its q over the batch: dual-memory by its E-steps, osgpr by its natural-
# gradient fixed point for a Bernoulli q(b)). The paper uses 'adult', which
# is not obtainable here; bank is Bernoulli too. Fold F of bank held out,
# the rest in WALL_BATCHES batches (default 40) in the file's order.
# Writes each fold's reports (JSON) and fold 0's figure into
# docs/figures/wallclock/ and prints a markdown table over WALL_FOLDS folds
# (default 5). WALL_BIN: a built dualgp (otherwise the release build).
set -euo pipefail
cd "$(dirname "$0")/.."
batches=${WALL_BATCHES:-40}
folds=${WALL_FOLDS:-5}
out=${WALL_OUT:-docs/figures/wallclock}
bin=$(scripts/built-dualgp.sh "${WALL_BIN:-}")
mkdir -p "$out"
methods=(dual-memory osgpr)
for fold in $(seq 0 $((folds - 1))); do
  for method in "${methods[@]}"; do
    "$bin" eval --data ../shared/data/bank.parquet --likelihood bernoulli --fold "$fold" \
      --method "$method" --batches "$batches" --m-steps 0 \
      --report "$out/${method}_fold$fold.json" >/dev/null
  done
done
"$bin" curves --metric test_nlpd --against seconds \
  --title "bank, fold 0: test NLPD against seconds of learning (hyperparameters held)" \
  --report "dual-memory=$out/dual-memory_fold0.json" --report "osgpr=$out/osgpr_fold0.json" \
  --output "$out/nlpd_wallclock.svg" >/dev/null
python3 - "$out" "$folds" "${methods[@]}" <<'EOF'
import json, statistics, sys
out, folds, methods = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def settled(report):
    """Seconds of learning until the NLPD first comes within 0.01 of its last."""
    batches, elapsed = report["batches"], 0.0
    for b in batches:
        elapsed += b["seconds"]
        if abs(b["test_nlpd"] - batches[-1]["test_nlpd"]) <= 0.01:
            return elapsed

print("| learner | test NLPD after the last batch (mean over folds) | seconds of learning (median over folds) | seconds until within 0.01 of its last NLPD (median over folds) | NLPD after the first batch |")
print("|---|---|---|---|---|")
for m in methods:
    runs = [json.load(open(f"{out}/{m}_fold{f}.json")) for f in range(folds)]
    nlpd = statistics.mean(r["batches"][-1]["test_nlpd"] for r in runs)
    seconds = statistics.median(sum(b["seconds"] for b in r["batches"]) for r in runs)
    first = statistics.mean(r["batches"][0]["test_nlpd"] for r in runs)
    within = statistics.median(settled(r) for r in runs)
    print(f"| {m} | {nlpd:.4f} | {seconds:.3f} | {within:.3f} | {first:.4f} |")
EOF
