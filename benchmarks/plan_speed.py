"""How long `--planner dreamshard` (table-wise and with its search, the default) takes to plan 200 tables on 8 devices, on
one CPU core; `neuroshard`'s time beside it. Then the first plan of held-out tasks.

    python benchmarks/plan_speed.py [--model MODEL.pt] [--pool DIR] [--repeats 30] [--tasks 8]
    python benchmarks/plan_speed.py --accuracy [--model MODEL.pt]

The whole `planner.plan(task)` call is timed (features, table order, the greedy and sampled
episodes, picking the best, the Plan with its predictions), after warm-up runs. One core: the
process is pinned to one CPU where the OS allows it, and torch and the BLAS libraries are held to
one thread. Target: ≤ 1 s for dreamshard with its search (the default), 200 tables on 8 devices
(`benchmarks/large_tasks.py` times 10,000 tables on 1,024 devices: ≤ 30 s).

"first" is a task's first plan: the share of lookups and the reuse bins of the row ranges a
planner tries (`streams.row_range_stats`) are cached per table and range, so planning a task again
skips them; a first plan is timed with those caches emptied. The 200-table task may offer no row
split; the held-out tasks are the demo's (`dreamshard demo`: the pool's test half, 80 tables on
8 devices of 5 GB, seed 1, the first of them the demo's task), where most do.

`--accuracy` measures instead what a first plan's speed costs: the row ranges' share of lookups
and bins come from a sample of the table's stream (`streams.row_range_stats`); against them counted
on the whole stream at the reference batch, for every range the split planners try (and those they
choose) on 4 of those held-out tasks and 2 tasks of each other table family (80 tables on 8
devices of 16 GB): relative change of the share and of the simulator's price of the row shard
alone (fwd + bwd), total variation of the bins; beside it, the same change between two batches of
the stream (step 0 and 1), the noise of the full count itself.
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


def timed(planner, task, repeats: int, cold: bool) -> tuple[list[float], object]:
    """Sorted times (ms) of `repeats` plans of `task`, each with the row-range caches emptied
    first where `cold`; and the last plan."""
    from dreamshard.streams import row_sample, row_shard_spec

    times = []
    for _ in range(repeats):
        if cold:
            row_shard_spec.cache_clear()
            row_sample.cache_clear()
        t0 = time.perf_counter()
        plan = planner.plan(task)
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times), plan


def row_stats_accuracy(model: str | None) -> None:
    from dataclasses import replace

    import numpy as np

    from dreamshard import streams
    from dreamshard.bins import REFERENCE_BATCH, count_bins
    from dreamshard.costs.sim import SimBackend
    from dreamshard.families import FAMILIES, synth_family
    from dreamshard.planners.dreamshard import DreamShardPlanner
    from dreamshard.planners.neuroshard import NeuroShardPlanner
    from dreamshard.synth import PoolConfig, synth_pool
    from dreamshard.tasks import sample_tasks, split_pool

    held_out = split_pool(synth_pool(PoolConfig()), 0)[1]
    jobs = [("dlrm held-out", sample_tasks(held_out, 4, (80, 80), 8, 5 * 10**9, seed=1))]
    for family in FAMILIES:
        if family != "dlrm":
            tables = synth_family(family, min(400, FAMILIES[family].default_tables))
            jobs.append((family, sample_tasks(tables, 2, (min(80, len(tables)),) * 2, 8, 16 * 10**9, seed=3)))
    tried, chosen = set(), set()
    sampled = streams.row_range_stats

    def recorded(table, start, stop):
        tried.add((table, start, stop))
        return sampled(table, start, stop)

    planners = (DreamShardPlanner(model), NeuroShardPlanner(model, depth=4))
    streams.row_shard_spec.cache_clear()
    streams.row_range_stats = recorded  # row_shard_spec reads it from the module: every range tried passes here
    try:
        for _, tasks in jobs:
            for task, planner in ((t, p) for t in tasks for p in planners):
                rows = [s for s in planner.plan(task).shards if s.is_row_shard]
                chosen.update((task.tables[s.table], *s.row_range(task.tables[s.table])) for s in rows)
    finally:
        streams.row_range_stats = sampled
    ranges = sorted(tried, key=lambda r: (r[0].name, r[1]))
    # [3, ranges] share and [3, ranges, 17] bins: sampled, then counted on the whole reference batch of step 0 and of step 1
    share, bins = np.zeros((3, len(ranges))), np.zeros((3, len(ranges), len(ranges[0][0].bins)))
    for n, r in enumerate(ranges):
        share[0, n], bins[0, n] = sampled(*r)
    for table in dict.fromkeys(r[0] for r in ranges):
        mine = [n for n, r in enumerate(ranges) if r[0] == table]
        for step in (0, 1):
            rows, counts = np.unique(streams.table_bags(table, REFERENCE_BATCH, step)[1].numpy(), return_counts=True)
            for n in mine:
                i, j = np.searchsorted(rows, ranges[n][1:])
                in_bins, _ = count_bins(counts[i:j])
                share[1 + step, n], bins[1 + step, n] = counts[i:j].sum() / counts.sum(), in_bins / max(1, j - i)
    specs = [replace(streams.row_shard_spec(*r), pooling_factor=r[0].pooling_factor * share[k, n], bins=tuple(bins[k, n]))
             for k in range(3) for n, r in enumerate(ranges)]
    price = SimBackend().shard_compute([[s] for s in specs]).sum(axis=1).reshape(3, -1)

    def rel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.where(y > 0, np.abs(x - y) / np.where(y > 0, y, 1.0), 0.0)

    changes = {"share (rel.)": lambda k: rel(share[k], share[1]), "bins (TV)": lambda k: np.abs(bins[k] - bins[1]).sum(-1) / 2,
               "sim price (rel.)": lambda k: rel(price[k], price[1])}
    print(f"{len(ranges)} row ranges of {len({r[0] for r in ranges})} tables tried by dreamshard and neuroshard (depth 4) on "
          f"{sum(len(t) for _, t in jobs)} tasks ({', '.join(name for name, _ in jobs)}), {len(chosen)} chosen; a sample of at most "
          f"{streams.ROW_SAMPLE_LOOKUPS:,} lookups against the whole stream at batch {REFERENCE_BATCH:,}")
    for label, pick in (("tried", np.ones(len(ranges), bool)), ("chosen", np.array([r in chosen for r in ranges]))):
        for what, change in changes.items():
            a, b = change(0)[pick], change(2)[pick]
            print(f"  {label:>6} {what:>16}: sample median {np.median(a):.4f} p90 {np.quantile(a, 0.9):.4f} max {a.max():.4f}"
                  f"  |  another batch median {np.median(b):.4f} p90 {np.quantile(b, 0.9):.4f} max {b.max():.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model file (default: the shipped model)")
    ap.add_argument("--pool", help="pool directory with tables.csv (default: synthesized, seed 0: --tables tables; held-out tasks: 856)")
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--tasks", type=int, default=8, help="held-out tasks whose first plan is timed (0: none)")
    ap.add_argument("--accuracy", action="store_true", help="instead of timing: the row ranges' sampled stats against the full count")
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        pinned = "pinned to one core"
    except (AttributeError, OSError):
        pinned = "not pinned"
    import numpy as np
    import torch

    torch.set_num_threads(1)
    if args.accuracy:
        return row_stats_accuracy(args.model)
    from dreamshard.costs.hardware import cpu_model
    from dreamshard.planners.dreamshard import DreamShardPlanner
    from dreamshard.planners.neuroshard import NeuroShardPlanner
    from dreamshard.streams import row_shard_spec
    from dreamshard.synth import PoolConfig, load_pool, synth_pool
    from dreamshard.tasks import Task, sample_tasks, split_pool

    pool = load_pool(args.pool) if args.pool else synth_pool(PoolConfig(tables=args.tables, seed=0))
    rng = np.random.default_rng(0)
    tables = [pool[i] for i in sorted(rng.choice(len(pool), args.tables, replace=False))]
    task = Task(tables, args.devices, 80 * 10**9)
    print(f"{args.tables} tables on {args.devices} devices; CPU: {cpu_model()} ({pinned}, 1 thread); torch {torch.__version__}, Python {platform.python_version()}")
    runs = [(f"best of {DreamShardPlanner(args.model).best_of} (the model's setting)", DreamShardPlanner(args.model, split=False), args.repeats),
            ("best of 1 (greedy)", DreamShardPlanner(args.model, best_of=1, split=False), args.repeats),
            ("with its search (the default)", DreamShardPlanner(args.model), args.repeats),
            ("neuroshard (no target)", NeuroShardPlanner(args.model), max(3, args.repeats // 10))]
    for label, planner, repeats in runs:
        for _ in range(2):
            planner.plan(task)
        first, _ = timed(planner, task, repeats, cold=True)
        times, plan = timed(planner, task, repeats, cold=False)
        slowest = max(statistics.median(times), statistics.median(first))
        verdict = "" if planner.name == "neuroshard" else "  [OK]" if slowest <= 1000 else "  [OVER 1 s]"
        cut = f", {len(plan.split_tables())} tables split" if plan.split_tables() else ""
        print(f"{label:>32}: median {statistics.median(times):7.1f} ms, min {times[0]:7.1f}, p90 {times[int(0.9 * len(times)) - 1]:7.1f}; "
              f"first plan median {statistics.median(first):7.1f}{verdict}  predicted {plan.predicted['max_device_ms']:.3f} ms{cut}")
    if args.tasks <= 0:
        return
    # The demo's held-out tasks (the default pool is the demo's; a smaller --pool keeps its test half).
    demo_pool = load_pool(args.pool) if args.pool else synth_pool(PoolConfig())
    held_out = sample_tasks(split_pool(demo_pool, 0)[1], args.tasks, (80, 80), 8, 5 * 10**9, seed=1)
    print(f"\nfirst plans of {args.tasks} held-out tasks (the demo's: the pool's test half, 80 tables on 8 devices of 5 GB, seed 1); "
          "median of 3 (neuroshard: 1) per task")
    for label, planner, _ in runs:
        first, again, measured = [], [], 0
        for t in held_out:
            planner.plan(t)  # warm-up: the process's one-time costs, not the task's
            cold, _ = timed(planner, t, repeats=1 if planner.name == "neuroshard" else 3, cold=True)
            measured += row_shard_spec.cache_info().currsize > 0
            warm, _ = timed(planner, t, repeats=1 if planner.name == "neuroshard" else 3, cold=False)
            first.append(statistics.median(cold))
            again.append(statistics.median(warm))
        verdict = "" if planner.name == "neuroshard" else "  [OK]" if max(first) <= 1000 else "  [OVER 1 s]"
        print(f"{label:>32}: first plan median {statistics.median(first):7.1f} ms, max {max(first):7.1f}{verdict}; "
              f"again median {statistics.median(again):7.1f}, max {max(again):7.1f}; row ranges in {measured} of {len(held_out)} tasks")


if __name__ == "__main__":
    main()
