"""Splits shared by the planners that cut tables: pieces, halving, row splits, plans of pieces.

A *piece* is a `Shard` not yet placed (device -1): a column range of one table, or a row range
(every column). A task cut into pieces is planned like a task of tables — a column piece is a
table of its own width reading the table's index stream, a row piece the table's stream
restricted to its rows (`RowShardSpec`: its measured lookups and bins) — and the placed pieces are
the plan's shards.

Row splits (`row_split`) are TorchRec's row-wise layout (`torchrec_io.row_wise_cuts`: blocks of
ceil(rows / k) rows), so that every row split a planner writes over all D devices, block r on
device r (`row_pinned`), exports as TorchRec `row_wise` and runs under DMP as planned; k is 2, 4,
8, ... below D and D itself (`row_parts`), at most MAX_ROW_PARTS (a row piece is a measured
stream: 1,024 of them per table would cost more to plan than they save). A split over k < D
devices is placed freely, its pieces on distinct devices (its exchange is still a reduce-scatter
over all D devices: costs/comm.py). A table is split by rows or by columns, never both.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from dreamshard.tier_stage import with_task_tier
from dreamshard.tiers import tier_of
from dreamshard.packing import InfeasibleError, format_bytes, infeasible_error
from dreamshard.plan import Plan, Shard, column_cuts
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task
from dreamshard.topology import several_hosts
from dreamshard.torchrec_io import row_wise_cuts
from dreamshard.validation import DIM_MULTIPLE

MAX_ROW_PARTS = 64


def whole(task: Task) -> list[Shard]:
    """One full-width piece per table."""
    return [Shard(i, -1, 0, t.dim) for i, t in enumerate(task.tables)]


def cut(piece: Shard, parts: int) -> list[Shard]:
    """`piece` cut into `parts` column ranges of about equal width (multiples of 4)."""
    return [Shard(piece.table, -1, piece.start + a, piece.start + b) for a, b in column_cuts(piece.width, parts)]


def can_halve(piece: Shard) -> bool:
    """A column piece at least twice the kernels' granularity wide (a row piece is never cut by columns)."""
    return piece.width >= 2 * DIM_MULTIPLE and not piece.is_row_shard


def is_whole(task: Task, piece: Shard) -> bool:
    """The piece is its whole table (what a row split starts from)."""
    return piece.start == 0 and piece.stop == task.tables[piece.table].dim and not piece.is_row_shard


def row_parts(devices: int, gpus_per_host: int | None = None) -> list[int]:
    """The numbers of row ranges a planner tries: 2, 4, 8, ... below `devices`, and `devices`
    itself (TorchRec's row_wise), and on several hosts `gpus_per_host` (table_row_wise,
    `twrw_blocks`), none over MAX_ROW_PARTS."""
    ks = [2**j for j in range(1, 7) if 2**j < devices] + [devices]
    if gpus_per_host is not None and 2 <= gpus_per_host < devices and gpus_per_host not in ks:
        ks.append(gpus_per_host)
    return sorted(k for k in ks if 2 <= k <= MAX_ROW_PARTS)


def host_gpus(task: Task) -> int | None:
    """The GPUs of one host of a task on several hosts (its topology), else None."""
    t = several_hosts(task.topology)
    return t.gpus_per_host if t is not None else None


def task_row_parts(task: Task) -> list[int]:
    """`row_parts` of the task's devices and, on several hosts, its GPUs per host; for a task of
    TorchRec's row layouts (`Task.row_layouts`) only those two: every device (row_wise, block r on
    device r) and a host's GPUs (table_row_wise)."""
    parts = row_parts(task.devices, host_gpus(task))
    if task.row_layouts == "torchrec":
        return [k for k in parts if k in (task.devices, host_gpus(task))]
    return parts


def twrw_blocks(task: Task, pieces: Sequence[Shard]) -> list[int]:
    """Per piece, its block r of a table-row-wise split (TorchRec's table_row_wise: a table's rows
    in G blocks of its row-wise layout over the G GPUs of one host, block r on GPU r of that host,
    so that its partial sums are reduced on NVLink and only its pooled output crosses hosts), or
    -1. On a task of several hosts every split of a table into G row blocks is one; the planners
    place its blocks so (`scoring.greedy_batch`, dreamshard's `row_trials`)."""
    G = host_gpus(task)
    out = [-1] * len(pieces)
    if G is None or G < 2:
        return out
    for k, p in enumerate(pieces):
        if p.is_row_shard:
            t = task.tables[p.table]
            cuts = row_wise_cuts(t.rows, G)
            r = next((j for j, c in enumerate(cuts) if c == p.row_range(t)), -1)
            out[k] = r
    return out


