"""The work a fused table-batched embedding step does per table: pure shape arithmetic.

`table_terms` counts, for each table under a workload (batch size, precision, optimizer), what the
step's kernels do with it — lookups, gathered bytes split by how often a row is reused in the batch
(from the table's reuse bins), output and gradient bytes, row updates, and the Triton kernel's tile
geometry (`triton_geometry`: forward programs, backward tiles and levels, masked paths), mirrored
from costs/kernels/triton_tbe.py (which needs triton; tests/test_sim.py checks the constants and
the block-width rule against its source). What each term models: costs/sim.py's module doc.

Two users, so the counts are written once here and neither imports the other:
  - the calibrated simulator (costs/sim.py), a cost backend: a shard's terms are its tables' sums
    (`sim.shard_terms` sets the per-shard ones), priced by coefficients fitted to measurements;
  - DreamShard's cost net (learned/nets.py, `KernelFeatures`): the same per-table counts as input
    features, their coefficients left to the net. Planners and learned modules may import this
    module: it is counts of tables only (no backend, no measurement, no calibration file).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from dreamshard.bins import BIN_MEAN, NUM_BINS, REFERENCE_BATCH
from dreamshard.tables import TableSpec
from dreamshard.tasks import Workload

TERMS = ("launch", "active", "tables", "lookups", "cold_bytes", "warm_bytes", "hot_bytes", "out_bytes", "grad_bytes", "update_bytes",
         "programs", "wide_programs", "masked_gather_bytes", "tiles", "masked_grad_bytes", "launches", "wide_grad_bytes",
         "branch_lookups")
# Terms a shard does not get by summing its tables' (set per shard in shard_terms): the fixed ones,
# the forward's launch configuration (wide_programs) and branches (branch_lookups), the backward's
# launches shared per class, and its gradient reads out of a wide gradient matrix (wide_grad_bytes).
SHARD_TERMS = ("launch", "active", "wide_programs", "launches", "wide_grad_bytes", "branch_lookups")
SECTOR = 32  # bytes per DRAM/L2 transaction

# The Triton kernel's tile geometry (costs/kernels/triton_tbe.py; that module needs triton, so it is
# mirrored here and tests/test_sim.py checks the constants against its source).
FWD_LANES = 1024
BWD_LANES = 4096
BWD_UP_LANES = 2048
BWD_PMAX = 64
BWD_MAX_TW = 256
TW_CLASSES = (16, 32, 64, 128, 256, 512, 1024)
DP_CLASSES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)  # the forward's tile widths
WIDE_DIM = 256  # a shard with a dim over this runs its forward with 8 warps and the wide branches
# The backward reads each table's gradient columns out of the shard's [B, Σ dims] gradient: past
# this width (Σ dims) each lookup's read costs more, by the log of the width over it (`wide_grad_factor`).
WIDE_GRAD_WIDTH = 512


def fwd_class(dim: np.ndarray) -> np.ndarray:
    """triton_tbe._dim_class: the forward's branch of a dim, 0..17 (its tile width DP, and whether
    the dim fills it). A shard's forward is one launch compiled with a branch per class it has."""
    dim = np.asarray(dim, dtype=np.int64)
    dp = _pow2(dim)
    return np.log2(dp).astype(np.int64) - 2 + np.where(dp == dim, 0, len(DP_CLASSES))


def wide_grad_factor(width: np.ndarray) -> np.ndarray:
    """The `wide_grad_bytes` term's weight on a shard's gradient bytes: log2(Σ dims / WIDE_GRAD_WIDTH),
    0 below it. Measured, not derived: shards of 16–128 tables (Σ dims to ~14,000) on an H100 had
    their backward priced 7–28% low by the other terms, more the wider they were
    (benchmarks/gpu_large_shards.py, docs/simulator.md)."""
    return np.maximum(np.log2(np.maximum(width, 1.0) / WIDE_GRAD_WIDTH), 0.0)


