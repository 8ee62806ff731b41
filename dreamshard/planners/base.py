"""The planner role and its registry: one name → one class, constructed from config only."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Callable

from dreamshard.plan import Plan
from dreamshard.tasks import Task
from dreamshard.validation import OptionError

PLANNERS: dict[str, type["Planner"]] = {}


class Planner(ABC):
    """Places the tables of a task on its devices, within memory. Never touches a cost backend."""

    name: str = "?"
    description: str = ""
    kind: str = "?"  # "heuristic", "search" (over plans, scored by a model) or "learned" (a trained policy)

    @classmethod
    def options(cls) -> dict[str, object]:
        """The constructor's options and their defaults: what `get_planner(name, **options)` takes."""
        params = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in params if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}

    @abstractmethod
    def plan(self, task: Task) -> Plan: ...

    def plan_many(self, tasks: list[Task], progress: Callable[[], None] | None = None) -> list[Plan]:
        plans = []
        for task in tasks:
            plans.append(self.plan(task))
            if progress:
                progress()
        return plans


def register(cls: type[Planner]) -> type[Planner]:
    PLANNERS[cls.name] = cls
    return cls


def get_planner(name: str, **kwargs) -> Planner:
    if name not in PLANNERS:
        raise OptionError(f"unknown planner {name!r}; choose from {', '.join(sorted(PLANNERS))}")
    unknown = sorted(set(kwargs) - set(PLANNERS[name].options()))
    if unknown:
        raise OptionError(f"planner {name} has no option {unknown[0]!r}; its options: {', '.join(PLANNERS[name].options()) or 'none'}")
    return PLANNERS[name](**kwargs)
