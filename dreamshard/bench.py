"""The results suite: every planner on the DreamShard paper's ten settings, on the table families
and on MLPerf DLRM-DCNv2, priced by one cost backend (`dreamshard bench paper`).

Protocol (the paper's, §5): a pool's tables are split 50/50 into train and test tables; tasks
are random table subsets of one half, on D devices of 5 GB each. The paper's ten settings are
DLRM-20/40/60/80/100 on 4 devices and DLRM-40/80/120/160/200 on 8, on the reference code's
tables (every table dim 16: `data tasks --dim 16`). The learned planners are trained per setting
on its training tasks with one budget of measured plans (`train_budget`, the paper's 100) and
planned with on its train and test tasks; the shipped models run beside them. The families suite
(every table family, its held-out ones included, 60 tables on 4 devices and 120 on 8) and the
MLPerf suite (the 26 published Criteo tables on 4 and 8 devices) have test tasks only and use
the shipped models: nothing is trained on them.

Everything a run computes is appended as it goes to OUT/rows.jsonl (one line per planner and
task) and OUT/plans.jsonl (every distinct test plan, to be measured elsewhere): a killed run
resumes where it stopped, and `report` rebuilds the tables and figures from those files alone,
from other costs too (a GPU's measurements of the same plans: `benchmarks/gpu_bench.py`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from dreamshard.files import atomic_write
from dreamshard.plan import Plan
from dreamshard.tasks import Task, Workload, sample_tasks, split_pool
from dreamshard.validation import InputError, NoPlanError, OptionError

GB = 10**9
SUITES = ("paper", "families", "mlperf")
HEURISTICS = ("random", "size", "dim", "lookup", "size_lookup")
LEARNED = ("rnn", "autoshard", "dreamshard")
# the paper's table: its heuristics, the RNN placer and DreamShard (table-wise, as the paper's); on
# the train tasks only these are planned (the others have nothing to learn from them)
PAPER_COLUMNS = (*HEURISTICS, "rnn", "dreamshard --no-split")
# the field beside it, on the test tasks
FIELD_COLUMNS = ("autoshard", "dreamshard", "dreamshard (shipped)", "neuroshard", "torchrec", "oracle")
FAMILY_POOL = (400, 11)  # tables and seed of a family's pool (seed 11: no calibration or training saw it)
ORACLE_BUDGET = 4000

# The paper's Table 1 cells quoted in this project's documentation (V100-era GPUs, FBGEMM TBE,
# test tasks): absolute milliseconds are not comparable with ours (other GPUs, kernels and batch),
# the relative improvement over random is.
PAPER_CELLS = {("DLRM-80 (8)", "random"): 25.2, ("DLRM-80 (8)", "lookup"): 16.7, ("DLRM-80 (8)", "dreamshard --no-split"): 16.1,
               ("DLRM-100 (4)", "random"): 94.5, ("DLRM-100 (4)", "lookup"): 79.5, ("DLRM-100 (4)", "dreamshard --no-split"): 77.8}


@dataclass(frozen=True)
class Setting:
    suite: str
    name: str  # "DLRM-80 (8)", "hot 120 (8)", "DCNv2 (4)"
    family: str
    tables: int
    devices: int
    memory: int  # bytes per device
    train: int  # tasks
    test: int
    dim: int | None = None  # every table given this dim (the reference code's 16)

    @property
    def slug(self) -> str:
        return _slug(f"{self.suite} {self.name}")


def _slug(text: str) -> str:
    """"paper DLRM-80 (8)" → "paper-dlrm-80-8": a file name."""
    return "-".join("".join(c if c.isalnum() else " " for c in text).split()).lower()


def settings(suites: Sequence[str] = SUITES, tasks: int = 50, family_tasks: int = 5, test_tasks: int | None = None) -> list[Setting]:
    """The suites' settings: `tasks` train and `test_tasks` (default: as many) test tasks per paper
    setting, `family_tasks` test tasks per family setting."""
    from dreamshard.families import FAMILIES

    out = []
    if "paper" in suites:
        for devices, sizes in ((4, (20, 40, 60, 80, 100)), (8, (40, 80, 120, 160, 200))):
            out += [Setting("paper", f"DLRM-{n} ({devices})", "dlrm", n, devices, 5 * GB, tasks, test_tasks or tasks, dim=16) for n in sizes]
    if "families" in suites:  # onehot's tables are MLPerf's: the mlperf suite places them as published
        for family in (f for f in FAMILIES if f != "onehot"):
            out += [Setting("families", f"{family} {n} ({d})", family, n, d, m * GB, 0, family_tasks) for n, d, m in ((60, 4, 24), (120, 8, 16))]
    if "mlperf" in suites:  # one task: the 26 published tables; HBM of an 80 GB GPU
        out += [Setting("mlperf", f"DCNv2 ({d})", "onehot", 26, d, 80 * GB, 0, 1) for d in (4, 8)]
    return out


def quick_settings() -> list[Setting]:
    """`--quick`: one paper setting per device count and one held-out family, three tasks each (train and test)."""
    return [Setting("paper", "DLRM-20 (4)", "dlrm", 20, 4, 5 * GB, 3, 3, dim=16), Setting("paper", "DLRM-40 (8)", "dlrm", 40, 8, 5 * GB, 3, 3, dim=16),
            Setting("families", "rmc 60 (4)", "rmc", 60, 4, 24 * GB, 0, 3)]


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------


def pool_of(setting: Setting, cache: dict) -> list:
    """The setting's table pool (the 856-table DLRM pool for the paper's settings; a family's
    pool of FAMILY_POOL otherwise), with every dim set where the setting says so."""
    key = (setting.family, setting.suite)
    if key not in cache:
        from dreamshard.families import synth_family
        from dreamshard.synth import PoolConfig, synth_pool

        if setting.suite == "paper":
            cache[key] = synth_pool(PoolConfig())
        elif setting.suite == "mlperf":
            cache[key] = synth_family("onehot", 26, 0)  # copy 0: the published tables
        else:
            cache[key] = synth_family(setting.family, *FAMILY_POOL)
    tables = cache[key]
    return [replace(t, dim=setting.dim) for t in tables] if setting.dim else tables


def tasks_of(setting: Setting, seed: int, cache: dict) -> tuple[list[Task], list[Task], int]:
    """(train tasks, test tasks, draws refused for not fitting in memory). Paper settings draw from
    the two halves of the pool split by `seed`; the others draw test tasks from the whole pool (no
    learned planner is trained on them); MLPerf's one task is all 26 tables."""
    tables = pool_of(setting, cache)
    workload = Workload(65_536)
    pool = f"{setting.family}{f' dim {setting.dim}' if setting.dim else ''} (seed {seed})"
    if setting.suite == "mlperf":
        return [], [Task(list(tables), setting.devices, setting.memory, workload, pool)], 0
    refused = [0]

    def draw(half, n, s):
        k = min(setting.tables, len(half))
        return sample_tasks(half, n, (k, k), setting.devices, setting.memory, s, pool, workload, refused=refused) if n else []

    if setting.suite == "paper":
        train_half, test_half = split_pool(tables, seed)
        return draw(train_half, setting.train, 1000 * seed + 1), draw(test_half, setting.test, 1000 * seed + 2), refused[0]
    return [], draw(tables, setting.test, 700 + setting.devices + 1000 * seed), refused[0]


