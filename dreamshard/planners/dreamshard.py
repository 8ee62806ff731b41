"""The `dreamshard` planner: a trained policy plays the cost net's MDP — milliseconds, no GPU.

With `best_of` K > 1 it plays the greedy episode and K − 1 sampled ones in one batch and keeps
the placement the cost net predicts cheapest. The returned plan carries the cost net's predicted
per-device costs. If every episode runs out of memory (the policy placed big tables badly), the
plan falls back to a memory packing and says so in its notes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dreamshard.mdp import EpisodeBatch, FastPlayer, Prepared, predict, prepare
from dreamshard.nets import COST_COMPONENTS, DreamShardModel, plan_cost
from dreamshard.packing import over_bounds
from dreamshard.plan import Plan
from dreamshard.planners.base import Planner, register
from dreamshard.planners.heuristics import place_or_pack, task_infeasible
from dreamshard.tasks import Task


def best_placement(model: DreamShardModel, p: Prepared, best_of: int, seed: int = 0, player: FastPlayer | None = None) -> tuple[np.ndarray | None, np.ndarray | None, float | None]:
    """(placement [T], predicted per-device costs [D, 3] ms, predicted overall ms), or Nones if stuck."""
    player = player or FastPlayer(model.cost_net, model.policy, model.keep_room)
    greedy = np.zeros(best_of, bool)
    greedy[0] = True  # episode 0 is the greedy one: best_of=1 is the reference's argmax policy
    placement, stuck, costs, overall = player.play(p, greedy, np.random.default_rng(seed))
    if stuck.all():
        return None, None, None
    k = int(np.where(stuck, np.inf, plan_cost(costs, overall, model.score)).argmin())
    scale = float(model.cost_net.scale)
    return placement[k], costs[k] * scale, float(overall[k]) * scale


def predicted_dict(device_costs: np.ndarray, overall: float, model_label: str) -> dict:
    devices = [{**{c: float(v) for c, v in zip(COST_COMPONENTS, row)}, "total_ms": float(row.sum())} for row in device_costs]
    # overall_ms: the overall head; max_device_ms: max over devices of the per-device totals
    return {"source": f"dreamshard cost net ({model_label})", "overall_ms": float(overall), "max_device_ms": max(d["total_ms"] for d in devices), "devices": devices}


@register
class DreamShardPlanner(Planner):
    name, description = "dreamshard", "DreamShard: RL policy on a learned cost model (--model, default: shipped H200 model)"

    def __init__(self, model: str | Path | None = None, best_of: int | None = None, seed: int = 0):
        self.model = DreamShardModel.load(model)
        self.label = "shipped H200 model" if model is None else str(model)
        self.best_of = int(best_of) if best_of is not None else self.model.best_of
        if self.best_of < 1:
            raise ValueError(f"best_of must be >= 1, got {best_of}")
        self.seed = seed
        self.player = FastPlayer(self.model.cost_net, self.model.policy, self.model.keep_room)

    def plan(self, task: Task) -> Plan:
        if over_bounds(task.sizes(), task.max_memory_bytes, task.devices):
            raise task_infeasible(task)  # at once: no episode can succeed
        p = prepare(task, self.model.normalization, self.model.linear_features)
        placement, device_costs, overall = best_placement(self.model, p, self.best_of, self.seed, self.player)
        if placement is not None:
            plan = Plan.table_wise(task, [int(d) for d in placement], self.name)
        else:
            plan = place_or_pack(task, None, self.name)  # raises InfeasibleError if nothing fits
            batch = EpisodeBatch.of([p])
            costs, ov = predict(self.model.cost_net, batch, torch.tensor([plan.placement]))
            scale = float(self.model.cost_net.scale)
            device_costs, overall = costs[0].numpy() * scale, float(ov[0]) * scale
            plan.notes = ["dreamshard policy ran out of memory; used a memory packing instead"]
        plan.predicted = predicted_dict(device_costs, overall, self.label)
        return plan
