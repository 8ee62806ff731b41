"""The plans of the held-out planner campaign (benchmarks/gpu_heldout.py), made here on the CPU.

    .venv/bin/python benchmarks/heldout_plans.py              # ~10 min; writes benchmarks/results/gpu_heldout/plans.jsonl
    .venv/bin/python benchmarks/heldout_plans.py --quick --out /tmp/hp   # logic check: one task, a few planners

Tasks of every held-out family (`families.HELD_OUT_FAMILIES`: tables no calibration, training
or tuning saw; pools of seed 11), chosen by seed before any plan was looked at: TASKS tasks per
setting, 60 tables on 4 devices at 24 GB and 120 tables on 8 devices at 16 GB, B = 65,536, fp16.
Every planner of the registry plans every task with its defaults (the shipped models) — the
heuristics with and without --split, `dreamshard` (its search) and `dreamshard --no-split`,
`neuroshard`, `oracle` on the simulator, `torchrec` with every sharding type, `autoshard`, `rnn`.
The planners run here because TorchRec is not installed on the GPU machines; the GPU campaign
measures this file. A placement several planners share is written once, naming them all
("planners ..." in its notes). Each plan's notes also carry its family, setting, task, planning
time on this machine and, for the planners with a cost net, the net's prediction and the
search's chosen candidate; the simulator's price is added by the report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import HELD_OUT_FAMILIES, synth_family  # noqa: E402
from dreamshard.plan import save_plans  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "gpu_heldout"
GB = 10**9
POOL_SEED, POOL_TABLES = 11, 400
SETTINGS = {"60 tables / 4 devices / 24 GB": (60, 4, 24 * GB), "120 tables / 8 devices / 16 GB": (120, 8, 16 * GB)}
TASKS = 3
HEURISTICS = ("random", "size", "dim", "lookup", "size_lookup")
PLANNERS: dict[str, tuple[str, dict]] = {
    "dreamshard": ("dreamshard", {}),
    "dreamshard --no-split": ("dreamshard", {"split": False}),
    "neuroshard": ("neuroshard", {}),
    "oracle (simulator)": ("oracle", {"backend": "sim"}),
    "torchrec (all types)": ("torchrec", {"sharding_types": "all"}),
    "autoshard": ("autoshard", {}),
    "rnn": ("rnn", {}),
    **{h: (h, {}) for h in HEURISTICS},
    **{f"{h} --split": (h, {"split": True}) for h in HEURISTICS},
}


def plan_kind(plan) -> str:
    """table-wise, columns, rows or rows+columns: the shard kinds the plan holds beside whole tables."""
    rows = any(s.row_stop is not None for s in plan.shards)
    cols = any(s.start > 0 or s.stop < plan.task.tables[s.table].dim for s in plan.shards)
    return "rows+columns" if rows and cols else "rows" if rows else "columns" if cols else "table-wise"


def tasks_of(family: str, setting: str, count: int):
    tables, devices, memory = SETTINGS[setting]
    pool = synth_family(family, POOL_TABLES, POOL_SEED)
    seed = 700 + devices  # fixed before any plan was made
    return sample_tasks(pool, count, (min(tables, len(pool)),) * 2, devices, memory, seed=seed, pool=f"{family}/{POOL_SEED}", workload=Workload(65_536))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--quick", action="store_true", help="one task of one family and setting, six planners (a logic check)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = HELD_OUT_FAMILIES[:1] if args.quick else HELD_OUT_FAMILIES
    settings = list(SETTINGS)[:1] if args.quick else list(SETTINGS)
    labels = ["dreamshard", "dreamshard --no-split", "neuroshard", "lookup", "size_lookup", "lookup --split"] if args.quick else list(PLANNERS)
    planners = {}
    for label in labels:
        name, options = PLANNERS[label]
        options = {**options, "backend": SimBackend()} if options.get("backend") == "sim" else options
        try:
            planners[label] = get_planner(name, **options)
        except InputError as e:  # e.g. a learned peer with no shipped model
            print(f"skipped {label}: {e}", flush=True)
    plans = []
    for family in families:
        for setting in settings:
            for t, task in enumerate(tasks_of(family, setting, 1 if args.quick else TASKS)):
                seen: dict[tuple, object] = {}
                for label, planner in planners.items():
                    t0 = time.perf_counter()
                    try:
                        plan = planner.plan(task)
                    except InputError as e:  # TorchRec's reservation refuses some tasks the others place
                        print(f"{family:10s} {setting} task {t} {label:22s} no plan: {e}", flush=True)
                        continue
                    ms = (time.perf_counter() - t0) * 1e3
                    key = tuple(sorted((s.table, s.device, s.start, s.stop, s.row_start, s.row_stop) for s in plan.shards))
                    what = [f"planner {label}", f"planning_ms {label} {ms:.1f}"]
                    if plan.predicted and plan.predicted.get("candidate"):
                        what.append(f"candidate {label} {plan.predicted['candidate']}")
                    if plan.predicted and "max_device_ms" in plan.predicted:  # a cost net's prediction
                        what.append(f"predicted_ms {label} {plan.predicted['max_device_ms']:.4f}")
                    if key in seen:
                        seen[key].notes += what
                        continue
                    plan.planner = label
                    plan.notes = [f"family {family}", f"setting {setting}", f"task {t}", f"kind {plan_kind(plan)}", *what, *(f"note {label}: {n}" for n in plan.notes)]
                    seen[key] = plan
                    plans.append(plan)
                    print(f"{family:10s} {setting} task {t} {label:22s} {plan_kind(plan):12s} {ms:8.1f} ms", flush=True)
                save_plans(plans, out / "plans.jsonl")  # after every task: a cut run keeps what it planned
    print(f"wrote {out / 'plans.jsonl'}: {len(plans)} plans")


if __name__ == "__main__":
    main()
