"""What the cost net's kernel terms can say of one device's step: the shipped DreamShard net's
linear part refit to the simulator (`dev_tasks.sim_weighted`, heads left out), and the net as
shipped, against that simulator, for the first k tables of a task of each family on one device,
no GPU.

    .venv/bin/python benchmarks/shared_costs.py                 # the H200 model and calibration → results/shared_costs.md, ~1 min

The simulator charges a shard's fixed costs once (a launch, the backward's fixed part, a launch per
level and tile class: costs/sim.py) whatever the number of tables in it; the net's linear part
weighs terms summed over a device's tables, so its refit spreads those fixed costs over the tables
of the training plans it was fitted on. A device of few tables is then priced low and one of many
small tables high; the error at k tables is what a net whose features miss the shared costs gets
wrong on a family of many small tables (`din`, held out), whatever its weights. The tasks: the
held-out campaign's first task of 60 tables on 4 devices per family (`heldout.tasks_of`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dev_tasks import net_ms, sim_weighted  # noqa: E402
from heldout import CALIBRATIONS, tasks_of  # noqa: E402

from dreamshard import shipped  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import HELD_OUT_FAMILIES, TRAINING_FAMILIES  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Task  # noqa: E402

COUNTS = (1, 2, 5, 10, 20, 40, 60)
SETTING = "60 tables / 4 devices / 24 GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200", choices=sorted(CALIBRATIONS), help="whose shipped model and calibration  [%(default)s]")
    ap.add_argument("--out", default="benchmarks/results/shared_costs.md")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    calibration = CALIBRATIONS[args.gpu]
    sim = SimBackend(calibration)
    path = shipped.model_path("dreamshard", args.gpu)
    nets = {"its linear part refit to the simulator (`dev_tasks.sim_weighted`)": get_planner("dreamshard", model=sim_weighted(path, calibration)),
            "the net as shipped (its ReLU heads too)": get_planner("dreamshard", model=path)}
    lines = [f"# The net's kernel terms on one device against the simulator ({sim.calibration.label})", "",
             f"`.venv/bin/python benchmarks/shared_costs.py --gpu {args.gpu}`: the shipped {args.gpu.upper()} model, the first k tables of each "
             "family's first held-out-campaign task on one device; its price over the simulator's − 1."]
    for name, net in nets.items():
        lines += ["", f"## {name}", "", f"| family | {' | '.join(f'k = {k}' for k in COUNTS)} |", "|---|" + "---:|" * len(COUNTS)]
        for family in TRAINING_FAMILIES + HELD_OUT_FAMILIES:
            task = tasks_of(family, SETTING, 1)[0]
            cells = []
            for k in COUNTS:
                plan = get_planner("lookup").plan(Task(task.tables[:k], 1, 10**13, task.workload, task.pool))
                cells.append(f"{net_ms(net, plan) / sim.evaluate_plan(plan).overall_ms - 1:+.1%}")
            lines.append(f"| {family}{' (held out)' if family in HELD_OUT_FAMILIES else ''} | {' | '.join(cells)} |")
    atomic_write(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
