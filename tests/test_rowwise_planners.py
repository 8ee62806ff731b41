"""Planners that write row-wise shards: the splitting searches (DreamShard's
split search, NeuroShard's beam) row-split a hot table only where the cost net, with the
simulator's reduce-scatter rule, says it pays; tables larger than a device are placed split by
rows; TorchRec's row-wise choices convert to our plans and back through export; a planner's
row-wise plan is measured by the distributed runner on two gloo processes."""

import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from dreamshard import torchrec_io as tio
from dreamshard.costs.comm import load_comm_model, relayout_ms, rowwise_ms
from dreamshard.packing import InfeasibleError
from dreamshard.plan import Plan, Shard
from dreamshard.planners import dreamshard as dreamshard_planner
from dreamshard.planners import get_planner, splits
from dreamshard.planners import neuroshard as neuroshard_planner
from dreamshard.planners.scoring import COMM, PieceScorer, greedy_batch
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task, Workload

# One hot table (pooling 300 over 200k rows, dim 128) that sets the step, and small ones: hot
# enough that a shipped model prices a row split of it as a gain on 2 or 4 devices.
HOT = TableSpec("hot", 200_000, 128, 300.0, distribution="zipf:1.05", seed=11)
SMALL = [TableSpec(f"s{i}", 2_000 * (i + 1), 32, 2.0 + i, distribution="zipf:1.1", seed=20 + i) for i in range(5)]
SPLITTING = [("dreamshard", {"split": True}), ("neuroshard", {"beam": 2, "depth": 3, "top": 4, "caps": 3})]
NEEDS = re.compile(r"^cannot place (\d+) tables needing .* \((\d+) bytes\) on (\d+) devices with .* \((\d+) bytes\) in all")


@pytest.fixture(scope="module")
def planners():
    return {name: get_planner(name, **kw) for name, kw in SPLITTING}


def hot_task(devices=4, cap=10**10, workload=Workload()) -> Task:
    return Task([HOT] + SMALL, devices, cap, workload)


def hot_rows_plan(devices: int) -> Plan:
    """The hot task with the hot table split by rows over every device, block r on device r (the
    splitting searches' layout, `splits.row_split`), the small tables round the devices: a row-wise
    plan that does not depend on which split a shipped model prefers."""
    task = hot_task(devices)
    pieces = splits.row_split(task, 0, devices) + splits.whole(task)[1:]
    return splits.placed(task, pieces, list(range(devices)) + [i % devices for i in range(len(SMALL))], "dreamshard")


def check_rows_and_memory(plan: Plan) -> None:
    """Independently of Plan.check: every table tiled exactly once by columns or by rows (row
    blocks on distinct devices, every column), every device within memory counting rows × columns."""
    task, w = plan.task, plan.task.workload
    used = np.zeros(task.devices, np.int64)
    for i, t in enumerate(task.tables):
        mine = [s for s in plan.shards if s.table == i]
        if any(s.is_row_shard for s in mine):
            ranges = sorted(s.row_range(t) for s in mine)
            assert all((s.start, s.stop) == (0, t.dim) for s in mine) and len({s.device for s in mine}) == len(mine)
            assert ranges[0][0] == 0 and ranges[-1][1] == t.rows and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        else:
            cols = sorted((s.start, s.stop) for s in mine)
            assert cols[0][0] == 0 and cols[-1][1] == t.dim and all(a[1] == b[0] for a, b in zip(cols, cols[1:]))
        for s in mine:
            a, b = s.row_range(t)
            state = 4 * (b - a) if w.optimizer == "rowwise_adagrad" else 0
            used[s.device] += (b - a) * s.width * w.elt_bytes + state
    assert used.max() <= task.max_memory_bytes
    plan.check()


