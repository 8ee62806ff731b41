"""The planner role and its registry: one name → one class, constructed from config only."""

from __future__ import annotations

import functools
import importlib
import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from dreamshard.plan import Plan
from dreamshard.tasks import Task
from dreamshard.tier_stage import plan_with_tiers
from dreamshard.validation import OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend

PLANNERS: dict[str, type["Planner"]] = {}


# Listing the registry (`dreamshard planners`, `plan --planner` checks, `--help`) reads each
# planner's name, kind, description and constructor options only. The learned planners' nets
# import torch (about 3 s on a small CPU machine), so their modules bind those names on first
# need, with the two helpers below, instead of at import.


class LazyImports:
    """Names a planner module's code uses from modules that import torch, bound into the module's
    globals by `load` (a planner's constructor and `fit` call it) or on the first read of one of
    them from outside (the module's `__getattr__ = lazy.getattr`). `imports` maps a module to the
    names taken from it (space-separated), or to None for the module itself. A name already bound
    (a test's monkeypatch) is kept."""

    def __init__(self, namespace: dict, imports: dict[str, str | None]):
        self.namespace = namespace
        self.sources = {name: (module, name) for module, names in imports.items() for name in (names or "").split()}
        self.sources |= {module: (module, None) for module, names in imports.items() if names is None}

    def load(self) -> None:
        for name, (module, attr) in self.sources.items():
            if name not in self.namespace:
                value = importlib.import_module(module)
                self.namespace[name] = value if attr is None else getattr(value, attr)

    def getattr(self, name: str):
        if name not in self.sources:
            raise AttributeError(f"module {self.namespace['__name__']!r} has no attribute {name!r}")
        self.load()
        return self.namespace[name]


class lazy_attr:
    """A class attribute that is `module`'s `name`, imported on first read (a function comes back
    unbound, as a staticmethod's would)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __get__(self, obj, owner):
        return getattr(importlib.import_module(self.module), self.name)


class Planner(ABC):
    """Places the tables of a task on its devices, within memory. Never touches a cost backend."""

    name: str = "?"
    description: str = ""
    kind: str = "?"  # "heuristic", "search" (over plans, scored by a model) or "learned" (a trained policy)
    requires: tuple[str, ...] = ()  # options it cannot plan without, though they default to None (so a missing one is a one-line error)
    # (constructor option, what one unit of it is) that bounds a search's work: what `plan --budget`
    # sets; None for planners whose work is fixed by the task alone
    budget_option: tuple[str, str] | None = None
    budget_with_split_only = False  # whether the search it bounds runs only with `split`
    # called by a long search with (units done, units in all) of the task it plans: the CLI's bar
    progress: Callable[[int, int], None] | None = None
    # a planner that chooses memory tiers itself (torchrec: its own kernels and caches) skips the tier stage
    chooses_tiers = False

    def __init_subclass__(cls, **kwargs) -> None:
        """Every planner's `plan` runs inside the tier stage (tier_stage.plan_with_tiers): a task whose
        tables do not fit in HBM, with host memory, is given tiers before the planner places it —
        one place for all planners, none of which needs to know."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("plan")
        if own is None or getattr(own, "_tier_stage", False) or cls.chooses_tiers or getattr(own, "__isabstractmethod__", False):
            return

        @functools.wraps(own)
        def plan(self, task: Task) -> Plan:
            return plan_with_tiers(lambda t: own(self, t), task)

        plan._tier_stage = True
        cls.plan = plan

    @classmethod
    def options(cls) -> dict[str, object]:
        """The constructor's options and their defaults: what `get_planner(name, **options)` takes."""
        params = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in params if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}

    @abstractmethod
    def plan(self, task: Task) -> Plan: ...


class LearnedPlanner(Planner):
    """The role of a planner with a trained model (`kind` "learned"): `fit` trains one on tasks
    against a cost backend — passed in, as a planner meets a backend only when given one (as
    `oracle` and `dreamshard`'s `verify` are) — `save` writes it, `load` (or the constructor's
    `model` option) reads it back, `plan` uses it.

    A learned planner is one file here in dreamshard/planners/ like every planner (the registry
    finds it through this package's __init__.py); its nets and training loop live in
    dreamshard/learned/, whose loop.py holds what every training loop needs (measuring sampled
    plans under a budget, checkpoints, log, progress)."""

    kind = "learned"
    CONFIGS: dict = {}  # name → training config (a dataclass of every hyperparameter)
    default_config = "paper"

    @classmethod
    def config(cls, name: str | None = None, **overrides):
        """The training config `name` (default: the planner's own) with `overrides` (None: keep)."""
        from dreamshard.learned.loop import make_config

        return make_config(cls.CONFIGS, name or cls.default_config, overrides)

    @classmethod
    @abstractmethod
    def fit(cls, tasks: Sequence[Task], backend: "CostBackend", out: str | Path, config=None, **options) -> "LearnedPlanner":
        """Train a model on `tasks`, measuring sampled plans with `backend`; write it to `out`
        (its resumable checkpoint beside it). → the planner that plans with it; `options` are
        the constructor's (other than `model`) and the training loop's own."""

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the planner's model to `path` (atomically)."""

    @classmethod
    def load(cls, path: str | Path, **options) -> "LearnedPlanner":
        """The planner with the model at `path`; `options` as the constructor's."""
        return cls(model=path, **options)


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