# --------------------------------------------------------------------------------------------
# planners
# --------------------------------------------------------------------------------------------


def train_models(setting: Setting, seed: int, tasks: Sequence[Task], backend, folder: Path, budget: int, learned: Sequence[str] = LEARNED,
                 say: Callable[[str], None] = print) -> dict[str, Path]:
    """planner → its model trained on the setting's training tasks against `backend` with `budget`
    measured plans (folder/<setting>-s<seed>-<planner>.pt; a finished model is reused, a cut
    training resumed), for the planners of `learned`."""
    from dreamshard.planners import PLANNERS

    folder.mkdir(parents=True, exist_ok=True)
    models = {}
    for name in learned:
        path = folder / f"{setting.slug}-s{seed}-{name}.pt"
        if not path.exists():
            cls = PLANNERS[name]
            cfg = cls.config(None, budget=budget, seed=seed, iterations=min(cls.config().iterations, budget))
            say(f"training {name} on {len(tasks)} tasks of {setting.name} ({budget} plans measured by {backend.name})")
            t0 = time.perf_counter()
            cls.fit(tasks, backend, path, cfg, log=folder / f"{path.stem}.log.jsonl", resume=Path(f"{path}.ckpt").exists())
            say(f"trained {name} in {time.perf_counter() - t0:.0f} s")
        models[name] = path
    return models


