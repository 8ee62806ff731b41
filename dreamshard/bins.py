"""The reuse bins: DreamShard's description of a table's access pattern (docs/design.md §2), and the
maths that derives them from a distribution.

Bin i of a table holds the fraction of its distinct accessed rows whose access count in one batch
(of REFERENCE_BATCH samples) falls in (0,1], (1,2], (2,4], ..., (2^14, 2^15], and > 2^15: 17 bins.
Everything that spells out a bin edge takes it from here: the table features and files
(tables.py), a bin's mean access count (`BIN_MEAN`), the bins measured on an actual stream
(`count_bins`, used by streams.py) and the expected bins of a synthetic distribution
(`reuse_stats_many`). This is the bottom of the house: it imports no other dreamshard module.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

NUM_BINS = 17
BIN_EDGES = [0] + [2**i for i in range(16)]  # lower edges: (0,1], (1,2], (2,4], ... , (2^15, inf)
BIN_LABELS = [f"({BIN_EDGES[i]},{BIN_EDGES[i + 1]}]" for i in range(16)] + [f"({BIN_EDGES[-1]},inf)"]
REFERENCE_BATCH = 65_536  # batch size at which reuse bins are defined (the 2021 DLRM file's)
# A row's mean access count in each bin (counts are integers): 1 for (0,1], the mean of the
# integers in (edge_j, edge_j+1], and twice the last edge for the open bin.
BIN_MEAN = np.array([1.0] + [(BIN_EDGES[j] + 1 + BIN_EDGES[j + 1]) / 2 for j in range(1, NUM_BINS - 1)] + [2.0 * BIN_EDGES[-1]])
_EDGES = np.array(BIN_EDGES, dtype=np.float64)


def count_bins(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows [17], lookups [17]) of integer access counts >= 1 (one per distinct row): how many
    rows have their count in each bin, and how many lookups those rows took."""
    counts = np.asarray(counts)
    which = np.searchsorted(_EDGES, counts, side="left") - 1  # edge_i < count <= edge_i+1
    return np.bincount(which, minlength=NUM_BINS).astype(np.float64), np.bincount(which, weights=counts, minlength=NUM_BINS)


def zipf_alpha(distribution: str) -> float | None:
    return None if distribution == "uniform" else float(distribution.split(":", 1)[1])


