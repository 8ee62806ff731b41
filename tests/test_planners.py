"""Every planner: a complete placement within memory for feasible tasks, the clear error otherwise."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dreamshard.packing import InfeasibleError, pack
from dreamshard.planners import PLANNERS, get_planner
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task

HEURISTICS = ["random", "size", "dim", "lookup", "size_lookup"]


def brute_force_feasible(task: Task) -> bool:
    sizes = task.sizes()
    for assign in itertools.product(range(task.devices), repeat=len(sizes)):
        used = [0] * task.devices
        for s, d in zip(sizes, assign):
            used[d] += s
        if max(used) <= task.max_memory_bytes:
            return True
    return False


@st.composite
def tasks(draw, max_tables=7, max_devices=3):
    n = draw(st.integers(1, max_tables))
    tables = [
        TableSpec(f"t{i}", draw(st.integers(1, 5000)), draw(st.sampled_from([4, 8, 16, 32, 64, 128])), draw(st.floats(0, 50)))
        for i in range(n)
    ]
    devices = draw(st.integers(1, max_devices))
    total = sum(t.bytes() for t in tables)
    cap = draw(st.integers(max(1, total // (devices * 2)), total + 1))
    return Task(tables, devices, cap)


@settings(max_examples=150, deadline=None)
@given(tasks())
def test_every_planner_respects_memory_or_says_infeasible(task):
    ok = brute_force_feasible(task)
    assert (pack(task.sizes(), task.max_memory_bytes, task.devices) is not None) == ok
    for name in HEURISTICS:
        planner = get_planner(name)
        if ok:
            plan = planner.plan(task)
            assert len(plan.placement) == len(task.tables)
            plan.check()  # every table on a device, every device within memory
        else:
            with pytest.raises(InfeasibleError, match=r"needing .* bytes.* on \d+ devices with .* bytes"):
                planner.plan(task)


def test_registry_lists_heuristics():
    assert set(HEURISTICS) <= set(PLANNERS)
    with pytest.raises(ValueError, match="unknown planner"):
        get_planner("nope")


def test_balanced_pack_fits_and_is_never_worse_balanced_than_the_packing():
    from dreamshard.packing import balanced_pack

    for seed in range(200):
        rng = random.Random(seed)
        n, devices = rng.randint(1, 60), rng.randint(1, 8)
        sizes = [rng.randint(1, 1000) for _ in range(n)]
        load = [rng.choice([0.0, rng.random(), 100 * rng.random()]) for _ in range(n)]
        cap = max(max(sizes), int(sum(sizes) / devices * rng.uniform(0.9, 1.6)))
        packed, balanced = pack(sizes, cap, devices), balanced_pack(sizes, cap, devices, load)
        assert (packed is None) == (balanced is None), seed
        if packed is None:
            continue
        used, tot, tot_packed = [0] * devices, [0.0] * devices, [0.0] * devices
        for i, d in enumerate(balanced):
            used[d] += sizes[i]
            tot[d] += load[i]
            tot_packed[packed[i]] += load[i]
        assert len(balanced) == n and max(used) <= cap and all(0 <= d < devices for d in balanced), seed
        assert max(tot) <= max(tot_packed) + 1e-9, seed


def test_a_greedy_stuck_on_memory_falls_back_to_a_balanced_packing():
    # a cold table of 9 units and six hot ones of 1 on 3 devices of 10: the lookup greedy spreads
    # the hot ones 2/2/2 first and has no room left for the cold one; first-fit decreasing would put
    # the cold one and a hot one on device 0 and the five other hot ones together on device 1
    tables = [TableSpec("cold", 9000, 64, 0.01)] + [TableSpec(f"hot{i}", 1000, 64, 100.0) for i in range(6)]
    probe = Task(tables, 3, 10**9)
    cap = probe.sizes()[0] + probe.sizes()[1]
    assert cap == 10 * probe.sizes()[1]  # sizes are linear in rows here
    plan = get_planner("lookup").plan(Task(tables, 3, cap))
    assert plan.notes and "ran out of memory" in plan.notes[0]
    hot_per_device = [sum(1 for i in range(1, 7) if plan.placement[i] == d) for d in range(3)]
    assert max(hot_per_device) == 3 and hot_per_device[plan.placement[0]] == 1


def test_too_many_bytes_says_what_would_be_enough():
    import re

    from dreamshard.packing import infeasible_error, over_bounds

    for seed in range(50):
        rng = random.Random(seed)
        sizes = [rng.randint(1, 10**9) for _ in range(rng.randint(2, 40))]
        devices = rng.randint(1, 8)
        cap = max(max(sizes), sum(sizes) // devices - rng.randint(1, 10**9))  # every table fits one device, not all of them
        if not over_bounds(sizes, cap, devices):
            continue
        msg = str(infeasible_error(["t"] * len(sizes), sizes, cap, devices))
        m = re.search(r"; that takes at least (\d+) devices of .* or ([\d.]+) (GB|MB) on each of (\d+)$", msg)
        assert m, msg
        need = int(m.group(1))
        per = float(m.group(2)) * {"GB": 1e9, "MB": 1e6}[m.group(3)]
        # the advice is enough (as far as bytes go) and the device count is the least that is
        assert need * cap >= sum(sizes) > (need - 1) * cap
        assert per * devices >= sum(sizes) and int(m.group(4)) == devices


def test_lookup_greedy_balances_lookups():
    tables = [TableSpec(f"t{i}", 100, 16, pf) for i, pf in enumerate([8, 7, 6, 5, 4, 3, 2, 1])]
    plan = get_planner("lookup").plan(Task(tables, 2, 10**9))
    loads = [sum(t.lookup for t in s) for s in plan.device_tables()]
    assert loads == [16 * 18, 16 * 18]


def test_packing_thousands_of_tables_without_recursion():
    # the exhaustive packing used to recurse once per table (RecursionError past ~1,000 tables)
    from dreamshard.packing import infeasible_error

    sizes = [1000 + i % 7 for i in range(5000)]
    cap = sum(sizes) // 8 + 2000
    placement = pack(sizes, cap, 8)
    assert placement is not None and len(placement) == 5000
    used = [0] * 8
    for b, d in zip(sizes, placement):
        used[d] += b
    assert max(used) <= cap
    # first-fit fails on this one, the search runs out of budget: None and the typed error, no RecursionError
    tight = sum(sizes) // 8 + 3
    assert pack(sizes, tight, 8) is None
    assert "cannot place 5000 tables" in str(infeasible_error(["t"] * 5000, sizes, tight, 8))
