#!/usr/bin/env bash
# Multi-output streams (issue 19): the issue's heterogeneous stream (seed 002's
# toy as u1, 3 sin(1.5πx) as u2; output 0 Gaussian on 80 % of the rows,
# output 1 probit Bernoulli on 20 %), learned by the multi-output model
# (Q = 2) sequentially (sorted by x and shuffled, 10 batches) and offline,
# against single-output learners given only output 1's rows, and the floor
# under all of them: output 1's test NLPD under its true latent. Prints a
# markdown section for docs/RESULTS.md. MO_N (2000) train rows, MO_TEST
# (20000: 4000 of output 1, so that differences of 0.01 are not noise) test
# rows, MO_SEED (0), MO_PROFILE (release; dev reuses a test build, same
# numbers, slower).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${MO_N:-2000}
n_test=${MO_TEST:-20000}
seed=${MO_SEED:-0}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
profile=${MO_PROFILE:-release}
out=$([ "$profile" = dev ] && echo debug || echo "$profile")
cargo build -q --profile "$profile" --example multi_output_toys -p dualgp
cargo build -q --profile "$profile" -p dualgp-pipelines --bin dualgp
target=${CARGO_TARGET_DIR:-target}
"$target/$out/examples/multi_output_toys" "$dir" "$n" "$seed" "$n_test" >/dev/null
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
python3 - "$dir" "$n" "$seed" "$n_test" <<'PY'
import json, sys
d, n, seed, n_test = sys.argv[1:5]
def final(name):
    return json.load(open(f"{d}/{name}.json"))["final"]
print(f"N = {n} train rows, {n_test} test rows, seed {seed}; test NLPD after the last batch (targets of output 0 standardised)\n")
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
oracle = json.load(open(f"{d}/heterogeneous_oracle.json"))["output1_test_nlpd"]
print(f"| oracle: output 1's true latent | | | | {oracle:.3f} | | |")
PY
