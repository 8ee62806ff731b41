"""The tier stage every planner runs when a task's tables do not fit in HBM (docs/tiers.md): each
table's tier before placement (`assign_tiers`), the planner's placement with those tiers
(`plan_with_tiers`, which `Planner` runs every `plan` through), and each device's free HBM given
to its host-tier shards after it (`grow_caches`). What a tier is and costs: tiers.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from dreamshard.packing import InfeasibleError, format_bytes, pack
from dreamshard.plan import Plan, Shard
from dreamshard.tables import PRECISION_BYTES
from dreamshard.tasks import Task
from dreamshard.tiers import FILLS, Tier, _options, full_bytes, link_bytes, tier_of


def assign_tiers(task: Task, fill: float = FILLS[0]) -> dict[str, Tier]:
    """Each table's tier when the task's tables do not fit its devices' HBM: all start in host
    memory (uvm), then a greedy spends `fill` of the devices' HBM on the steps that save the most
    host-link bytes per HBM byte — a cache for a cold table, a bigger cache, or the whole table in
    HBM for the hot ones. A table left in uvm is one whose cache could not help (it could not hold
    a batch's rows, or its hits would not pay for its bytes before the HBM ran out). Raises
    InfeasibleError when the host-tier tables do not fit the host memory."""
    w = task.workload
    cap, D = task.max_memory_bytes, task.devices
    budget = int(fill * cap * D)
    hulls = [_options(t, cap, w.batch_size, w.precision, w.optimizer) for t in task.tables]
    steps = []  # (saved per byte, table, hull position)
    for i, h in enumerate(hulls):
        for k in range(1, len(h)):
            extra = h[k][0] - h[k - 1][0]
            steps.append(((h[k - 1][1] - h[k][1]) / max(extra, 1), i, k))
    steps.sort(key=lambda s: -s[0])
    at = [0] * len(hulls)
    used = 0
    for _, i, k in steps:
        if at[i] != k - 1:
            continue  # an earlier step of this table did not fit
        extra = hulls[i][k][0] - hulls[i][k - 1][0]
        if used + extra <= budget:
            used += extra
            at[i] = k
    tiers = {t.name: hulls[i][at[i]][2] for i, t in enumerate(task.tables)}
    host = sum(full_bytes(t.rows, t.dim, w.precision, w.optimizer) for t in task.tables if tiers[t.name].kind != "hbm")
    if host > D * task.host_memory_bytes:
        raise InfeasibleError(f"cannot place {len(task.tables)} tables: {format_bytes(host)} of them must go to host memory, more than "
                              f"{D} devices × {format_bytes(task.host_memory_bytes)} of host memory hold")
    return tiers


def describe(tiers: dict[str, Tier]) -> str:
    """The tier stage's choice in words (table counts, before placement)."""
    kinds = [t.kind for t in tiers.values()]
    return f"tiers: {kinds.count('hbm')} tables in HBM, {kinds.count('uvm_caching')} in host memory behind an HBM cache, {kinds.count('uvm')} in host memory (uvm)"


HOST_HINT = " of HBM and no host memory (--host-memory, a task's host_memory_bytes, puts what does not fit in HBM in host memory behind an HBM cache)"


def plan_with_tiers(place: Callable[[Task], Plan], task: Task) -> Plan:
    """The tier stage around a planner's placement (`Planner` runs every `plan` through it): a task
    whose tables fit in HBM, or that offers no host memory, is placed as it is; otherwise tiers are
    assigned (`assign_tiers`) and the planner places the task with those tiers, whose HBM sizes it
    packs (Task.table_bytes); a fill that leaves it no placement is retried with less HBM."""
    if task.tiers is not None:
        return place(task)
    if not task.host_memory_bytes:
        try:
            return place(task)
        except InfeasibleError as e:
            if sum(task.sizes()) <= task.devices * task.max_memory_bytes:
                raise  # the bytes fit the devices' HBM in all: host memory is not what is missing
            text = str(e)  # the hint goes after the bytes, before the reason that ends the message
            raise InfeasibleError(text.replace(" in all", " in all" + HOST_HINT, 1) if " in all" in text else text + HOST_HINT) from None
    if pack(task.sizes(), task.max_memory_bytes, task.devices, node_budget=20_000) is not None:
        return place(task)
    last: InfeasibleError | None = None
    for fill in FILLS:
        tiered = replace(task, tiers=assign_tiers(task, fill))
        try:
            plan = place(tiered)
        except InfeasibleError as e:
            last = e
            continue
        host = plan.device_host_bytes()
        d = int(np.argmax(host))
        if host[d] > task.host_memory_bytes:
            last = InfeasibleError(f"device {d} would hold {format_bytes(host[d])} in host memory, over its {format_bytes(task.host_memory_bytes)}")
            continue
        grown, changed = grow_caches(plan)
        grown.notes.append(describe(tiered.tiers) + f" (tier stage: {fill:.0%} of HBM for tables and caches)"
                           + (f"; after placement {changed} host-tier shards took more of their device's free HBM" if changed else ""))
        return grown
    assert last is not None
    raise last


def grow_caches(plan: Plan) -> tuple[Plan, int]:
    """The tier stage after placement: each device's free HBM (the packing leaves some) goes to its
    host-tier shards, greedily to the step that saves the most host-link bytes per HBM byte — a
    larger cache, a cache for a uvm shard, or the whole shard in HBM — so that every cache is sized
    to the HBM its device has left. → (the plan, carrying its shards' own tiers: its task no
    longer imposes the table-wide ones; the number of shards changed)."""
    task, w = plan.task, plan.workload
    cap = task.max_memory_bytes
    used = plan.device_bytes()
    specs = plan.shard_specs()
    shards = list(plan.shards)
    grown = set()
    for d in range(plan.devices):
        mine = [i for i, s in enumerate(shards) if s.device == d and s.tier != "hbm"]
        free = cap - used[d]
        while mine and free > 0:
            best = None  # (saved per byte, shard, extra bytes, tier)
            for i in mine:
                s, spec = shards[i], specs[i]
                now_hbm = s.bytes(task.tables[s.table], w.precision, w.optimizer)
                now_link = link_bytes(spec, s.tier, s.cache_ratio, w.batch_size, PRECISION_BYTES[w.precision])
                for hb, lb, tier in _options(spec, now_hbm + free, w.batch_size, w.precision, w.optimizer):
                    extra = hb - now_hbm
                    if extra > 0 and lb < now_link and (best is None or (now_link - lb) / extra > best[0]):
                        best = ((now_link - lb) / extra, i, extra, tier)
            if best is None:
                break
            _, i, extra, tier = best
            shards[i] = replace(shards[i], tier=tier.kind, cache_ratio=tier.cache_ratio)
            free -= extra
            used[d] += extra
            grown.add(i)
            if tier.kind == "hbm":
                mine.remove(i)
    return Plan(replace(task, tiers=None), shards, plan.planner, plan.predicted, list(plan.notes)), len(grown)



def with_task_tier(task: Task, shard: Shard) -> Shard:
    """The shard with its table's tier in the task (a tierless piece of a planner's search)."""
    if task.tiers is None:
        return shard
    t = tier_of(task.tiers, task.tables[shard.table].name)
    if (shard.tier, shard.cache_ratio) == (t.kind, t.cache_ratio):
        return shard
    return replace(shard, tier=t.kind, cache_ratio=t.cache_ratio)
