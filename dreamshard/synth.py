"""The synthetic DLRM-like table pool, and the published statistics it is checked against.

The Meta DLRM dataset files (github facebookresearch/dlrm_datasets, MIT) are large LFS objects;
what ships here is their published locality statistics (`data/dlrm_datasets/`). The pool below is
*not* that data: it is a seeded generator whose aggregate statistics are fitted to it
(`dreamshard data stats` prints both side by side).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dreamshard.streams import reuse_stats
from dreamshard.tables import NUM_BINS, REFERENCE_BATCH, TableSpec, load_tables, save_tables

DIMS = (4, 8, 16, 32, 64, 128)
STATS_FILES = {
    "2021": "locality_stats_2021_t856_bs65536.txt",
    "2022": "locality_stats_2022_t788_bs131072.txt",
}


@dataclass(frozen=True)
class PoolConfig:
    """Knobs of the generator. Defaults were fitted (benchmarks/fit_pool.py) to the 2021 file."""

    tables: int = 856
    seed: int = 0
    rows_log10: tuple[float, float] = (2.0, 7.3)  # hash sizes log-uniform: hundreds to tens of millions
    pooling_sigma: float = 1.6  # lognormal spread of pooling factors (heavy tail)
    zero_lookup_fraction: float = 0.03  # tables never looked up in a batch (seen in the real files)
    mean_pooling: float = 15.81  # 2021 file: 887,017,990 indices / 856 tables / 65,536 samples
    zipf_alpha: tuple[float, float] = (0.6, 1.35)  # per-table popularity skew, uniform in this range


def synth_pool(config: PoolConfig = PoolConfig(), progress: Callable[[int], None] | None = None) -> list[TableSpec]:
    """Deterministic pool of `config.tables` tables (specs + stream descriptors)."""
    rng = np.random.default_rng(config.seed)
    n = config.tables
    rows = np.round(10 ** rng.uniform(*config.rows_log10, size=n)).astype(np.int64)
    dims = rng.choice(DIMS, size=n)
    pf = rng.lognormal(0.0, config.pooling_sigma, size=n)
    pf[rng.random(n) < config.zero_lookup_fraction] = 0.0
    # Scale so the pool's mean lookups per table-sample equals the published one: the tail of a
    # lognormal makes the sample mean of a few hundred draws wander by tens of percent.
    pf *= config.mean_pooling / max(pf.mean(), 1e-12)
    alphas = rng.uniform(*config.zipf_alpha, size=n)
    tables = []
    for i in range(n):
        dist = f"zipf:{alphas[i]:.4f}"
        bins = reuse_stats(int(rows[i]), float(pf[i]), dist)["bins"]
        tables.append(
            TableSpec(
                name=f"t{i}",
                rows=int(rows[i]),
                dim=int(dims[i]),
                pooling_factor=float(np.round(pf[i], 4)),
                bins=tuple(bins),
                distribution=dist,
                seed=config.seed * 100_003 + i,
            )
        )
        if progress:
            progress(1)
    return tables


def write_pool(tables: Sequence[TableSpec], out: str | Path, config: PoolConfig) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_tables(tables, out / "tables.csv")
    (out / "pool.json").write_text(json.dumps({"format": "dreamshard.pool/1", "config": asdict(config)}, indent=1))
    return out / "tables.csv"


def load_pool(directory: str | Path) -> list[TableSpec]:
    return load_tables(Path(directory) / "tables.csv")


# --------------------------------------------------------------------------------------------
# Published statistics and the pool's own
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalityStats:
    source: str
    tables: int
    batch_size: int
    indices: float  # lookups per batch, all tables
    unique: float  # distinct rows per batch, all tables
    row_hist: tuple[float, ...]  # fraction of distinct rows per reuse bin
    lookup_hist: tuple[float, ...]  # fraction of lookups per reuse bin

    @property
    def lookups_per_table_sample(self) -> float:
        return self.indices / self.tables / self.batch_size


def published_stats(year: str = "2021") -> LocalityStats:
    """The first block of a published locality-stats file: the whole-file aggregate."""
    name = STATS_FILES[year]
    text = resources.files("dreamshard").joinpath("data/dlrm_datasets", name).read_text()
    tables, batch = (int(x) for x in re.search(r"_t(\d+)_bs(\d+)", name).groups())
    block = text.split("\n\n")[0]
    hists = re.findall(r"Histogram of col sizes:\n(.*?)\[0,", block, re.S) + re.findall(r"Ratio of index distribution at different column sizes:\n(.*?)\[0,", block, re.S)
    row_hist, lookup_hist = ([float(line.split(":")[1]) for line in h.strip().splitlines()] for h in hists)
    return LocalityStats(
        source=f"{name} (published, whole file)",
        tables=tables,
        batch_size=batch,
        indices=float(re.search(r"Avg # of indices: (\d+)", block).group(1)),
        unique=float(re.search(r"Avg # of unique cols: (\d+)", block).group(1)),
        row_hist=tuple(row_hist),
        lookup_hist=tuple(lookup_hist),
    )


def pool_stats(tables: Sequence[TableSpec], batch_size: int = REFERENCE_BATCH) -> LocalityStats:
    """Expected aggregate statistics of a pool's streams at `batch_size` (analytic; see streams)."""
    row_hist, lookup_hist = np.zeros(NUM_BINS), np.zeros(NUM_BINS)
    indices = unique = 0.0
    for t in tables:
        s = reuse_stats(t.rows, t.pooling_factor, t.distribution or "uniform", batch_size)
        indices += s["lookups"]
        unique += s["unique"]
        row_hist += np.array(s["bins"]) * s["unique"]
        lookup_hist += np.array(s["lookup_bins"]) * s["lookups"]
    return LocalityStats(
        source="synthetic pool (expected, analytic)",
        tables=len(tables),
        batch_size=batch_size,
        indices=indices,
        unique=unique,
        row_hist=tuple(row_hist / max(unique, 1e-12)),
        lookup_hist=tuple(lookup_hist / max(indices, 1e-12)),
    )