def planners_for(models: dict[str, Path], oracle_budget: int, labels: Iterable[str]) -> dict[str, object]:
    """label → planner. With trained `models` the learned planners (and NeuroShard, which searches
    on DreamShard's cost net) use them; otherwise the shipped ones. `dreamshard (shipped)` is the
    shipped model always. A planner that cannot be built here (TorchRec not installed, no model
    shipped) is left out, and the reason returned under its label as a string."""
    from dreamshard.costs.sim import SimBackend
    from dreamshard.planners import get_planner

    dream = models.get("dreamshard")
    specs = {**{h: (h, {}) for h in HEURISTICS},
             "rnn": ("rnn", {"model": models.get("rnn")}), "autoshard": ("autoshard", {"model": models.get("autoshard")}),
             "dreamshard": ("dreamshard", {"model": dream}), "dreamshard --no-split": ("dreamshard", {"model": dream, "split": False}),
             "dreamshard (shipped)": ("dreamshard", {}), "neuroshard": ("neuroshard", {"model": dream}),
             "torchrec": ("torchrec", {"sharding_types": "all"}), "oracle": ("oracle", {"backend": SimBackend(), "budget": oracle_budget})}
    out: dict[str, object] = {}
    for label in labels:
        name, options = specs[label]
        try:
            out[label] = get_planner(name, **options)
        except InputError as e:
            out[label] = f"{e}"
    return out


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


def plan_hash(plan: Plan) -> str:
    """12 hex digits of a plan's shards: the key its measurements are filed under."""
    return hashlib.sha1(repr(plan.layout()).encode()).hexdigest()[:12]


def task_hash(task: Task) -> str:
    """12 hex digits of a task's tables and devices: runs that made a task's rows on different
    machines can be checked to have drawn the same task."""
    tables = [(t.name, t.rows, t.dim, round(t.pooling_factor, 6), t.distribution, t.seed) for t in task.tables]
    return hashlib.sha1(repr((tables, task.devices, task.max_memory_bytes)).encode()).hexdigest()[:12]


