"""AutoShard with and without its devices masked for memory in training (`Config.mask_memory`),
chosen on development tasks before the held-out ones of benchmarks/learned_peers.py were looked at:

    python benchmarks/autoshard_memory.py ref 4000     # the reference (the default): overflowing episodes, a negative reward
    python benchmarks/autoshard_memory.py mask 4000    # only devices with room (mask_memory)
    python benchmarks/autoshard_memory.py ref 400 1    # another training seed (1)
    python benchmarks/autoshard_memory.py plot OUT.png runs/autoshard_memory/ref_400.jsonl ...   # the runs' training curves

Training tasks: learned_peers.py's (70 tasks of 20–120 train-half tables of the synthetic pool, 2–8
devices, 5 GB), priced by the simulator (H200 calibration), `BUDGET` measured plans. Development
tasks: 8 tasks of 40–80 train-half tables on 4 devices and 8 on 8 devices (seeds 7704 and 7708;
never a test-half table). Prints, for lookup, size_lookup and the trained AutoShard, the mean
simulated step, AutoShard's own reward (min/max of the devices' compute: balance) and the slowest
device's compute. Writes the model and its training log to runs/autoshard_memory/ (`ref_400.pt`, `ref_400_seed1.jsonl`, ...).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.planners import PLANNERS, get_planner  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import sample_tasks, split_pool  # noqa: E402


OUT = Path("runs/autoshard_memory")
USAGE = "usage: autoshard_memory.py ref|mask BUDGET [SEED]  |  autoshard_memory.py plot PNG LOG.jsonl..."


def main() -> None:
    if sys.argv[1:2] == ["plot"] and len(sys.argv) > 3:
        return plot(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("ref", "mask"):
        raise SystemExit(USAGE)
    variant, budget, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) == 4 else 0
    sim = SimBackend()
    train_half, _ = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    tasks = [t for d in range(2, 9) for t in sample_tasks(train_half, 10, (20, 120), d, 5 * 10**9, seed=1000 + d)]
    dev = [t for d in (4, 8) for t in sample_tasks(train_half, 8, (40, 80), d, 5 * 10**9, seed=7700 + d)]
    OUT.mkdir(parents=True, exist_ok=True)
    cls = PLANNERS["autoshard"]
    cfg = cls.config("masked" if variant == "mask" else None, seed=seed, budget=budget, iterations=budget // 8)
    run = f"{variant}_{budget}" + (f"_seed{seed}" if seed else "")
    path = OUT / f"{run}.pt"
    if not path.is_file():  # a model trained before is planned with again
        t0 = time.time()
        cls.fit(tasks, sim, path, cfg, log=OUT / f"{run}.jsonl", progress=False)
        print(f"{variant}: trained in {time.time() - t0:.0f} s", flush=True)
    planners = {"lookup": get_planner("lookup"), "size_lookup": get_planner("size_lookup"),
                "autoshard (greedy, the default)": get_planner("autoshard", model=str(path)),
                "autoshard, best_of 16 (sampled)": get_planner("autoshard", model=str(path), best_of=16)}
    print(f"{variant} @{budget}, seed {seed}: {cls.Model.load(path).meta['measurements']} measured plans", flush=True)
    print("| training | planner | step ms | balance (min/max) | slowest device's compute ms | fullest device's tables, median / max |", flush=True)
    for name, planner in planners.items():
        step, balance, slowest, fullest = [], [], [], []
        for t in dev:
            plan = planner.plan(t)
            r = sim.evaluate_plan(plan)
            compute = [d.fwd_comp_ms + d.bwd_comp_ms for d in r.devices]
            step.append(r.overall_ms), balance.append(min(compute) / max(compute)), slowest.append(max(compute))
            fullest.append(np.bincount([s.device for s in plan.shards], minlength=t.devices).max() / len(t.tables))
        print(f"| {variant} @{budget}{f' (seed {seed})' if seed else ''} | {name} | {np.mean(step):.3f} | {np.mean(balance):.3f} | {np.mean(slowest):.3f} | "
              f"{np.median(fullest):.0%} / {np.max(fullest):.0%} |", flush=True)


def plot(png: Path, logs: list[Path]) -> None:
    """AutoShard's training curves, one line per training log (`LOG.jsonl` of a run, named by its
    file): the sampled episodes' mean balance reward and their share that overflowed memory, by
    measured plans (a running mean over the last 10 iterations)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for log in logs:
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        x = [r["measurements"] for r in rows]
        for ax, key in zip(axes, ("collect/reward", "collect/overflow")):
            y = np.convolve([r[key] for r in rows], np.ones(10) / 10, mode="valid")  # the mean of iterations i-9..i
            ax.plot(x[9:], y, label=log.stem)
    for ax, title in zip(axes, ("balance reward (min/max of the devices' compute)", "episodes overflowing memory")):
        ax.set_xlabel("measured plans")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
