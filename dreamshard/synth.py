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

from dreamshard.bins import REFERENCE_BATCH, reuse_bins_many, reuse_stats_many
from dreamshard.files import atomic_write, one_writer
from dreamshard.tables import TableSpec, load_tables, save_tables
from dreamshard.validation import MAX_SEED

DIMS = (4, 8, 16, 32, 64, 128)
STATS_FILES = {
    "2021": "locality_stats_2021_t856_bs65536.txt",
    "2022": "locality_stats_2022_t788_bs131072.txt",
}


@dataclass(frozen=True)
class PoolConfig:
    tables: int = 856
    seed: int = 0
    zero_lookup_fraction: float = 0.02  # tables never looked up in a batch (the real files have some)
    mean_pooling: float = 15.81  # 2021 file: 887,017,990 indices / 856 tables / 65,536 samples


MIXTURE_FILES = {  # the archetype mixture fitted to each published stats file (benchmarks/fit_pool.py --year)
    "2021": "pool_mixture.json",
    "2022": "pool_mixture_2022.json",
}


def _mixture(year: str = "2021") -> list[dict]:
    """Table archetypes and weights fitted to the published stats of `year` (benchmarks/fit_pool.py)."""
    return json.loads(resources.files("dreamshard").joinpath("data", MIXTURE_FILES[year]).read_text())["archetypes"]


def synth_pool(config: PoolConfig = PoolConfig(), progress: Callable[[int], None] | None = None, year: str = "2021") -> list[TableSpec]:
    """Deterministic pool of `config.tables` tables (specs + stream descriptors).

    Tables come from the archetype mixture fitted to the `year` stats (benchmarks/fit_pool.py),
    each jittered within its grid cell so no two are alike; dims are uniform over DIMS. The 2021
    pool is the shipped model's and the tests': its output for a seed must never change.
    """
    rng = np.random.default_rng(config.seed)
    arch = _mixture(year)
    n = config.tables
    # Largest-remainder apportionment: each archetype gets its share of tables, independent of
    # the seed. Random draws would let a handful of heavy-pooling tables (which carry most of
    # the lookups) come and go, moving the pool's histograms by more than the fit's error.
    share = np.array([a["weight"] for a in arch]) * n / sum(a["weight"] for a in arch)
    counts = np.floor(share).astype(int)
    # stable: archetypes of equal weight tie here, and numpy's default sort breaks ties by the CPU's
    # SIMD path (an AVX-512 machine gave another dlrm pool of seed 11 than an AVX2 one)
    counts[np.argsort(-(share - counts), kind="stable")[: n - counts.sum()]] += 1
    picks = rng.permutation(np.repeat(np.arange(len(arch)), counts))
    log_rows = np.array([arch[i]["log10_rows"] for i in picks]) + rng.uniform(-0.1, 0.1, n)
    alphas = np.array([arch[i]["zipf_alpha"] for i in picks]) + rng.uniform(-0.02, 0.02, n)
    pf = np.array([arch[i]["pooling_factor"] for i in picks]) * np.exp(rng.uniform(-0.1, 0.1, n))
    # Zero-lookup tables are taken among the lightest, so they do not remove a heavy table's lookups.
    light = np.flatnonzero(pf <= 1.2)
    pf[rng.choice(light, size=min(len(light), round(config.zero_lookup_fraction * n)), replace=False)] = 0.0
    # Rescale to the published mean: the jitter moves a finite pool's mean a little.
    pf *= config.mean_pooling / max(pf.mean(), 1e-12)
    rows = np.maximum(np.round(10**log_rows), 10).astype(np.int64)
    dims = rng.choice(DIMS, size=n)
    dists = [f"zipf:{a:.4f}" for a in alphas]
    # modulo 2^63: every pool seed the docs allow (0..MAX_SEED) gives valid stream seeds; below
    # MAX_SEED // 100,003 (every pool made before) the seeds are unchanged
    seeds = [(config.seed * 100_003 + i) % (MAX_SEED + 1) for i in range(n)]
    return table_specs([f"t{i}" for i in range(n)], rows, dims, pf, dists, seeds, progress)


def table_specs(names: Sequence[str], rows: Sequence[int], dims: Sequence[int], pooling: Sequence[float], distributions: Sequence[str],
                seeds: Sequence[int], progress: Callable[[int], None] | None = None) -> list[TableSpec]:
    """TableSpecs of generated tables, their reuse bins derived in one batch; pooling factors
    rounded to 4 decimals (what a table file keeps), so a written pool reads back equal."""
    bins = reuse_bins_many(rows, pooling, distributions)
    tables = []
    for i in range(len(names)):
        tables.append(
            TableSpec(
                name=names[i],
                rows=int(rows[i]),
                dim=int(dims[i]),
                pooling_factor=float(np.round(pooling[i], 4)),
                bins=tuple(bins[i].tolist()),
                distribution=distributions[i],
                seed=int(seeds[i]),
            )
        )
        if progress:
            progress(1)
    return tables


def write_pool(tables: Sequence[TableSpec], out: str | Path, config: PoolConfig, family: str | None = None) -> Path:
    """tables.csv and pool.json (the generator's config; `family` when not the default pool's)."""
    out = Path(out)
    meta = {"format": "dreamshard.pool/1", "config": asdict(config)}
    if family is not None:
        meta["family"] = family
    with one_writer(out):  # both files of one pool, also where another command writes the folder at once
        save_tables(tables, out / "tables.csv")
        atomic_write(out / "pool.json", json.dumps(meta, indent=1))
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
    s = reuse_stats_many([t.rows for t in tables], [t.pooling_factor for t in tables], [t.distribution or "uniform" for t in tables], batch_size)
    indices, unique = float(s["lookups"].sum()), float(s["unique"].sum())
    row_hist = s["bins"].T @ s["unique"]
    lookup_hist = s["lookup_bins"].T @ s["lookups"]
    return LocalityStats(
        source="synthetic pool (expected, analytic)",
        tables=len(tables),
        batch_size=batch_size,
        indices=indices,
        unique=unique,
        row_hist=tuple(row_hist / max(unique, 1e-12)),
        lookup_hist=tuple(lookup_hist / max(indices, 1e-12)),
    )
