"""The `dlrm` pools the H200 machines drew before session 10, and the candidates on them (CPU).

synth_pool's apportionment ties 7 archetypes of equal weight for the last 2 extra tables of a
300-table pool; numpy's default sort broke the tie by the CPU's SIMD path, so the GPU machines'
`dlrm` pool of seed 11 (every `dlrm` campaign before session 10) is not the one this CPU draws (since
session 10 the sort is stable: the pools are this CPU's everywhere). Which archetypes the GPU
machines took is found by re-planning with the session-9 model under each of the 21 choices: the one
whose predicted costs equal those the campaign recorded. Then, on that pool, which measured
DreamShard plans the heuristic candidates change (benchmarks/candidates_check.py's question), and
the shipped model's plans of those tasks priced by the simulator beside the session-9 model's and
the best heuristic's (benchmarks/replan_check.py's question; simulator numbers, not measurements).

    PYTHONPATH=. python benchmarks/dlrm_gpu_pool_check.py
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_heldout_planners import HEURISTICS, measured_plans  # noqa: E402

import dreamshard.synth as synth  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CSV = os.path.join(HERE, "results", "gpu_families_planners_pp2", "call1", "plans.csv")
MODEL = os.path.join(HERE, "results", "gpu_shipped_model_pp2", "model_gpu.pt")
LABEL = "dreamshard (pp2.pt)"


def tied_archetypes(n: int = 300) -> tuple[list[int], int]:
    """The archetypes tied at the apportionment's cut, and how many of them get an extra table."""
    weights = np.array([a["weight"] for a in synth._mixture("2021")])
    share = weights * n / weights.sum()
    rem = share - np.floor(share)
    extra = n - int(np.floor(share).sum())
    cut = np.sort(rem)[::-1][extra - 1]
    tied = [int(i) for i in np.flatnonzero(rem == cut)]
    return tied, extra - int((rem > cut).sum())


def with_ties(first: tuple[int, ...]):
    """np.argsort for synth_pool that puts the archetypes `first` ahead of the others they tie with."""
    real = np.argsort

    def argsort(a, *args, **kw):
        order = list(real(a, kind="stable"))
        values = np.asarray(a)[order]
        for v in np.unique(values):
            block = [i for i in order if np.asarray(a)[i] == v]
            if set(first) <= set(block):
                start = order.index(block[0])
                order[start:start + len(block)] = list(first) + [i for i in block if i not in first]
        return np.array(order)
    return argsort


def main() -> None:
    policy = DreamShardPlanner(model=MODEL, heuristic_candidates=False)
    tied, k = tied_archetypes()
    print(f"tied archetypes {tied}, {k} of them get an extra table")
    real = synth.np.argsort
    found = None
    for first in itertools.combinations(tied, k):
        synth.np.argsort = with_ties(first)
        try:
            rows = list(itertools.islice(measured_plans(CSV, {LABEL: policy}, ("dlrm",)), 6))
        finally:
            synth.np.argsort = real
        err = max(abs(plan.predicted["max_device_ms"] / float(row["predicted_max_device_ms"]) - 1) for _, _, row, plan in rows)
        print(f"  {first}: predicted costs of the first 6 measured plans within {100 * err:.3f}%")
        if err < 1e-4:
            found = first
    if found is None:
        print("no choice reproduces the campaign")
        return
    print(f"the GPU machines' pool: archetypes {found} took the extra tables")
    synth.np.argsort = with_ties(found)
    try:
        with_candidates, shipped, sim = DreamShardPlanner(model=MODEL), DreamShardPlanner(), SimBackend()
        heuristics = {h: get_planner(h) for h in HEURISTICS}
        n, changed, priced = 0, [], {}
        for _, setting, row, plan in measured_plans(CSV, {LABEL: policy}, ("dlrm",)):
            n += 1
            best = with_candidates.plan(plan.task)
            if best.placement != plan.placement:
                changed.append(f"  {setting} task {row['task']}: {best.notes[0]}")
            price = lambda p: sim.evaluate_plan(p).overall_ms  # noqa: E731
            priced.setdefault(setting, []).append((price(shipped.plan(plan.task)), price(best), min(price(h.plan(plan.task)) for h in heuristics.values())))
    finally:
        synth.np.argsort = real
    print(f"on that pool the candidates change {len(changed)} of the {n} measured `dlrm` plans")
    print("\n".join(changed))
    print(f"\nthe shipped model ({shipped.label}) on those tasks, simulated ms ({sim.name}):")
    print("| setting | tasks | shipped model | session-9 model | best heuristic per task | shipped > 2% above it | session-9 > 2% above it |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for setting, rs in priced.items():
        now, before, best = (np.array(c) for c in zip(*rs))
        print(f"| {setting} | {len(rs)} | {now.mean():.3f} | {before.mean():.3f} | {best.mean():.3f} | {(now > 1.02 * best).sum()} | {(before > 1.02 * best).sum()} |")

if __name__ == "__main__":
    main()
