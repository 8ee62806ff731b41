"""`neuroshard`: NeuroShard's search (Zha et al., MLSys 2023, "Pre-train and Search"), scored by
our cost net instead of its three pre-trained ones.

As its authors describe it:
- **Inner placement** — greedy: pieces in descending predicted single-piece compute, each to the
  device with the least predicted compute so far among those with memory for it and whose dim
  sum stays within `cap` × (total dim / devices); the device's compute is re-predicted for its
  whole fused set after each piece. The cap is swept over `caps` values in [1.0, 1.5] and the
  placement with the lowest predicted step cost (compute and communication) kept.
- **Outer search** — a beam search (width `beam`, depth `depth`) over column-wise sharding plans:
  a step halves one piece among the union of the `top` largest and the `top` costliest (at most
  2 × `top` candidates per plan); every candidate is scored by its best inner placement.
The best plan seen, table-wise included, is returned.

Every candidate at one depth has the same number of pieces, so all inner greedies of a depth run
as one batch (candidates × cap values) in NumPy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dreamshard.learned.nets import DreamShardModel
from dreamshard.packing import over_bounds
from dreamshard.plan import Plan, Shard
from dreamshard.planners import splits
from dreamshard.planners.base import Planner, register
from dreamshard.planners.heuristics import place_or_pack, task_infeasible
from dreamshard.planners.scoring import PieceScorer
from dreamshard.tasks import Task


def greedy_batch(scorer: PieceScorer, pieces: list[list[Shard]], caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NeuroShard's inner greedy for C candidates × S dim caps at once → (best cost [C] units,
    inf where no cap placed every piece; devices [C, n] of the best placement)."""
    task, net = scorer.task, scorer.net
    C, n, D, S = len(pieces), len(pieces[0]), task.devices, len(caps)
    rows = scorer.rows(pieces)  # [C, n, R]
    nP = net.nP
    single = scorer.alone(rows)  # [C, n]
    sizes = np.array([splits.sizes(task, ps) for ps in pieces], np.int64)
    dims = np.array([[p.width for p in ps] for ps in pieces], np.int64)
    order = np.argsort(-single, axis=1, kind="stable")  # [C, n]
    E = C * S  # episode e = candidate e // S at cap e % S
    cand = np.repeat(np.arange(C), S)
    dim_cap = np.tile(caps, C) * dims[0].sum() / D  # the total dim is the same for every candidate
    state = net.empty((E, D))
    comp = np.zeros((E, D))  # an empty device computes nothing (not the heads' bias)
    used = np.zeros((E, D), np.int64)
    dim_sum = np.zeros((E, D), np.int64)
    devices = np.full((E, n), -1, np.int64)
    failed = np.zeros(E, bool)
    es = np.arange(E)
    for step in range(n):
        i = order[cand, step]  # [E] piece placed now
        size, dim = sizes[cand, i], dims[cand, i]
        legal = (used + size[:, None] <= task.max_memory_bytes) & (dim_sum + dim[:, None] <= dim_cap[:, None])
        failed |= ~legal.any(1)
        a = np.where(legal, comp, np.inf).argmin(1)
        state[es, a] += rows[cand, i]
        used[es, a] += size
        dim_sum[es, a] += dim
        comp[es, a] = net.costs(state[es, a, :nP])[:, :2].sum(-1)
        devices[es, i] = a
    cost = np.where(failed, np.inf, scorer.score(state)).reshape(C, S)
    best = cost.argmin(1)
    return cost[np.arange(C), best], devices.reshape(C, S, n)[np.arange(C), best]


@register
class NeuroShardPlanner(Planner):
    name = "neuroshard"
    kind = "search"
    description = "NeuroShard (MLSys 2023): beam search over column halvings, greedy under a swept dim-sum cap, scored by the cost net (--model)"

    def __init__(self, model: str | Path | None = None, beam: int = 3, depth: int = 10, top: int = 10, caps: int = 11):
        if min(beam, top, caps) < 1 or depth < 0:
            raise ValueError("neuroshard needs beam, top, caps >= 1 and depth >= 0")
        self.model = DreamShardModel.load(model)
        self.label = "shipped H200 model" if model is None else str(model)
        self.beam, self.depth, self.top = beam, depth, top
        self.caps = np.linspace(1.0, 1.5, caps)

    def plan(self, task: Task) -> Plan:
        if over_bounds(task.sizes(), task.max_memory_bytes, task.devices):
            raise task_infeasible(task)
        scorer = PieceScorer(self.model, task)
        start = splits.whole(task)
        cost, devices = greedy_batch(scorer, [start], self.caps)
        best = (float(cost[0]), start, devices[0])
        beams = [start]
        for _ in range(self.depth):
            seen, candidates = set(), []
            for pieces in beams:
                for i in self._candidates(scorer, pieces):
                    halves = splits.cut(pieces[i], 2)
                    new = pieces[:i] + pieces[i + 1 :] + halves
                    key = frozenset(new)
                    if key not in seen:
                        seen.add(key)
                        candidates.append(new)
            if not candidates:
                break
            costs, devs = greedy_batch(scorer, candidates, self.caps)
            ranked = np.argsort(costs, kind="stable")
            if costs[ranked[0]] < best[0]:
                best = (float(costs[ranked[0]]), candidates[ranked[0]], devs[ranked[0]])
            beams = [candidates[k] for k in ranked[: self.beam] if np.isfinite(costs[k])]
            if not beams:
                break
        if not np.isfinite(best[0]):  # no cap let the greedy place everything: a memory packing
            plan = place_or_pack(task, None, self.name)
            plan.notes = ["neuroshard's greedy found no placement within memory and the dim caps; used a memory packing instead"]
            return plan
        _, pieces, devices = best
        return splits.placed(task, pieces, devices, self.name, predicted=scorer.predicted(pieces, devices, self.label))

    def _candidates(self, scorer: PieceScorer, pieces: list[Shard]) -> list[int]:
        """Pieces worth halving: the union of the `top` largest and the `top` costliest."""
        single = scorer.alone(scorer.rows([pieces])[0])
        sizes = np.array(splits.sizes(scorer.task, pieces))
        k = min(self.top, len(pieces))
        chosen = set(np.argsort(-sizes, kind="stable")[:k]) | set(np.argsort(-single, kind="stable")[:k])
        return sorted(int(i) for i in chosen if splits.can_halve(pieces[i]))
