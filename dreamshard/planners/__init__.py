"""One registry of planners. Importing this package registers every built-in planner."""

from dreamshard.planners import dreamshard, heuristics, neuroshard  # noqa: F401  (registers)
from dreamshard.planners.base import PLANNERS, Planner, get_planner, register

__all__ = ["PLANNERS", "Planner", "get_planner", "register"]
