"""The default simulator against the plans `gpu_heldout_planners.py` measured on an H200 (CPU):
the tasks re-drawn and re-planned here (every planner is deterministic), each plan priced by the
simulator, whole-step MAPE per family and setting (the simulator the campaign priced with is in
its plans.csv's sim_ms; this prices with today's default or --calibration).

    PYTHONPATH=. python benchmarks/sim_planner_plans_check.py benchmarks/results/gpu_heldout_planners_pp/plans.csv \
        --model benchmarks/results/gpu_shipped_model_pp/model_gpu.pt --shipped benchmarks/results/gpu_shipped_model_kf/model_gpu.pt [--calibration FILE]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_heldout_planners as g  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans_csv")
    ap.add_argument("--model", action="append", default=[], help="a model file measured beside the shipped one (as the campaign's --model)")
    ap.add_argument("--shipped", help="the model that was shipped when the campaign ran [default: today's weights as they planned before "
                    "2026-11-25's product-rule commit 39c5542, as in every campaign committed so far]")
    ap.add_argument("--calibration")
    ap.add_argument("--pool-tables", type=int, default=300)
    args = ap.parse_args()
    sim = SimBackend(args.calibration)
    planners = {"dreamshard (shipped)": DreamShardPlanner(args.shipped) if args.shipped else g.shipped_before_kernel_rule(), **{h: get_planner(h) for h in g.HEURISTICS},
                **{f"dreamshard ({os.path.basename(m)})": DreamShardPlanner(m) for m in args.model}}
    print(f"simulator: {sim.calibration.label}, product path {sim.product_path}; measured: {args.plans_csv}")
    print("| family | setting | plans | whole-step MAPE | mean signed | the campaign's simulator |\n|---|---|---:|---:|---:|---:|")
    err: dict[tuple, list[float]] = {}
    old: dict[tuple, list[float]] = {}
    for family, setting, row, plan in g.measured_plans(args.plans_csv, planners, pool_tables=args.pool_tables):
        m = float(row["measured_ms"])
        err.setdefault((family, setting), []).append((sim.evaluate_plan(plan).overall_ms - m) / m)
        old.setdefault((family, setting), []).append(abs(float(row["sim_ms"]) - m) / m)
    for (family, setting), e in err.items():
        e = np.array(e)
        print(f"| {family} | {setting} | {len(e)} | {100 * np.mean(np.abs(e)):.1f}% | {100 * np.mean(e):+.1f}% | {100 * np.mean(old[(family, setting)]):.1f}% |")


if __name__ == "__main__":
    main()
