"""Index streams: the lookups a table sees in one batch, and the reuse statistics they imply.

Synthetic streams are regenerated from (distribution, seed, step) for any batch size on any
device, so a plan file is enough to rebuild the exact inputs of a measurement:
  - bag lengths ~ Poisson(pooling_factor);
  - `zipf:a`: popularity rank k in [0, rows) with P(k) ∝ (k+1)^-a (inverse-CDF of the continuous
    law, so sampling is O(1) per lookup at any table size); `uniform`: all rows equally likely;
  - rank → row through a fixed bijection (multiplication by a prime mod rows, plus a seeded
    offset), so hot rows are scattered over the table as hashed ids are.
DLRM-format streams (`dlrm:<file>#<t>`) replay the file's bags, cycling samples for batches larger
than the file's.
"""

from __future__ import annotations

import gzip
import io
import math
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from dreamshard.tables import NUM_BINS, REFERENCE_BATCH, TableError, TableSpec

_PRIME = 2_147_483_647  # 2^31 - 1: coprime with every table size below it


def _zipf_alpha(distribution: str) -> float | None:
    return None if distribution == "uniform" else float(distribution.split(":", 1)[1])


def _zipf_probabilities(rows: np.ndarray, alpha: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """P(rank k) of the zipf sampler below (exact for its continuous inverse-CDF construction):
    ((k+2)^e - (k+1)^e) / ((rows+1)^e - 1), e = 1 - alpha (the log form at alpha = 1); 0 past the
    table. Arguments broadcast."""
    x0, x1 = ranks + 1.0, ranks + 2.0
    one = np.abs(alpha - 1.0) < 1e-9
    e = np.where(one, 0.5, 1.0 - alpha)  # any value off 0 where alpha = 1: that branch is discarded
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        p = np.where(one, (np.log(x1) - np.log(x0)) / np.log(rows + 1.0), (x1**e - x0**e) / ((rows + 1.0) ** e - 1.0))
    return np.where(ranks < rows, p, 0.0)


def _bin_bounds() -> list[tuple[int, int | None]]:
    """Integer count ranges [lo, hi] of each bin; hi None = unbounded."""
    bounds = [(1, 1)]
    for i in range(1, 16):
        bounds.append((2 ** (i - 1) + 1, 2**i))
    bounds.append((2**15 + 1, None))
    return bounds


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
_EDGES = np.array([0] + [2**i for i in range(16)], dtype=np.float64)  # lower count edge of each bin
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
    alpha = np.array([np.nan if d == "uniform" else _zipf_alpha(d) for d in distributions], np.float64).reshape(-1)
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


def empirical_reuse(indices: torch.Tensor) -> dict:
    """Reuse statistics of an actual batch of one table's indices."""
    if indices.numel() == 0:
        return {"bins": [0.0] * NUM_BINS, "lookup_bins": [0.0] * NUM_BINS, "unique": 0, "lookups": 0}
    _, counts = torch.unique(indices, return_counts=True)
    counts = counts.cpu().numpy()
    rows_in, lookups_in = [], []
    for lo, hi in _bin_bounds():
        m = (counts >= lo) & ((counts <= hi) if hi is not None else True)
        rows_in.append(float(m.sum()))
        lookups_in.append(float(counts[m].sum()))
    return {
        "bins": [r / len(counts) for r in rows_in],
        "lookup_bins": [x / counts.sum() for x in lookups_in],
        "unique": int(len(counts)),
        "lookups": int(counts.sum()),
    }


# --------------------------------------------------------------------------------------------
# Generating batches
# --------------------------------------------------------------------------------------------


def _generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step * 7_919 + 12345) % (2**63 - 1))
    return g