def test_a_hot_table_is_split_by_rows_where_the_model_says_it_pays(planners, monkeypatch):
    """On 2 and 4 devices: where a search splits the hot table by rows, the split is TorchRec's
    row_wise layout and the same search without row moves predicts a costlier plan; and some search
    splits it on one of the two (which one depends on the shipped model's prices)."""
    chose = []
    for devices in (2, 4):
        task = hot_task(devices)
        for name, planner in planners.items():
            plan = planner.plan(task)
            check_rows_and_memory(plan)
            rows = {task.tables[s.table].name for s in plan.shards if s.is_row_shard}
            if "hot" not in rows:  # the search preferred a column plan by its prediction
                continue
            chose.append((name, devices))
            # a split over every device is TorchRec's row_wise: blocks of ceil(rows / D), block r on device r
            hot = sorted((s for s in plan.shards if s.table == 0), key=lambda s: s.row_start)
            if len(hot) == devices:
                assert [(s.device, s.row_range(HOT)) for s in hot] == [(r, ab) for r, ab in enumerate(tio.row_wise_cuts(HOT.rows, devices))]
            # the same search without row moves predicts a costlier plan: the row split was chosen because it pays
            with monkeypatch.context() as m:
                m.setattr(PieceScorer, "row_candidates", lambda self, pieces, among, top: [])
                columns = planner.plan(task)
            assert not columns.has_row_shards()
            assert plan.predicted["max_device_ms"] < columns.predicted["max_device_ms"], (name, devices)
    assert chose, "no search split the hot table by rows"


def test_no_row_split_where_the_exchange_costs_more(planners, monkeypatch):
    """With collectives 1,000 times slower no row split pays: both searches return exactly the
    plan they return without row moves (column and table-wise results unchanged)."""
    task = hot_task(4)
    comm = load_comm_model(None, "cuda", 4).params()
    slow = {**comm, **{k: {**comm[k], "latency_ms": 1000.0} for k in ("reduce_scatter", "all_gather")}}
    for name, planner in planners.items():
        shipped, planner.comm = planner.comm, slow
        try:
            plan = planner.plan(task)
        finally:
            planner.comm = shipped
        with monkeypatch.context() as m:
            m.setattr(PieceScorer, "row_candidates", lambda self, pieces, among, top: [])
            columns = planner.plan(task)
        assert not plan.has_row_shards() and plan.shards == columns.shards, name


def test_the_scorer_prices_the_exchange_as_the_simulator_does(planners):
    """A row piece leaves its device's comm head (the device's comm is what its other pieces
    alone predict) and the reduce-scatter + all-gather of comm.rowwise_ms is added to every device,
    with the copies of comm.relayout_ms of each device that holds a row piece."""
    task = hot_task(4)
    scorer = PieceScorer(planners["neuroshard"].model, task)
    pieces = splits.row_split(task, 0, 4) + splits.whole(task)[1:]
    devices = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0])
    pred = scorer.predicted(pieces, devices, "test")
    comm = load_comm_model(None, "cuda", 4).params()  # the shipped model of the task's device count
    w = task.workload
    rs, ag = rowwise_ms(comm, HOT.dim, w.batch_size, w.elt_bytes, 4)
    assert pred["rowwise_comm_ms"] == pytest.approx(rs + ag, rel=1e-6)
    others = scorer.state(pieces[4:], devices[4:])
    alone_comm = scorer.device_costs(others)[:, COMM] * scorer.net.scale  # the comm head's, or the comm model's all-to-all
    a2a = np.bincount(devices[4:], weights=[p.width for p in pieces[4:]], minlength=4)
    copy_f, copy_b = relayout_ms(comm, a2a, [HOT.dim] * 4, w.batch_size, w.elt_bytes)
    assert copy_f.min() > 0 and copy_b.min() > 0
    assert [d["comm_ms"] for d in pred["devices"]] == pytest.approx(list(alone_comm + rs + ag + copy_f + copy_b), rel=1e-5)
    assert pred["max_device_ms"] == pytest.approx(float(scorer.score(scorer.state(pieces, devices))) * scorer.net.scale, rel=1e-5)


