"""Table families: seeded generators of table pools with the shapes real recommender models have.

Our synthetic pool (`dlrm`, synth.py) is fitted to Meta's 2021 DLRM locality statistics and has
dims 4–128 (powers of two) only; planners and the simulator that hold on it can fail on other shapes
(docs/families.md). Each family below is one deterministic function (tables, seed) → [TableSpec] whose
tables carry `zipf:`/`uniform` stream descriptors, so the existing stream machinery (streams.py)
regenerates their index streams and bins.py derives their reuse bins. Where each family's numbers
come from is written in docs/families.md (with the public sources).

  dlrm      today's pool (synth.synth_pool), fitted to the 2021 stats; byte-identical per seed
  dlrm2022  the same generator fitted to the 2022 stats file (batch 131,072)
  wide      wide and odd dims (multiples of 4 up to 1,024), otherwise DLRM-like tables
  hot       tiny hot tables: 10^2–10^4 rows, each touched row read hundreds to ~10^5 times a batch
  heavy     very heavy lognormal pooling (median 30, tail to 300)
  onehot    MLPerf DLRM-DCNv2: the 26 Criteo-1TB tables (up to 4·10^7 rows), dim 128, pooling
            1 (one-hot) or the benchmark's multi-hot sizes
  mixed     held out: a probe of shapes no calibration has seen, a mix of all
  rmc       held out: Meta's production models RMC1–3 as DeepRecSys configures them (8 tables of
            4·10^6 rows × dim 32 × 80 lookups, 32 of 5·10^5 × 64 × 120, 10 of 2·10^6 × 32 × 20)
  din       held out: Alibaba's DIN on the public Taobao ad dataset as TorchEasyRec configures it
            (16 id features of 3 to 1.14·10^6 rows, 3 behaviour-sequence tables of 50 lookups in the
            published copy, 10–100 in later ones; dim 16)

HELD_OUT_FAMILIES are chosen before any result was looked at: nothing is calibrated, trained or
tuned on them; every report includes them (marked). Why `mixed`: it is the shape mix on which a
simulator fitted to `dlrm` alone failed (dims 8–256 with 24/48/96/192, heavy-tailed pooling, rows
10^3–5·10^7, some tiny hot tables), so its error is the one to remove. Holding out `wide`
instead would keep every non-power-of-two dim — a separate, masked kernel path — out of the
calibration, so the held-out check would measure an unobserved kernel path rather than whether
the model generalizes to new tables and new mixes of them in fused shards. Why `rmc` and `din`:
each is the table set of a real, publicly described model, not a shape range we drew: whole
models of many alike tables with fixed heavy pooling (`rmc`), and of tiny one-hot id tables beside
behaviour sequences (`din`); docs/families.md gives their sources.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dreamshard.bins import BIN_MEAN, REFERENCE_BATCH, reuse_stats_many
from dreamshard.synth import DIMS, PoolConfig, published_stats, synth_pool, table_specs
from dreamshard.tables import TableSpec
from dreamshard.validation import DIM_MULTIPLE, MAX_DIM, MAX_SEED, MAX_TABLES, OptionError

# The held-out families: nothing is calibrated, trained or tuned on them; every report carries them.
HELD_OUT_FAMILIES = ("mixed", "rmc", "din")
DEFAULT_FAMILY = "dlrm"
# A generated table stays within this many bytes (fp16 weights) unless its family is defined by
# published sizes (onehot): a task at the campaigns' settings (16–24 GB per device) can then be drawn.
MAX_TABLE_BYTES = 4 * 10**9

# MLPerf Training DLRM-DCNv2 (mlcommons/training recommendation_v2/torchrec_dlrm/README.MD):
# the 26 Criteo-1TB categorical features' table sizes and the benchmark's multi-hot sizes.
CRITEO_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14,
               40000000, 40000000, 40000000, 590152, 12973, 108, 36)
CRITEO_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
CRITEO_DIM = 128

# Meta's production recommendation-model classes RMC1–3 (Gupta et al., "The Architectural Implications of
# Facebook's DNN-based Personalized Recommendation", HPCA 2020) as DeepRecSys configures them (Gupta et al.,
# ISCA 2020; harvard-acc/DeepRecSys models/configs/dlrm_rm1.json, dlrm_rm2.json, dlrm_rm3.json):
# (model, tables, rows per table, embedding dim, lookups per table and sample — fixed in the configs).
RMC_MODELS = (("rm1", 8, 4_000_000, 32, 80), ("rm2", 32, 500_000, 64, 120), ("rm3", 10, 2_000_000, 32, 20))

# Alibaba's DIN on the public Taobao display-ad dataset (Tianchi dataset 56) as Alibaba's TorchEasyRec
# configures it (examples/multi_tower_din_taobao.config): every id feature's table (its num_buckets;
# price's 98 boundaries make 99 buckets, pid is hashed to 20), then the behaviour sequence `click_50_seq`
# (the user's last 50 clicks, at most 100 kept) over adgroup_id, cate_id and brand; dim 16 throughout.
# (feature, rows, lookups per sample; None: the sequence's length)
TAOBAO_TABLES = (("user_id", 1_141_730, 1), ("cms_segid", 98, 1), ("cms_group_id", 14, 1), ("final_gender_code", 3, 1),
                 ("age_level", 8, 1), ("pvalue_level", 5, 1), ("shopping_level", 5, 1), ("occupation", 3, 1),
                 ("new_user_class_level", 6, 1), ("adgroup_id", 846_812, 1), ("cate_id", 12_961, 1), ("campaign_id", 423_438, 1),
                 ("customer", 255_877, 1), ("brand", 461_498, 1), ("price", 99, 1), ("pid", 20, 1),
                 ("click_50_seq__adgroup_id", 846_812, None), ("click_50_seq__cate_id", 12_961, None), ("click_50_seq__brand", 461_498, None))
TAOBAO_DIM = 16
TAOBAO_SEQUENCE = 50  # clicks in the behaviour sequence (its name) ...
TAOBAO_SEQUENCE_MAX = 100  # ... and the most it keeps (sequence_length)

# Wide dims: probe dims (24, 48, 96, 192) and those common in production configs (multiples of 4, many not
# powers of two), and FBGEMM's benchmark rule for mixed dims (`--mixed`: uniform in [D/2, 3D/2),
# rounded up to a multiple of 4).
WIDE_DIMS = (12, 24, 40, 48, 80, 96, 160, 192, 256, 320, 384, 512, 640, 768, 1024)
WIDE_BASE_DIMS = (128, 256, 512, 768)
HOT_DIMS = (16, 32, 64, 96, 128, 192, 256)
HEAVY_DIMS = (16, 32, 64, 128, 256)
MIXED_DIMS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class Family:
    name: str
    prefix: str  # table names are prefix + index, so a table's family can be read off its name
    summary: str
    generate: Callable[[int, int], list[TableSpec]]  # (tables, seed) → specs
    default_tables: int = 856


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------


def _stream_seeds(family: str, seed: int, n: int) -> list[int]:
    """Per-table stream seeds of a family pool: distinct across families for the same pool seed
    (so two families never replay one stream), within 0..MAX_SEED."""
    return [int.from_bytes(hashlib.sha256(f"{family}:{seed}:{i}".encode()).digest()[:8], "big") >> 1 for i in range(n)]


def _rng(family: str, seed: int) -> np.random.Generator:
    # one independent stream per (family, seed): changing one family never moves another's tables
    return np.random.default_rng([seed, int.from_bytes(hashlib.sha256(family.encode()).digest()[:4], "big")])


def _cap_rows(rows: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """Rows at most MAX_TABLE_BYTES of fp16 weights, at least 10."""
    return np.maximum(np.minimum(rows, MAX_TABLE_BYTES // (2 * dims)), 10).astype(np.int64)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, n: int) -> np.ndarray:
    return 10 ** rng.uniform(np.log10(lo), np.log10(hi), n)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: float, hi: float, n: int) -> np.ndarray:
    return np.clip(median * np.exp(sigma * rng.standard_normal(n)), lo, hi)


def _zipf(alphas: np.ndarray) -> list[str]:
    return [f"zipf:{a:.4f}" for a in alphas]


def _specs(family: str, seed: int, rows, dims, pf, dists, progress=None) -> list[TableSpec]:
    prefix = FAMILIES[family].prefix
    return table_specs([f"{prefix}{i}" for i in range(len(rows))], rows, dims, pf, dists, _stream_seeds(family, seed, len(rows)), progress)


def _dlrm(n: int, seed: int) -> list[TableSpec]:
    return synth_pool(PoolConfig(tables=n, seed=seed))


def _dlrm2022(n: int, seed: int) -> list[TableSpec]:
    """The 2021 generator with the mixture fitted to the 2022 stats (at their batch of 131,072) and
    their mean pooling; tables renamed so a 2022 pool never shares a name with a 2021 one."""
    ref = published_stats("2022")
    tables = synth_pool(PoolConfig(tables=n, seed=seed, mean_pooling=round(ref.lookups_per_table_sample, 4)), year="2022")
    seeds = _stream_seeds("dlrm2022", seed, n)
    prefix = FAMILIES["dlrm2022"].prefix
    return [TableSpec(f"{prefix}{i}", t.rows, t.dim, t.pooling_factor, t.bins, t.distribution, s) for i, (t, s) in enumerate(zip(tables, seeds))]


def _wide(n: int, seed: int) -> list[TableSpec]:
    rng = _rng("wide", seed)
    named = rng.choice(WIDE_DIMS, size=n)
    base = rng.choice(WIDE_BASE_DIMS, size=n)
    fbgemm_mixed = np.minimum(-(-rng.integers(base // 2, 3 * base // 2) // DIM_MULTIPLE) * DIM_MULTIPLE, MAX_DIM)
    dims = np.where(rng.random(n) < 0.5, named, fbgemm_mixed).astype(np.int64)
    rows = _cap_rows(np.round(_log_uniform(rng, 1e3, 1e7, n)), dims)
    pf = _lognormal(rng, 4.0, 1.0, 0.3, 100.0, n)
    return _specs("wide", seed, rows, dims, pf, _zipf(rng.uniform(0.2, 1.2, n)))


def _hot(n: int, seed: int) -> list[TableSpec]:
    rng = _rng("hot", seed)
    dims = rng.choice(HOT_DIMS, size=n)
    rows = np.round(_log_uniform(rng, 1e2, 1e4, n)).astype(np.int64)
    # >= 16 lookups per sample: at B = 65,536 that is >= 10^6 lookups a batch on <= 10^4 rows,
    # so every touched row is read >= ~100 times (a real 1,302-row table has pooling 69)
    pf = _lognormal(rng, 40.0, 0.8, 16.0, 400.0, n)
    return _specs("hot", seed, rows, dims, pf, _zipf(rng.uniform(0.3, 1.3, n)))


def _heavy(n: int, seed: int) -> list[TableSpec]:
    rng = _rng("heavy", seed)
    dims = rng.choice(HEAVY_DIMS, size=n)
    rows = _cap_rows(np.round(_log_uniform(rng, 1e4, 1e7, n)), dims)
    pf = _lognormal(rng, 30.0, 1.0, 1.0, 300.0, n)
    return _specs("heavy", seed, rows, dims, pf, _zipf(rng.uniform(0.2, 1.1, n)))


def _onehot(n: int, seed: int) -> list[TableSpec]:
    """Copies of the 26 MLPerf DLRM-DCNv2 tables: copy 0 of each exactly as published, later copies
    with rows jittered by up to ±10% (so no two tables are alike), even copies with the benchmark's
    multi-hot sizes, odd copies one-hot (pooling 1, as the original Criteo features)."""
    rng = _rng("onehot", seed)
    feature = np.arange(n) % len(CRITEO_ROWS)
    copy = np.arange(n) // len(CRITEO_ROWS)
    base = np.array(CRITEO_ROWS, dtype=np.float64)[feature]
    jitter = np.where(copy == 0, 1.0, np.exp(rng.uniform(-0.1, 0.1, n)))
    rows = np.maximum(np.round(base * jitter), 1).astype(np.int64)
    pf = np.where(copy % 2 == 0, np.array(CRITEO_MULTI_HOT, dtype=np.float64)[feature], 1.0)
    # Criteo's categorical values are power-law distributed; the exponent is our assumption (docs/families.md)
    alphas = rng.uniform(0.9, 1.2, n)
    return _specs("onehot", seed, rows, np.full(n, CRITEO_DIM), pf, _zipf(alphas))


def _mixed(n: int, seed: int) -> list[TableSpec]:
    """The probe: dims 8–256 with 24/48/96/192 among them, lognormal pooling with a heavy
    tail, rows 10^3–5·10^7, and one table in ten tiny and hot."""
    rng = _rng("mixed", seed)
    dims = rng.choice(MIXED_DIMS, size=n)
    hot = rng.random(n) < 0.1
    rows = np.where(hot, _log_uniform(rng, 10**2.5, 10**3.5, n), _log_uniform(rng, 1e3, 5e7, n))
    rows = _cap_rows(np.round(rows), dims)
    pf = np.where(hot, _lognormal(rng, 40.0, 0.6, 16.0, 300.0, n), _lognormal(rng, 5.0, 1.2, 0.1, 300.0, n))
    return _specs("mixed", seed, rows, dims, pf, _zipf(rng.uniform(0.2, 1.3, n)))


def _copies(n: int, per: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Table i of a family made of copies of a published model of `per` tables: its table in the
    model, its copy, and its rows' factor (copy 0 exactly as published, later copies jittered by up
    to ±10% so that no two tables are alike)."""
    feature, copy = np.arange(n) % per, np.arange(n) // per
    return feature, copy, np.where(copy == 0, 1.0, np.exp(rng.uniform(-0.1, 0.1, n)))


