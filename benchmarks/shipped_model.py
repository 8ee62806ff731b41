"""Train the model shipped as dreamshard/data/models/dreamshard_h200.pt, and test how it generalizes.

    dreamshard data synth --out /tmp/pool --seed 0
    python benchmarks/shipped_model.py --pool /tmp/pool --out dreamshard/data/models/dreamshard_h200.pt

Training tasks: the pool's *train* half (split seed 0, the split `dreamshard data tasks --seed 0`
makes), 20–120 tables per task, 2–8 devices, 5 GB per device; costs from the simulator with the
shipped H200 calibration. Test tasks: the *test* half only — tables the model never saw — in the
paper's setting (80 tables on 8 devices) and at table and device counts it was not trained on.
Every planner's plans are priced by the same simulator.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

HEURISTICS = ["random", "size", "dim", "lookup", "size_lookup"]
# (label, table counts, devices, memory per device) of the held-out test settings
TEST_SETTINGS = [
    ("DLRM-80, 8 devices (paper's setting)", (80, 80), 8, 5 * 10**9),
    ("DLRM-40, 4 devices", (40, 40), 4, 5 * 10**9),
    ("DLRM-120, 8 devices (10 GB each)", (120, 120), 8, 10 * 10**9),
    ("DLRM-160, 16 devices (20 GB each; unseen table and device counts)", (160, 160), 16, 20 * 10**9),
]


def cost_net_accuracy(model, priced) -> dict:
    """MAPE and Spearman of the cost net on measured plans of unseen tables: per device and
    component, and per plan (the max-device score and the overall head)."""
    from dreamshard.learned.loop import mape, spearman
    from dreamshard.learned.mdp import EpisodeBatch, predict, prepare

    items = [prepare(t, model.normalization, model.linear_features) for t, _, _ in priced]
    batch = EpisodeBatch.of(items)
    placement = torch.full(batch.sizes.shape, -1, dtype=torch.long)
    for i, (_, p, _) in enumerate(priced):
        placement[i, : len(p)] = torch.tensor(p)
    costs, overall = predict(model.cost_net, batch, placement)
    scale = float(model.cost_net.scale)
    costs, overall = costs.numpy() * scale, overall.numpy() * scale
    mask = batch.device_mask.numpy()  # real devices that hold at least one table (below)
    true = np.zeros_like(costs)
    for i, (_, _, r) in enumerate(priced):
        true[i, : len(r.devices)] = [[d.fwd_comp_ms, d.bwd_comp_ms, d.fwd_comm_ms + d.bwd_comm_ms] for d in r.devices]
    mask &= true.sum(-1) > 0  # an empty device costs 0: no relative error there
    measured = np.array([r.overall_ms for _, _, r in priced])
    max_device = costs.sum(-1).max(-1)
    out = {}
    for k, c in enumerate(("fwd_comp", "bwd_comp", "comm")):  # a shard of zero-lookup tables has no backward
        m = mask & (true[..., k] > 0)
        out[f"mape_{c}"] = mape(costs[..., k][m], true[..., k][m])
    out["mape_device_total"] = mape(costs.sum(-1)[mask], true.sum(-1)[mask])
    out["spearman_device_total"] = spearman(costs.sum(-1)[mask], true.sum(-1)[mask])
    out["mape_max_device"] = mape(max_device, measured)
    out["spearman_max_device"] = spearman(max_device, measured)
    out["mape_overall_head"] = mape(overall, measured)
    out["spearman_overall_head"] = spearman(overall, measured)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", required=True)
    ap.add_argument("--out", required=True, help="model file to write")
    ap.add_argument("--tasks-per-device-count", type=int, default=30)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--budget", type=int, default=400, help="simulated measurements in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-tasks", type=int, default=50)
    ap.add_argument("--eval-only", action="store_true", help="skip training; evaluate --out")
    ap.add_argument("--log", help="JSONL training log (default: OUT.jsonl beside the model)")
    ap.add_argument("--report", help="write the results as JSON here")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override fields of the default Config (ablations), e.g. keep_room=true")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from dreamshard.costs.sim import SimBackend
    from dreamshard.files import atomic_write
    from dreamshard.learned.dreamshard import get_config, train
    from dreamshard.planners import get_planner
    from dreamshard.report import evaluate
    from dreamshard.synth import load_pool
    from dreamshard.tasks import sample_tasks, split_pool

    sim = SimBackend()
    pool_dir = str(Path(args.pool).resolve())
    train_half, test_half = split_pool(load_pool(args.pool), 0)
    out = Path(args.out)
    if not args.eval_only:
        tasks = []
        for devices in range(2, 9):
            tasks += sample_tasks(train_half, args.tasks_per_device_count, (20, 120), devices, 5 * 10**9, seed=1000 + devices, pool=pool_dir)
        overrides = {}
        for item in args.set:
            key, value = item.split("=", 1)
            overrides[key] = {"true": True, "false": False}.get(value.lower(), value)
            for cast in (int, float):
                try:
                    overrides[key] = cast(value)
                    break
                except ValueError:
                    pass
        cfg = get_config("default", iterations=args.iterations, budget=args.budget, seed=args.seed, **overrides)
        print(f"training on {len(tasks)} tasks (20–120 of {len(train_half)} train tables, 2–8 devices) against {sim.name}: {cfg}")
        t0 = time.time()
        train(cfg, tasks, sim, out, log=args.log or out.with_suffix(".jsonl"))
        print(f"trained in {time.time() - t0:.0f} s; {out}: {out.stat().st_size / 1e3:.0f} KB")

    results = {"backend": sim.name, "model": str(out), "settings": []}
    ours = get_planner("dreamshard", model=str(out))
    for label, count, devices, cap in TEST_SETTINGS:
        tests = sample_tasks(test_half, args.test_tasks, count, devices, cap, seed=1, pool=pool_dir)
        # heuristics built afresh per setting: random's draws start from its seed in each one
        evaluated = evaluate({"dreamshard": ours, **{name: get_planner(name) for name in HEURISTICS}}, tests, sim, 65_536)
        summary = evaluated.summary()
        row = {"setting": label, "tasks": len(tests), **{name: s.mean_ms for name, s in summary.items()}}
        row["plan_ms"] = summary["dreamshard"].mean_planning_ms
        row["fallbacks"] = sum(bool(r.notes) for r in evaluated.of("dreamshard"))
        priced = [(r.plan.task, r.plan.placement, r.report) for r in evaluated.rows]  # every planner's plans: the cost net's held-out test
        best = min(row[h] for h in HEURISTICS)
        row["vs_best_heuristic"] = row["dreamshard"] / best - 1
        row["cost_net"] = cost_net_accuracy(ours.model, priced)
        results["settings"].append(row)
        print(f"{label}: dreamshard {row['dreamshard']:.4f} ms ({row['vs_best_heuristic']:+.2%} vs best heuristic); " + ", ".join(f"{h} {row[h]:.4f}" for h in HEURISTICS))
        print("   cost net on these held-out plans: " + ", ".join(f"{k} {v:.3f}" for k, v in row["cost_net"].items()))
    if args.report:
        atomic_write(args.report, json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
