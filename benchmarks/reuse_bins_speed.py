"""How fast expected reuse bins are derived from a table's distribution (target: ≥ 10,000/s).

    python benchmarks/reuse_bins_speed.py [--tables 10000] [--reference 200]

Draws random (rows, pooling factor, distribution) triples in the synthetic pool's range (rows
10^2–10^8, pooling 0.1–300, zipf alpha 0.2–1.5, one in ten uniform), then times
`bins.reuse_bins_many` on all of them (after the one-time set-up of its tables, timed
apart), and the former per-table sum (`_reference_stats` in tests/test_streams.py) on the first
`--reference` of them, reporting the largest difference between the two. One thread.
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=10_000)
    ap.add_argument("--reference", type=int, default=200, help="tables timed with the former per-table sum (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from dreamshard.costs.hardware import cpu_model
    from dreamshard.bins import _cell_tables, reuse_stats_many

    rng = np.random.default_rng(args.seed)
    n = args.tables
    rows = np.round(10 ** rng.uniform(2, 8, n)).astype(np.int64)
    pf = 10 ** rng.uniform(-1, np.log10(300), n)
    dists = ["uniform" if rng.random() < 0.1 else f"zipf:{a:.4f}" for a in rng.uniform(0.2, 1.5, n)]
    print(f"CPU: {cpu_model()} (1 thread); numpy {np.__version__}, Python {platform.python_version()}")
    t0 = time.perf_counter()
    _cell_tables()
    setup = time.perf_counter() - t0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        got = reuse_stats_many(rows, pf, dists)
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(f"batched (bins.reuse_stats_many): {n:,} tables in {best:.3f} s = {n / best:,.0f} tables/s (best of 3; one-time set-up {setup:.2f} s)")
    if args.reference:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from test_streams import _reference_stats

        k = min(args.reference, n)
        t0 = time.perf_counter()
        ref = [_reference_stats(int(rows[i]), float(pf[i]), dists[i]) for i in range(k)]
        dt = time.perf_counter() - t0
        db = max(np.abs(got["bins"][i] - ref[i]["bins"]).max() for i in range(k))
        dl = max(np.abs(got["lookup_bins"][i] - ref[i]["lookup_bins"]).max() for i in range(k))
        print(f"former per-table sum: {k:,} tables in {dt:.2f} s = {k / dt:,.0f} tables/s; largest difference: bins {db:.1e}, lookup bins {dl:.1e}")


if __name__ == "__main__":
    main()
