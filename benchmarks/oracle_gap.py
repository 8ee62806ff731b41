"""Every planner's gap to the `oracle` (a long annealing search on the simulator's true cost) on
held-out tasks (docs/dreamshard.md, "The oracle: how far from the best plan").

    python benchmarks/oracle_gap.py [--tasks 10] [--budget 20000] [--out benchmarks/results/oracle_gap.md]

The settings, tasks (the synthetic pool's *test* half, seed 2) and planners of
benchmarks/splits_sim.py; the oracle searches with `--budget` evaluations of the simulator (H200
calibration) per task, which also prices every plan. Per planner: mean ms, the mean of per-task
% above the oracle, and the tasks where it beats the oracle by more than 0.1% (the oracle is a
search, not a proof of optimality: where a planner beats it, it is no ceiling).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from splits_sim import PLANNERS, held_out_settings  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.report import evaluate  # noqa: E402

BEATS = 0.001  # a planner "beats" the oracle on a task where it is more than 0.1% cheaper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--budget", type=int, default=20_000, help="oracle evaluations per task")
    ap.add_argument("--out", default="benchmarks/results/oracle_gap.md")
    args = ap.parse_args()
    sim = SimBackend()
    planners = {label: get_planner(name, **kw) for label, (name, kw) in PLANNERS.items()}
    planners["oracle"] = get_planner("oracle", backend=sim, budget=args.budget)
    md = [f"Priced by the {sim.name}; oracle: {args.budget:,} simulator evaluations per task, seed 0; "
          f"`python benchmarks/oracle_gap.py --tasks {args.tasks} --budget {args.budget}`.", ""]
    overall: dict[str, list] = {name: [] for name in PLANNERS}
    beaten: dict[str, int] = {name: 0 for name in PLANNERS}
    for label, tasks in held_out_settings(args.tasks):
        res = evaluate(planners, tasks, sim)
        oracle = np.array(res.costs("oracle"))
        rows = [x for x in res.rows if x.planner == "oracle"]
        md += [f"**{label}** ({len(tasks)} held-out tasks; oracle mean {oracle.mean():.3f} ms, "
               f"{np.mean([x.planning_ms for x in rows]) / 1000:.1f} s a task)", "",
               "| planner | mean ms | above the oracle (mean of per-task %) | worst task | tasks it beats the oracle | mean planning ms |",
               "|---|---:|---:|---:|---:|---:|"]
        for name in PLANNERS:
            m = np.array(res.costs(name))
            gap = m / oracle - 1
            overall[name] += gap.tolist()
            beaten[name] += int(np.sum(gap < -BEATS))
            ms = np.mean([x.planning_ms for x in res.rows if x.planner == name])
            md.append(f"| {name} | {m.mean():.3f} | {gap.mean():+.1%} | {gap.max():+.1%} | {int(np.sum(gap < -BEATS))} of {len(m)} | {ms:.0f} |")
        md.append("")
        print("\n".join(md[-len(PLANNERS) - 4 :]), flush=True)
    n = len(next(iter(overall.values())))
    md += [f"**All {n} tasks**", "", "| planner | above the oracle (mean of per-task %) | tasks it beats the oracle |", "|---|---:|---:|"]
    md += [f"| {name} | {np.mean(g):+.1%} | {beaten[name]} of {n} |" for name, g in overall.items()]
    md.append("")
    print("\n".join(md[-len(PLANNERS) - 4 :]), flush=True)
    atomic_write(args.out, "\n".join(md))


if __name__ == "__main__":
    main()
