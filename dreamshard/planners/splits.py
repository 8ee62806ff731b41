"""Column splits shared by the planners that cut tables: pieces, halving, and plans of pieces.

A *piece* is a `Shard` not yet placed (device -1): a column range of one table. A task cut into
pieces is planned like a task of tables — each piece is a table of its own width reading the
table's index stream — and the placed pieces are the plan's shards.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from dreamshard.plan import Plan, Shard, column_cuts
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task
from dreamshard.validation import DIM_MULTIPLE


def whole(task: Task) -> list[Shard]:
    """One full-width piece per table."""
    return [Shard(i, -1, 0, t.dim) for i, t in enumerate(task.tables)]


def cut(piece: Shard, parts: int) -> list[Shard]:
    """`piece` cut into `parts` column ranges of about equal width (multiples of 4)."""
    return [Shard(piece.table, -1, piece.start + a, piece.start + b) for a, b in column_cuts(piece.width, parts)]


def can_halve(piece: Shard) -> bool:
    return piece.width >= 2 * DIM_MULTIPLE


def specs(task: Task, pieces: Sequence[Shard]) -> list[TableSpec]:
    return [p.spec(task.tables[p.table]) for p in pieces]


def sizes(task: Task, pieces: Sequence[Shard]) -> list[int]:
    """Device bytes of each piece under the task's workload."""
    return [task.table_bytes(s) for s in specs(task, pieces)]


def as_task(task: Task, pieces: Sequence[Shard]) -> Task:
    """The task whose tables are the pieces (what a table-wise placer or the cost net sees)."""
    return Task(specs(task, pieces), task.devices, task.max_memory_bytes, task.workload, task.pool)


def split_heaviest(task: Task, proxy: Sequence[float]) -> list[Shard]:
    """Pieces of the hand rule: a table whose proxy cost alone exceeds the per-device average
    (sum / devices) is cut into ceil(proxy / average) pieces — at most one per device and one per
    4 columns — so that no piece is above the average; the rest stay whole."""
    average = sum(proxy) / task.devices
    pieces = []
    for piece, cost in zip(whole(task), proxy):
        parts = min(math.ceil(cost / average), task.devices, piece.width // DIM_MULTIPLE) if average > 0 else 1
        pieces += cut(piece, parts) if parts > 1 else [piece]
    return pieces


def placed(task: Task, pieces: Sequence[Shard], devices: Sequence[int], planner: str, **kwargs) -> Plan:
    return Plan(task, [replace(p, device=int(d)) for p, d in zip(pieces, devices)], planner, **kwargs)