def _read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSONL file a killed run may have cut in the middle of a line."""
    if not path.exists():
        return []
    out = []
    for line in dict.fromkeys(path.read_text().splitlines()):  # a line twice (files joined twice) counts once
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the torn last line of a killed run: that task is planned again
    return out


def task_key(row: dict) -> tuple:
    return row["setting"], row["seed"], row["split"], row["task"]


@dataclass
class Run:
    """A suite run's folder: rows.jsonl, plans.jsonl, models/, and what `report` writes."""

    folder: Path

    @property
    def rows_path(self) -> Path:
        return self.folder / "rows.jsonl"

    @property
    def plans_path(self) -> Path:
        return self.folder / "plans.jsonl"

    def check_config(self, config: dict) -> None:
        """Write the run's parameters to run.json, or refuse (OptionError) to go on in a folder
        made with other ones: its rows and models would be mixed with this run's unseen."""
        path = self.folder / "run.json"
        if path.exists():
            try:
                before = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise OptionError(f"{path}: unreadable ({e}); give another --out") from None
            changed = {k: (before.get(k), v) for k, v in config.items() if before.get(k) != v}
            if changed:
                what = ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in changed.items())
                raise OptionError(f"{self.folder} was made with other parameters ({what}); give another --out, or the same parameters to resume it")
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(config, indent=1) + "\n")

    def rows(self) -> list[dict]:
        """The rows of every write that was completed (`append`)."""
        rows = _read_jsonl(self.rows_path)
        count: dict[str, int] = defaultdict(int)
        for r in rows:
            count[r["write"]] += 1
        return [r for r in rows if count[r["write"]] == r["of"]]

    def done(self) -> set[tuple]:
        """(setting, seed, split, task, planner) of every row written."""
        return {(*task_key(r), r["planner"]) for r in self.rows()}

    def append(self, rows: list[dict], plans: list[Plan]) -> None:
        """One task's rows and plans, each file in one write. A kill leaves at most a torn last
        line: `rows()` keeps a write only with all its rows (each names its write and says how
        many it has), so that task's planners run again."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write = f"{time.time_ns():x}"
        for path, lines in ((self.plans_path, [p.to_json() for p in plans]), (self.rows_path, [{**r, "write": write, "of": len(rows)} for r in rows])):
            if lines:
                with open(path, "a+b") as fh:
                    fh.seek(0, 2)
                    torn = fh.tell() > 0 and (fh.seek(-1, 2), fh.read(1))[1] != b"\n"  # a kill's torn line: new lines start on their own
                    fh.write(("\n" if torn else "").encode() + "".join(json.dumps(d) + "\n" for d in lines).encode())


def run_suite(run: Run, chosen: Sequence[Setting], backend, seeds: int = 1, train_budget: int = 100, oracle_budget: int = ORACLE_BUDGET,
              say: Callable[[str], None] = print, progress: Callable[[int, int], None] | None = None,
              labels: Sequence[str] = PAPER_COLUMNS + FIELD_COLUMNS, deadline: float | None = None, splits: Sequence[str] = ("test", "train")) -> None:
    """Plan every task of every setting and seed with every planner of `labels` (on train tasks,
    those of the paper's table), price each plan with `backend`, append the rows. A planner's
    rows already in the run are not made again (resume; a run with more labels adds theirs).
    `deadline` (time.monotonic()): no task is begun after it. `splits`: the tasks planned (the
    learned planners are trained on the train tasks either way)."""
    done = run.done()
    pools: dict = {}
    jobs = [(s, seed) for s in chosen for seed in range(seeds)]
    total = sum(s.train + s.test for s in chosen) * seeds
    finished = 0
    for setting, seed in jobs:
        train, test, refused = tasks_of(setting, seed, pools)
        wanted = {split: [lb for lb in labels if split == "test" or lb in PAPER_COLUMNS] for split in ("train", "test")}
        if train and train_budget:  # the shipped model beside the trained one
            wanted["test"] += ["dreamshard (shipped)"] if "dreamshard" in labels and "dreamshard (shipped)" not in labels else []
        else:
            wanted["test"] = [lb for lb in wanted["test"] if lb != "dreamshard (shipped)"]
        # test tasks first: a run cut short has the field's rows before the paper's train column
        todo = [(split, i, t, [lb for lb in wanted[split] if (setting.name, seed, split, i, lb) not in done])
                for split, ts in (("test", test), ("train", train)) if split in splits for i, t in enumerate(ts)]
        todo = [job for job in todo if job[3]]
        finished += len(train) + len(test) - len(todo)
        if progress:
            progress(finished, total)
        if not todo:
            continue
        if deadline is not None and time.monotonic() > deadline:
            say(f"deadline: stopped before {setting.name} (the run resumes there)")
            return
        learned = [n for n in LEARNED if any(lb.split(" ")[0] == n for job in todo for lb in job[3]) or (n == "dreamshard" and any(lb == "neuroshard" for job in todo for lb in job[3]))]
        models = train_models(setting, seed, train, backend, run.folder / "models", train_budget, learned, say) if train and train_budget else {}
        planners = planners_for(models, oracle_budget, dict.fromkeys(lb for job in todo for lb in job[3]))
        for split, i, task, todo_labels in todo:
            if deadline is not None and time.monotonic() > deadline:
                say(f"deadline: stopped before {setting.name} {split} task {i} (the run resumes there)")
                return
            rows, plans, seen = [], [], {}
            for label in todo_labels:
                planner = planners[label]
                row = {"suite": setting.suite, "setting": setting.name, "seed": seed, "split": split, "task": i, "planner": label,
                       "tables": len(task.tables), "devices": task.devices, "refused_draws": refused, "task_hash": task_hash(task),
                       "trained": label.split(" ")[0] in models and label != "dreamshard (shipped)", "ms": None, "error": None}
                if isinstance(planner, str):
                    rows.append({**row, "error": planner, "planning_ms": 0.0})
                    continue
                t0 = time.perf_counter()
                try:
                    plan = planner.plan(task)
                except NoPlanError as e:
                    rows.append({**row, "error": str(e), "planning_ms": (time.perf_counter() - t0) * 1e3})
                    continue
                planning_ms = (time.perf_counter() - t0) * 1e3
                report = backend.evaluate_plan(plan)
                key = plan_hash(plan)
                if split == "test" and key not in seen:
                    plan.notes = [f"setting {setting.name}", f"seed {seed}", f"task {i}", f"hash {key}", *plan.notes]
                    seen[key] = plan
                    plans.append(plan)
                rows.append({**row, "ms": report.overall_ms, "source": report.source, "planning_ms": planning_ms, "plan": key,
                             "split_tables": len(plan.split_tables()), "measurements": _measurements(planner),
                             "devices_ms": [[d.fwd_comp_ms, d.fwd_comm_ms, d.bwd_comm_ms, d.bwd_comp_ms] for d in report.devices]})
            run.append(rows, plans)
            finished += 1
            if progress:
                progress(finished, total)


def _measurements(planner) -> int:
    """Measured plans the planner's model was trained on (0 for planners with no model)."""
    model = getattr(planner, "model", None)
    meta = getattr(model, "meta", None) or {}
    return int(meta.get("measurements", 0))


# --------------------------------------------------------------------------------------------
# the tables
# --------------------------------------------------------------------------------------------


def with_costs(rows: list[dict], costs: dict[tuple, float]) -> list[dict]:
    """The test rows priced by `costs` ((setting, seed, task, plan hash) → ms) instead: a planner
    none of whose plans in a setting has a cost (one that was not measured) is left out there,
    and so is a task on which some other planner's plan has none (a measurement cut short)."""
    def cost(r):
        return None if r["ms"] is None else costs.get((r["setting"], r["seed"], r["task"], r["plan"]))

    tests = [r for r in rows if r["split"] == "test"]
    measured = {(r["setting"], r["planner"]) for r in tests if cost(r) is not None}
    kept = [r for r in tests if (r["setting"], r["planner"]) in measured]
    incomplete = {task_key(r) for r in kept if r["ms"] is not None and cost(r) is None}
    return [{**r, "ms": cost(r)} for r in kept if task_key(r) not in incomplete]


def read_costs(path: Path) -> dict[tuple, float]:
    """(setting, seed, task, plan hash) → measured ms, from a CSV of `benchmarks/gpu_bench.py`."""
    with open(path) as fh:
        return {(r["setting"], int(r["seed"]), int(r["task"]), r["plan"]): float(r["measured_ms"]) for r in csv.DictReader(fh)}


@dataclass
class Cell:
    setting: str
    split: str
    planner: str
    mean_ms: float  # mean over tasks (of each seed), then over seeds
    std_ms: float  # over seeds (nan with one seed)
    over_random: float  # the paper's speedup: random's mean / this mean − 1
    vs_best_heuristic: float  # this mean / the best heuristic's mean − 1
    vs_oracle: float  # this mean / oracle's mean − 1 (nan without oracle)
    planning_ms: float
    measurements: int
    failed: int  # tasks with no plan
    tasks: int


def cells(rows: list[dict]) -> list[Cell]:
    """One cell per (setting, split, planner): means over the same tasks for every planner."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["setting"], r["split"])].append(r)
    out = []
    for (setting, split), rs in groups.items():
        by_task: dict[tuple, dict[str, dict]] = defaultdict(dict)
        for r in rs:
            by_task[(r["seed"], r["task"])][r["planner"]] = r
        planners = list(dict.fromkeys(r["planner"] for r in rs))
        # the tasks that every planner placing all of its tasks placed (a task with a row missing
        # is one a run has not reached); a planner that failed on some task is averaged over the
        # rest of these, and its cell says how many it failed
        whole = [p for p in planners if all(r["ms"] is not None for r in rs if r["planner"] == p)]
        common = [k for k, t in by_task.items() if all(p in t for p in whole)]
        means: dict[str, float] = {}
        stds: dict[str, float] = {}
        for p in planners:
            per_seed: dict[int, list[float]] = defaultdict(list)
            for k in common:
                r = by_task[k].get(p)
                if r is not None and r["ms"] is not None:
                    per_seed[k[0]].append(r["ms"])
            seed_means = [statistics.fmean(v) for v in per_seed.values() if v]
            means[p] = statistics.fmean(seed_means) if seed_means else math.nan
            stds[p] = statistics.stdev(seed_means) if len(seed_means) > 1 else math.nan
        heur = [means[h] for h in HEURISTICS if h in means and not math.isnan(means[h])]
        best_h = min(heur) if heur else math.nan
        for p in planners:
            rp = [t[p] for t in by_task.values() if p in t]
            out.append(Cell(setting, split, p, means[p], stds[p], means.get("random", math.nan) / means[p] - 1, means[p] / best_h - 1,
                            means[p] / means.get("oracle", math.nan) - 1, statistics.fmean(r["planning_ms"] for r in rp) if rp else math.nan,
                            max((r.get("measurements", 0) for r in rp), default=0), sum(r["ms"] is None for r in rp), len(common)))
    return out


def _pct(x: float) -> str:
    return "" if math.isnan(x) else f"{x * 100:+.1f}%"


def _ms(c: Cell) -> str:
    if math.isnan(c.mean_ms):
        return "no plan"
    return f"{c.mean_ms:.3f}" + ("" if math.isnan(c.std_ms) else f" ± {c.std_ms:.3f}")


def setting_order(names) -> list[str]:
    """Settings in the suites' order (the paper's by devices and tables, then the families,
    then MLPerf); names no suite has (a test's) after them, as they came."""
    canon = [s.name for s in settings()]
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (canon.index(n) if n in canon else len(canon), names.index(n)))


