"""How long `--planner dreamshard` (and with `--split`) takes to plan 200 tables on 8 devices, on
one CPU core; `neuroshard`'s time beside it.

    python benchmarks/plan_speed.py [--model MODEL.pt] [--pool DIR] [--repeats 30]

The whole `planner.plan(task)` call is timed (features, table order, the greedy and sampled
episodes, picking the best, the Plan with its predictions), after warm-up runs. One core: the
process is pinned to one CPU where the OS allows it, and torch and the BLAS libraries are held to
one thread. Target (issues 5 and 11): ≤ 50 ms for dreamshard, with and without splits.
"""

from __future__ import annotations

import os

# Before numpy/torch load: their thread pools read these once.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model file (default: the shipped H200 model)")
    ap.add_argument("--pool", help="pool directory with tables.csv (default: synthesize 200 tables, seed 0)")
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        pinned = "pinned to one core"
    except (AttributeError, OSError):
        pinned = "not pinned"
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from dreamshard.costs.hardware import cpu_model
    from dreamshard.planners.dreamshard import DreamShardPlanner
    from dreamshard.tasks import Task

    if args.pool:
        from dreamshard.synth import load_pool

        pool = load_pool(args.pool)
    else:
        from dreamshard.synth import PoolConfig, synth_pool

        pool = synth_pool(PoolConfig(tables=args.tables, seed=0))
    rng = np.random.default_rng(0)
    tables = [pool[i] for i in sorted(rng.choice(len(pool), args.tables, replace=False))]
    task = Task(tables, args.devices, 80 * 10**9)
    print(f"{args.tables} tables on {args.devices} devices; CPU: {cpu_model()} ({pinned}, 1 thread); torch {torch.__version__}, Python {platform.python_version()}")
    from dreamshard.planners.neuroshard import NeuroShardPlanner

    runs = [(f"best of {DreamShardPlanner(args.model).best_of} (the model's setting)", DreamShardPlanner(args.model), args.repeats),
            ("best of 1 (greedy)", DreamShardPlanner(args.model, best_of=1), args.repeats),
            ("--split, the model's best of", DreamShardPlanner(args.model, split=True), args.repeats),
            ("neuroshard (no target)", NeuroShardPlanner(args.model), max(3, args.repeats // 10))]
    for label, planner, repeats in runs:
        for _ in range(2):
            planner.plan(task)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            plan = planner.plan(task)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        verdict = "" if planner.name == "neuroshard" else "  [OK]" if statistics.median(times) <= 50 else "  [OVER 50 ms]"
        cut = f", {len(plan.split_tables())} tables split" if plan.split_tables() else ""
        print(f"{label:>32}: median {statistics.median(times):7.1f} ms, min {times[0]:7.1f}, p90 {times[int(0.9 * len(times)) - 1]:7.1f}{verdict}  predicted {plan.predicted['max_device_ms']:.3f} ms{cut}")


if __name__ == "__main__":
    main()
