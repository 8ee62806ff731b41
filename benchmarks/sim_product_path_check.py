"""The simulator against the `hot` family's plans measured on an H200 with the backward's product
path (benchmarks/results/gpu_hot_family_product_path/plans.csv, from
`gpu_heldout_planners.py --families hot --total-s 200`): the same tasks re-drawn and re-planned here
(CPU; the planners are deterministic), priced by the shipped calibration with and without the
product path's pricing (costs/sim.py `product_path`), whole-step MAPE per setting.

    python benchmarks/sim_product_path_check.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_heldout_planners as g  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu_hot_family_product_path", "plans.csv")
# the model shipped when that campaign ran: its "dreamshard (shipped)" plans are this model's
SHIPPED_THEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu_shipped_model_kf", "model_gpu.pt")


def main() -> None:
    sims = {"without": SimBackend(product_path=False), "with": SimBackend(product_path=True)}
    planners = {"dreamshard (shipped)": DreamShardPlanner(SHIPPED_THEN), **{h: get_planner(h) for h in g.HEURISTICS}}
    print(f"simulator: {sims['with'].calibration.label}; measured: {RESULTS}")
    errs: dict[str, dict[str, list[float]]] = {}
    for _, setting, row, plan in g.measured_plans(RESULTS, planners):
        m = float(row["measured_ms"])
        for k, sim in sims.items():
            errs.setdefault(setting, {k: [] for k in sims})[k].append(abs(sim.evaluate_plan(plan).overall_ms - m) / m)
    for setting, e in errs.items():
        print(f"{setting}: {len(e['with'])} plans; whole-step MAPE without the product path {100 * np.mean(e['without']):.1f}%, "
              f"with it {100 * np.mean(e['with']):.1f}% (max {100 * max(e['with']):.1f}%)")


if __name__ == "__main__":
    main()
