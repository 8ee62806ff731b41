"""DreamShard on a table family it was never trained on, with no GPU: the shipped model's recipe
trained on the simulator without one training family, then that family's development tasks
planned, beside the same recipe trained on every family and `oracle`; and how each cost net
orders the family's near-optimal plans, with its cost heads' ReLU layers halved or left out.

    .venv/bin/python benchmarks/unseen_family.py                  # --family hot → results/unseen_family.md: ~15 min on a 2-core CPU
    .venv/bin/python benchmarks/unseen_family.py --family wide    # → results/unseen_family_wide.md
    .venv/bin/python benchmarks/unseen_family.py --family wide --span 96            # and the recipe with 96 span tasks in its prior
    .venv/bin/python benchmarks/unseen_family.py --family wide --span 96 --seed 1   # another training run → ..._wide_seed1.md
    .venv/bin/python benchmarks/unseen_family.py --family wide --shared-terms on --out F  # and the recipe with its cost net's shared terms

The held-out families measure this on a GPU, where the cost net's error on new tables and the
search's reach are mixed together. Here the simulator (H100 calibration) is both what the models
are trained against — the recipe of `gpu_train_shipped.py`: 60 measured plans, a prior of 4,000,
the span tables in the prior, the refinement around the search — and what prices the plans (and
a model without the span tables beside), so a model's only handicap on the
left-out family is not having seen it: what the learned policy and cut net propose there, and how
far the search gets from it. The tasks are `dev_tasks.py`'s (2 of 60 tables on 4 devices and 2 of
120 on 8, pools of seed 5, 16 GB); `oracle` anneals on the same simulator (4,000 evaluations).
Per planner: the mean of per-task ratios to the best table-wise heuristic; per model, its cost net
against the simulator on its own plans and on the oracle's. Models are written to --models and
reused when there.
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

from dev_tasks import CALIBRATION, ORACLE_BUDGET, POOL_SEED, SETTINGS, evaluate, heads_scaled, near_pairs, net_ms, ordered_right  # noqa: E402
from gpu_train_shipped import DREAMSHARD_OPTIONS, PLANNERS, config, training_tasks  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import TRAINING_FAMILIES  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402

BUDGET, PRIOR_PLANS = 60, 4_000  # the shipped recipe's (gpu_train_shipped.py)
SPAN = DREAMSHARD_OPTIONS["prior_span"]


def trained(path: Path, families: tuple[str, ...], span: int = SPAN, seed: int = 0, shared: bool | None = None) -> Path:
    """The shipped recipe on the simulator over `families`' training tasks (with `span` tasks of
    span tables in its prior, Config.prior_span; `seed` the training's; `shared`: Config.shared_terms
    in place of the recipe's), at `path` (kept if there)."""
    if path.is_file():
        return path
    sim = SimBackend(CALIBRATION)
    tasks = training_tasks(12, 300, Workload(65_536), families)
    print(f"training {path} on {len(tasks)} tasks of {', '.join(families)} (prior_span {span}, seed {seed}) ...", flush=True)
    cfg = replace(config("dreamshard", BUDGET, 65_536, PRIOR_PLANS, overrides=None if shared is None else {"shared_terms": shared}), prior_span=span, seed=seed)
    PLANNERS["dreamshard"].fit(tasks, sim, path, cfg, progress=False, prior=SimBackend(CALIBRATION))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="hot", choices=TRAINING_FAMILIES, help="the training family left out  [%(default)s]")
    ap.add_argument("--models", help="folder for the models (reused when there)  [runs/unseen_family, runs/unseen_family_seed<N> with --seed N]")
    ap.add_argument("--out", help="[benchmarks/results/unseen_family[_FAMILY][_seedN].md: the family unless hot, the seed unless 0]")
    ap.add_argument("--span", type=int, default=0, help="also the recipe without the family with this many span tasks in its prior (the recipe's: 24)")
    ap.add_argument("--shared-terms", choices=["on", "off"], help="also the recipe without the family with its cost net's shared terms on or off (Config.shared_terms)")
    ap.add_argument("--seed", type=int, default=0, help="the models' training seed (another seed: another run of the same recipe)  [%(default)s]")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    out = args.out or f"benchmarks/results/unseen_family{'' if args.family == 'hot' else '_' + args.family}{f'_seed{args.seed}' if args.seed else ''}.md"
    models = Path(args.models or f"runs/unseen_family{f'_seed{args.seed}' if args.seed else ''}")  # a model of another seed is never reused
    models.mkdir(parents=True, exist_ok=True)
    others = tuple(f for f in TRAINING_FAMILIES if f != args.family)
    without = trained(models / f"without_{args.family}.pt", others, SPAN, args.seed)
    every = trained(models / "every_family.pt", TRAINING_FAMILIES, SPAN, args.seed)
    sim = SimBackend(CALIBRATION)
    planners = {
        f"dreamshard, trained without {args.family}": get_planner("dreamshard", model=str(without)),
        f"dreamshard, trained without {args.family}, no annealing": get_planner("dreamshard", model=str(without), anneal=0),
        # its cost heads' ReLU layers halved or left out (dev_tasks.heads_scaled): what they add on a family they never saw
        f"dreamshard, trained without {args.family}, cost heads x0.5": get_planner("dreamshard", model=heads_scaled(without, 0.5)),
        f"dreamshard, trained without {args.family}, linear part": get_planner("dreamshard", model=heads_scaled(without, 0.0)),
    }
    no_span = trained(models / f"without_{args.family}_no_span.pt", others, 0, args.seed)
    planners[f"dreamshard, trained without {args.family}, no span tasks in its prior"] = get_planner("dreamshard", model=str(no_span))
    if args.span:
        more = trained(models / f"without_{args.family}_span{args.span}.pt", others, args.span, args.seed)
        planners[f"dreamshard, trained without {args.family}, {args.span} span tasks in its prior"] = get_planner("dreamshard", model=str(more))
    if args.shared_terms:
        other = trained(models / f"without_{args.family}_shared_{args.shared_terms}.pt", others, SPAN, args.seed, args.shared_terms == "on")
        planners[f"dreamshard, trained without {args.family}, shared terms {args.shared_terms}"] = get_planner("dreamshard", model=str(other))
    planners |= {
        "dreamshard, trained on every family": get_planner("dreamshard", model=str(every)),
        "oracle": get_planner("oracle", backend=sim, budget=ORACLE_BUDGET),
    }
    nets = [name for name in planners if name.startswith("dreamshard")]
    kept: list[dict] = []
    by_family, errors = evaluate(sim, planners, nets, [args.family], kept)
    ratios = {name: by_family[name][args.family] for name in planners}
    lines = [f"# DreamShard on a family it never saw: `{args.family}` ({sim.name})", "",
             f"`.venv/bin/python benchmarks/unseen_family.py --family {args.family}{f' --span {args.span}' if args.span else ''}{f' --shared-terms {args.shared_terms}' if args.shared_terms else ''}{f' --seed {args.seed}' if args.seed else ''}`: models trained on the simulator by the shipped recipe "
             f"({BUDGET} plans priced as measurements, a prior of {PRIOR_PLANS:,}), with and without `{args.family}`; {len(ratios['oracle'])} "
             f"development tasks of `{args.family}` ({' and '.join(f'{t} tables on {d} devices' for t, d in SETTINGS)}, pools of seed {POOL_SEED}); "
             "mean of per-task ratios to the best table-wise heuristic (simulated).", "",
             "| planner | mean | per task |", "|---|---:|---|"]
    for name, r in ratios.items():
        lines.append(f"| {name} | {np.mean(r) * 100:+.2f}% | " + ", ".join(f"{x * 100:+.1f}%" for x in r) + " |")
    lines += ["", "The cost net against the simulator (predicted / simulated max-device step − 1):", "",
              "| model | own plans: mean | the oracle's: mean |", "|---|---:|---:|"]
    for name in nets:
        own, orc = (np.mean(errors[name][k]) * 100 for k in ("own", "oracle's"))
        lines.append(f"| {name} | {own:+.1f}% | {orc:+.1f}% |")
    # every two of a task's distinct plans within 5% of its best, 0.5% or more apart (as heldout.py's report)
    pairs = [pair for task in kept for pair in near_pairs(list({id(p): (ms, p) for ms, p in task.values()}.values()))]
    scorers = {name: planners[name] for name in nets if "no annealing" not in name}
    lines += ["", f"Which of two plans is faster: of {len(pairs)} pairs of near-optimal plans (every two of a task's plans within 5% of its best, "
              "0.5% or more apart), those each cost net orders as the simulator does:", "", "| cost net | pairs ordered as simulated |", "|---|---:|"]
    for name, planner in scorers.items():
        right = ordered_right(pairs, lambda v, planner=planner: net_ms(planner, v[1]))
        lines.append(f"| {name} | {right} ({right / max(len(pairs), 1):.0%}) |")
    atomic_write(out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
