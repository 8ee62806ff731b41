"""The simulator against the `hot` family's plans measured on an H200 with the backward's product
path (benchmarks/results/gpu_hot_family_product_path/plans.csv, from
`gpu_heldout_planners.py --families hot --total-s 200`): the same tasks re-drawn and re-planned here
(CPU; the planners are deterministic), priced by the shipped calibration with and without the
product path's pricing (costs/sim.py `product_path`), whole-step MAPE per setting.

    python benchmarks/sim_product_path_check.py
"""

from __future__ import annotations

import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_heldout_planners as g  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu_hot_family_product_path", "plans.csv")


def main() -> None:
    wl = Workload(65_536)
    with open(RESULTS, newline="") as fh:
        measured = {(r["setting"], int(r["task"]), r["planner"]): float(r["measured_ms"]) for r in csv.DictReader(fh)}
    pool = synth_family("hot", 300, 11)
    sims = {"without": SimBackend(product_path=False), "with": SimBackend(product_path=True)}
    planners = {"dreamshard (shipped)": get_planner("dreamshard"), **{h: get_planner(h) for h in g.HEURISTICS}}
    print(f"simulator: {sims['with'].calibration.label}; measured: {RESULTS}")
    for n, d, cap, seed in g.SETTINGS:
        name = g.setting_name(n, d, cap)
        errs: dict[str, list[float]] = {k: [] for k in sims}
        for i, task in enumerate(sample_tasks(pool, 7, (n, n), d, cap, seed=seed, workload=wl)):
            for label, planner in planners.items():
                if (name, i, label) in measured:
                    plan, m = planner.plan(task), measured[(name, i, label)]
                    for k, sim in sims.items():
                        errs[k].append(abs(sim.evaluate_plan(plan).overall_ms - m) / m)
        print(f"{name}: {len(errs['with'])} plans; whole-step MAPE without the product path {100 * np.mean(errs['without']):.1f}%, "
              f"with it {100 * np.mean(errs['with']):.1f}% (max {100 * max(errs['with']):.1f}%)")


if __name__ == "__main__":
    main()