def synthetic_bags(table: TableSpec, batch_size: int, step: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths [B], indices [sum lengths]) of one table for batch number `step`."""
    device = torch.device(device)
    g = _generator(table.seed, step, device)
    rate = torch.full((batch_size,), float(table.pooling_factor), device=device)
    lengths = torch.poisson(rate, generator=g).to(torch.int64)
    n = int(lengths.sum())
    u = torch.rand(n, generator=g, device=device, dtype=torch.float64)
    alpha = _zipf_alpha(table.distribution or "uniform")
    rows = table.rows
    if alpha is None:
        rank = torch.floor(u * rows)
    elif abs(alpha - 1.0) < 1e-9:
        rank = torch.floor(torch.exp(u * math.log(rows + 1.0))) - 1
    else:
        e = 1.0 - alpha
        rank = torch.floor((u * ((rows + 1.0) ** e - 1.0) + 1.0) ** (1.0 / e)) - 1
    rank = rank.clamp_(0, rows - 1).to(torch.int64)
    offset = (table.seed * 104_729) % rows
    return lengths, (rank * (_PRIME % rows) + offset) % rows


@lru_cache(maxsize=4)
def _load_dlrm_file(path: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return load_dlrm_file(path)


def table_bags(table: TableSpec, batch_size: int, step: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths, indices) of one table for any stream kind."""
    dist = table.distribution or "uniform"
    if not dist.startswith("dlrm:"):
        return synthetic_bags(table, batch_size, step, device)
    path, t = dist[5:].rsplit("#", 1)
    indices, offsets, _ = _load_dlrm_file(path)
    file_batch = (offsets.numel() - 1) // _num_tables(path)
    t = int(t)
    samples = (torch.arange(batch_size) + step * batch_size) % file_batch + t * file_batch
    starts, ends = offsets[samples], offsets[samples + 1]
    lengths = ends - starts
    pos = torch.repeat_interleave(starts - torch.cumsum(lengths, 0) + lengths, lengths) + torch.arange(int(lengths.sum()))
    return lengths.to(device), indices[pos].to(device)


def shard_batch(tables: Sequence[TableSpec], batch_size: int, step: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """FBGEMM TBE inputs for a shard: (indices, offsets[T*B+1]), table-major."""
    lengths, indices = [], []
    for t in tables:
        ln, ix = table_bags(t, batch_size, step, device)
        lengths.append(ln)
        indices.append(ix)
    if not tables:
        return torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device)
    all_lengths = torch.cat(lengths)
    offsets = torch.zeros(all_lengths.numel() + 1, dtype=torch.int64, device=all_lengths.device)
    torch.cumsum(all_lengths, 0, out=offsets[1:])
    return torch.cat(indices), offsets


# --------------------------------------------------------------------------------------------
# DLRM dataset format (github facebookresearch/dlrm_datasets)
# --------------------------------------------------------------------------------------------


def load_dlrm_file(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indices, offsets, lengths) from a `.pt` or `.pt.gz` file; lengths is [T, B]."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one user-facing error
        raise TableError(f"{path}: not a DLRM dataset file ({type(e).__name__}: {e})") from None
    if not (isinstance(data, (tuple, list)) and len(data) == 3):
        raise TableError(f"{path}: expected a tuple (indices, offsets, lengths)")
    indices, offsets, lengths = (torch.as_tensor(x).to(torch.int64) for x in data)
    if lengths.dim() != 2:
        raise TableError(f"{path}: lengths must be [tables, batch], got shape {tuple(lengths.shape)}")
    T, B = lengths.shape
    if offsets.numel() != T * B + 1 or int(offsets[-1]) != indices.numel():
        raise TableError(f"{path}: offsets ({offsets.numel()}) do not match {T} tables × {B} samples and {indices.numel()} indices")
    return indices, offsets, lengths


@lru_cache(maxsize=4)
def _num_tables(path: str) -> int:
    return _load_dlrm_file(path)[2].shape[0]


def tables_from_dlrm(path: str | Path, dims: Sequence[int] | int = 64, prefix: str = "t") -> list[TableSpec]:
    """Per-table specs of a DLRM-format file: rows = max index + 1, pooling = mean length,
    reuse bins measured on the file's batch. Dims are not in the file: pass one or a list."""
    path = Path(path).resolve()
    indices, offsets, lengths = _load_dlrm_file(str(path))
    T, B = lengths.shape
    dims = [dims] * T if isinstance(dims, int) else list(dims)
    if len(dims) != T:
        raise TableError(f"{path}: {T} tables but {len(dims)} dims given")
    specs = []
    for t in range(T):
        ix = indices[int(offsets[t * B]) : int(offsets[(t + 1) * B])]
        stats = empirical_reuse(ix)
        specs.append(
            TableSpec(
                name=f"{prefix}{t}",
                rows=int(ix.max()) + 1 if ix.numel() else 1,
                dim=int(dims[t]),
                pooling_factor=float(lengths[t].double().mean()),
                bins=tuple(stats["bins"]) if ix.numel() else (0.0,) * NUM_BINS,
                distribution=f"dlrm:{path}#{t}",
            )
        )
    return specs
