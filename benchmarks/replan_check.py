"""A model shipped after a campaign, on the campaign's tasks of families it was not measured on
(CPU, simulator): each task of the campaign's plans.csv re-planned by the model and priced by the
simulator (default calibration), beside the simulator's price of the measured model's plan and of
the best heuristic's (re-planned here: tasks and planners are deterministic), and how many of its
placements the campaign measured (any planner's). Simulator numbers, not measurements: its error
per family is in docs/costs.md. Not for the `dlrm` campaigns before session 10, whose pools an
AVX-512 machine drew otherwise (dreamshard/synth.py).

    PYTHONPATH=. python benchmarks/replan_check.py benchmarks/results/gpu_families_planners_pp2/plans.csv \\
        "dreamshard (pp2.pt)" benchmarks/results/gpu_shipped_model_pp2/model_gpu.pt dreamshard/data/models/dreamshard_h200.pt \\
        --families wide,heavy,dlrm2022,onehot
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_heldout_planners import HEURISTICS, measured_plans  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans_csv")
    ap.add_argument("label", help="the label in plans.csv of the model the campaign measured, e.g. 'dreamshard (pp2.pt)'")
    ap.add_argument("measured_model", help="that model's file (its plans are re-planned to know what was measured)")
    ap.add_argument("model", help="the model to price")
    ap.add_argument("--families", help="comma-separated; default every family of plans_csv")
    args = ap.parse_args()
    planners = {h: get_planner(h) for h in HEURISTICS} | {args.label: DreamShardPlanner(model=args.measured_model)}
    new = DreamShardPlanner(model=args.model)
    sim = SimBackend()
    tasks: dict = collections.defaultdict(dict)  # (family, setting, task) -> {planner: (placement, simulated ms)}
    drawn: dict = {}  # (family, setting, task) -> the task
    for family, setting, row, plan in measured_plans(args.plans_csv, planners, args.families.split(",") if args.families else None):
        key = (family, setting, int(row["task"]))
        tasks[key][row["planner"]] = (plan.placement, sim.evaluate_plan(plan).overall_ms)
        drawn[key] = plan.task
    by_setting: dict = collections.defaultdict(list)
    for key, got in tasks.items():
        if any(h not in got for h in HEURISTICS) or args.label not in got:
            continue
        plan = new.plan(drawn[key])
        measured = any(placement == plan.placement for placement, _ in got.values())
        by_setting[key[:2]].append((measured, sim.evaluate_plan(plan).overall_ms, got[args.label][1], min(got[h][1] for h in HEURISTICS)))
    print(f"{args.model} on the tasks of {args.plans_csv}, re-planned on the CPU and priced by the simulator "
          f"({sim.name}), beside the simulator's price of the plans the campaign measured\n")
    print("| family | setting | tasks | placements the campaign measured | model | measured model | best heuristic per task | "
          "model > 2% above the best heuristic | measured model > 2% above |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (family, setting), rs in by_setting.items():
        measured, model, before, best = (np.array(c) for c in zip(*rs))
        print(f"| {family} | {setting} | {len(rs)} | {measured.sum()} | {model.mean():.3f} | {before.mean():.3f} | {best.mean():.3f} | "
              f"{(model > 1.02 * best).sum()} | {(before > 1.02 * best).sum()} |")


if __name__ == "__main__":
    main()
