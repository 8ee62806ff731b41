"""Two models' cost nets against the `hot` family's plans measured on an H200 (CPU, ~1 min): the
second call of benchmarks/results/gpu_families_planners_pp (every planner's plan of its `hot`
tasks, re-planned here: the planners are deterministic), mean signed max-device error per setting.

    PYTHONPATH=. python benchmarks/costnet_hot_plans_check.py

Models: the shipped one and the one trained with the re-fitted simulator as its prior
(benchmarks/results/gpu_shipped_model_pp2, docs/costs.md "Today").
"""

from __future__ import annotations

import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_heldout_planners as g  # noqa: E402
from costnet_prior import predict  # noqa: E402

from dreamshard.families import synth_family  # noqa: E402
from dreamshard.learned.nets import DreamShardModel  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MEASURED = os.path.join(HERE, "results", "gpu_families_planners_pp", "call2", "plans.csv")
SECOND = os.path.join(HERE, "results", "gpu_shipped_model_pp2", "model_gpu.pt")


def main() -> None:
    wl = Workload(65_536)
    with open(MEASURED, newline="") as fh:
        measured = {(r["family"], r["setting"], int(r["task"]), r["planner"]): float(r["measured_max_device_ms"]) for r in csv.DictReader(fh)}
    models = {"shipped": DreamShardModel.load(), "second (re-fitted prior)": DreamShardModel.load(SECOND)}
    # in that call the shipped model was today's: its plans are "dreamshard (shipped)"
    planners = {h: get_planner(h) for h in g.HEURISTICS} | {"dreamshard (shipped)": get_planner("dreamshard")}
    pool = synth_family("hot", 300, 11)
    print(f"measured: {MEASURED}\n| setting | plans | " + " | ".join(models) + " |\n|---|---:|" + "---:|" * len(models))
    for n, d, cap, seed in g.SETTINGS:
        name = g.setting_name(n, d, cap)
        tasks = sorted({k[2] for k in measured if k[:2] == ("hot", name)})
        drawn = sample_tasks(pool, max(tasks) + 1, (n, n), d, cap, seed=seed, workload=wl)
        plans, ms = [], []
        for i in tasks:
            for label, planner in planners.items():
                if ("hot", name, i, label) in measured:
                    plans.append(planner.plan(drawn[i]).device_tables())
                    ms.append(measured[("hot", name, i, label)])
        ms = np.array(ms)
        errs = [100 * np.mean((np.array([p.sum(1).max() for p in predict(m, plans, wl)]) - ms) / ms) for m in models.values()]
        print(f"| {name} | {len(plans)} | " + " | ".join(f"{e:+.1f}%" for e in errs) + " |")


if __name__ == "__main__":
    main()
