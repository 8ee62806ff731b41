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

Our addition, row-wise shards (docs/rowwise.md; NeuroShard has none): a step may also split a whole table
by rows over k devices (`splits.row_parts`: 2, 4, ... and all D, TorchRec's row-wise layout), for
the `scoring.ROW_CANDIDATES` costliest tables whose compute alone exceeds the reduce-scatter + all-gather
their rows would add (`PieceScorer.row_candidates`). Row pieces are priced by their own features
and the exchange as the simulator prices it (scoring.py); the inner greedy puts block r of a split
over all D on device r and the pieces of a smaller split on distinct devices. A row split is kept
only where the best inner placement of its candidate scores lowest, as a halving is. A table
larger than a device starts the search split by rows (`splits.forced_row_splits`).

The inner greedies of a depth run as one batch (candidates × cap values) in NumPy per number of
pieces (a halving adds one piece, a row split k − 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dreamshard import shipped
from dreamshard.packing import over_bounds
from dreamshard.plan import Plan
from dreamshard.planners import splits
from dreamshard.planners.base import LazyImports, Planner, register
from dreamshard.planners.heuristics import place_or_pack
from dreamshard.tasks import Task
from dreamshard.validation import OptionError

# the cost net (torch): bound when a planner is built (base.LazyImports), so listing the registry
# does not import torch
lazy = LazyImports(globals(), {
    "dreamshard.learned.nets": "DreamShardModel",
    "dreamshard.planners.scoring": "PieceScorer beam_search comm_params greedy_batch",
})
__getattr__ = lazy.getattr

@register
class NeuroShardPlanner(Planner):
    name = "neuroshard"
    kind = "search"
    budget_option = ("depth", "beam-search steps")
    description = "NeuroShard (MLSys 2023): beam search over column halvings, greedy under a swept dim-sum cap, scored by the cost net (--model)"

    def __init__(self, model: str | Path | None = None, beam: int = 3, depth: int = 10, top: int = 10, caps: int = 11, comm_model: str | Path | None = None):
        """`model`: a model file, or None for DreamShard's shipped model for this GPU
        (`dreamshard.shipped`). `comm_model`: the comm model (file) whose collectives price row
        splits; None: the NCCL model shipped for the GPU planned for (`scoring.comm_params`)."""
        if min(beam, top, caps) < 1 or depth < 0:
            raise OptionError("neuroshard needs beam, top, caps >= 1 and depth >= 0")
        lazy.load()
        self.model = DreamShardModel.load(model)
        self.comm = comm_params(comm_model) if comm_model is not None else None  # None: the shipped model of each task's device count
        self.label = shipped.label("dreamshard") if model is None else str(model)  # the shipped model for this GPU (dreamshard.shipped)
        self.beam, self.depth, self.top = beam, depth, top
        self.caps = np.linspace(1.0, 1.5, caps)

    def plan(self, task: Task) -> Plan:
        forced = over_bounds(task.sizes(), task.max_memory_bytes, task.devices)
        start = splits.forced_row_splits(task) if forced else splits.whole(task)  # InfeasibleError where even rows cannot place it
        scorer = PieceScorer(self.model, task, self.comm)
        cost, devices, _ = greedy_batch(scorer, [start], self.caps)
        if forced and not np.isfinite(cost[0]):  # no packing to fall back on: the greedy under memory alone
            cost, devices, _ = greedy_batch(scorer, [start], np.array([splits.NO_DIM_CAP]))
        best = beam_search(scorer, [start], self.caps, self.beam, self.depth, self.top, (float(cost[0]), start, devices[0]), self.progress)
        if not np.isfinite(best[0]):  # no cap let the greedy place everything: a memory packing
            if forced:
                raise splits.infeasible(task)  # a table larger than a device: no table-wise packing either
            plan = place_or_pack(task, None, self.name)
            plan.notes = ["neuroshard's greedy found no placement within memory and the dim caps; used a memory packing instead"]
            return plan
        _, pieces, devices = best
        return splits.placed(task, pieces, devices, self.name, predicted=scorer.predicted(pieces, devices, self.label))
