"""The planner role and its registry: one name → one class, constructed from config only."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

from dreamshard.plan import Plan
from dreamshard.tasks import Task

PLANNERS: dict[str, type["Planner"]] = {}


class Planner(ABC):
    """Places the tables of a task on its devices, within memory. Never touches a cost backend."""

    name: str = "?"
    description: str = ""

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
        raise ValueError(f"unknown planner {name!r}; choose from {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name](**kwargs)
