"""The plans of the multi-GPU comm campaign (benchmarks/gpu_comm.py), made here on the CPU.

    .venv/bin/python benchmarks/comm_plans.py --devices 2,4   # ~2 min; writes benchmarks/results/gpu_comm/plans_<D>.jsonl
    .venv/bin/python benchmarks/comm_plans.py --devices 8     # the 8-GPU campaign's plans (80 tables)

A count's file is written anew: the campaigns' results refer to its plans by index, so make only
the counts whose plans are to be measured again.

One task per table family (every family of dreamshard.families, tables from pool seed 11: tables no
calibration or training saw; `mixed` is the held-out family) on 2, 4 and 8 devices (20, 40 and 80 tables,
32 GB per device, B = 65,536, fp16), planned by planners that make every plan kind: table-wise
(`lookup`), column splits (`size_lookup --split`), DreamShard's split search, NeuroShard (column
halvings) and TorchRec's planner with every sharding type (row-wise and table-row-wise among them).
The planners run here because TorchRec is not installed on the GPU machines; the GPU campaign
measures these files. A placement two planners share is kept once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard.families import FAMILIES  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.plan import save_plans  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "gpu_comm"
SETTINGS = {2: 20, 4: 40, 8: 80}  # devices → tables per task
POOL_SEED = 11
GB = 10**9
PLANNERS = {
    "lookup": {},
    "size_lookup --split": {"split": True},
    "dreamshard --split": {"split": True},
    "neuroshard": {},
    "torchrec (all types)": {"sharding_types": "all"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", required=True, help="device counts, comma-separated, of " + ", ".join(map(str, SETTINGS)))
    args = ap.parse_args()
    counts = [int(x) for x in args.devices.split(",")]
    if not set(counts) <= set(SETTINGS):
        ap.error(f"--devices: counts among {sorted(SETTINGS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for devices in counts:
        n = SETTINGS[devices]
        plans, seen = [], set()
        for family in FAMILIES:
            pool = synth_family(family, 300 if family != "onehot" else None, POOL_SEED)
            task = sample_tasks(pool, 1, (min(n, len(pool)),) * 2, devices, 32 * GB, seed=500 + devices, pool=f"{family}/{POOL_SEED}",
                                workload=Workload(65_536))[0]
            for label, options in PLANNERS.items():
                try:
                    plan = get_planner(label.split()[0], **options).plan(task)
                except InputError as e:  # TorchRec's reservation refuses some tasks the others place
                    print(f"{devices} devices  {family:9s} {label:22s} no plan: {e}", flush=True)
                    continue
                key = tuple(sorted((s.table, s.device, s.start, s.stop, s.row_start, s.row_stop) for s in plan.shards))
                if key in seen:
                    continue
                seen.add(key)
                plan.planner = label
                plan.notes = [*plan.notes, f"family {family}", f"kind {plan.kind}"]
                plans.append(plan)
                print(f"{devices} devices  {family:9s} {label:22s} {plan.kind:12s} {len(plan.shards):3d} shards", flush=True)
        save_plans(plans, OUT / f"plans_{devices}.jsonl")
        print(f"wrote {OUT / f'plans_{devices}.jsonl'}: {len(plans)} plans")


if __name__ == "__main__":
    main()
