"""`dreamshard bench paper` on a GPU machine: the suite planned on its CPUs, one process per
setting, and its test plans measured on every visible GPU at once.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py plan --out $OUT --tasks 50 --test-tasks 10 --family-tasks 3 --skip torchrec   # the machine's CPUs, ≤ 9.5 min
    PYTHONPATH=. python3 benchmarks/gpu_bench.py measure RUN --out $OUT                                        # every GPU, ≤ 9.5 min
    .venv/bin/dreamshard bench report RUN --costs $OUT/measured.csv --out DIR                                   # here: the measured tables
    # logic check on a CPU: plan --quick --out D --jobs 2; measure D --out D2 --cpu --quick

**plan** runs `bench.run_suite` for each setting in its own process (the simulator prices; the
learned planners are trained per paper setting against it) into OUT/<setting>/, then appends
every setting's rows and plans to OUT/rows.jsonl and OUT/plans.jsonl, the layout `bench report`
reads. A setting cut by the budget resumes with the same command (`--resume OUT`). TorchRec is
not installed on the GPU machines: `--skip torchrec` there, and its rows are made where it is
(`bench paper ... --planners torchrec` into the same run: rows are per planner).

**measure** times every distinct test plan of RUN/plans.jsonl with the sequential runner (our
Triton TBE; the collectives from the comm model shipped for the GPU and the plan's device count),
the plans dealt to the GPUs task by task, one process per GPU: OUT/measured.csv (setting, seed,
task, plan hash, measured ms, ...), appended as it goes; `--resume DIR` keeps DIR's lines.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.monotonic()
COLUMNS = ("setting", "seed", "task", "plan", "measured_ms", "max_device_ms", "comm_ms", "wall_s", "gpu")


def _plan_setting(job) -> str:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from dreamshard import bench
    from dreamshard.costs.sim import SimBackend

    setting, out, args = job
    labels = [lb for lb in bench.PAPER_COLUMNS + bench.FIELD_COLUMNS if lb not in args.skip]
    lines = []
    try:
        bench.run_suite(bench.Run(Path(out)), [setting], SimBackend(), args.seeds, args.train_budget, args.oracle_budget,
                        say=lines.append, labels=labels, deadline=T0 + args.budget_s)
    except Exception as e:  # one setting's failure is reported; the others' rows are kept
        import traceback

        lines.append(f"FAILED: {traceback.format_exc()}")
    return f"{setting.name}: {len(bench.Run(Path(out)).rows())} rows in {time.monotonic() - T0:.0f} s" + "".join(f"\n  {x}" for x in lines)


def plan_cmd(args) -> None:
    from dreamshard import bench

    out = Path(args.out)
    if args.resume and Path(args.resume) != out:
        shutil.copytree(args.resume, out, dirs_exist_ok=True)
    chosen = bench.quick_settings() if args.quick else bench.settings(args.suite.split(","), args.tasks, args.family_tasks, args.test_tasks)
    if args.quick:
        args.train_budget, args.oracle_budget = 0, min(args.oracle_budget, 1000)
    # the largest settings first: they take longest
    jobs = sorted(((s, str(out / s.slug), args) for s in chosen), key=lambda j: -j[0].tables * (j[0].train + j[0].test))
    with mp.get_context("spawn").Pool(min(args.jobs, len(jobs)), maxtasksperchild=1) as pool:
        for line in pool.imap_unordered(_plan_setting, jobs):
            print(f"[{time.monotonic() - T0:6.1f}s] {line}", flush=True)
    # one run folder: every setting's rows and plans
    for name in ("rows.jsonl", "plans.jsonl"):
        text = "".join((out / s.slug / name).read_text() for s, _, _ in jobs if (out / s.slug / name).exists())
        (out / name).write_text(text)
    print(json.dumps({"settings": len(jobs), "rows": sum(1 for _ in open(out / "rows.jsonl")), "wall_s": round(time.monotonic() - T0, 1)}), flush=True)


def _queue_iter(q):
    """The tasks put on `q` until a None."""
    while (item := q.get()) is not None:
        yield item


def _measure_share(job) -> int:
    """GPU `gpu` measures the plans of `tasks` (lists of (key, plan JSON), one list per task, or a
    queue of them ended by None) into OUT/measured-<gpu>.csv, beginning no task after the budget."""
    gpu, tasks, out, args = job
    import torch

    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.plan import Plan

    device = "cpu" if args.cpu else f"cuda:{gpu}"
    if not args.cpu:
        torch.cuda.set_device(gpu)
    runner = SequentialRunner("torch" if args.cpu else "triton", None, "cpu" if args.cpu else "cuda", warmup=1 if args.quick else 3, iters=2 if args.quick else 10)
    path = Path(out) / f"measured-{gpu}.csv"
    fresh = not path.exists()
    done = 0
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        if fresh:
            writer.writeheader()
        for task in tasks if isinstance(tasks, list) else _queue_iter(tasks):
            if time.monotonic() - T0 > args.budget_s:
                continue  # drain the queue without measuring
            for key, doc in task:
                plan = Plan.from_json(doc)
                if args.quick:
                    from gpu_comm import shrunk

                    plan = shrunk(plan)
                t0 = time.monotonic()
                report = runner.evaluate_plan(plan, 256 if args.quick else None)
                writer.writerow({"setting": key[0], "seed": key[1], "task": key[2], "plan": key[3], "measured_ms": f"{report.overall_ms:.5f}",
                                 "max_device_ms": f"{max(d.total_ms for d in report.devices):.5f}",
                                 "comm_ms": f"{max(d.fwd_comm_ms + d.bwd_comm_ms for d in report.devices):.5f}",
                                 "wall_s": f"{time.monotonic() - t0:.2f}", "gpu": device})
                fh.flush()
                done += 1
    return done


def measured_keys(out: Path) -> set:
    done = set()
    for p in out.glob("measured-*.csv"):
        with open(p) as fh:
            done |= {(r["setting"], int(r["seed"]), int(r["task"]), r["plan"]) for r in csv.DictReader(fh)}
    return done


def test_tasks(plans_file: Path, skip: set) -> list[list[tuple]]:
    """The distinct test plans of a plans file not in `skip`, grouped by task: [[(key, JSON), ...], ...]."""
    by_task: dict[tuple, dict] = {}
    for line in plans_file.read_text().splitlines() if plans_file.exists() else []:
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        notes = dict(n.split(" ", 1) for n in doc.get("notes", []) if n.split(" ", 1)[0] in ("setting", "seed", "task", "hash"))
        key = (notes["setting"], int(notes["seed"]), int(notes["task"]), notes["hash"])
        if key not in skip:
            by_task.setdefault(key[:3], {}).setdefault(key, doc)
    return [list(plans.items()) for plans in by_task.values()]


def write_measured(out: Path, args, gpus: int, counts: list[int], left: int) -> None:
    from dreamshard.costs.hardware import describe_hardware, software_versions

    rows = []
    for p in sorted(out.glob("measured-*.csv")):
        with open(p) as fh:
            rows += list(csv.DictReader(fh))
    with open(out / "measured.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    summary = {"device": describe_hardware("cpu" if args.cpu else "cuda", gpus), "versions": software_versions(), "runner": "sequential (triton)",
               "measured_this_call": sum(counts), "measured": len(rows), "left": left, "wall_s": round(time.monotonic() - T0, 1),
               "command": " ".join(["benchmarks/gpu_bench.py", *sys.argv[1:]])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)


def measure_cmd(args) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        for p in Path(args.resume).glob("measured-*.csv"):
            if p.parent != out:
                shutil.copy(p, out / p.name)
    tasks = test_tasks(Path(args.folder, "plans.jsonl"), measured_keys(out))
    gpus = 1 if args.cpu else torch.cuda.device_count()
    shares = [tasks[g::gpus] for g in range(gpus)]
    print(f"[{time.monotonic() - T0:6.1f}s] {sum(map(len, tasks))} plans of {len(tasks)} tasks on {gpus} GPU(s)", flush=True)
    with mp.get_context("spawn").Pool(gpus) as pool:
        counts = pool.map(_measure_share, [(g, shares[g], str(out), args) for g in range(gpus)])
    write_measured(out, args, gpus, counts, sum(map(len, tasks)) - sum(counts))


def all_cmd(args) -> None:
    """plan and measure in one call: each setting's test plans go to the GPUs as soon as it is planned."""
    import queue
    import threading

    import torch

    from dreamshard import bench

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.quick:
        chosen, args.train_budget, args.oracle_budget = bench.quick_settings(), 0, min(args.oracle_budget, 1000)
    else:
        chosen = bench.settings(args.suite.split(","), args.tasks, args.family_tasks, args.test_tasks)
    jobs = sorted(((s, str(work / s.slug), args) for s in chosen), key=lambda j: j[0].tables * (j[0].train + j[0].test))  # small first: the GPUs start early
    ctx = mp.get_context("spawn")
    gpus = 1 if args.cpu else torch.cuda.device_count()
    tasks_q = ctx.Queue()
    workers = [ctx.Process(target=_measure_share, args=((g, tasks_q, str(out), args),)) for g in range(gpus)]
    for w in workers:
        w.start()
    ready: queue.Queue = queue.Queue()
    sent = 0
    with ctx.Pool(min(args.jobs, len(jobs)), maxtasksperchild=1) as pool:
        for job in jobs:
            pool.apply_async(_plan_setting, (job,), callback=lambda line, job=job: ready.put((job, line)),
                             error_callback=lambda e, job=job: ready.put((job, f"FAILED {e}")))
        for _ in jobs:
            job, line = ready.get()
            print(f"[{time.monotonic() - T0:6.1f}s] {line}", flush=True)
            for task in test_tasks(Path(job[1]) / "plans.jsonl", set()):
                tasks_q.put(task)
                sent += len(task)
    for _ in workers:
        tasks_q.put(None)
    for w in workers:
        w.join()
    for name in ("rows.jsonl",):
        (out / name).write_text("".join((Path(j[1]) / name).read_text() for j in jobs if (Path(j[1]) / name).exists()))
    done = len(measured_keys(out))
    write_measured(out, args, gpus, [done], sent - done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="the suite planned on this machine's CPUs, a process per setting")
    p.add_argument("--out", required=True)
    p.add_argument("--suite", default="paper,families,mlperf")
    p.add_argument("--tasks", type=int, default=50)
    p.add_argument("--test-tasks", type=int)
    p.add_argument("--family-tasks", type=int, default=5)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--train-budget", type=int, default=100)
    p.add_argument("--oracle-budget", type=int, default=4000)
    p.add_argument("--skip", default="", help="comma-separated planner labels left out (torchrec where TorchRec is not installed)")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--budget-s", type=float, default=560.0, help="no task is begun after this many seconds")
    p.add_argument("--resume", help="an earlier call's OUT")
    p.add_argument("--quick", action="store_true")
    p.set_defaults(run=plan_cmd)
    m = sub.add_parser("measure", help="RUN's test plans measured on every GPU")
    m.add_argument("folder", help="the run folder (plans.jsonl)")
    m.add_argument("--out", required=True)
    m.add_argument("--budget-s", type=float, default=540.0)
    m.add_argument("--resume")
    m.add_argument("--cpu", action="store_true", help="the torch kernel on CPU (a logic check)")
    m.add_argument("--quick", action="store_true", help="tables cut to 4,096 rows, batch 256 (with --cpu)")
    m.set_defaults(run=measure_cmd)
    a = sub.add_parser("all", help="plan (the machine's CPUs) and measure (every GPU) at once: OUT/rows.jsonl, OUT/measured.csv")
    a.add_argument("--out", required=True)
    a.add_argument("--work", default="/tmp/gpu_bench", help="the per-setting run folders (plans and models stay here)")
    a.add_argument("--suite", default="paper,families,mlperf")
    a.add_argument("--tasks", type=int, default=50)
    a.add_argument("--test-tasks", type=int)
    a.add_argument("--family-tasks", type=int, default=5)
    a.add_argument("--seeds", type=int, default=1)
    a.add_argument("--train-budget", type=int, default=100)
    a.add_argument("--oracle-budget", type=int, default=4000)
    a.add_argument("--skip", default="torchrec")
    a.add_argument("--jobs", type=int, default=os.cpu_count())
    a.add_argument("--budget-s", type=float, default=540.0, help="no task planned or measured is begun after this many seconds")
    a.add_argument("--cpu", action="store_true")
    a.add_argument("--quick", action="store_true")
    a.set_defaults(run=all_cmd)
    args = ap.parse_args()
    if args.command in ("plan", "all"):
        args.skip = [s for s in args.skip.split(",") if s]
    args.run(args)


if __name__ == "__main__":
    main()
