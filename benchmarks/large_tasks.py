"""Planning and simulated pricing of large tasks with every planner that needs no model or backend.

    python benchmarks/large_tasks.py [--tables 10000] [--cases 10000x64,2000x1024,10000x1024]

Tables come from the synthetic pool (`data synth`, seed 0, as many tables as the largest case);
each case takes the first T of them on D devices with 30% more memory per device than an even
share (at least the largest table). Times, per planner: `planner.plan(task)` and
`SimBackend().evaluate_plan(plan)`; then the memory packing alone where it must search (a few
bytes per device more than an even share: first-fit fails, the search runs to its node budget)
and where no placement can exist. One thread (torch and BLAS held to one), wall-clock seconds.
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402


# Left out: the learned peers need a trained model and `oracle` a backend (missing_arguments);
# the searches take minutes at these sizes (neuroshard: plan_speed.py; torchrec: torchrec_planner.py).
SEARCHES = ("neuroshard", "torchrec")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="10000x64,2000x1024,10000x1024", help="TABLESxDEVICES, comma-separated")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from dreamshard.costs.hardware import cpu_model
    from dreamshard.costs.sim import SimBackend
    from dreamshard.packing import InfeasibleError, pack
    from dreamshard.planners import PLANNERS, get_planner
    from dreamshard.report import evaluate, missing_arguments
    from dreamshard.synth import PoolConfig, synth_pool
    from dreamshard.tasks import Task

    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    t0 = time.perf_counter()
    pool = synth_pool(PoolConfig(tables=max(t for t, _ in cases), seed=0))
    print(f"CPU: {cpu_model()} (1 thread); torch {torch.__version__}, Python {platform.python_version()}")
    print(f"synthetic pool of {len(pool):,} tables (bins derived in a batch): {time.perf_counter() - t0:.2f} s\n")
    planners = {name: get_planner(name) for name in sorted(PLANNERS)
                if not missing_arguments(name) and name not in SEARCHES}
    sim = SimBackend()
    print("| tables | devices | planner | plan (s) | sim pricing (s) | notes |")
    print("|---:|---:|---|---:|---:|---|")
    for T, D in cases:
        tables = pool[:T]
        sizes = [t.bytes() for t in tables]
        task = Task(tables, D, max(int(sum(sizes) / D * 1.3), max(sizes)))
        for r in evaluate(planners, [task], sim).rows:
            print(f"| {T:,} | {D:,} | {r.planner} | {r.planning_ms / 1000:.3f} | {r.pricing_ms / 1000:.3f} | {r.error or '; '.join(r.notes)} |")
    print("\n| tables | devices | memory per device | packing (s) | outcome |")
    print("|---:|---:|---|---:|---|")
    for T, D in cases:
        tables = pool[:T]
        sizes = [t.bytes() for t in tables]
        for label, cap in (("max(even share + 3 B, largest table)", max(sum(sizes) // D + 3, max(sizes))), ("even share - 1 B", sum(sizes) // D - 1)):
            task = Task(tables, D, max(cap, 1))
            t0 = time.perf_counter()
            placed = pack(task.sizes(), task.max_memory_bytes, task.devices)
            dt = time.perf_counter() - t0
            outcome = "placed"
            if placed is None:
                try:
                    planners["size"].plan(task)
                except InfeasibleError as e:
                    outcome = f"InfeasibleError: {str(e)[:60]}…"
            print(f"| {T:,} | {D:,} | {label} | {dt:.3f} | {outcome} |")


if __name__ == "__main__":
    main()
