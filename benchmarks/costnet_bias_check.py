"""Where a DreamShard model's cost net departs from the simulator, per component (CPU, seconds):
the four heuristics' plans of 6 tasks per setting (40 tables / 4 devices, 80 / 8; a family's pool
of seed 11, as the measured campaigns), each priced by the net and by the default simulator;
printed: the net over the simulator, summed over devices, forward, backward and all-to-all, and
the max-device step. Heuristic plans, not the model's own: its own are the cheapest by its net,
which biases the net's error on them low.

    PYTHONPATH=. python benchmarks/costnet_bias_check.py --family hot \\
        --model benchmarks/results/gpu_cache_model/train/model_gpu.pt     # and the shipped model
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_heldout_planners import HEURISTICS, SETTINGS  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import synth_family  # noqa: E402
from dreamshard.learned.mdp import EpisodeBatch, predict, prepare  # noqa: E402
from dreamshard.learned.nets import DreamShardModel  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="hot")
    ap.add_argument("--model", action="append", default=[], help="model files beside the shipped one")
    ap.add_argument("--tasks", type=int, default=6)
    args = ap.parse_args()
    sim, workload = SimBackend(), Workload(65_536)
    pool = synth_family(args.family, 300, 11)
    print(f"{args.family}: cost net / simulator ({sim.calibration.label}) on the heuristics' plans, {args.tasks} tasks per setting")
    for path in [None, *args.model]:
        model = DreamShardModel.load(path)
        ratios = []
        for n, d, cap, seed in SETTINGS[:2]:
            for task in sample_tasks(pool, args.tasks, (n, n), d, cap, seed=seed, workload=workload):
                plans = [get_planner(h).plan(task) for h in HEURISTICS]
                p = prepare(task, model.normalization, model.linear_features, model.kernel)
                net, _ = predict(model.cost_net, EpisodeBatch.of([p] * len(plans)), torch.tensor([q.placement for q in plans]), model.comm)
                net = net.numpy() * float(model.cost_net.scale)  # [plans, D, (fwd, bwd, comm)]
                for k, q in enumerate(plans):
                    s = sim.costs_batch(task.tables, np.array([q.placement]), d, workload)[0]  # [D, (fwd, fwd comm, bwd comm, bwd)]
                    ratios.append([net[k, :, 0].sum() / s[:, 0].sum(), net[k, :, 1].sum() / s[:, 3].sum(),
                                   net[k, :, 2].sum() / s[:, 1:3].sum(), net[k].sum(-1).max() / s.sum(-1).max()])
        r = 100 * (np.mean(ratios, axis=0) - 1)
        print(f"  {os.path.basename(path) if path else 'shipped':<16} ({len(ratios)} plans): forward {r[0]:+.1f}%, backward {r[1]:+.1f}%, "
              f"all-to-all {r[2]:+.1f}%, max-device step {r[3]:+.1f}%")


if __name__ == "__main__":
    main()