def _zipf_probabilities(rows: np.ndarray, alpha: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """P(rank k) of the zipf sampler (`streams.synthetic_bags`; exact for its continuous inverse-CDF construction):
    ((k+2)^e - (k+1)^e) / ((rows+1)^e - 1), e = 1 - alpha (the log form at alpha = 1); 0 past the
    table. Arguments broadcast."""
    x0, x1 = ranks + 1.0, ranks + 2.0
    one = np.abs(alpha - 1.0) < 1e-9
    e = np.where(one, 0.5, 1.0 - alpha)  # any value off 0 where alpha = 1: that branch is discarded
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        p = np.where(one, (np.log(x1) - np.log(x0)) / np.log(rows + 1.0), (x1**e - x0**e) / ((rows + 1.0) ** e - 1.0))
    return np.where(ranks < rows, p, 0.0)


# --------------------------------------------------------------------------------------------
# Reuse statistics (expected, analytic), many tables at once
# --------------------------------------------------------------------------------------------
#
# A table's expected bins are a sum over its rows of P(that row's count falls in bin i), with
# counts ~ Poisson(lam_k), lam_k = lookups × P(rank k). Per table that is millions of rows, so:
#   - uniform: every row has the same lam: one evaluation;
#   - zipf: the hottest _HEAD ranks one by one (there lam changes a lot from one rank to the
#     next, and the bins of a small table hinge on each); the rest as a continuum of ranks
#     whose lam falls in cells of a fixed log-lam grid: the number of ranks in a cell comes
#     from inverting lam(rank) at the cell edges, and what they contribute from the cell's mean
#     and slope of the Poisson bin probabilities (tabulated once for all tables) and the ranks'
#     mean position in the cell.
#     Ranks with lam above the grid are all in the top bin; below it, each is looked up at most
#     once (the error is O(lam) relative, lam < _LAM_MIN).
# The Poisson bin probabilities themselves come from a table in sqrt(lam) (exact ones cost
# ~150 ns per bin edge). A table then costs a few thousand vector elements and small matrix
# products: ~20,000 tables a second on one core (benchmarks/reuse_bins_speed.py), where the
# former per-table sum over ~6,000 representative ranks took ~7 ms. Against that sum (kept in
# tests/test_streams.py as the reference), bins and lookup bins agree within 2.5e-4 and distinct
# rows within 1e-4 relative over rows 1..10^10, pooling 10^-3..10^3, zipf alpha 0.05..3.

_HEAD = 64  # 32 leaves errors of ~1e-3 on tables of a few hundred rows
_LAM_MIN, _LAM_MAX = 1e-5, 1.6 * 2.0**15  # 1.6 · 2^15 is 86 standard deviations above the top edge
_CELLS_PER_E = 64  # grid cells per factor e of lam; 32 leaves ~3e-4 on near-uniform small tables
_CHUNK = 2048  # tables per block: bounds the [tables, cells] arrays at ~10 MB


def _poisson_bins_exact(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., 17] each: P(edge_i < C <= edge_i+1) and E[C; edge_i < C <= edge_i+1], C ~ Poisson(lam).

    P(C <= edge) is 0 or 1 to within 1e-7 outside the 8 edges from lam/32 to 8·lam, so only those
    are evaluated. ~150 ns per evaluation near a bin edge: only used to build the tables below."""
    from scipy.special import gammaincc  # regularized upper gamma: P(Poisson(lam) <= k) = Q(k+1, lam)

    lam = np.asarray(lam, np.float64)
    flat = lam.reshape(-1, 1)
    window = 8
    first = np.clip(np.searchsorted(_EDGES, flat[:, 0], side="right") - 1 - 4, 0, len(_EDGES) - window)[:, None]
    idx = first + np.arange(window)
    edge = _EDGES[idx]
    bins = np.arange(len(_EDGES))[None, :]
    cdf = (bins >= first + window).astype(np.float64)  # P(C <= edge): 1 above the window, 0 below
    below = cdf.copy()  # P(C <= edge - 1), 0 at edge 0
    np.put_along_axis(cdf, idx, gammaincc(edge + 1, flat), axis=1)
    np.put_along_axis(below, idx, np.where(edge > 0, gammaincc(np.maximum(edge, 1), flat), 0.0), axis=1)
    ones = np.ones_like(cdf[:, :1])
    in_bin = np.diff(np.concatenate([cdf, ones], 1), axis=1)
    # E[C; a < C <= b] = lam · P(a - 1 < C' <= b - 1), C' ~ Poisson(lam)
    lookups = flat * np.diff(np.concatenate([below, ones], 1), axis=1)
    return in_bin.reshape(*lam.shape, -1), lookups.reshape(*lam.shape, -1)


_SQRT_STEP = 0.01  # grid step in sqrt(lam), where every bin edge is a transition of width ~1/2
_SERIES = 25  # Poisson terms summed below lam = 1 (the next is < 1e-25)


@lru_cache(maxsize=1)
def _point_table() -> np.ndarray:
    """[n, 34] `_poisson_bins_exact` at sqrt(lam) = 1, 1.01, ..., past sqrt(_LAM_MAX), the
    lookups divided by lam; linear interpolation in sqrt(lam) is within ~1e-5 of exact."""
    root = np.arange(1.0, np.sqrt(_LAM_MAX) + 2 * _SQRT_STEP, _SQRT_STEP)
    in_bin, lookups = _poisson_bins_exact(root**2)
    return np.concatenate([in_bin, lookups / root[:, None] ** 2], axis=1)


def _poisson_bins(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_poisson_bins_exact` fast: a series below lam = 1 (exact), interpolation in a table up to
    _LAM_MAX, the top bin above it."""
    lam = np.asarray(lam, np.float64)
    flat = lam.reshape(-1)
    out = np.zeros((len(flat), 2 * NUM_BINS))
    small = flat < 1.0
    if small.any():  # P(C = j) = e^-lam lam^j / j!, j < _SERIES, summed into the bins
        j = np.arange(_SERIES)
        pmf = np.exp(-flat[small])[:, None] * np.cumprod(np.concatenate([np.ones((small.sum(), 1)), flat[small, None] / j[1:]], 1), axis=1)
        member = (j[:, None] > _EDGES[None, :]) & (j[:, None] <= np.append(_EDGES[1:], np.inf)[None, :])
        out[small, :NUM_BINS] = pmf @ member
        out[small, NUM_BINS:] = (pmf * j) @ member / np.where(flat[small] > 0, flat[small], 1.0)[:, None]
    mid = ~small & (flat <= _LAM_MAX)
    if mid.any():
        table = _point_table()
        pos = (np.sqrt(flat[mid]) - 1.0) / _SQRT_STEP
        i = np.minimum(pos.astype(np.int64), len(table) - 2)
        w = (pos - i)[:, None]
        out[mid] = table[i] * (1.0 - w) + table[i + 1] * w
    big = flat > _LAM_MAX
    out[big, NUM_BINS - 1] = out[big, -1] = 1.0
    in_bin, lookups = out[:, :NUM_BINS], out[:, NUM_BINS:] * flat[:, None]
    return in_bin.reshape(*lam.shape, NUM_BINS), lookups.reshape(*lam.shape, NUM_BINS)


@lru_cache(maxsize=1)
def _cell_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log-lam cell edges [G+1] and, for each of _poisson_bins' two outputs, each cell's mean and
    slope over the cell [2, G, 17]: f(t) ≈ mean + slope·(t - 1/2), t in [0, 1] across the cell
    (least squares; 64 points per cell resolve the sharpest bin edge, 2^-7.5 wide in log-lam)."""
    cells = int(np.ceil(np.log(_LAM_MAX / _LAM_MIN) * _CELLS_PER_E))
    u = np.linspace(np.log(_LAM_MIN), np.log(_LAM_MAX), cells + 1)
    t = (np.arange(64) + 0.5) / 64
    in_bin, lookups = _poisson_bins(np.exp(u[:-1, None] + t * np.diff(u)[:, None]))  # [G, 64, 17]
    fit = lambda f: np.stack([f.mean(axis=1), 12 * ((t - 0.5)[None, :, None] * f).mean(axis=1)])
    return u, fit(in_bin), fit(lookups)


def _expm1_over(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    """(exp(e·a) - 1) / e, and its limit a at e = 0, without cancellation near e = 0."""
    safe = np.where(e == 0, 1.0, e)
    return np.where(e == 0, a, np.expm1(safe * a) / safe)


def _zipf_tail_share(rows: np.ndarray, e: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(rank >= x + 1/2) under `_zipf_probabilities`' law (e = 1 - alpha), for real x:
    ((rows+1)^e - y^e) / ((rows+1)^e - 1), y = x + 3/2, in a form exact near e = 0."""
    y = x + 1.5
    return y**e * _expm1_over(e, np.log((rows + 1.0) / y)) / _expm1_over(e, np.log(rows + 1.0))


def _zipf_share_at(x: np.ndarray, rows: np.ndarray, e: np.ndarray) -> np.ndarray:
    """P(rank x) for real x >= 0: `_zipf_probabilities`' law (e = 1 - alpha) written as
    h(y) / n, y = x + 3/2, h(y) = ((y+1/2)^e - (y-1/2)^e) / e, n = ((rows+1)^e - 1) / e."""
    y = x + 1.5
    return (y - 0.5) ** e * _expm1_over(e, np.log1p(1.0 / (y - 0.5))) / _expm1_over(e, np.log(rows + 1.0))


def _zipf_rank_of(log_lam: np.ndarray, log_lookups: np.ndarray, rows: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The real rank x past the head whose lam (lookups × the continuous extension of
    `_zipf_probabilities`, falling in x) is exp(log_lam); clipped to [_HEAD - 1/2, rows - 1/2].

    P(rank x) = h(y) / n with y = x + 3/2, n = ((rows+1)^e - 1) / e and
    h(y) = ((y+1/2)^e - (y-1/2)^e) / e = y^-alpha (1 + alpha (alpha+1) / (24 y^2) + O(y^-4)),
    inverted to the same order: relative error O(y^-4) < 1e-7 past the head."""
    e = 1.0 - alpha
    lo, hi = _HEAD + 1.0, np.maximum(rows + 1.0, _HEAD + 1.0)
    with np.errstate(over="ignore", under="ignore"):
        y = np.maximum(np.exp((log_lookups - np.log(_expm1_over(e, np.log(rows + 1.0))) - log_lam) / alpha), 1.0)
        y = y * np.exp((alpha + 1.0) / (24.0 * y * y))
    return np.clip(y, lo, hi) - 1.5


def reuse_stats_many(rows: Sequence[int], pooling_factors: Sequence[float], distributions: Sequence[str], batch_size: int = REFERENCE_BATCH) -> dict:
    """Expected reuse statistics of one batch of many tables (Poisson counts; see above), as
    arrays: `bins` [T, 17] (fraction of distinct rows per bin — the table feature),
    `lookup_bins` [T, 17] (fraction of lookups landing on rows of each bin — the published
    'index distribution'), `unique` [T] (expected distinct rows), `lookups` [T] (expected
    lookups). A table with no lookups has all-zero bins. ~20,000 tables a second on one core."""
    rows = np.asarray(rows, np.float64).reshape(-1)
    lookups = batch_size * np.asarray(pooling_factors, np.float64).reshape(-1)
    alpha = np.array([np.nan if d == "uniform" else zipf_alpha(d) for d in distributions], np.float64).reshape(-1)
    if not len(rows) == len(lookups) == len(alpha):
        raise ValueError(f"{len(rows)} rows, {len(lookups)} pooling factors and {len(alpha)} distributions")
    T = len(rows)
    rows_in, lookups_in = np.zeros((T, NUM_BINS)), np.zeros((T, NUM_BINS))
    uniform = np.isnan(alpha) & (lookups > 0)
    if uniform.any():  # every row alike
        in_bin, lk = _poisson_bins(lookups[uniform] / rows[uniform])
        rows_in[uniform], lookups_in[uniform] = in_bin * rows[uniform, None], lk * rows[uniform, None]
    zipf = np.flatnonzero(~np.isnan(alpha) & (lookups > 0))
    for start in range(0, len(zipf), _CHUNK):
        block = zipf[start : start + _CHUNK]
        rows_in[block], lookups_in[block] = _zipf_block(rows[block], lookups[block], alpha[block])
    # rounding and the in-cell slopes can leave a hair below 0 where a bin is empty
    rows_in, lookups_in = np.maximum(rows_in, 0.0), np.maximum(lookups_in, 0.0)
    unique, total = rows_in.sum(axis=1), lookups_in.sum(axis=1)
    return {
        "bins": rows_in / np.where(unique > 0, unique, 1.0)[:, None],
        "lookup_bins": lookups_in / np.where(total > 0, total, 1.0)[:, None],
        "unique": unique,
        "lookups": np.maximum(lookups, 0.0),
    }


def reuse_bins_many(rows: Sequence[int], pooling_factors: Sequence[float], distributions: Sequence[str], batch_size: int = REFERENCE_BATCH) -> np.ndarray:
    """[T, 17] expected reuse bins of many tables (`reuse_stats_many`'s `bins`)."""
    return reuse_stats_many(rows, pooling_factors, distributions, batch_size)["bins"]


def reuse_stats(rows: int, pooling_factor: float, distribution: str, batch_size: int = REFERENCE_BATCH) -> dict:
    """`reuse_stats_many` of one table, as lists and floats. Prefer the batched call for many."""
    s = reuse_stats_many([rows], [pooling_factor], [distribution], batch_size)
    return {"bins": s["bins"][0].tolist(), "lookup_bins": s["lookup_bins"][0].tolist(), "unique": float(s["unique"][0]), "lookups": float(s["lookups"][0])}


def reuse_bins(rows: int, pooling_factor: float, distribution: str, batch_size: int = REFERENCE_BATCH) -> list[float]:
    return reuse_stats(rows, pooling_factor, distribution, batch_size)["bins"]


def _zipf_block(rows: np.ndarray, lookups: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows_in, lookups_in) [B, 17] of zipf tables: the exact head, then the tail by cells."""
    e = 1.0 - alpha
    # head: ranks 0.._HEAD-1 one by one
    in_bin, lk = _poisson_bins(lookups[:, None] * _zipf_probabilities(rows[:, None], alpha[:, None], np.arange(_HEAD, dtype=np.float64)[None, :]))
    rows_in, lookups_in = in_bin.sum(axis=1), lk.sum(axis=1)
    # tail: ranks _HEAD..rows-1 as a continuum x in [_HEAD - 1/2, rows - 1/2]
    u, cell_rows, cell_lookups = _cell_tables()
    lo, h = _HEAD - 0.5, u[1] - u[0]
    x = _zipf_rank_of(u[None, :], np.log(lookups)[:, None], rows[:, None], alpha[:, None])
    mass = x[:, :-1] - x[:, 1:]  # ranks per cell (x falls as lam rises)
    # Where in its cell a cell's ranks lie: their density in log-lam is ∝ exp(-u / alpha), so in a
    # full cell their mean position is m(h / alpha), m(z) = 1/z - 1/(e^z - 1) (the mean of an
    # exponential cut to [0, 1]); in the (at most two) cells holding an end of the table's
    # log-lam range, the same cut to the part of the cell the table covers. The position weights
    # each cell's slope; without it a near-uniform table (small alpha: steep density) is off by
    # ~1e-3.
    def mean_position(z: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.where(z < 1e-4, 0.5 - z / 12, 1.0 / z - 1.0 / np.expm1(z))

    rate = h / alpha
    offset = mass * (mean_position(rate) - 0.5)[:, None]
    with np.errstate(divide="ignore"):
        ends = [np.log(lookups * _zipf_share_at(np.minimum(at, np.maximum(rows - 0.5, lo)), rows, e)) for at in (rows - 0.5, np.full_like(rows, lo))]
    b = np.arange(len(rows))
    for end in ends:
        j = np.clip(np.floor((np.nan_to_num(end, neginf=u[0]) - u[0]) / h), 0, len(u) - 2).astype(np.int64)
        t_lo, t_hi = (np.clip((ends[i] - u[j]) / h, 0.0, 1.0) for i in (0, 1))
        width = np.maximum(t_hi - t_lo, 0.0)
        offset[b, j] = mass[b, j] * (t_lo + width * mean_position(rate * width) - 0.5)
    rows_in += mass @ cell_rows[0] + offset @ cell_rows[1]
    lookups_in += mass @ cell_lookups[0] + offset @ cell_lookups[1]
    # above the grid: every rank in the top bin; below it: each rank looked up at most once
    tail = rows > _HEAD
    share = [np.where(tail, _zipf_tail_share(rows, e, at), 0.0) for at in (np.full_like(rows, lo), x[:, -1], x[:, 0])]
    rows_in[:, -1] += x[:, -1] - lo
    lookups_in[:, -1] += lookups * (share[0] - share[1])
    rows_in[:, 0] += lookups * share[2]
    lookups_in[:, 0] += lookups * share[2]
    return rows_in, lookups_in
