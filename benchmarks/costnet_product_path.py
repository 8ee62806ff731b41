"""Can DreamShard's cost net price the backward's product path? (issue 10; CPU, ~4 min)

    PYTHONPATH=. python benchmarks/costnet_product_path.py [--prior-plans 8000]

The simulator prices a table the Triton kernel's product path takes by that path's model
(costs/paths.py) in place of its backward terms. The cost net learns from the simulator's plans
(the prior) and a few measured ones; with Config.kernel_features it sees a table's backward terms
(costs/terms.py), which say nothing of the path, so a hot small table is an exception it must infer
from rows and pooling. Config.kernel_product_path adds the path's flag and modelled time.

Two prior nets, the loop's prior phase exactly (benchmarks/costnet_prior.py `prior_model`: the
72 training tasks of gpu_shipped_model.py, `--prior-plans` plans priced by the shipped simulator,
which prices the product path), kernel features and the comm model, with and without the path's
features. Each is scored
  - against the simulator: per family, max-device MAPE on held-out simulated plans (pool seed 11,
    lookup-greedy and 2 random placements per task, 40 tables / 4 devices and 80 / 8;
    costnet_prior.py `sim_plans`);
  - against the GPU: max-device MAPE on the `hot` family's plans measured on an H200 with the
    product path (benchmarks/results/gpu_hot_family_product_path, re-planned here as
    sim_product_path_check.py does). Neither net saw a measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_heldout_planners as g  # noqa: E402
from costnet_prior import predict, prior_model, sim_plans  # noqa: E402
from gpu_shipped_model import training_tasks  # noqa: E402
from sim_product_path_check import RESULTS, SHIPPED_THEN  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import FAMILIES  # noqa: E402
from dreamshard.learned.dreamshard import get_config  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402



def measured_hot_plans() -> tuple[list, np.ndarray]:
    """The hot family's measured plans (as lists of device tables) and their measured max-device ms."""
    planners = {"dreamshard (shipped)": DreamShardPlanner(SHIPPED_THEN), **{h: get_planner(h) for h in g.HEURISTICS}}
    found = [(plan.device_tables(), float(row["measured_max_device_ms"])) for _, _, row, plan in g.measured_plans(RESULTS, planners)]
    return [p for p, _ in found], np.array([m for _, m in found])


def max_device(model, plans, workload: Workload) -> np.ndarray:
    return np.array([p.sum(1).max() for p in predict(model, plans, workload)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prior-plans", type=int, default=8000)
    args = ap.parse_args()
    workload = Workload(65_536)
    sim = SimBackend()
    t0 = time.time()
    tasks = training_tasks(12, 300, workload)
    held_out = sim_plans(FAMILIES, sim, workload, 4)
    hot_plans, hot_ms = measured_hot_plans()
    print(f"simulator: {sim.calibration.label} (product path priced: {sim.product_path}); {len(tasks)} training tasks; "
          f"{len(hot_plans)} measured hot plans; {time.time() - t0:.0f} s")
    rows = []
    for product in (False, True):
        cfg = get_config("default", kernel_features=True, comm="model", kernel_product_path=product, prior_plans=args.prior_plans, batch_size=workload.batch_size)
        model, _, seconds = prior_model(cfg, tasks, sim)
        row = {"features": "kernel + product path" if product else "kernel", "fit_s": round(seconds)}
        for f, (plans, ms) in held_out.items():
            row[f] = 100 * np.mean(np.abs(max_device(model, plans, workload) - ms) / ms)
        row["hot measured"] = 100 * np.mean(np.abs(max_device(model, hot_plans, workload) - hot_ms) / hot_ms)
        rows.append(row)
        print(f"{row['features']}: prior fit {seconds:.0f} s", flush=True)
    cols = [*FAMILIES, "hot measured"]
    print("\nmax-device MAPE of the prior net (no measurement): against the simulator on held-out plans per family; against the H200 on the hot family's measured plans")
    print("| features | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for r in rows:
        print(f"| {r['features']} | " + " | ".join(f"{r[c]:.1f}%" for c in cols) + " |")


if __name__ == "__main__":
    main()
