"""Fit the synthetic pool's table mixture to the published 2021 locality statistics.

Why a mixture: the published histograms are lookup-weighted averages over tables, so they are
*linear* in the fraction of tables of each kind once the mean pooling factor is fixed. We grid
table archetypes (log10 rows × zipf alpha × pooling factor), compute each one's expected reuse
statistics at the file's batch size (bins.reuse_stats), and solve a non-negative least
squares problem for their weights:
  - lookup-weighted reuse histogram = published,
  - mean pooling factor (lookups per table-sample) = published,
  - distinct rows per table = published, and the distinct-row histogram = published,
  - weights sum to 1, and a ridge pull toward a broad prior (pooling log-normal around 3,
    all sizes and skews) so the pool is a spread of tables rather than a few spikes.
Writes dreamshard/data/pool_mixture.json (2021) or pool_mixture_2022.json (`--year 2022`, fitted at
that file's batch of 131,072); `synth.synth_pool` samples tables from it.
    python benchmarks/fit_pool.py [--year 2022] [--out FILE]
"""

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from dreamshard.bins import reuse_stats
from dreamshard.synth import MIXTURE_FILES, published_stats

LOG10_ROWS = np.arange(2.0, 7.51, 0.5)
ALPHAS = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4]
POOLING = [0.3, 1, 3, 10, 30, 100, 300]
RIDGE = 4.0
DATA = Path(__file__).resolve().parent.parent / "dreamshard" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description="fit the table mixture to a published locality-stats file")
    ap.add_argument("--year", default="2021", choices=sorted(MIXTURE_FILES))
    ap.add_argument("--out", help="where to write [default: the shipped mixture file of that year]")
    args = ap.parse_args()
    OUT = Path(args.out) if args.out else DATA / MIXTURE_FILES[args.year]
    ref = published_stats(args.year)
    grid = list(itertools.product(LOG10_ROWS.tolist(), ALPHAS, POOLING))
    stats = [reuse_stats(int(10**lr), pf, f"zipf:{a}", ref.batch_size) for lr, a, pf in grid]
    H = np.array([s["lookup_bins"] for s in stats])
    R = np.array([s["bins"] for s in stats])
    U = np.array([s["unique"] for s in stats]) / ref.batch_size  # distinct rows per sample
    PF = np.array([pf for _, _, pf in grid])
    pf_ref, uniq_ref = ref.lookups_per_table_sample, ref.unique / ref.tables / ref.batch_size
    th, tr = np.array(ref.lookup_hist), np.array(ref.row_hist)

    rows, rhs = [], []
    for j in range(len(th)):  # Σ w·pf·h_j / pf_ref = published h_j
        rows.append(10 * PF * H[:, j] / pf_ref)
        rhs.append(10 * th[j])
    rows.append(20 * PF / pf_ref), rhs.append(20.0)  # mean pooling
    rows.append(20 * np.ones(len(grid))), rhs.append(20.0)  # weights sum to 1
    rows.append(5 * U / uniq_ref), rhs.append(5.0)  # distinct rows per table
    for j in range(len(tr)):  # Σ w·U·(r_j − published r_j) = 0
        rows.append(3 * U * (R[:, j] - tr[j]) / U.mean())
        rhs.append(0.0)
    prior = np.exp(-0.5 * ((np.log(PF) - np.log(3)) / 1.5) ** 2)
    prior /= prior.sum()
    A = np.vstack([np.array(rows), RIDGE * np.eye(len(grid))])
    b = np.concatenate([rhs, RIDGE * prior])
    w, _ = nnls(A, b)
    w /= w.sum()

    agg_h = (w * PF) @ H / (w * PF).sum()
    agg_r = (w * U) @ R / (w * U).sum()
    print(f"mixture of {int((w > 1e-4).sum())} archetypes: lookup-hist L1 {np.abs(agg_h - th).sum():.4f}, "
          f"row-hist L1 {np.abs(agg_r - tr).sum():.4f}, mean pooling {(w * PF).sum():.2f} (published {pf_ref:.2f})")
    keep = w > 1e-4
    OUT.write_text(json.dumps({
        "fitted_to": ref.source,
        "ridge": RIDGE,
        "archetypes": [{"log10_rows": g[0], "zipf_alpha": g[1], "pooling_factor": g[2], "weight": round(float(x), 6)}
                       for g, x, k in zip(grid, w, keep) if k],
    }, indent=0))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
