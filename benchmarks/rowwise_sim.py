"""Row-wise shards on the simulator: the best table-wise plan, the best plan with
column splits, the best plan with row shards, and TorchRec's own plan, all priced by the simulator.

    PYTHONPATH=. python3 benchmarks/rowwise_sim.py [--out benchmarks/results/rowwise_sim]

Settings: the onehot family (MLPerf DLRM-DCNv2's 26 Criteo tables, dim 128) on 4 and 8 devices of
24 GB, and held-out tasks where one hot table sets the step on 4 and 8 devices: 30 tables of the
`dlrm` family (pool seed 100 + k) and the `hot` family's heaviest table (dim × pooling) of a 64-table
pool of the same seed, widened to dim 128 — drawn from dlrm/hot, never from the held-out family
`mixed`. (Since the backward's product path that hot table, of a few thousand rows, is cheap: the
table that sets these tasks' table-wise step is one of the dlrm tables of heavy pooling.) Plans:

  table-wise   best of dreamshard (policy), size_lookup, lookup, torchrec table_wise
  columns      best of the above and dreamshard --split, neuroshard, size_lookup/lookup --split,
               with row moves off (the searches exactly as before row shards)
  rows         best of dreamshard --split and neuroshard with row moves (our planners; a plan
               counts here only if it has a row shard, else it is the columns plan again)
  torchrec     TorchRec 1.8's planner, every sharding type allowed (sharding_types=all), its plan
               converted to ours (row_wise → row shards)

`even spread` is what the best table-wise plan's work would cost spread perfectly evenly: its
devices' compute summed over D, plus its cheapest device's comm. Splitting a table does not make
its lookups fewer (a row shard adds launches and a collective), so where it is more than 30%
below the table-wise plan's step, the ≥ 30% target is out of reach of any split of these tables.

Every plan is priced by the simulator (H200 calibration): compute from the shards' terms (a row
shard's measured lookups and bins), the all-to-all from the NCCL fit, and the row-wise exchange by
the reduce-scatter / all-gather rule *derived from the all-to-all fit, not yet fitted*
(costs/comm.py). Writes rowwise_sim.json, rowwise_sim.md and the plans (plans/*.json) that
benchmarks/gpu_rowwise.py measures on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.packing import InfeasibleError  # noqa: E402
from dreamshard.plan import save_plans  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.scoring import PieceScorer  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402

CAP = 24 * 10**9
PRICED = "simulator; reduce-scatter/all-gather model derived from the all-to-all fit, not yet fitted"
TABLE_WISE = {"dreamshard": ("dreamshard", {"split": False}), "size_lookup": ("size_lookup", {}), "lookup": ("lookup", {}), "torchrec table_wise": ("torchrec", {})}
COLUMNS = {"dreamshard --split": ("dreamshard", {"split": True}), "neuroshard": ("neuroshard", {}),
           "size_lookup --split": ("size_lookup", {"split": True}), "lookup --split": ("lookup", {"split": True})}
ROWS = {"dreamshard --split": ("dreamshard", {"split": True}), "neuroshard": ("neuroshard", {})}
TORCHREC = ("torchrec", {"sharding_types": "all"})


def hot_task(k: int, devices: int) -> Task:
    """30 dlrm tables and the heaviest hot-family table (dim 128) of pool seed 100 + k."""
    hot = max(synth_family("hot", 64, 100 + k), key=lambda t: t.dim * t.pooling_factor)
    return Task(synth_family("dlrm", 30, 100 + k) + [replace(hot, dim=128)], devices, CAP, Workload())


def settings() -> list[tuple[str, Task]]:
    onehot = synth_family("onehot", 26, 0)
    out = [(f"onehot D={d}", Task(onehot, d, CAP, Workload())) for d in (4, 8)]
    out += [(f"hot{k} D={d}", hot_task(k, d)) for d in (4, 8) for k in range(3)]
    return out


class NoRowMoves:
    """The searches exactly as before row shards: no table is offered a row split."""

    def __enter__(self):
        self.saved = PieceScorer.row_candidates
        PieceScorer.row_candidates = lambda self, pieces, among, top: []

    def __exit__(self, *exc):
        PieceScorer.row_candidates = self.saved


def price(sim: SimBackend, plan) -> float:
    return float(sim.evaluate(plan.device_tables(), plan.workload).overall_ms)


def device_work(devices: list[dict]) -> tuple[float, float]:
    """(compute summed over the devices, the cheapest device's comm), ms, of per-device costs
    (a cost report's devices as dicts: fwd_comp_ms, bwd_comp_ms, fwd_comm_ms, bwd_comm_ms)."""
    return (sum(d["fwd_comp_ms"] + d["bwd_comp_ms"] for d in devices), min(d["fwd_comm_ms"] + d["bwd_comm_ms"] for d in devices))


def even_spread(sim: SimBackend, plan) -> float:
    """A plan's compute spread evenly over its devices, plus its cheapest device's comm (the docstring)."""
    devices = sim.evaluate(plan.device_tables(), plan.workload).devices
    compute, comm = device_work([d.__dict__ for d in devices])
    return compute / len(devices) + comm


def run_group(sim, task, group: dict, rows: bool | None) -> dict:
    """Each planner's plan and simulated step; rows=True keeps only plans with a row shard."""
    out = {}
    for label, (name, kw) in group.items():
        t0 = time.perf_counter()
        try:
            plan = get_planner(name, **kw).plan(task)
        except InfeasibleError as e:
            out[label] = {"error": str(e)}
            continue
        if rows is True and not plan.has_row_shards():
            continue
        out[label] = {"plan": plan, "ms": price(sim, plan), "seconds": time.perf_counter() - t0, "split": plan.split_tables(),
                      "row_tables": sorted({task.tables[s.table].name for s in plan.shards if s.is_row_shard})}
    return out


def best(results: dict) -> tuple[str, dict] | None:
    ok = {k: v for k, v in results.items() if "ms" in v}
    return min(ok.items(), key=lambda kv: kv[1]["ms"]) if ok else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/rowwise_sim")
    args = ap.parse_args()
    out = Path(args.out)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    sim = SimBackend()
    priced = f"{PRICED} ({sim.name}, calibration of {sim.calibration.date}; planners with the shipped cost net)"
    rows, md = [], [f"Priced by the {priced}. `PYTHONPATH=. python3 benchmarks/rowwise_sim.py`", "",
                    "| setting | table-wise best | columns best | rows best | TorchRec (all types) | rows vs table-wise | rows vs TorchRec | even spread vs table-wise | row-split tables |",
                    "|---|---|---|---|---|---|---|---|---|"]
    for label, task in settings():
        tw = run_group(sim, task, TABLE_WISE, None)
        with NoRowMoves():
            col = run_group(sim, task, COLUMNS, None)
        col.update({f"{k} (table-wise)": v for k, v in tw.items()})
        rw = run_group(sim, task, ROWS, True)
        tr = run_group(sim, task, {"torchrec all": TORCHREC}, None)
        b_tw, b_col, b_rw, b_tr = best(tw), best(col), best(rw), best(tr)
        if b_rw is None:  # no row plan chosen: the best with row moves allowed is the columns plan
            b_rw = b_col
        slug = label.replace(" ", "_").replace("=", "")
        entry = {"setting": label, "tables": len(task.tables), "devices": task.devices, "max_memory_bytes": task.max_memory_bytes}
        for kind, b in (("table_wise", b_tw), ("columns", b_col), ("rows", b_rw), ("torchrec", b_tr)):
            if b is None:
                entry[kind] = None
                continue
            name, r = b
            path = out / "plans" / f"{slug}_{kind}.json"
            save_plans([r["plan"]], path)
            entry[kind] = {"planner": name, "sim_ms": r["ms"], "split": r["split"], "row_tables": r["row_tables"], "plan": str(path.relative_to(out)),
                           "planning_s": r["seconds"]}
        if b_tw:
            entry["table_wise"]["even_spread_ms"] = even_spread(sim, b_tw[1]["plan"])
        entry["all"] = {grp: {k: ({"sim_ms": v["ms"], "row_tables": v["row_tables"]} if "ms" in v else v) for k, v in res.items()}
                        for grp, res in (("table_wise", tw), ("columns", col), ("rows", rw), ("torchrec", tr))}
        rows.append(entry)
        f = lambda k: f"{entry[k]['sim_ms']:.3f} ({entry[k]['planner']})" if entry[k] else "—"  # noqa: E731
        pct = lambda a, b: f"{(a / b - 1) * 100:+.1f}%"  # noqa: E731
        vs = lambda a, b: pct(entry[a]["sim_ms"], entry[b]["sim_ms"]) if entry[a] and entry[b] else "—"  # noqa: E731
        spread = pct(entry["table_wise"]["even_spread_ms"], entry["table_wise"]["sim_ms"]) if entry["table_wise"] else "—"
        md.append(f"| {label} | {f('table_wise')} | {f('columns')} | {f('rows')} | {f('torchrec')} | {vs('rows', 'table_wise')} | {vs('rows', 'torchrec')} | "
                  f"{spread} | {', '.join(entry['rows']['row_tables']) if entry['rows'] else ''} |")
        print(md[-1], flush=True)
    atomic_write(out / "rowwise_sim.json", json.dumps({"priced_by": priced, "settings": rows}, indent=1))
    md += ["", "ms: simulated step (max over devices of fwd + bwd compute and comm). rows best: the best plan of our planners with a row shard "
           "(if none chose one, the columns plan). even spread: the best table-wise plan's compute spread evenly over the devices plus its "
           "cheapest device's comm (the script's docstring). hotK: 30 `dlrm` tables + the heaviest `hot`-family table (dim 128), pool seed 100 + K."]
    atomic_write(out / "rowwise_sim.md", "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
