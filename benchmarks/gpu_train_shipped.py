"""The shipped models of every learned planner — dreamshard, autoshard, rnn — trained from real
measurements in one call on one GPU (≤ 9.5 minutes; `--resume` goes on from OUT if a call is cut):

    PYTHONPATH=. python3 benchmarks/gpu_train_shipped.py --out OUT            # → OUT/{dreamshard,autoshard,rnn}_<gpu>.pt
    PYTHONPATH=. python3 benchmarks/gpu_train_shipped.py --out OUT --resume   # a call cut by its limit: the same OUT
    PYTHONPATH=. python3 benchmarks/gpu_train_shipped.py --out /tmp/q --device cpu --quick   # the same logic on CPU (simulator), seconds to minutes

`<gpu>` is the GPU's model as `costs.hardware.gpu_slug` names it (h100, h200): copy the files into
dreamshard/data/models/ and the planners use them without `--model` (`dreamshard.shipped`: the
file of the GPU planned for, else another GPU's, said so).

- **Tasks**, the same for all three: the shipped DreamShard model's — `--tasks-per-family` tasks of
  each *training* family (`families.TRAINING_FAMILIES`, pools of seed 10), 20–60 tables on 2–8
  devices of 24 GB (`training_tasks`); B = 65,536, fp16, SGD.
- **Measurements**: every sampled plan measured by the sequential runner with our Triton TBE on
  the GPU (`--backend triton --runner sequential` of `dreamshard train`), all-to-all from the NCCL
  model shipped for the GPU. Each planner gets a budget of measured plans: `--budget N` for all
  three; else DreamShard's shipped recipe, `--dreamshard-budget` 80 plans (with a simulator prior
  of `--prior-plans` 8,000 plans priced by the default calibration: not measurements), and for
  AutoShard and the RNN placer one budget, the same for both, `--peer-budget` (default `auto`:
  the largest multiple of 10 up to 400 that the time left after DreamShard allows at the time
  per plan DreamShard's measurements took; decided once and kept in summary.json for `--resume`).
- **Configs**: each planner's default config (`Planner.config()`: for DreamShard `default`, as the
  planner class holds it today) with the budget, iterations = budget / the config's measurements
  per iteration, the batch, and for DreamShard the shipped model's cost-net options
  (`DREAMSHARD_OPTIONS`) and the prior. Training through `Planner.fit`.
- **Time**: the call ends by `--total-s` (540 s from the start of the script). Each planner has its
  own deadline — DreamShard's leaves room for the peers' smallest budget, AutoShard's for the RNN
  placer's budget — and a plan is measured only if it can finish before it (`Deadline`). A
  planner out of time stops at its last finished iteration (its checkpoint `MODEL.pt.ckpt`,
  written after every iteration); the next call with `--resume` goes on from there. A model is
  written to OUT as soon as its training ends.

Written as it goes: `<planner>_<gpu>.pt` (+ `.ckpt`), `train_<planner>.jsonl` (each loop's log,
one line per iteration), `measured.jsonl` (one line per measured plan: planner, devices, shards,
tables, seconds, overall_ms), `summary.json` (per planner: done, budget, the real measurements
its model was trained on — plans and shards —, seconds, seconds per plan; the GPU, the backend).
"""

from __future__ import annotations

import time

T0 = time.monotonic()  # the call's clock starts before the imports (torch, CUDA)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import TRAINING_FAMILIES, synth_family  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.planners import PLANNERS  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402
from dreamshard.validation import load_torch_file  # noqa: E402

CAP = 24 * 10**9


def training_tasks(per_family: int, pool_tables: int, workload: Workload, families=TRAINING_FAMILIES) -> list:
    """`per_family` tasks of each family's pool of seed 10 (the calibration shards' pools): 20–60
    tables on 2–8 devices of 24 GB."""
    tasks = []
    for f in families:
        pool = synth_family(f, pool_tables, 10)
        for k in range(per_family):
            tasks += sample_tasks(pool, 1, (20, 60), 2 + k % 7, CAP, seed=100 + k, workload=workload)
    return tasks