def markdown(cs: list[Cell], source: str) -> str:
    """The paper's table (its planners, train and test, mean ms and % over random, the paper's own
    cells beside), then the field's (every planner on the test tasks: % vs the best heuristic, gap
    to oracle, planning time, measurements), then where DreamShard is not the best."""
    settings_seen = setting_order(c.setting for c in cs)
    get = {(c.setting, c.split, c.planner): c for c in cs}
    lines = [f"Costs: {source}. Mean step (ms) over the tasks every planner placed; in brackets the speedup over random "
             "(random's mean / the planner's − 1, as the paper reports it).", ""]
    paper = [s for s in settings_seen if s.startswith("DLRM-")]
    if paper:
        lines += ["## The paper's table", "", "| setting | split | " + " | ".join(PAPER_COLUMNS) + " |", "|---|---|" + "---:|" * len(PAPER_COLUMNS)]
        for s in paper:
            for split in [x for x in ("train", "test") if (s, x, "random") in get]:
                cells_ = [get.get((s, split, p)) for p in PAPER_COLUMNS]
                lines.append(f"| {s} | {split} | " + " | ".join("" if c is None else f"{_ms(c)} ({_pct(c.over_random)})" for c in cells_) + " |")
            if any((s, p) in PAPER_CELLS for p in PAPER_COLUMNS):
                ref = [PAPER_CELLS.get((s, p)) for p in PAPER_COLUMNS]
                rnd = PAPER_CELLS.get((s, "random"))
                lines.append(f"| {s} | test, the paper | " + " | ".join("" if v is None else f"{v} ({_pct(rnd / v - 1)})" for v in ref) + " |")
        lines.append("")
    planners = list(dict.fromkeys(c.planner for c in cs if c.split == "test"))
    lines += ["## Every planner on the test tasks: vs the best heuristic (mean over the lowest heuristic mean − 1)", "",
              "| setting | tasks | " + " | ".join(planners) + " |", "|---|---:|" + "---:|" * len(planners)]
    for s in settings_seen:
        row = [get.get((s, "test", p)) for p in planners]
        n = next((c.tasks for c in row if c is not None), 0)
        lines.append(f"| {s} | {n} | " + " | ".join("" if c is None else ("no plan" if math.isnan(c.mean_ms) else _pct(c.vs_best_heuristic) + (f" ({c.failed} no plan)" if c.failed else ""))
                                                  for c in row) + " |")
    lines += ["", "## Mean step (ms) on the test tasks, gap to oracle, planning time", "",
              "| setting | planner | mean ms | vs oracle | planning ms | measured plans | tasks with no plan |", "|---|---|---:|---:|---:|---:|---:|"]
    for s in settings_seen:
        for c in sorted((get[(s, "test", p)] for p in planners if (s, "test", p) in get), key=lambda c: (math.isnan(c.mean_ms), c.mean_ms)):
            lines.append(f"| {s} | {c.planner} | {_ms(c)} | {_pct(c.vs_oracle)} | {c.planning_ms:.0f} | {c.measurements} | {c.failed} |")
    lines += ["", "## Where `dreamshard` is not the lowest mean on the test tasks (among the planners that placed every task)", ""]
    behind = []
    for s in settings_seen:
        # a planner that failed on some task is averaged over fewer tasks: it does not compete here
        row = [get[(s, "test", p)] for p in planners if (s, "test", p) in get and not math.isnan(get[(s, "test", p)].mean_ms) and not get[(s, "test", p)].failed]
        d = get.get((s, "test", "dreamshard"))
        if d is None or math.isnan(d.mean_ms) or not row:
            continue
        best = min(row, key=lambda c: c.mean_ms)
        if best.mean_ms < d.mean_ms * (1 - 1e-9):
            behind.append(f"- {s}: {best.planner} {best.mean_ms:.3f} ms, dreamshard {d.mean_ms:.3f} ms ({_pct(d.mean_ms / best.mean_ms - 1)})")
    ran = any(c.planner == "dreamshard" and c.split == "test" for c in cs)
    lines += behind or [("- none: it has the lowest mean in every setting" if ran else "- `dreamshard` was not among this run's planners")]
    return "\n".join(lines) + "\n"


