"""Tasks whose tables are 1.5–3× the devices' HBM, planned with host memory by our planners (the tier
stage) and by TorchRec's planner with UVM caching allowed, all priced by the simulator (issue 38's
second target); and those plans measured on a GPU.

    PYTHONPATH=. python3 benchmarks/tiers_sim.py --out benchmarks/results/tiers_sim --devices 2   # ~25 s on 2 CPU cores
    PYTHONPATH=. python3 benchmarks/tiers_sim.py --out benchmarks/results/tiers_sim --devices 4   # ~40 s; adds its rows
    PYTHONPATH=. python3 benchmarks/tiers_sim.py --out benchmarks/results/tiers_sim/mixed --family mixed --devices 2   # a held-out family
    ... --plans P.jsonl                                   # also append every plan to P.jsonl (made where TorchRec is installed)
    PYTHONPATH=. python3 benchmarks/tiers_sim.py measure P.jsonl --out $OUT   # a GPU: each plan by the sequential runner (Triton TBE)
    ... measure P.jsonl --out $OUT --resume DIR/measured.jsonl             # a call cut short: the plans it did not measure, or that failed
    .venv/bin/python benchmarks/tiers_sim.py report DIR/measured.jsonl "GPU, kernel" SECONDS       # the measured table again
    .venv/bin/python benchmarks/tiers_sim.py reprice P.jsonl DIR/measured.jsonl CALIBRATION  # its sim_ms by today's simulator

Tasks: `--tables` tables drawn from a `dlrm` pool (seed 12; `--family F`: that family's pool, the
held-out ones are mixed, rmc and din), B = 65,536, fp16, SGD, on 2 and 4
devices whose HBM is total bytes / ratio / devices, with 4× the table bytes of host memory per
device. TorchRec runs with `reservation=0.0` (its default reservation of input buffers at
B = 65,536 leaves no HBM for tables at these sizes) and prices nothing itself here: every plan is
priced by the same simulator, default calibration, default host link (costs/host.py). Writes
results.csv and results.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402
from dreamshard.validation import NoPlanError  # noqa: E402

PLANNERS = {"size_lookup": {}, "dreamshard": {}, "neuroshard": {}, "torchrec": {"reservation": 0.0}}


def measure(argv: list[str]) -> None:
    """Every plan of a --plans file measured by the sequential runner (Triton TBE on the GPU here,
    comm from the shipped model), priced beside by the simulator of this GPU; OUT/measured.jsonl
    (a line a plan, as it goes: a cut call keeps what it measured) and OUT/report.md."""
    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.plan import load_plans

    ap = argparse.ArgumentParser(prog="tiers_sim.py measure")
    ap.add_argument("plans")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no new plan after this many seconds")
    ap.add_argument("--resume", help="an earlier call's measured.jsonl: its measured rows are kept and their plans not measured again (failed ones are)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernel = "triton" if args.device.startswith("cuda") else "torch"
    runner = SequentialRunner(kernel, device=args.device, warmup=3, iters=10, input_sets=3)
    sim = SimBackend()
    rows, hardware = [r for r in read_rows(args.resume) if "error" not in r] if args.resume else [], args.device
    done = {(r["setting"], r["planner"]) for r in rows}
    for plan in load_plans(args.plans):
        if (plan.notes[0], plan.planner) in done:
            continue
        if time.monotonic() - t0 > args.budget_s:
            break
        row = {"setting": plan.notes[0], "planner": plan.planner, "tiers": dict(Counter(s.tier for s in plan.shards))}
        try:
            report = runner.evaluate_plan(plan)
            row["measured_ms"], hardware = report.overall_ms, report.hardware
            row["sim_ms"] = sim.evaluate_plan(plan).overall_ms
        except Exception as e:  # noqa: BLE001 - one plan's failure is reported, the others run
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        atomic_write(out / "measured.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        print(f"[{time.monotonic() - t0:6.1f} s] {json.dumps(row)}", flush=True)
    atomic_write(out / "report.md", measured_report(rows, f"{hardware}, {kernel}", time.monotonic() - t0))
    print((out / "report.md").read_text())


def reprice(plans: str, measured: str, calibration: str) -> None:
    """Each measured row's sim_ms again, its plan priced by today's simulator with `calibration`
    (the GPU's default, named: the price the measuring GPU gives)."""
    from dreamshard.plan import load_plans

    sim = SimBackend(calibration=calibration)
    price = {(p.notes[0], p.planner): sim.evaluate_plan(p).overall_ms for p in load_plans(plans)}
    rows = read_rows(measured)
    for r in rows:
        if "measured_ms" in r:
            r["sim_ms"] = price[(r["setting"], r["planner"])]
    atomic_write(Path(measured), "".join(json.dumps(r) + "\n" for r in rows))


def read_rows(path: str) -> list[dict]:
    """The rows of a measured.jsonl."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def measured_report(rows: list[dict], hardware: str, seconds: float) -> str:
    """Per setting, each planner's measured step and TorchRec's; ours against TorchRec's."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    names = list(dict.fromkeys(r["planner"] for r in rows))
    lines = [f"# Tables at 1.5–3× HBM, measured ({hardware}; sequential runner; {seconds:.0f} s)", "",
             "Measured step in ms (the simulator of this GPU in brackets); `ours / TorchRec`: the best of our planners' measured steps over TorchRec's.", "",
             "| setting | " + " | ".join(names) + " | ours / TorchRec |", "|---|" + "---|" * (len(names) + 1)]
    for s in settings:
        got = {r["planner"]: r for r in rows if r["setting"] == s}
        cells = [f"{got[n]['measured_ms']:.3f} ({got[n]['sim_ms']:.3f})" if n in got and "measured_ms" in got[n]
                 else "failed" if n in got else "no plan" if n.startswith("torchrec") else "—" for n in names]
        ours = [r["measured_ms"] for n, r in got.items() if not n.startswith("torchrec") and "measured_ms" in r]
        theirs = [r["measured_ms"] for n, r in got.items() if n.startswith("torchrec") and "measured_ms" in r]
        ratio = f"{min(ours) / min(theirs):.3f}" if ours and theirs else "—"
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {ratio} |")
    failed = [r for r in rows if "error" in r]
    lines += [""] + [f"- failed: {r['setting']}, {r['planner']}: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["measure"]:
        measure(sys.argv[2:])
        return
    if sys.argv[1:2] == ["reprice"]:  # reprice PLANS.jsonl MEASURED.jsonl CALIBRATION: sim_ms again, by today's simulator
        reprice(*sys.argv[2:5])
        return
    if sys.argv[1:2] == ["report"]:  # report MEASURED.jsonl HARDWARE SECONDS: the measured table again
        print(measured_report(read_rows(sys.argv[2]), sys.argv[3], float(sys.argv[4])), end="")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tables", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--devices", default="2,4", help="device counts, comma-separated (one per call keeps each call short)")
    ap.add_argument("--family", default="dlrm", help="the tables' family (its pool of 856 tables, seed 12); the held-out ones: mixed, rmc, din")
    ap.add_argument("--planners", default=",".join(PLANNERS), help="of " + ", ".join(PLANNERS))
    ap.add_argument("--plans", help="append every plan made to this .jsonl file (for `measure` on a GPU)")
    args = ap.parse_args()
    chosen = {n: PLANNERS[n] for n in args.planners.split(",")}
    made = []
    device_counts = [int(x) for x in args.devices.split(",")]
    out = Path(args.out)
    pool = synth_pool(PoolConfig(tables=856, seed=12)) if args.family == "dlrm" else synth_family(args.family, 856, 12)
    sim = SimBackend()
    rows = []
    for devices in device_counts:
        for ratio in (1.5, 2.0, 3.0):
            for seed in range(args.seeds):
                rng = np.random.default_rng(1000 * devices + 10 * int(ratio * 10) + seed)
                tables = [pool[i] for i in sorted(rng.choice(len(pool), size=args.tables, replace=False))]
                total = sum(t.bytes() for t in tables)
                task = Task(tables, devices, int(total / ratio / devices), Workload(), host_memory_bytes=4 * total)
                for name, options in chosen.items():
                    t0 = time.perf_counter()
                    try:
                        plan = get_planner(name, **options).plan(task)
                        plan.notes = [f"{args.family} {devices} dev, {ratio}x HBM, draw {seed}"] + list(plan.notes)
                        made.append(plan)
                        ms = sim.evaluate_plan(plan).overall_ms
                        tiers = Counter(s.tier for s in plan.shards)
                        row = {"devices": devices, "ratio": ratio, "seed": seed, "planner": name, "sim_ms": round(ms, 4),
                               "hbm": tiers["hbm"], "uvm_caching": tiers["uvm_caching"], "uvm": tiers["uvm"]}
                    except NoPlanError as e:
                        row = {"devices": devices, "ratio": ratio, "seed": seed, "planner": name, "sim_ms": "", "error": str(e)[:200]}
                    row["planning_s"] = round(time.perf_counter() - t0, 2)
                    rows.append(row)
                    print(row, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    if args.plans:
        from dreamshard.plan import load_plans, save_plans

        save_plans((load_plans(args.plans) if Path(args.plans).is_file() else []) + made, Path(args.plans))
    fields = ["devices", "ratio", "seed", "planner", "sim_ms", "hbm", "uvm_caching", "uvm", "planning_s", "error"]
    if (out / "results.csv").is_file():  # the other device counts' rows of an earlier call are kept
        with open(out / "results.csv", newline="") as f:
            kept = [r for r in csv.DictReader(f) if int(r["devices"]) not in device_counts]
        for r in kept:
            r["devices"], r["ratio"], r["seed"] = int(r["devices"]), float(r["ratio"]), int(r["seed"])
            r["sim_ms"] = float(r["sim_ms"]) if r["sim_ms"] else ""
            r.update({k: int(r[k]) for k in ("hbm", "uvm_caching", "uvm") if r.get(k)})
        rows = kept + rows
    rows.sort(key=lambda r: (r["devices"], r["ratio"], r["seed"], list(PLANNERS).index(r["planner"])))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    names = [n for n in PLANNERS if any(r["planner"] == n for r in rows)]
    lines = ["# Tables at 1.5–3× HBM, planned with host memory (simulator numbers)", "",
             f"`PYTHONPATH=. python3 benchmarks/tiers_sim.py --out {args.out}{'' if args.family == 'dlrm' else ' --family ' + args.family}`: "
             f"{args.tables} tables of a {args.family} pool (seed 12), B = 65,536, fp16, SGD; "
             "simulated step in ms (default H200 calibration, default host link: not GPU measurements), mean over seeds; "
             "in brackets the shards in HBM / cached / uvm of the last seed. Each row draws its own tables (rows are not comparable with each other).", "",
             "| devices | bytes / HBM | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for devices in sorted({r["devices"] for r in rows}):
        for ratio in (1.5, 2.0, 3.0):
            cells = []
            for name in names:
                got = [r for r in rows if (r["devices"], r["ratio"], r["planner"]) == (devices, ratio, name)]
                ok = [r["sim_ms"] for r in got if r["sim_ms"] != ""]
                last = got[-1]
                cells.append(f"{np.mean(ok):.2f} ({last.get('hbm', '-')}/{last.get('uvm_caching', '-')}/{last.get('uvm', '-')})" if len(ok) == len(got) else f"no plan ({len(got) - len(ok)} of {len(got)})")
            lines.append(f"| {devices} | {ratio} | " + " | ".join(cells) + " |")
    atomic_write(out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
