"""One registry of planners. Importing this package registers every built-in planner."""

from dreamshard.planners import heuristics, dreamshard, neuroshard, autoshard, rnn  # noqa: F401  (registers)
from dreamshard.planners import torchrec  # noqa: F401  (registers; TorchRec itself is imported only when the planner is built)
from dreamshard.planners import oracle  # noqa: F401  (registers; needs a cost backend, so the demo and compare skip it)
from dreamshard.planners.base import PLANNERS, Planner, get_planner, register

__all__ = ["PLANNERS", "Planner", "get_planner", "register"]
