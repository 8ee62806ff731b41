"""DreamShard models against `oracle` on the development tasks: the tasks a change to the planner
or its training is chosen on, never the held-out families.

    .venv/bin/python benchmarks/dev_tasks.py                                   # the shipped model: minutes on a CPU core
    .venv/bin/python benchmarks/dev_tasks.py --model A.pt --model B.pt         # models side by side (the oracle once)
    .venv/bin/python benchmarks/dev_tasks.py --families hot --model A.pt       # one family (e.g. the one a model was trained without)

Tasks: the five *training* families but `onehot` (`families.TRAINING_FAMILIES`), pools of seed 5
(the shipped model trained on pools of seed 10), 2 tasks each of 60 tables on 4 devices and of
120 on 8, 16 GB per device, B = 65,536. Every plan priced by the simulator with the H100
calibration (the GPU the shipped model was trained on); `oracle` anneals on that simulator (4,000
evaluations per task). Per model: `dreamshard`'s mean of per-task ratios to the best table-wise
heuristic (lookup, size_lookup), per family and in all; the oracle's beside; and the model's cost
net against that simulator (its predicted max-device step over the simulated one) on its own plans
and on the oracle's: a search picks the plan its net prices lowest, so a net that prices the better
plans higher than its own keeps the search from them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import TRAINING_FAMILIES, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.plan import Plan  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402

FAMILIES = ("dlrm", "dlrm2022", "wide", "hot", "heavy")
SETTINGS = ((60, 4), (120, 8))
POOL_SEED, TASKS, MEMORY = 5, 2, 16 * 10**9
CALIBRATION = "h100_triton.json"
ORACLE_BUDGET = 4_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a DreamShard model file (repeat for several; default: the shipped model)")
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"training families to plan, of {','.join(TRAINING_FAMILIES)}  [%(default)s]")
    ap.add_argument("--out", default="benchmarks/results/dev_tasks.md")
    args = ap.parse_args()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if not families or set(families) - set(TRAINING_FAMILIES):
        ap.error(f"--families: some of {','.join(TRAINING_FAMILIES)} (development tasks are of training families only), not {args.families!r}")
    sim = SimBackend(CALIBRATION)
    models = args.model or [None]
    names = [m or "shipped" for m in models]
    planners = {name: get_planner("dreamshard", model=m) for name, m in zip(names, models)}
    planners["oracle"] = get_planner("oracle", backend=sim, budget=ORACLE_BUDGET)
    ratios, net_error = evaluate(sim, planners, names, families)
    lines = [f"# DreamShard on the development tasks ({sim.name})", "",
             "`.venv/bin/python benchmarks/dev_tasks.py " + "".join(f"--model {m} " for m in models if m)
             + (f"--families {','.join(families)} " if families != list(FAMILIES) else "") + "`: mean of per-task ratios to the best "
             f"table-wise heuristic, {TASKS} tasks of {' and '.join(f'{t} tables on {d} devices' for t, d in SETTINGS)} per family (pools of seed {POOL_SEED}).", "",
             *family_table(ratios, list(planners), families)]
    lines += ["", "The cost net against the simulator (predicted / simulated max-device step − 1) on the model's own plans and on the oracle's:", "",
              "| model | own plans: mean | own plans: mean abs | own plans: range | the oracle's: mean | the oracle's: mean abs | the oracle's: range |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        own, orc = (np.array(net_error[name][k]) * 100 for k in ("own", "oracle's"))
        lines.append(f"| {name} | {own.mean():+.1f}% | {np.abs(own).mean():.1f}% | {own.min():+.1f} to {own.max():+.1f}% | {orc.mean():+.1f}% | {np.abs(orc).mean():.1f}% | {orc.min():+.1f} to {orc.max():+.1f}% |")
    atomic_write(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


def family_table(ratios: dict, names: list[str], families: list[str]) -> list[str]:
    """Markdown rows: each of `names`' mean per-task ratio (`evaluate`'s) per family and in all."""
    lines = ["| planner | " + " | ".join(families) + " | all |", "|---|" + "---:|" * (len(families) + 1)]
    for name in names:
        cells = [f"{np.mean(ratios[name][f]) * 100:+.2f}%" for f in families]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {np.mean([r for f in families for r in ratios[name][f]]) * 100:+.2f}% |")
    return lines


def evaluate(sim: SimBackend, planners: dict, nets: list[str], families: list[str], kept: list | None = None) -> tuple[dict, dict]:
    """Every planner (`planners`, "oracle" among them) on the development tasks of `families`,
    priced by `sim`. → (planner → family → its per-task ratios to the best table-wise heuristic;
    each of `nets` (dreamshard planners) → "own" / "oracle's" → its cost net's price of its own and
    of the oracle's plans over the simulator's − 1). `kept`: each task's {planner: (simulated ms,
    plan)} appended to it."""
    ratios: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    net_error: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for family in families:
        pool = synth_family(family, 300, POOL_SEED)
        for tables, devices in SETTINGS:
            for task in sample_tasks(pool, TASKS, (tables, tables), devices, MEMORY, seed=900 + devices, workload=Workload(65_536)):
                best = min(sim.evaluate_plan(get_planner(h).plan(task)).overall_ms for h in ("lookup", "size_lookup"))
                plans = {name: planner.plan(task) for name, planner in planners.items()}
                simulated = {name: sim.evaluate_plan(plan).overall_ms for name, plan in plans.items()}
                if kept is not None:
                    kept.append({name: (simulated[name], plans[name]) for name in planners})
                for name in planners:
                    ratios[name][family].append(simulated[name] / best - 1)
                for name in nets:
                    for whose in (name, "oracle"):
                        net_error[name]["own" if whose == name else "oracle's"].append(net_ms(planners[name], plans[whose]) / simulated[whose] - 1)
                print(f"{family} {tables}/{devices}: " + ", ".join(f"{n} {ratios[n][family][-1] * 100:+.1f}%" for n in planners), flush=True)
    return ratios, net_error


def heads_scaled(path, keep: float):
    """The DreamShard model at `path` with its cost heads' ReLU layers scaled by `keep` (their last
    layers' weights and biases): 0 leaves the costs of its linear part on the kernel terms alone
    (CostNet `linear`) and the comm model; 1 is the model as trained. A probe of how the ReLU
    layers, fitted to the training families, price tables of families they never saw."""
    import torch

    from dreamshard.learned.nets import DreamShardModel

    model = DreamShardModel.load(path)
    with torch.no_grad():
        for head in model.cost_net.heads:
            head[2].weight.mul_(keep)
            head[2].bias.mul_(keep)
    return model


def random_plans(plans: int, seed: int = 0) -> tuple[list, list[np.ndarray]]:
    """`plans` random placements of the shipped recipe's training tasks, then every distinct table
    of them alone on one device: (tasks, placements), what the fits to the simulator's prices
    (`sim_weighted`, shared_costs.py) are made on, as the training's prior is."""
    from gpu_train_shipped import training_tasks

    from dreamshard.tasks import Task

    rng = np.random.default_rng(seed)
    tasks = training_tasks(12, 300, Workload(65_536), TRAINING_FAMILIES)
    chosen = [tasks[i] for i in rng.integers(len(tasks), size=plans)]
    singles = list({t: Task([t], 1, task.max_memory_bytes, task.workload, task.pool) for task in tasks for t in task.tables}.values())
    return chosen + singles, [rng.integers(t.devices, size=len(t.tables)) for t in chosen] + [np.zeros(1, np.int64)] * len(singles)