def row_split(task: Task, table: int, parts: int) -> list[Shard] | None:
    """Table `table`'s rows as `parts` pieces of TorchRec's row-wise layout (in row order), or
    None where that layout leaves a block empty (fewer rows than it needs) — except a
    table-row-wise split (`parts` the GPUs of a host, on several hosts), whose empty blocks are
    left out as TorchRec leaves the host's last ranks without rows: a table of 3 rows is 3 blocks
    on GPUs 0–2 of its host, so that every table of a task may keep its exchange inside a host."""
    t = task.tables[table]
    cuts = row_wise_cuts(t.rows, parts)
    if cuts[-1][0] >= cuts[-1][1]:
        cuts = [(a, b) for a, b in cuts if a < b]
        if parts != host_gpus(task) or len(cuts) < 2:
            return None
    return [Shard(table, -1, 0, t.dim, a, b) for a, b in cuts]


def row_groups(task: Task, pieces: Sequence[Shard]) -> tuple[list[int], list[int]]:
    """Per piece: (the device it must take, or -1; its row-split group, or -1). A table split by
    rows over all devices has block r on device r (TorchRec's row_wise, `row_split`); the pieces
    of a table split over fewer devices share a group (distinct devices, `Plan.check`)."""
    rows = [(k, p) for k, p in enumerate(pieces) if p.is_row_shard]  # few: the rest is -1
    starts: dict[int, list[int]] = {}
    for _, p in rows:
        starts.setdefault(p.table, []).append(p.row_start)
    group = {t: g for g, t in enumerate(t for t, s in starts.items() if len(s) != task.devices)}
    pin, groups = [-1] * len(pieces), [-1] * len(pieces)
    for k, p in rows:
        if p.table in group:
            groups[k] = group[p.table]
        else:
            pin[k] = sorted(starts[p.table]).index(p.row_start)
    return pin, groups


def forced_row_splits(task: Task) -> list[Shard]:
    """Whole pieces, except that a table larger than a device is split by rows into the fewest
    `row_parts` whose largest block fits one. Raises InfeasibleError (`infeasible`) where even that
    cannot hold the task: a table whose blocks over the most parts are still too large, or more
    bytes than all devices hold."""
    cap, w = task.max_memory_bytes, task.workload
    if sum(task.sizes()) > task.devices * cap:
        raise infeasible(task)
    pieces = []
    for piece, t in zip(whole(task), task.tables):
        if task.table_bytes(t) <= cap:
            pieces.append(piece)
            continue
        for k in task_row_parts(task):
            rows = row_split(task, piece.table, k)
            if rows is not None and rows[0].bytes(t, w.precision, w.optimizer) <= cap:
                pieces += rows
                break
        else:
            raise infeasible(task)
    return pieces


def infeasible(task: Task) -> InfeasibleError:
    """The splitting planners' InfeasibleError: the packing's one line and, for a table larger
    than a device, why splitting it by rows does not place it either."""
    sizes, cap, w = task.sizes(), task.max_memory_bytes, task.workload
    err = infeasible_error([t.name for t in task.tables], sizes, cap, task.devices)
    big = max(range(len(sizes)), key=lambda i: sizes[i])
    if sizes[big] <= cap or sum(sizes) > task.devices * cap:
        return err
    parts = task_row_parts(task)
    if not parts:
        return InfeasibleError(f"{err}; one device cannot split it by rows")
    k = parts[-1]
    t = task.tables[big]
    block = Shard(big, -1, 0, t.dim, *row_wise_cuts(t.rows, k)[0]).bytes(t, w.precision, w.optimizer)
    if block <= cap:
        return InfeasibleError(f"{err}; split by rows it fits, but no placement of the pieces within memory was found")
    return InfeasibleError(f"{err}; split by rows over {k} devices its largest block still needs {block} bytes ({format_bytes(block)})")


NO_DIM_CAP = 1e9  # a dim-cap factor no placement reaches: the greedy under memory alone


def specs(task: Task, pieces: Sequence[Shard]) -> list[TableSpec]:
    return [p.spec(task.tables[p.table]) for p in pieces]


def sizes(task: Task, pieces: Sequence[Shard]) -> list[int]:
    """Device bytes of each piece under the task's workload (from its extent: a row piece's
    stream is not measured for it)."""
    w = task.workload
    return [with_task_tier(task, p).bytes(task.tables[p.table], w.precision, w.optimizer) for p in pieces]


def as_task(task: Task, pieces: Sequence[Shard]) -> Task:
    """The task whose tables are the pieces (what a table-wise placer or the cost net sees), each
    piece in its table's tier where the task has tiers."""
    piece_specs = specs(task, pieces)
    tiers = None if task.tiers is None else {spec.name: tier_of(task.tiers, task.tables[p.table].name) for p, spec in zip(pieces, piece_specs)}
    return Task(piece_specs, task.devices, task.max_memory_bytes, task.workload, task.pool, host_memory_bytes=task.host_memory_bytes, tiers=tiers,
                topology=task.topology, row_layouts=task.row_layouts)


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


def unplaced(plan: Plan) -> tuple[list[Shard], list[int]]:
    """A plan as the searches hold one (`placed`'s inverse): its pieces, without devices, and their devices."""
    return [replace(s, device=-1) for s in plan.shards], [s.device for s in plan.shards]
