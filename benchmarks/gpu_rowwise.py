"""The plans of benchmarks/rowwise_sim.py measured on one GPU (issue 13, part 3): table-wise, column
splits, row shards and TorchRec's own plan, each timed by the sequential runner with our Triton
kernel, beside the simulator's price of the same plan.

    PYTHONPATH=. python3 benchmarks/gpu_rowwise.py --out $OUT                         # one H200, ≤ 8 min
    PYTHONPATH=. python3 benchmarks/gpu_rowwise.py --out /tmp/r --device cpu --quick  # logic check here

It reads the plan files benchmarks/rowwise_sim.py wrote (benchmarks/results/rowwise_sim/plans: no
planner runs here, so TorchRec need not be installed on the GPU machine) and measures each device's
shards in turn on the one GPU (the sequential runner's protocol: warm-ups, then timed forward and
backward of the device's fused TBE over its shards — row shards on their measured restricted
streams — with the all-to-all priced by the shipped NCCL comm model and the reduce-scatter /
all-gather by the rule derived from it, not yet fitted: docs/rowwise.md). The step is the slowest
device's fwd + bwd compute and comm.

Time-boxed and incremental: settings in order of interest (onehot on 8, then 4 devices, then the
hot tasks), within a setting the row plan first, then table-wise, TorchRec, columns; no new plan
after --budget-s; every measured plan is appended to measured.csv and summary.json is rewritten
after each, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.plan import Plan, load_plans  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402

PLANS = Path(__file__).resolve().parent / "results" / "rowwise_sim"
ORDER = ["onehot_D8", "onehot_D4", "hot0_D8", "hot0_D4", "hot1_D8", "hot1_D4", "hot2_D8", "hot2_D4"]
KINDS = ["rows", "table_wise", "torchrec", "columns"]
FIELDS = ["setting", "kind", "planner", "devices", "row_tables", "measured_ms", "sim_ms", "measured_max_compute_ms", "comm_ms", "seconds"]


def rebatch(plan: Plan, batch_size: int) -> Plan:
    t = plan.task
    return Plan(Task(t.tables, t.devices, t.max_memory_bytes, Workload(batch_size, t.workload.precision, t.workload.optimizer), t.pool), plan.shards, plan.planner)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--plans", default=str(PLANS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernel", default="triton")
    ap.add_argument("--budget-s", type=float, default=420.0, help="no new plan after this many seconds (default 420: the run ends within 8 min)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="logic check: the hot0 plans on 4 devices, batch 256, 1 iteration")
    args = ap.parse_args()
    from dreamshard.costs.runners import SequentialRunner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = json.loads((Path(args.plans) / "rowwise_sim.json").read_text())
    order = ["hot0_D4"] if args.quick else ORDER
    warmup, iters = (0, 1) if args.quick else (args.warmup, args.iters)
    runner = SequentialRunner(args.kernel, device=args.device, warmup=warmup, iters=iters)
    sim = SimBackend()
    t0 = time.perf_counter()
    done, errors, measured_on = [], [], {}
    with open(out / "measured.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for slug in order:
            entry = next((e for e in summary["settings"] if e["setting"].replace(" ", "_").replace("=", "") == slug), None)
            if entry is None:
                continue
            seen = set()
            for kind in KINDS:
                rec = entry.get(kind)
                if rec is None or rec["plan"] in seen:
                    continue
                seen.add(rec["plan"])
                if time.perf_counter() - t0 > args.budget_s:
                    errors.append(f"{slug} {kind}: not measured (budget of {args.budget_s:.0f} s spent)")
                    continue
                s0 = time.perf_counter()
                try:
                    plan = load_plans(Path(args.plans) / rec["plan"])[0]
                    if args.quick:
                        plan = rebatch(plan, 256)
                    report = runner.evaluate(plan.device_tables(), plan.workload)
                    simulated = sim.evaluate(plan.device_tables(), plan.workload)
                except Exception as e:  # keep measuring the others; the error goes in the summary
                    errors.append(f"{slug} {kind}: {type(e).__name__}: {e}"[:500])
                    traceback.print_exc()
                    continue
                row = {"setting": slug, "kind": kind, "planner": rec["planner"], "devices": plan.devices, "row_tables": " ".join(rec["row_tables"]),
                       "measured_ms": report.overall_ms, "sim_ms": simulated.overall_ms,
                       "measured_max_compute_ms": max(d.fwd_comp_ms + d.bwd_comp_ms for d in report.devices),
                       "comm_ms": max(d.fwd_comm_ms + d.bwd_comm_ms for d in report.devices), "seconds": time.perf_counter() - s0}
                w.writerow(row)
                f.flush()
                done.append({**row, "devices_ms": [d.__dict__ for d in report.devices]})
                print(f"{slug:10s} {kind:10s} measured {row['measured_ms']:.3f} ms  sim {row['sim_ms']:.3f} ms  ({row['seconds']:.0f} s)", flush=True)
                measured_on = {"hardware": report.hardware, "runner": report.runner}
                atomic_write(out / "summary.json", json.dumps({**measured_on, "elapsed_s": time.perf_counter() - t0,
                                                               "measured": done, "errors": errors, "note": summary["priced_by"]}, indent=1))
    atomic_write(out / "summary.json", json.dumps({**measured_on, "elapsed_s": time.perf_counter() - t0, "measured": done, "errors": errors, "note": summary["priced_by"]}, indent=1))
    print(f"done in {time.perf_counter() - t0:.0f} s: {len(done)} plans measured, {len(errors)} not", flush=True)


if __name__ == "__main__":
    main()
