"""Column splits on the simulator: the splitting planners against the table-wise ones on many
held-out tasks (docs/dreamshard.md, "Splitting").

    python benchmarks/splits_sim.py [--tasks 20] [--out benchmarks/results/splits_sim.md]

The four test settings of f3e71a6:benchmarks/shipped_model.py, `--tasks` held-out tasks each from the
synthetic pool's *test* half (seed 2), the
planners below, every plan priced by the simulator (H200 calibration).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.report import evaluate  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import Task, sample_tasks, split_pool  # noqa: E402

PLANNERS = {  # label → (registered name, options); the table-wise ones first
    "lookup": ("lookup", {}),
    "dreamshard --no-split": ("dreamshard", {"split": False}),
    "lookup --split": ("lookup", {"split": True}),
    "neuroshard": ("neuroshard", {}),
    "dreamshard": ("dreamshard", {}),
}
TABLE_WISE = ("lookup", "dreamshard --no-split")

# Held-out settings on the DLRM pool's test half: the paper's, and unseen table and device counts.
TEST_SETTINGS = [
    ("DLRM-80, 8 devices (paper's setting)", (80, 80), 8, 5 * 10**9),
    ("DLRM-40, 4 devices", (40, 40), 4, 5 * 10**9),
    ("DLRM-120, 8 devices (10 GB each)", (120, 120), 8, 10 * 10**9),
    ("DLRM-160, 16 devices (20 GB each; unseen table and device counts)", (160, 160), 16, 20 * 10**9),
]


def held_out_settings(tasks_per_setting: int) -> list[tuple[str, list[Task]]]:
    """(label, tasks) of the four test settings: held-out tasks (seed 2) from the synthetic pool's
    test half — the tasks this benchmark, benchmarks/oracle_gap.py and benchmarks/torchrec_planner.py
    all plan."""
    _, test_half = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    return [(label, sample_tasks(test_half, tasks_per_setting, count, devices, cap, seed=2)) for label, count, devices, cap in TEST_SETTINGS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/splits_sim.md")
    args = ap.parse_args()
    sim = SimBackend()
    planners = {label: get_planner(name, **kw) for label, (name, kw) in PLANNERS.items()}
    md = [f"Priced by the {sim.name}; `python benchmarks/splits_sim.py --tasks {args.tasks}`.", ""]
    for label, tasks in held_out_settings(args.tasks):
        res = evaluate(planners, tasks, sim)
        best_tw = np.min([res.costs(name) for name in TABLE_WISE], axis=0)
        md += [f"**{label}** ({len(tasks)} held-out tasks)", "",
               "| planner | mean ms | vs best table-wise (mean of per-task ratios) | tasks worse than best table-wise by > 1% | tasks with a split | mean planning ms |",
               "|---|---:|---:|---:|---:|---:|"]
        for name in PLANNERS:
            m = np.array(res.costs(name))
            r = m / best_tw - 1
            rows = [x for x in res.rows if x.planner == name]
            md.append(f"| {name} | {m.mean():.3f} | {r.mean():+.1%} | {int(np.sum(r > 0.01))} of {len(m)} | "
                      f"{sum(bool(x.split_tables) for x in rows)} | {np.mean([x.planning_ms for x in rows]):.0f} |")
        md.append("")
        print("\n".join(md[-len(PLANNERS) - 4 :]), flush=True)
    atomic_write(args.out, "\n".join(md))


if __name__ == "__main__":
    main()