def csv_text(cs: list[Cell]) -> str:
    buf = io.StringIO()
    fields = list(Cell.__dataclass_fields__)
    w = csv.DictWriter(buf, fields)
    w.writeheader()
    for c in cs:
        w.writerow({f: getattr(c, f) for f in fields})
    return buf.getvalue()


def write_report(run: Run, costs_file: Path | None = None, out: Path | None = None) -> list[Path]:
    """results.md, results.csv (and figures, where matplotlib is installed) from the run's rows,
    priced as they were planned, or by `costs_file` (then the test rows it has)."""
    rows = run.rows()
    if not rows:
        raise OptionError(f"{run.folder}: no results yet (rows.jsonl is empty or missing)")
    if costs_file is not None:
        rows = with_costs(rows, read_costs(costs_file))
        if not rows:
            raise OptionError(f"{costs_file}: none of its costs belong to a complete test task of {run.folder}")
        summary = costs_file.with_name("summary.json")
        about = json.loads(summary.read_text()) if summary.exists() else {}
        how = about.get("how", {}).get(costs_file.name,  # a summary.json of several files says how each was measured
                                       f"{about.get('runner', '')}, each plan on one GPU; collectives from the comm model shipped for the GPU and the plan's device count")
        source = f"measured on {about['device']}, {how} ({costs_file.name})" if "device" in about else f"measured ({costs_file.name})"
    else:
        source = ", ".join(sorted({r["source"] for r in rows if r.get("source")}))
    out = out or run.folder
    cs = cells(rows)
    written = [out / "results.md", out / "results.csv"]
    atomic_write(written[0], markdown(cs, source))
    atomic_write(written[1], csv_text(cs))
    from dreamshard import plots

    if plots.available():
        written += figures(rows, cs, out, "measured" if costs_file else "simulated", None if costs_file else run.folder)
    return written


