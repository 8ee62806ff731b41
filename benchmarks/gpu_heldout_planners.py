"""DreamShard against the heuristics on tasks of the held-out families, measured (issue 10's planner
target): one time-boxed call on one H200.

    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out $OUT                          # ≤ 9.5 min
    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out $OUT --families dlrm,hot --tasks 4   # other families, time box shared
    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out $OUT --families dlrm,hot --skip-done CALL1/plans.csv  # go on
    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out DIR --merge CALL1/plans.csv CALL2/plans.csv        # CPU: one summary
    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out $OUT --model M.pt --only "dreamshard (M.pt)" --families hot --tasks-from CALL1/plans.csv  # one more model on those tasks
    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out $OUT --settings 2 --seed-offset 1000  # fresh tasks, 8 GB setting
    PYTHONPATH=. python benchmarks/gpu_heldout_planners.py --out /tmp/h --device cpu --quick  # logic check

Tasks: the held-out families (`mixed`, `rmc`, `din`, pool seed 11 — never in any calibration or
training run), each in turn with an equal share of --total-s, 16 tasks per setting: 40 tables on 4 devices and 80 on 8 at 24 GB per device, and 120 on 8 at
tight memory, 8 GB per device (78–96% full on most draws). The first tasks of the first two
settings are the ones benchmarks/gpu_shipped_model.py measured (same seeds). Planners: the shipped
DreamShard model and any --model files beside it, the heuristics size, dim, lookup and size_lookup. Each plan is
measured by the sequential runner on our Triton TBE (compute measured device by device, the
all-to-all from the shipped comm model); a placement two planners share is measured once.
Tasks are measured whole (every planner), the settings in turn, until --total-s: a cut leaves the
settings about equally measured. With --families, those families' pools of seed 11 instead (unseen
tasks; of an unseen family only for the held-out ones).
Written as it goes: plans.csv (one line per planner and task), summary.json (per setting: means,
DreamShard's wins / ties / losses against the best heuristic of each task, its worst ratio to it,
the cost net's max-device error on these measured plans), for each DreamShard model.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace
from typing import Sequence

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import FAMILIES, HELD_OUT_FAMILIES, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.learned.nets import DreamShardModel  # noqa: E402
from dreamshard.packing import format_bytes  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402

GB = 10**9
# (tables, devices, bytes per device); the task seeds follow gpu_shipped_model.py (200 + devices),
# the tight setting has its own
SETTINGS = ((40, 4, 24 * GB, 204), (80, 8, 24 * GB, 208), (120, 8, 8 * GB, 308))
HEURISTICS = ("size", "dim", "lookup", "size_lookup")
TIE = 0.01  # within 1% of the best heuristic: a tie (the runner's repeat-to-repeat spread is ~1%)
# a plans.csv row without a family column is of `mixed` (files written before there was --families)
UNNAMED_FAMILY = "mixed"
COLUMNS = ["family", "setting", "task", "planner", "measured_ms", "measured_max_device_ms", "predicted_max_device_ms", "sim_ms", "plan_s"]


def setting_name(n: int, d: int, cap: int) -> str:
    return f"{n} tables / {d} devices / {format_bytes(cap)}"


def summarise(rows: list[dict], dreamshard: str) -> dict:
    """Per setting: the model `dreamshard` against the heuristics on the tasks measured whole."""
    out = {}
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting]
        by_task: dict[int, dict[str, dict]] = {}
        for r in mine:
            by_task.setdefault(r["task"], {})[r["planner"]] = r
        tasks = [t for t, planners in by_task.items() if dreamshard in planners and all(h in planners for h in HEURISTICS)]
        if not tasks:
            continue
        entry = {"tasks": len(tasks), "mean_measured_ms": {}}
        for p in (dreamshard, *HEURISTICS):
            entry["mean_measured_ms"][p] = float(np.mean([by_task[t][p]["measured_ms"] for t in tasks]))
        ratios = []
        for t in tasks:
            best = min(by_task[t][h]["measured_ms"] for h in HEURISTICS)
            ratios.append(by_task[t][dreamshard]["measured_ms"] / best)
        entry["wins"] = sum(r < 1 - TIE for r in ratios)
        entry["ties"] = sum(1 - TIE <= r <= 1 + TIE for r in ratios)
        entry["losses"] = sum(r > 1 + TIE for r in ratios)
        entry["worse_than_best_heuristic_by_over_2pct"] = sum(r > 1.02 for r in ratios)
        entry["worst_ratio_to_best_heuristic"] = float(max(ratios))
        entry["mean_ratio_to_best_heuristic"] = float(np.mean(ratios))
        pred = [(by_task[t][dreamshard]["predicted_max_device_ms"], by_task[t][dreamshard]["measured_max_device_ms"]) for t in tasks]
        if all(p is not None for p, _ in pred):
            # the cost net's per-plan max-device error on measured held-out plans (target ≤ 5%)
            entry["cost_net_max_device_mape"] = float(np.mean([abs(p - m) / m for p, m in pred]))
        entry["sim_mape"] = float(np.mean([abs(r["sim_ms"] - r["measured_ms"]) / r["measured_ms"] for r in mine]))
        out[setting] = entry
    return out


def summaries(rows: list[dict], families: list[str], models: list[str]) -> dict:
    """summarise() per model (one family), or per family and model."""
    if len(families) == 1:
        return {m: summarise([r for r in rows if r["family"] == families[0]], m) for m in models}
    return {f: {m: summarise([r for r in rows if r["family"] == f], m) for m in models} for f in families}


def with_product_rule(model: DreamShardModel, rule: str) -> DreamShardModel:
    """`model`'s weights with its product-path features marked by `rule` (nets.PRODUCT_RULES)."""
    return replace(model, kernel=replace(model.kernel, product_rule=rule))


