"""`dreamshard bench paper` on a GPU machine: the suite planned on its CPUs, and its test plans
measured on every visible GPU at once.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py all --out $OUT --suite paper,mlperf,families --tasks 50 --test-tasks 5 --family-tasks 3 --jobs 60 --budget-s 500   # 4 × H200, 494 s
    PYTHONPATH=. python3 benchmarks/gpu_bench.py all ... --resume DIR          # again, DIR holding the first call's measured-*.csv
    .venv/bin/dreamshard bench report RUN --costs $OUT/measured.csv --out DIR  # here: the measured tables of RUN's rows
    # apart: plan --out RUN ... (the rows, TorchRec's too where it is installed); measure RUN --out $OUT
    # logic check on a CPU: all --cpu --quick --out D --jobs 2

**all** trains each learned planner of each paper setting in its own process (against the
simulator), then plans each setting's test tasks in a process of its own (`bench.run_suite`), and
sends every task's distinct plans, as soon as it is planned, to one process per GPU (the paper's
settings first), which times them with the sequential runner (our Triton TBE; the collectives from
the comm model shipped for the GPU and the plan's device count) into OUT/measured-<gpu>.csv;
OUT/measured.csv joins them and OUT/rows.jsonl the settings' rows. Planning is deterministic (the
same plans, hash for hash, on every call), so a call cut by its budget resumes with `--resume`.
TorchRec is not installed on the GPU machines: its rows are made where it is (`dreamshard bench
paper ... --planners torchrec`) and stay simulated.

**plan** makes the suite's rows (test and train tasks) a process per setting into OUT/<setting>/
and joins them into OUT/rows.jsonl and OUT/plans.jsonl; **measure** times the distinct test plans
of RUN/plans.jsonl on every GPU.
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

from dreamshard import bench  # noqa: E402

T0 = time.monotonic()
COLUMNS = ("setting", "seed", "task", "plan", "measured_ms", "max_device_ms", "comm_ms", "wall_s", "gpu")


def _plan_setting(job) -> str:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from dreamshard.costs.sim import SimBackend

    setting, out, args = job
    labels = [lb for lb in bench.PAPER_COLUMNS + bench.FIELD_COLUMNS if lb not in args.skip]
    lines = []
    try:
        bench.run_suite(bench.Run(Path(out)), [setting], SimBackend(args.calibration), args.seeds, args.train_budget, args.oracle_budget,
                        say=lines.append, labels=labels, deadline=T0 + args.budget_s, splits=args.splits)
    except Exception:  # one setting's failure is reported; the others' rows are kept
        import traceback

        lines.append(f"FAILED: {traceback.format_exc()}")
    return f"{setting.name}: {len(bench.Run(Path(out)).rows())} rows in {time.monotonic() - T0:.0f} s" + "".join(f"\n  {x}" for x in lines)


def plan_cmd(args) -> None:

    out = Path(args.out)
    if args.resume and Path(args.resume) != out:
        shutil.copytree(args.resume, out, dirs_exist_ok=True)
    chosen = bench.quick_settings() if args.quick else bench.settings(args.suite.split(","), args.tasks, args.family_tasks, args.test_tasks)
    chosen = [c for c in chosen if args.devices in (None, c.devices)]
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


def _queue_iter(queues):
    """The tasks put on the queues, the first queue's first, until each has given a None."""
    import queue

    open_ = list(queues)
    while open_:
        for q in open_:
            try:
                item = q.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                open_.remove(q)
            else:
                yield item
            break


def cost_row(key: tuple, report, wall_s: float, gpu: str) -> dict:
    """One line of a measured CSV (COLUMNS): the plan's key, its report's step, slowest device and
    comm, the seconds it took."""
    return {"setting": key[0], "seed": key[1], "task": key[2], "plan": key[3], "measured_ms": f"{report.overall_ms:.5f}",
            "max_device_ms": f"{max(d.total_ms for d in report.devices):.5f}",
            "comm_ms": f"{max(d.fwd_comm_ms + d.bwd_comm_ms for d in report.devices):.5f}", "wall_s": f"{wall_s:.2f}", "gpu": gpu}


