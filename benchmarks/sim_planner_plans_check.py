"""The default simulator against the plans `gpu_heldout_planners.py` measured on an H200 (CPU):
the tasks re-drawn and re-planned here (every planner is deterministic), each plan priced by the
simulator, whole-step MAPE per family and setting (the simulator the campaign priced with is in
its plans.csv's sim_ms; this prices with today's default or --calibration).

    PYTHONPATH=. python benchmarks/sim_planner_plans_check.py benchmarks/results/gpu_heldout_planners_pp/plans.csv \
        --model benchmarks/results/gpu_shipped_model_pp/model_gpu.pt --shipped benchmarks/results/gpu_shipped_model_kf/model_gpu.pt [--calibration FILE]
"""

from __future__ import annotations

import argparse
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
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans_csv")
    ap.add_argument("--model", action="append", default=[], help="a model file measured beside the shipped one (as the campaign's --model)")
    ap.add_argument("--shipped", help="the model that was shipped when the campaign ran [default: today's]")
    ap.add_argument("--calibration")
    ap.add_argument("--pool-tables", type=int, default=300)
    args = ap.parse_args()
    wl = Workload(65_536)
    sim = SimBackend(args.calibration)
    with open(args.plans_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    measured = {(r["family"], r["setting"], int(r["task"]), r["planner"]): (float(r["measured_ms"]), float(r["sim_ms"])) for r in rows}
    planners = {"dreamshard (shipped)": DreamShardPlanner(args.shipped) if args.shipped else get_planner("dreamshard"), **{h: get_planner(h) for h in g.HEURISTICS},
                **{f"dreamshard ({os.path.basename(m)})": DreamShardPlanner(m) for m in args.model}}
    print(f"simulator: {sim.calibration.label}, product path {sim.product_path}; measured: {args.plans_csv}")
    print("| family | setting | plans | whole-step MAPE | mean signed | the campaign's simulator |\n|---|---|---:|---:|---:|---:|")
    for family in dict.fromkeys(r["family"] for r in rows):
        pool = synth_family(family, args.pool_tables, 11)
        for n, d, cap, seed in g.SETTINGS:
            name = g.setting_name(n, d, cap)
            tasks = sorted({k[2] for k in measured if k[:2] == (family, name)})
            if not tasks:
                continue
            drawn = sample_tasks(pool, max(tasks) + 1, (n, n), d, cap, seed=seed, workload=wl)
            err, old = [], []
            for i in tasks:
                for label, planner in planners.items():
                    if (family, name, i, label) in measured:
                        m, s_old = measured[(family, name, i, label)]
                        err.append((sim.evaluate_plan(planner.plan(drawn[i])).overall_ms - m) / m)
                        old.append(abs(s_old - m) / m)
            err = np.array(err)
            print(f"| {family} | {name} | {len(err)} | {100 * np.mean(np.abs(err)):.1f}% | {100 * np.mean(err):+.1f}% | {100 * np.mean(old):.1f}% |", flush=True)


if __name__ == "__main__":
    main()