def _rmc(n: int, seed: int) -> list[TableSpec]:
    """Copies of the 50 tables of Meta's RMC1, RMC2 and RMC3 (8 + 32 + 10): each table's dim and
    lookups as published, its rows jittered in later copies (_copies)."""
    rng = _rng("rmc", seed)
    counts = [m[1] for m in RMC_MODELS]
    base_rows, base_dims, base_pf = (np.repeat([m[k] for m in RMC_MODELS], counts) for k in (2, 3, 4))
    feature, _, jitter = _copies(n, sum(counts), rng)
    rows = np.maximum(np.round(base_rows[feature] * jitter), 1).astype(np.int64)
    # the skew is our assumption (docs/families.md): the configs give no index distribution
    return _specs("rmc", seed, rows, base_dims[feature], base_pf[feature].astype(np.float64), _zipf(rng.uniform(0.4, 1.2, n)))


def _din(n: int, seed: int) -> list[TableSpec]:
    """Copies of the 19 tables of DIN on Taobao: copy 0 as published (behaviour sequences of 50
    clicks), later copies with rows jittered (_copies) and one sequence length per copy,
    log-uniform in [10, 100] (the config's cap), shared by its three sequence tables."""
    rng = _rng("din", seed)
    feature, copy, jitter = _copies(n, len(TAOBAO_TABLES), rng)
    base_rows = np.array([t[1] for t in TAOBAO_TABLES], dtype=np.float64)
    rows = np.maximum(np.round(base_rows[feature] * jitter), 1).astype(np.int64)
    length = np.where(np.arange(copy.max() + 1) == 0, float(TAOBAO_SEQUENCE), _log_uniform(rng, 10, TAOBAO_SEQUENCE_MAX, copy.max() + 1))
    sequence = np.array([t[2] is None for t in TAOBAO_TABLES])[feature]
    pf = np.where(sequence, length[copy], 1.0)
    return _specs("din", seed, rows, np.full(n, TAOBAO_DIM), pf, _zipf(rng.uniform(0.6, 1.2, n)))