def figures(rows: list[dict], cs: list[Cell], out: Path, source: str, folder: Path | None = None) -> list[Path]:
    """improvement.png/svg: each planner's mean step on the test tasks against the best
    heuristic, per setting; devices.png/svg: the per-device phases of every planner's plan of
    one task (from the rows' own pricing); training-*.png/svg: the learned planners' training
    curves in that setting, where the run (`folder`) kept their logs."""
    from dreamshard import plots
    from dreamshard.costs.base import CostReport, DeviceCost

    written = []
    order = setting_order(c.setting for c in cs)
    # the heuristics are the baseline, and the RNN placer, far above it, would set the scale
    shown = [c for c in cs if c.split == "test" and c.planner not in HEURISTICS + ("rnn",) and not math.isnan(c.mean_ms)]
    bars_ = [(c.setting, c.planner, c.vs_best_heuristic * 100) for c in sorted(shown, key=lambda c: order.index(c.setting))]
    for suffix in plots.SUFFIXES:
        written.append(plots.grouped_bars(bars_, out / f"improvement{suffix}", "% vs the best heuristic (lower is better)",
                                          f"mean step on the test tasks against the best heuristic — {source} (rnn, far above: results.md)", "{:+.0f}", 0.0))
    # the paper's headline setting where the run has it, else its largest
    pick = "DLRM-80 (8)" if "DLRM-80 (8)" in order else max(order, key=lambda s: next((r["tables"] for r in rows if r["setting"] == s), 0))
    first = [r for r in rows if r["setting"] == pick and r["split"] == "test" and r.get("devices_ms")]
    if first:
        key = min(task_key(r) for r in first)
        panels = [(r["planner"], CostReport([DeviceCost(*d) for d in r["devices_ms"]], r.get("source", ""), "", "", 0))
                  for r in first if task_key(r) == key and r["planner"] not in ("random", "size", "dim", "rnn")]
        panels.sort(key=lambda p: p[1].overall_ms)
        for suffix in plots.SUFFIXES:
            written.append(plots.device_components(panels, out / f"devices{suffix}", f"{pick}, test task {key[3]}: per-device phases — {panels[0][1].backend}"))
    for log in sorted(folder.glob(f"models/{_slug('paper ' + pick)}-s0-*.log.jsonl")) if folder else []:
        name = log.name.split(".")[0]
        for suffix in plots.SUFFIXES:
            written.append(plots.training_curves(_read_jsonl(log), out / f"training-{name}{suffix}", f"{name}: trained against the simulator"))
    return written
