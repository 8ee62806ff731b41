"""Ablation of DreamShard's configurations on held-out test tasks (docs/dreamshard.md).

Trains `paper`, `default`, `default` with each of its changes reverted to the reference's choice,
and `default` plus each change we tried and left out (one at a time), on the training tasks
against the simulator; then plans every held-out test task with each model and measures the plans
on the same simulator. Heuristics are listed beside them. A change is in `default` only if
reverting it raises the mean test cost.

    python benchmarks/ablation.py --train /tmp/tasks/train.jsonl --test /tmp/tasks/test.jsonl \\
        --seeds 0 1 2 --out runs/ablation --jobs 2

Each (variant, seed) result is cached as JSON in --out, so an interrupted run picks up where it
stopped; --markdown prints the table from the cache. `--split`: the same models (trained once, in
--out) plan with the search that cuts tables (`dreamshard`'s default) instead of the policy's
table-wise plan: the ablation of the whole planner.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from dreamshard.files import atomic_write

# Our changes to the reference: (label, ours, reference, kept in `default`). A kept change is
# ablated by reverting it in `default`; a change left out, by adding it to `default`.
CHANGES: list[tuple[str, dict, dict, bool]] = [
    ("fixed log-scale features (vs per-task z-scores)", {"normalization": "fixed"}, {"normalization": "task"}, True),
    ("5 linear-scale memory-traffic features", {"linear_features": True}, {"linear_features": False}, True),
    ("50 RL batches per iteration at lr 3e-3 (vs 10 at 5e-4)", {"rl_batches": 50, "lr": 3e-3}, {"rl_batches": 10, "lr": 5e-4}, True),
    ("max-device score (vs the overall head)", {"score": "max_device"}, {"score": "overall"}, True),
    ("best of 16 plans (vs greedy only)", {"best_of": 16}, {"best_of": 1}, True),  # inference only
    ("policy sees the table being placed", {"policy_sees_table": True}, {"policy_sees_table": False}, False),
    ("memory look-ahead: keep room for the largest table to come", {"keep_room": True}, {"keep_room": False}, True),
    ("RL batch of 4 tasks × 16 episodes, returns normalised per task (vs 1 × 10)", {"advantage": "task", "rl_tasks_per_batch": 4, "rl_episodes_per_task": 16}, {"advantage": "batch", "rl_tasks_per_batch": 1, "rl_episodes_per_task": 10}, False),
]
HEURISTICS = ["random", "size", "dim", "lookup", "size_lookup"]


def variants() -> dict[str, tuple[str, dict]]:
    out = {"paper": ("paper", {}), "default": ("default", {})}
    for i, (_, ours, reference, kept) in enumerate(CHANGES):
        out[f"default-{i}"] = ("default", reference if kept else ours)
    return out


def run_one(name: str, base: str, overrides: dict, seed: int, args) -> dict:
    import torch

    torch.set_num_threads(1)
    from dreamshard.costs.sim import SimBackend
    from dreamshard.learned.dreamshard import get_config, train
    from dreamshard.planners.dreamshard import DreamShardPlanner
    from dreamshard.report import evaluate
    from dreamshard.tasks import load_tasks

    sim = SimBackend(args.calibration) if args.calibration else SimBackend()
    train_tasks, test_tasks = load_tasks(args.train), load_tasks(args.test)
    out = Path(args.out)
    inference_only = set(overrides) == {"best_of"}
    train_overrides = {} if inference_only else overrides
    cfg = get_config(base, seed=seed, iterations=args.iterations, **train_overrides)
    tag = "default" if inference_only else name
    model_path = out / f"{tag}-s{seed}.pt"
    t0 = time.time()
    if not model_path.exists():
        train(cfg, train_tasks, sim, model_path, log=out / f"{tag}-s{seed}.jsonl", progress=False)
    seconds = time.time() - t0
    planner = DreamShardPlanner(model_path, best_of=overrides.get("best_of"), split=args.split)
    results = evaluate({name: planner}, test_tasks, sim, cfg.batch_size)
    s = results.summary()[name]
    return {"variant": name, "seed": seed, "config": dataclasses.asdict(cfg), "best_of": planner.best_of, "mean_ms": s.mean_ms, "costs": results.costs(name),
            "fallbacks": sum(bool(r.notes) for r in results.rows), "train_s": seconds, "plan_ms": s.mean_planning_ms, "backend": results.source}


def heuristics(args) -> dict:
    from dreamshard.costs.sim import SimBackend
    from dreamshard.report import evaluate
    from dreamshard.tasks import load_tasks

    sim = SimBackend(args.calibration) if args.calibration else SimBackend()
    results = evaluate(HEURISTICS, load_tasks(args.test), sim, 65_536)
    out: dict = {name: {"mean_ms": s.mean_ms, "costs": results.costs(name)} for name, s in results.summary().items()}
    out["_backend"] = results.source
    return out


def _job(item):
    name, base, overrides, seed, args = item
    path = Path(args.out) / f"result-{name}-s{seed}{'-split' if args.split else ''}.json"
    if path.exists():
        return json.loads(path.read_text())
    r = run_one(name, base, overrides, seed, args)
    atomic_write(path, json.dumps(r))
    print(f"{name} seed {seed}: {r['mean_ms']:.4f} ms (trained in {r['train_s']:.0f} s)", flush=True)
    return r


def markdown(results: list[dict], heur: dict, split: bool) -> str:
    import numpy as np

    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["variant"], []).append(r)
    labels = {"paper": "paper (reference code)", "default": "**default**"}
    for i, (label, _, _, kept) in enumerate(CHANGES):
        labels[f"default-{i}"] = f"default {'without' if kept else '+'} {label}"
    best_h = min(v["mean_ms"] for k, v in heur.items() if not k.startswith("_"))
    default = np.mean([r["mean_ms"] for r in by.get("default", [])]) if by.get("default") else float("nan")
    lines = [
        f"Mean overall cost (ms) of the 50 held-out test tasks, {'plans of the search (cuts)' if split else 'table-wise plans'}, "
        f"{heur['_backend']}; mean ± std over seeds; the heuristics table-wise.",
        "",
        "| planner | mean cost (ms) | vs default | vs best heuristic | memory fallbacks | seeds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in labels:
        if key not in by:
            continue
        m = np.array([r["mean_ms"] for r in by[key]])
        fb = sum(r["fallbacks"] for r in by[key])
        lines.append(f"| {labels[key]} | {m.mean():.4f} ± {m.std():.4f} | {m.mean() / default - 1:+.2%} | {m.mean() / best_h - 1:+.2%} | {fb} | {len(m)} |")
    for name in HEURISTICS:
        v = heur[name]["mean_ms"]
        lines.append(f"| heuristic: {name} | {v:.4f} | {v / default - 1:+.2%} | {v / best_h - 1:+.2%} | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--out", default="runs/ablation")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--calibration", help="simulator calibration (default: the shipped H200 one)")
    ap.add_argument("--only", nargs="+", help="variants to run (paper, default, default-0 ...)")
    ap.add_argument("--jobs", type=int, default=1, help="training processes at once (one CPU thread each)")
    ap.add_argument("--markdown", action="store_true", help="only print the table from the cached results")
    ap.add_argument("--split", action="store_true", help="plan with the search that cuts tables (the same models)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [(n, b, o, s, args) for n, (b, o) in variants().items() for s in args.seeds if not args.only or n in args.only]
    # the inference-only variant reuses default's model: train default first
    todo.sort(key=lambda item: (item[0] != "default", set(item[2]) == {"best_of"}))
    if not args.markdown and args.jobs > 1:
        first = [t for t in todo if t[0] == "default"]
        with ProcessPoolExecutor(args.jobs) as pool:
            list(pool.map(_job, first))
            list(pool.map(_job, [t for t in todo if t[0] != "default"]))
    elif not args.markdown:
        for t in todo:
            _job(t)
    # every seed so far
    results = [json.loads(p.read_text()) for p in sorted(out.glob("result-*.json")) if p.stem.endswith("-split") == args.split]
    hpath = out / "heuristics.json"
    if not hpath.exists():
        atomic_write(hpath, json.dumps(heuristics(args)))
    print(markdown(results, json.loads(hpath.read_text()), args.split))


if __name__ == "__main__":
    main()