def span_tables(n: int, seed: int) -> list[TableSpec]:
    """Tables spread over the shapes the tool accepts rather than over one model's: dims multiples
    of 4 log-uniform in 4–1,024 (the kernel's range), rows log-uniform 10–10^8 (at most
    MAX_TABLE_BYTES), pooling log-uniform 0.1–500, zipf α uniform in 0–1.4. Not a family (no
    planner is judged on them): a cost net's simulator prior draws tasks of them beside the training
    families' (`learned.dreamshard.Config.prior_span`) so that it has seen every shape once."""
    rng = _rng("span", seed)
    dims = np.clip(np.round(_log_uniform(rng, DIM_MULTIPLE, MAX_DIM, n) / DIM_MULTIPLE) * DIM_MULTIPLE, DIM_MULTIPLE, MAX_DIM).astype(np.int64)
    rows = _cap_rows(np.round(_log_uniform(rng, 10, 1e8, n)), dims)
    pf = _log_uniform(rng, 0.1, 500.0, n)
    return table_specs([f"{SPAN_PREFIX}{i}" for i in range(n)], rows, dims, pf, _zipf(rng.uniform(0.0, 1.4, n)), _stream_seeds("span", seed, n))


SPAN_PREFIX = "span"  # no family's prefix starts so (family_of gives None)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("dlrm", "t", "DLRM-like pool fitted to Meta's 2021 locality stats (dims 4–128)", _dlrm),
        Family("dlrm2022", "u", "DLRM-like pool fitted to Meta's 2022 locality stats (batch 131,072)", _dlrm2022, 788),
        Family("wide", "w", "wide and odd dims (multiples of 4, 12–1,024), DLRM-like rows and pooling", _wide),
        Family("hot", "h", "tiny hot tables: 10^2–10^4 rows, pooling 16–400", _hot),
        Family("heavy", "p", "very heavy lognormal pooling (median 30, up to 300)", _heavy),
        Family("onehot", "c", "MLPerf DLRM-DCNv2: the 26 Criteo-1TB tables (up to 4e7 rows), dim 128, one-/multi-hot", _onehot),
        Family("mixed", "m", "held out: a probe — dims 8–256 incl. 24/48/96/192, heavy-tailed pooling, 10% tiny hot", _mixed),
        Family("rmc", "r", "held out: Meta's RMC1–3 (DeepRecSys): 50 tables of 0.5–4e6 rows, dim 32/64, 20/80/120 lookups", _rmc),
        Family("din", "d", "held out: Alibaba's DIN on Taobao (TorchEasyRec): 16 id tables of 3–1.1e6 rows, 3 sequences of 50, dim 16", _din),
    )
}
TRAINING_FAMILIES = tuple(name for name in FAMILIES if name not in HELD_OUT_FAMILIES)


