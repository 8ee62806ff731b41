"""The `oracle` planner: simulated annealing on a backend's true cost (dreamshard/planners/oracle.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dreamshard.costs.base import CostBackend, CostReport, DeviceCost
from dreamshard.costs.sim import SimBackend
from dreamshard.packing import InfeasibleError
from dreamshard.planners import PLANNERS, get_planner
from dreamshard.planners.oracle import OraclePlanner
from dreamshard.report import missing_arguments
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tasks import Task, sample_tasks, split_pool
from dreamshard.validation import OptionError


@pytest.fixture(scope="module")
def sim():
    return SimBackend()


@pytest.fixture(scope="module")
def tasks():
    _, test_half = split_pool(synth_pool(PoolConfig(seed=0)), 0)
    return sample_tasks(test_half, 2, (40, 40), 4, 5 * 10**9, seed=3) + sample_tasks(test_half, 1, (80, 80), 8, 5 * 10**9, seed=3)


class Counting(CostBackend):
    """Wraps a backend and counts the placements it prices (a batch of N counts N)."""

    def __init__(self, inner, batched: bool = True):
        self.inner, self.name, self.priced = inner, inner.name, 0
        if batched:
            self.costs_batch = self._costs_batch

    def _costs_batch(self, tables, placements, devices, workload):
        placements = np.asarray(placements).reshape(-1, len(tables))
        self.priced += len(placements)
        return self.inner.costs_batch(tables, placements, devices, workload)

    def evaluate(self, shards, workload=None):
        self.priced += 1
        return self.inner.evaluate(shards, workload)


class Fake(CostBackend):
    """A non-batched backend of its own: a device costs its dims and lookups, a fixed cost per
    table and a little all-to-all."""

    name = "fake backend"

    def evaluate(self, shards, workload=None):
        devices = []
        for held in shards:
            comp = sum(t.dim * (1 + t.pooling_factor) / 1e3 + 0.05 for t in held)
            comm = 0.01 * sum(t.dim for t in held) / 64
            devices.append(DeviceCost(comp * 0.3, comm, comm, comp * 0.7))
        return CostReport(devices, self.name, "sim", "none", 65_536)


def test_registered_as_a_search_planner_that_needs_a_backend(sim):
    assert PLANNERS["oracle"].kind == "search"
    assert missing_arguments("oracle") == ["backend"]  # so the demo skips it and compare refuses it
    assert {"budget", "restarts", "seed", "split"} <= set(PLANNERS["oracle"].options())
    for bad in ({}, {"backend": None}, {"backend": sim, "budget": 0}, {"backend": sim, "restarts": -1}):
        with pytest.raises(OptionError):
            get_planner("oracle", **bad)


@pytest.mark.parametrize("split", [True, False])
def test_plans_within_memory_and_never_worse_than_lookup(sim, tasks, split):
    for task in tasks:
        plan = get_planner("oracle", backend=sim, budget=2_000, split=split).plan(task)
        plan.check()
        if not split:
            assert plan.is_table_wise
        cost = sim.evaluate_plan(plan).overall_ms
        assert plan.predicted["source"] == sim.name and plan.predicted["overall_ms"] == pytest.approx(cost)
        starts = [get_planner("lookup").plan(task)] + ([get_planner("lookup", split=True).plan(task)] if split else [])
        assert cost <= min(sim.evaluate_plan(p).overall_ms for p in starts) + 1e-9
        assert plan.notes and "evaluations" in plan.notes[0]


def test_deterministic_for_a_seed(sim, tasks):
    task = tasks[2]
    a = OraclePlanner(sim, budget=1_500, seed=5).plan(task)
    b = OraclePlanner(sim, budget=1_500, seed=5).plan(task)
    assert a.shards == b.shards and a.predicted == b.predicted


@pytest.mark.parametrize("budget", [1, 2, 7, 300, 1_001])
@pytest.mark.parametrize("batched", [True, False])
def test_budget_respected(sim, tasks, budget, batched):
    counting = Counting(sim, batched)
    plan = OraclePlanner(counting, budget=budget, restarts=2).plan(tasks[0])
    plan.check()
    assert 1 <= counting.priced <= budget
    assert plan.predicted["evaluations"] == counting.priced
    if budget >= 300:
        assert counting.priced >= budget - 20  # it spends what it is given


def test_non_batched_backend(tasks):
    fake = Fake()
    task = tasks[0]
    plan = OraclePlanner(fake, budget=400).plan(task)
    plan.check()
    start = fake.evaluate_plan(get_planner("lookup").plan(task)).overall_ms
    assert plan.predicted["source"] == "fake backend"
    assert fake.evaluate_plan(plan).overall_ms <= start + 1e-9


def test_column_splits_in_multiples_of_4(sim, tasks):
    splits_seen = 0
    for task in tasks:
        plan = OraclePlanner(sim, budget=3_000).plan(task)
        plan.check()
        for s in plan.shards:
            assert s.start % 4 == 0 and s.stop % 4 == 0 and s.width >= 4
        splits_seen += len(plan.split_tables())
    assert splits_seen  # the search does cut tables on these tasks


def test_one_device_and_infeasible(sim, tasks):
    task = tasks[0]
    one = Task(task.tables, 1, sum(task.sizes()), task.workload)
    plan = OraclePlanner(sim, budget=100).plan(one)
    plan.check()
    tight = Task(task.tables, task.devices, max(task.sizes()) - 1, task.workload)
    with pytest.raises(InfeasibleError):
        OraclePlanner(sim, budget=100, split=False).plan(tight)


def reference_moves(annealer, task, state, n, rng):
    """`Annealer._moves` as first written, the draw by draw spec its faster loop keeps: a piece
    by `_piece`, then a move to a legal device (half the time among the three fastest) or a swap."""
    cap, seen, rows = task.max_memory_bytes, set(), []
    for _ in range(4 * n):
        if len(rows) == n:
            break
        i = annealer._piece(state, rng)
        a = state.dev[i]
        if rng.random() < 0.5:
            legal = state.used + state.size[i] <= cap
            legal[a] = False
            ok = np.flatnonzero(legal)
            if not len(ok):
                continue
            if rng.random() < 0.5:
                ok = ok[np.argsort(state.totals[ok], kind="stable")[:3]]
            d = int(ok[rng.integers(len(ok))])
            if ("m", i, d) in seen:
                continue
            seen.add(("m", i, d))
            row = state.dev.copy()
            row[i] = d
        else:
            fits = np.flatnonzero((state.dev != a) & (state.used[a] - state.size[i] + state.size <= cap)
                                  & (state.used[state.dev] - state.size + state.size[i] <= cap))
            if not len(fits):
                continue
            j = int(fits[rng.integers(len(fits))])
            b = state.dev[j]
            if (min(i, j), max(i, j)) in seen:
                continue
            seen.add((min(i, j), max(i, j)))
            row = state.dev.copy()
            row[i], row[j] = b, a
        rows.append(row)
    return (state.pieces, np.array(rows)) if rows else None


def test_the_moves_are_drawn_as_the_reference_draws_them(sim, tasks):
    """The annealing's moves and swaps, drawn from the same generator state, are the reference's
    neighbours and leave the generator where it leaves it — on roomy and on tight memory (where
    many moves have no legal device) and with ties among the devices' costs."""
    from dreamshard.planners.oracle import Annealer, Pricer, State

    annealer, checked = Annealer(), 0
    for k, task in enumerate(tasks[:4]):
        for cap in (task.max_memory_bytes, int(sum(task.sizes()) / task.devices * 1.05)):
            tight = Task(task.tables, task.devices, cap)
            pricer = Pricer(sim, tight, 10**6)
            pieces = [(t, 0, spec.dim) for t, spec in enumerate(tight.tables)]
            rng = np.random.default_rng(k)
            size = np.array([pricer.size(p) for p in pieces])
            dev = np.argsort(np.argsort(-size)) % tight.devices  # round robin by size: within memory
            totals = np.round(rng.uniform(1, 3, tight.devices), 1 if cap < task.max_memory_bytes else 3)
            state = State(pieces, dev, pricer, totals)
            for seed in range(20):
                a, b = np.random.default_rng(seed), np.random.default_rng(seed)
                got, want = annealer._moves(tight, state, 8, a), reference_moves(annealer, tight, state, 8, b)
                assert (got is None) == (want is None) and (got is None or np.array_equal(got[1], want[1]))
                assert a.random() == b.random()
                checked += got is not None
    assert checked > 100