def _pow2(dim: np.ndarray) -> np.ndarray:
    return np.maximum(4, 2 ** np.ceil(np.log2(np.maximum(dim, 1)))).astype(np.int64)


def _block_width(dim: int, whole_row: bool) -> int:
    """triton_tbe._bwd_tile_width: the column block covering the dim with the fewest padded columns
    (each block ~16 elements of overhead), or the whole row rounded up to a power of two (Adagrad)."""
    if whole_row:
        return max(TW_CLASSES[0], 1 << (int(dim) - 1).bit_length())
    best = min((-(-dim // tw) * (tw + 16), -tw) for tw in TW_CLASSES if tw <= BWD_MAX_TW)
    return -best[1]


# per dim (0..1,024) and optimizer: the block width (and, below, the tile class 0..13 that shares launches)
ALL_DIMS = np.arange(0, 1025, dtype=np.int64)
BLOCK_WIDTH = {whole: np.array([_block_width(max(d, 4), whole) for d in ALL_DIMS]) for whole in (False, True)}


# per dim: the backward's tile class (its block width, and whether the dim fills it: tables of one
# class share each level's launch) and how many classes there are; the forward's branch classes (fwd_class)
TILE_CLASSES = 2 * len(TW_CLASSES)
FWD_CLASSES = 2 * len(DP_CLASSES)
TILE_CLASS = {whole: np.log2(BLOCK_WIDTH[whole]).astype(np.int64) - 4 + np.where(ALL_DIMS % BLOCK_WIDTH[whole] == 0, 0, len(TW_CLASSES))
              for whole in (False, True)}


def _chunk(tw: np.ndarray, lanes: int) -> np.ndarray:
    """triton_tbe._chunk: elements of a tile, P = lanes / TW within [16, BWD_PMAX]."""
    return np.minimum(np.maximum(lanes // tw, 16), max(BWD_PMAX, 16))


def triton_geometry(dim: np.ndarray, lookups: np.ndarray, batch_size: int, elt_bytes: int, whole_row: bool) -> dict[str, np.ndarray]:
    """Per table: forward programs, level-0 backward tiles (times column blocks), levels, and which
    paths are masked (dims that are not a power of two forward, not a multiple of the block backward)."""
    dim = np.asarray(dim, dtype=np.int64)
    dp = _pow2(dim)
    programs = np.ceil(batch_size / np.maximum(1, FWD_LANES // dp))
    tw = BLOCK_WIDTH[whole_row][np.minimum(dim, 1024)]
    blocks = -(-dim // tw)
    p0 = _chunk(tw, BWD_LANES // (2 if elt_bytes == 4 else 1))
    p1 = _chunk(tw, BWD_UP_LANES)
    n = np.round(lookups)
    tiles = np.ceil(n / p0)
    # levels: level 0, then each level k >= 1 cuts the 2 entries per tile of level k-1 into tiles of p1
    levels = (n > 0).astype(np.float64)
    t = tiles.copy()
    while (t > 1).any():
        more = t > 1
        t = np.where(more, np.ceil(2 * t / p1), t)
        levels += more
    return {"programs": programs, "masked_fwd": dp != dim, "tiles": tiles * blocks, "levels": levels, "masked_bwd": dim % tw != 0}


_HOT = np.arange(NUM_BINS) >= 5  # used more than 16 times


def cache_hits(rows_in_bin: np.ndarray, counts: np.ndarray, capacity_rows: np.ndarray) -> np.ndarray:
    """[T, NUM_BINS]: the fraction of each bin's repeated lookups that find their row still in a
    cache of `capacity_rows` rows (per table; inf: the old model, every repeat a hit).

    Che's approximation of an LRU cache under independent references: a row looked up c times in
    the batch is hit again if its previous lookup lies within the cache's characteristic window
    tau (a fraction of the batch's stream), P = 1 - exp(-c·tau), tau chosen so the expected rows
    touched within tau fill the cache: sum_bins n·(1 - exp(-c·tau)) = capacity. The forward runs a
    shard's tables one after another (its grid is table-major), so each has the cache to itself.
    Why it matters: a 440,630 × 256 table read 43 times per row fills 225 MB, far past a 60 MB L2,
    yet by its bins every repeat would be a cheap L2 hit."""
    rows_in_bin, counts = np.atleast_2d(rows_in_bin), np.atleast_2d(counts)
    counts = np.broadcast_to(counts, rows_in_bin.shape)
    capacity_rows = np.broadcast_to(np.asarray(capacity_rows, dtype=np.float64), rows_in_bin.shape[:1])
    hit = np.ones(rows_in_bin.shape)
    spill = np.flatnonzero(rows_in_bin.sum(axis=1) > capacity_rows)  # the others hold every row they touch
    if len(spill):
        n, c, k = rows_in_bin[spill], counts[spill], capacity_rows[spill]
        # Newton from tau = 0 on the touched-rows curve, which is concave and increasing in tau: every
        # step lands left of the root and the steps shrink to it (a few to tens of steps, not a bisection's 100)
        tau = np.zeros(len(spill))
        for _ in range(100):
            e = np.exp(-c * tau[:, None])
            step = (k - (n * (1.0 - e)).sum(axis=1)) / (n * c * e).sum(axis=1)
            tau += step
            if np.all(step <= 1e-9 * tau):
                break
        hit[spill] = -np.expm1(-c * tau[:, None])
    return hit


def table_terms(tables: Sequence[TableSpec], workload: Workload = Workload(), cache_bytes: float = 0.0) -> np.ndarray:
    """[T, len(TERMS)] per-table terms; a shard's terms are their sum (launch, active: set per shard).
    `cache_bytes`: the device's last-level cache; a table's repeated gathers that miss it
    (cache_hits) count as cold bytes. 0: no such limit (every repeat may hit, as calibrations without the L2 term price)."""
    n = len(tables)
    out = np.zeros((n, len(TERMS)))
    if n == 0:
        return out
    elt, batch_size = workload.elt_bytes, workload.batch_size
    dim = np.array([t.dim for t in tables], dtype=np.float64)
    rows = np.array([t.rows for t in tables], dtype=np.float64)
    pf = np.array([t.pooling_factor for t in tables], dtype=np.float64)
    # fromiter over the flattened tuples: twice as fast as np.array on a list of tuples, which
    # matters when a whole placement must be costed in a millisecond
    bins = np.fromiter(itertools.chain.from_iterable([t.bins for t in tables]), np.float64, count=n * NUM_BINS).reshape(n, NUM_BINS)
    lookups = batch_size * pf
    row_bytes = np.ceil(dim * elt / SECTOR) * SECTOR
    # Reuse at this batch from the histogram at the reference batch: a row's expected count
    # beyond its first touch scales with the batch; distinct rows never exceed the table.
    mean_count = np.maximum(bins @ BIN_MEAN, 1.0)
    mean_count = 1.0 + (mean_count - 1.0) * batch_size / REFERENCE_BATCH
    unique = np.minimum(lookups / mean_count, rows)
    lookup_share = bins * BIN_MEAN  # lookups falling in each bin, unnormalized
    norm = np.maximum(lookup_share.sum(axis=1), 1e-12)
    hot_frac = (lookup_share[:, _HOT]).sum(axis=1) / norm
    repeat = np.maximum(lookups - unique, 0.0)
    hot = np.minimum(repeat, lookups * hot_frac)
    warm = repeat - hot
    spilled = np.zeros(n)
    over = np.flatnonzero(unique * row_bytes > cache_bytes) if cache_bytes > 0 else []
    if len(over):  # only a table whose touched rows overflow the cache misses any repeat (most fit)
        rows_in_bin = unique[over, None] * bins[over] / np.maximum(bins[over].sum(axis=1, keepdims=True), 1e-12)
        # repeated lookups per bin at this batch, made to add up to the table's repeats (a table
        # smaller than its lookups clips its distinct rows; one given no bins has all rows in bin 0)
        again = rows_in_bin * (BIN_MEAN - 1.0) * batch_size / REFERENCE_BATCH
        total = again.sum(axis=1, keepdims=True)
        again = np.where(total > 0, again * repeat[over, None] / np.maximum(total, 1e-12), np.where(np.arange(NUM_BINS) == 0, repeat[over, None], 0.0))
        counts = 1.0 + np.divide(again, rows_in_bin, out=np.zeros_like(again), where=rows_in_bin > 0)
        hit = cache_hits(rows_in_bin, counts, cache_bytes / row_bytes[over])
        share = [np.divide((again[:, m] * hit[:, m]).sum(axis=1), again[:, m].sum(axis=1), out=np.ones(len(over)), where=again[:, m].sum(axis=1) > 0)
                 for m in (~_HOT, _HOT)]
        spilled[over] = warm[over] * (1.0 - share[0]) + hot[over] * (1.0 - share[1])
        warm[over], hot[over] = warm[over] * share[0], hot[over] * share[1]
    state = 4.0 if workload.optimizer == "rowwise_adagrad" else 0.0
    out[:, TERMS.index("tables")] = 1.0
    out[:, TERMS.index("lookups")] = lookups
    out[:, TERMS.index("cold_bytes")] = (unique + spilled) * row_bytes
    out[:, TERMS.index("warm_bytes")] = warm * row_bytes
    out[:, TERMS.index("hot_bytes")] = hot * row_bytes
    out[:, TERMS.index("out_bytes")] = batch_size * dim * elt
    out[:, TERMS.index("grad_bytes")] = lookups * row_bytes
    out[:, TERMS.index("update_bytes")] = unique * (2 * row_bytes + 2 * state)
    g = triton_geometry(dim, lookups, batch_size, elt, workload.optimizer == "rowwise_adagrad")
    out[:, TERMS.index("programs")] = g["programs"]
    out[:, TERMS.index("wide_programs")] = g["programs"]  # kept only in shards with a dim over WIDE_DIM (shard_terms)
    out[:, TERMS.index("masked_gather_bytes")] = np.where(g["masked_fwd"], lookups * row_bytes, 0.0)
    out[:, TERMS.index("tiles")] = g["tiles"]
    out[:, TERMS.index("masked_grad_bytes")] = np.where(g["masked_bwd"], lookups * row_bytes, 0.0)
    out[:, TERMS.index("launches")] = g["levels"]  # alone; in a shard, tables of one class share launches (shard_terms)
    # wide_grad_bytes and branch_lookups stay 0: a shard's, from its width and its dims' classes (shard_terms)
    return out


# The shard terms as functions of sums over a shard's tables (the cost net sums per-table rows into
# shard vectors, and can only apply a function after the sum): per table a row of SHARED_WIDTH
# columns (`shared_rows`), summed per shard, turned into the six SHARD_TERMS by `shared_terms`.
# A max over a shard's tables is a sum of thresholds: its launches (per tile class, the most levels
# of its tables) count, per class and level l, whether any table of the class has l levels or more.
MAX_LEVELS = 12  # a table's backward levels (levels past the first fold tiles by 8 or more: 2^31 lookups make 10)
_SHARED_SCALARS = ("tables", "active", "lookups", "programs", "wide", "grad_bytes", "width")
SHARED_SCALARS = len(_SHARED_SCALARS)
SHARED_WIDTH = SHARED_SCALARS + FWD_CLASSES + TILE_CLASSES * MAX_LEVELS
_FWD_AT = SHARED_SCALARS
_LEVELS_AT = _FWD_AT + FWD_CLASSES


def shared_rows(terms: np.ndarray, dims: np.ndarray, optimizer: str, scale: dict[str, float] | None = None) -> np.ndarray:
    """[T, SHARED_WIDTH] per table (its `table_terms` row and dim): 1; whether it has lookups; its
    lookups, forward programs and gradient bytes (each over `scale[term]`, default 1); whether its
    dim is over WIDE_DIM; its dim over WIDE_GRAD_WIDTH; its forward class, one-hot; per tile class
    and level l = 1..MAX_LEVELS, whether it is of the class with at least l levels."""
    scale = scale or {}
    dims = np.asarray(dims, dtype=np.int64)
    n = len(dims)
    out = np.zeros((n, SHARED_WIDTH))
    lookups = terms[:, TERMS.index("lookups")]
    out[:, 0] = 1.0
    out[:, 1] = lookups > 0
    out[:, 2] = lookups / scale.get("lookups", 1.0)
    out[:, 3] = terms[:, TERMS.index("programs")] / scale.get("programs", 1.0)
    out[:, 4] = dims > WIDE_DIM
    out[:, 5] = terms[:, TERMS.index("grad_bytes")] / scale.get("grad_bytes", 1.0)
    out[:, 6] = dims / WIDE_GRAD_WIDTH
    out[np.arange(n), _FWD_AT + fwd_class(dims)] = 1.0
    cls = TILE_CLASS[optimizer == "rowwise_adagrad"][np.minimum(dims, 1024)]
    levels = np.minimum(terms[:, TERMS.index("launches")], MAX_LEVELS).astype(np.int64)
    block = np.zeros((n, TILE_CLASSES, MAX_LEVELS))
    block[np.arange(n), cls] = levels[:, None] >= np.arange(1, MAX_LEVELS + 1)
    out[:, _LEVELS_AT:] = block.reshape(n, -1)
    return out


def shared_terms(sums) -> list:
    """The six SHARD_TERMS (in its order, each [...]) of shards whose `shared_rows` sum to `sums`
    [..., SHARED_WIDTH] (NumPy or torch: the cost net applies it to its shard vectors in both):
    launch and active, a shard's once; the programs of a shard with a dim over WIDE_DIM; its
    launches, per tile class its most levels; its gradient bytes × wide_grad_factor of its width;
    its lookups × its forward branches beyond the first. Equal to sim.shard_terms' (tests/test_sim.py)."""
    present = sums[..., _FWD_AT:].clip(max=1.0)  # min(1, ·) of the one-hots
    return shard_terms_of(sums, present[..., : _LEVELS_AT - _FWD_AT].sum(-1), present[..., _LEVELS_AT - _FWD_AT :].sum(-1))


def shard_terms_of(sums, branches, launches) -> list:
    """`shared_terms` from the scalar columns of the sums (the first SHARED_SCALARS), the count
    of forward classes present (`branches`) and of tile-class levels present (`launches`)."""
    width = sums[..., 6].clip(min=1.0)
    log2 = width.log2() if hasattr(width, "log2") else np.log2(width)  # a torch tensor, or NumPy
    flags = sums[..., :2].clip(max=1.0)
    return [flags[..., 0], flags[..., 1], sums[..., 3] * sums[..., 4].clip(max=1.0), launches, sums[..., 5] * log2,
            sums[..., 2] * (branches - 1.0).clip(min=0.0)]


def presence_bits(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """`shared_rows` rows [..., SHARED_WIDTH] → ([..., W] uint64, f): the forward classes and the
    tile-class levels each row has as bits, the forward ones in the first f words — of the
    columns some row has only (the others stay 0 in every sum). The OR of rows' bits counts, by
    popcount, the presences of their sum (`shard_terms_of`'s `branches` and `launches`): a greedy
    keeps a device's presences as a word or two, not ~190 columns."""
    seen = (rows.reshape(-1, SHARED_WIDTH) != 0).any(0)
    words, fwd_words = [], 0
    for k, (lo, hi) in enumerate(((_FWD_AT, _LEVELS_AT), (_LEVELS_AT, SHARED_WIDTH))):
        cols = np.flatnonzero(seen[lo:hi]) + lo
        for w in range(0, max(1, len(cols)), 64):
            c = cols[w : w + 64]
            words.append(((rows[..., c] != 0).astype(np.uint64) << np.arange(len(c), dtype=np.uint64)).sum(-1, dtype=np.uint64))
            fwd_words += k == 0
    return np.stack(words, axis=-1), fwd_words
