"""A row shard as a table of its own: rows [row_start, row_stop) of a table, every column.

A row-wise split cuts a table's rows into ranges that sit on distinct devices. A row shard looks
up only the indices of the table's stream that fall in its range (the others of each bag add
nothing), so it produces *partial* pooled sums for the whole batch; the devices' partials are
summed by a reduce-scatter (costs/comm.py). To the cost backends a row shard is a `RowShardSpec`:
a `TableSpec` whose rows are its range, whose pooling factor is the table's times the range's
share of its lookups *counted* on a sample of the table's own stream (hot rows are not spread
evenly over ranges), whose reuse bins are the stream's reweighted by the range's part of each
(`streams.row_range_stats`; `streams.row_shard_spec` builds the spec), and which keeps its parent
table and range, from which `streams.table_bags` regenerates exactly the parent's indices in
range, re-based to 0.

This module holds the noun only (no torch): the plan, the simulator and the runners import it;
the stream maths is streams.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

from dreamshard.tables import TableSpec
from dreamshard.validation import TableError

_TABLE_FIELDS = tuple(f.name for f in fields(TableSpec))


@dataclass(frozen=True)
class RowShardSpec(TableSpec):
    """Rows [row_start, row_stop) of `parent`, all its columns. `rows`, `pooling_factor` and `bins`
    describe the shard's own stream (from the table's: `streams.row_range_stats`); `distribution`
    names it for people (`rows:<start>:<stop>:<parent's>`, which no table file accepts, so a row
    shard can never be mistaken for a whole table with that stream)."""

    parent: TableSpec | None = None
    row_start: int = 0
    row_stop: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.parent
        if not isinstance(p, TableSpec) or isinstance(p, RowShardSpec):
            raise TableError(f"row shard {self.name!r}: its parent must be a whole table, got {type(p).__name__}")
        if not 0 <= self.row_start < self.row_stop <= p.rows or self.rows != self.row_stop - self.row_start:
            raise TableError(f"row shard {self.name!r}: rows [{self.row_start}, {self.row_stop}) is not a range of the {p.rows} rows of {p.name!r} with {self.rows} rows")
        if self.dim != p.dim or self.seed != p.seed:
            raise TableError(f"row shard {self.name!r}: dim and seed must be its table's ({p.dim}, {p.seed})")

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in _TABLE_FIELDS}
        d["bins"] = list(self.bins)
        d["row_shard"] = {"parent": self.parent.to_dict(), "rows": [self.row_start, self.row_stop]}
        return d


def row_shard_name(table: TableSpec, start: int, stop: int) -> str:
    return f"{table.name}[rows {start}:{stop}]"


def row_shard_distribution(table: TableSpec, start: int, stop: int) -> str:
    return f"rows:{start}:{stop}:{table.distribution or 'uniform'}"


def spec_from_dict(d: dict, where: str = "table spec") -> TableSpec:
    """A spec from `to_dict()` of a TableSpec or a RowShardSpec (as the distributed runner's job
    carries them): a row shard keeps its measured fields and its parent; nothing is re-measured."""
    extra = d.get("row_shard") if isinstance(d, dict) else None
    if extra is None:
        return TableSpec.from_dict(d, where)
    if not (isinstance(extra, dict) and isinstance(extra.get("rows"), list) and len(extra["rows"]) == 2):
        raise TableError(f"{where}, key 'row_shard': expected {{'parent': a table spec, 'rows': [start, stop]}}")
    parent = TableSpec.from_dict(extra.get("parent"), f"{where}, row_shard parent")
    values = {k: d.get(k) for k in _TABLE_FIELDS}
    values["bins"] = tuple(values["bins"] or ())
    return RowShardSpec(**values, parent=parent, row_start=extra["rows"][0], row_stop=extra["rows"][1])


def exchange_order(shards: Sequence[Sequence[TableSpec]]) -> list[list[TableSpec]]:
    """Each device's tables in the order its fused TBE holds them in both runners: whole tables and
    column shards (their outputs, leading, are the all-to-all's), then row shards (the
    reduce-scatter's). The order changes what the fused op costs (a 2-device plan's row-heavy
    shard: forward 0.48 ms in this order, 0.55 ms in the plan's own, on an H100), so both runners
    measure this one."""
    return [[t for t in s if not isinstance(t, RowShardSpec)] + [t for t in s if isinstance(t, RowShardSpec)] for s in shards]


def row_dims(shards: Sequence[Sequence[TableSpec]]) -> list[int]:
    """Each device's columns of row shards (its part of the row-wise exchange's copies)."""
    return [sum(t.dim for t in s if isinstance(t, RowShardSpec)) for s in shards]


def rowwise_tables(specs: Sequence[TableSpec]) -> list[TableSpec]:
    """The whole tables that `specs` holds row shards of, once each, in order of first appearance:
    the layout of the row-wise exchange's [B, Σ dim] buffer (every backend and every rank of the
    distributed runner derive it from the same flattened list, so they agree)."""
    seen: dict[str, TableSpec] = {}
    for s in specs:
        if isinstance(s, RowShardSpec) and s.parent.name not in seen:
            seen[s.parent.name] = s.parent
    return list(seen.values())


def exchange_dims(shards: Sequence[Sequence[TableSpec]]) -> tuple[list[int], int]:
    """(dim sum of each device's all-to-all — its whole tables and column shards —, the dim sum
    of the row-wise tables, whose partial outputs go through the reduce-scatter instead)."""
    a2a = [sum(t.dim for t in s if not isinstance(t, RowShardSpec)) for s in shards]
    return a2a, sum(t.dim for t in rowwise_tables([t for s in shards for t in s]))
