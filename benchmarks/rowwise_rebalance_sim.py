"""How much of a row-wise plan's imbalance is search (CPU, simulator; issue 13, docs/rowwise.md).

    PYTHONPATH=. python benchmarks/rowwise_rebalance_sim.py [PLAN_NAME ...]   # default: every row plan and two column plans

From a plan file of benchmarks/rowwise_sim.py, moves whole table-wise or column pieces (never a row
block) one at a time to another device while the device costs, sorted from the slowest, get
lexicographically smaller — so a move that relieves one of several tied slowest devices counts,
where a move judged by the step alone does not — within memory. Twice: judged by the simulator
(how far the plan is from a plain local optimum of the simulator's price), and judged by the
shipped model's cost net (what a planner, which may not call a backend, could do that way); both
results priced by the simulator.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.learned.nets import DreamShardModel  # noqa: E402
from dreamshard.plan import Plan, Shard, load_plans  # noqa: E402
from dreamshard.planners.scoring import PieceScorer  # noqa: E402
from dreamshard.validation import PlanError  # noqa: E402

PLANS = Path(__file__).resolve().parent / "results" / "rowwise_sim" / "plans"


def priced(sim: SimBackend, plan: Plan) -> tuple[float, list[float]]:
    """(step, device totals from the slowest), ms, by the simulator."""
    r = sim.evaluate(plan.device_tables(), plan.workload)
    return r.overall_ms, sorted((d.fwd_comp_ms + d.bwd_comp_ms + d.fwd_comm_ms + d.bwd_comm_ms for d in r.devices), reverse=True)


def by_cost_net(model: DreamShardModel, plan: Plan):
    """A pricing of plans of `plan`'s task like `priced`, by the cost net (units, not ms)."""
    scorer = PieceScorer(model, plan.task)

    def price(p: Plan) -> tuple[float, list[float]]:
        # pieces by what they hold, not where: the scorer measures each piece once, not once per device
        state = scorer.state([replace(s, device=0) for s in p.shards], np.array([s.device for s in p.shards]))
        devices = scorer.device_costs(state).sum(-1) + scorer.collective(state)
        return float(scorer.score(state)), sorted(devices.tolist(), reverse=True)
    return price


def rebalance(sim: SimBackend, plan: Plan, price=None) -> tuple[Plan, int]:
    """First-improvement local search over single moves of pieces that are not row blocks, judged
    by `price` (default: the simulator's `priced`)."""
    price = price or (lambda p: priced(sim, p))
    shards, best, moves = list(plan.shards), price(plan), 0
    improved = True
    while improved:
        improved = False
        for i, s in enumerate(shards):
            if s.is_row_shard:
                continue
            for d in range(plan.devices):
                if d == s.device or any(o.table == s.table and o.device == d for o in shards):
                    continue
                cand = Plan(plan.task, shards[:i] + [Shard(s.table, d, s.start, s.stop, s.row_start, s.row_stop)] + shards[i + 1:], plan.planner)
                try:
                    cand.check()  # its memory too
                except PlanError:
                    continue
                c = price(cand)
                if (round(c[0], 6), [round(x, 6) for x in c[1]]) < (round(best[0], 6), [round(x, 6) for x in best[1]]):
                    shards, best, moves, improved = list(cand.shards), c, moves + 1, True
                    break
            if improved:
                break
    return Plan(plan.task, shards, plan.planner), moves


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*", default=[f"{s}_D{d}_rows" for d in (4, 8) for s in ("onehot", "hot0", "hot1", "hot2")]
                    + ["onehot_D8_columns", "hot2_D4_columns"],
                    help="plan names in benchmarks/results/rowwise_sim/plans (without .json)")
    args = ap.parse_args(argv)
    sim, model = SimBackend(), DreamShardModel.load(None)
    print("Simulated ms (default calibration); moves judged by the simulator, then by the shipped cost net\n")
    print("| plan | planner | simulated step | devices (slowest first) | after the simulator's moves | devices | moves | after the cost net's moves | moves |")
    print("|---|---|---:|---|---:|---|---:|---:|---:|")
    for name in args.plans:
        path = PLANS / f"{name}.json"
        if not path.is_file():
            raise SystemExit(f"error: no plan {path}: name one of {', '.join(sorted(p.stem for p in PLANS.glob('*.json')))}")
        plan = load_plans(path)[0]
        before = priced(sim, plan)
        after_plan, moves = rebalance(sim, plan)
        after = priced(sim, after_plan)
        net_plan, net_moves = rebalance(sim, plan, by_cost_net(model, plan))
        net = priced(sim, net_plan)[0]
        fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        print(f"| {name} | {plan.planner} | {before[0]:.3f} | {fmt(before[1])} | {after[0]:.3f} ({100 * (after[0] / before[0] - 1):+.1f}%) | {fmt(after[1])} | {moves} "
              f"| {net:.3f} ({100 * (net / before[0] - 1):+.1f}%) | {net_moves} |")


if __name__ == "__main__":
    main()
