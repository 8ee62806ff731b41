"""Tasks whose tables are 1.5–3× the devices' HBM, planned with host memory by our planners (the tier
stage) and by TorchRec's planner with UVM caching allowed, all priced by the simulator (issue 38's
second target, in simulator numbers until benchmarks/gpu_tiers.py measures such plans).

    PYTHONPATH=. python3 benchmarks/tiers_sim.py --out benchmarks/results/tiers_sim --devices 2   # ~25 s on 2 CPU cores
    PYTHONPATH=. python3 benchmarks/tiers_sim.py --out benchmarks/results/tiers_sim --devices 4   # ~40 s; adds its rows
    PYTHONPATH=. python3 benchmarks/tiers_sim.py --out benchmarks/results/tiers_sim/mixed --family mixed --devices 2   # a held-out family

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tables", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--devices", default="2,4", help="device counts, comma-separated (one per call keeps each call short)")
    ap.add_argument("--family", default="dlrm", help="the tables' family (its pool of 856 tables, seed 12); the held-out ones: mixed, rmc, din")
    args = ap.parse_args()
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
                for name, options in PLANNERS.items():
                    t0 = time.perf_counter()
                    try:
                        plan = get_planner(name, **options).plan(task)
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
    lines = ["# Tables at 1.5–3× HBM, planned with host memory (simulator numbers)", "",
             f"`PYTHONPATH=. python3 benchmarks/tiers_sim.py --out {args.out}{'' if args.family == 'dlrm' else ' --family ' + args.family}`: "
             f"{args.tables} tables of a {args.family} pool (seed 12), B = 65,536, fp16, SGD; "
             "simulated step in ms (default H200 calibration, default host link: not GPU measurements), mean over seeds; "
             "in brackets the shards in HBM / cached / uvm of the last seed. Each row draws its own tables (rows are not comparable with each other).", "",
             "| devices | bytes / HBM | " + " | ".join(PLANNERS) + " |", "|---|---|" + "---|" * len(PLANNERS)]
    for devices in sorted({r["devices"] for r in rows}):
        for ratio in (1.5, 2.0, 3.0):
            cells = []
            for name in PLANNERS:
                got = [r for r in rows if (r["devices"], r["ratio"], r["planner"]) == (devices, ratio, name)]
                ok = [r["sim_ms"] for r in got if r["sim_ms"] != ""]
                last = got[-1]
                cells.append(f"{np.mean(ok):.2f} ({last.get('hbm', '-')}/{last.get('uvm_caching', '-')}/{last.get('uvm', '-')})" if len(ok) == len(got) else f"no plan ({len(got) - len(ok)} of {len(got)})")
            lines.append(f"| {devices} | {ratio} | " + " | ".join(cells) + " |")
    atomic_write(out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
