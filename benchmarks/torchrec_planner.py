"""TorchRec 1.8's planner beside ours on the simulator.

    python benchmarks/torchrec_planner.py [--tasks 5] [--timeout 5] [--out benchmarks/results/torchrec_planner.md]

The held-out tasks of benchmarks/splits_sim.py (its four settings, seed 2, the synthetic pool's test
half). Per task: `lookup` and `dreamshard` (table-wise), TorchRec's table-wise plan (`torchrec`),
TorchRec allowed the sharding types our plans express (`torchrec tw+cw`: table_wise, column_wise,
table_column_wise) and TorchRec allowed every type (`torchrec all`: priced where every table's
sharding is expressible, counted where it chose row-wise or another type we cannot express yet).
Every plan priced by our simulator (H200 calibration), TorchRec's own estimate and planning time
beside ours, and the tasks where TorchRec found no plan, with the memory it reserved.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from splits_sim import held_out_settings  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.packing import InfeasibleError  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.torchrec import NotExpressibleError, TorchRecPlanner  # noqa: E402
from dreamshard.report import evaluate  # noqa: E402

OURS = ("lookup", "dreamshard")
EXPRESSIBLE = "table_wise,column_wise,table_column_wise"


def all_types(planner: TorchRecPlanner, tasks, sim) -> tuple[list[float], list[float], list[float], Counter, Counter, Counter]:
    """TorchRec with every sharding type: (sim ms, its estimate ms, planning ms) per task — nan
    where it found no plan or chose a type we cannot express — the outcomes, the sharding types
    of its expressible plans (tables) and the type that made each other plan inexpressible."""
    ms, est, plan_ms, outcome, chosen, bad = [], [], [], Counter(), Counter(), Counter()
    for task in tasks:
        t0 = time.perf_counter()
        try:
            plan = planner.plan(task)
        except NotExpressibleError as e:
            outcome["not expressible"] += 1
            bad[str(e).split(" for table")[0].removeprefix("torchrec chose ")] += 1
            ms.append(math.nan), est.append(math.nan), plan_ms.append((time.perf_counter() - t0) * 1000)
            continue
        except InfeasibleError:
            outcome["no plan"] += 1
            ms.append(math.nan), est.append(math.nan), plan_ms.append((time.perf_counter() - t0) * 1000)
            continue
        outcome["plan"] += 1
        chosen.update(plan.predicted["sharding_types"])
        ms.append(sim.evaluate_plan(plan).overall_ms)
        est.append(plan.predicted["overall_ms"])
        plan_ms.append((time.perf_counter() - t0) * 1000)
    return ms, est, plan_ms, outcome, chosen, bad


def fmt(x: float, spec: str = ".3f") -> str:
    return "—" if math.isnan(x) else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=5, help="TorchRec's own search limit (s) when it may choose among several sharding types")
    ap.add_argument("--out", default="benchmarks/results/torchrec_planner.md")
    args = ap.parse_args()
    sim = SimBackend()
    planners = {name: get_planner(name) for name in OURS}
    planners["torchrec"] = get_planner("torchrec")
    planners["torchrec tw+cw"] = TorchRecPlanner(sharding_types=EXPRESSIBLE, timeout_s=args.timeout)
    every = TorchRecPlanner(sharding_types="all", timeout_s=args.timeout)
    md = [f"Priced by the {sim.name}; `python benchmarks/torchrec_planner.py --tasks {args.tasks} --timeout {args.timeout}` "
          "(the held-out tasks of benchmarks/splits_sim.py). TorchRec's estimate: the slowest rank's sum of its shards' perf (ms), "
          "its own cost model at its default H100-class constants; \"vs best ours\": the mean over the tasks it placed of its simulated cost "
          "over the better of lookup and dreamshard. TorchRec plans with its default storage reservation (15% of HBM plus input-KJT and "
          "dense buffers). With several sharding types allowed, TorchRec's search takes minutes on 160 tables (90 s a task measured here), "
          f"so it runs under its own time limit of {args.timeout} s (checked between proposals). Planning times on a 2-core CPU.", ""]
    failures = []
    for label, tasks in held_out_settings(args.tasks):
        res = evaluate(planners, tasks, sim)
        best_ours = np.min([res.costs(n) for n in OURS], axis=0)
        md += [f"**{label}** ({len(tasks)} held-out tasks)", "",
               "| planner | placed | mean sim ms (placed tasks) | vs best ours | TorchRec's estimate, mean ms | mean planning ms | tasks with a split |",
               "|---|---:|---:|---:|---:|---:|---:|"]
        for name in planners:
            rows = res.of(name)
            m = np.array(res.costs(name))
            ok = ~np.isnan(m)
            est = [r.plan.predicted["overall_ms"] for r in rows if r.ok and r.plan.predicted and "TorchRec" in r.plan.predicted.get("source", "")]
            md.append(f"| {name} | {ok.sum()} of {len(m)} | {fmt(m[ok].mean() if ok.any() else math.nan)} | "
                      f"{fmt((m[ok] / best_ours[ok] - 1).mean() if ok.any() else math.nan, '+.1%')} | {fmt(np.mean(est) if est else math.nan)} | "
                      f"{np.mean([r.planning_ms for r in rows]):.1f} | {sum(bool(r.split_tables) for r in rows)} |")
            if name.startswith("torchrec"):
                failures += [(label, name, r.task, r.error) for r in rows if not r.ok]
        ms, est, plan_ms, outcome, chosen, bad = all_types(every, tasks, sim)
        m = np.array(ms)
        ok = ~np.isnan(m)
        md.append(f"| torchrec all | {ok.sum()} of {len(m)} | {fmt(m[ok].mean() if ok.any() else math.nan)} | "
                  f"{fmt((m[ok] / best_ours[ok] - 1).mean() if ok.any() else math.nan, '+.1%')} | {fmt(np.nanmean(est) if ok.any() else math.nan)} | "
                  f"{np.mean(plan_ms):.1f} | — |")
        md += ["", f"torchrec all: {outcome['plan']} expressible plans (tables by type: {dict(chosen)}), {outcome['not expressible']} not expressible yet "
                   f"(tasks by the first type we cannot express: {dict(bad)}), {outcome['no plan']} with no plan.", ""]
        print("\n".join(md[-len(planners) - 7:]), flush=True)
    md += ["**Tasks where TorchRec found no plan** (every one placed by lookup and dreamshard)", ""]
    md += [f"- {label}, task {task}, {name}: {err}" for label, name, task, err in failures] or ["- none"]
    md.append("")
    atomic_write(args.out, "\n".join(md))
    print(f"{len(failures)} TorchRec runs found no plan; wrote {args.out}")


if __name__ == "__main__":
    main()