ORDER = ("dreamshard", "autoshard", "rnn")  # trained in this order; the peers share one budget
PEERS = ("autoshard", "rnn")
# The shipped DreamShard model's cost-net options on top of the default config (docs/dreamshard.md,
# "The shipped model"): kernel-term features, weighed by the cost net's linear part too, the comm
# model's all-to-all, every training table alone in the prior, the terms a shard pays once
# (shared_terms), and the cost net refined on plans around its own search (priced by the prior),
# with a term on the differences between one task's plans.
DREAMSHARD_OPTIONS = {"kernel_features": True, "comm": "model", "cost_linear": True, "prior_singles": True, "prior_span": 24, "search_plans": 3000,
                      "search_rank": 8.0, "shared_terms": True}
WITH_PRIOR = ("prior_singles", "prior_span", "search_plans", "search_rank", "search_measured")  # need the prior: left out without one
PEER_BUDGET_MAX, PEER_BUDGET_MIN, PEER_BUDGET_STEP = 400, 40, 10  # auto: a multiple of 10 in [40, 400]
# seconds per measured plan before any is timed (a call without DreamShard: the peers' budget is
# decided by it): measured, 1.2–1.3 s on the H100 (dreamshard, autoshard) and 1.9–2.1 s on the
# H200; 1.0 s there gave the peers 200 plans each, and AutoShard ran out of time at 116
GUESS_PLAN_S = 2.0
# seconds a peer spends per measured plan beyond measuring it (learning; autoshard: a V-trace step
# and 20 cost-model steps per 8 plans), and once (its start, the check of its model)
PEER_OVERHEAD_S = {"autoshard": 0.08, "rnn": 0.03}
PEER_FIXED_S = 10.0
SAFETY = 1.2  # on the measured time per plan, for the plans still to come
TAIL_S = {"dreamshard": 12.0, "autoshard": 4.0, "rnn": 3.0}  # an iteration's work after its last measurement (RL, cost net, checkpoint)
# --quick: the configs' per-iteration work shrunk so that the logic runs in seconds on a CPU (a
# field a config lacks is left alone)
QUICK = {"cost_steps": 10, "rl_batches": 2, "prior_epochs": 2, "cost_updates": 2, "search_plans": 16, "search_steps": 5}


class TimeUp(Exception):
    """A planner's deadline came before its training ended: its last checkpoint stands."""


class Deadline:
    """The backend as one planner's training meets it: measures a plan only if it can finish, with
    the rest of its iteration, before `deadline` (TimeUp otherwise), and records every plan it
    measures (`seconds`, `shards`; a line of `log`). Anything else is the backend's."""

    def __init__(self, backend, deadline: float, tail_s: float, planner: str, log: Path | None, guess_s: float = GUESS_PLAN_S, cut_after: int | None = None):
        self.backend, self.deadline, self.tail_s, self.planner, self.log, self.guess_s = backend, deadline, tail_s, planner, log, guess_s
        self.cut_after = cut_after  # tests: the deadline comes after this many plans
        self.seconds: list[float] = []
        self.shards: list[int] = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def expected_s(self) -> float:
        """The next plan's time: the slowest of the last few measured (the guess before any)."""
        return max(self.seconds[-5:]) if self.seconds else self.guess_s

    def evaluate(self, shards, workload: Workload | None = None):
        workload = workload or Workload()
        if time.monotonic() + self.expected_s() + self.tail_s > self.deadline or (self.cut_after is not None and len(self.seconds) >= self.cut_after):
            raise TimeUp(f"{self.planner}: {len(self.seconds)} plans measured in this call; the next would end after its deadline")
        t = time.monotonic()
        report = self.backend.evaluate(shards, workload)
        self.seconds.append(time.monotonic() - t)
        self.shards.append(sum(1 for s in shards if s))
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(json.dumps({"planner": self.planner, "devices": len(shards), "shards": self.shards[-1], "tables": sum(len(s) for s in shards),
                                     "seconds": round(self.seconds[-1], 4), "overall_ms": report.overall_ms, "t": round(time.monotonic() - T0, 2)}) + "\n")
        return report

    def evaluate_many(self, placements, workload: Workload | None = None):
        return [self.evaluate(shards, workload) for shards in placements]