def synth_family(name: str = DEFAULT_FAMILY, tables: int | None = None, seed: int = 0) -> list[TableSpec]:
    """The pool of family `name`: `tables` tables (default: the family's own count) from `seed`.
    Deterministic; OptionError (one line) on an unknown family or an out-of-range count or seed."""
    if name not in FAMILIES:
        raise OptionError(f"--family {name!r}: not one of {', '.join(FAMILIES)}")
    family = FAMILIES[name]
    n = family.default_tables if tables is None else tables
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_TABLES:
        raise OptionError(f"--tables {n!r}: must be an integer in 1..{MAX_TABLES:,}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise OptionError(f"--seed {seed!r}: must be an integer in 0..2^63 - 1")
    return family.generate(int(n), int(seed))


def family_of(table_name: str) -> str | None:
    """The family whose naming a table follows (prefix + index), or None."""
    for f in FAMILIES.values():
        rest = table_name[len(f.prefix):]
        if table_name.startswith(f.prefix) and rest.isdigit():
            return f.name
    return None


# --------------------------------------------------------------------------------------------
# Shape buckets: where the simulator's error is reported (dim, hits per touched row,
# pooling). A shard is put in the bucket of its dominant table: the one moving the most row bytes.
# --------------------------------------------------------------------------------------------

DIM_EDGES = (32, 128, 256)  # dim ≤32, 33–128, 129–256, >256
HITS_EDGES = (2.0, 16.0, 256.0)  # lookups per distinct touched row in one batch
POOLING_EDGES = (2.0, 10.0, 50.0)


def _label(value: float, edges: Sequence[float], name: str, fmt: str = "g") -> str:
    i = int(np.searchsorted(edges, value, side="left"))
    lo = "0" if i == 0 else format(edges[i - 1], fmt)
    return f"{name} >{format(edges[-1], fmt)}" if i == len(edges) else f"{name} {lo}–{format(edges[i], fmt)}"


def hits_per_row(tables: Sequence[TableSpec], batch_size: int = REFERENCE_BATCH) -> np.ndarray:
    """[T] expected lookups per distinct touched row in one batch (bins.reuse_stats_many; a replayed
    DLRM table from its bins' mean count). 0 for a table without lookups."""
    synthetic = [i for i, t in enumerate(tables) if not (t.distribution or "uniform").startswith("dlrm:")]
    out = np.zeros(len(tables))
    if synthetic:
        s = reuse_stats_many([tables[i].rows for i in synthetic], [tables[i].pooling_factor for i in synthetic],
                             [tables[i].distribution or "uniform" for i in synthetic], batch_size)
        out[synthetic] = s["lookups"] / np.maximum(s["unique"], 1e-12) * (s["unique"] > 0)
    replayed = [i for i in set(range(len(tables))) - set(synthetic) if tables[i].pooling_factor > 0]
    if replayed:
        out[replayed] = [float(np.dot(tables[i].bins, BIN_MEAN)) for i in replayed]
    return out


def table_buckets(tables: Sequence[TableSpec], batch_size: int = REFERENCE_BATCH) -> list[dict[str, str]]:
    """Each table's shape bucket: {"dim": ..., "hits": ..., "pooling": ...}."""
    hits = hits_per_row(tables, batch_size)
    return [{"dim": _label(t.dim, DIM_EDGES, "dim", "d"), "hits": _label(h, HITS_EDGES, "hits/row"),
             "pooling": _label(t.pooling_factor, POOLING_EDGES, "pooling")} for t, h in zip(tables, hits)]


def shard_bucket(tables: Sequence[TableSpec], batch_size: int = REFERENCE_BATCH) -> dict[str, str]:
    """The bucket of a shard's dominant table (most lookups × row width), plus whether it is fused."""
    if not tables:
        return {"dim": "empty", "hits": "empty", "pooling": "empty", "tables": "0"}
    weight = [t.pooling_factor * t.dim for t in tables]
    i = int(np.argmax(weight))
    b = table_buckets([tables[i]], batch_size)[0]
    b["tables"] = "1" if len(tables) == 1 else "2–12" if len(tables) <= 12 else "13+"
    return b
