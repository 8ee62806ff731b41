"""A DreamShard model learned from GPU measurements, and the measured comparison that decides
which model ships — one time-boxed call on one H200. The shipped model's recipe:

    PYTHONPATH=. python benchmarks/gpu_shipped_model.py --out $OUT --prior-plans 8000 --kernel-features --comm model \
        --product-rule kernel --models gpu --test-tasks 0          # → OUT/model_gpu.pt = dreamshard/data/models/dreamshard_h200.pt

Other uses:

    PYTHONPATH=. python benchmarks/gpu_shipped_model.py --out $OUT                       # one H200, ≤ 9.5 min
    PYTHONPATH=. python benchmarks/gpu_shipped_model.py --out $OUT --prior-plans 8000    # the GPU-trained model with the simulator prior
    PYTHONPATH=. python benchmarks/gpu_shipped_model.py --out $OUT --prior-plans 8000 --kernel-features --comm model   # and the cost net's options
    PYTHONPATH=. python benchmarks/gpu_shipped_model.py --out $OUT --prior-plans 8000 --kernel-features --comm model --models gpu --test-tasks 0
        # the GPU-trained model alone (measure it with gpu_heldout_planners.py --model); a run cut
        # by the call's limit goes on with --resume, OUT holding the cut run's files
    PYTHONPATH=. python benchmarks/gpu_shipped_model.py --out /tmp/g --device cpu --quick  # logic check

1. Training tasks from the *training* families (dreamshard/families.py; pools of seed 10, the
   pools the calibration shards came from): `--tasks-per-family` tasks each of 20–60 tables on 2–8
   devices, 24 GB per device.
2. `gpu`: DreamShard's training (config `default`) against the sequential runner measuring our
   Triton TBE on the GPU — `--budget` real measurements (the paper's scale is ~100).
   With `--prior-plans N` its cost net is first fitted on N plans priced by the simulator (default
   calibration; not measurements; ~75 s of one CPU core for 8,000: docs/costs.md, "The cost net: a simulator prior").
   `--kernel-features` and `--comm model` set the cost net's options of the same names (Config,
   docs/costs.md) for both models.
   `sim`: the same training against the simulator with `--calibration` (the per-family fit), on
   the same tasks, for the comparison.
3. Held-out tasks of every held-out family (`mixed`, `rmc`, `din`; pool seed 11: never in
   calibration or training), 40 tables on 4 devices and 80 on 8, the families in turn: every planner's plan measured by the same runner, beside
   each model's own prediction of it (the cost net's per-plan accuracy on measured held-out plans)
   and the simulator's price. Planners: the GPU-trained model, the simulator-trained model, the
   shipped model, lookup and size_lookup. Tasks are measured whole (every planner) until
   `--total-s`.
Written as it goes: train_gpu.jsonl / train_sim.jsonl (training logs), model_gpu.pt / model_sim.pt,
plans.csv (one line per measured plan), summary.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import HELD_OUT_FAMILIES, TRAINING_FAMILIES, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402

FAMILIES_CALIBRATION = "dreamshard/data/calibrations/h200_triton_families.json"
CAP = 24 * 10**9
SETTINGS = ((40, 4), (80, 8))
COLUMNS = ["family", "task", "tables", "devices", "planner", "measured_ms", "measured_max_device_ms", "predicted_ms", "predicted_max_device_ms", "sim_ms", "split_tables"]


def training_tasks(per_family: int, pool_tables: int, workload: Workload, families=TRAINING_FAMILIES) -> list:
    """`per_family` tasks of each family's pool of seed 10 (the calibration shards' pools): 20–60
    tables on 2–8 devices of 24 GB (lab-archive:benchmarks/costnet_prior.py fits its prior on the same tasks)."""
    tasks = []
    for f in families:
        pool = synth_family(f, pool_tables, 10)
        for k in range(per_family):
            tasks += sample_tasks(pool, 1, (20, 60), 2 + k % 7, CAP, seed=100 + k, workload=workload)
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget", type=int, default=80)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--tasks-per-family", type=int, default=12)
    ap.add_argument("--test-tasks", type=int, default=4, help="held-out tasks per family and setting")
    ap.add_argument("--pool-tables", type=int, default=300)
    ap.add_argument("--calibration", default=FAMILIES_CALIBRATION)
    ap.add_argument("--prior-plans", type=int, default=0, help="the GPU-trained model's simulator prior: plans priced by the simulator (default calibration) before measuring (Config.prior_plans)")
    ap.add_argument("--kernel-features", action="store_true", help="both models: the cost net also sees each table's kernel terms (Config.kernel_features, docs/costs.md)")
    ap.add_argument("--comm", choices=["head", "model"], default="head",
                    help="both models: a device's all-to-all from the comm head or from the backend's comm model (Config.comm; the sequential runner's h200_nccl.json, the simulator's calibration)")
    ap.add_argument("--product-rule", choices=["candidate", "kernel"], default="candidate",
                    help="with --kernel-features: which tables the product-path features mark (nets.PRODUCT_RULES; the shipped model: kernel)")
    ap.add_argument("--models", default="gpu,sim", help="which models to train: gpu, sim or both (gpu,sim)")
    ap.add_argument("--resume", action="store_true", help="go on training the GPU model from OUT/model_gpu.pt.ckpt (a run cut by the call's time limit)")
    ap.add_argument("--total-s", type=float, default=540.0)
    ap.add_argument("--quick", action="store_true", help="tiny run (CPU logic check): batch 1024, 4 measurements, 1 test task")
    args = ap.parse_args()
    which = args.models.split(",")
    if not which or set(which) - {"gpu", "sim"}:
        ap.error(f"--models: give gpu, sim or gpu,sim, not {args.models!r}")
    t0 = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    log = lambda text: print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)  # noqa: E731
    from dreamshard.costs.runners import SequentialRunner

    batch = 1024 if args.quick else 65_536
    budget, iterations = (4, 2) if args.quick else (args.budget, args.iterations)
    per_family, test_tasks = (1, 1) if args.quick else (args.tasks_per_family, args.test_tasks)
    workload = Workload(batch)
    runner = SequentialRunner("triton" if args.device == "cuda" else "torch", device=args.device)
    sim = SimBackend(args.calibration)

    # quick: families without 10^7-row tables, which take minutes to initialise on a CPU
    tasks = training_tasks(per_family, args.pool_tables, workload, ("dlrm", "hot") if args.quick else TRAINING_FAMILIES)
    log(f"{len(tasks)} training tasks")

    summary: dict = {"device": args.device, "batch_size": batch, "budget": budget, "iterations": iterations, "prior_plans": args.prior_plans,
                     "kernel_features": args.kernel_features, "comm": args.comm, "training_tasks": len(tasks),
                     "held_out_families": list(HELD_OUT_FAMILIES), "simulator": sim.calibration.label, "models": {}}
    models = {}
    for name, backend in (("gpu", runner), ("sim", sim)):
        if name not in which:
            continue
        # the simulator prior (the simulator with its default calibration) for the GPU-trained model only
        prior = args.prior_plans if name == "gpu" else None
        cfg = DreamShardPlanner.config("default", budget=budget, iterations=iterations, batch_size=batch, prior_plans=prior or None,
                                       kernel_features=args.kernel_features, comm=args.comm)
        t = time.monotonic()
        models[name] = DreamShardPlanner.fit(tasks, backend, os.path.join(args.out, f"model_{name}.pt"), cfg, log=os.path.join(args.out, f"train_{name}.jsonl"), progress=False,
                                             prior=SimBackend() if prior else None, resume=args.resume and name == "gpu")
        if args.kernel_features and args.product_rule != "candidate":
            # the same weights, their product-path features marking the tables the kernel takes (the shipped file's rule)
            model = models[name].model
            model = replace(model, kernel=replace(model.kernel, product_rule=args.product_rule))
            model.save(os.path.join(args.out, f"model_{name}.pt"))
            models[name] = DreamShardPlanner(os.path.join(args.out, f"model_{name}.pt"))
        summary["models"][name] = {"backend": backend.name, "seconds": round(time.monotonic() - t, 1), "measurements": models[name].model.meta["measurements"]}
        log(f"trained {name}: {summary['models'][name]}")
        atomic_write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1))

    if not test_tasks:
        log("no held-out tasks (--test-tasks 0)")
        return
    labels = {"gpu": "dreamshard (GPU-trained)", "sim": "dreamshard (sim-trained, family calibration)"}
    planners = {**{labels[k]: m for k, m in models.items()},
                "dreamshard (shipped)": get_planner("dreamshard"), "lookup": get_planner("lookup"), "size_lookup": get_planner("size_lookup")}
    # the k-th task of every held-out family and setting before the (k+1)-th: a cut leaves them about equally measured
    drawn = {(f, n, d): sample_tasks(synth_family(f, args.pool_tables, 11), test_tasks, (n, n), d, CAP, seed=200 + d, workload=workload)
             for f in HELD_OUT_FAMILIES for n, d in SETTINGS}
    tests = [(f, n, d, ts[k]) for k in range(test_tasks) for (f, n, d), ts in drawn.items()]
    rows = []
    with open(os.path.join(args.out, "plans.csv"), "w", newline="") as fh:
        out = csv.DictWriter(fh, COLUMNS)
        out.writeheader()
        for i, (family, n, d, task) in enumerate(tests):
            if time.monotonic() - t0 > args.total_s:
                log(f"time box: stopping before held-out task {i} of {len(tests)}")
                break
            for label, planner in planners.items():
                plan = planner.plan(task)
                report = runner.evaluate_plan(plan)
                predicted = plan.predicted or {}
                row = {"family": family, "task": i, "tables": n, "devices": d, "planner": label, "measured_ms": round(report.overall_ms, 5),
                       "measured_max_device_ms": round(max(c.total_ms for c in report.devices), 5),
                       "predicted_ms": predicted.get("overall_ms"), "predicted_max_device_ms": max((c["total_ms"] for c in predicted.get("devices", [])), default=None),
                       "sim_ms": round(sim.evaluate_plan(plan).overall_ms, 5), "split_tables": len(plan.split_tables())}
                out.writerow(row)
                fh.flush()
                rows.append(row)
            log(f"held-out task {i} ({family}, {n} tables, {d} devices): " + ", ".join(f"{r['planner']} {r['measured_ms']:.3f}" for r in rows[-len(planners):]))
    done = sorted({r["task"] for r in rows})
    summary["held_out_tasks_measured"] = len(done)

    def entries(rows: list[dict]) -> dict:
        out = {}
        for label in planners:
            mine = [r for r in rows if r["planner"] == label]
            if not mine:
                continue
            entry = {"mean_measured_ms": float(np.mean([r["measured_ms"] for r in mine])), "mean_sim_ms": float(np.mean([r["sim_ms"] for r in mine]))}
            if all(r["predicted_max_device_ms"] is not None for r in mine):
                # the cost net's per-plan max-device error on measured held-out plans (target: ≤ 5%)
                err = [abs(r["predicted_max_device_ms"] - r["measured_max_device_ms"]) / r["measured_max_device_ms"] for r in mine]
                entry["cost_net_max_device_mape"] = float(np.mean(err))
            out[label] = entry
        return out

    summary["planners"] = entries(rows)  # every held-out family's tasks together ...
    summary["planners_by_family"] = {f: entries([r for r in rows if r["family"] == f]) for f in HELD_OUT_FAMILIES}  # ... and each alone
    summary["elapsed_s"] = round(time.monotonic() - t0, 1)
    atomic_write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1))
    log("done: " + json.dumps(summary["planners"]))


if __name__ == "__main__":
    main()