def checkpoint_measurements(path: Path) -> int:
    """Measured plans a training checkpoint holds (0 without one): what its model has learned from."""
    return int(load_torch_file(path, "checkpoint")["measurements"]) if path.is_file() else 0


def checkpoint_budget(path: Path) -> int:
    """The budget of measured plans a training checkpoint's run was started with."""
    ck = load_torch_file(path, "checkpoint")
    config = ck["config"]
    return int(config["budget"] if config.get("budget") is not None else config["iterations"] * config["measurements_per_iteration"])


def gpu_name(device: str) -> tuple[str, str]:
    """(the GPU as the shipped files name it, its full name): ("h100", "NVIDIA H100 80GB HBM3"); ("cpu", CPU) on CPU."""
    from dreamshard.costs.hardware import describe_hardware, gpu_slug

    if device == "cpu":
        return "cpu", describe_hardware("cpu")
    import torch

    name = torch.cuda.get_device_name(0)
    return gpu_slug(name), name


def config(name: str, budget: int, batch: int, prior_plans: int, quick: bool = False, overrides: dict | None = None):
    """The planner's default config with the budget spread over whole iterations of its own size;
    `quick`: its per-iteration work shrunk too (`QUICK`, the fields it has); `overrides`: DreamShard's
    options in place of the recipe's (those of WITH_PRIOR only with a prior)."""
    cls = PLANNERS[name]
    default = cls.config()
    extra = {}
    if name == "dreamshard":
        extra = {**DREAMSHARD_OPTIONS, "prior_plans": prior_plans} if prior_plans else {k: v for k, v in DREAMSHARD_OPTIONS.items() if k not in WITH_PRIOR}
    if quick:
        extra |= {k: v for k, v in QUICK.items() if hasattr(default, k)}
    if name == "dreamshard":  # the caller's over the recipe's and --quick's
        extra |= {k: v for k, v in (overrides or {}).items() if prior_plans or k not in WITH_PRIOR}
    if not extra.get("search_plans"):
        extra.pop("search_rank", None)  # a term of the refinement: none without it
    return cls.config(budget=budget, iterations=max(1, budget // default.measurements_per_iteration), batch_size=batch, **extra)


def peer_budget(seconds_per_plan: float, left_s: float) -> int:
    """The largest multiple of PEER_BUDGET_STEP ≤ PEER_BUDGET_MAX that both peers can measure in
    `left_s` at `seconds_per_plan` (× SAFETY, plus their learning); below PEER_BUDGET_MIN, 0."""
    per_plan = sum(seconds_per_plan * SAFETY + PEER_OVERHEAD_S[p] for p in PEERS)
    fits = (left_s - PEER_FIXED_S * len(PEERS)) / per_plan
    budget = int(min(PEER_BUDGET_MAX, max(0, fits) // PEER_BUDGET_STEP * PEER_BUDGET_STEP))
    return budget if budget >= PEER_BUDGET_MIN else 0


def peer_estimate_s(name: str, budget: int, seconds_per_plan: float) -> float:
    return PEER_FIXED_S + budget * (seconds_per_plan * SAFETY + PEER_OVERHEAD_S[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the models, logs and summary.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--backend", choices=["triton", "torch", "sim"], help="what measures the plans  [cuda: triton (sequential runner); cpu: sim]")
    ap.add_argument("--planners", default=",".join(ORDER), help="which to train, of dreamshard,autoshard,rnn")
    ap.add_argument("--budget", type=int, help="measured plans for every planner (overrides the two below)")
    ap.add_argument("--dreamshard-budget", type=int, default=80, help="DreamShard's measured plans (the shipped recipe)")
    ap.add_argument("--peer-budget", default="auto", help="AutoShard's and the RNN placer's measured plans, the same for both: a number, or auto (≤ 400, what the time allows)")
    ap.add_argument("--search-plans", type=int, help="DreamShard's plans around its own search after training, priced by the simulator (0: none)  [the recipe's: 3000]")
    ap.add_argument("--search-measured", type=int, help="DreamShard's plans near its own search's after training (its plan and a neighbour, on half as many training tasks), measured: beyond --dreamshard-budget (0: none)  [the recipe's: 0]")
    ap.add_argument("--prior-span", type=int, help="DreamShard's tasks of span tables in its prior (0: none)  [the recipe's: 24]")
    ap.add_argument("--shared-terms", choices=["on", "off"], help="DreamShard's cost net with the six terms a shard pays once (Config.shared_terms)  [the recipe's]")
    ap.add_argument("--seed", type=int, help="DreamShard's training seed: another training run of the same recipe  [0]")
    ap.add_argument("--rl-batches", type=int, help="DreamShard's REINFORCE batches per iteration  [the default config's: 50]")
    ap.add_argument("--lr", type=float, help="DreamShard's learning rate (decayed linearly to 0)  [the default config's: 3e-3]")
    ap.add_argument("--leave-out", choices=TRAINING_FAMILIES, metavar="FAMILY", help="train without this training family: its development tasks (heldout.py plan --dev --family) then show a family the models never saw, with no held-out family looked at")
    ap.add_argument("--prior-plans", type=int, default=8000, help="DreamShard's simulator prior: plans priced by the simulator's default calibration before measuring (0: none)")
    ap.add_argument("--tasks-per-family", type=int, default=12)
    ap.add_argument("--pool-tables", type=int, default=300)
    ap.add_argument("--total-s", type=float, default=540.0, help="the call's time from the script's start; each planner's deadline is within it")
    ap.add_argument("--resume", action="store_true", help="go on from OUT's checkpoints (a call cut by its time limit)")
    ap.add_argument("--cut-after", type=int, help=argparse.SUPPRESS)  # tests: each planner's deadline comes after this many plans of the call
    ap.add_argument("--quick", action="store_true", help="tiny run (logic check): B = 1024, 2 families x 1 task, 4 plans each (--budget: N), a prior of 32, little work per iteration")
    args = ap.parse_args()
    which = [p.strip() for p in args.planners.split(",")]
    if not which or set(which) - set(ORDER) or len(set(which)) != len(which):
        ap.error(f"--planners: give some of {','.join(ORDER)}, each once, not {args.planners!r}")
    which = [p for p in ORDER if p in which]
    if args.peer_budget != "auto" and not (args.peer_budget.isdigit() and int(args.peer_budget) >= 1):
        ap.error(f"--peer-budget: a number >= 1 or auto, not {args.peer_budget!r}")
    backend_name = args.backend or ("triton" if args.device == "cuda" else "sim")
    if args.device == "cpu" and backend_name == "triton":
        ap.error("--backend triton needs --device cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_end = T0 + args.total_s
    now = lambda: time.monotonic() - T0  # noqa: E731
    say = lambda text: print(f"[{now():6.1f}s] {text}", flush=True)  # noqa: E731

    gpu, device_name = gpu_name(args.device)
    paths = {p: out / f"{p}_{gpu}.pt" for p in which}
    started = [p for p in which if Path(f"{paths[p]}.ckpt").is_file()]
    if started and not args.resume:
        ap.error(f"{out} holds checkpoints of a run ({', '.join(started)}): pass --resume to go on, or give another --out")
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if args.resume and summary_path.is_file() else {}
    if summary and summary.get("gpu") != gpu:
        ap.error(f"--resume: {summary_path} is of a run on {summary.get('gpu')}, this is {gpu}; give another --out")

    if args.quick:
        import torch

        torch.set_num_threads(1)  # small nets: threads only contend on a small CPU
    batch = 1024 if args.quick else 65_536
    per_family, families = (1, ("dlrm", "hot")) if args.quick else (args.tasks_per_family, TRAINING_FAMILIES)
    families = tuple(f for f in families if f != args.leave_out)
    prior_plans = 32 if args.quick else args.prior_plans
    # a resumed run keeps the budgets its checkpoints were started with (the peers': one for both)
    budgets = {p: checkpoint_budget(Path(f"{paths[p]}.ckpt")) for p in started}
    budgets |= {p: budgets[q] for p in PEERS for q in PEERS if q in budgets}
    if "peer_budget" in summary:  # decided by an earlier call
        budgets = {p: summary["peer_budget"] for p in PEERS} | budgets
    budgets.setdefault("dreamshard", args.budget or (4 if args.quick else args.dreamshard_budget))
    fixed_peers = args.budget or (int(args.peer_budget) if args.peer_budget != "auto" else 4 if args.quick else None)
    if fixed_peers is not None:
        budgets = {p: fixed_peers for p in PEERS} | budgets
    if not args.resume:
        (out / "measured.jsonl").unlink(missing_ok=True)

    workload = Workload(batch)
    if backend_name == "sim":
        backend = SimBackend()
    else:
        from dreamshard.costs.kernels import unavailable_reason
        from dreamshard.costs.runners import SequentialRunner

        problem = unavailable_reason(backend_name, args.device)
        if problem:
            ap.error(f"--backend {backend_name} cannot run on {args.device} here: {problem}")
        backend = SequentialRunner(backend_name, device=args.device)  # `dreamshard train --backend triton --runner sequential --device cuda`
    tasks = training_tasks(per_family, args.pool_tables, workload, families)
    say(f"{len(tasks)} training tasks on {device_name} ({gpu}); plans measured by {backend.name}; planners {', '.join(which)}")

    recipe_overrides = {k: v for k, v in (("search_plans", args.search_plans), ("search_measured", args.search_measured), ("prior_span", args.prior_span),
                                          ("shared_terms", None if args.shared_terms is None else args.shared_terms == "on"), ("seed", args.seed),
                                          ("rl_batches", args.rl_batches), ("lr", args.lr))
                        if v is not None}  # config()'s, said in the summary
    summary |= {"gpu": gpu, "device": device_name, "backend": backend.name, "batch_size": batch, "training_tasks": len(tasks), "families": list(families),
                "tables_per_task": [20, 60], "devices_per_task": [2, 8], "max_memory_bytes": 24 * 10**9, "quick": args.quick,
                "dreamshard_options": {**DREAMSHARD_OPTIONS, **recipe_overrides}, "prior_plans": prior_plans, "total_s": args.total_s}
    if "autoshard" in budgets:
        summary["peer_budget"] = budgets["autoshard"]
    summary.setdefault("models", {})
    summary.setdefault("calls", 0)
    summary["calls"] += 1

    def save_summary() -> None:
        atomic_write(summary_path, json.dumps(summary, indent=1))

    def seconds_per_plan() -> float:
        """DreamShard's measured time per plan (its plans after the first few, which compile kernels), else the guess."""
        return summary.get("seconds_per_plan", GUESS_PLAN_S)

    for name in which:
        cls, path = PLANNERS[name], paths[name]
        ckpt = Path(f"{path}.ckpt")
        entry = summary["models"].setdefault(name, {"file": path.name, "done": False, "plans": 0, "shards": 0, "seconds": 0.0})
        if entry["done"] and path.is_file():
            say(f"{name}: done in an earlier call ({path.name})")
            continue
        later = [p for p in which if ORDER.index(p) > ORDER.index(name)]
        if name in PEERS and name not in budgets:
            left = t_end - time.monotonic() - sum(TAIL_S[p] for p in PEERS)
            budget = peer_budget(seconds_per_plan(), left)
            if not budget:
                say(f"{name}: {left:.0f} s left, not enough for {PEER_BUDGET_MIN} plans of each peer at {seconds_per_plan():.2f} s a plan: run again with --resume")
                break
            budgets |= {p: budget for p in PEERS}
            summary["peer_budget"] = budget
            say(f"peers' budget: {budget} measured plans each ({seconds_per_plan():.2f} s a plan, {left:.0f} s left)")
        # this planner's deadline: the end of the call, less what the planners after it need
        if name == "dreamshard":
            reserve = sum(peer_estimate_s(p, budgets.get(p, PEER_BUDGET_MIN), GUESS_PLAN_S) for p in later)
        else:
            reserve = sum(peer_estimate_s(p, budgets[p], seconds_per_plan()) for p in later)
        deadline = t_end - reserve
        cfg = config(name, budgets[name], batch, prior_plans, args.quick, recipe_overrides)
        entry |= {"budget": budgets[name], "iterations": cfg.iterations, "config": cfg.name, "measurements_per_iteration": budgets[name] // cfg.iterations}
        save_summary()
        say(f"{name}: {budgets[name]} measured plans over {cfg.iterations} iterations (config {cfg.name}), until {deadline - T0:.0f} s")
        timed = Deadline(backend, deadline, TAIL_S[name], name, out / "measured.jsonl", seconds_per_plan(), args.cut_after)
        before = checkpoint_measurements(ckpt) if args.resume else 0
        t = time.monotonic()
        options = {"prior": SimBackend()} if name == "dreamshard" and prior_plans else {}
        try:
            planner = cls.fit(tasks, timed, path, cfg, log=out / f"train_{name}.jsonl", progress=False, resume=args.resume and ckpt.is_file(), **options)
            done = True
        except TimeUp as e:
            planner, done = None, False
            say(f"{name}: out of time ({e})")
        used = checkpoint_measurements(ckpt) - before  # plans measured in this call that its checkpoint (and model) hold
        entry["plans"] += used
        entry["shards"] += sum(timed.shards[:used])
        entry["seconds"] = round(entry["seconds"] + time.monotonic() - t, 1)
        entry["measured_this_call"] = len(timed.seconds)  # a cut iteration's plans are measured but not learned from
        if len(timed.seconds) >= 8:
            entry["seconds_per_plan"] = round(sum(timed.seconds[4:]) / len(timed.seconds[4:]), 3)
        if name == "dreamshard" and "seconds_per_plan" in entry:
            summary["seconds_per_plan"] = entry["seconds_per_plan"]
        if done:
            meta = planner.model.meta
            near = meta.get("search", {}).get("search/measured", 0)  # measured after the last iteration (search_measured)
            entry["shards"] += sum(timed.shards[used : used + near])
            entry |= {"done": True, "plans": int(meta["measurements"]), "backend": meta["backend"], "check": check(cls, path, tasks[0])}
            say(f"{name}: wrote {path} ({entry['plans']} measured plans, {entry['shards']} shards, {entry['seconds']:.0f} s)")
        save_summary()
    missing = [p for p in which if not summary["models"].get(p, {}).get("done")]
    summary["resume"] = f"PYTHONPATH=. python3 benchmarks/gpu_train_shipped.py --out {out} --resume" if missing else None
    summary["elapsed_s_last_call"] = round(now(), 1)
    save_summary()
    say(f"not finished: {', '.join(missing)}; run again with --resume" if missing else f"all trained: {', '.join(str(paths[p]) for p in which)}")


def check(cls, path: Path, task) -> str:
    """The written model loads as a planner's and places a training task within memory."""
    plan = cls(model=str(path)).plan(task)
    plan.check()
    return f"placed {len(task.tables)} tables on {task.devices} devices"


if __name__ == "__main__":
    main()
