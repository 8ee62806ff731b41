"""Properties of every registered planner on thousands of random tasks, large ones included.

For each of 2,000 seeded random tasks (1 to 2,500 tables, 1 to 1,024 devices, memory from
hopeless to roomy) and every planner in the registry:
  - a plan places every table exactly once, on a device of the task, each device within memory;
  - planning is deterministic for a given seed (a fresh planner gives the same placement);
  - a task that cannot fit (a table larger than a device, or more bytes than all devices) gets
    the typed InfeasibleError naming the bytes it needs; so does any task a planner gives up on,
    and none gives up where the memory packing finds a placement — never a RecursionError or any
    other exception.
Then a 10,000-table task and a 1,024-device task go through planning and simulated pricing under
a guard against hangs only (timings live in benchmarks/large_tasks.py, not here).

And every planner as a user gets it — the registry's every entry, TorchRec's included, each with
its `--split` and `--no-split`, the learned ones with their shipped models, the searches with a
small budget — on each of 2,000 small random tasks (1 to 30 tables, 1 to 16 devices, memory
from hopeless to roomy): every plan passes the package's own checks (`Plan.check`, and the plan
file's loader on its JSON) besides the independent one here, and every refusal is a typed
NoPlanError.

`make test` runs the first 80 random tasks and the first 30 small ones; the 2,000 of each and the
large tasks are marked `long` (`make test-long`).
"""

from __future__ import annotations

import inspect
import os
import re
import signal
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from dreamshard.costs.sim import SimBackend
from dreamshard.packing import InfeasibleError, over_bounds, pack
from dreamshard.learned.autoshard import AutoShardModel, AutoShardNet
from dreamshard.learned.rnn import RNNModel, Seq2SeqPlacer
from dreamshard.planners import PLANNERS, get_planner
from dreamshard.tables import NUM_BINS, OPTIMIZERS, PRECISION_BYTES, TableSpec
from dreamshard.tasks import Task, Workload

TASKS = 2_000
# A test checks correctness; its time guard only catches a hang. Each large case takes seconds to
# a few minutes on an idle machine, and several times that on a busy one: an hour is a hang.
HANG_S = 3600
NEEDS = re.compile(r"cannot place (\d+) tables needing .* \((\d+) bytes\) on (\d+) devices with .* \((\d+) bytes\) in all")


@contextmanager
def hang_guard(cpu_seconds: int):
    """Fail with TimeoutError once the process has used `cpu_seconds` of CPU time in the block
    (SIGPROF: Unix, main thread). CPU time, not wall-clock: a machine busy with other work slows
    the block down but does not trip the guard; only a hang or a quadratic blow-up does."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {cpu_seconds} s of CPU time: a hang or a quadratic blow-up")

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def random_tables(n: int, seed: int, prefix: str = "t") -> list[TableSpec]:
    """Tables spanning the pool's range: rows 10..10^7, every dim class, pooling 0..50."""
    rng = np.random.default_rng(seed)
    rows = np.round(10 ** rng.uniform(1, 7, n)).astype(np.int64)
    dims = rng.choice([4, 8, 16, 32, 64, 128, 256], n)
    pf = np.where(rng.random(n) < 0.05, 0.0, rng.uniform(0.1, 50, n))
    bins = rng.dirichlet(np.ones(NUM_BINS), n)
    return [TableSpec(f"{prefix}{i}", int(rows[i]), int(dims[i]), float(pf[i]), tuple(bins[i].tolist())) for i in range(n)]


