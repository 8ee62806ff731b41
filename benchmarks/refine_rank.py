"""The refinement's term on differences (`Config.search_rank`) with no GPU: the shipped model's
recipe trained on the simulator at several weights of the term, then the development tasks planned.

    .venv/bin/python benchmarks/refine_rank.py                                  # weights 0, 8, 32: ~20 min on a 2-core CPU
    .venv/bin/python benchmarks/refine_rank.py --truth h200_triton_tiles2.json --weights 0,8 --out runs/refine_rank_h200.md

The recipe of `gpu_train_shipped.py` (60 plans priced as measurements, a prior of 4,000 priced
by the H100 calibration, the span tables, the refinement around the search) with `search_rank`
W; the "measurements" come from the simulator with the `--truth` calibration (default: the
prior's own, so the prior is exact; another GPU's: a prior off from what is measured, as on real
hardware). Every plan of the development tasks (`dev_tasks.py`'s: 2 tasks of 60 tables on 4
devices and 2 of 120 on 8 per family, pools of seed 5) is priced by the truth; `oracle` anneals on
the prior's simulator, as the held-out campaign's does. Per model: the mean of per-task ratios to
the best table-wise heuristic; its cost net against the truth on its own plans and on the
oracle's, and the spread (standard deviation over the tasks) of the difference of those two
errors — what a search that keeps the plan its net prices lowest is misled by. Models are
written to --models and reused when there.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dev_tasks import CALIBRATION, FAMILIES, ORACLE_BUDGET, POOL_SEED, SETTINGS, TASKS, evaluate, family_table  # noqa: E402
from gpu_train_shipped import PLANNERS, config, training_tasks  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import TRAINING_FAMILIES  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402

BUDGET, PRIOR_PLANS = 60, 4_000  # the shipped recipe's (gpu_train_shipped.py)


def trained(path: Path, weight: float, truth: str) -> Path:
    """The shipped recipe with `search_rank` = `weight`, measured by the simulator of `truth`, at `path` (kept if there)."""
    if path.is_file():
        return path
    tasks = training_tasks(12, 300, Workload(65_536), TRAINING_FAMILIES)
    print(f"training {path} (search_rank {weight:g}, measured by {truth}) ...", flush=True)
    cfg = replace(config("dreamshard", BUDGET, 65_536, PRIOR_PLANS), search_rank=weight)
    PLANNERS["dreamshard"].fit(tasks, SimBackend(truth), path, cfg, progress=False, prior=SimBackend(CALIBRATION))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="0,8,32", help="values of search_rank, comma-separated  [%(default)s]")
    ap.add_argument("--truth", default=CALIBRATION, help="the calibration that prices the 'measurements' and the plans  [%(default)s: the prior's]")
    ap.add_argument("--models", default="runs/refine_rank", help="folder for the models (reused when there)")
    ap.add_argument("--out", default="benchmarks/results/refine_rank.md")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    weights = [float(w) for w in args.weights.split(",")]
    models = Path(args.models)
    models.mkdir(parents=True, exist_ok=True)
    stem = Path(args.truth).stem
    paths = {f"search_rank {w:g}": trained(models / f"rank{w:g}_{stem}.pt", w, args.truth) for w in weights}
    truth = SimBackend(args.truth)
    planners = {name: get_planner("dreamshard", model=str(p)) for name, p in paths.items()}
    planners["oracle"] = get_planner("oracle", backend=SimBackend(CALIBRATION), budget=ORACLE_BUDGET)
    ratios, errors = evaluate(truth, planners, list(paths), list(FAMILIES))
    command = "`.venv/bin/python benchmarks/refine_rank.py" + (f" --weights {args.weights}" if args.weights != "0,8,32" else "") \
        + (f" --truth {args.truth}" if args.truth != CALIBRATION else "") + "`"
    lines = [f"# The refinement's term on differences, on the simulator (measured by {truth.name}; prior and oracle: {CALIBRATION})", "",
             f"{command}: the shipped recipe trained on the simulator at each weight of `search_rank`; mean of per-task ratios to the best "
             f"table-wise heuristic, {TASKS} development tasks of {' and '.join(f'{t} tables on {d} devices' for t, d in SETTINGS)} per family "
             f"(pools of seed {POOL_SEED}).", "",
             *family_table(ratios, list(planners), list(FAMILIES))]
    lines += ["", "The cost net against the truth (predicted / priced max-device step − 1), and the spread over the tasks of the oracle's error minus its own:", "",
              "| model | own plans: mean | the oracle's: mean | spread of the difference |", "|---|---:|---:|---:|"]
    for name in paths:
        own, orc = (np.array(errors[name][k]) * 100 for k in ("own", "oracle's"))
        lines.append(f"| {name} | {own.mean():+.2f}% | {orc.mean():+.2f}% | {np.std(orc - own):.2f} points |")
    atomic_write(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