def _measure_share(job) -> int:
    """GPU `gpu` measures the plans of `tasks` (lists of (key, plan JSON), one list per task; or a
    tuple of queues of them, each ended by None) into OUT/measured-<gpu>.csv, beginning no task
    after the budget."""
    gpu, tasks, out, args = job
    if not args.cpu:  # this process sees its GPU alone: Triton launches on the device it was given
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.plan import Plan

    device = "cpu" if args.cpu else f"cuda:{gpu}"
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
                writer.writerow(cost_row(key, report, time.monotonic() - t0, device))
                fh.flush()
                done += 1
    return done


def measured_keys(out: Path) -> set:
    return set().union(*(bench.read_costs(p) for p in out.glob("measured-*.csv")))


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


def measure_distributed(args) -> None:
    """Every distinct test plan of as many devices as there are GPUs, by the distributed runner (one
    process per GPU, NCCL, Triton TBE; `--batch` plans per start of its processes) and, in the same
    call, by the sequential runner on GPU 0: OUT/distributed.csv and OUT/sequential.csv (the
    columns of measured.csv; `dreamshard bench report RUN --costs OUT/distributed.csv` gives the
    distributed tables), OUT/pairs.jsonl (both reports of every plan) and summary.json."""
    import torch

    from dreamshard.costs.hardware import describe_hardware, software_versions
    from dreamshard.costs.runners import DistributedRunner, SequentialRunner
    from dreamshard.plan import Plan

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_type, kernel = ("cpu", "torch") if args.cpu else ("cuda", "triton")
    gpus = 4 if args.cpu else torch.cuda.device_count()  # gloo processes on a CPU: any count
    done = bench.read_costs(out / "distributed.csv") if (out / "distributed.csv").exists() else {}
    plans = [(key, Plan.from_json(doc)) for task in test_tasks(Path(args.folder, "plans.jsonl"), set(done)) for key, doc in task]
    plans = [(k, p) for k, p in plans if p.devices == gpus]
    print(f"[{time.monotonic() - T0:6.1f}s] {len(plans)} plans of {gpus} devices on {gpus} {device_type} device(s)", flush=True)
    warm, iters = (1, 2) if args.quick else (3, 10)
    dist = DistributedRunner(kernel, device_type, warmup=warm, iters=iters)
    seq = SequentialRunner(kernel, None, device_type, warmup=warm, iters=iters)
    files = {name: open(out / f"{name}.csv", "a", newline="") for name in ("distributed", "sequential")}
    pairs = open(out / "pairs.jsonl", "a")
    writers = {name: csv.DictWriter(fh, COLUMNS) for name, fh in files.items()}
    for name, fh in files.items():
        if fh.tell() == 0:
            writers[name].writeheader()
    measured = 0
    for start in range(0, len(plans), args.batch):
        if time.monotonic() - T0 > args.budget_s:
            break
        batch = plans[start:start + args.batch]
        if args.quick:
            from gpu_comm import shrunk

            batch = [(k, shrunk(p)) for k, p in batch]
        workload = batch[0][1].workload.with_overrides(256, "fp32") if args.quick else None
        t = time.monotonic()
        reports = dist.evaluate_many([p.device_tables() for _, p in batch], workload or batch[0][1].workload)
        for (key, plan), rep in zip(batch, reports):
            s = seq.evaluate_plan(plan, 256 if args.quick else None, "fp32" if args.quick else None)
            for name, r in (("distributed", rep), ("sequential", s)):
                writers[name].writerow(cost_row(key, r, (time.monotonic() - t) / len(batch), f"{gpus} x {device_type}"))
            pairs.write(json.dumps({"key": list(key), "planner": plan.planner, "distributed": rep.to_json(), "sequential": s.to_json()}) + "\n")
            measured += 1
        for fh in (*files.values(), pairs):
            fh.flush()
        print(f"[{time.monotonic() - T0:6.1f}s] {measured} of {len(plans)} plans", flush=True)
    for fh in (*files.values(), pairs):
        fh.close()
    how = {"distributed.csv": f"the distributed runner ({kernel}, {'gloo' if args.cpu else 'NCCL'}: one process per device, the collectives measured)",
           "sequential.csv": f"the sequential runner ({kernel}, device 0: each plan's shards in turn; collectives from the comm model shipped for the device and the plan's device count)"}
    summary = {"device": describe_hardware(device_type, gpus), "versions": software_versions(), "how": how,
               "measured_this_call": measured, "left": len(plans) - measured, "wall_s": round(time.monotonic() - T0, 1),
               "command": " ".join(["benchmarks/gpu_bench.py", *sys.argv[1:]])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)


