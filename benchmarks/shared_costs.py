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

Beside them, what would fix it: linear fits of each device's compute (non-negative least squares on
relative error, as `dreamshard calibrate`; 1,000 random placements of the shipped recipe's
training tasks and their tables alone, priced by the simulator) on the net's kernel terms summed
over the device's tables, with one fixed term a device with tables pays once, and with the
simulator's six shard terms (`sim.shard_terms`' SHARD_TERMS: launch, active, launches per tile
class, the wide path's programs and gradient bytes, the forward's branches).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from dev_tasks import net_ms, random_plans, sim_weighted  # noqa: E402
from heldout import CALIBRATIONS, tasks_of  # noqa: E402

from dreamshard import shipped  # noqa: E402
from dreamshard.costs.sim import SimBackend, shard_terms  # noqa: E402
from dreamshard.costs.terms import SHARD_TERMS, TERMS  # noqa: E402
from dreamshard.families import HELD_OUT_FAMILIES, TRAINING_FAMILIES  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402

COUNTS = (1, 2, 5, 10, 20, 40, 60)
SETTING = "60 tables / 4 devices / 24 GB"


def device_rows(model, sim: SimBackend, tables: list, workload: Workload) -> np.ndarray:
    """One device's features for the fits: the net's kernel terms (`CostNet.linear_inputs`)
    summed over its tables, 1 (its fixed term), and the simulator's shard terms of those tables."""
    import torch

    with torch.no_grad():
        summed = model.cost_net.linear_inputs(torch.from_numpy(model.features(tables, workload).astype(np.float32))).numpy().sum(0)
    dims = np.array([t.dim for t in tables], np.float64)
    shard = shard_terms(sim.table_terms(tables, workload), np.zeros(len(tables), np.int64), 1, dims, workload)[0, [TERMS.index(n) for n in SHARD_TERMS]]
    return np.concatenate([summed, [1.0], shard])


def fits(model, sim: SimBackend, plans: int = 1000, seed: int = 0) -> dict[str, tuple[slice, np.ndarray]]:
    """The two fits of the module docstring: name → (the columns of `device_rows` it uses, its [columns, 2] weights for fwd and bwd)."""
    from scipy.optimize import nnls

    X, Y = [], []
    for task, placement in zip(*random_plans(plans, seed)):
        costs = sim.costs_batch(task.tables, placement[None, :], task.devices, task.workload)[0]
        for d in np.unique(placement):
            X.append(device_rows(model, sim, [t for t, q in zip(task.tables, placement) if q == d], task.workload))
            Y.append(costs[d, [0, 3]])
    X, Y = np.array(X), np.array(Y)
    terms = X.shape[1] - 1 - len(SHARD_TERMS)
    out = {}
    for name, cols in (("the kernel terms and a fixed term per device", slice(0, terms + 1)), ("the kernel terms and the simulator's shard terms", slice(0, terms + 1 + len(SHARD_TERMS)))):
        weights = []
        for c in range(2):
            ok = Y[:, c] > 1e-9
            weights.append(nnls(X[ok, cols] / Y[ok, c : c + 1], np.ones(int(ok.sum())))[0])  # relative error
        out[name] = (cols, np.stack(weights, 1))
    return out


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
    shipped_net, refit = get_planner("dreamshard", model=path), get_planner("dreamshard", model=sim_weighted(path, calibration))

    def one_device(tables, workload):
        return get_planner("lookup").plan(Task(tables, 1, 10**13, workload))

    # each: (tables, workload) → one device's step, ms
    prices = {"the net as shipped (its ReLU heads too)": lambda t, w: net_ms(shipped_net, one_device(t, w)),
              "its linear part refit to the simulator (`dev_tasks.sim_weighted`)": lambda t, w: net_ms(refit, one_device(t, w))}
    for name, (cols, weights) in fits(shipped_net.model, sim).items():
        prices[f"a linear fit on {name}"] = lambda t, w, cols=cols, weights=weights: float((device_rows(shipped_net.model, sim, t, w)[cols] @ weights).sum())
    lines = [f"# The net's kernel terms on one device against the simulator ({sim.calibration.label})", "",
             f"`.venv/bin/python benchmarks/shared_costs.py --gpu {args.gpu}`: the shipped {args.gpu.upper()} model, the first k tables of each "
             "family's first held-out-campaign task on one device; its price over the simulator's − 1."]
    for name, price in prices.items():
        lines += ["", f"## {name}", "", f"| family | {' | '.join(f'k = {k}' for k in COUNTS)} |", "|---|" + "---:|" * len(COUNTS)]
        for family in TRAINING_FAMILIES + HELD_OUT_FAMILIES:
            task = tasks_of(family, SETTING, 1)[0]
            cells = []
            for k in COUNTS:
                tables = task.tables[:k]
                cells.append(f"{price(tables, task.workload) / sim.evaluate_plan(one_device(tables, task.workload)).overall_ms - 1:+.1%}")
            lines.append(f"| {family}{' (held out)' if family in HELD_OUT_FAMILIES else ''} | {' | '.join(cells)} |")
    atomic_write(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