def shipped_before_kernel_rule() -> DreamShardPlanner:
    """The shipped model as it planned in the campaigns before 2026-11-25's product-rule commit
    (39c5542): the same weights, its product-path features on every candidate of the path's model
    (nets.PRODUCT_RULES "candidate"). Their "dreamshard (shipped)" plans are this planner's."""
    return DreamShardPlanner(with_product_rule(DreamShardModel.load(), "candidate"), split=False)


def measured_plans(plans_csv: str, planners: dict, families: Sequence[str] | None = None, pool_tables: int = 300, seed_offset: int = 0):
    """The plans a campaign (of `seed_offset`) measured, re-drawn and re-planned on the CPU (tasks and
    planners are deterministic), for checking a cost model against them: yields (family, setting,
    row of plans.csv, plan) for every row whose planner is in `planners` (label → planner).
    Exits with a one-line error where a re-planned plan's predicted max-device cost is not the one
    the campaign recorded: that planner (or its model) is not the one that made the measured plan."""
    with open(plans_csv, newline="") as fh:
        rows = {(r.get("family") or UNNAMED_FAMILY, r["setting"], int(r["task"]), r["planner"]): r for r in csv.DictReader(fh)}
    workload = Workload(65_536)
    for family in dict.fromkeys(k[0] for k in rows):
        if families is not None and family not in families:
            continue
        pool = synth_family(family, pool_tables, 11)
        for n, d, cap, seed in SETTINGS:
            name = setting_name(n, d, cap)
            tasks = sorted({k[2] for k in rows if k[:2] == (family, name)})
            drawn = sample_tasks(pool, max(tasks) + 1, (n, n), d, cap, seed=seed + seed_offset, workload=workload) if tasks else []
            for i in tasks:
                for label, planner in planners.items():
                    row = rows.get((family, name, i, label))
                    if row is None:
                        continue
                    plan = planner.plan(drawn[i])
                    recorded, devices = row.get("predicted_max_device_ms"), (plan.predicted or {}).get("devices")
                    now = max(d["total_ms"] for d in devices) if devices else None
                    if recorded and now is not None and abs(now / float(recorded) - 1) > 1e-3:
                        sys.exit(f"{plans_csv}: {family}, {name}, task {i}: '{label}' does not remake the measured plan "
                                 f"(predicted {now:.4f} ms, the campaign {float(recorded):.4f}): give the model that made it")
                    yield family, name, row, plan


