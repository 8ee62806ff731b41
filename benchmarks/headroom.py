"""How much a planner can still gain on held-out tasks (docs/dreamshard.md), on the simulator.

    python benchmarks/headroom.py --tasks /tmp/tasks/test.jsonl

Per task: the compute (forward + backward) of the most expensive table on a device of its own — a
floor no placement can beat, since that table's device pays at least that — and a local search
that starts from the `lookup` heuristic's plan and repeatedly applies the single-table move that
lowers the *true* simulated cost most, within memory, until none does. Prints the means over tasks.
"""

from __future__ import annotations

import argparse

import numpy as np

from dreamshard.costs.sim import SimBackend, overall
from dreamshard.report import evaluate
from dreamshard.tasks import load_tasks


def local_search(sim: SimBackend, task, placement: np.ndarray) -> tuple[np.ndarray, float]:
    tables, D = task.tables, task.devices
    terms = sim.table_terms(tables, task.workload)
    sizes = np.array(task.sizes())
    cost = float(overall(sim.costs_batch(tables, placement[None], D, task.workload, terms))[0])
    while True:
        used = np.bincount(placement, weights=sizes, minlength=D)
        moves = [(t, d) for t in range(len(tables)) for d in range(D)
                 if d != placement[t] and used[d] + sizes[t] <= task.max_memory_bytes]
        if not moves:
            return placement, cost
        cands = np.repeat(placement[None], len(moves), axis=0)
        for i, (t, d) in enumerate(moves):
            cands[i, t] = d
        costs = overall(sim.costs_batch(tables, cands, D, task.workload, terms))
        best = int(np.argmin(costs))
        if costs[best] >= cost - 1e-9:
            return placement, cost
        placement, cost = cands[best], float(costs[best])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", required=True, help="tasks JSONL (dreamshard data tasks)")
    args = ap.parse_args()
    sim = SimBackend()
    tasks = load_tasks(args.tasks)
    lookup = evaluate(["lookup"], tasks, sim)
    floors, searched = [], []
    for task, row in zip(tasks, lookup.rows):
        single = sim.shard_compute([[t] for t in task.tables], task.workload)
        floors.append(float(single.sum(axis=1).max()))
        searched.append(local_search(sim, task, np.array(row.plan.placement))[1])
    print(f"{len(tasks)} tasks, {lookup.source}")
    print(f"most expensive table's compute alone: {np.mean(floors):.3f} ms (mean)")
    print(f"lookup heuristic: {lookup.summary()['lookup'].mean_ms:.4f} ms; after single-table moves on the true cost: {np.mean(searched):.4f} ms")


if __name__ == "__main__":
    main()
