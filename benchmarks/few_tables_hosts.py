"""`dreamshard` with and without its every-table table-row-wise candidates (`table_row_wise_by_host`:
every table table-row-wise, and every table a grid of two column blocks on two hosts) on tasks of
few tables on many hosts that the candidate was not designed on, beside TorchRec's
planner with every sharding type (given the same Topology), by simulation.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/few_tables_hosts.py      # ~2 min on one core

Tasks: 26 tables drawn from the `onehot`, `dlrm` and `hot` pools of seed 9 (the candidate was
chosen on the MLPerf tables of benchmarks/topology_scale.py), on 8 and 16 hosts of the `h100-sxm`
preset (8 × H100 each, 80 GB per GPU), B = 65,536. Prices: the simulator with the H100
calibration, collectives in two levels (costs/hierarchy.py). TorchRec 1.8 needed (its planner's
search cut at 5 s a task, as in topology_scale.py). Writes
benchmarks/results/few_tables_hosts.md.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import dreamshard as ds  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402
from dreamshard.topology import PRESETS  # noqa: E402

FAMILIES, SEED, TABLES, HOSTS = ("onehot", "dlrm", "hot"), 9, 26, (8, 16)
OUT = Path(__file__).resolve().parent / "results" / "few_tables_hosts.md"

# the H100 compute calibration of the committed results (the H100 default, h100_triton_large_shards.json,
# prices shards of many tables closer: docs/simulator.md)
CALIBRATION = "h100_triton.json"


def main() -> None:
    sim = SimBackend(CALIBRATION)
    candidate = ds.table_row_wise_by_host
    lines = ["# Every table table-row-wise on many hosts (simulated)", "", f"`{' '.join(['.venv/bin/python', *sys.argv])}`: `dreamshard`'s simulated step "
             f"(ms, H100 calibration) without and with the candidate, {TABLES} tables of pool seed {SEED} per family.", "",
             "| family | hosts | GPUs | without | with | change | tables as grids | TorchRec (all types) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    torchrec = get_planner("torchrec", sharding_types="all", timeout_s=5)
    for family in FAMILIES:
        pool = synth_family(family, None if family == "onehot" else 300, SEED)
        rng = np.random.default_rng(SEED)
        for hosts in HOSTS:
            topo = replace(PRESETS["h100-sxm"], hosts=hosts)
            idx = sorted(rng.choice(len(pool), size=min(TABLES, len(pool)), replace=False))
            task = Task([pool[i] for i in idx], topo.devices, topo.hbm_bytes, Workload(65_536), f"{family}/{SEED}", topology=topo)
            cost = []
            for on in (False, True):
                ds.table_row_wise_by_host = candidate if on else (lambda scorer, whole, blocks=1: None)
                try:
                    plan = get_planner("dreamshard").plan(task)
                    cost.append(sim.evaluate_plan(plan).overall_ms)
                finally:
                    ds.table_row_wise_by_host = candidate
            grids = sum(len({(s.start, s.stop) for s in plan.shards if s.table == i and s.is_row_shard}) > 1 for i in range(len(task.tables)))
            theirs = sim.evaluate_plan(torchrec.plan(task)).overall_ms
            lines.append(f"| {family} | {hosts} | {topo.devices} | {cost[0]:.3f} | {cost[1]:.3f} | {cost[1] / cost[0] - 1:+.1%} | {grids} | {theirs:.3f} |")
            print(lines[-1], flush=True)
    atomic_write(OUT, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
