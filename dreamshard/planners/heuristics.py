"""Greedy baselines (docs/design.md §4): sort tables by a cost proxy, largest first, and give each
to the device with the least proxy load that still has memory for it.

With `split=True` (what a user would do by hand) a table whose proxy alone exceeds the
per-device average is first cut into column pieces (`splits.split_heaviest`), and the pieces are
placed like tables, two pieces of one table on one device only when no other device has room.

They never split a table by rows, not even a narrow one their column cut cannot bring under the
average, by design: a row split trades a table's compute for a reduce-scatter and an
all-gather over every device, and a proxy that sees neither comm nor the uneven lookups of a
table's row ranges cannot tell when that pays (a narrow table's exchange is small, but so may
be what its split saves once every block pays a device's fixed cost). The planners with a cost
model make that call (dreamshard --split, neuroshard); so a table larger
than a device is still infeasible for the heuristics."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from dreamshard.packing import balanced_pack, infeasible_error
from dreamshard.plan import Plan
from dreamshard.planners import splits
from dreamshard.planners.base import Planner, register
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task


def greedy(task: Task, proxy: list[float], groups: list[int] | None = None) -> list[int] | None:
    """Least-loaded-device-with-room greedy in descending proxy order; None if it gets stuck.

    `groups[i]` (the table of piece i, when placing pieces): a device already holding a piece of
    the same table is taken only if no other device has room. Ties go to the lowest device id.
    Each step is one vectorised pass over the devices, so 10,000 tables on 1,024 devices take a
    fraction of a second."""
    free = np.full(task.devices, task.max_memory_bytes, np.int64)
    load = np.zeros(task.devices)
    placement = [-1] * len(task.tables)
    held: dict[int, list[int]] = {}
    for i in sorted(range(len(proxy)), key=lambda i: -proxy[i]):
        size = task.table_bytes(task.tables[i])
        if groups is None or not held.get(groups[i]):
            d = int(load.argmin())  # the least loaded of all devices, when it has room, is the answer
            if free[d] >= size:  # (one pass over the devices instead of four: 100,000 tables × 1,024 devices)
                free[d] -= size
                load[d] += proxy[i]
                placement[i] = d
                if groups is not None:
                    held.setdefault(groups[i], []).append(d)
                continue
        legal = free >= size
        score = np.where(legal, load, np.inf)
        if groups is not None and held.get(groups[i]):
            elsewhere = legal.copy()
            elsewhere[held[groups[i]]] = False
            if elsewhere.any():
                score[held[groups[i]]] = np.inf
        d = int(score.argmin())
        if not legal[d]:
            return None
        free[d] -= size
        load[d] += proxy[i]
        placement[i] = d
        if groups is not None:
            held.setdefault(groups[i], []).append(d)
    return placement


def lookup_load(table: TableSpec) -> float:
    """Rows read per sample: the lookup greedy's proxy, and the load every fallback packing balances."""
    return table.dim * table.pooling_factor


def place_or_pack(task: Task, placement: list[int] | None, planner: str, load: Sequence[float] | None = None) -> Plan:
    """The planner's placement, or — when memory is too tight for it — a packing that fits, with
    `load` (default: `lookup_load` of each table) balanced over the devices as memory allows."""
    if placement is not None:
        return Plan.table_wise(task, placement, planner)
    load = [lookup_load(t) for t in task.tables] if load is None else load
    packed = balanced_pack(task.sizes(), task.max_memory_bytes, task.devices, load)
    if packed is None:
        raise task_infeasible(task)
    return Plan.table_wise(task, packed, planner, notes=[f"{planner} greedy ran out of memory; used a memory packing instead"])


def task_infeasible(task: Task):
    return infeasible_error([t.name for t in task.tables], task.sizes(), task.max_memory_bytes, task.devices)


class GreedyPlanner(Planner):
    kind = "heuristic"

    def __init__(self, split: bool = False):
        self.split = bool(split)

    def proxy(self, table: TableSpec, task: Task) -> float:
        raise NotImplementedError

    def plan(self, task: Task) -> Plan:
        proxy = [self.proxy(t, task) for t in task.tables]
        pieces = splits.split_heaviest(task, proxy) if self.split else splits.whole(task)
        if len(pieces) == len(task.tables):
            return place_or_pack(task, greedy(task, proxy), self.name, proxy)
        cut = splits.as_task(task, pieces)
        devices = greedy(cut, [self.proxy(t, cut) for t in cut.tables], [p.table for p in pieces])
        if devices is None:  # memory too tight for the greedy over pieces: table-wise, or a packing
            return place_or_pack(task, greedy(task, proxy), self.name, proxy)
        return splits.placed(task, pieces, devices, self.name)


@register
class SizeGreedyPlanner(GreedyPlanner):
    name, description = "size", "greedy by table bytes"

    def proxy(self, table, task):
        return float(task.table_bytes(table))


@register
class DimGreedyPlanner(GreedyPlanner):
    name, description = "dim", "greedy by embedding dim"

    def proxy(self, table, task):
        return float(table.dim)


@register
class LookupGreedyPlanner(GreedyPlanner):
    name, description = "lookup", "greedy by dim × pooling factor"

    def proxy(self, table, task):
        return lookup_load(table)


@register
class SizeLookupGreedyPlanner(GreedyPlanner):
    name, description = "size_lookup", "greedy by dim × pooling factor × log10(rows)"

    def proxy(self, table, task):
        return table.dim * table.pooling_factor * math.log10(max(table.rows, 2))


# the greedy heuristics (DreamShard's fallback prices all their plans with its cost net)
GREEDY_PLANNERS = (SizeGreedyPlanner, DimGreedyPlanner, LookupGreedyPlanner, SizeLookupGreedyPlanner)


@register
class RandomPlanner(Planner):
    name, description = "random", "uniformly random device with room, tables in random order"
    kind = "heuristic"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def plan(self, task: Task) -> Plan:
        sizes = task.sizes()
        free = np.full(task.devices, task.max_memory_bytes, np.int64)
        placement: list[int] | None = [-1] * len(task.tables)
        for i in self.rng.permutation(len(task.tables)):
            legal = (free >= sizes[i]).nonzero()[0]
            if not len(legal):
                placement = None
                break
            d = int(self.rng.choice(legal))
            free[d] -= sizes[i]
            placement[i] = d
        return place_or_pack(task, placement, self.name)
