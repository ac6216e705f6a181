#!/usr/bin/env python3
"""Seed 000's Fig. 3: landing gymnasium's lunar lander by batch Bayesian
optimisation, driven through `dualgp suggest` as a user's experiment loop
would drive it (issue 45).

The search space is [0, 2]^12: the twelve constants of the heuristic
controller in gymnasium's `lunar_lander` module (its gains, the angle clip
and the two thresholds; the defaults are a point of the box), as in Eriksson
et al. (2019). An evaluation flies the controller on LANDER_SEEDS fixed
environment seeds: its reward is the mean episode return, and it succeeded
when the lander came to rest on the ground, rather than crashing, flying
off or hovering, on at least half of them (LANDER_SUCCESS_SHARE: a landing
on every seed is so rare that a success model learns nothing from it). Each method starts from LANDER_INIT random points and evaluates
up to LANDER_EVALS points in all:

- `batch`: batches of 3 by fantasies (Alg. 2): expected improvement of the
  reward model times the success model's probability (`--success-target`);
- `one at a time`: the same with batches of 1;
- `parallel kriging`: batches of 3, the model an exact GP (`--method
  offline` with every point an inducing input) and fantasies at its mean
  (Ginsbourger et al. 2010's kriging believer);
- `random`: uniform points.

Arguments: DUALGP (a built binary) and OUT (a directory for the evaluated
points, `lander.json`: each method's best reward after each evaluation,
per start, and its wall time, and `best.METHOD.json`: the same curves for
`dualgp curves --runs`). LANDER_STARTS random starts (default 5).
Run it through `scripts/lunar_lander.sh`, which installs gymnasium and Box2D.
"""

import json
import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

D = 12
STARTS = int(os.environ.get("LANDER_STARTS", "5"))
INIT = int(os.environ.get("LANDER_INIT", "24"))
EVALS = int(os.environ.get("LANDER_EVALS", "90"))
SEEDS = range(int(os.environ.get("LANDER_SEEDS", "10")))
SUCCESS_SHARE = float(os.environ.get("LANDER_SUCCESS_SHARE", "0.5"))
BOUNDS = ";".join(["0,2"] * D)


def controller(w, s):
    """gymnasium's heuristic with its twelve constants taken from `w`
    (the defaults: 0.5, 1, 0.4, 0.55, 0.5, 1, 0.5, 0.5, 0, 0.5, 0.05, 0.05)."""
    angle_targ = np.clip(s[0] * w[0] + s[2] * w[1], -w[2], w[2])
    hover_targ = w[3] * abs(s[0])
    angle_todo = (angle_targ - s[4]) * w[4] - s[5] * w[5]
    hover_todo = (hover_targ - s[1]) * w[6] - s[3] * w[7]
    if s[6] or s[7]:
        angle_todo = w[8]
        hover_todo = -s[3] * w[9]
    if hover_todo > abs(angle_todo) and hover_todo > w[10]:
        return 2
    if angle_todo < -w[11]:
        return 3
    if angle_todo > w[11]:
        return 1
    return 0


def evaluate(env, w):
    """The mean return over the fixed seeds, and whether enough episodes landed."""
    returns, landed = [], []
    for seed in SEEDS:
        s, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            s, r, terminated, truncated, _ = env.step(controller(w, s))
            total += r
            done = terminated or truncated
        # At rest on the ground the lander sleeps; a crash or a flight off
        # the screen ends the episode awake, and a timeout never lands.
        landed.append(terminated and not env.unwrapped.lander.awake)
        returns.append(total)
    return float(np.mean(returns)), bool(np.mean(landed) >= SUCCESS_SHARE)


def write_evaluated(path, xs, ys, landed):
    columns = {"id": pa.array(range(len(xs)), pa.int64())}
    columns.update({f"x{j}": pa.array([x[j] for x in xs]) for j in range(D)})
    columns["y"] = pa.array(ys)
    columns["landed"] = pa.array([float(v) for v in landed])
    pq.write_table(pa.table(columns), path)


def suggest(dualgp, path, k, seed, flags):
    command = [dualgp, "suggest", "--data", path, "--likelihood", "gaussian", "--bounds", BOUNDS,
               "--batch", str(k), "--maximize", "--success-target", "landed", "--seed", str(seed), *flags]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["points"]


METHODS = {
    "batch": (3, ()),
    "one at a time": (1, ()),
    "parallel kriging": (3, ("--method", "offline", "--inducing", str(EVALS))),
    "random": (3, None),
}


def run(dualgp, out, method, start):
    k, flags = METHODS[method]
    env = gym.make("LunarLander-v3")
    rng = np.random.default_rng(start)
    xs = [list(rng.uniform(0, 2, D)) for _ in range(INIT)]
    ys, landed = map(list, zip(*(evaluate(env, x) for x in xs)))
    path = os.path.join(out, f"{method.replace(' ', '_')}.{start}.parquet")
    suggest_seconds, started = 0.0, time.time()
    while len(xs) < EVALS:
        if flags is None:
            batch = [list(rng.uniform(0, 2, D)) for _ in range(k)]
        else:
            write_evaluated(path, xs, ys, landed)
            clock = time.time()
            batch = suggest(dualgp, path, k, 1000 * start + len(xs), flags)
            suggest_seconds += time.time() - clock
        for x in batch[: EVALS - len(xs)]:
            y, ok = evaluate(env, x)
            xs.append(x)
            ys.append(y)
            landed.append(ok)
    write_evaluated(path, xs, ys, landed)
    best = list(np.maximum.accumulate(ys))
    return {"best": best, "landed": landed, "suggest_seconds": suggest_seconds,
            "seconds": time.time() - started}


def main():
    dualgp, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    defaults = [0.5, 1.0, 0.4, 0.55, 0.5, 1.0, 0.5, 0.5, 0.0, 0.5, 0.05, 0.05]
    reference = evaluate(gym.make("LunarLander-v3"), defaults)
    results = {"heuristic's own constants": {"reward": reference[0], "landed": reference[1]}}
    for method in METHODS:
        results[method] = [run(dualgp, out, method, start) for start in range(STARTS)]
        finals = [r["best"][-1] for r in results[method]]
        print(f"{method}: best reward after {EVALS} evaluations {np.mean(finals):.1f} "
              f"(starts {', '.join(f'{v:.1f}' for v in finals)})", file=sys.stderr)
        runs = [r["best"] for r in results[method]]
        json.dump(runs, open(os.path.join(out, f"best.{method.replace(' ', '_')}.json"), "w"))
    json.dump(results, open(os.path.join(out, "lander.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