def random_tasks(count: int, seed: int) -> list[Task]:
    """Subsets of one 6,000-table pool: mostly small tasks, 2% of 1,000–2,500 tables, devices
    up to 1,024, memory per device from below the largest table to twice the even share."""
    pool = random_tables(6_000, seed)
    rng = np.random.default_rng(seed + 1)
    tasks = []
    for i in range(count):
        kind = rng.random()
        n = int(rng.integers(1000, 2501)) if kind < 0.02 else int(rng.integers(50, 400)) if kind < 0.12 else int(rng.integers(1, 50))
        devices = int(rng.choice([1, 2, 3, 4, 8, 16, 64, 1024], p=[0.1, 0.15, 0.1, 0.2, 0.2, 0.1, 0.1, 0.05]))
        tables = [pool[j] for j in rng.choice(len(pool), n, replace=False)]
        precision, optimizer = str(rng.choice(list(PRECISION_BYTES))), str(rng.choice(OPTIMIZERS))
        sizes = [t.bytes(precision, optimizer) for t in tables]
        cap = max(1, int(max(sum(sizes) / devices * rng.uniform(0.8, 2.0), max(sizes) * rng.uniform(0.9, 1.3))))
        tasks.append(Task(tables, devices, cap, Workload(precision=precision, optimizer=optimizer)))
    return tasks


# Every registered planner, and every splitting one with its split option on. The search
# planner runs with a small beam here: the property is memory and shape, not search quality, and
# its full search on 2,500 tables over 1,024 devices takes tens of seconds per task.
SMALL_SEARCH = {"neuroshard": {"beam": 2, "depth": 2, "top": 2, "caps": 3},
                "oracle": {"backend": SimBackend(), "budget": 200, "split": False}}  # oracle needs a backend: the simulator


def untrained_models() -> dict[str, dict]:
    """The learned peers ship no model: they plan here with seeded untrained nets (the property is
    memory and shape; their training is tests/test_learned_peers.py). The RNN placer's output
    layer is as wide as the widest task here."""
    torch.manual_seed(0)
    return {"autoshard": {"model": AutoShardModel(AutoShardNet())}, "rnn": {"model": RNNModel(Seq2SeqPlacer(1_024))}}


SMALL_SEARCH.update(untrained_models())


def planner_configs(small: dict[str, dict], torchrec: bool = False) -> dict[str, tuple[str, dict]]:
    """Every registered planner with the options in `small`, and each that can split tables also
    with the other setting of `split` than its default (or than `small` gives it)."""
    configs = {}
    for name, cls in sorted(PLANNERS.items()):
        if name == "torchrec" and not torchrec:
            continue
        kw = small.get(name, {})
        configs[name] = (name, kw)
        if "split" in cls.options():
            split = kw.get("split", cls.options()["split"])
            configs[f"{name} --{'no-' if split else ''}split"] = (name, {**kw, "split": not split})
    return configs


# TorchRec's planner: ~0.1 s a task, and by design it refuses tight tasks others place (its memory
# reservation): it joins the small tasks below, tests/test_torchrec_planner.py has the rest
CONFIGS = planner_configs(SMALL_SEARCH)
# The planners with a cost net take 20–150 ms a task (a few seconds on 2,500 tables over 1,024
# devices); they plan every 5th task here (400 of them, the large ones among them) and every
# large task below. The heuristics plan all 2,000.
MODEL_STRIDE = int(os.environ.get("DREAMSHARD_MODEL_STRIDE", "5"))  # 1: all 2,000 (about 10 min here)


def stride(label: str) -> int:
    name = CONFIGS[label][0]
    return MODEL_STRIDE if "model" in PLANNERS[name].options() or name == "oracle" else 1


@pytest.fixture(scope="module")
def planners():
    return {label: get_planner(name, **kw) for label, (name, kw) in CONFIGS.items()}


def fresh(label: str, planners: dict):
    """A planner of seed 0 in the state a new one has: a new instance where planning draws from
    an RNG the planner keeps; the shared one where each plan seeds its own (the planners with a
    cost net, whose model takes a while to load; `test_fresh_learned_planner_is_deterministic`)."""
    name, kw = CONFIGS[label]
    if "model" in PLANNERS[name].options():
        return planners[label]
    return get_planner(name, **kw, **({"seed": 0} if "seed" in inspect.signature(PLANNERS[name]).parameters else {}))


