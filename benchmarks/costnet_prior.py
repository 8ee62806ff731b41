"""DreamShard's cost net against real H200 measurements, with and without the simulator prior
(issue 10): offline, on the CPU, from the committed records of one GPU campaign.

    PYTHONPATH=. python benchmarks/costnet_prior.py --out benchmarks/results/costnet_prior   # CPU, one core, ~50 min
    PYTHONPATH=. python benchmarks/costnet_prior.py --out /tmp/c --quick                     # logic check, ~1 min

Seeds (and variants) can run side by side, one core each, and be merged (the committed results):
    python benchmarks/costnet_prior.py --out /tmp/s0 --seeds 1 --first-seed 0; ... --out /tmp/s2a --first-seed 2 --seeds 1 --variants 0
    python benchmarks/costnet_prior.py --out /tmp/s1 --seeds 1 --first-seed 1; ... --out /tmp/s2b --first-seed 2 --seeds 1 --variants 1,2
    python benchmarks/costnet_prior.py --out benchmarks/results/costnet_prior --seeds 0 --merge /tmp/s0/summary.json /tmp/s1/summary.json /tmp/s2a/summary.json /tmp/s2b/summary.json

The records (benchmarks/results/gpu_families/, benchmarks/gpu_families.py, docs/costs.md):
calib_records.jsonl holds 60 shards of the six training families (pool seed 10), each timed alone;
val_records.jsonl holds 70 shards of pool seed 11 (10 per family, the held-out `mixed` included)
and the 168 device shards of 28 whole table-wise plans (4 per family: lookup-greedy and DreamShard,
40 tables on 4 devices and 80 on 8). A record is one device's measured forward and backward compute
(fwd_ms, bwd_ms): the targets of the cost net's fwd_comp and bwd_comp heads for a device holding
those tables. A plan's all-to-all was not measured: the campaign added the shipped comm model's
(dreamshard/data/comm/h200_nccl.json, `placement_ms` of the devices' dim sums) — as the sequential
runner does when DreamShard trains on a GPU, so it is the comm head's target there too. This script
recomputes it and checks that it reproduces placements.csv's measured_ms. A plan's measured cost is
then max_d(fwd_d + bwd_d + comm_d), and the cost net's the same max over its three heads' sum
(nets.plan_cost "max_device", the shipped model's score).

Cost nets (the shipped one once, the others per --seeds):
  shipped          dreamshard/data/models/dreamshard_h200.pt: trained on an H200 from 80 measured plans
  prior            a fresh net after the training loop's prior phase (learned.dreamshard.fit_prior):
                   --prior-plans plans of the initial policy on the training tasks of
                   benchmarks/gpu_shipped_model.py, priced by the simulator (default calibration)
  prior+gpu s=S    (S in --shares) that net fine-tuned on the 60 calibration shards (training families only) with the
                   loop's batches (fit_batch: a share S of each batch prior plans) and loss (cost_loss;
                   a shard timed alone has no all-to-all and no plan cost: those targets are NaN), for
                   iterations × cost_steps steps at the config's lr decayed to 0, as the loop fits
  gpu only         a fresh net fitted the same way on the 60 shards alone (no prior; its scale is
                   their mean compute, its comm head untrained)
  ... LOFO         per family F: the prior net fine-tuned on the GPU records of every *training*
                   family but F (calibration and validation records, shards and plans; `mixed` never),
                   evaluated on F: each family's error on tables and plans of a family it never saw
                   measured (for `mixed` this is all six training families)
  (kernel features)             the same with Config.kernel_features (learned/nets.KernelFeatures):
                   the per-table kernel terms the simulator prices (costs/terms.py: programs, tiles,
                   masked bytes, ...; scaled by their mean over the training tables, stored with the
                   model) and a dim > 256 flag appended to the features; prior and prior+gpu
  (kernel features, comm model) and Config.comm "model" (nets.CommFormula): a device's all-to-all
                   from the comm model of the backend trained against (here the simulator's, the same
                   parameters as h200_nccl.json) in place of the comm head, which is not fitted;
                   prior, prior+gpu, LOFO
  simulator        the prior's teacher itself, for reference

Every net predicts through the library's own path (mdp.prepare → table_features, mdp.predict), as
the planner does; the model options are the library's (learned/dreamshard.py, Config).

Per family: compute MAPE of fwd + bwd over its 34 validation shards (10 alone, 24 in plans);
plan MAPE (and mean signed error) of the max-device cost over its 4 measured plans; and, with more
plans than were measured, the max-device MAPE against the simulator on held-out plans of the family
(pool seed 11: lookup-greedy and 2 random placements of each task, 40 tables / 4 devices and 80 / 8),
the simulator being within 2-3% of the GPU on plans (docs/costs.md).
Writes summary.json (every number, per seed) and summary.md (the tables).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_shipped_model import training_tasks  # noqa: E402
from dreamshard.costs.calibrate import load_records  # noqa: E402
from dreamshard.costs.comm import load_comm_model  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import FAMILIES, HELD_OUT_FAMILY, TRAINING_FAMILIES, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.learned.dreamshard import cost_loss, create_model, fit_batch, fit_prior, get_config, prior_steps  # noqa: E402
from dreamshard.learned.loop import Progress, decay_lr  # noqa: E402
from dreamshard.learned.mdp import EpisodeBatch, predict as predict_units, prepare  # noqa: E402
from dreamshard.learned.nets import DreamShardModel, Measured, ReplayBuffer  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.tasks import Task, Workload, sample_tasks  # noqa: E402

RECORDS = "benchmarks/results/gpu_families"
COMM_MODEL = "dreamshard/data/comm/h200_nccl.json"
SETTINGS = ((40, 4), (80, 8))
CAP = 24 * 10**9
# the cost nets compared, by the model options they set (Config): name suffix → overrides
VARIANTS = {"": {}, " (kernel features)": {"kernel_features": True}, " (kernel features, comm model)": {"kernel_features": True, "comm": "model"}}


# --------------------------------------------------------------------------------------------
# Plans: lists of shards (one list of tables per device), with measured or simulated costs
# --------------------------------------------------------------------------------------------


def as_task(plan, workload: Workload) -> tuple[Task, np.ndarray]:
    """A plan (shards) as a task of its tables (memory unbounded) and the placement of them."""
    tables = [t for shard in plan for t in shard]
    return Task(tables, len(plan), 10**15, workload), np.array([d for d, shard in enumerate(plan) for _ in shard], np.int64)


def as_measured(plan, model: DreamShardModel, workload: Workload, costs: np.ndarray) -> Measured:
    """A measured plan (shards) as the nets' input (the model's features); `costs` [D, 3] ms (NaN: not measured)."""
    task, placement = as_task(plan, workload)
    costs = costs.astype(np.float32)
    overall = float(costs.sum(1).max()) if not np.isnan(costs).any() else float("nan")
    return Measured(model.features(task.tables, workload), placement, costs, overall)


def predict(model: DreamShardModel, plans, workload: Workload, chunk: int = 512) -> list[np.ndarray]:
    """Per plan, [D, 3] predicted (fwd, bwd, comm) ms, as the planner predicts a plan (mdp.predict:
    the per-device heads, with the model's comm model where it has one)."""
    out = []
    for s in range(0, len(plans), chunk):
        part = [as_task(p, workload) for p in plans[s : s + chunk]]
        batch = EpisodeBatch.of([prepare(t, model.normalization, model.linear_features, model.kernel) for t, _ in part])
        placement = torch.full(batch.sizes.shape, -1, dtype=torch.int64)
        for i, (_, p) in enumerate(part):
            placement[i, : len(p)] = torch.from_numpy(p)
        dev, _ = predict_units(model.cost_net, batch, placement, model.comm)
        out += [dev[i, : t.devices].numpy() * float(model.cost_net.scale) for i, (t, _) in enumerate(part)]
    return out


class Records:
    """The campaign's records as plans: single shards (one device, no all-to-all) and whole plans."""

    def __init__(self, root: str, comm_model, workload: Workload):
        self.calib, self.val = load_records(os.path.join(root, "calib_records.jsonl")), load_records(os.path.join(root, "val_records.jsonl"))
        self.comm, self.workload = comm_model, workload

    def comm_ms(self, plan) -> np.ndarray:
        fwd, bwd = self.comm.placement_ms([sum(t.dim for t in shard) for shard in plan], self.workload.batch_size, self.workload.elt_bytes)
        return np.array(fwd) + np.array(bwd)

    def split(self, records):
        """→ (shards: [(family, plan of one shard, [1, 3] costs with NaN comm)],
              plans: [(family, plan, [D, 3] costs with the comm model's all-to-all)])."""
        shards, by_plan = [], defaultdict(list)
        for r in records:
            shards.append((r.family, [r.tables], np.array([[r.fwd_ms, r.bwd_ms, np.nan]])))
            if r.placement is not None:
                by_plan[r.placement].append(r)
        plans = []
        for p in sorted(by_plan):
            rs = sorted(by_plan[p], key=lambda r: r.device)
            plan = [r.tables for r in rs]
            costs = np.array([[r.fwd_ms, r.bwd_ms, c] for r, c in zip(rs, self.comm_ms(plan))])
            plans.append((rs[0].family, plan, costs))
        return shards, plans

    def check_comm(self, placements_csv: str, plans) -> int:
        """How many plans' recomputed measured cost equals placements.csv's measured_ms (5 decimals)."""
        import csv

        rows = list(csv.DictReader(open(placements_csv)))
        return sum(abs(float(row["measured_ms"]) - float(c.sum(1).max())) < 1e-4 for row, (_, _, c) in zip(rows, plans))


def sim_plans(families, sim: SimBackend, workload: Workload, tasks_per_setting: int, seed: int = 5) -> dict:
    """Per family: held-out plans (pool seed 11; lookup-greedy and 2 random placements per task)
    and their simulated max-device ms."""
    lookup = get_planner("lookup")
    rng = np.random.default_rng(seed)
    out = {}
    for f in families:
        pool = synth_family(f, None, 11)
        plans = []
        for n, d in SETTINGS:
            try:
                tasks = sample_tasks(pool, tasks_per_setting, (n, n), d, CAP, seed=200 + d, workload=workload)
            except Exception:  # noqa: BLE001 - onehot's 4·10^7-row tables: fewer per task
                tasks = sample_tasks(pool, tasks_per_setting, (n // 2, n // 2), d, CAP, seed=200 + d, workload=workload)
            for t in tasks:
                plans.append(lookup.plan(t).device_tables())
                for _ in range(2):
                    p = rng.integers(d, size=len(t.tables))
                    plans.append([[t.tables[i] for i in range(len(t.tables)) if p[i] == k] for k in range(d)])
        plans = [p for p in plans if all(p)]
        out[f] = (plans, np.array([sim.evaluate(p, workload).overall_ms for p in plans]))
    return out


# --------------------------------------------------------------------------------------------
# Scores
# --------------------------------------------------------------------------------------------


def score(predict_plans, shards, plans, held_out) -> dict:
    """Per family: compute MAPE (shards), plan MAPE and signed error (measured plans), comm head
    MAPE (plan devices), max-device MAPE against the simulator (held-out simulated plans)."""
    out = {}
    pred_shards = predict_plans([p for _, p, _ in shards])
    pred_plans = predict_plans([p for _, p, _ in plans])
    for f in [f for f in FAMILIES if any(g == f for g, _, _ in shards)]:
        comp = [abs(pr[0, :2].sum() - c[0, :2].sum()) / c[0, :2].sum() for (g, _, c), pr in zip(shards, pred_shards) if g == f]
        signed = [(pr.sum(1).max() - c.sum(1).max()) / c.sum(1).max() for (g, _, c), pr in zip(plans, pred_plans) if g == f]
        # the same with the comm model's all-to-all in place of the comm head: the compute heads' share of the error
        exact = [(pr[:, :2].sum(1) + c[:, 2]).max() / c.sum(1).max() - 1 for (g, _, c), pr in zip(plans, pred_plans) if g == f]
        comm = [np.abs(pr[:, 2] - c[:, 2]) / c[:, 2] for (g, _, c), pr in zip(plans, pred_plans) if g == f]
        entry = {"compute_mape": float(np.mean(comp)), "shards": len(comp), "plan_mape": float(np.mean(np.abs(signed))),
                 "plan_signed": float(np.mean(signed)), "plans": len(signed), "plan_mape_exact_comm": float(np.mean(np.abs(exact))),
                 "comm_mape": float(np.mean(np.concatenate(comm)))}
        if f in held_out:
            sp, truth = held_out[f]
            pred = np.array([p.sum(1).max() for p in predict_plans(sp)])
            entry["vs_sim_plan_mape"] = float(np.mean(np.abs(pred - truth) / truth))
            entry["vs_sim_plans"] = len(sp)
        out[f] = entry
    return out


def sim_predictor(sim: SimBackend, records: Records, workload: Workload):
    """The simulator as a predictor: its compute per shard, the comm model's all-to-all."""

    def run(plans):
        out = []
        for plan in plans:
            comp = sim.shard_compute(plan, workload)
            comm = records.comm_ms(plan) if len(plan) > 1 else np.full(1, np.nan)
            out.append(np.column_stack([comp, comm]))
        return out

    return run


# --------------------------------------------------------------------------------------------
# Fitting: the loop's prior phase, and fine-tuning on measured records
# --------------------------------------------------------------------------------------------


def prior_model(cfg, tasks, sim: SimBackend) -> tuple[DreamShardModel, ReplayBuffer, float]:
    """A fresh model as `train` makes it (create_model: its options, seed, the simulator's comm
    model) after the loop's prior phase on `tasks` (fit_prior)."""
    model = create_model(cfg, tasks, sim)
    prepared = [prepare(t, cfg.normalization, cfg.linear_features, model.kernel) for t in tasks]
    rng, gen = np.random.default_rng(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    t0 = time.time()
    buffer, _ = fit_prior(cfg, model, tasks, prepared, sim, rng, gen, Progress(False, 1, 0, {}))
    return model, buffer, time.time() - t0


def fine_tune(cfg, model: DreamShardModel, data: list[Measured], prior: ReplayBuffer, share: float) -> DreamShardModel:
    """A copy of `model` whose cost net is fitted on `data` as the loop fits it over a run:
    iterations × cost_steps steps of fit_batch/cost_loss, Adam at cfg.lr decayed linearly to 0."""
    import copy

    model = copy.deepcopy(model)
    net = model.cost_net
    run = replace(cfg, prior_share=share)
    real = ReplayBuffer()
    for m in data:
        real.add(m)
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    steps = cfg.iterations * cfg.cost_steps
    for step in range(steps):
        decay_lr(optimizer, cfg.lr, step, steps)
        loss = cost_loss(net, fit_batch(real, prior if share else ReplayBuffer(), run, rng), model.comm is None)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def gpu_only(cfg, data: list[Measured], tasks, sim: SimBackend) -> DreamShardModel:
    model = create_model(cfg, tasks, sim)
    model.cost_net.scale.fill_(float(np.mean([np.nansum(m.device_costs[:, :2], 1).max() for m in data])))
    return fine_tune(cfg, model, data, ReplayBuffer(), 0.0)


# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--records", default=RECORDS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--prior-plans", type=int, default=8000)
    ap.add_argument("--prior-epochs", type=int, default=80)
    ap.add_argument("--shares", default="0,0.5,0.8", help="prior shares of the fine-tuning batches to compare")
    ap.add_argument("--sim-tasks", type=int, default=10, help="held-out tasks per family and setting priced by the simulator")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds --first-seed .. --first-seed + --seeds - 1 (runs of other seeds merge with --merge)")
    ap.add_argument("--variants", default=",".join(str(i) for i in range(len(VARIANTS))),
                    help=f"which cost nets (indices into {[v or ' (shipped config)' for v in VARIANTS]}), comma-separated")
    ap.add_argument("--merge", nargs="*", default=[], help="summary.json files of other seeds' runs to merge into this one's tables")
    ap.add_argument("--quick", action="store_true", help="a tiny run that checks the logic (1 seed, 300 plans, 188 prior steps, 80 fine-tuning steps, 1 task per family and setting)")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.prior_plans, args.prior_epochs, args.sim_tasks = 1, 300, 40, 1
    shares = [float(s) for s in args.shares.split(",")]
    torch.set_num_threads(1)  # small nets: one thread is as fast, and two runs side by side do not thrash
    t0 = time.monotonic()
    log = lambda text: print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)  # noqa: E731
    os.makedirs(args.out, exist_ok=True)

    workload = Workload(65_536)
    sim = SimBackend()
    records = Records(args.records, load_comm_model(COMM_MODEL, "cuda"), workload)
    if any(r.family == HELD_OUT_FAMILY for r in records.calib):
        raise SystemExit(f"{args.records}: calibration records of the held-out family {HELD_OUT_FAMILY!r}")
    val_shards, val_plans = records.split(records.val)
    calib_shards, _ = records.split(records.calib)
    same = records.check_comm(os.path.join(args.records, "placements.csv"), val_plans)
    log(f"records: {len(calib_shards)} calibration shards, {len(val_shards)} validation shards, {len(val_plans)} plans "
        f"({same} of them reproduce placements.csv's measured_ms with the comm model)")
    tasks = training_tasks(1 if args.quick else 12, 300, workload)
    held_out = sim_plans(FAMILIES, sim, workload, args.sim_tasks)
    log(f"{len(tasks)} training tasks; {sum(len(p) for p, _ in held_out.values())} held-out simulated plans")

    base = get_config("default", prior_plans=args.prior_plans, prior_epochs=args.prior_epochs, batch_size=workload.batch_size, budget=80, iterations=8,
                      cost_steps=10 if args.quick else None)
    summary: dict = {"records": args.records, "comm_model": COMM_MODEL, "plans_reproduced": same, "simulator": sim.name, "config": {
        k: getattr(base, k) for k in ("prior_plans", "prior_epochs", "iterations", "cost_steps", "cost_batch", "lr", "normalization", "linear_features")},
        "training_tasks": len(tasks), "seeds": args.seeds, "nets": {}}

    def add(name: str, seed: int | None, result: dict) -> None:
        summary["nets"].setdefault(name, {})["shipped" if seed is None else f"seed {seed}"] = result
        mixed = result[HELD_OUT_FAMILY]
        log(f"{name}{'' if seed is None else f' (seed {seed})'}: mixed plan {100 * mixed['plan_mape']:.1f}%, compute {100 * mixed['compute_mape']:.1f}%; "
            f"worst plan {max(100 * r['plan_mape'] for r in result.values()):.1f}%")
        atomic_write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1))

    add("simulator", None, score(sim_predictor(sim, records, workload), val_shards, val_plans, held_out))
    shipped = DreamShardModel.load()
    add("shipped", None, score(lambda plans: predict(shipped, plans, workload), val_shards, val_plans, held_out))

    train_shards, train_plans = records.split([r for r in records.calib + records.val if r.family in TRAINING_FAMILIES])
    summary["variants"] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for i in [int(v) for v in args.variants.split(",")]:
            tag, options = list(VARIANTS.items())[i]
            summary["variants"][tag or "(shipped config)"] = options
            cfg = replace(base, seed=seed, **options)
            model, prior, seconds = prior_model(cfg, tasks, sim)
            summary.setdefault("prior_seconds", []).append(round(seconds, 1))
            run = lambda m: (lambda plans: predict(m, plans, workload))  # noqa: E731
            add("prior" + tag, seed, score(run(model), val_shards, val_plans, held_out))
            calib = [as_measured(p, model, workload, c) for _, p, c in calib_shards]
            for share in shares if tag != " (kernel features)" else [0.5]:  # kernel features alone: the comm head's share of the error, at the default share
                add(f"prior+gpu s={share:g}{tag}", seed, score(run(fine_tune(cfg, model, calib, prior, share)), val_shards, val_plans, held_out))
            if tag == " (kernel features)":
                continue
            if not tag:
                add("gpu only", seed, score(run(gpu_only(cfg, calib, tasks, sim)), val_shards, val_plans, held_out))
            for share in shares if not tag else [0.5]:  # the new options: the default share only
                lofo = {}
                for f in FAMILIES:
                    data = [as_measured(p, model, workload, c) for g, p, c in train_shards + train_plans if g != f]
                    lofo[f] = score(run(fine_tune(cfg, model, data, prior, share)), [s for s in val_shards if s[0] == f], [p for p in val_plans if p[0] == f],
                                    {f: held_out[f]})[f]
                add(f"prior+gpu LOFO s={share:g}{tag}", seed, lofo)
    for path in args.merge:  # other seeds' runs of the same script (run side by side on two cores)
        other = json.load(open(path))
        summary["prior_seconds"] = summary.get("prior_seconds", []) + other.get("prior_seconds", [])
        summary["variants"].update(other.get("variants", {}))
        for name, runs in other["nets"].items():
            for key, result in runs.items():
                summary["nets"].setdefault(name, {}).setdefault(key, result)
    summary["seeds"] = len({key for runs in summary["nets"].values() for key in runs if key.startswith("seed")})
    summary["elapsed_s"] = round(time.monotonic() - t0, 1)
    atomic_write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1))
    atomic_write(os.path.join(args.out, "summary.md"), markdown(summary))
    log(f"wrote {args.out}/summary.json, summary.md")


