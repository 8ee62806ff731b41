"""The `rnn` planner: DreamShard's RNN baseline, the sequence-to-sequence device placer of
Mirhoseini et al. (ICML 2017) trained with REINFORCE on measured costs
(dreamshard/learned/rnn.py: the model, the training and our departures). A `LearnedPlanner`;
`--model` gives a trained file (none is shipped: it is a baseline we compare with).

It decodes greedily among the devices with room; if a table fits nowhere the plan is a memory
packing instead, and says so in its notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dreamshard.learned.rnn import CONFIGS, Config, RNNModel, plan_placement, train
from dreamshard.packing import over_bounds
from dreamshard.plan import Plan
from dreamshard.planners.base import LearnedPlanner, register
from dreamshard.planners.heuristics import place_or_pack, task_infeasible
from dreamshard.tasks import Task
from dreamshard.validation import OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend


@register
class RNNPlanner(LearnedPlanner):
    """`model`: a file from `dreamshard train --planner rnn`, or an `RNNModel`."""

    name, description = "rnn", "seq2seq LSTM device placer (Mirhoseini et al. 2017), REINFORCE on measured costs (--model)"
    requires = ("model",)
    CONFIGS, default_config = CONFIGS, "paper"

    def __init__(self, model: str | Path | RNNModel | None = None):
        if model is None:
            raise OptionError("planner rnn needs a trained model: --model MODEL.pt from `dreamshard train --planner rnn`")
        self.model = model if isinstance(model, RNNModel) else RNNModel.load(model)
        self.model.net.eval()

    @classmethod
    def fit(cls, tasks: Sequence[Task], backend: CostBackend, out: str | Path, config: Config | None = None, **loop) -> "RNNPlanner":
        """The RNN placer's training (`learned.rnn.train`, config `paper` unless given) on `tasks` against `backend`."""
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
        plan.notes = ["rnn placer ran out of memory; used a memory packing instead"]
        return plan
