#!/usr/bin/env python3
"""Streams that change, and River's online models as the yardstick (issue 46).

Builds drifting streams from the shared data and two generated ones, runs
`dualgp replay` on each in epochs of 50 and of 1000, and River's online
models prequentially (each record predicted, then learned, one at a time),
and prints one markdown table: mean absolute error for regression, accuracy
and log loss for classification. Run it through `scripts/river.sh`, which
installs River and pyarrow in a virtual environment of its own.

Arguments: DUALGP (a built binary) and OUT (a directory for the streams,
the predictions and `yardstick.json`). RIVER_ROWS caps the rows taken from
each shared data set before sorting (default 5000). dualgp runs without
forgetting, with `--forget-half-life auto`, with the half-life
RIVER_HALF_LIFE (default 500 records), and, on streams with a date, with
`--time-column` on it. River also runs as dualgp does in epochs of 50 (each
epoch predicted by the model of the epochs before it, then learned), so that
the two are compared on the same information.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from river import forest, linear_model, neighbors, preprocessing

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
ROWS = int(os.environ.get("RIVER_ROWS", "5000"))
HALF_LIFE = os.environ.get("RIVER_HALF_LIFE", "500")


def from_shared(name, sort_by, rows=ROWS):
    """The first `rows` rows of a shared data set, sorted by one input."""
    table = pq.read_table(os.path.join(DATA, f"{name}.parquet")).slice(0, rows)
    order = np.argsort(table.column(sort_by).to_numpy(), kind="stable")
    return table.take(pa.array(order))


def generated(kind, n=5000, seed=0):
    """A level that jumps halfway (`jump`), a level that wanders as a random
    walk with the date (in years, a record a day) as input `x2` (`walk`), or
    inputs that drift past the first epoch's range (`drift`)."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    if kind == "jump":
        x = rng.uniform(-2, 2, size=(n, 2))
        y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 2.0 * (i >= n // 2) + rng.normal(0, 0.1, n)
    elif kind == "walk":
        x = np.column_stack([rng.uniform(-2, 2, size=(n, 2)), 2020 + i / 365])
        level = np.cumsum(rng.normal(0, 0.05, n))
        y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + level + rng.normal(0, 0.1, n)
    else:
        x0 = 4 * i / n - 2 + rng.uniform(-0.1, 0.1, n)
        x = np.column_stack([x0, rng.uniform(-1, 1, n)])
        y = np.sin(3 * x[:, 0]) + 0.3 * x[:, 1] + rng.normal(0, 0.1, n)
    columns = {"id": pa.array(i, pa.int64())}
    columns.update({f"x{j}": pa.array(x[:, j]) for j in range(x.shape[1])})
    columns["y"] = pa.array(y)
    return pa.table(columns)


def features(table):
    return [c for c in table.column_names if c.startswith("x")]


def scores(kind, y, predicted):
    """MAE for regression; accuracy and log loss for `predicted` P(y = 1)."""
    y = np.asarray(y, float)
    p = np.asarray(predicted, float)
    if kind == "regression":
        return {"mae": float(np.mean(np.abs(y - p)))}
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return {
        "accuracy": float(np.mean((p >= 0.5) == (y == 1))),
        "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
    }


def river_models(kind):
    if kind == "regression":
        return {
            "linear regression": lambda: preprocessing.StandardScaler() | linear_model.LinearRegression(),
            "KNN": lambda: preprocessing.StandardScaler() | neighbors.KNNRegressor(),
            # Scaled as the others: its leaves' linear models diverge on raw inputs.
            "adaptive random forest": lambda: preprocessing.StandardScaler() | forest.ARFRegressor(seed=0),
        }
    return {
        "logistic regression": lambda: preprocessing.StandardScaler() | linear_model.LogisticRegression(),
        "KNN": lambda: preprocessing.StandardScaler() | neighbors.KNNClassifier(),
        "adaptive random forest": lambda: forest.ARFClassifier(seed=0),
    }


def run_river(make, kind, table, epoch=1):
    """Prequential: each `epoch` records predicted, then learned (one at a
    time when `epoch` is 1). With epochs the first is left out of the
    scores, as dualgp's replay scores it by the prior."""
    model = make()
    names = features(table)
    xs = [dict(zip(names, row)) for row in zip(*(table.column(n).to_pylist() for n in names))]
    ys = table.column("y").to_pylist()
    predicted = []
    for start in range(0, len(xs), epoch):
        batch = list(zip(xs[start:start + epoch], ys[start:start + epoch]))
        for x, _ in batch:
            if kind == "regression":
                guess = model.predict_one(x)
                predicted.append(0.0 if guess is None else guess)
            else:
                proba = model.predict_proba_one(x)
                predicted.append(proba.get(1, proba.get(True, 0.5)) if proba else 0.5)
        for x, y in batch:
            model.learn_one(x, y if kind == "regression" else int(y))
    skip = 0 if epoch == 1 else epoch
    return scores(kind, ys[skip:], predicted[skip:])


def run_dualgp(dualgp, kind, stream, batch, out, flags=()):
    out = f"{out}.b{batch}" + "".join(flags).replace("-", "")
    predictions = f"{out}.parquet"
    likelihood = "gaussian" if kind == "regression" else "bernoulli"
    command = [dualgp, "replay", "--data", stream, "--likelihood", likelihood, "--workers", "2",
               "--batch-size", str(batch), "--output", predictions, "--report", f"{out}.json", *flags]
    subprocess.run(command, check=True, capture_output=True)
    got = pq.read_table(predictions).to_pydict()
    labels = dict(zip(*(pq.read_table(stream, columns=["id", "y"]).to_pydict()[c] for c in ("id", "y"))))
    ys = [labels[i] for i in got["id"]]
    column = "mean" if kind == "regression" else "p1"
    result = scores(kind, ys, got[column])
    # The first epoch is the prior's: scored apart so that River's epochs compare.
    later = [k for k, e in enumerate(got["epoch"]) if e > 0]
    result["after_first_epoch"] = scores(kind, [ys[k] for k in later], [got[column][k] for k in later])
    result["prequential_nlpd"] = json.load(open(f"{out}.json"))["prequential_nlpd"]
    return result


def main():
    dualgp, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    streams = {
        "kin40k by x0": ("regression", from_shared("kin40k", "x0")),
        "elevators by x0": ("regression", from_shared("elevators", "x0")),
        "bank by x0": ("classification", from_shared("bank", "x0")),
        "sunspots in time order": ("regression", pq.read_table(os.path.join(os.path.dirname(__file__), "..", "data", "sunspots.parquet"))),
        "a level that jumps halfway": ("regression", generated("jump")),
        "a level that wanders, with its date": ("regression", generated("walk")),
        "inputs that drift past the first epoch's range": ("regression", generated("drift")),
    }
    results = {}
    for name, (kind, table) in streams.items():
        slug = "".join(c if c.isalnum() else "_" for c in name)
        path = os.path.join(out, f"{slug}.parquet")
        pq.write_table(table.select(["id"] + features(table) + ["y"]), path)
        row = {"kind": kind, "rows": table.num_rows}
        for variant, forget in dualgp_variants(TIME_COLUMNS.get(name)).items():
            for batch in (50, 1000):
                row[f"dualgp{variant}, epochs of {batch}"] = None if forget is None else run_dualgp(
                    dualgp, kind, path, batch, os.path.join(out, slug), forget)
        for model, make in river_models(kind).items():
            for epoch in (1, 50):
                key = f"River {model}" + ("" if epoch == 1 else f", epochs of {epoch}")
                started = time.time()
                row[key] = run_river(make, kind, table, epoch)
                row[key]["seconds"] = time.time() - started
        results[name] = row
        print(f"{name}: done", file=sys.stderr)
    json.dump(results, open(os.path.join(out, "yardstick.json"), "w"), indent=2)
    print_table(results)


# The streams whose date a user would mark as time, and the flags that do it
# (sunspots' date is its only input, so it stays one).
TIME_COLUMNS = {
    "a level that wanders, with its date": ("--time-column", "x2"),
    "sunspots in time order": ("--time-column", "x0", "--features", "x0"),
}


def dualgp_variants(time_column=None):
    """dualgp's runs by the suffix of their column: no forgetting, automatic,
    a fixed half-life, and the date as time (None: the stream has no date)."""
    return {"": (), " auto": ("--forget-half-life", "auto"),
            f" {HALF_LIFE}": ("--forget-half-life", HALF_LIFE),
            " time column": time_column}


def print_table(results):
    """One row per stream: MAE (regression) or accuracy / log loss
    (classification) of each learner, each epoch size; then dualgp's
    prequential NLPD by variant."""
    variants = list(dualgp_variants())
    river = ["linear", "KNN", "forest"]
    learners = [f"dualgp{v}, {b}" for v in variants for b in (50, 1000)] + [f"River {m}" for m in river]
    shown = lambda kind, f: "—" if f is None else (
        f"{f['mae']:.3f}" if kind == "regression" else f"{f['accuracy']:.3f} / {f['log_loss']:.3f}")
    print("| stream | rows | " + " | ".join(learners) + " |")
    print("|---|---|" + "---|" * len(learners))
    for name, row in results.items():
        one_at_a_time = [v for k, v in row.items() if k.startswith("River") and "epochs" not in k]
        figures = [v for k, v in row.items() if k.startswith("dualgp")] + one_at_a_time
        print(f"| {name} | {row['rows']} | " + " | ".join(shown(row["kind"], f) for f in figures) + " |")
    print()
    print("Epochs of 50 on both sides, the first epoch left out:")
    print()
    same = [f"dualgp{v}, 50" for v in variants] + [f"River {m}, 50" for m in river]
    print("| stream | " + " | ".join(same) + " |")
    print("|---|" + "---|" * len(same))
    for name, row in results.items():
        ours = [row[f"dualgp{v}, epochs of 50"] for v in variants]
        figures = [None if f is None else f["after_first_epoch"] for f in ours] + [
            v for k, v in row.items() if k.startswith("River") and k.endswith("epochs of 50")]
        print(f"| {name} | " + " | ".join(shown(row["kind"], f) for f in figures) + " |")
    print()
    print("| stream | " + " | ".join(learners[:2 * len(variants)]) + " |")
    print("|---|" + "---|" * (2 * len(variants)))
    for name, row in results.items():
        figures = [v for k, v in row.items() if k.startswith("dualgp")]
        print(f"| {name} | " + " | ".join("—" if f is None else f"{f['prequential_nlpd']:.3f}" for f in figures) + " |")


if __name__ == "__main__":
    main()
