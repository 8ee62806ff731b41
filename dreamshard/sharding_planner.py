"""A drop-in for TorchRec's `EmbeddingShardingPlanner` that places the tables with a dreamshard
planner (docs/torchrec.md). A TorchRec user swaps the planner and keeps the rest:

    planner = ShardingPlanner(topology=Topology(...), batch_size=per_rank, constraints={...}, distribution="zipf:1.05")
    DistributedModelParallel(model, plan=planner.collective_plan(model, sharders), ...)

`ShardingPlanner` takes `EmbeddingShardingPlanner`'s arguments, plans the tables with a dreamshard
planner within the ParameterConstraints, and runs TorchRec's planner pinned to that plan
(`torchrec_io.constraints_for`, `dreamshard_enumerator`, `dreamshard_partitioner`), so TorchRec's
storage reservation, estimates, storage checks and stats still run. It sits above the planners
(it runs one), and `torchrec_io`, which the planners use, below them.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

from dreamshard.bins import REFERENCE_BATCH
from dreamshard.packing import InfeasibleError
from dreamshard.plan import Plan, Shard
from dreamshard.planners import get_planner, splits
from dreamshard.planners.base import Planner
from dreamshard.tasks import Task
from dreamshard.torchrec_io import (COLUMN_TYPES, ROW_TYPES, ConstraintError, NotExpressibleError, Offered, allowed_types, check_kernel, constraint_text,
                                    constraints_for, dreamshard_enumerator, dreamshard_partitioner, embedding_configs, import_torchrec, offered_types,
                                    quiet, row_wise_cuts, table_sharding, task_from_torchrec)
from dreamshard.validation import NoPlanError, OptionError, one_line

# TorchRec's own search, which a ShardingPlanner replaces with a dreamshard planner
REPLACED = ("enumerator", "proposer", "partitioner", "plan_loader")


class ShardingPlanner:
    """A drop-in for TorchRec's `EmbeddingShardingPlanner` that places the tables with a dreamshard
    planner: the same arguments in the same order (`topology`, `batch_size` per rank,
    `storage_reservation`, `stats`, `constraints`, ...), the same `plan(module, sharders)` and
    `collective_plan(module, sharders, pg)`, and a TorchRec `ShardingPlan` for
    `DistributedModelParallel`. docs/torchrec.md, "The drop-in planner".

    - `topology`: its world_size ranks; each rank's memory is its HBM (DDR on a "cpu" compute
      device) left by `storage_reservation` (by default TorchRec's own, 15% and the model's dense
      part), the smallest rank's for all; local_world_size (its intra_group_size) makes the hosts
      of table_row_wise and table_column_wise; its bandwidths go to TorchRec's estimates and stats.
    - `batch_size`: TorchRec's, per rank (512 when None, as TorchRec's). dreamshard plans the
      step of the global batch, `batch_size` × world_size.
    - `constraints`: TorchRec ParameterConstraints by table name. `sharding_types` bound each
      table's shards (`allowed_types`); `compute_kernels` must include "fused", the only kernel
      planned; `min_partition` bounds column shard widths; `pooling_factors` × `num_poolings`
      (and per-feature `batch_sizes`) are a table's lookups per sample where `table_stats` and
      `batches` do not give them; `feature_names` must be the table's.
    - `stats`: TorchRec's reporters (`Stats`), which see the plan as TorchRec's planner's do;
      `performance_model`, `debug`, `callbacks`, `timeout_seconds` go to TorchRec's planner too.
      `enumerator`, `proposer`, `partitioner` and `plan_loader` are TorchRec's search, which the
      dreamshard planner replaces: giving one is an OptionError.
    - `planner`: a dreamshard planner, by name ("dreamshard", the shipped model) or object
      (`get_planner(name, ...)`).
    - `table_stats`, `batches`, `distribution`, `max_samples`: each table's pooling factor and
      reuse, as for `tables_from_torchrec`. `optimizer`: the one fused into the backward.

    Each table may take the sharding types its constraint allows that the sharders offer on the
    compute device with the fused kernel (`offered_types`: TorchRec's CPU sharder has no
    row-wise ones). A plan is made in up to two passes. The planner plans the tables (skipped
    when every table is table_wise only); where a table's shards are not what it may take (a
    constraint, or a row split TorchRec cannot express), the table is laid out again — a row
    split over as many ranks as a host has becomes table_row_wise on one host where allowed;
    else whole where a rank holds it, else by rows in TorchRec's layout, else in the fewest
    column shards that fit — while the other tables keep the planner's cuts; the planner's
    table-wise variant (`split=False`) places every piece that is not a row layout again, its
    busiest device on the rank the row layouts load least. Then TorchRec's planner runs pinned to
    the plan (`constraints_for`, `dreamshard_enumerator`, `dreamshard_partitioner`): TorchRec's
    estimates, storage checks, stats and callbacks run as for its own plans. The dreamshard plan
    is kept in `last_plan`, TorchRec's planner in `last_planner`."""

    def __init__(self, topology: Any = None, batch_size: int | None = None, enumerator: Any = None, storage_reservation: Any = None,
                 proposer: Any = None, partitioner: Any = None, performance_model: Any = None, stats: Any = None,
                 constraints: Mapping[str, Any] | None = None, debug: bool = True, callbacks: list | None = None, timeout_seconds: int | None = None,
                 plan_loader: Any = None, *, planner: "str | Planner" = "dreamshard", table_stats: str | Path | Mapping[str, Mapping] | None = None,
                 batches: Iterable[Any] | None = None, distribution: str | None = None, max_samples: int = REFERENCE_BATCH, optimizer: str = "sgd") -> None:
        tr = self.tr = import_torchrec("ShardingPlanner")
        if topology is not None and not isinstance(topology, tr.Topology):
            hint = "; the dreamshard planner goes in planner=" if callable(getattr(topology, "plan", None)) or isinstance(topology, str) else ""
            raise OptionError(f"ShardingPlanner: topology must be a TorchRec Topology, not {type(topology).__name__}{hint}")
        given = dict(zip(REPLACED, (enumerator, proposer, partitioner, plan_loader)))
        replaced = next((k for k, v in given.items() if v is not None), None)
        if replaced is not None:
            raise OptionError(f"ShardingPlanner: {replaced} is part of TorchRec's search, which the dreamshard planner replaces; leave it unset (or use TorchRec's EmbeddingShardingPlanner)")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise OptionError(f"ShardingPlanner: batch_size {batch_size!r:.40} must be a positive integer (TorchRec's per-rank batch)")
        reporters = stats if isinstance(stats, list) else [stats] if stats is not None else []
        stranger = next((x for x in reporters if not isinstance(x, tr.Stats)), None)
        if stranger is not None:
            raise OptionError(f"ShardingPlanner: stats takes TorchRec Stats reporters, as EmbeddingShardingPlanner does, not a {type(stranger).__name__}; "
                              "per-table statistics go in table_stats=")
        if constraints is not None and not isinstance(constraints, Mapping):
            raise OptionError(f"ShardingPlanner: constraints must map table names to TorchRec ParameterConstraints, not a {type(constraints).__name__}")
        self.planner = _planner_object(planner)
        with quiet():  # TorchRec warns on every directly built Topology and on its heuristic reservation
            self.topology = topology if topology is not None else _default_topology(tr)
            # EmbeddingShardingPlanner's own default reservation, so the memory left is what TorchRec would plan within
            self.reservation = storage_reservation if storage_reservation is not None else tr.HeuristicalStorageReservation(percentage=0.15)
        self.batch_size = batch_size if batch_size is not None else 512  # TorchRec's default per-rank batch (its BATCH_SIZE)
        self.constraints = dict(constraints) if constraints else None
        self.stats, self.performance_model, self.debug, self.callbacks, self.timeout_seconds = stats, performance_model, debug, callbacks, timeout_seconds
        self.statistics = {"table_stats": table_stats, "batches": batches, "distribution": distribution, "max_samples": max_samples}
        self.optimizer = optimizer
        self.last_plan: Plan | None = None
        self.last_planner = None  # TorchRec's planner of the last plan (its stats, storage reservation)
        self.offered: Offered = None  # the sharding types the last plan's sharders offer (`task`)

    @property
    def local_world_size(self) -> int:
        """Ranks per host of the table_row_wise and table_column_wise layouts (TorchRec's enumerator
        lays table_row_wise over the topology's intra_group_size)."""
        return int(getattr(self.topology, "intra_group_size", self.topology.local_world_size))

    def _check_constraints(self, module: Any) -> None:
        """The user's constraints name tables of the model and ask for what dreamshard plans."""
        if not self.constraints:
            return
        names = [c.name for _, c in embedding_configs(module)]
        for name, c in self.constraints.items():
            if name not in names:
                raise ConstraintError(f"constraints: {name!r} is not a table of the model (its tables: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")
            if not isinstance(c, self.tr.ParameterConstraints):
                raise ConstraintError(f"constraints, table {name!r}: expected a TorchRec ParameterConstraints, got {type(c).__name__}")
            allowed_types(name, c, offered=self.offered)
            check_kernel(name, c, "fused")
            if getattr(c, "use_virtual_table", False):
                raise ConstraintError(f"{constraint_text(name, 'use_virtual_table', True)}: dreamshard plans tables held whole in device memory")
            group = getattr(c, "device_group", None)
            if group and group != self.topology.compute_device:
                raise ConstraintError(f"{constraint_text(name, 'device_group', group)}: dreamshard plans every table on the topology's {self.topology.compute_device} ranks")

    def task(self, module: Any, sharders: list) -> Task:
        """What dreamshard plans: the model's tables on the topology's ranks, each with the memory
        TorchRec's reservation leaves on the smallest rank, at the global batch (the per-rank
        `batch_size` × world size). It also notes the sharding types the `sharders` offer on the
        topology's compute device (`offered`), which bound every table's."""
        self.offered = offered_types(sharders, self.topology.compute_device)
        self._check_constraints(module)
        with quiet():
            left = self.reservation.reserve(topology=self.topology, batch_size=self.batch_size, module=module, sharders=sharders, constraints=self.constraints)
        kind = "ddr" if self.topology.compute_device == "cpu" else "hbm"
        cap = min(int(getattr(d.storage, kind)) for d in left.devices)
        if cap < 1:
            raise InfeasibleError(f"TorchRec's storage reservation leaves no {kind.upper()} on a rank (of {self.topology.world_size})")
        world = self.topology.world_size
        task = task_from_torchrec(module, world, cap, self.batch_size * world, self.optimizer, constraints=self.constraints, rank_batch_size=self.batch_size,
                                  **{k: v for k, v in self.statistics.items() if v is not None})
        if self.topology.local_world_size < world:  # several hosts: plan (and price) on them, with TorchRec's bandwidths
            from dataclasses import replace

            from dreamshard.topology import from_torchrec

            task = replace(task, topology=from_torchrec(self.topology)).validate("task from TorchRec")
        return task

    def plan(self, module: Any, sharders: list | None = None):
        """The module's TorchRec ShardingPlan (the tables of its EmbeddingBagCollections), planned
        by the dreamshard planner within the constraints and checked by TorchRec's planner."""
        tr = self.tr
        sharders = sharders if sharders is not None else [tr.EmbeddingBagCollectionSharder()]
        ours = self.dreamshard_plan(self.task(module, sharders))
        self.last_plan = ours
        pinned = constraints_for(ours, self.constraints, self.local_world_size)
        with quiet():
            self.last_planner = tr.EmbeddingShardingPlanner(
                topology=self.topology, batch_size=self.batch_size, storage_reservation=self.reservation, proposer=tr.GreedyProposer(),
                enumerator=dreamshard_enumerator(ours, self.topology, self.batch_size, pinned, self.local_world_size),
                partitioner=dreamshard_partitioner(ours), performance_model=self.performance_model, constraints=pinned,
                stats=self.stats, debug=self.debug, callbacks=self.callbacks, timeout_seconds=self.timeout_seconds)
            try:
                return self.last_planner.plan(module, sharders)
            except tr.PlannerError as e:
                raise InfeasibleError(self._reason(ours, e)) from None
            except Exception as e:  # TorchRec's own failure on this model, as one line
                raise NoPlanError(f"TorchRec failed to take the {ours.planner} plan ({type(e).__name__}: {one_line(e)[:600]})") from None

    def dreamshard_plan(self, task: Task) -> Plan:
        """The planner's plan of `task` within the constraints (the two passes of the class doc),
        its row splits TorchRec's layouts (`Task.row_layouts`)."""
        task = replace(task, row_layouts="torchrec")
        cons = self.constraints or {}
        kinds = {t.name: allowed_types(t.name, cons.get(t.name), offered=self.offered) for t in task.tables}
        first, redo = None, {t.name for t in task.tables}
        if any(set(k) != {"table_wise"} for k in kinds.values()):  # some table may be split: the planner's own plan first
            try:
                first = self.planner.plan(task)
            except InfeasibleError:
                first = None  # e.g. a table-wise planner and a table larger than a rank: the second pass splits it as allowed
            if first is not None:
                first.check("dreamshard plan")
                redo = set(self._disallowed(first))
                if not redo:
                    return first
        plan = self._lay_out_again(task, first, redo, kinds)
        left = self._disallowed(plan)
        if left:  # the planner split a piece though it was asked to place them whole (it has no split=False)
            why = next(iter(left.values()))
            raise ConstraintError(f"{why}; laid out again, the {plan.planner} planner still split it: give a planner with split=False")
        return plan

    def _disallowed(self, plan: Plan) -> dict[str, str]:
        """Tables whose shards their constraints (or TorchRec) do not allow, with why."""
        by_table: list[list[Shard]] = [[] for _ in plan.task.tables]
        for s in plan.shards:
            by_table[s.table].append(s)
        cons, out = self.constraints or {}, {}
        for t, shards in zip(plan.task.tables, by_table):
            try:
                table_sharding(t, shards, plan.devices, self.local_world_size, cons.get(t.name), offered=self.offered)
            except (ConstraintError, NotExpressibleError) as e:
                out[t.name] = str(e)
        return out

    def _lay_out_again(self, task: Task, first: Plan | None, redo: set[str], kinds: dict[str, tuple[str, ...]]) -> Plan:
        """The second pass: the tables in `redo` laid out as their constraints allow (whole where
        it fits a rank, else by rows in TorchRec's layout, else in the fewest column shards that
        fit), the others as in `first` (its row layouts kept where they are); the planner's
        table-wise variant places every piece that is not a row layout."""

        cap, w, local = task.max_memory_bytes, task.workload, self.local_world_size
        cons = self.constraints or {}
        pinned: list[Shard] = []
        free: list[Shard] = []
        for i, t in enumerate(task.tables):
            mine = [s for s in first.shards if s.table == i] if first is not None else []
            # column shards placed again might span hosts, which table_column_wise alone does not allow
            one_host_only = "column_wise" not in kinds[t.name] and local < task.devices
            if first is not None and t.name not in redo and not (one_host_only and len(mine) > 1 and not mine[0].is_row_shard):
                if any(s.is_row_shard for s in mine):
                    pinned += mine
                else:
                    free += [Shard(i, -1, s.start, s.stop) for s in mine]
                continue
            if first is not None and "table_row_wise" in kinds[t.name] and local < task.devices and len(mine) == local \
                    and sorted(s.row_range(t) for s in mine) == row_wise_cuts(t.rows, local):
                # the planner's row split over as many ranks as a host has: TorchRec's table_row_wise on one host
                pinned += self._row_layout(task, i, "table_row_wise", pinned)
                continue
            pieces, why = self._pieces(task, i, kinds[t.name], pinned)
            if pieces is None:
                c = cons.get(t.name)
                if c is not None and getattr(c, "sharding_types", None):
                    raise ConstraintError(f"{constraint_text(t.name, 'sharding_types', c.sharding_types)}: {why}")
                raise InfeasibleError(f"table {t.name!r}: {why}")
            if pieces and pieces[0].device >= 0:
                pinned += pieces
            else:
                free += pieces
        used = [0] * task.devices
        for s in pinned:
            used[s.device] += s.bytes(task.tables[s.table], w.precision, w.optimizer)
        room = cap - max(used)
        if free and room < 1:
            raise InfeasibleError(f"the tables split by rows ({', '.join(sorted({task.tables[s.table].name for s in pinned}))}) fill a rank's {cap:,} bytes; no room is left for the others")
        planner = self._table_wise_planner()
        placed: list[Shard] = []
        if free:
            try:
                sub = planner.plan(Task(splits.specs(task, free), task.devices, room, w, task.pool, topology=task.topology, row_layouts=task.row_layouts))
            except InfeasibleError as e:
                restricted = [f"{n!r}: {list(k)}" for n, k in kinds.items() if getattr(cons.get(n), "sharding_types", None)]
                raise InfeasibleError(one_line(e) + (f"; within the constraints' sharding_types ({', '.join(restricted[:3])}{', ...' if len(restricted) > 3 else ''})"
                                                     if restricted else "")) from None
            rank = _relabel(task, pinned, [(free[s.table], s) for s in sub.shards])
            for s in sub.shards:  # a piece's shards, back on its table's columns
                p = free[s.table]
                placed.append(Shard(p.table, rank[s.device], p.start + s.start, p.start + s.stop, s.row_start, s.row_stop))
        again = sorted(redo) if first is not None else []
        notes = [f"laid out again for their constraints or TorchRec: {', '.join(again[:8])}{', ...' if len(again) > 8 else ''}"] if again else []
        plan = Plan(task, pinned + placed, first.planner if first is not None else getattr(planner, "name", "dreamshard"), notes=notes)
        plan.check("dreamshard plan")
        return plan

    def _pieces(self, task: Task, table: int, kinds: Sequence[str], pinned: list[Shard]) -> tuple[list[Shard] | None, str]:
        """How `_lay_out_again` lays out a table anew: [the whole table] (unplaced) where a rank
        holds it and a whole table is allowed (table_wise, or a column type's one shard); else
        its row shards (placed) in the first allowed row layout whose blocks fit; else its fewest
        column shards (unplaced) that fit, none narrower than min_partition. (None, why) where
        none of those fits."""
        t, w, cap = task.tables[table], task.workload, task.max_memory_bytes
        size = task.table_bytes(t)
        if size <= cap and any(k == "table_wise" or k in COLUMN_TYPES for k in kinds):
            return [Shard(table, -1, 0, t.dim)], ""
        block = None
        for kind in (k for k in kinds if k in ROW_TYPES):
            rows = self._row_layout(task, table, kind, pinned)
            block = max(s.bytes(t, w.precision, w.optimizer) for s in rows)
            if block <= cap:
                return rows, ""
        if any(k in COLUMN_TYPES for k in kinds):
            c = (self.constraints or {}).get(t.name)
            cut = _fitting_columns(task, table, cap, getattr(c, "min_partition", None) if c is not None else None)
            if cut is not None:
                return cut, ""
        missing = [k for k in ("row_wise", "column_wise") if k not in kinds and (not self.offered or k in self.offered[1])]
        split = f"; split by rows its largest block needs {block:,}" if block is not None else ""
        return None, (f"the table needs {size:,} bytes, more than the {cap:,} a rank has left after TorchRec's storage reservation{split}, "
                      f"and no split allowed fits{'; allow ' + ' or '.join(missing) if missing else ''}")

    def _row_layout(self, task: Task, table: int, kind: str, pinned: list[Shard]) -> list[Shard]:
        """Table `table` split by rows in TorchRec's `kind` layout: row_wise over every rank,
        table_row_wise over the ranks of the host with the fewest bytes pinned so far."""
        t, w, local = task.tables[table], task.workload, self.local_world_size
        if kind == "row_wise":
            ranks = list(range(task.devices))
        else:
            load = [0] * (task.devices // local)
            for s in pinned:
                load[s.device // local] += s.bytes(task.tables[s.table], w.precision, w.optimizer)
            host = min(range(len(load)), key=lambda h: load[h])
            ranks = list(range(host * local, (host + 1) * local))
        return [Shard(table, r, 0, t.dim, a, b) for r, (a, b) in zip(ranks, row_wise_cuts(t.rows, len(ranks))) if a < b]

    def _table_wise_planner(self) -> "Planner":
        """The planner with its splitting off (a copy with `split=False`), or itself where it has no such switch."""
        if getattr(self.planner, "split", False):
            planner = copy.copy(self.planner)
            planner.split = False
            return planner
        return self.planner

    @staticmethod
    def _reason(plan: Plan, error: Exception) -> str:
        """TorchRec's verdict (its first line) and, where it has one, the partitioner's reason
        (its "Last planner error"), on one line."""
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
        first = lines[0] if lines else type(error).__name__
        at = next((i for i, ln in enumerate(lines) if ln.startswith("Last planner error")), None)
        last = " ".join(lines[at + 1 : at + 2]) if at is not None else ""
        return one_line(f"TorchRec refused the {plan.planner} plan: {first}" + (f" ({last})" if last else ""))[:800]

    def collective_plan(self, module: Any, sharders: list | None = None, pg: Any = None):
        """`plan` on rank 0, broadcast to the others (as TorchRec's planners do)."""
        import torch.distributed as dist
        from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result

        pg = pg if pg is not None else dist.GroupMember.WORLD
        return invoke_on_rank_and_broadcast_result(pg, 0, self.plan, module, sharders)


def _relabel(task: Task, pinned: Sequence[Shard], placed: Sequence[tuple[Shard, Shard]]) -> list[int]:
    """Which rank each device of the table-wise planner's plan of the pieces becomes: that planner
    saw the ranks empty, but the row layouts pinned before it load some of them, so its busiest
    device goes to the least loaded rank, and so on (by lookups × width per sample, a row block
    taking its share of its table's; any relabelling fits, as every rank kept room for the
    pinned bytes). (piece, its shard in that plan) pairs in `placed`. Without row layouts the
    ranks are the planner's devices."""
    if not pinned:
        return list(range(task.devices))
    mine = [0.0] * task.devices
    for s in pinned:
        t = task.tables[s.table]
        a, b = s.row_range(t)
        mine[s.device] += t.pooling_factor * t.dim * (b - a) / t.rows
    theirs = [0.0] * task.devices
    for piece, s in placed:
        t = task.tables[piece.table]
        a, b = s.row_range(t)
        theirs[s.device] += t.pooling_factor * s.width * (b - a) / t.rows
    rank = [0] * task.devices
    busiest = sorted(range(task.devices), key=lambda d: -theirs[d])
    for d, r in zip(busiest, sorted(range(task.devices), key=lambda r: mine[r])):
        rank[d] = r
    return rank


def _fitting_columns(task: Task, table: int, cap: int, min_width: int | None) -> list[Shard] | None:
    """The fewest about-equal column shards of `table` (widths multiples of 4, at least
    `min_width`) each within `cap` bytes, unplaced; None where none are."""
    from dreamshard.plan import column_cuts

    t, w = task.tables[table], task.workload
    for parts in range(2, t.dim // 4 + 1):
        pieces = [Shard(table, -1, a, b) for a, b in column_cuts(t.dim, parts)]
        if min_width and min(p.width for p in pieces) < min(min_width, t.dim):
            return None
        if max(p.bytes(t, w.precision, w.optimizer) for p in pieces) <= cap:
            return pieces
    return None


def _planner_object(planner: Any) -> "Planner":
    """A dreamshard planner object from a name (`get_planner(name)`) or the object itself."""
    if isinstance(planner, str):

        return get_planner(planner)
    if not callable(getattr(planner, "plan", None)):
        raise OptionError(f"ShardingPlanner: planner must be a dreamshard planner name or object (get_planner(name)), not {planner!r:.60}")
    return planner


def _default_topology(tr: SimpleNamespace) -> Any:
    """TorchRec's default topology: the process group's world and local sizes on its device type."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise OptionError("ShardingPlanner: no topology given and no process group to take one from; pass topology=Topology(world_size=..., compute_device=...)")
    from torchrec.distributed.comm import get_local_size

    import torch

    return tr.Topology(world_size=dist.get_world_size(), local_world_size=get_local_size(), compute_device="cuda" if torch.cuda.is_available() else "cpu")
