"""Index streams: the lookups a table sees in one batch, and the reuse bins measured on them
(the bins a distribution implies, expected rather than measured, are bins.py's).

Synthetic streams are regenerated from (distribution, seed, step) for any batch size on any
device, so a plan file is enough to rebuild the exact inputs of a measurement:
  - bag lengths ~ Poisson(pooling_factor);
  - `zipf:a`: popularity rank k in [0, rows) with P(k) ∝ (k+1)^-a (inverse-CDF of the continuous
    law, so sampling is O(1) per lookup at any table size); `uniform`: all rows equally likely;
  - rank → row through a fixed bijection (multiplication by a prime mod rows, plus a seeded
    offset), so hot rows are scattered over the table as hashed ids are.
DLRM-format streams (`dlrm:<file>#<t>`) replay the file's bags, cycling samples for batches larger
than the file's.
A row shard's stream (`rowshard.RowShardSpec`) is its table's stream for the same batch and step,
each bag keeping only the indices in the shard's row range, re-based to 0: the shards of a table
together see exactly the table's lookups. Its share of them and its reuse bins come from a sample
of the table's stream (`row_range_stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch

import numpy as np

from dreamshard.bins import BIN_EDGES, NUM_BINS, REFERENCE_BATCH, count_bins, reuse_bins, zipf_alpha
from dreamshard.rowshard import RowShardSpec, row_shard_distribution, row_shard_name
from dreamshard.tables import TableError, TableSpec
from dreamshard.validation import check_dlrm_file

_PRIME = 2_147_483_647  # 2^31 - 1: coprime with every table size below it


# --------------------------------------------------------------------------------------------
# Reuse statistics of an actual batch
# --------------------------------------------------------------------------------------------


def empirical_reuse(indices: torch.Tensor) -> dict:
    """Reuse statistics of an actual batch of one table's indices."""
    if indices.numel() == 0:
        return {"bins": [0.0] * NUM_BINS, "lookup_bins": [0.0] * NUM_BINS, "unique": 0, "lookups": 0}
    _, counts = torch.unique(indices, return_counts=True)
    counts = counts.cpu().numpy()
    rows_in, lookups_in = count_bins(counts)
    return {
        "bins": (rows_in / len(counts)).tolist(),
        "lookup_bins": (lookups_in / counts.sum()).tolist(),
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
    alpha = zipf_alpha(table.distribution or "uniform")
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
    if isinstance(table, RowShardSpec):
        lengths, indices = table_bags(table.parent, batch_size, step, device)
        return restrict_bags(lengths, indices, table.row_start, table.row_stop)
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


def restrict_bags(lengths: torch.Tensor, indices: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bags keeping only the indices in [start, stop), re-based to 0, in their order."""
    keep = (indices >= start) & (indices < stop)
    upto = torch.zeros(keep.numel() + 1, dtype=torch.int64, device=indices.device)  # kept among the first k indices
    torch.cumsum(keep.to(torch.int64), 0, out=upto[1:])
    at_end = upto[torch.cumsum(lengths.to(torch.int64), 0)]  # ... up to the end of each bag
    new_lengths = torch.diff(at_end, prepend=at_end.new_zeros(1))
    return new_lengths.to(lengths.dtype), indices[keep] - start


# A row range's share of its table's lookups and its reuse bins come from one sample of the
# table's stream, drawn and counted once per table and shared by every range a planner tries: the
# stream at the largest batch of at most ROW_SAMPLE_LOOKUPS lookups (step 0; the reference batch
# itself where that is under it). Drawing and counting the whole reference batch (up to 2^24
# lookups) took ~0.5 s per table, seconds for a plan's first row moves; this sample takes ~5 ms.
# The share's relative sampling error is sqrt((1 - share) / (share × lookups)): 0.7% for an
# eighth of the table (docs/dreamshard.md, "Planning speed", has the measured effect on prices).
ROW_SAMPLE_LOOKUPS = 1 << 17
# A row seen more than this many times in the sample has its count at the reference batch known
# to ~25% (Poisson), within its reuse bin's factor of two: it is placed in its bin individually.
RESOLVED_COUNT = 16


def row_sample_batch(table: TableSpec) -> int:
    return int(min(REFERENCE_BATCH, max(1, ROW_SAMPLE_LOOKUPS // max(1, math.ceil(table.pooling_factor)))))


def stream_bins(table: TableSpec) -> np.ndarray:
    """The reuse bins of the table's stream at the reference batch: those its distribution implies
    (bins.py) for a synthetic stream, whatever bins the spec was given; a file's stream's own, as
    `tables_from_dlrm` measured them on the file."""
    dist = table.distribution or "uniform"
    if dist.startswith("dlrm:"):
        return np.asarray(table.bins, np.float64)
    return np.asarray(reuse_bins(table.rows, table.pooling_factor, dist), np.float64)


@dataclass(frozen=True)
class RowSample:
    """One table's sample, as `row_range_stats` reads it: the rows seen, sorted, split into those
    resolved (counted often enough to place in a bin) and the others."""

    lookups: int  # in the sample
    cold_rows: np.ndarray  # the unresolved rows
    cold_upto: np.ndarray  # [len + 1] lookups of the first k unresolved rows
    hot_rows: np.ndarray  # the resolved rows
    hot_upto: np.ndarray  # [len + 1] lookups of the first k resolved rows
    hot_bin: np.ndarray  # each resolved row's bin at the reference batch (count × the batch ratio)
    hot_per_bin: np.ndarray  # [17] resolved rows of the table in each bin
    cold_bins: np.ndarray  # [17] bool: the bins of the unresolved rows (at or below the threshold)
    bins: np.ndarray  # [17] the table's reuse at the reference batch (`stream_bins`)


@lru_cache(maxsize=32)  # at most a few MB each
def row_sample(table: TableSpec) -> RowSample:
    """The sample of `table`'s stream that `row_range_stats` reads (`row_sample_batch`, step 0)."""
    batch = row_sample_batch(table)
    _, indices = table_bags(table, batch, step=0)
    idx = indices.numpy()
    if table.rows <= len(idx):  # a count per row beats unique's sort up to about twice the sample: same rows and counts
        counts = np.bincount(idx, minlength=table.rows)
        rows = np.flatnonzero(counts)
        counts = counts[rows]
    else:
        rows, counts = np.unique(idx, return_counts=True)
    scale = REFERENCE_BATCH / batch  # a row's expected count at the reference batch per count here
    # Resolved: counted more than RESOLVED_COUNT times, the threshold rounded up to a bin edge so
    # that a bin holds resolved rows only or unresolved ones only. Where the sample is the reference
    # batch every count is exact: only the rows looked up once stay unresolved.
    threshold = 2.0 ** math.ceil(math.log2(scale * RESOLVED_COUNT)) if scale > 1 else 1.0
    hot = counts * scale > threshold
    # The resolved rows' bins: their distinct counts, ascending, fill `count_bins`' bins in order.
    values, which = np.unique(counts[hot] * scale, return_inverse=True)
    per_value, _ = count_bins(values)
    hot_bin = np.repeat(np.arange(NUM_BINS), per_value.astype(np.int64))[which]
    zero = np.zeros(1, np.int64)
    return RowSample(
        lookups=int(counts.sum()),
        cold_rows=rows[~hot],
        cold_upto=np.concatenate([zero, np.cumsum(counts[~hot])]),
        hot_rows=rows[hot],
        hot_upto=np.concatenate([zero, np.cumsum(counts[hot])]),
        hot_bin=hot_bin,
        hot_per_bin=np.bincount(hot_bin, minlength=NUM_BINS),
        cold_bins=np.append(BIN_EDGES[1:], np.inf) <= threshold,
        bins=stream_bins(table),
    )


def row_range_stats(table: TableSpec, start: int, stop: int) -> tuple[float, tuple[float, ...]]:
    """(share of the table's lookups in rows [start, stop), reuse bins of those rows at the
    reference batch), from the table's sample (`row_sample`).

    The share is counted. The bins are the table's (`stream_bins`), each reweighted by the range's
    part of that bin's rows: counted among the resolved rows (the hot ones, which land in some
    ranges and not others), and for the bins of the unresolved rows taken as the range's part of
    those rows' lookups. Their own counts would not do: a row looked up a few times at the
    reference batch is mostly not seen at all in a sample many times smaller, so the sample's bins
    (scaled up or not) miss most of those rows and misplace the rest. How they spread over the low
    bins is taken to be the table's in every range: the synthetic streams' hashing scatters rows
    so (a file's ids are taken as they come). A stream with no lookups in the sample shares them
    by rows."""
    s = row_sample(table)
    if s.lookups == 0:
        return (stop - start) / table.rows, tuple(table.bins)
    i, j = np.searchsorted(s.cold_rows, [start, stop])
    k, m = np.searchsorted(s.hot_rows, [start, stop])
    cold = int(s.cold_upto[j] - s.cold_upto[i])
    mine = cold + int(s.hot_upto[m] - s.hot_upto[k])
    if mine == 0:
        return 0.0, (0.0,) * NUM_BINS
    share = mine / s.lookups
    # a bin none of whose rows the sample resolved (expected, not drawn) takes the range's share
    part = np.where(s.hot_per_bin > 0, np.bincount(s.hot_bin[k:m], minlength=NUM_BINS) / np.maximum(s.hot_per_bin, 1), share)
    part[s.cold_bins] = cold / s.cold_upto[-1] if s.cold_upto[-1] else share
    weights = s.bins * part
    return share, tuple((weights / weights.sum() if weights.any() else s.bins).tolist())


@lru_cache(maxsize=4096)
def row_shard_spec(table: TableSpec, start: int, stop: int) -> RowShardSpec:
    """Rows [start, stop) of `table` as a table a backend can price and measure: its rows, its
    share of the table's pooling factor and its bins, both from the table's stream
    (`row_range_stats`); its stream is the table's restricted to the range (`table_bags`)."""
    if not 0 <= start < stop <= table.rows:
        raise ValueError(f"rows [{start}, {stop}) are not a range of the {table.rows} rows of {table.name!r}")
    share, bins = row_range_stats(table, start, stop)
    return RowShardSpec(name=row_shard_name(table, start, stop), rows=stop - start, dim=table.dim, pooling_factor=table.pooling_factor * share,
                        bins=bins, distribution=row_shard_distribution(table, start, stop), seed=table.seed, parent=table, row_start=start, row_stop=stop)


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
    """(indices, offsets, lengths) from a `.pt` or `.pt.gz` file; lengths is [T, B]. The file is
    held to `validation.check_dlrm_file` (DataError naming the file and the fault)."""
    return check_dlrm_file(path)


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
