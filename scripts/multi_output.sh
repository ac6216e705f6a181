#!/usr/bin/env bash
# Multi-output streams (issue 19): the issue's heterogeneous stream (seed 002's
# toy as u1, 3 sin(1.5πx) as u2; output 0 Gaussian on 80 % of the rows,
# output 1 probit Bernoulli on 20 %), learned by the multi-output model
# (Q = 2) sequentially (sorted by x and shuffled, 10 batches) and offline,
# against single-output learners given only output 1's rows. Prints a
# markdown section for docs/RESULTS.md. MO_N (2000) train rows, MO_SEED (0),
# MO_PROFILE (release; dev reuses a test build, same numbers, slower).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${MO_N:-2000}
seed=${MO_SEED:-0}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
profile=${MO_PROFILE:-release}
out=$([ "$profile" = dev ] && echo debug || echo "$profile")
cargo build -q --profile "$profile" --example multi_output_toys -p dualgp
cargo build -q --profile "$profile" -p dualgp-pipelines --bin dualgp
target=${CARGO_TARGET_DIR:-target}
"$target/$out/examples/multi_output_toys" "$dir" "$n" "$seed" >/dev/null
bin="$target/$out/dualgp"
multi=(--data "$dir/heterogeneous_train.parquet" --test "$dir/heterogeneous_test.parquet"
  --likelihood gaussian,bernoulli --latents 2 --batches 10)
single=(--data "$dir/heterogeneous_train_output1.parquet" --test "$dir/heterogeneous_test_output1.parquet"
  --likelihood bernoulli --batches 10)
"$bin" eval "${multi[@]}" --order sorted:x0 --report "$dir/multi_sorted.json" >/dev/null
"$bin" eval "${multi[@]}" --order shuffle:0 --report "$dir/multi_shuffled.json" >/dev/null
"$bin" eval "${multi[@]}" --method offline --report "$dir/multi_offline.json" >/dev/null
"$bin" eval "${single[@]}" --order sorted:x0 --report "$dir/single_sorted.json" >/dev/null
"$bin" eval "${single[@]}" --order shuffle:0 --report "$dir/single_shuffled.json" >/dev/null
"$bin" eval "${single[@]}" --method offline --report "$dir/single_offline.json" >/dev/null
python3 - "$dir" "$n" "$seed" <<'PY'
import json, sys
d, n, seed = sys.argv[1], sys.argv[2], sys.argv[3]
def final(name):
    return json.load(open(f"{d}/{name}.json"))["final"]
print(f"N = {n} train rows, {int(n) // 2} test rows, seed {seed}; test NLPD after the last batch (targets of output 0 standardised)\n")
print("| model | order | NLPD output 0 | RMSE output 0 | NLPD output 1 | accuracy output 1 | seconds |")
print("|---|---|---|---|---|---|---|")
for name, label, order in [("multi_sorted", "multi-output, Q = 2", "sorted:x0"),
                           ("multi_shuffled", "multi-output, Q = 2", "shuffle:0"),
                           ("multi_offline", "multi-output, Q = 2, offline", "all data")]:
    f = final(name)
    print(f"| {label} | {order} | {f['test_nlpd_by_output']['0']:.3f} | {f['test_rmse_by_output']['0']:.3f} | "
          f"{f['test_nlpd_by_output']['1']:.3f} | {f['test_accuracy_by_output']['1']:.3f} | {f['seconds_total']:.1f} |")
for name, label, order in [("single_sorted", "output 1 alone (bernoulli)", "sorted:x0"),
                           ("single_shuffled", "output 1 alone (bernoulli)", "shuffle:0"),
                           ("single_offline", "output 1 alone, offline", "all data")]:
    f = final(name)
    print(f"| {label} | {order} | | | {f['test_nlpd']:.3f} | {f['test_accuracy']:.3f} | {f['seconds_total']:.1f} |")
PY