def check_plan(task: Task, plan) -> None:
    """Every table's columns exactly once (its shards tile [0, dim) in multiples of 4) or, split
    by rows, its rows exactly once (full-width blocks on distinct devices), every shard on a
    device of the task, and each device within memory counting a shard's rows × columns —
    computed here, not by `Plan.check`."""
    cover = [0] * len(task.tables)
    row_cover = {}  # row-split table → next row, devices used
    used = np.zeros(task.devices, np.int64)  # exact integer bytes (float sums lose them past 2^53)
    for s in sorted(plan.shards, key=lambda s: (s.table, s.start, s.row_start)):
        t = task.tables[s.table]
        assert 0 <= s.device < task.devices, f"a shard of {t.name} off the devices"
        a, b = s.row_range(t)
        if (a, b) != (0, t.rows):
            row, devices = row_cover.setdefault(s.table, (0, set()))
            assert (s.start, s.stop) == (0, t.dim) and a == row and a < b <= t.rows and s.device not in devices, f"{t.name}: shard rows [{a}, {b}) on {s.device}"
            row_cover[s.table] = (b, devices | {s.device})
        else:
            assert s.start == cover[s.table] and s.stop > s.start and (s.stop - s.start) % 4 == 0, f"{t.name}: shard [{s.start}, {s.stop})"
            cover[s.table] = s.stop
        state = 4 * (b - a) if task.workload.optimizer == "rowwise_adagrad" else 0
        used[s.device] += (b - a) * (s.stop - s.start) * task.workload.elt_bytes + state
    for i, (row, _) in row_cover.items():
        assert row == task.tables[i].rows and cover[i] == 0, f"{task.tables[i].name}: rows [0, {row}) of {task.tables[i].rows}, split by rows and columns"
        cover[i] = task.tables[i].dim
    assert cover == [t.dim for t in task.tables], "a table's columns not covered"
    assert used.max() <= task.max_memory_bytes, f"device {used.argmax()} holds {used.max():,} bytes > {task.max_memory_bytes:,}"


def check_infeasible(task: Task, error: InfeasibleError) -> None:
    """The typed error, naming the table count, the bytes needed and the bytes there are."""
    sizes = task.sizes()
    m = NEEDS.search(str(error))
    assert m, str(error)
    assert [int(g) for g in m.groups()] == [len(sizes), sum(sizes), task.devices, task.devices * task.max_memory_bytes]