def sim_weighted(path, calibration: str, plans: int = 1000, seed: int = 0):
    """The DreamShard model at `path` with its cost heads' ReLU layers left out and its linear part
    refit to the simulator of `calibration`: the kernel terms weighed as that simulator prices
    them (`fit_linear`, as training starts it, on `plans` random placements of the shipped recipe's
    training tasks and on their tables alone, priced by the simulator), the exchanges by the comm
    model. A probe of DreamShard's search on the simulator's prices in place of its net's: the
    linear part it was shipped with has moved from them in training, and its ReLU layers misprice
    families they never saw."""
    from dreamshard.learned.dreamshard import fit_linear, measure, to_measured
    from dreamshard.learned.mdp import prepare

    model = heads_scaled(path, 0.0)
    sim = SimBackend(calibration)
    tasks, placements = random_plans(plans, seed)
    kernel_batch = model.kernel.batch_size if model.kernel is not None else 65_536
    items = []
    for task, placement, report in zip(tasks, placements, measure(sim, tasks, placements, kernel_batch)):
        m = to_measured(prepare(task, model.normalization, model.linear_features, model.kernel), placement, report)
        if task.devices == 1:
            m.device_costs[:, 2] = np.nan  # a table alone has no exchange (as the prior's singles)
        items.append(m)
    fit_linear(model.cost_net, items)
    return model


def near_pairs(plans: list[tuple], near: float = 0.05, tie: float = 0.005) -> list[tuple[tuple, tuple]]:
    """Every two of one task's plans — tuples (true cost, ...) — within `near` of its best cost and
    at least `tie` apart: the pairs a search must order right, among near-optimal plans."""
    from itertools import combinations

    best = min(v[0] for v in plans)
    good = [v for v in plans if v[0] <= best * (1 + near)]
    return [(a, b) for a, b in combinations(good, 2) if abs(a[0] / b[0] - 1) >= tie]


def ordered_right(pairs: list[tuple[tuple, tuple]], price) -> int:
    """How many of `pairs` (`near_pairs`') `price` — a function of a pair's tuple — puts in the
    order of their true costs (the tuples' first items); each tuple priced once."""
    seen: dict[int, float] = {}

    def priced(v: tuple) -> float:
        if id(v) not in seen:
            seen[id(v)] = price(v)
        return seen[id(v)]

    return sum((priced(a) < priced(b)) == (a[0] < b[0]) for a, b in pairs)


def net_ms(planner, plan: Plan) -> float:
    """The max-device step the planner's cost net predicts for `plan` (its search's scorer)."""
    from dreamshard.planners import splits
    from dreamshard.planners.scoring import PieceScorer

    pieces, devices = splits.unplaced(plan)
    return PieceScorer(planner.model, plan.task, planner.comm).predicted(pieces, np.array(devices), "")["max_device_ms"]


if __name__ == "__main__":
    main()
