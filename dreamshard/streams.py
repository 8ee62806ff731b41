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
together see exactly the table's lookups.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch

import numpy as np

from dreamshard.bins import NUM_BINS, REFERENCE_BATCH, count_bins, zipf_alpha
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


# A row shard's pooling factor and bins are measured on its table's stream at the reference
# batch (the batch the bins are defined at), unless that is over this many lookups; then at the
# largest batch under it (a table of pooling > 256), whose bins see a little less reuse.
ROW_STATS_MAX_LOOKUPS = 1 << 24


def row_stats_batch(table: TableSpec) -> int:
    return int(min(REFERENCE_BATCH, max(1, ROW_STATS_MAX_LOOKUPS // max(1, math.ceil(table.pooling_factor)))))


@lru_cache(maxsize=2)  # a plan's row shards come table by table; an entry can be ~0.5 GB
def _row_counts(table: TableSpec) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows, sorted; their access counts) in the table's measuring batch (step 0)."""
    _, indices = table_bags(table, row_stats_batch(table), step=0)
    rows, counts = torch.unique(indices, sorted=True, return_counts=True)
    return rows.numpy(), counts.numpy()


def row_range_stats(table: TableSpec, start: int, stop: int) -> tuple[float, tuple[float, ...]]:
    """(share of the table's lookups in rows [start, stop), reuse bins of those rows) measured on
    its stream (`row_stats_batch`). A stream with no lookups in that batch shares them by rows."""
    rows, counts = _row_counts(table)
    i, j = np.searchsorted(rows, [start, stop], side="left")
    total, mine = int(counts.sum()), counts[i:j]
    if total == 0:
        return (stop - start) / table.rows, tuple(table.bins)
    if mine.size == 0:
        return 0.0, (0.0,) * NUM_BINS
    in_bins, _ = count_bins(mine)
    return float(mine.sum()) / total, tuple((in_bins / mine.size).tolist())


@lru_cache(maxsize=4096)
def row_shard_spec(table: TableSpec, start: int, stop: int) -> RowShardSpec:
    """Rows [start, stop) of `table` as a table a backend can price and measure: its rows, the
    measured share of the table's pooling factor and its measured bins; its stream is the
    table's restricted to the range (`table_bags`)."""
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
