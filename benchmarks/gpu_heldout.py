"""The held-out planner campaign, measured: every plan of benchmarks/heldout_plans.py timed on one GPU.

    PYTHONPATH=. python3 benchmarks/gpu_heldout.py --out $OUT                 # one H100 or H200, ≤ 9.5 min
    PYTHONPATH=. python3 benchmarks/gpu_heldout.py --out $OUT --resume DIR    # go on from a cut call's measured.csv
    .venv/bin/python benchmarks/gpu_heldout.py --out /tmp/gh --cpu --quick    # logic check here (torch kernel, small batch)

Each plan of benchmarks/results/gpu_heldout/plans.jsonl is measured by the sequential runner
(our Triton TBE, shard by shard on the GPU; the collectives from the comm model shipped for the GPU
and the plan's device count), task by task in the file's order, so a call cut by its budget
(--budget-s) leaves whole tasks. One CSV line per plan (`measured.csv`, appended as it goes):
family, setting, task, the planners that made the plan, its kind, the measured overall step and
max-device cost, comm, the runner's wall time. benchmarks/heldout_report.py makes the tables.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dreamshard.costs.hardware import describe_hardware, software_versions  # noqa: E402
from dreamshard.costs.runners import SequentialRunner  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.plan import load_plans  # noqa: E402
from gpu_comm import shrunk  # noqa: E402

PLANS = Path(__file__).resolve().parent / "results" / "gpu_heldout" / "plans.jsonl"
COLUMNS = ("family", "setting", "task", "planners", "plan", "kind", "measured_ms", "max_device_ms", "comm_ms", "wall_s")
T0 = time.monotonic()


def note(plan, key: str) -> str:
    return next(n[len(key) + 1 :] for n in plan.notes if n.startswith(key + " "))


def planners_of(plan) -> list[str]:
    return [n[len("planner ") :] for n in plan.notes if n.startswith("planner ")]


def plan_hash(plan) -> str:
    """12 hex digits of the plan's shards: a plan re-made differently is measured again."""
    shards = sorted((s.table, s.device, s.start, s.stop, s.row_start, s.row_stop) for s in plan.shards)
    return hashlib.sha1(repr(shards).encode()).hexdigest()[:12]


def plan_id(plan) -> tuple[str, str, str, str, str]:
    return note(plan, "family"), note(plan, "setting"), note(plan, "task"), ";".join(planners_of(plan)), plan_hash(plan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--plans", default=str(PLANS))
    ap.add_argument("--budget-s", type=float, default=540.0, help="no new task after this many seconds")
    ap.add_argument("--resume", help="a cut call's OUT: its measured.csv is kept and its plans are not measured again")
    ap.add_argument("--cpu", action="store_true", help="the torch kernel on CPU (a logic check)")
    ap.add_argument("--quick", action="store_true", help="tables cut to 4,096 rows, batch 256 (with --cpu)")
    args = ap.parse_args()
    from dataclasses import replace

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plans = load_plans(args.plans)
    path = out / "measured.csv"
    if args.resume and Path(args.resume, "measured.csv") != path:
        shutil.copy(Path(args.resume, "measured.csv"), path)
    done = set()
    if path.exists():
        with open(path) as fh:
            done = {(r["family"], r["setting"], r["task"], r["planners"], r["plan"]) for r in csv.DictReader(fh)}
    device = "cpu" if args.cpu else "cuda"
    runner = SequentialRunner("torch" if args.cpu else "triton", None, device, warmup=1 if args.quick else 3, iters=2 if args.quick else 10)
    fresh = not path.exists()
    fh = open(path, "a", newline="")
    writer = csv.DictWriter(fh, COLUMNS)
    if fresh:
        writer.writeheader()
    last_task, measured = None, 0
    for plan in plans:
        key = plan_id(plan)
        if key in done:
            continue
        if key[:3] != last_task and time.monotonic() - T0 > args.budget_s:
            print(f"[{time.monotonic() - T0:6.1f}s] budget spent: stopping before {key[:3]}", flush=True)
            break
        last_task = key[:3]
        if args.quick:  # small tables and batch: the logic on a CPU in seconds
            plan = shrunk(plan)
            plan = replace(plan, task=replace(plan.task, workload=replace(plan.task.workload, batch_size=256)))
        t0 = time.monotonic()
        report = runner.evaluate_plan(plan)
        comm = max(d.fwd_comm_ms + d.bwd_comm_ms for d in report.devices)
        writer.writerow({"family": key[0], "setting": key[1], "task": key[2], "planners": key[3], "plan": key[4], "kind": note(plan, "kind"),
                         "measured_ms": f"{report.overall_ms:.5f}", "max_device_ms": f"{max(d.total_ms for d in report.devices):.5f}",
                         "comm_ms": f"{comm:.5f}", "wall_s": f"{time.monotonic() - t0:.2f}"})
        fh.flush()
        measured += 1
        print(f"[{time.monotonic() - T0:6.1f}s] {key[0]:10s} {key[1]} task {key[2]} {report.overall_ms:8.3f} ms  {key[3]}", flush=True)
    fh.close()
    summary = {"device": describe_hardware(device, 1), "versions": software_versions(), "runner": runner.name, "plans_file": str(args.plans),
               "measured_this_call": measured, "wall_s": round(time.monotonic() - T0, 1),
               "command": " ".join(["benchmarks/gpu_heldout.py", *sys.argv[1:]])}
    atomic_write(out / "summary.json", json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