def measure_cmd(args) -> None:
    import torch

    if args.distributed:
        measure_distributed(args)
        return
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


def _train_one(job) -> str:
    """One learned planner trained on one paper setting (the models a planning job then finds)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from dreamshard.costs.sim import SimBackend

    setting, folder, name, args = job
    train, _, _ = bench.tasks_of(setting, 0, {})
    bench.train_models(setting, 0, train, SimBackend(args.calibration), Path(folder) / "models", args.train_budget, [name], say=lambda line: None)
    return f"trained {name} for {setting.name} at {time.monotonic() - T0:.0f} s"


def all_cmd(args) -> None:
    """The test tasks planned (the machine's CPUs: each learned planner trained per paper setting
    in its own process, then a process per setting) and measured (every GPU) at once: a task's
    plans go to the GPUs as soon as it is planned, the paper's settings first."""
    import torch


    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.resume:
        for p in Path(args.resume).glob("measured-*.csv"):
            shutil.copy(p, out / f"earlier-{p.name}")  # measured-*.csv names are the workers'
    if args.quick:
        chosen, args.oracle_budget = bench.quick_settings(), min(args.oracle_budget, 1000)
    else:
        chosen = bench.settings(args.suite.split(","), args.tasks, args.family_tasks, args.test_tasks)
    chosen = [c for c in chosen if args.devices in (None, c.devices)]
    measured = measured_keys(out) | {k for p in out.glob("earlier-*.csv") for k in bench.read_costs(p)}
    ctx = mp.get_context("spawn")
    gpus = 1 if args.cpu else torch.cuda.device_count()
    queues = (ctx.Queue(), ctx.Queue())  # the paper's settings, the others
    workers = [ctx.Process(target=_measure_share, args=((g, queues, str(out), args),)) for g in range(gpus)]
    for w in workers:
        w.start()
    folder = {s.name: work / s.slug for s in chosen}
    trained = [s for s in chosen if s.train and args.train_budget]
    pending, sent, plans = {}, set(), 0
    with ctx.Pool(min(args.jobs, 3 * len(trained) + len(chosen)), maxtasksperchild=1) as pool:
        def plan(s):
            pending[s.name] = pool.apply_async(_plan_setting, ((s, str(folder[s.name]), args),))

        training = {s.name: [pool.apply_async(_train_one, ((s, str(folder[s.name]), n, args),)) for n in bench.LEARNED] for s in trained}
        for s in chosen:
            if s.name not in training:
                plan(s)
        while training or pending:
            time.sleep(5)
            for name in [n for n, rs in training.items() if all(r.ready() for r in rs)]:
                for r in training.pop(name):
                    print(f"[{time.monotonic() - T0:6.1f}s] {r.get() if r.successful() else 'FAILED training ' + name}", flush=True)
                plan(next(s for s in chosen if s.name == name))
            for s in chosen:  # every test task planned so far, to the GPUs
                done = {bench.task_key(r)[:4] for r in bench.Run(folder[s.name]).rows()}
                for task in test_tasks(folder[s.name] / "plans.jsonl", measured):
                    key = task[0][0][:3]
                    if key not in sent and (key[0], key[1], "test", key[2]) in done:
                        sent.add(key)
                        plans += len(task)
                        queues[0 if s.suite == "paper" else 1].put(task)
            for name in [n for n, r in pending.items() if r.ready()]:
                r = pending.pop(name)
                print(f"[{time.monotonic() - T0:6.1f}s] {r.get() if r.successful() else 'FAILED ' + name}", flush=True)
    for q in queues:
        for _ in workers:
            q.put(None)
    for w in workers:
        w.join()
    (out / "rows.jsonl").write_text("".join((f / "rows.jsonl").read_text() for f in folder.values() if (f / "rows.jsonl").exists()))
    done = len(measured_keys(out))  # this call's
    for p in out.glob("earlier-*.csv"):  # the earlier call's lines join this call's
        shutil.move(p, out / p.name.replace("earlier-", "measured-earlier-"))
    write_measured(out, args, gpus, [done], plans - done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    suite = argparse.ArgumentParser(add_help=False)  # what plan and all run: `dreamshard bench paper`'s options
    suite.add_argument("--out", required=True)
    suite.add_argument("--suite", default="paper,families,mlperf")
    suite.add_argument("--tasks", type=int, default=50)
    suite.add_argument("--test-tasks", type=int)
    suite.add_argument("--family-tasks", type=int, default=5)
    suite.add_argument("--seeds", type=int, default=1)
    suite.add_argument("--train-budget", type=int, default=100)
    suite.add_argument("--oracle-budget", type=int, default=4000)
    suite.add_argument("--jobs", type=int, default=os.cpu_count())
    suite.add_argument("--quick", action="store_true")
    suite.add_argument("--devices", type=int, help="only the settings of this many devices")
    suite.add_argument("--calibration", help="the simulator's calibration the planners train and search on (default: this machine's GPU's, or the CPU default)")
    p = sub.add_parser("plan", parents=[suite], help="the suite planned on this machine's CPUs, a process per setting")
    p.add_argument("--skip", default="", help="comma-separated planner labels left out (torchrec where TorchRec is not installed)")
    p.add_argument("--budget-s", type=float, default=560.0, help="no task is begun after this many seconds")
    p.add_argument("--resume", help="an earlier call's OUT")
    p.add_argument("--splits", default="test,train")
    p.set_defaults(run=plan_cmd)
    m = sub.add_parser("measure", help="RUN's test plans measured on every GPU")
    m.add_argument("folder", help="the run folder (plans.jsonl)")
    m.add_argument("--out", required=True)
    m.add_argument("--budget-s", type=float, default=540.0)
    m.add_argument("--resume")
    m.add_argument("--cpu", action="store_true", help="the torch kernel on CPU (a logic check)")
    m.add_argument("--quick", action="store_true", help="tables cut to 4,096 rows, batch 256 (with --cpu)")
    m.add_argument("--distributed", action="store_true", help="the plans of as many devices as GPUs by the distributed runner beside the sequential one (measure_distributed)")
    m.add_argument("--batch", type=int, default=8, help="--distributed: plans per start of its processes")
    m.set_defaults(run=measure_cmd)
    a = sub.add_parser("all", parents=[suite], help="plan (the machine's CPUs) and measure (every GPU) at once: OUT/rows.jsonl, OUT/measured.csv")
    a.add_argument("--work", default="/tmp/gpu_bench", help="the per-setting run folders (plans and models stay here)")
    a.add_argument("--skip", default="torchrec")
    a.add_argument("--resume", help="a folder of an earlier call's measured-*.csv: those plans are not measured again")
    a.add_argument("--budget-s", type=float, default=540.0, help="no task planned or measured is begun after this many seconds")
    a.add_argument("--splits", default="test", help="the tasks planned: test (the rows measured), or test,train")
    a.add_argument("--cpu", action="store_true", help="the torch kernel on CPU (a logic check)")
    a.set_defaults(run=all_cmd)
    args = ap.parse_args()
    if args.command in ("plan", "all"):
        args.skip = [s for s in args.skip.split(",") if s]
        args.splits = tuple(s for s in args.splits.split(",") if s)
    args.run(args)


if __name__ == "__main__":
    main()
