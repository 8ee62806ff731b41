"""What the learned peers (`autoshard`, `rnn`) share as planners: their model from `--model`, else
the one shipped for this GPU (`dreamshard.shipped`; without one, a model file is required),
training through their module's `train`, and planning by their policy's placement among the
devices with room — a memory packing, said in the plan's notes, if the policy strands a table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from dreamshard import shipped
from dreamshard.packing import over_bounds
from dreamshard.plan import Plan
from dreamshard.planners.base import LearnedPlanner
from dreamshard.planners.heuristics import place_or_pack, task_infeasible
from dreamshard.tasks import Task
from dreamshard.validation import OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend
    from dreamshard.learned.loop import NetFile


class ModelUnlessShipped:
    """`requires` of a peer: ("model",) unless a model is shipped for it (read from the folder
    when asked, so `dreamshard planners`, `compare` and `demo` see a file added to it)."""

    def __get__(self, obj, owner) -> tuple[str, ...]:
        return () if shipped.available(owner.name) else ("model",)


class DescribedModel:
    """`description` of a peer: its own, and where its model comes from (`--model`, and the
    shipped model where there is one)."""

    def __init__(self, text: str):
        self.text = text

    def __get__(self, obj, owner) -> str:
        default = shipped.describe_default(owner.name)
        return f"{self.text} (--model{', default: ' + default if default else ''})"


class PeerPlanner(LearnedPlanner):
    """A subclass names its `Model` (a NetFile), its module's `train` and its `placement` (net,
    task → devices, or None when stranded), and `who` for the notes; `base.lazy_attr`s, so
    that listing the registry does not import the nets (and torch). `model` None: the shipped
    model for this GPU (`shipped.choose`); `label` says which model plans."""

    requires = ModelUnlessShipped()
    Model: type[NetFile]
    train: Callable
    placement: Callable[..., np.ndarray | None]
    who = "?"

    def __init__(self, model: str | Path | NetFile | None = None):
        self.notes: list[str] = []  # what every plan of this model says (another GPU's shipped model)
        if model is None:
            choice = shipped.choose(self.name)
            if choice is None:
                raise OptionError(f"planner {self.name} needs a trained model: --model MODEL.pt from `dreamshard train --planner {self.name}`")
            model, self.label = choice.path, choice.label
            self.notes = [choice.note] if choice.note else []
        else:
            self.label = "trained model" if isinstance(model, self.Model) else str(model)
        self.model = model if isinstance(model, self.Model) else self.Model.load(model)
        self.model.net.eval()

    @classmethod
    def fit(cls, tasks: Sequence[Task], backend: CostBackend, out: str | Path, config=None, **loop) -> "PeerPlanner":
        """Train with the planner's loop (its default config unless given) on `tasks` against `backend`."""
        planner = cls(model=cls.train(config or cls.config(), tasks, backend, out, **loop))
        planner.label = str(out)
        return planner

    def save(self, path: str | Path) -> None:
        self.model.save(path)

    def place(self, task: Task) -> np.ndarray | None:
        """The policy's placement of `task` (devices per table), or None where it strands a table."""
        return type(self).placement(self.model.net, task)

    def plan(self, task: Task) -> Plan:
        if over_bounds(task.sizes(), task.max_memory_bytes, task.devices):
            raise task_infeasible(task)
        placement = self.place(task)
        if placement is not None:
            return Plan.table_wise(task, [int(d) for d in placement], self.name, notes=self.notes)
        plan = place_or_pack(task, None, self.name)
        plan.notes = [f"{self.who} ran out of memory; used a memory packing instead", *self.notes]
        return plan
