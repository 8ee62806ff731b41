"""Planners measured on a real GPU: the shipped DreamShard model against the heuristics (docs/dreamshard.md).

    PYTHONPATH=. python3 benchmarks/gpu_planners.py --out $OUT [--tasks 8]

Held-out tasks from the synthetic pool's *test* half, drawn as in benchmarks/shipped_model.py
(tables the model never saw). Every planner's plan of every task is measured with the sequential
runner — our Triton TBE on one GPU, each device's shard in turn, the all-to-all from the shipped
NCCL model — and priced by the simulator too. Writes gpu_planners.json and gpu_planners.md.
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
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import sample_tasks, split_pool  # noqa: E402

PLANNERS = ["dreamshard", "lookup", "size_lookup", "random"]
SETTINGS = [  # (label, tables, devices, memory per device): two of shipped_model.py's test settings
    ("DLRM-80, 8 devices, 5 GB", 80, 8, 5 * 10**9),
    ("DLRM-120, 8 devices, 10 GB", 120, 8, 10 * 10**9),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_planners")
    ap.add_argument("--tasks", type=int, default=8, help="held-out tasks per setting")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    B = 65_536
    _, test_half = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    runner, sim = SequentialRunner("triton", device=args.device), SimBackend()
    results, md = {"batch_size": B, "settings": []}, []
    t0 = time.time()
    for label, count, devices, cap in SETTINGS:
        tasks = sample_tasks(test_half, args.tasks, (count, count), devices, cap, seed=1)
        row = {"setting": label, "tasks": len(tasks), "planners": {}}
        for name in PLANNERS:
            plans = [get_planner(name).plan(t) for t in tasks]
            measured = [runner.evaluate(p.shards(), B, p.task.precision, p.task.optimizer) for p in plans]
            simulated = [sim.evaluate(p.shards(), B, p.task.precision, p.task.optimizer) for p in plans]
            row["planners"][name] = {"measured_ms": [r.overall_ms for r in measured], "simulated_ms": [r.overall_ms for r in simulated]}
            print(f"[{time.time() - t0:6.0f}s] {label}, {name}: measured {np.mean(row['planners'][name]['measured_ms']):.3f} ms, "
                  f"simulated {np.mean(row['planners'][name]['simulated_ms']):.3f} ms", flush=True)
        hardware = measured[0].hardware
        results["settings"].append(row)
        ours = np.array(row["planners"]["dreamshard"]["measured_ms"])
        md += [f"**{label}** ({len(tasks)} held-out tasks; {hardware}; measured: Triton TBE, sequential runner, NCCL model for the all-to-all)", "",
               "| planner | measured mean ms | simulated mean ms | DreamShard vs this planner, measured (mean of per-task ratios) | tasks DreamShard is faster |",
               "|---|---:|---:|---:|---:|"]
        for name in PLANNERS:
            m, s = np.array(row["planners"][name]["measured_ms"]), np.array(row["planners"][name]["simulated_ms"])
            vs = "" if name == "dreamshard" else f"{np.mean(ours / m - 1):+.2%}"
            wins = "" if name == "dreamshard" else f"{int(np.sum(ours < m))} of {len(m)}"
            md.append(f"| {name} | {m.mean():.3f} | {s.mean():.3f} | {vs} | {wins} |")
        md.append("")
        results["hardware"] = hardware
        # written after every setting, so a run cut short keeps what it measured
        with open(os.path.join(args.out, "gpu_planners.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "gpu_planners.md"), "w") as f:
            f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
