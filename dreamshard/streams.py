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


def _rank_probabilities(rows: int, alpha: float | None, ranks: np.ndarray) -> np.ndarray:
    """P(rank k) for the sampler below: exact for the continuous inverse-CDF construction."""
    if alpha is None:
        return np.full(ranks.shape, 1.0 / rows)
    x0, x1 = ranks + 1.0, ranks + 2.0
    if abs(alpha - 1.0) < 1e-9:
        return (np.log(x1) - np.log(x0)) / math.log(rows + 1.0)
    e = 1.0 - alpha
    return (x1**e - x0**e) / ((rows + 1.0) ** e - 1.0)


def _bin_bounds() -> list[tuple[int, int | None]]:
    """Integer count ranges [lo, hi] of each bin; hi None = unbounded."""
    bounds = [(1, 1)]
    for i in range(1, 16):
        bounds.append((2 ** (i - 1) + 1, 2**i))
    bounds.append((2**15 + 1, None))
    return bounds


def _rank_groups(rows: int, exact: int = 2048, groups: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Representative ranks and their multiplicities: exact for the head, geometric buckets after.

    The popularity of neighbouring ranks in the tail differs by far less than the Poisson
    spread of their counts, so one representative per bucket changes the histograms by < 1e-3.
    """
    head = np.arange(min(rows, exact), dtype=np.float64)
    if rows <= exact:
        return head, np.ones_like(head)
    edges = np.unique(np.geomspace(exact, rows, groups).astype(np.int64))
    edges[0], edges[-1] = exact, rows
    mids = (edges[:-1] + edges[1:] - 1) / 2.0
    return np.concatenate([head, mids]), np.concatenate([np.ones_like(head), np.diff(edges).astype(np.float64)])


def reuse_stats(rows: int, pooling_factor: float, distribution: str, batch_size: int = REFERENCE_BATCH) -> dict:
    """Expected reuse statistics of one batch under the Poisson approximation of the counts.

    Returns `bins` (fraction of distinct rows per bin — the table feature), `lookup_bins`
    (fraction of lookups landing on rows of each bin — the published 'index distribution'),
    `unique` (expected distinct rows) and `lookups` (expected lookups).
    """
    from scipy.special import gammaincc  # regularized upper gamma: P(Poisson(lam) <= k) = Q(k+1, lam)

    lookups = batch_size * pooling_factor
    if lookups <= 0:
        return {"bins": [0.0] * NUM_BINS, "lookup_bins": [0.0] * NUM_BINS, "unique": 0.0, "lookups": 0.0}
    ranks, weight = _rank_groups(rows)
    lam = lookups * _rank_probabilities(rows, _zipf_alpha(distribution), ranks)
    # P(C <= k) for every bin edge k at once (C ~ Poisson(lam)); edges are 0, 1, 2, 4, ..., 2^15
    ks = np.array([0] + [2**i for i in range(16)], dtype=np.float64)
    cdf = gammaincc(ks[:, None] + 1, lam[None, :])  # [17, R]
    cdf_below = np.vstack([np.zeros_like(lam), gammaincc(ks[1:, None], lam[None, :])])  # P(C <= k-1)
    ones = np.ones((1, lam.size))
    in_bin = np.diff(np.vstack([cdf, ones]), axis=0)  # P(edge_i < C <= edge_{i+1})
    # E[C; edge_i < C <= edge_{i+1}] = lam * P(edge_i - 1 < C' <= edge_{i+1} - 1), C' ~ Poisson(lam)
    lookups_bin = lam * np.diff(np.vstack([cdf_below, ones]), axis=0)
    rows_in = (in_bin * weight).sum(axis=1).tolist()
    lookups_in = (lookups_bin * weight).sum(axis=1).tolist()
    unique = sum(rows_in)
    return {
        "bins": [r / unique for r in rows_in],
        "lookup_bins": [x / sum(lookups_in) for x in lookups_in],
        "unique": unique,
        "lookups": lookups,
    }


def reuse_bins(rows: int, pooling_factor: float, distribution: str, batch_size: int = REFERENCE_BATCH) -> list[float]:
    return reuse_stats(rows, pooling_factor, distribution, batch_size)["bins"]


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
