"""Shards the planners' searches make, measured for the compute calibration. The simulator and the
cost net price the plans of a search lower than they measure, the more so the more it cuts tables
into columns (heldout.py's report), because a search keeps what its price underrates: the devices
of the development tasks' search plans measured 7.6% above the simulator, random shards of the
same families 2%. One call, one GPU:

    PYTHONPATH=. python3 benchmarks/gpu_search_shards.py --out $OUT --fit-plans F.jsonl.gz [--plans P.jsonl.gz]   # one H200, ≤ 8 min
    .venv/bin/python benchmarks/gpu_search_shards.py --out /tmp/c --device cpu --quick --fit-plans F.jsonl.gz   # logic check

- **fit** (`calib_records.jsonl`): every device of the plans in `--fit-plans` (`heldout.py plan
  --calib`: the search planners' plans of tasks from the training families' calibration pools,
  seed 10), then `--pairs` pairs per training family from the same pools: a shard
  (`calibrate.design_shards`, 2–24 tables) measured as drawn and again with its most looked-up
  tables (one to four) each replaced by one of their column pieces (`plan.column_cuts` into 2 or
  4, as the planners cut);
- **validation** (`val_records.jsonl`): every device of the plans in `--plans` (e.g. the
  development tasks' plans) that cut `--min-cuts` tables or more, and half as many pairs from every
  family's pool of seed 11, the held-out families' too. Never fitted.
Pairs visit the families in turn, so a cut-short call leaves every family about equally measured;
every file is rewritten after each shard. The simulator's price (the shipped calibration) is
written beside each measurement in `summary.json`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.calibrate import design_shards  # noqa: E402
from dreamshard.families import FAMILIES, TRAINING_FAMILIES, synth_family  # noqa: E402
from dreamshard.plan import column_cuts, load_plans  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402
from dreamshard.validation import DIM_MULTIPLE  # noqa: E402
from gpu_large_shards import GB, measure_jobs  # noqa: E402  (the same loop: a shard at a time, records and summary rewritten after each)


def with_pieces(tables: list, rng: np.random.Generator) -> list:
    """The shard with its 1–4 most looked-up tables (that can be cut) each replaced by one of its
    column pieces, 2 or 4 parts."""
    cuttable = [i for i, t in enumerate(tables) if t.dim >= 2 * DIM_MULTIPLE]
    order = sorted(cuttable, key=lambda i: -tables[i].pooling_factor * tables[i].dim)
    out = list(tables)
    for i in order[: int(rng.integers(1, 5))]:
        t = tables[i]
        parts = int(rng.choice([p for p in (2, 4) if p <= t.dim // DIM_MULTIPLE]))
        a, b = column_cuts(t.dim, parts)[int(rng.integers(parts))]
        out[i] = replace(t, name=f"{t.name}[{a}:{b}]", dim=b - a)
    return out


def pairs(family: str, seed: int, n: int, max_bytes: int, max_tables: int) -> list[tuple[list, list]]:
    rng = np.random.default_rng(seed * 1000 + len(family))
    drawn = [s for s in design_shards(6 * n, seed * 100 + len(family) + 7, max_bytes, max_tables=max_tables, pool=synth_family(family, seed=seed))
             if len(s) >= 2 and any(t.dim >= 2 * DIM_MULTIPLE for t in s)][:n]
    return [(s, with_pieces(s, rng)) for s in drawn]


def plan_shards(path: str, min_cuts: int = 0, quick: bool = False) -> list[tuple[str, str, list]]:
    """(family, plan label, a device's tables) of every device of every plan in the file that cuts
    at least `min_cuts` tables into columns (and has no row pieces); `quick`: the tables cut to
    4,096 rows (a logic check on a CPU)."""
    from gpu_comm import shrunk

    out = []
    for plan in map(shrunk, load_plans(path)) if quick else load_plans(path):
        if plan.has_row_shards() or len(plan.column_cut_tables()) < min_cuts:
            continue
        notes = dict(n.split(" ", 1) for n in plan.notes if " " in n)
        label = f"{notes.get('family', '?')} {notes.get('setting', '?')} task {notes.get('task', '?')} {plan.planner}"
        out += [(notes.get("family"), f"{label} device {d}", tables) for d, tables in enumerate(plan.device_tables()) if tables]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fit-plans", help="a plans file (heldout.py plan --calib): every device of its plans measured to fit, first")
    ap.add_argument("--pairs", type=int, default=8, help="pairs per training family to fit, after those (half as many per family to validate; 0: none)")
    ap.add_argument("--plans", help="a plans file (heldout.py plan): its devices measured to validate, last")
    ap.add_argument("--min-cuts", type=int, default=3, help="the plans' devices measured: those of plans cutting at least this many tables")
    ap.add_argument("--budget-s", type=float, default=420.0, help="no new shard after this many seconds")
    args = ap.parse_args()
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernel = "triton" if args.device.startswith("cuda") else "torch"
    workload = Workload(batch_size=512 if args.quick else 65_536)
    n, max_bytes, max_tables = (min(args.pairs, 1), 10**8, 6) if args.quick else (args.pairs, 8 * GB, 24)
    runner_kw = {"warmup": 1, "iters": 2} if args.quick else {"warmup": 3, "iters": 10}
    queues = {(role, f): [(role, f, f"pair {i} {kind}", s) for i, pair in enumerate(pairs(f, seed, k, max_bytes, max_tables)) for kind, s in zip(("whole", "pieces"), pair)]
              for role, seed, k, fams in (("fit", 10, n, TRAINING_FAMILIES), ("val", 11, (n + 1) // 2, tuple(FAMILIES)))
              for f in fams}
    jobs = []
    if args.fit_plans:
        jobs += [("fit", f, label, tables) for f, label, tables in plan_shards(args.fit_plans, quick=args.quick)][: 4 if args.quick else None]
    while any(queues.values()):  # a pair at a time from each family in turn
        for q in queues.values():
            jobs += q[:2]
            del q[:2]
    if args.plans:
        jobs += [("val", f, label, tables) for f, label, tables in plan_shards(args.plans, args.min_cuts, args.quick)][: 4 if args.quick else None]
    measure_jobs(jobs, out, args, kernel, workload, runner_kw, t0)


if __name__ == "__main__":
    main()
