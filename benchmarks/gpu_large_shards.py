"""Shards of many tables, measured for the compute calibration: the H100 calibration was fitted to
shards of 1–12 tables (`gpu_families.py`), and the full pool's devices hold ~107 tables and 24 GB
each, where its backward is priced ~12% low (docs/tiers.md). One call on one GPU:

    PYTHONPATH=. python3 benchmarks/gpu_large_shards.py --out $OUT            # one H100, ~5 min
    .venv/bin/python benchmarks/gpu_large_shards.py --out /tmp/l --device cpu --quick   # logic check

- **fit** (`calib_records.jsonl`): `--shards` shards per training family of 16–128 tables up to 20 GB,
  from the family's calibration pool (seed 10, as gpu_families.py's);
- **validation** (`val_records.jsonl`): as many from every family's pool of seed 11, the held-out
  families' too, and the full 856-table `dlrm` pool (seed 0) placed on 8 devices of 24 GB with
  host memory by `size_lookup` (`dreamshard plan`'s default), every device's tables measured as one
  HBM shard (the tiers' own cost is gpu_tiers.py's). Never fitted.

Each record is a `calibrate.ShardRecord` (what `dreamshard calibrate --from-records` reads); the
simulator's price with the shipped calibration is printed beside each measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.calibrate import design_shards, measure_shards  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import FAMILIES, HELD_OUT_FAMILIES, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402

GB = 10**9


def full_pool_shards(quick: bool) -> list[list]:
    """The full pool's size_lookup plan (as gpu_tiers.py part 6 plans it), one list of tables per device."""
    from dreamshard.planners import get_planner
    from dreamshard.synth import PoolConfig, synth_pool

    pool = synth_pool(PoolConfig(tables=856 if not quick else 40, seed=0))
    devices, hbm = (8, 24 << 30) if not quick else (2, int(sum(t.bytes() for t in pool) / 1.5 / 2))
    task = Task(pool, devices, hbm, Workload(batch_size=65_536 if not quick else 512), host_memory_bytes=512 << 30 if not quick else 4 * hbm)
    return get_planner("size_lookup").plan(task).device_tables()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shards", type=int, default=6, help="shards per family and role")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no new shard after this many seconds")
    args = ap.parse_args()
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernel = "triton" if args.device.startswith("cuda") else "torch"
    workload = Workload(batch_size=512 if args.quick else 65_536)
    n, lo, hi, max_bytes = (1, 2, 6, 10**8) if args.quick else (args.shards, 16, 128, 20 * GB)
    runner_kw = {"warmup": 1, "iters": 2} if args.quick else {"warmup": 3, "iters": 10}
    jobs = []  # (role, family, tables)
    for role, seed in (("fit", 10), ("val", 11)):
        for family in FAMILIES:
            if role == "fit" and family in HELD_OUT_FAMILIES:
                continue
            pool = synth_family(family, seed=seed)
            # design_shards draws 1..max_tables log-uniformly; keep the draws of at least `lo` tables
            shards = [s for s in design_shards(8 * n, seed * 100 + len(family), max_bytes, max_tables=hi, pool=pool) if len(s) >= lo][:n]
            jobs += [(role, family, s) for s in shards]
        if role == "fit":  # the target next, before the other validation shards
            jobs += [("val", "dlrm full pool", s) for s in full_pool_shards(args.quick)]
    measure_jobs([(role, family, "", tables) for role, family, tables in jobs], out, args, kernel, workload, runner_kw, t0)


def measure_jobs(jobs: list[tuple[str, str, str, list]], out: Path, args, kernel: str, workload: Workload, runner_kw: dict, t0: float) -> None:
    """Each job (role "fit" or "val", family, what, tables) measured as one shard, in order, until
    args.budget_s: its record appended to OUT/calib_records.jsonl ("fit") or val_records.jsonl,
    and a row with the simulator's price of the shard beside to OUT/summary.json, both rewritten
    after every shard (a call cut by its limit keeps what it measured); a shard that fails is a
    row with its error, and the others run (gpu_search_shards.py measures its jobs so too)."""
    sim = SimBackend()
    files = {"fit": out / "calib_records.jsonl", "val": out / "val_records.jsonl"}
    lines: dict[str, list[str]] = {k: [] for k in files}
    rows = []
    for role, family, what, tables in jobs:
        if time.monotonic() - t0 > args.budget_s:
            rows.append({"role": role, "family": family, "what": what, "skipped": "budget"})
            continue
        try:
            rec = measure_shards([tables], kernel, args.device, workload, **runner_kw)[0]
        except Exception as e:  # noqa: BLE001 - one shard's failure is reported, the others run
            rows.append({"role": role, "family": family, "what": what, "tables": len(tables), "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        rec.family = family
        (sf, sb), = sim.shard_compute([tables], workload)
        lines[role].append(json.dumps(rec.to_json()))
        atomic_write(files[role], "\n".join(lines[role]) + "\n")
        row = {"role": role, "family": family, "held_out": family in HELD_OUT_FAMILIES, "what": what, "tables": len(tables),
               "dims": " ".join(str(t.dim) for t in tables), "gb": round(sum(t.bytes() for t in tables) / GB, 2),
               "fwd_ms": rec.fwd_ms, "bwd_ms": rec.bwd_ms, "sim_fwd_ms": float(sf), "sim_bwd_ms": float(sb)}
        rows.append(row)
        atomic_write(out / "summary.json", json.dumps({"device": rec.hardware, "batch": workload.batch_size, "calibration": sim.calibration.label, "rows": rows}, indent=1))
        print(f"[{time.monotonic() - t0:6.1f} s] {role} {family}{' ' + what if what else ''}: {len(tables)} tables {row['gb']} GB, fwd {rec.fwd_ms:.3f} (sim {sf:.3f}), "
              f"bwd {rec.bwd_ms:.3f} (sim {sb:.3f})", flush=True)
    print(f"done: {len(lines['fit'])} fit and {len(lines['val'])} validation shards in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
