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
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.report import evaluate  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import sample_tasks, split_pool  # noqa: E402

PLANNERS = ["dreamshard", "lookup", "size_lookup", "random"]
SETTINGS = [  # (label, tables, devices, memory per device): two of shipped_model.py's test settings
    ("DLRM-80, 8 devices, 5 GB", 80, 8, 5 * 10**9),
    ("DLRM-120, 8 devices, 10 GB", 120, 8, 10 * 10**9),
]


TIE = 0.01  # plans within 1% of each other count as a tie: the largest table often sets the step for both


def markdown(results: dict) -> str:
    md = []
    for row in results["settings"]:
        P = row["planners"]
        ours = np.array(P["dreamshard"]["measured_ms"])
        md += [f"**{row['setting']}** ({row['tasks']} held-out tasks; {results['hardware']}; measured: Triton TBE, sequential runner, "
               f"NCCL model for the all-to-all)", "",
               "| planner | measured mean ms | simulated mean ms | DreamShard vs this planner (measured means) | DreamShard faster / tie (±1%) / slower |",
               "|---|---:|---:|---:|---:|"]
        for name, p in P.items():
            m, sim = np.array(p["measured_ms"]), np.array(p["simulated_ms"])
            if name == "dreamshard":
                md.append(f"| {name} | {m.mean():.3f} | {sim.mean():.3f} | | |")
                continue
            r = ours / m - 1
            md.append(f"| {name} | {m.mean():.3f} | {sim.mean():.3f} | {ours.mean() / m.mean() - 1:+.1%} | "
                      f"{int(np.sum(r < -TIE))} / {int(np.sum(abs(r) <= TIE))} / {int(np.sum(r > TIE))} |")
        md.append("")
    return "\n".join(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_planners")
    ap.add_argument("--tasks", type=int, default=8, help="held-out tasks per setting")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--markdown", metavar="JSON", help="only print the tables of an earlier run's gpu_planners.json")
    args = ap.parse_args()
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return
    os.makedirs(args.out, exist_ok=True)
    B = 65_536
    _, test_half = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    runner, sim = SequentialRunner("triton", device=args.device), SimBackend()
    results = {"batch_size": B, "settings": []}
    t0 = time.time()
    for label, count, devices, cap in SETTINGS:
        tasks = sample_tasks(test_half, args.tasks, (count, count), devices, cap, seed=1)

        def done(r, label=label):
            print(f"[{time.time() - t0:6.0f}s] {label}, task {r.task + 1}/{len(tasks)}, {r.planner}: measured {r.overall_ms:.3f} ms", flush=True)

        measured = evaluate(PLANNERS, tasks, runner, B, progress=done)
        simulated = measured.priced_by(sim, B)  # the same plans: planned once
        results["settings"].append({"setting": label, "tasks": len(tasks), "measured_by": measured.source, "simulated_by": simulated.source,
                                    "planners": {name: {"measured_ms": measured.costs(name), "simulated_ms": simulated.costs(name)} for name in PLANNERS}})
        results["hardware"] = measured.rows[0].report.hardware
        # written after every setting, so a run cut short keeps what it measured
        atomic_write(os.path.join(args.out, "gpu_planners.json"), json.dumps(results, indent=1))
        atomic_write(os.path.join(args.out, "gpu_planners.md"), markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
