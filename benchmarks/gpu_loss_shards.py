"""Where the shipped model's lost tasks are mispriced: one call on one H200.

The tasks of a planner campaign's plans.csv where the shipped model's plan measured more than 2%
above the best heuristic's are re-drawn and re-planned (tasks and planners are deterministic), and
both plans measured device by device (sequential runner, Triton TBE), each device's forward and
backward beside the simulator's. A device with a table of at most 8,192 rows is measured twice more,
its backward forced onto one path (`bwd_dense` 0: sorted only; inf: every candidate by product), to
see whether the kernel's choice between the paths holds there.

    PYTHONPATH=. python benchmarks/gpu_loss_shards.py --plans benchmarks/results/gpu_families_shipped/merged/plans.csv --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from statistics import median

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_heldout_planners import HEURISTICS, SETTINGS, setting_name, shipped_before_kernel_rule  # noqa: E402
from dreamshard.costs import paths  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402

MODEL = "dreamshard (shipped)"


def lost_tasks(plans_csv: str, margin: float = 0.02) -> list[tuple[str, str, int, str]]:
    """(family, setting, task, best heuristic) where the shipped model measured > margin above it."""
    by: dict[tuple, dict] = {}
    with open(plans_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            by.setdefault((r["family"], r["setting"], int(r["task"])), {})[r["planner"]] = float(r["measured_ms"])
    out = []
    for key, ms in by.items():
        if MODEL in ms and all(h in ms for h in HEURISTICS):
            best = min(HEURISTICS, key=ms.get)
            if ms[MODEL] > (1 + margin) * ms[best]:
                out.append((*key, best))
    return out


def lost_plans(plans_csv: str, families: str | None = None):
    """(family, setting, task, planner label, plan) of each lost task (`lost_tasks`): the task
    re-drawn from its family's pool of seed 11, the shipped model's plan (as it planned in these
    campaigns: `shipped_before_kernel_rule`) and the best heuristic's."""
    shipped = shipped_before_kernel_rule()
    for family, setting, task, best in lost_tasks(plans_csv):
        if families and family not in families.split(","):
            continue
        n, d, cap, seed = next(s for s in SETTINGS if setting_name(*s[:3]) == setting)
        drawn = sample_tasks(synth_family(family, 300, 11), task + 1, (n, n), d, cap, seed=seed, workload=Workload(65_536))[task]
        for label, planner in ((MODEL, shipped), (best, get_planner(best))):
            yield family, setting, task, label, planner.plan(drawn)


def time_tbe(tables, batch: int, device, **options) -> tuple[float, float, int]:
    """Median forward and backward ms of the shard's Triton TBE built with `options` (the runner's
    protocol: 3 input sets, 3 warm-up steps, 10 timed), and how many tables took the product path."""
    import torch

    from dreamshard.costs.kernels.triton_tbe import TritonTBE
    from dreamshard.costs.runners.sequential import time_steps

    tbe = TritonTBE([t.rows for t in tables], [t.dim for t in tables], precision="fp16", optimizer="sgd", device=device, **options)
    fwd, bwd = time_steps(tbe, tables, batch, device, input_sets=3, warmup=3, iters=10)
    dense = tbe.last_backward_stats.get("dense_tables", 0)
    del tbe
    torch.cuda.empty_cache()
    return median(fwd), median(bwd), int(dense)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a logic check (torch kernel, no forced paths)")
    ap.add_argument("--families", help="only these families (comma-separated)")
    args = ap.parse_args()
    import torch

    from dreamshard.costs.runners import SequentialRunner

    t0 = time.monotonic()
    device = torch.device(args.device if args.device != "cuda" else "cuda:0")
    workload = Workload(65_536)
    runner = SequentialRunner("triton" if args.device == "cuda" else "torch", device=args.device, iters=10 if args.device == "cuda" else 1)
    sim = SimBackend()
    records = []
    for family, setting, task, label, plan in lost_plans(args.plans, args.families):
        shards = plan.device_tables()
        measured, priced = runner.evaluate(shards, plan.workload), sim.evaluate(shards, plan.workload)
        predicted = [c["total_ms"] for c in (plan.predicted or {}).get("devices", [])] or [None] * len(shards)
        print(f"[{time.monotonic() - t0:6.1f}s] {family} {setting} task {task} {label}: measured {measured.overall_ms:.3f} sim {priced.overall_ms:.3f}", flush=True)
        for dev, (shard, m, s, p) in enumerate(zip(shards, measured.devices, priced.devices, predicted)):
            lookups, rows, dims = paths.table_arrays(shard, workload.batch_size)
            rec = {"family": family, "setting": setting, "task": task, "planner": label, "device": dev, "tables": len(shard),
                   "dims": sorted({t.dim for t in shard}), "min_rows": int(rows.min()) if len(shard) else 0, "lookups": float(lookups.sum()),
                   "measured_fwd": m.fwd_comp_ms, "measured_bwd": m.bwd_comp_ms, "sim_fwd": s.fwd_comp_ms, "sim_bwd": s.bwd_comp_ms,
                   "comm": m.fwd_comm_ms + m.bwd_comm_ms, "net_total": p,
                   "sim_product_tables": int(paths.product_tables(lookups, rows, dims, workload.batch_size, 2).sum()) if len(shard) else 0}
            if args.device == "cuda" and len(shard) and rows.min() <= paths.BWD_DENSE_ROWS:
                for tag, threshold in (("sorted", 0.0), ("default", paths.BWD_DENSE), ("product", float("inf"))):
                    f, b, k = time_tbe(shard, workload.batch_size, device, bwd_dense=threshold)
                    rec[f"{tag}_fwd"], rec[f"{tag}_bwd"], rec[f"{tag}_dense_tables"] = f, b, k
            records.append(rec)
            print("   dev {device}: {tables} tables dims {dims} measured fwd {measured_fwd:.3f} bwd {measured_bwd:.3f} | sim fwd {sim_fwd:.3f} bwd {sim_bwd:.3f}".format(**rec)
                  + (" | bwd sorted {sorted_bwd:.3f} default {default_bwd:.3f} ({default_dense_tables} by product) product {product_bwd:.3f} ({product_dense_tables})".format(**rec) if "sorted_bwd" in rec else ""), flush=True)
    with open(os.path.join(args.out, "loss_shards.json"), "w") as fh:
        json.dump(records, fh, indent=1)
    print(f"[{time.monotonic() - t0:6.1f}s] done: {len(records)} device shards")


if __name__ == "__main__":
    main()
