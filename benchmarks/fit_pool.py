"""Fit the synthetic pool's generator knobs to the published 2021 locality statistics.

Random search over PoolConfig's shape knobs (mean pooling is fixed to the published value),
scored by L1 distance of the lookup-weighted reuse histogram plus half that of the row
histogram, each candidate scored on a 160-table pool (the stats are averages, so a smaller
pool ranks candidates the same way at a fifth of the cost). Run:
    python benchmarks/fit_pool.py --trials 120 --seed 0
and copy the winner into PoolConfig's defaults; `dreamshard data stats` checks the full pool.
"""

import argparse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

from dreamshard.synth import PoolConfig, pool_stats, published_stats, synth_pool


def score(cfg: PoolConfig) -> tuple[float, float, float]:
    ref = published_stats("2021")
    s = pool_stats(synth_pool(cfg))
    lk = float(np.abs(np.array(s.lookup_hist) - ref.lookup_hist).sum())
    rw = float(np.abs(np.array(s.row_hist) - ref.row_hist).sum())
    return lk + 0.5 * rw, lk, rw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tables", type=int, default=160)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cands = []
    for _ in range(args.trials):
        lo = rng.uniform(1.5, 4.0)
        a_lo = rng.uniform(0.05, 1.0)
        cands.append(
            replace(
                PoolConfig(tables=args.tables, seed=1),
                rows_log10=(round(lo, 2), round(rng.uniform(max(lo + 2, 6.0), 7.5), 2)),
                pooling_sigma=round(rng.uniform(0.5, 2.2), 2),
                zipf_alpha=(round(a_lo, 2), round(a_lo + rng.uniform(0.1, 1.0), 2)),
            )
        )
    with ProcessPoolExecutor(2) as ex:
        results = sorted(zip(ex.map(score, cands), range(len(cands))))
    for (total, lk, rw), i in results[:5]:
        c = cands[i]
        print(f"score {total:.3f} lookup-L1 {lk:.3f} row-L1 {rw:.3f}  rows_log10={c.rows_log10} pooling_sigma={c.pooling_sigma} zipf_alpha={c.zipf_alpha}")


if __name__ == "__main__":
    main()
