"""Planning past one host, by simulation: our plans beside TorchRec 1.8's planner on the same
machines of 2–128 hosts of 8 × H100 SXM (NVLink 4 inside, 8 × 400 Gb/s between hosts: the
`h100-sxm` preset, dreamshard/topology.py), priced by our simulator on that topology (two-level
collectives, costs/hierarchy.py) and by TorchRec's own estimator, with each planner's time.

    python benchmarks/topology_scale.py                       # hosts 2 and 4, and a 128-host timing row; < 2 min on one core
    python benchmarks/topology_scale.py --hosts 8 --timing-hosts "" --out DIR/h8
    python benchmarks/topology_scale.py --hosts 16 --timing-hosts "" --out DIR/h16

Table sets, per host count H (D = 8H GPUs of 80 GB):
  - `mlperf`: the 26 tables of MLPerf DLRM-DCNv2 (Criteo 1TB, dim 128; the `onehot` family's copy 0,
    as `dreamshard bench paper --suite mlperf` places them), one task;
  - `synthetic`: the DLRM-like synthetic pool (dreamshard/synth.py, seed 7) scaled with the machine:
    8 tables per GPU (128 tables on 2 hosts, 1,024 on 16), one task; the timing rows (--timing-hosts,
    our planners alone) 10,000 tables.

Planners: `lookup` (table-wise greedy), `size_lookup --split`, `neuroshard`, `dreamshard` (its
search, on by default) planned for the topology; `dreamshard (flat)`, the same planner given the task
as one host of D GPUs (its plan then priced on the real topology: what planning without the hierarchy
costs); `dreamshard (TorchRec layouts)`, the same planner with its row splits in TorchRec's layouts
alone (`Task.row_layouts`: row_wise and table_row_wise, what `plan --row-layouts torchrec` and the
drop-in `ShardingPlanner` plan), so that TorchRec's estimator can price it; TorchRec's planner given the same `Topology` (local_world_size 8, both bandwidths):
`torchrec` (table_wise) and `torchrec all` (every sharding type, its search cut at --timeout s;
left out of tasks above --torchrec-all-max-tables tables, where it plans for minutes).

Prices: `sim` our simulator (the H100 calibration `h100_triton.json` for compute; collectives in two levels,
inside a host the shipped 4 × H100 NCCL model, between hosts 50 GB/s per GPU and 5 µs per remote
host), `sim 1-host` the same plan priced as if all D GPUs were one NVLink island (what a flat model
says), `torchrec est` TorchRec's own estimate of the plan on the same Topology (its perf estimators
on our shards: `torchrec_io.dreamshard_enumerator` and `dreamshard_partitioner`; the max over ranks
of its per-shard totals). Simulator numbers are simulator numbers: nothing here was measured on GPUs.

Writes DIR/results.md, results.csv and results.json (default DIR:
benchmarks/results/topology_scale).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.hardware import describe_hardware  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402
from dreamshard.topology import PRESETS, Topology  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402

GB = 10**9
PER_GPU = 8  # synthetic tables per GPU
OURS = {"lookup": {}, "size_lookup --split": {"split": True}, "neuroshard": {}, "dreamshard": {}}
FAST = {"lookup": {}, "size_lookup --split": {"split": True}, "dreamshard --no-split": {"split": False}, "dreamshard": {}}  # the timing rows
TIMING_TABLES = 10_000  # the target: 10,000 tables for 128 hosts × 8 GPUs in 60 s on one core

# the H100 compute calibration of the committed results (the H100 default, h100_triton_large_shards.json,
# prices shards of many tables closer: docs/simulator.md)
CALIBRATION = "h100_triton.json"


def tasks_for(hosts: int, topo: Topology, sets: list[str], cache: dict, tables: int | None = None) -> list[tuple[str, Task]]:
    D = topo.devices
    out = []
    if "mlperf" in sets:
        out.append(("mlperf", Task(synth_family("onehot", 26, 0), D, topo.hbm_bytes, Workload(65_536), "mlperf dcnv2", topology=topo)))
    if "synthetic" in sets:
        n = tables or PER_GPU * D
        if n not in cache:
            cache[n] = synth_pool(PoolConfig(tables=n, seed=7))
        out.append((f"synthetic ({n:,} tables)", Task(cache[n], D, topo.hbm_bytes, Workload(65_536), "synthetic seed 7", topology=topo)))
    return out


def torchrec_estimate(plan, trp) -> float:
    """TorchRec's own estimate of `plan` on its task's topology: its planner run pinned to the
    plan (our enumerator and partitioner), no storage held back; the slowest rank's total, ms."""
    from dreamshard.torchrec_io import constraints_for, dreamshard_enumerator, dreamshard_partitioner, quiet

    task, tr = plan.task, trp.tr
    G = task.machine.gpus_per_host
    topology = task.machine.to_torchrec(hbm_cap=task.max_memory_bytes)
    batch = max(1, task.workload.batch_size // task.devices)
    pinned = constraints_for(plan, local_world_size=G)
    with quiet():
        planner = tr["EmbeddingShardingPlanner"](
            topology=topology, batch_size=batch, enumerator=dreamshard_enumerator(plan, topology, batch, pinned, G), partitioner=dreamshard_partitioner(plan),
            constraints=pinned, storage_reservation=tr["FixedPercentageStorageReservation"](0.0), stats=[], debug=False)
        planner.plan(trp.module(task), [tr["Sharder"]()])
    ranks = [0.0] * task.devices
    for so in planner._best_plan:
        for s in so.shards:
            ranks[s.rank] += s.perf.total
    return max(ranks)


def run_one(name: str, planner, task: Task, sim: SimBackend, trp, flat: bool = False, torchrec_layouts: bool = False) -> dict:
    row = {"planner": name}
    given = replace(task, topology=None) if flat else replace(task, row_layouts="torchrec") if torchrec_layouts else task
    t0 = time.perf_counter()
    try:
        plan = planner.plan(given)
    except InputError as e:  # InfeasibleError, NotExpressibleError, TorchRec's failure: one line
        row.update(plan_s=time.perf_counter() - t0, error=str(e)[:160])
        return row
    row["plan_s"] = time.perf_counter() - t0
    if flat:
        plan.task = task  # the flat plan on the real machine
    row["sim_ms"] = sim.evaluate_plan(plan).overall_ms
    row["sim_1host_ms"] = sim.evaluate_plan(replace(plan, task=replace(task, topology=None))).overall_ms
    split = plan.split_tables()
    row["split"] = len(split)
    row["row_split"] = len({plan.task.tables[s.table].name for s in plan.shards if s.is_row_shard})
    if trp is not None:
        try:
            row["torchrec_est_ms"] = torchrec_estimate(plan, trp)
        except Exception as e:  # noqa: BLE001 - TorchRec refusing a plan is a result, said in one line
            row["torchrec_est_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    if plan.predicted and plan.predicted.get("source", "").startswith("TorchRec"):
        row["own_estimate_ms"] = plan.predicted["overall_ms"]
        row["types"] = plan.predicted.get("sharding_types")
    return row


def fmt(x, spec=".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="2,4", help="host counts compared with every planner")
    ap.add_argument("--timing-hosts", default="128", help="host counts of the timing rows (our fast planners only, the synthetic set)")
    ap.add_argument("--sets", default="mlperf,synthetic")
    ap.add_argument("--preset", default="h100-sxm", choices=sorted(PRESETS))
    ap.add_argument("--timeout", type=int, default=5, help="TorchRec's own search limit (s) with every sharding type")
    ap.add_argument("--no-torchrec", action="store_true")
    ap.add_argument("--torchrec-all-max-tables", type=int, default=600, help="plan with `torchrec all` only tasks of at most this many tables")
    ap.add_argument("--out", default="benchmarks/results/topology_scale")
    args = ap.parse_args()
    sets = args.sets.split(",")
    sim = SimBackend(CALIBRATION)  # the machine simulated is of H100s: their compute and NVLink models
    trp = None
    planners = {name: get_planner(name.split(" ")[0], **opts) for name, opts in OURS.items()}
    if not args.no_torchrec:
        from dreamshard.planners.torchrec import TorchRecPlanner

        trp = TorchRecPlanner()
        planners["torchrec"] = trp
        planners["torchrec all"] = TorchRecPlanner(sharding_types="all", timeout_s=args.timeout)
    flat = get_planner("dreamshard")
    rows, cache = [], {}
    start = time.perf_counter()
    for hosts in [int(h) for h in args.hosts.split(",") if h]:
        topo = replace(PRESETS[args.preset], hosts=hosts)
        for label, task in tasks_for(hosts, topo, sets, cache):
            for name, planner in planners.items():
                if name == "torchrec all" and len(task.tables) > args.torchrec_all_max_tables:
                    rows.append({"hosts": hosts, "gpus": topo.devices, "set": label, "planner": name, "plan_s": math.nan,
                                 "error": f"not run: over --torchrec-all-max-tables {args.torchrec_all_max_tables}"})
                    continue
                rows.append({"hosts": hosts, "gpus": topo.devices, "set": label, **run_one(name, planner, task, sim, trp)})
                print(json.dumps(rows[-1]), flush=True)
            rows.append({"hosts": hosts, "gpus": topo.devices, "set": label, **run_one("dreamshard (flat)", flat, task, sim, trp, flat=True)})
            print(json.dumps(rows[-1]), flush=True)
            rows.append({"hosts": hosts, "gpus": topo.devices, "set": label, **run_one("dreamshard (TorchRec layouts)", flat, task, sim, trp, torchrec_layouts=True)})
            print(json.dumps(rows[-1]), flush=True)
    for hosts in [int(h) for h in args.timing_hosts.split(",") if h]:
        topo = replace(PRESETS[args.preset], hosts=hosts)
        for label, task in tasks_for(hosts, topo, ["synthetic"], cache, TIMING_TABLES):
            for name, opts in FAST.items():
                rows.append({"hosts": hosts, "gpus": topo.devices, "set": label, "timing": True,
                             **run_one(name, get_planner(name.split(" ")[0], **opts), task, sim, None)})
                print(json.dumps(rows[-1]), flush=True)
    total = time.perf_counter() - start
    write(rows, args, total)


def write(rows: list[dict], args, total: float) -> None:
    os.makedirs(args.out, exist_ok=True)
    machine = describe_hardware("cpu", 1)
    parts = ["python benchmarks/topology_scale.py"]
    parts += [f"--hosts {args.hosts}"] if args.hosts != "2,4" else []
    parts += [f'--timing-hosts "{args.timing_hosts}"'] if args.timing_hosts != "128" else []
    parts += [f"--sets {args.sets}"] if args.sets != "mlperf,synthetic" else []
    parts += [f"--torchrec-all-max-tables {args.torchrec_all_max_tables}"] if args.torchrec_all_max_tables != 600 else []
    parts += [f"--out {args.out}"] if args.out != "benchmarks/results/topology_scale" else []
    cmd = " ".join(parts)
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    lines = [
        "# Planning past one host (simulated)",
        "",
        f"`{cmd}` on {machine} (one process, OMP_NUM_THREADS={threads}), {total:.0f} s in all. Machine simulated: "
        f"hosts of the `{args.preset}` preset ({PRESETS[args.preset].name}). Prices are our simulator's (H100 compute calibration {CALIBRATION}, "
        "collectives in two levels: inside a host the shipped 4 × H100 NCCL model, between hosts 50 GB/s per GPU and 5 µs per remote host) "
        "and TorchRec 1.8's own estimator on the same Topology; nothing here was measured on GPUs. `sim 1-host`: the same plan priced as "
        "one NVLink island of all its GPUs. `split`: tables cut (rows: by rows).",
        "",
        "| hosts | GPUs | tables | planner | sim ms | sim 1-host ms | TorchRec est ms | split (rows) | plan s |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['hosts']} | {r['gpus']} | {r['set']} | {r['planner']} | no plan: {r['error'][:90]} | | | | {fmt(r['plan_s'], '.2f')} |")
            continue
        est = fmt(r.get("torchrec_est_ms")) if "torchrec_est_error" not in r else "refused"
        lines.append(f"| {r['hosts']} | {r['gpus']} | {r['set']} | {r['planner']} | {fmt(r['sim_ms'])} | {fmt(r['sim_1host_ms'])} | {est} | "
                     f"{r['split']} ({r['row_split']}) | {r['plan_s']:.2f} |")
    lines += ["", "Best of ours (sim) against TorchRec's best (sim), per setting:", "", "| hosts | tables | ours best | ms | TorchRec best | ms | ours ≤ TorchRec |", "|---:|---|---|---:|---|---:|---|"]
    keys = sorted({(r["hosts"], r["set"]) for r in rows if not r.get("timing")}, key=lambda k: (k[1], k[0]))
    for h, s in keys:
        group = [r for r in rows if (r["hosts"], r["set"]) == (h, s) and "sim_ms" in r and not r.get("timing")]
        ours = [r for r in group if not r["planner"].startswith("torchrec") and r["planner"] != "dreamshard (flat)"]
        theirs = [r for r in group if r["planner"].startswith("torchrec")]
        if not ours or not theirs:
            continue
        a, b = min(ours, key=lambda r: r["sim_ms"]), min(theirs, key=lambda r: r["sim_ms"])
        lines.append(f"| {h} | {s} | {a['planner']} | {a['sim_ms']:.3f} | {b['planner']} | {b['sim_ms']:.3f} | {'yes' if a['sim_ms'] <= b['sim_ms'] else 'no'} |")
    text = "\n".join(lines) + "\n"
    atomic_write(os.path.join(args.out, "results.md"), text)
    fields = ["hosts", "gpus", "set", "planner", "sim_ms", "sim_1host_ms", "torchrec_est_ms", "torchrec_est_error", "own_estimate_ms", "split", "row_split", "plan_s", "error", "timing"]
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    atomic_write(os.path.join(args.out, "results.json"), json.dumps({"rows": rows, "seconds": total, "machine": machine}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
