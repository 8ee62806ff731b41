"""The multi-GPU comm campaign: fit the collectives as the runner issues them, then measure the plans
of every planner with both runners. One call on a 4-GPU machine (2 and 4 devices).

    PYTHONPATH=. python3 benchmarks/gpu_comm.py --out $OUT                    # 4 GPUs, ≤ 9 min
    .venv/bin/python benchmarks/gpu_comm.py --out /tmp/gc --cpu --quick       # logic check here: gloo, torch kernel

For each device count D (4, then 2, as far as the GPUs go; 2 of 4 GPUs of one host share its NVLink
switch as a 2-GPU host's do):

1. `comm.calibrate`: the all-to-all over balanced and skewed patterns, the reduce-scatter and the
   all-gather, timed as the distributed runner times its comm phases, on the fitted and the
   held-out sets; written to ``$OUT/<gpu>_nccl_<D>gpu.json`` (the model and every point: ship it
   as dreamshard/data/comm/<gpu>_nccl_<D>gpu.json; `dreamshard calibrate comm --refit` fits again);
2. the plans of benchmarks/comm_plans.py (every family, table-wise, column and row plans of five
   planners) measured by the distributed runner (one process per GPU, NCCL, Triton TBE) and by the
   sequential runner (compute shard by shard on GPU 0; comm from the model of step 1);
3. ``$OUT/campaign_<gpu>.json``: every report, written after each batch of plans, so a run cut
   short keeps what it measured. benchmarks/comm_report.py turns it into the tables of docs/comm.md.

A global budget (--budget-s) stops measuring new plans before the call's limit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # mandatory on our GPU machines (workers get it too)
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard.costs import comm  # noqa: E402
from dreamshard.costs.hardware import describe_hardware, gpu_slug, software_versions  # noqa: E402
from dreamshard.costs.runners import DistributedRunner, SequentialRunner  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.plan import load_plans  # noqa: E402

PLANS = Path(__file__).resolve().parent / "results" / "gpu_comm"
T0 = time.monotonic()


def log(*a) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def shrunk(plan, rows: int = 4096):
    """`plan` with every table cut to at most `rows` rows (row ranges scaled alike): the --quick
    check runs every plan kind on CPU processes without the tables' real memory."""
    from dataclasses import replace

    from dreamshard.plan import Plan

    old = [t.rows for t in plan.task.tables]
    tables = [replace(t, rows=min(t.rows, rows)) for t in plan.task.tables]
    at = lambda i, r: None if r is None else round(r * tables[i].rows / old[i])  # noqa: E731
    shards = [replace(s, row_start=at(s.table, s.row_start), row_stop=at(s.table, s.row_stop)) for s in plan.shards]
    return Plan(replace(plan.task, tables=tables), shards, plan.planner, None, plan.notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true", help="gloo and the torch kernel on CPU processes (a logic check)")
    ap.add_argument("--quick", action="store_true", help="small batch, few plans and sizes (with --cpu)")
    ap.add_argument("--budget-s", type=float, default=500.0, help="no new batch of plans after this")
    ap.add_argument("--devices", default="4,2", help="device counts, in order (the largest first: a cut run keeps it)")
    ap.add_argument("--batch", type=int, default=8, help="plans per start of the distributed runner's processes")
    ap.add_argument("--no-plans", action="store_true", help="fit the comm models only")
    ap.add_argument("--sequential-only", metavar="KIND", help="no collectives: the sequential runner's compute of the plans whose notes end in 'kind KIND...'")
    args = ap.parse_args()
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_type = "cpu" if args.cpu else "cuda"
    kernel = "torch" if args.cpu else "triton"
    visible = torch.cuda.device_count() if device_type == "cuda" else 8  # gloo processes on this host: any count
    gpu = gpu_slug() if device_type == "cuda" else "cpu"
    # the sequential runner needs one device whatever the plan's count; the collectives need them all
    counts = [d for d in map(int, args.devices.split(",")) if d <= visible or args.sequential_only]
    log(f"{describe_hardware(device_type, visible)}; {software_versions()}; device counts {counts}")
    result = {"hardware": describe_hardware(device_type, visible), "versions": software_versions(), "kernel": kernel, "gpu": gpu,
              "command": " ".join(sys.argv), "models": {}, "plans": []}
    path = out / f"campaign_{gpu}.json"

    def save() -> None:
        atomic_write(path, json.dumps(result, indent=1))

    if args.sequential_only:
        seq = SequentialRunner(kernel, comm.CommModel(0.01, 100.0), device_type)  # comm: any; the compute is what is kept
        for D in counts:
            for i, plan in enumerate(load_plans(PLANS / f"plans_{D}.jsonl")):
                if plan.notes[-1].startswith(f"kind {args.sequential_only}"):
                    s = seq.evaluate(plan.device_tables(), plan.workload)
                    result["plans"].append({"devices": D, "index": i, "planner": plan.planner, "notes": plan.notes, "sequential": s.to_json()})
                    log(f"{D} devices, plan {i}: compute {[(round(d.fwd_comp_ms, 3), round(d.bwd_comp_ms, 3)) for d in s.devices]}")
        save()
        return
    quick = {"chunk_bytes": [4 << 10, 1 << 20], "buffer_bytes": [64 << 10, 4 << 20]} if args.quick else {}
    models = {}
    for D in counts:
        t = time.monotonic()
        model = comm.calibrate(D, device_type=device_type, iters=5 if args.quick else 20, warmup=1 if args.quick else 3,
                               chunk_bytes=quick.get("chunk_bytes"), buffer_bytes=quick.get("buffer_bytes"))
        name = f"{gpu}_{model.process_group}_{D}gpu.json"
        model.save(out / name)
        models[D] = model
        result["models"][str(D)] = {"file": name, "fit": model.describe(), "fit_details": model.fit_details,
                                    "reduce_scatter": model.reduce_scatter, "all_gather": model.all_gather}
        save()
        log(f"{D} devices: {model.describe()}; held out {json.dumps(model.fit_details.get('held_out'))} ({time.monotonic() - t:.0f} s)")

    dist = DistributedRunner(kernel, device_type, warmup=1 if args.quick else 3, iters=3 if args.quick else 10)
    for D in counts if not args.no_plans else []:
        plans = load_plans(PLANS / f"plans_{D}.jsonl")
        if args.quick:  # one plan of each kind, small
            kinds = {}
            for p in plans:
                kinds.setdefault(p.notes[-1], shrunk(p))
            plans = list(kinds.values())
        workload = plans[0].workload
        if args.quick:
            workload = workload.with_overrides(1024, "fp32")
        seq = SequentialRunner(kernel, models[D], "cuda" if device_type == "cuda" else "cpu", warmup=1 if args.quick else 3, iters=3 if args.quick else 10)
        for start in range(0, len(plans), args.batch):
            if time.monotonic() - T0 > args.budget_s:
                log(f"budget spent: {len(plans) - start} plans of {D} devices not measured")
                result.setdefault("not_measured", []).extend(f"{D}:{i}" for i in range(start, len(plans)))
                break
            batch = plans[start:start + args.batch]
            t = time.monotonic()
            reports = dist.evaluate_many([p.device_tables() for p in batch], workload)
            for i, (plan, rep) in enumerate(zip(batch, reports)):
                s = seq.evaluate(plan.device_tables(), workload)
                result["plans"].append({"devices": D, "index": start + i, "planner": plan.planner, "notes": plan.notes,
                                        "distributed": rep.to_json(), "sequential": s.to_json()})
                log(f"{D} devices, plan {start + i} {plan.planner} {plan.notes}: distributed {rep.overall_ms:.3f} (e2e {rep.e2e_ms:.3f}), "
                    f"sequential {s.overall_ms:.3f}")
            save()
            log(f"batch of {len(batch)} in {time.monotonic() - t:.0f} s")
    log(f"done: {len(result['plans'])} plans; wrote {path}")


if __name__ == "__main__":
    main()