def test_tables_larger_than_a_device_are_placed_by_row_splits(planners):
    size = HOT.bytes()
    task = hot_task(4, cap=int(size * 0.6))  # the hot table needs two devices' worth of memory
    assert task.table_bytes(HOT) > task.max_memory_bytes
    for name, planner in planners.items():
        plan = planner.plan(task)
        check_rows_and_memory(plan)
        assert plan.has_row_shards() and len([s for s in plan.shards if s.table == 0]) >= 2, name
    # the planners that do not split still refuse it, naming the table
    for name, options in (("dreamshard", {"split": False}), ("lookup", {}), ("size_lookup", {})):
        with pytest.raises(InfeasibleError, match=r"table hot alone needs \d+ bytes > \d+ per device$"):
            get_planner(name, **options).plan(task)
    # more bytes than all devices hold, and a table too large even in MAX_ROW_PARTS blocks (128
    # devices hold the task, 64 blocks of the hot table do not fit one): the typed error, the bytes, why
    for devices, cap, why in [(4, int(size * 0.2), r"; table hot alone needs \d+ bytes > \d+ per device$"),
                              (128, int(size * 0.012), r"; split by rows over 64 devices its largest block still needs \d+ bytes \(.*\)$")]:
        tiny = hot_task(devices, cap=cap)
        for name, planner in planners.items():
            with pytest.raises(InfeasibleError) as e:
                planner.plan(tiny)
            m = NEEDS.search(str(e.value))
            assert m and [int(g) for g in m.groups()] == [len(tiny.tables), sum(tiny.sizes()), devices, devices * cap], name
            assert re.search(why, str(e.value)), (name, str(e.value))


def random_tasks(count: int, seed: int) -> list[Task]:
    """Small random tasks whose hot table sometimes dominates and sometimes is larger than a device."""
    rng = np.random.default_rng(seed)
    tasks = []
    for k in range(count):
        n = int(rng.integers(2, 9))
        rows = rng.integers(500, 20_000, n)
        dims = rng.choice([16, 32, 64, 128], n)
        pf = rng.uniform(1, 20, n)
        tables = [TableSpec(f"r{k}_{i}", int(rows[i]), int(dims[i]), float(pf[i]), distribution=f"zipf:{rng.uniform(0.8, 1.2):.2f}", seed=int(rng.integers(1000)))
                  for i in range(n)]
        devices = int(rng.choice([2, 3, 4, 8]))
        workload = Workload(precision=str(rng.choice(["fp16", "fp32"])), optimizer=str(rng.choice(["sgd", "rowwise_adagrad"])))
        sizes = [t.bytes(workload.precision, workload.optimizer) for t in tables]
        cap = int(max(sum(sizes) / devices * rng.uniform(1.1, 2.0), max(sizes) * rng.uniform(0.4, 1.3)))
        tasks.append(Task(tables, devices, cap, workload))
    return tasks


def test_splitting_planners_on_random_tasks(planners):
    """Every plan tiles every table (by columns or rows) and fits memory; a task with a table
    larger than a device is placed only by a row split; a refusal is the typed error."""
    placed = oversize = 0
    for task in random_tasks(8, seed=5):
        big = max(task.sizes()) > task.max_memory_bytes
        for name, planner in planners.items():
            try:
                plan = planner.plan(task)
            except InfeasibleError as e:
                assert NEEDS.search(str(e)), str(e)
                continue
            check_rows_and_memory(plan)
            placed += 1
            oversize += big
            assert not big or plan.has_row_shards()
    assert placed >= 8 and oversize >= 2