def merge(paths: list[str], out_dir: str) -> None:
    """The rows of several calls' plans.csv (the first of a repeated (family, setting, task,
    planner) kept) into out_dir/plans.csv and their summary.json."""
    rows, seen = [], set()
    for path in paths:
        with open(path, newline="") as fh:
            for r in csv.DictReader(fh):
                r["family"] = r.get("family") or UNNAMED_FAMILY
                key = (r["family"], r["setting"], r["task"], r["planner"])
                if key in seen:
                    continue
                seen.add(key)
                r["task"] = int(r["task"])
                for k in ("measured_ms", "measured_max_device_ms", "sim_ms", "plan_s"):
                    r[k] = float(r[k])
                r["predicted_max_device_ms"] = float(r["predicted_max_device_ms"]) if r["predicted_max_device_ms"] else None
                rows.append(r)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "plans.csv"), "w", newline="") as fh:
        out = csv.DictWriter(fh, COLUMNS)
        out.writeheader()
        out.writerows(rows)
    families = list(dict.fromkeys(r["family"] for r in rows))
    models = [p for p in dict.fromkeys(r["planner"] for r in rows) if p.startswith("dreamshard")]
    summary = {"merged_from": paths, "families": families, "tie_band": TIE, "models": summaries(rows, families, models)}
    atomic_write(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", action="append", default=[], help="a DreamShard model file to measure beside the shipped one (repeatable)")
    ap.add_argument("--tasks", type=int, default=16, help="held-out tasks per setting")
    ap.add_argument("--first-task", type=int, default=0, help="start at this task of each setting (to go on from a cut run)")
    ap.add_argument("--skip-done", help="a plans.csv of an earlier call: the (family, setting, task) it measured are not measured again")
    ap.add_argument("--families", default=",".join(HELD_OUT_FAMILIES), help=f"comma-separated table families (pools of seed 11)  [default: the held-out ones, {','.join(HELD_OUT_FAMILIES)}]")
    ap.add_argument("--pool-tables", type=int, default=300)
    ap.add_argument("--total-s", type=float, default=540.0)
    ap.add_argument("--quick", action="store_true", help="CPU logic check: batch 1024, 1 task per setting, small tables")
    ap.add_argument("--settings", default="0,1,2", help="which settings, by index: 0 = 40 tables / 4 devices, 1 = 80 / 8, 2 = 120 / 8 at 8 GB")
    ap.add_argument("--seed-offset", type=int, default=0, help="added to every setting's task seed: other tasks of the same pools")
    ap.add_argument("--tasks-from", metavar="CSV", help="a plans.csv of an earlier call: measure only the (family, setting, task) it measured")
    ap.add_argument("--only", action="append", default=[], metavar="LABEL",
                    help="measure only these planners (labels as in plans.csv, repeatable); with --tasks-from, a model on an earlier call's tasks, joined to it with --merge")
    ap.add_argument("--merge", nargs="+", metavar="CSV", help="no measuring: the plans.csv of several calls into one plans.csv and summary.json in --out")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    t0 = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    log = lambda text: print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)  # noqa: E731
    from dreamshard.costs.runners import SequentialRunner

    batch = 1024 if args.quick else 65_536
    workload = Workload(batch)
    runner = SequentialRunner("triton" if args.device == "cuda" else "torch", device=args.device)
    sim = SimBackend()
    models = {"dreamshard (shipped)": get_planner("dreamshard", split=False), **{f"dreamshard ({os.path.basename(m)})": DreamShardPlanner(model=m, split=False) for m in args.model}}
    planners = {**models, **{h: get_planner(h) for h in HEURISTICS}}
    if args.only:
        unknown = [p for p in args.only if p not in planners]
        if unknown:
            ap.error(f"--only: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(map(repr, planners))}")
        planners = {p: planners[p] for p in args.only}
    families = args.families.split(",")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    n_tasks = 1 if args.quick else args.tasks
    summary: dict = {"device": args.device, "batch_size": batch, "held_out_families": list(HELD_OUT_FAMILIES), "families": families, "pool_seed": 11,
                     "simulator": sim.calibration.label, "runner": runner.name, "tie_band": TIE, "settings": args.settings, "seed_offset": args.seed_offset}
    def tasks_of(path: str) -> set:
        with open(path, newline="") as fh:
            return {(r.get("family") or UNNAMED_FAMILY, r["setting"], int(r["task"])) for r in csv.DictReader(fh)}

    if args.skip_done and args.tasks_from:
        ap.error("--skip-done and --tasks-from: choose one")
    done = tasks_of(args.skip_done) if args.skip_done else set()
    wanted = tasks_of(args.tasks_from) if args.tasks_from else None
    # every family's tasks drawn before anything is measured: a setting a family's pool cannot fill
    # (its tables over the devices' memory) is said at once and left out, not found mid-run
    settings = [((8, 4, 24 * GB, 204), (12, 8, 24 * GB, 208), (16, 8, GB // 20, 308))[i] if args.quick else s for i, s in enumerate(SETTINGS)]
    try:
        chosen = [int(i) for i in args.settings.split(",")]
        settings = [(n, d, cap, seed + args.seed_offset) for n, d, cap, seed in (settings[i] for i in chosen)]
    except (ValueError, IndexError):
        ap.error(f"--settings: comma-separated indices 0-{len(SETTINGS) - 1}, not {args.settings!r}")
    tasks: dict[str, dict[str, list]] = {}
    summary["infeasible"] = {}
    for family in families:
        pool = synth_family(family, args.pool_tables, 11)
        if args.quick:  # tables a CPU initialises in seconds
            pool = [t for t in pool if t.rows <= 200_000]
        tasks[family] = {}
        for n, d, cap, seed in settings:
            try:
                tasks[family][setting_name(n, d, cap)] = sample_tasks(pool, n_tasks, (n, n), d, cap, seed=seed, workload=workload)
            except InputError as e:
                summary["infeasible"].setdefault(family, {})[setting_name(n, d, cap)] = str(e)
                log(f"{family}: {setting_name(n, d, cap)} left out: {e}")
    rows: list[dict] = []
    with open(os.path.join(args.out, "plans.csv"), "w", newline="") as fh:
        out = csv.DictWriter(fh, COLUMNS)
        out.writeheader()
        for k, family in enumerate(families):
            deadline = args.total_s * (k + 1) / len(families)  # each family its share of the time box
            for i in range(args.first_task, n_tasks):
                for setting, ts in tasks[family].items():
                    if time.monotonic() - t0 > deadline:
                        break
                    if (family, setting, i) in done or (wanted is not None and (family, setting, i) not in wanted):
                        continue
                    measured: dict[tuple, tuple] = {}  # a placement two planners share is measured once
                    for label, planner in planners.items():
                        t = time.monotonic()
                        plan = planner.plan(ts[i])
                        plan_s = time.monotonic() - t
                        key = tuple(sorted((s.table, s.device, s.start, s.stop, s.row_start, s.row_stop or 0) for s in plan.shards))
                        if key not in measured:
                            report = runner.evaluate_plan(plan)
                            measured[key] = (report.overall_ms, max(c.total_ms for c in report.devices), sim.evaluate_plan(plan).overall_ms)
                        ms, max_dev, sim_ms = measured[key]
                        predicted = plan.predicted or {}
                        row = {"family": family, "setting": setting, "task": i, "planner": label, "measured_ms": round(ms, 5), "measured_max_device_ms": round(max_dev, 5),
                               "predicted_max_device_ms": max((c["total_ms"] for c in predicted.get("devices", [])), default=None),
                               "sim_ms": round(sim_ms, 5), "plan_s": round(plan_s, 3)}
                        out.writerow(row)
                        rows.append(row)
                    fh.flush()
                    log(f"{family}: {setting} task {i}: " + ", ".join(f"{r['planner']} {r['measured_ms']:.3f}" for r in rows[-len(planners):]))
                else:
                    continue
                log(f"time box: {family} stopped in round {i} of {n_tasks}")
                break
    summary["models"] = summaries(rows, families, list(models))
    summary["elapsed_s"] = round(time.monotonic() - t0, 1)
    atomic_write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1))
    log("done: " + json.dumps(summary["models"], indent=1))


if __name__ == "__main__":
    main()