def mean_over_seeds(runs: dict) -> dict:
    """{family: {metric: mean over the runs}}."""
    fams = next(iter(runs.values()))
    return {f: {k: float(np.mean([r[f][k] for r in runs.values()])) for k in fams[f]} for f in fams}


def markdown(summary: dict) -> str:
    nets = {name: mean_over_seeds(runs) for name, runs in summary["nets"].items()}
    fams = list(FAMILIES)
    head = "| cost net | " + " | ".join(f"`{f}`" + (" (held out)" if f == HELD_OUT_FAMILY else "") for f in fams) + " | worst |\n|---|" + "---:|" * (len(fams) + 1) + "\n"

    def table(metric: str, signed: str | None = None) -> str:
        lines = head
        for name, res in nets.items():
            if metric not in res[fams[0]]:
                continue
            cells = [f"{100 * res[f][metric]:.1f}%" + (f" ({100 * res[f][signed]:+.1f})" if signed else "") for f in fams]
            lines += f"| {name} | " + " | ".join(cells) + f" | {max(100 * res[f][metric] for f in fams):.1f}% |\n"
        return lines

    c = summary["config"]
    return (f"# The cost net against H200 measurements, with the simulator prior\n\n"
            f"`PYTHONPATH=. python benchmarks/costnet_prior.py --out benchmarks/results/costnet_prior` — CPU, against the committed H200 "
            f"measurements of `{summary['records']}` ({summary['plans_reproduced']} of 28 plans' measured cost reproduced from the records and the comm "
            f"model). Prior: {c['prior_plans']} plans, {c['prior_epochs']} epochs ({prior_steps(replace(get_config('default'), **c))} steps), priced by {summary['simulator']}; fine-tuning: "
            f"{c['iterations']} × {c['cost_steps']} steps, lr {c['lr']}. Means over {summary['seeds']} seeds (the shipped model and the simulator: one). "
            f"Seconds per prior fit: {', '.join(str(s) for s in summary.get('prior_seconds', []))}.\n\n"
            f"## Max-device MAPE per measured plan (4 per family; mean signed error in brackets) — target ≤ 5%\n\n{table('plan_mape', 'plan_signed')}\n"
            f"## Compute MAPE per device shard (fwd + bwd, 34 per family)\n\n{table('compute_mape')}\n"
            f"## Max-device MAPE against the simulator on held-out simulated plans (more plans than measured)\n\n{table('vs_sim_plan_mape')}\n"
            f"## Comm head MAPE on the measured plans' devices (its target: the comm model)\n\n{table('comm_mape')}\n"
            f"## Max-device MAPE per measured plan with the comm model's all-to-all in place of the comm head (the compute heads' share)\n\n"
            f"{table('plan_mape_exact_comm')}\n")


if __name__ == "__main__":
    main()
