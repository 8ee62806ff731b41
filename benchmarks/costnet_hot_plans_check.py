"""Two models' cost nets against the `hot` family's plans measured on an H200 (CPU, ~1 min): the
second call of benchmarks/results/gpu_families_planners_pp (every planner's plan of its `hot`
tasks, re-planned here: the planners are deterministic), mean signed max-device error per setting.

    PYTHONPATH=. python benchmarks/costnet_hot_plans_check.py

Models: the one shipped when that call ran (session 9: benchmarks/results/gpu_shipped_model_pp, its
plans made without the heuristics' candidates, which came after) and the one trained with the
re-fitted simulator as its prior (benchmarks/results/gpu_shipped_model_pp2, docs/costs.md "Today").
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_heldout_planners as g  # noqa: E402
from costnet_prior import predict  # noqa: E402

from dreamshard.learned.nets import DreamShardModel  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MEASURED = os.path.join(HERE, "results", "gpu_families_planners_pp", "call2", "plans.csv")
SECOND = os.path.join(HERE, "results", "gpu_shipped_model_pp2", "model_gpu.pt")
THEN = os.path.join(HERE, "results", "gpu_shipped_model_pp", "model_gpu.pt")  # its "dreamshard (shipped)" plans are this model's


def main() -> None:
    wl = Workload(65_536)
    models = {"shipped then": DreamShardModel.load(THEN), "second (re-fitted prior)": DreamShardModel.load(SECOND)}
    planners = {h: get_planner(h) for h in g.HEURISTICS} | {"dreamshard (shipped)": DreamShardPlanner(THEN, heuristic_candidates=False)}
    by_setting: dict[str, tuple[list, list]] = {}
    for _, setting, row, plan in g.measured_plans(MEASURED, planners, families=("hot",)):
        plans, ms = by_setting.setdefault(setting, ([], []))
        plans.append(plan.device_tables())
        ms.append(float(row["measured_max_device_ms"]))
    print(f"measured: {MEASURED}\n| setting | plans | " + " | ".join(models) + " |\n|---|---:|" + "---:|" * len(models))
    for setting, (plans, ms) in by_setting.items():
        ms = np.array(ms)
        errs = [100 * np.mean((np.array([p.sum(1).max() for p in predict(m, plans, wl)]) - ms) / ms) for m in models.values()]
        print(f"| {setting} | {len(plans)} | " + " | ".join(f"{e:+.1f}%" for e in errs) + " |")


if __name__ == "__main__":
    main()
