"""Column splits measured on a real GPU: the splitting planners against the table-wise ones
(docs/dreamshard.md, "Splitting").

    PYTHONPATH=. python3 benchmarks/gpu_splits.py --out $OUT [--tasks 6] [--budget-s 480]

Held-out tasks from the synthetic pool's *test* half (tables the shipped model never saw), drawn
as in lab-archive:benchmarks/gpu_planners.py. Every planner's plan is measured with the sequential runner (our
Triton TBE on one GPU, each device's shard in turn — a column shard reads its table's index stream
at its own width — the all-to-all from the shipped NCCL model) and priced by the simulator too.
Tasks are measured in turn until `--budget-s` seconds have passed; results are written after every
task. Writes gpu_splits.json and gpu_splits.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.runners import SequentialRunner  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.report import evaluate  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import sample_tasks, split_pool  # noqa: E402

PLANNERS = {  # label → (registered name, options); the table-wise ones first
    "lookup": ("lookup", {}),
    "dreamshard": ("dreamshard", {"split": False}),
    "lookup --split": ("lookup", {"split": True}),
    "neuroshard": ("neuroshard", {}),
    "dreamshard --split": ("dreamshard", {"split": True}),
}
TABLE_WISE = ("lookup", "dreamshard")
SETTINGS = [  # (label, tables, devices, memory per device): the demo's, and a smaller one
    ("DLRM-80, 8 devices, 5 GB", 80, 8, 5 * 10**9),
    ("DLRM-40, 4 devices, 16 GB", 40, 4, 16 * 10**9),
]


def markdown(results: dict) -> str:
    md = []
    for row in results["settings"]:
        P, n = row["planners"], row["tasks_measured"]
        if not n:
            continue
        best_tw = np.min([P[name]["measured_ms"] for name in TABLE_WISE], axis=0)
        md += [f"**{row['setting']}** ({n} held-out tasks; {row['measured_by']}; also priced by the {row['simulated_by']})", "",
               "| planner | measured mean ms | simulated mean ms | vs best table-wise (measured, mean of per-task ratios) | tasks worse than best table-wise by > 1% | tasks with a split |",
               "|---|---:|---:|---:|---:|---:|"]
        for name, p in P.items():
            m, s = np.array(p["measured_ms"]), np.array(p["simulated_ms"])
            r = m / best_tw - 1
            md.append(f"| {name} | {m.mean():.3f} | {s.mean():.3f} | {r.mean():+.1%} | {int(np.sum(r > 0.01))} of {n} | {sum(bool(x) for x in p['split'])} |")
        md.append("")
    return "\n".join(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_splits")
    ap.add_argument("--tasks", type=int, default=6, help="held-out tasks per setting")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernel", default="triton", help="torch or fbgemm for a CPU dry run")
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting new tasks after this many seconds")
    ap.add_argument("--markdown", metavar="JSON", help="only print the tables of an earlier run's gpu_splits.json")
    args = ap.parse_args()
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return
    os.makedirs(args.out, exist_ok=True)
    B = args.batch_size
    _, test_half = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    runner, sim = SequentialRunner(args.kernel, device=args.device), SimBackend()
    planners = {label: get_planner(name, **kw) for label, (name, kw) in PLANNERS.items()}
    results: dict = {"batch_size": B, "settings": [], "hardware": "?"}
    t0 = time.time()
    for label, count, devices, cap in SETTINGS:
        tasks = sample_tasks(test_half, args.tasks, (count, count), devices, cap, seed=1)
        entry = {"setting": label, "tasks_measured": 0, "planners": {p: {"measured_ms": [], "simulated_ms": [], "split": [], "planning_ms": []} for p in planners}}
        results["settings"].append(entry)
        for i, task in enumerate(tasks):
            if time.time() - t0 > args.budget_s:
                print(f"[{time.time() - t0:6.0f}s] budget spent: {label} stops after {i} tasks", flush=True)
                break
            measured = evaluate(planners, [task], runner, B)
            simulated = measured.priced_by(sim, B)
            for r, s in zip(measured.rows, simulated.rows):
                p = entry["planners"][r.planner]
                p["measured_ms"].append(r.overall_ms)
                p["simulated_ms"].append(s.overall_ms)
                p["split"].append(r.split_tables)
                p["planning_ms"].append(r.planning_ms)
            entry["tasks_measured"] = i + 1
            entry["measured_by"], entry["simulated_by"] = measured.source, simulated.source
            results["hardware"] = measured.rows[0].report.hardware
            print(f"[{time.time() - t0:6.0f}s] {label}, task {i + 1}: " + ", ".join(f"{r.planner} {r.overall_ms:.3f}" for r in measured.rows), flush=True)
            # written after every task, so a run cut short keeps what it measured
            atomic_write(os.path.join(args.out, "gpu_splits.json"), json.dumps(results, indent=1))
            atomic_write(os.path.join(args.out, "gpu_splits.md"), markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
