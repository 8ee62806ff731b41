"""The `autoshard` planner: AutoShard's policy (Zha et al., KDD 2022) places the tables one at a
time, costliest first by its cost model, an LSTM over the placements so far — milliseconds, no GPU.
A `LearnedPlanner`: `fit` trains it against a cost backend (dreamshard/learned/autoshard.py, the
paper's algorithm and our departures from it); `--model` gives a trained file. There is no shipped
AutoShard model: it is a peer we compare with, trained here as its authors train it.

The policy takes the most likely device with room for each table; if it strands a table the plan
is a memory packing instead, and says so in its notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dreamshard.learned.autoshard import CONFIGS, AutoShardModel, Config, plan_placement, train
from dreamshard.packing import over_bounds
from dreamshard.plan import Plan
from dreamshard.planners.base import LearnedPlanner, register
from dreamshard.planners.heuristics import place_or_pack, task_infeasible
from dreamshard.tasks import Task
from dreamshard.validation import OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend


@register
class AutoShardPlanner(LearnedPlanner):
    """`model`: a file from `dreamshard train --planner autoshard`, or an `AutoShardModel`."""

    name, description = "autoshard", "AutoShard (KDD 2022): LSTM policy over placements, trained by V-trace against a cost backend (--model)"
    requires = ("model",)
    CONFIGS, default_config = CONFIGS, "paper"

    def __init__(self, model: str | Path | AutoShardModel | None = None):
        if model is None:
            raise OptionError("planner autoshard needs a trained model: --model MODEL.pt from `dreamshard train --planner autoshard`")
        self.model = model if isinstance(model, AutoShardModel) else AutoShardModel.load(model)
        self.model.net.eval()

    @classmethod
    def fit(cls, tasks: Sequence[Task], backend: CostBackend, out: str | Path, config: Config | None = None, **loop) -> "AutoShardPlanner":
        """AutoShard's training (`learned.autoshard.train`, config `paper` unless given) on `tasks` against `backend`."""
        return cls(model=train(config or cls.config(), tasks, backend, out, **loop))

    def save(self, path: str | Path) -> None:
        self.model.save(path)

    def plan(self, task: Task) -> Plan:
        if over_bounds(task.sizes(), task.max_memory_bytes, task.devices):
            raise task_infeasible(task)
        placement = plan_placement(self.model.net, task)
        if placement is not None:
            return Plan.table_wise(task, [int(d) for d in placement], self.name)
        plan = place_or_pack(task, None, self.name)
        plan.notes = ["autoshard policy ran out of memory; used a memory packing instead"]
        return plan
