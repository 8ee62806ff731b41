"""Two checks in one call on one H200, after benchmarks/gpu_loss_shards.py (docs/costs.md,
"Measured on every family"):

1. **The first measurement of a process**: the plan that measured 2.138 ms as the first plan of the
   `dlrm` campaign call and 1.545 ms in a later call is measured three times in a row, first thing in
   a fresh process, device by device (the sequential runner now measures a process's first shard
   once untimed: all three should agree).
2. **The product path's cost in fused shards**: device shards of the training families' plans
   (never `mixed`) whose product-path candidates (paths.takes_product, count matrix in the buffer)
   save, by the path model, between 30 us and --max-saving-us: what the kernel took before
   paths.DENSE_TABLE_US (every candidate, the shard saving more than 30 us). Each shard's backward
   measured three ways: sorted path only (`bwd_dense` 0), every candidate by product
   (`bwd_dense_min_us` 0: the choice before), and the kernel's choice now.

    PYTHONPATH=. python benchmarks/gpu_product_fixed_cost.py --out $OUT
    PYTHONPATH=. python benchmarks/gpu_product_fixed_cost.py --out /tmp/x --select-only   # CPU: which shards

benchmarks/results/gpu_families_shipped/product_fixed_cost/ is the first run, before DENSE_TABLE_US:
there `default_bwd_ms` is the choice of then (every candidate), which `every_candidate_bwd_ms` is now.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_heldout_planners import SETTINGS  # noqa: E402
from dreamshard.costs import paths  # noqa: E402
from dreamshard.families import TRAINING_FAMILIES, synth_family  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402

def modelled_saving_us(shard, batch: int, elt: int = 2) -> float:
    """What the path model says this shard's product-path candidates save together."""
    lookups, rows, dims = paths.table_arrays(shard, batch)
    takes = paths.product_tables(lookups, rows, dims, batch, elt, min_saving_us=0.0)
    return float(np.sum(np.where(takes, paths.sparse_us(lookups, dims, elt) - paths.dense_us(lookups, rows, dims, batch, elt), 0.0)))


def borderline_shards(max_saving_us: float, tasks: int, per_family: int) -> list[dict]:
    workload = Workload(65_536)
    out = []
    for family in TRAINING_FAMILIES:
        pool, found, seen = synth_family(family, 300, 11), [], set()
        for n, d, cap, seed in SETTINGS:
            try:
                drawn = sample_tasks(pool, tasks, (n, n), d, cap, seed=seed, workload=workload)
            except InputError:  # a setting this pool cannot fill (onehot at 8 GB)
                continue
            for i, task in enumerate(drawn):
                for planner in ("lookup", "size_lookup", "dreamshard"):
                    for dev, shard in enumerate(get_planner(planner).plan(task).device_tables()):
                        key = tuple(sorted(t.name for t in shard))
                        saving = modelled_saving_us(shard, workload.batch_size) if shard else 0.0
                        if key not in seen and 30.0 < saving < max_saving_us:
                            seen.add(key)
                            found.append({"family": family, "setting": (n, d, cap), "task": i, "planner": planner, "device": dev,
                                          "modelled_saving_us": saving, "tables": shard})
        # the smallest savings and the largest both: spread over the range
        found.sort(key=lambda r: r["modelled_saving_us"])
        pick = np.unique(np.linspace(0, len(found) - 1, min(per_family, len(found))).round().astype(int)) if found else []
        out += [found[k] for k in pick]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-saving-us", type=float, default=600.0)
    ap.add_argument("--tasks", type=int, default=4, help="tasks per setting searched for shards")
    ap.add_argument("--per-family", type=int, default=10)
    ap.add_argument("--select-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    log = lambda text: print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)  # noqa: E731
    result: dict = {}
    if not args.select_only:
        import torch

        from benchmarks.gpu_loss_shards import time_tbe
        from dreamshard.costs.runners import SequentialRunner

        n, d, cap, seed = SETTINGS[0]
        task = sample_tasks(synth_family("dlrm", 300, 11), 1, (n, n), d, cap, seed=seed, workload=Workload(65_536))[0]
        plan = get_planner("dreamshard").plan(task)
        runner = SequentialRunner("triton", device="cuda")
        result["first_measurements"] = []
        for k in range(3):
            report = runner.evaluate(plan.device_tables(), plan.workload)
            result["first_measurements"].append({"overall_ms": report.overall_ms, "devices": [[c.fwd_comp_ms, c.bwd_comp_ms] for c in report.devices]})
            log(f"dlrm 40/4 task 0, shipped model's plan, measurement {k + 1}: {report.overall_ms:.3f} ms; devices fwd/bwd "
                + ", ".join(f"{c.fwd_comp_ms:.3f}/{c.bwd_comp_ms:.3f}" for c in report.devices))
    shards = borderline_shards(args.max_saving_us, args.tasks, args.per_family)
    log(f"{len(shards)} shards with a modelled saving in (30, {args.max_saving_us:.0f}) us: "
        + ", ".join(f"{f} {sum(s['family'] == f for s in shards)}" for f in TRAINING_FAMILIES))
    rows = []
    for s in shards:
        row = {k: v for k, v in s.items() if k != "tables"}
        row.update(n_tables=len(s["tables"]), lookups=float(sum(t.pooling_factor for t in s["tables"]) * 65_536))
        if not args.select_only:
            device = torch.device("cuda", 0)
            _, b_sorted, _ = time_tbe(s["tables"], 65_536, device, bwd_dense=0.0)
            _, b_every, k_every = time_tbe(s["tables"], 65_536, device, bwd_dense_min_us=0.0)
            _, b_default, k = time_tbe(s["tables"], 65_536, device)
            row.update(sorted_bwd_ms=b_sorted, every_candidate_bwd_ms=b_every, every_candidate_tables=k_every, default_bwd_ms=b_default, product_tables=k)
            log(f"{s['family']} {s['planner']} task {s['task']} dev {s['device']}: {len(s['tables'])} tables, saving {s['modelled_saving_us']:.0f} us modelled, "
                f"measured {1000 * (b_sorted - b_every):.0f} us (sorted {b_sorted:.3f}, every candidate {b_every:.3f} ms ({k_every} by product); "
                f"now {b_default:.3f} ms, {k} by product)")
        rows.append(row)
    result["shards"] = rows
    with open(os.path.join(args.out, "product_fixed_cost.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    log("done")


if __name__ == "__main__":
    main()
