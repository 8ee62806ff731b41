"""The learned planners at equal measurement budgets, on the simulator: DreamShard, AutoShard and
the RNN placer trained on the same tasks against the simulator (H200 calibration), then placing
held-out tasks (docs/dreamshard.md, "The learned peers").

    python benchmarks/learned_peers.py [--budget 400] [--autoshard-budget 4000] [--tasks 10]

Training tasks: the recipe of f3e71a6:benchmarks/shipped_model.py — 10 tasks per device count 2..8 of
20–120 tables from the synthetic pool's *train* half, 5 GB per device. Every planner gets
`--budget` measured plans (DreamShard's scale); AutoShard is also trained at `--autoshard-budget`
measured plans, the scale of its own paper, as its reference code trains (the default: overflowing
episodes get a negative reward) and with the devices without room masked (its `masked` config) (each plan measures its 2–8 shards: tens of thousands
of shard measurements). Held-out tasks: the four settings of benchmarks/splits_sim.py (the pool's
*test* half, seed 2); the RNN placer's output layer is 8 devices wide, so it has no plan for the
16-device setting. Every plan priced by the simulator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from splits_sim import held_out_settings  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import PLANNERS, get_planner  # noqa: E402
from dreamshard.report import evaluate  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import sample_tasks, split_pool  # noqa: E402

BASELINES = ["random", "lookup", "size_lookup"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=400, help="measured plans for every learned planner")
    ap.add_argument("--autoshard-budget", type=int, default=4000, help="measured plans for AutoShard at its own scale")
    ap.add_argument("--tasks", type=int, default=10, help="held-out tasks per setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default="/tmp/learned_peers", help="where the trained models go")
    ap.add_argument("--out", default="benchmarks/results/learned_peers")
    ap.add_argument("--resume", action="store_true", help="reuse the finished models in --models (and go on with unfinished ones)")
    ap.add_argument("--autoshard-best-of", type=int, default=1, help="AutoShard plans with the best of this many sampled episodes (1: its greedy one, the default)")
    args = ap.parse_args()
    sim = SimBackend()
    train_half, _ = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    tasks = [t for d in range(2, 9) for t in sample_tasks(train_half, 10, (20, 120), d, 5 * 10**9, seed=1000 + d)]
    models, out = Path(args.models), Path(args.out)
    models.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    runs = [("dreamshard", args.budget, dict(iterations=10)), ("autoshard", args.budget, {}), ("rnn", args.budget, {}),
            ("autoshard", args.autoshard_budget, {}), ("autoshard", args.autoshard_budget, dict(config="masked"))]
    planners = {name: get_planner(name) for name in BASELINES}
    training = {}
    # --resume: a finished model is loaded, not trained; its training time is the earlier run's
    before = json.loads((out / "summary.json").read_text())["training"] if args.resume and (out / "summary.json").exists() else {}
    for name, budget, extra in runs:
        cls = PLANNERS[name]
        per_iteration = cls.config().measurements_per_iteration
        cfg = cls.config(extra.get("config"), seed=args.seed, budget=budget, iterations=extra.get("iterations", max(1, budget // per_iteration)))
        masked = extra.get("config") == "masked"
        tag = "_masked" if masked else ""
        label = f"{name} @{budget}" + (" (devices without room masked)" if masked else "")
        t0 = time.time()
        path = models / f"{name}_{budget}{tag}.pt"
        resume = args.resume and Path(f"{path}.ckpt").exists()  # --resume: a model not started yet is trained from the start
        planner = cls.fit(tasks, sim, path, cfg, log=out / f"{name}_{budget}{tag}.jsonl", progress=False, resume=resume)
        meta = planner.model.meta
        seconds = round(time.time() - t0, 1)
        if label in before and before[label]["measured_plans"] == meta["measurements"] and seconds < 0.5 * before[label]["seconds"]:
            seconds = before[label]["seconds"]
        training[label] = {"seconds": seconds, "measured_plans": meta["measurements"], "shard_measurements": meta.get("shard_measurements"),
                           "iterations": cfg.iterations}
        print(label, training[label], flush=True)
        planners[label] = PLANNERS[name](model=planner.model, best_of=args.autoshard_best_of) if name == "autoshard" else planner
    planners["dreamshard (shipped model)"] = get_planner("dreamshard")

    md = [f"Priced by the {sim.name}; trained on {len(tasks)} tasks (20–120 train-half tables, 2–8 devices, 5 GB); "
          f"`python benchmarks/learned_peers.py --budget {args.budget} --autoshard-budget {args.autoshard_budget} --tasks {args.tasks} --seed {args.seed}"
          + (f" --autoshard-best-of {args.autoshard_best_of}" if args.autoshard_best_of != 1 else "") + "`.", "",
          "| trained | measured plans | shard measurements | iterations | training s |", "|---|---:|---:|---:|---:|"]
    for label, t in training.items():
        md.append(f"| {label} | {t['measured_plans']} | {t['shard_measurements'] or '—'} | {t['iterations']} | {t['seconds']:.0f} |")
    md.append("")
    summary = {"training": training, "settings": []}
    for setting, held_out in held_out_settings(args.tasks):
        usable = {k: p for k, p in planners.items() if not (k.startswith("rnn") and held_out[0].devices > p.model.net.devices)}
        res = evaluate(usable, held_out, sim)
        rand = np.array(res.costs("random"))
        md += [f"**{setting}** ({len(held_out)} held-out tasks)", "",
               "| planner | mean ms | vs random (mean of per-task ratios) | planning ms | tables on the fullest device (median, max) |", "|---|---:|---:|---:|---:|"]
        row = {"setting": setting, "planners": {}}
        for label in planners:
            if label not in usable:
                md.append(f"| {label} | — (model is {planners[label].model.net.devices} devices wide) | | | |")
                continue
            m = np.array(res.costs(label))
            ms = np.mean([x.planning_ms for x in res.rows if x.planner == label])
            # a policy that piles tables onto one device shows here (the evaluated plans; `random`, the
            # baseline, is left out)
            plans = [x.plan for x in sorted(res.rows, key=lambda x: x.task) if x.planner == label and x.plan is not None]
            fullest = [int(np.bincount([s.device for s in p.shards], minlength=p.task.devices).max()) for p in plans] if label != "random" else []
            piled = f"{np.median(fullest):.0f}, {max(fullest)} of {len(held_out[0].tables)}" if fullest else "—"
            md.append(f"| {label} | {m.mean():.3f} | {np.mean(m / rand - 1):+.1%} | {ms:.0f} | {piled} |")
            row["planners"][label] = {"mean_ms": float(m.mean()), "vs_random": float(np.mean(m / rand - 1))}
        md.append("")
        summary["settings"].append(row)
        print("\n".join(md[-len(planners) - 4:]), flush=True)
    atomic_write(out / "README.md", "\n".join(md))
    atomic_write(out / "summary.json", json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