@pytest.mark.parametrize("count", [80, pytest.param(TASKS, marks=pytest.mark.long)])
def test_every_planner_on_random_tasks(planners, count):
    tasks = random_tasks(count, seed=2026)  # the first 80 of the 2,000 are the same tasks
    assert len(tasks) == count and sum(len(t.tables) > 1_000 for t in tasks) >= count // 100
    outcomes = {name: [0, 0] for name in planners}  # plans, infeasible errors
    with hang_guard(1_800 * 5 // MODEL_STRIDE):
        for i, task in enumerate(tasks):
            sizes = task.sizes()
            hopeless = over_bounds(sizes, task.max_memory_bytes, task.devices)
            packs = hopeless is False and pack(task.sizes(), task.max_memory_bytes, task.devices) is not None
            for name, planner in planners.items():
                if i % stride(name):
                    continue
                try:
                    plan = planner.plan(task)
                except InfeasibleError as e:
                    assert not packs, f"task {i}: {name} gave up on a task the memory packing places"
                    check_infeasible(task, e)
                    outcomes[name][1] += 1
                    continue
                # a table larger than a device fits once cut: only a split plan may place such a task
                assert not hopeless or plan.split_tables(), f"task {i}: {name} placed a task that cannot fit"
                check_plan(task, plan)
                outcomes[name][0] += 1
                if i % (10 * stride(name)) == 0:  # deterministic: two planners of the same seed plan the same
                    assert fresh(name, planners).plan(task).shards == fresh(name, planners).plan(task).shards, f"task {i}: {name}"
    for name, (placed, refused) in outcomes.items():
        n = len(range(0, len(tasks), stride(name)))
        assert placed + refused == n
        # both kinds were exercised (the splitting planners now place by rows tasks with a table larger than a device: fewer refusals)
        assert placed > n // 4 and refused >= n // 40 if count == TASKS else placed + refused > 0, (name, placed, refused)


def test_fresh_learned_planner_is_deterministic(planners):
    for task in random_tasks(20, seed=7):
        if over_bounds(task.sizes(), task.max_memory_bytes, task.devices):
            continue
        try:
            first = planners["dreamshard"].plan(task)
        except InfeasibleError:
            continue
        assert get_planner("dreamshard", seed=0).plan(task).shards == first.shards


@pytest.mark.long
@pytest.mark.parametrize("tables,devices", [(10_000, 64), (2_000, 1_024), (10_000, 1_024)])
def test_large_tasks_plan_and_price(planners, tables, devices):
    """Plan and simulate-price with every planner; the guard only catches hangs (timings:
    benchmarks/large_tasks.py)."""
    specs = random_tables(tables, seed=tables + devices)
    sizes = [t.bytes() for t in specs]
    task = Task(specs, devices, max(int(sum(sizes) / devices * 1.3), max(sizes)))
    sim = SimBackend()
    with hang_guard(HANG_S):
        for name, planner in planners.items():
            plan = planner.plan(task)
            check_plan(task, plan)
            report = sim.evaluate_plan(plan)
            assert len(report.devices) == devices
            costs = np.array([[d.fwd_comp_ms, d.fwd_comm_ms, d.bwd_comm_ms, d.bwd_comp_ms] for d in report.devices])
            assert np.isfinite(costs).all() and (costs >= 0).all() and costs.sum() > 0


@pytest.mark.long
@pytest.mark.parametrize("devices,slack", [(8, 3), (1_024, 3), (1_024, -1)])
def test_large_infeasible_tasks_fail_clearly(planners, devices, slack):
    """10,000 tables with a few bytes too few per device (first-fit fails, the search runs out of
    budget), or fewer bytes than the tables need: the typed error with its byte counts."""
    specs = random_tables(10_000, seed=devices)
    sizes = [t.bytes() for t in specs]
    task = Task(specs, devices, max(sum(sizes) // devices + slack, max(sizes) if slack > 0 else 1))
    with hang_guard(HANG_S):
        for name, planner in planners.items():
            try:
                plan = planner.plan(task)
            except InfeasibleError as e:
                check_infeasible(task, e)
            else:
                assert slack > 0, f"{name} placed more bytes than the devices hold"
                check_plan(task, plan)


# --------------------------------------------------------------------------------------------
# Every planner as a user gets it, on 2,000 small tasks
# --------------------------------------------------------------------------------------------

SMALL_TASKS = 2_000
# The learned planners with their shipped models (`plan --planner autoshard` without --model), the
# searches with a small budget (`plan --budget`): the property is validity, not search quality.
AS_SHIPPED = {"neuroshard": SMALL_SEARCH["neuroshard"], "oracle": {"backend": SimBackend(), "budget": 200}}
USER_CONFIGS = planner_configs(AS_SHIPPED, torchrec=True)
# Which planners may answer a task that fits with NoPlanError (the CLI's "no plan for this task"),
# and what they must say: the RNN placer's model has no output for a device beyond its width (the
# shipped one: 8); TorchRec has none where its own search finds none.
MAY_HAVE_NO_PLAN = {"rnn": "places tasks of up to", "torchrec": ""}


def small_random_tasks(count: int, seed: int) -> list[Task]:
    """1–30 tables of one 3,000-table pool on 1–16 devices, each precision and optimizer; memory
    per device below the largest table (5% of tasks), tight (0.8–1.5 × the even share, at least
    the largest table), roomy (1.5–4 ×) or 80 GB (where TorchRec's reservation leaves room)."""
    pool = random_tables(3_000, seed, prefix="s")
    rng = np.random.default_rng(seed + 1)
    tasks = []
    for _ in range(count):
        n, devices = int(rng.integers(1, 31)), int(rng.choice([1, 2, 3, 4, 6, 8, 16]))
        tables = [pool[j] for j in rng.choice(len(pool), n, replace=False)]
        precision, optimizer = str(rng.choice(list(PRECISION_BYTES))), str(rng.choice(OPTIMIZERS))
        sizes = [t.bytes(precision, optimizer) for t in tables]
        regime, share, largest = rng.random(), sum(sizes) / devices, max(sizes)
        cap = (largest * rng.uniform(0.5, 1.0) if regime < 0.05
               else max(share * rng.uniform(0.8, 1.5), largest * rng.uniform(1.0, 1.3)) if regime < 0.55
               else max(share * rng.uniform(1.5, 4.0), largest * rng.uniform(1.3, 2.0)) if regime < 0.85 else 80 * 2**30)
        tasks.append(Task(tables, devices, max(1, int(cap)), Workload(precision=precision, optimizer=optimizer)))
    return tasks


@contextmanager
def one_torch_thread():
    """The nets here are small: on a busy machine two intra-op threads spend more time waiting
    for each other than computing (AutoShard's 25 ms a task becomes 250 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# `make test-long`: 2,000 tasks × 17 planners, about 8 minutes of CPU (12 minutes on a shared
# 2-core machine; a quarter of a second a task for all of them, most of it the learned planners,
# TorchRec's and the searches). `make test`: the first 30 tasks, about 10 s.
@pytest.mark.parametrize("count", [30, pytest.param(SMALL_TASKS, marks=pytest.mark.long)])
def test_every_planner_as_shipped_on_small_random_tasks(count):
    from dreamshard.plan import Plan
    from dreamshard.validation import NoPlanError

    tasks = small_random_tasks(count, seed=34)
    planners = {label: get_planner(name, **kw) for label, (name, kw) in USER_CONFIGS.items()}
    outcomes = {label: {"plans": 0, "split": 0, "infeasible": 0, "no plan": 0} for label in planners}
    with one_torch_thread(), hang_guard(3 * 3600 * count // SMALL_TASKS + 600):
        for i, task in enumerate(tasks):
            sizes = task.sizes()
            hopeless = over_bounds(sizes, task.max_memory_bytes, task.devices)
            packs = hopeless is False and pack(sizes, task.max_memory_bytes, task.devices) is not None
            for label, planner in planners.items():
                name = USER_CONFIGS[label][0]
                try:
                    plan = planner.plan(task)
                except InfeasibleError as e:
                    assert not packs or name == "torchrec", f"task {i}: {label} gave up on a task the memory packing places: {e}"
                    if name != "torchrec":
                        check_infeasible(task, e)
                    outcomes[label]["infeasible"] += 1
                    continue
                except NoPlanError as e:
                    assert name in MAY_HAVE_NO_PLAN and MAY_HAVE_NO_PLAN[name] in str(e) and "\n" not in str(e), f"task {i}: {label}: {e}"
                    outcomes[label]["no plan"] += 1
                    continue
                assert not hopeless or plan.split_tables(), f"task {i}: {label} placed a task that cannot fit"
                plan.check(f"task {i}, {label}")  # the package's own check (PlanError)
                Plan.from_json(plan.to_json(), f"task {i}, {label}").check()  # as `measure` would read its file
                check_plan(task, plan)
                outcomes[label]["plans"] += 1
                outcomes[label]["split"] += bool(plan.split_tables())
    print(f"\n{count} small random tasks (seed 34): plans (of them split), infeasible, no plan; 0 invalid plans")
    for label, o in outcomes.items():
        print(f"  {label:24s} {o['plans']:5d} ({o['split']:4d}) {o['infeasible']:5d} {o['no plan']:5d}")
    for label, o in outcomes.items():
        assert sum(o.values()) - o["split"] == count
        assert o["plans"] > count // (4 if USER_CONFIGS[label][0] != "torchrec" else 20), (label, o)  # placing is the common case
    if count == SMALL_TASKS:  # every --split variant cuts somewhere
        assert all(o["split"] > 0 for label, o in outcomes.items() if USER_CONFIGS[label][1].get("split", PLANNERS[USER_CONFIGS[label][0]].options().get("split"))), outcomes
