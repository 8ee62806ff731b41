"""The simulator against real measurements, family by family: one time-boxed GPU campaign.

    PYTHONPATH=. python benchmarks/gpu_families.py --out $OUT                      # one H200, ≤ 8 min
    PYTHONPATH=. python benchmarks/gpu_families.py --out /tmp/f --device cpu --quick  # logic check, seconds

For every table family (dreamshard/families.py; the held-out ones included, marked) it draws shards
from the family's pools — single tables and fused shards of 1–12 tables (calibrate.design_shards,
fixed seeds) — measures each with our Triton TBE through the sequential runner's protocol (the path
`dreamshard calibrate` measures with), prices each with the simulator (the shipped calibration, or
--calibration), and then measures whole table-wise plans (lookup-greedy and the shipped DreamShard
model, on 4 and 8 devices) the same way, device by device, the all-to-all from the shipped comm model.

Two pools per family: shards from pool seed 10 are for calibration (training families only: the
held-out families are never in them), shards from pool seed 11 and every placement are for validation.
Written as it goes (a run cut short keeps everything measured so far):
  calib_records.jsonl  ShardRecords to fit from:  dreamshard calibrate --backend triton --device cuda
                       --from-records calib_records.jsonl --comm-model dreamshard/data/comm/h200_nccl.json --out FILE
  val_records.jsonl    ShardRecords to validate:  dreamshard calibrate --validate FILE --from-records val_records.jsonl
  shards.csv           one line per measured shard (family, role, shape bucket, measured and simulated fwd/bwd ms)
  placements.csv       one line per measured plan (family, setting, planner, measured and simulated overall ms)
  summary.json         calibrate.validation_report of everything measured so far (per family, per bucket), errors, timing
Time-boxed: no new shard after --shard-share of --budget-s, no new plan after --budget-s; the
rounds visit the families in turn, so a cut leaves every family about equally measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.calibrate import MAX_SHARD_BYTES, ShardRecord, design_shards, takes_product_path, validation_report  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import FAMILIES, HELD_OUT_FAMILIES, shard_bucket, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.tasks import Task, Workload, sample_tasks, split_pool  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402

POOL_SEEDS = {"calib": 10, "val": 11}
PLANNERS = ("lookup", "dreamshard")
SETTINGS = ((40, 4), (80, 8))  # (tables, devices) of the whole plans
SHARD_COLUMNS = ["family", "held_out", "role", "pool_seed", "tables", "dims", "rows", "pooling", "bucket_dim", "bucket_hits", "bucket_pooling",
                 "measured_fwd_ms", "measured_bwd_ms", "sim_fwd_ms", "sim_bwd_ms", "placement", "device"]
PLACEMENT_COLUMNS = ["placement", "family", "held_out", "tables", "devices", "max_memory_bytes", "planner", "measured_ms", "sim_ms", "measured_compute_ms", "sim_compute_ms"]


class Campaign:
    """Measures, prices and writes: one object so the time box and the files live in one place."""

    def __init__(self, args: argparse.Namespace) -> None:
        from dreamshard.costs.runners import SequentialRunner

        self.args, self.t0 = args, time.monotonic()
        self.workload = Workload(args.batch_size)
        self.runner = SequentialRunner(args.kernel, device=args.device, warmup=args.warmup, iters=args.iters)
        self.sim = SimBackend(args.calibration)
        self.records: list[ShardRecord] = []
        self.counts = {(f, role): 0 for f in FAMILIES for role in POOL_SEEDS}  # single shards measured, by family and role
        self.plans: list[dict] = []
        self.errors: list[str] = []
        os.makedirs(args.out, exist_ok=True)
        self.files = {name: open(os.path.join(args.out, name), "w", newline="") for name in ("calib_records.jsonl", "val_records.jsonl", "shards.csv", "placements.csv")}
        self.shard_csv = csv.DictWriter(self.files["shards.csv"], SHARD_COLUMNS)
        self.plan_csv = csv.DictWriter(self.files["placements.csv"], PLACEMENT_COLUMNS)
        self.shard_csv.writeheader()
        self.plan_csv.writeheader()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {text}", flush=True)

    def measure(self, shards, family: str, role: str, pool_seed: int, placement: int | None = None) -> list[ShardRecord] | None:
        """Measure one placement (a list of shards, one per device), price it, write its lines; None on failure."""
        try:
            report = self.runner.evaluate(shards, self.workload)
        except Exception as e:  # noqa: BLE001 - one failing shard (out of memory, a kernel error) must not end the campaign
            self.errors.append(f"{family} {role} {[len(s) for s in shards]} tables: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            self.log(f"FAILED: {self.errors[-1]}")
            traceback.print_exc(limit=3)
            self._free()
            return None
        simulated = self.sim.shard_compute(shards, self.workload)
        out = []
        for d, (shard, cost, (sf, sb)) in enumerate(zip(shards, report.devices, simulated)):
            rec = ShardRecord(list(shard), self.workload.batch_size, self.workload.precision, self.workload.optimizer, cost.fwd_comp_ms, cost.bwd_comp_ms,
                              placement, d if placement is not None else None, report.hardware, report.details.get("versions"), family,
                              takes_product_path(self.args.kernel))
            out.append(rec)
            self.files["calib_records.jsonl" if role == "calib" else "val_records.jsonl"].write(json.dumps(rec.to_json()) + "\n")
            b = shard_bucket(shard, self.workload.batch_size)
            self.shard_csv.writerow({"family": family, "held_out": family in HELD_OUT_FAMILIES, "role": role, "pool_seed": pool_seed, "tables": len(shard),
                                     "dims": " ".join(str(t.dim) for t in shard), "rows": " ".join(str(t.rows) for t in shard),
                                     "pooling": " ".join(f"{t.pooling_factor:g}" for t in shard), "bucket_dim": b["dim"], "bucket_hits": b["hits"],
                                     "bucket_pooling": b["pooling"], "measured_fwd_ms": round(cost.fwd_comp_ms, 5), "measured_bwd_ms": round(cost.bwd_comp_ms, 5),
                                     "sim_fwd_ms": round(float(sf), 5), "sim_bwd_ms": round(float(sb), 5), "placement": placement, "device": rec.device})
        self.records += out
        if placement is None:
            self.counts[(family, role)] += 1
        for f in self.files.values():
            f.flush()
        self._free()
        return out

    def _free(self) -> None:
        if self.args.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def write_summary(self, phase: str) -> None:
        measured = [r for r in self.records if r.tables]
        summary = {"phase": phase, "elapsed_s": round(self.elapsed(), 1), "batch_size": self.workload.batch_size, "kernel": self.args.kernel,
                   "device": self.args.device, "held_out_families": list(HELD_OUT_FAMILIES), "calibration": self.sim.calibration.label,
                   "shards": {f: {role: self.counts[(f, role)] for role in POOL_SEEDS} for f in FAMILIES},
                   "plans": self.plans, "errors": self.errors}
        if len(measured) >= 3:
            summary["simulator_vs_measured"] = validation_report(self.sim.calibration, measured)
        atomic_write(os.path.join(self.args.out, "summary.json"), json.dumps(summary, indent=1, default=str))

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def family_pools(args) -> dict[tuple[str, str], list]:
    n = args.pool_tables
    return {(f, role): synth_family(f, n, seed) for f in FAMILIES for role, seed in POOL_SEEDS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--kernel", help="[default: triton on cuda, torch on cpu]")
    ap.add_argument("--quick", action="store_true", help="a tiny configuration that checks the logic in seconds (CPU)")
    ap.add_argument("--budget-s", type=float, help="stop starting new plans after this many seconds [default: 440; quick: 60]")
    ap.add_argument("--shard-share", type=float, default=0.6, help="share of the budget for shards; plans get the rest")
    ap.add_argument("--shards", type=int, help="shards per family and role at most [default: 60; quick: 1]")
    ap.add_argument("--batch-size", type=int, help="[default: 65536; quick: 256]")
    ap.add_argument("--iters", type=int, help="[default: 10; quick: 1]")
    ap.add_argument("--warmup", type=int, help="[default: 3; quick: 0]")
    ap.add_argument("--calibration", help="simulator calibration to price with [default: the shipped one]")
    args = ap.parse_args()
    q = args.quick
    args.kernel = args.kernel or ("triton" if args.device == "cuda" else "torch")
    args.budget_s = args.budget_s or (60.0 if q else 440.0)
    args.shards = args.shards or (1 if q else 60)
    args.batch_size = args.batch_size or (256 if q else 65_536)
    args.iters = args.iters or (1 if q else 10)
    args.warmup = args.warmup if args.warmup is not None else (0 if q else 3)
    args.pool_tables = 60 if q else None  # None: each family's own pool size
    cap = 64 * 2**20 if q else MAX_SHARD_BYTES[args.device]
    settings = ((6, 2),) if q else SETTINGS
    planners = ("lookup",) if q else PLANNERS

    camp = Campaign(args)
    camp.log(f"{args.kernel} on {args.device}, B={args.batch_size}, budget {args.budget_s:.0f} s, held-out families {', '.join(HELD_OUT_FAMILIES)}")
    pools = family_pools(args)
    camp.log(f"pools synthesized: {len(pools)}")
    designed = {(f, role): design_shards(args.shards, POOL_SEEDS[role] + 1000 * i, cap, max_tables=12, pool=pools[(f, role)])
                for i, f in enumerate(FAMILIES) for role in POOL_SEEDS if not (role == "calib" and f in HELD_OUT_FAMILIES)}
    shard_deadline = args.budget_s * args.shard_share
    try:
        # shards: round j measures the j-th shard of every family and role, so a cut keeps them balanced
        for j in range(args.shards):
            if camp.elapsed() > shard_deadline:
                camp.log(f"shard budget spent after {j} rounds")
                break
            for (f, role), shards in designed.items():
                camp.measure([shards[j]], f, role, POOL_SEEDS[role])
            camp.write_summary(f"shards, round {j + 1}")
            camp.log(f"round {j + 1}: {len(camp.records)} shards measured")
        # whole table-wise plans, from the validation pools' test halves (tables no model trained on)
        from dreamshard.planners import get_planner

        planner_objs = {p: get_planner(p, **({"split": False} if p == "dreamshard" else {})) for p in planners}  # whole placements
        placement = 0
        for count, devices in settings:
            for f in FAMILIES:
                _, half = split_pool([t for t in pools[(f, "val")] if t.bytes() <= cap // 2], 0)
                task = None
                k = min(count, len(half))  # none at all where every table is over half the cap (rmc's under --quick's 64 MiB)
                while task is None and k >= 2:
                    try:
                        task = sample_tasks(half, 1, (k, k), devices, cap, seed=7, workload=camp.workload)[0]
                    except InputError:
                        k //= 2  # a family of huge tables (onehot) may not fit `count` of them under the cap
                if task is None:
                    camp.errors.append(f"{f}: no placeable task of {count} tables on {devices} devices under {cap:,} B")
                    continue
                for p, planner in planner_objs.items():
                    if camp.elapsed() > args.budget_s:
                        raise TimeoutError
                    plan = planner.plan(Task(task.tables, devices, cap, camp.workload))
                    shards = plan.device_tables()
                    got = camp.measure(shards, f, "val", POOL_SEEDS["val"], placement)
                    if got:
                        sim = camp.sim.evaluate(shards, camp.workload)
                        meas = max(r.fwd_ms + r.bwd_ms + d.fwd_comm_ms + d.bwd_comm_ms for r, d in zip(got, sim.devices))
                        row = {"placement": placement, "family": f, "held_out": f in HELD_OUT_FAMILIES, "tables": len(task.tables), "devices": devices,
                               "max_memory_bytes": cap, "planner": p, "measured_ms": round(meas, 5), "sim_ms": round(sim.overall_ms, 5),
                               "measured_compute_ms": round(max(r.fwd_ms + r.bwd_ms for r in got), 5),
                               "sim_compute_ms": round(max(d.fwd_comp_ms + d.bwd_comp_ms for d in sim.devices), 5)}
                        camp.plans.append(row)
                        camp.plan_csv.writerow(row)
                        camp.files["placements.csv"].flush()
                        camp.log(f"plan {placement}: {f} {len(task.tables)} tables / {devices} devices, {p}: measured {meas:.3f} ms, simulated {sim.overall_ms:.3f} ms")
                    placement += 1
                camp.write_summary(f"plans, {count} tables / {devices} devices")
    except TimeoutError:
        camp.log("budget spent: no more plans")
    finally:
        camp.write_summary("done")
        camp.close()
    camp.log(f"done: {len(camp.records)} shard measurements, {len(camp.plans)} plans, {len(camp.errors)} errors; wrote {args.out}")


if __name__ == "__main__":
    main()