def reference_greedy(scorer: PieceScorer, pieces: list[list[Shard]], caps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`scoring.greedy_batch` as first written, the spec its batched loop is checked against: each
    step gathers what every episode places and applies every constraint on [E, D] arrays; the
    row constraints as `splits.row_groups` first had them."""
    task, net = scorer.task, scorer.net
    C, n, D, S = len(pieces), len(pieces[0]), task.devices, len(caps)
    rows = scorer.rows(pieces)
    sizes = np.array([splits.sizes(task, ps) for ps in pieces], np.int64)
    dims = np.array([[0 if p.is_row_shard else p.width for p in ps] for ps in pieces], np.int64)
    pin, group = np.full((C, n), -1), np.full((C, n), -1)
    for c, ps in enumerate(pieces):
        count = Counter(p.table for p in ps if p.is_row_shard)
        starts = {t: sorted(p.row_start for p in ps if p.is_row_shard and p.table == t) for t in count}
        groups = {t: g for g, t in enumerate(t for t in count if count[t] != D)}
        for k, p in enumerate(ps):
            if p.is_row_shard and count[p.table] == D:
                pin[c, k] = starts[p.table].index(p.row_start)
            elif p.is_row_shard:
                group[c, k] = groups[p.table]
    order = np.argsort(-scorer.single[scorer.slots(pieces)], axis=1, kind="stable")  # each piece's compute alone, as measured (`rows` measured them)
    E = C * S
    cand = np.repeat(np.arange(C), S)
    dim_cap = np.maximum(np.tile(caps, C) * dims[cand].sum(1) / D, dims[cand].max(1))  # never below the widest piece
    state, comp = scorer.empty((E, D)), np.zeros((E, D))
    used, dim_sum = np.zeros((E, D), np.int64), np.zeros((E, D), np.int64)
    held = np.zeros((E, max(1, int(group.max()) + 1), D), bool)
    devices, failed, es = np.full((E, n), -1), np.zeros(E, bool), np.arange(E)
    for step in range(n):
        i = order[cand, step]
        size, dim, p, g = sizes[cand, i], dims[cand, i], pin[cand, i], group[cand, i]
        legal = (used + size[:, None] <= task.max_memory_bytes) & (dim_sum + dim[:, None] <= dim_cap[:, None])
        legal &= (p[:, None] < 0) | (np.arange(D)[None, :] == p[:, None])
        legal &= ~(held[es, np.maximum(g, 0)] & (g[:, None] >= 0))
        failed |= ~legal.any(1)
        a = np.where(legal, comp, np.inf).argmin(1)
        state[es, a] += rows[cand, i]
        used[es, a] += size
        dim_sum[es, a] += dim
        held[es, np.maximum(g, 0), a] |= g >= 0
        comp[es, a] = net.costs(state[es, a, : net.nP])[:, :2].sum(-1)
        devices[es, i] = a
    cost = np.where(failed, np.inf, scorer.score(state)).reshape(C, S)
    best = cost.argmin(1)
    return cost[np.arange(C), best], devices.reshape(C, S, n)[np.arange(C), best], caps[best]


def reference_state(scorer: PieceScorer, pieces: list[Shard], devices: np.ndarray) -> np.ndarray:
    state = scorer.empty((scorer.task.devices,))
    np.add.at(state, np.asarray(devices), scorer.rows([pieces])[0])
    return state


def candidate_cuts(task: Task) -> list[list[Shard]]:
    """Whole tables; each table split by rows over every k of `splits.row_parts` (pinned blocks
    over all D, a group under D); each halved; and a mix of the three."""
    whole = splits.whole(task)
    out = [whole]
    for i, piece in enumerate(whole):
        for k in splits.row_parts(task.devices):
            if rows := splits.row_split(task, i, k):
                out.append(whole[:i] + whole[i + 1 :] + rows)
        if splits.can_halve(piece):
            out.append(whole[:i] + splits.cut(piece, 2) + whole[i + 1 :])
    if len(whole) >= 3 and (over_all := splits.row_split(task, 0, task.devices)) and (over_two := splits.row_split(task, 1, 2)):
        out.append([q for p in whole[2:] for q in (splits.cut(p, 2) if splits.can_halve(p) else [p])] + over_two + over_all)
    return out


def test_the_batched_greedy_is_the_step_by_step_one(planners):
    """NeuroShard's inner greedy, batched over candidates and caps with its per-step work laid out
    before the loop, places every piece where the step-by-step reference does: the same devices,
    the same costs (inf where no cap placed everything; its full states are summed in one product
    after the steps, the reference's step by step: float32 sums in another order)."""
    finite = failed = 0
    for task in [hot_task(4), hot_task(2), hot_task(4, cap=int(HOT.bytes() * 0.6))] + random_tasks(8, seed=11):
        scorer = PieceScorer(planners["neuroshard"].model, task)
        by_len: dict[int, list[list[Shard]]] = {}
        for c in candidate_cuts(task):
            by_len.setdefault(len(c), []).append(c)
        for caps in (np.linspace(1.0, 1.5, 4), np.array([splits.NO_DIM_CAP])):
            for cands in by_len.values():
                cost, devices, cap = greedy_batch(scorer, cands, caps)
                ref_cost, ref_devices, ref_cap = reference_greedy(scorer, cands, caps)
                assert np.array_equal(devices, ref_devices) and np.array_equal(np.isinf(cost), np.isinf(ref_cost)) and np.array_equal(cap, ref_cap)
                np.testing.assert_allclose(cost[np.isfinite(cost)], ref_cost[np.isfinite(ref_cost)], rtol=1e-6)
                finite += int(np.isfinite(cost).sum())
                failed += int(np.isinf(cost).sum())
    assert finite > 100 and failed > 0


def test_one_batch_of_candidates_of_any_length_and_caps_is_each_candidate_alone(planners):
    """greedy_batch places candidates of different piece counts in one batch (the shorter ones
    padded with empty pieces placed last), each under the caps given for it ([C, S]): each one's
    devices, cost and chosen cap are those it gets in a batch of its own."""
    checked = 0
    for task in [hot_task(4), hot_task(4, cap=int(HOT.bytes() * 0.6))] + random_tasks(3, seed=13):
        scorer = PieceScorer(planners["neuroshard"].model, task)
        cands = candidate_cuts(task)
        assert len({len(c) for c in cands}) > 1
        all_caps = np.linspace(1.0, 1.5, 6)
        per = np.stack([all_caps[k % 4 : k % 4 + 3] for k in range(len(cands))])
        for caps in (all_caps, per):
            cost, devices, cap = greedy_batch(scorer, cands, caps)
            for c, pieces in enumerate(cands):
                own_cost, own_devices, own_cap = greedy_batch(scorer, [pieces], caps if caps.ndim == 1 else caps[c])
                assert np.array_equal(devices[c, : len(pieces)], own_devices[0]) and cap[c] == own_cap[0]
                assert cost[c] == pytest.approx(own_cost[0], rel=1e-6) if np.isfinite(own_cost[0]) else np.isinf(cost[c])
                checked += 1
    assert checked > 50


def test_the_beams_children_are_placed_under_the_caps_around_their_parents(planners, monkeypatch):
    """caps_near is the window of caps centred on the nearest one (shifted inside at the ends);
    with child_caps the beam's first step places under every cap and each later candidate under
    the window around its parent's best cap; without, every candidate under every cap."""
    from dreamshard.planners import scoring

    caps = np.linspace(1.0, 1.5, 11)
    assert np.allclose(scoring.caps_near(caps, 1.26, 3), [1.2, 1.25, 1.3])
    assert np.allclose(scoring.caps_near(caps, 1.0, 3), caps[:3]) and np.allclose(scoring.caps_near(caps, 1.5, 3), caps[-3:])
    task = hot_task(4)
    scorer = PieceScorer(planners["neuroshard"].model, task)
    seen = []

    def spy(scorer, candidates, caps_given):
        out = greedy_batch(scorer, candidates, caps_given)
        seen.append((np.asarray(caps_given), out[2]))
        return out

    monkeypatch.setattr(scoring, "greedy_batch", spy)
    scoring.beam_search(scorer, [splits.whole(task)], caps, 2, 3, 4, child_caps=3)
    assert len(seen) >= 2 and seen[0][0].shape == caps.shape
    for (given, _), (_, parent_caps) in zip(seen[1:], seen):
        assert given.shape[1] == 3 and set(np.round(given[:, 1], 6)) <= set(np.round(parent_caps, 6)) | {1.05, 1.45}
    seen.clear()
    scoring.beam_search(scorer, [splits.whole(task)], caps, 2, 3, 4)
    assert all(given.shape == caps.shape for given, _ in seen)


def test_the_scorers_cache_is_each_pieces_own_measure(planners):
    """Pieces measured a few at a time as a search meets them (the cache grown, reindexed) have
    the rows measured all at once, their bytes `splits.sizes`, their all-to-all width their
    columns (0 for a row piece), and keep them as the cache grows."""
    task = hot_task(4)
    pieces = list(dict.fromkeys(p for c in candidate_cuts(task) for p in c))
    model = planners["neuroshard"].model
    once = PieceScorer(model, task).rows([pieces])[0]
    scorer = PieceScorer(model, task)
    order = np.random.default_rng(0).permutation(len(pieces))
    first = scorer.rows([[pieces[order[0]]]])[0, 0]
    for k in range(1, len(order), 3):
        scorer.slots([[pieces[i] for i in order[k : k + 3]]])
    slots = scorer.slots([pieces])[0]
    assert np.allclose(scorer.table[slots], once, rtol=1e-5, atol=1e-6)
    assert np.array_equal(scorer.table[slots[order[0]]], first)
    assert scorer.bytes[slots].tolist() == splits.sizes(task, pieces)
    assert scorer.table[slots, scorer._a2a].tolist() == [0 if p.is_row_shard else p.width for p in pieces]


def test_plans_are_the_reference_paths(planners, monkeypatch):
    """Both splitting planners plan as they do with the reference greedy and device states."""
    tasks = [hot_task(4), hot_task(2), hot_task(4, cap=int(HOT.bytes() * 0.6))] + random_tasks(4, seed=5)
    fast = {name: [] for name in planners}
    for task in tasks:
        for name, planner in planners.items():
            fast[name].append(planner.plan(task))
    monkeypatch.setattr(dreamshard_planner, "greedy_batch", reference_greedy)
    monkeypatch.setattr(neuroshard_planner, "greedy_batch", reference_greedy)
    monkeypatch.setattr(PieceScorer, "state", reference_state)
    rows = 0
    for k, task in enumerate(tasks):
        for name, planner in planners.items():
            plan, ref = fast[name][k], planner.plan(task)
            assert plan.shards == ref.shards and plan.predicted == ref.predicted, (name, k)
            rows += plan.has_row_shards()
    assert rows >= 4


def test_torchrec_row_wise_choices_convert_and_round_trip_through_export():
    from torchrec.distributed.types import ShardingPlan  # noqa: F401  (TorchRec is here: the export needs it)

    task = hot_task(4)
    plan = get_planner("torchrec", sharding_types="row_wise,table_wise").plan(task)
    plan.check()
    assert plan.has_row_shards()
    sharding = tio.to_sharding_plan(plan, device_type="cuda")
    back = tio.plan_from_torchrec(sharding, task)
    assert back.shards == plan.shards
    # our row split over every device (the splitting searches' layout, splits.row_split) exports as row_wise, and back
    ours = hot_rows_plan(2)
    kinds = {name: s["sharding_type"] for name, s in tio.torchrec_shardings(ours).items()}
    assert kinds["hot"] == "row_wise"
    assert tio.plan_from_torchrec(tio.to_sharding_plan(ours), ours.task).shards == ours.shards


def test_row_wise_cuts_are_torchrecs_layout():
    from torchrec.distributed.sharding_plan import _calculate_rw_shard_sizes_and_offsets

    for rows, ranks in [(10, 4), (5, 4), (60_000, 8), (7, 7), (1, 3), (40_000_000, 8)]:
        sizes, offsets = _calculate_rw_shard_sizes_and_offsets(rows, ranks, 8)
        assert tio.row_wise_cuts(rows, ranks) == [(o[0], o[0] + s[0]) for s, o in zip(sizes, offsets)]
    assert splits.row_split(Task([TableSpec("x", 5, 8, 1.0)], 4, 10**9), 0, 4) is None  # 2, 2, 1, 0: a block would be empty


def test_distributed_runner_measures_a_row_wise_plan():
    """A row-wise plan on 2 devices, re-batched to 16 samples, on two gloo processes: the
    reduce-scatter and all-gather run for real and every device's phases are timed."""
    from dreamshard.costs.runners import DistributedRunner

    plan = hot_rows_plan(2)
    task = plan.task
    small = Plan(Task(task.tables, 2, task.max_memory_bytes, Workload(16, "fp32")), plan.shards, plan.planner)
    r = DistributedRunner("torch", "cpu", 1, 2, timeout_s=120).evaluate_plan(small)
    assert r.runner == "distributed" and r.details["rowwise_dim"] == HOT.dim
    assert all(c.fwd_comm_ms > 0 and c.bwd_comm_ms > 0 and c.fwd_comp_ms > 0 and c.bwd_comp_ms > 0 for c in r.devices)


def test_planners_import_no_cost_backend():
    """The scorer's collective rule is costs/comm.py's arithmetic (costs/hierarchy.py's on several hosts), the host tiers' costs/host.py's, the kernel features costs/terms.py's counts and costs/paths.py's path model; no backend comes with them."""
    code = ("import sys, dreamshard.planners as p; p.dreamshard.lazy.load(); p.neuroshard.lazy.load(); "
            "print(sorted(m for m in sys.modules if m.startswith('dreamshard.costs')))")  # with the nets the planners bind when built
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['dreamshard.costs', 'dreamshard.costs.comm', 'dreamshard.costs.hierarchy', 'dreamshard.costs.host', 'dreamshard.costs.paths', 'dreamshard.costs.terms']"


def test_the_beam_goes_past_its_depth_only_while_each_step_gains(planners):
    """beam_search(depth=1, extend=k) takes step j > 1 only where step j − 1 lowered the cheapest
    plan: its steps and result are those of the plain beams of depth 1, 2, ... up to the first
    step that gained nothing."""
    from dreamshard.planners.scoring import beam_search

    rng = np.random.default_rng(12)
    warm = [TableSpec(f"h{i}", int(rng.integers(50_000, 300_000)), int(rng.choice([32, 64, 128])), float(rng.uniform(20, 120)), distribution="zipf:1.05", seed=30 + i)
            for i in range(12)]
    task = Task([HOT] + SMALL + warm, 4, 10**10)
    scorer = PieceScorer(planners["neuroshard"].model, task)
    start = splits.whole(task)
    caps = np.linspace(1.0, 1.5, 3)
    plain = [beam_search(scorer, [start], caps, 2, depth, 4)[0] for depth in range(1, 7)]
    steps = []
    cost = beam_search(scorer, [start], caps, 2, 1, 4, progress=lambda step, _: steps.append(step), extend=5)[0]
    taken = len(steps)
    assert taken > 2  # this task gains past the first step
    assert all(plain[j] < plain[j - 1] for j in range(1, taken - 1))  # every step past the first that ran had gained
    assert taken == 6 or plain[taken - 1] == plain[taken - 2]  # it stopped after a step that gained nothing
    assert cost == plain[taken - 1]
