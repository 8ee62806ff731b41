"""The learned split action: cut sets, the cut net's choices, episodes of cuts (torch and NumPy),
training with cuts, and the planner's search with its sources."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dreamshard.costs.sim import SimBackend
from dreamshard.learned.dreamshard import get_config, plan_placements, sample_plans, train
from dreamshard.learned.mdp import CutSet, EpisodeBatch, FastPlayer, choose_cuts, cut_set, plan_cuts, prepare, rollout, rollout_cuts
from dreamshard.learned.nets import CUT_PARTS, DreamShardModel
from dreamshard.planners import get_planner
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tasks import Task, sample_tasks, split_pool
from test_dreamshard import canonical, small_config


@pytest.fixture(scope="module")
def pool():
    return synth_pool(PoolConfig(tables=200, seed=0))


def cut_model(seed: int = 3) -> DreamShardModel:
    torch.manual_seed(seed)
    return DreamShardModel.create(False, "fixed", best_of=4, score="max_device", linear_features=True, keep_room=True, cuts=True)


def test_a_cut_set_holds_every_legal_cut_of_every_table_once(pool):
    task = Task(pool[:30], 4, 10**12)
    s = cut_set(task, cut_model())
    for i, t in enumerate(task.tables):
        for o, parts in enumerate(CUT_PARTS):
            mine = [p for p, w, q in zip(s.pieces, s.owner, s.option) if w == i and q == o]
            assert s.legal[i, o] == (parts <= t.dim // 4)
            if s.legal[i, o]:  # the option's pieces tile the table's columns
                assert len(mine) == parts and mine[0].start == 0 and mine[-1].stop == t.dim
                assert all(a.stop == b.start for a, b in zip(mine, mine[1:]))
            else:
                assert not mine
    assert [s.pieces[i] for i in s.whole] == [p for p in s.pieces if p.start == 0 and p.stop == task.tables[p.table].dim and s.option[s.pieces.index(p)] == 0]
    # an episode's active pieces are exactly the pieces of its options
    options = np.array([[o for o in np.flatnonzero(s.legal[i])][-1] for i in range(len(task.tables))])[None]
    task_of, prepared, pieces = s.pieces_task(s.active(options)[0])
    assert len(task_of.tables) == len(pieces) == sum(CUT_PARTS[o] for o in options[0])
    assert [t.dim for t in task_of.tables] == [p.width for p in pieces] and len(prepared.sizes) == len(pieces)


def test_offered_tables_alone_may_be_cut(pool):
    task = Task(pool[:20], 4, 10**12)
    offered = np.zeros(20, bool)
    offered[[3, 7]] = True
    s = cut_set(task, cut_model(), offered)
    assert set(np.flatnonzero(s.legal[:, 1:].any(1))) <= {3, 7}


def test_the_cut_net_chooses_legal_options_and_learns_through_its_log_probs(pool):
    model = cut_model()
    sets = [cut_set(Task(pool[:12], 4, 10**12), model), cut_set(Task(pool[40:45], 2, 10**12), model)]
    gen = torch.Generator().manual_seed(0)
    for greedy in (True, False):
        c = choose_cuts(model, sets, greedy, gen)
        for e, s in enumerate(sets):
            n = len(s.whole)
            assert s.legal[np.arange(n), c.options[e, :n]].all()
            assert (c.options[e, n:] == -1).all()
            assert c.decisions[e] == (s.legal.sum(1) > 1).sum()
    c.log_prob.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.cut.parameters())
    # an untrained net keeps most tables whole (CutNet.CUT_PRIOR)
    many = choose_cuts(model, [sets[0]] * 200, False, gen)
    assert (many.options[:, :12] == 0).mean() > 0.75
    # the planner's NumPy choices: argmax where greedy, the same legal options otherwise
    opts = plan_cuts(model, sets[0], np.array([True, False, False]), np.random.default_rng(0))
    assert (opts[0] == choose_cuts(model, [sets[0]], True).options[0, :12]).all()
    assert sets[0].legal[np.arange(12), opts].all()


def test_episodes_of_cuts_place_the_chosen_pieces_as_a_task_of_them_would(pool):
    """A batch of a cut set with an episode's pieces active plays as the task of those pieces alone
    (greedy), in torch and in the NumPy player."""
    model = cut_model(5)
    task = Task(pool[:25], 4, 3 * 10**9)
    s = cut_set(task, model)
    rng = np.random.default_rng(1)
    options = np.array([[rng.choice(np.flatnonzero(s.legal[i])) for i in range(25)] for _ in range(3)])
    active = s.active(options)
    player = FastPlayer(model.cost_net, model.policy, model.keep_room, model.comm)
    with torch.no_grad():
        together = rollout(model.cost_net, model.policy, EpisodeBatch.of([s.prepared] * 3, active), greedy=True, keep_room=True)
    fast, fstuck, fcosts, _ = player.play(s.prepared, np.ones(3, bool), None, active)
    for e in range(3):
        _, prepared, _ = s.pieces_task(active[e])
        with torch.no_grad():
            alone = rollout(model.cost_net, model.policy, EpisodeBatch.of([prepared]), greedy=True, keep_room=True)
        idx = np.flatnonzero(active[e])
        # the pieces of one cut are alike (the same table, the same width): which of two alike pieces
        # a device takes may differ with the tensor shapes' float sums, and the plan is the same
        keys = [(int(s.owner[i]), s.pieces[i].stop - s.pieces[i].start) for i in idx]
        assert by_device(together.placement[e, idx], keys) == by_device(alone.placement[0], keys)
        assert (together.placement[e, ~active[e]] == -1).all()
        assert torch.allclose(together.device_costs[e].sort(0).values, alone.device_costs[0].sort(0).values, atol=1e-4)
        assert bool(fstuck[e]) == bool(alone.stuck[0])
        assert by_device(fast[e, idx], keys) == by_device(alone.placement[0], keys)
        assert np.allclose(np.sort(fcosts[e], axis=0), np.sort(alone.device_costs[0].numpy(), axis=0), atol=1e-4)


def by_device(placement, keys) -> dict[int, list]:
    """Each device's pieces, as sorted keys, the devices relabelled in order of first use (`canonical`)."""
    out: dict[int, list] = {}
    for d, k in zip(canonical(placement), keys):
        out.setdefault(d, []).append(k)
    return {d: sorted(v) for d, v in out.items()}


def test_sampled_plans_with_cuts_are_plans_of_pieces_within_memory(pool):
    model = cut_model(2)
    with torch.no_grad():  # a net that cuts often, so the plans have pieces
        model.cut.net[-1].bias.copy_(torch.tensor([0.0, 2.0, 2.0]))
    tasks = [Task(pool[:20], 4, 2 * 10**9), Task(pool[30:60], 8, 10**12)]
    sets = [cut_set(t, model) for t in tasks]
    prepared = [prepare(t, "fixed", True) for t in tasks]
    got = sample_plans(model, tasks, prepared, sets, [0, 1, 1], True, torch.Generator().manual_seed(0))
    assert any(len(t.tables) > len(tasks[i].tables) for t, i in zip(got.tasks, [0, 1, 1]))
    for t, placement, i in zip(got.tasks, got.placements, [0, 1, 1]):
        used = np.zeros(t.devices, np.int64)
        np.add.at(used, placement, t.sizes())
        assert used.max() <= t.max_memory_bytes and (placement >= 0).all()
        # the pieces of each table add up to its columns
        for name in {x.name for x in tasks[i].tables}:
            assert sum(x.dim for x in t.tables if x.name.split("[")[0] == name) == next(x.dim for x in tasks[i].tables if x.name == name)


def test_training_with_cuts_saves_loads_and_resumes_exactly(pool, tmp_path):
    train_half, test_half = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 4, (8, 12), 4, 10**12, seed=2)
    cfg = small_config(iterations=2)
    assert cfg.cuts
    whole = train(cfg, tasks, SimBackend(), tmp_path / "a.pt", log=tmp_path / "a.jsonl", progress=False)
    train(small_config(iterations=2), tasks, SimBackend(), tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, stop_after=1)
    resumed = train(small_config(iterations=2), tasks, SimBackend(), tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, resume=True)
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    loaded = DreamShardModel.load(tmp_path / "a.pt")
    assert loaded.cut is not None
    for a, b in zip(whole.parameters(), loaded.parameters()):
        assert torch.equal(a, b)
    eval_tasks, placements = plan_placements(loaded, sample_tasks(test_half, 2, (8, 12), 4, 10**12, seed=3))
    assert all(len(p) == len(t.tables) for t, p in zip(eval_tasks, placements))


def test_a_model_without_a_cut_net_loads_and_trains_table_wise(pool, tmp_path):
    train_half, _ = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 3, (6, 8), 2, 10**12, seed=4)
    model = train(small_config(iterations=1, cuts=False), tasks, SimBackend(), tmp_path / "m.pt", progress=False)
    assert model.cut is None and DreamShardModel.load(tmp_path / "m.pt").cut is None
    assert "cut" not in model.state()


@pytest.fixture(scope="module")
def trained(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("cuts") / "m.pt"
    train_half, _ = split_pool(pool, 0)
    train(small_config(iterations=2), sample_tasks(train_half, 4, (10, 20), 4, 10**12, seed=5), SimBackend(), out, progress=False)
    return out


SOURCES = ("policy", "heuristic", "learned cuts", "cut ladder", "row ladder", "lookup", "a restart")  # the last two: starts of the annealing only


def test_the_search_returns_the_cheapest_candidate_with_its_source(pool, trained):
    _, test_half = split_pool(pool, 0)
    sim = SimBackend()
    for task in sample_tasks(test_half, 4, (15, 25), 4, 3 * 10**9, seed=6):
        table_wise = get_planner("dreamshard", model=str(trained), split=False).plan(task)
        plan = get_planner("dreamshard", model=str(trained)).plan(task)
        plan.check()
        source = plan.predicted["candidate"]
        assert source.split(" + ")[0].startswith(SOURCES) and source.count(" + descent") <= 1
        assert "annealing" not in source or source.endswith(" + annealing on the cost net")
        assert not source.startswith(("lookup", "a restart")) or source.endswith(" + annealing on the cost net")
        # never predicted dearer than the table-wise plan it started from
        assert plan.predicted["max_device_ms"] <= table_wise.predicted["max_device_ms"] * (1 + 1e-4)
        sim.evaluate_plan(plan)
        # a time budget runs more rounds of the same search: a valid plan predicted no dearer
        longer = get_planner("dreamshard", model=str(trained), budget_ms=50).plan(task)
        longer.check()
        assert longer.predicted["max_device_ms"] <= plan.predicted["max_device_ms"] * (1 + 1e-4)


def test_a_time_budget_buys_rounds_of_sampled_cuts_and_annealing_from_the_cheapest(pool, trained, monkeypatch):
    """`budget_ms`: after the one round of the default, rounds of the annealing (another seed each,
    from the cheapest so far) while time is left — on a clock that moves 1 ms a look, so the rounds
    do not depend on this machine's speed; each round's plan is kept only where it is cheaper."""
    import dreamshard.planners.dreamshard as ds

    _, test_half = split_pool(pool, 0)
    plain = get_planner("dreamshard", model=str(trained))
    # a task whose plan has no row pieces (which the annealing does not move)
    task, default = next((t, p) for t in sample_tasks(test_half, 8, (20, 20), 4, 3 * 10**9, seed=6) for p in [plain.plan(t)] if not p.has_row_shards())
    clock = iter(range(10**9))
    monkeypatch.setattr(ds.time, "perf_counter", lambda: next(clock) / 1e3)
    rounds, real = [], ds.DreamShardPlanner._anneal

    def anneal(self, scorer, best, rnd=0):
        found = real(self, scorer, best, rnd)
        rounds.append((rnd, best.cost, found.cost))
        return found

    monkeypatch.setattr(ds.DreamShardPlanner, "_anneal", anneal)
    longer = get_planner("dreamshard", model=str(trained), budget_ms=40).plan(task)
    longer.check()
    assert [r for r, _, _ in rounds[:3]] == [0, 1, 2] and len(rounds) > 3
    assert all(after <= before for _, before, after in rounds)
    assert all(rounds[k + 1][1] == rounds[k][2] for k in range(len(rounds) - 1))  # each from the cheapest so far
    assert longer.predicted["max_device_ms"] <= default.predicted["max_device_ms"] * (1 + 1e-4)
    assert longer.predicted["candidate"].count(ds.ANNEALED) <= 1


def test_the_annealing_stage_prices_as_the_scorer_and_only_lowers_the_prediction(pool, trained):
    """The last stage anneals on the cost net: its pricer's per-device totals are the scorer's
    (`PieceScorer.device_costs`) for the same placements, and it replaces the search's plan only
    by one the net prices lower, within memory."""
    from dreamshard.planners import splits
    from dreamshard.planners.dreamshard import NetPricer
    from dreamshard.planners.scoring import PieceScorer

    _, test_half = split_pool(pool, 0)
    planner = get_planner("dreamshard", model=str(trained))
    checked = 0
    for task in sample_tasks(test_half, 3, (15, 25), 4, 3 * 10**9, seed=8):
        without = get_planner("dreamshard", model=str(trained), anneal=0).plan(task)
        plan = planner.plan(task)
        plan.check()
        assert plan.predicted["max_device_ms"] <= without.predicted["max_device_ms"] * (1 + 1e-6)
        # by default from the search's plan alone: its plan is that plan's, annealed or as it was;
        # with the lookup plans and a restart as starts too, no dearer than without the stage
        assert plan.predicted["candidate"] in (without.predicted["candidate"], without.predicted["candidate"] + " + annealing on the cost net")
        more = get_planner("dreamshard", model=str(trained), anneal_lookup=True).plan(task)
        more.check()
        assert more.predicted["max_device_ms"] <= without.predicted["max_device_ms"] * (1 + 1e-6)
        assert more.predicted["candidate"].split(" + ")[0].startswith(SOURCES)
        pieces, devices = splits.unplaced(plan)
        if any(p.is_row_shard for p in pieces):
            continue
        scorer = PieceScorer(planner.model, task)
        pricer = NetPricer(scorer, 40)
        rng = np.random.default_rng(0)
        keys = [(p.table, p.start, p.stop) for p in pieces]
        # placements far from each other, then batches of neighbours (a piece or two moved) of a
        # walk away from the first: priced from a base placement plus the moved pieces' rows
        batches = [np.stack([np.array(devices)] + [rng.integers(task.devices, size=len(pieces)) for _ in range(3)])]
        walk = np.array(devices)
        for _ in range(6):
            near = np.repeat(walk[None], 6, axis=0)
            for row in near:
                moved = rng.choice(len(pieces), rng.integers(1, 3), replace=False)
                row[moved] = rng.integers(task.devices, size=len(moved))
            batches.append(near)
            walk = near[-1]
        for placements in batches:
            got = pricer.totals(keys, placements)
            for row, want in zip(placements, got):
                expect = scorer.device_costs(scorer.state(pieces, row)).sum(-1) * float(planner.model.cost_net.scale)
                assert want == pytest.approx(expect, rel=1e-5)
        assert pricer.used == 40
        checked += 1
    assert checked >= 1
    with pytest.raises(ValueError, match="anneal"):
        get_planner("dreamshard", anneal=-1)


def test_annealing_with_row_pieces_keeps_them_and_prices_them_in_every_placement(pool, trained):
    """`anneal_rows`: a plan with row pieces is annealed too, its row pieces where they were; the
    pricer adds their state to every placement of the others (the scorer's totals of the whole
    plan) and their bytes to their devices' (so a move never overfills one)."""
    from dreamshard.planners import splits
    from dreamshard.planners.dreamshard import NetPricer
    from dreamshard.planners.oracle import State
    from dreamshard.planners.scoring import PieceScorer

    _, test_half = split_pool(pool, 0)
    planner = get_planner("dreamshard", model=str(trained))
    checked = annealed = 0
    for task in sample_tasks(test_half, 8, (8, 12), 8, 3 * 10**9, seed=8):  # few tables a device: row splits pay
        plan = planner.plan(task)
        if not plan.has_row_shards():
            continue
        rows = get_planner("dreamshard", model=str(trained), anneal_rows=True).plan(task)
        rows.check()  # within memory, every table tiled once
        assert rows.predicted["max_device_ms"] <= plan.predicted["max_device_ms"] * (1 + 1e-6)
        kept = {(s.table, s.row_start, s.row_stop, s.device) for s in rows.shards if s.is_row_shard}
        if rows.predicted["candidate"].endswith(" + annealing on the cost net"):
            assert kept == {(s.table, s.row_start, s.row_stop, s.device) for s in plan.shards if s.is_row_shard}
            annealed += 1
        pieces, devices = splits.unplaced(plan)
        fixed = [i for i, p in enumerate(pieces) if p.is_row_shard]
        moving = [i for i in range(len(pieces)) if i not in fixed]
        scorer = PieceScorer(planner.model, task)
        pricer = NetPricer(scorer, 8, ([pieces[i] for i in fixed], [devices[i] for i in fixed]))
        rng = np.random.default_rng(0)
        keys = [(pieces[i].table, pieces[i].start, pieces[i].stop) for i in moving]
        placements = np.stack([np.array([devices[i] for i in moving])] + [rng.integers(task.devices, size=len(moving)) for _ in range(3)])
        for row, want in zip(placements, pricer.totals(keys, placements)):
            whole = np.array(devices)
            whole[moving] = row
            expect = scorer.device_costs(scorer.state(pieces, whole)).sum(-1) * float(planner.model.cost_net.scale)
            assert want == pytest.approx(expect, rel=1e-5)
        state = State(keys, placements[0], pricer, pricer.price(keys, placements[:1])[0])
        sizes = splits.sizes(task, pieces)
        assert state.used.tolist() == np.bincount(devices, weights=sizes, minlength=task.devices).astype(np.int64).tolist()
        checked += 1
    assert checked >= 1 and annealed >= 1


def test_budget_ms_is_checked():
    from dreamshard.validation import OptionError

    with pytest.raises((ValueError, OptionError), match="budget_ms"):
        get_planner("dreamshard", budget_ms=0)


def test_verify_keeps_the_plan_the_backend_measures_fastest_of_its_variants(pool, trained):
    """`verify=K`: K variants of the plan (the planner itself, the search on the other price of the
    cut penalty, the last stage also from the lookup plans, then the next seed), each distinct one
    priced by the backend (the simulator here, a GPU kernel in use); the plan kept is the cheapest
    by it and is that variant's plan; the measurements are in its `predicted`. A backend is required."""
    from dreamshard.bench import plan_hash
    from dreamshard.costs.sim import SimBackend
    from dreamshard.planners.dreamshard import VERIFY_CUT_PENALTY

    sim = SimBackend()
    _, test_half = split_pool(pool, 0)
    task = sample_tasks(test_half, 1, (20, 20), 4, 3 * 10**9, seed=8)[0]
    plan = get_planner("dreamshard", model=str(trained), seed=5, verify=4, backend=sim).plan(task)
    plan.check()
    variants = [(5, False, 0.0), (5, False, VERIFY_CUT_PENALTY), (5, True, 0.0), (6, False, 0.0)]
    alone = {v: get_planner("dreamshard", model=str(trained), seed=v[0], anneal_lookup=v[1], cut_penalty=v[2]).plan(task) for v in variants}
    got = plan.predicted["verified"]
    key = lambda p: (p["seed"], p["anneal_lookup"], p["cut_penalty"])  # noqa: E731
    distinct = [v for i, v in enumerate(variants) if plan_hash(alone[v]) not in {plan_hash(alone[w]) for w in variants[:i]}]
    assert [key(p) for p in got["plans"]] == distinct
    for p in got["plans"]:
        assert p["measured_ms"] == pytest.approx(sim.evaluate_plan(alone[key(p)]).overall_ms)
    assert plan_hash(plan) == plan_hash(alone[key(got)])
    assert sim.evaluate_plan(plan).overall_ms == pytest.approx(min(p["measured_ms"] for p in got["plans"]))
    with pytest.raises(ValueError, match="verify needs a backend"):
        get_planner("dreamshard", verify=2)
    with pytest.raises(ValueError, match="verify"):
        get_planner("dreamshard", verify=-1, backend=sim)


def test_the_cut_penalty_raises_a_plans_price_per_table_cut_up_to_its_cap(pool, trained):
    """`cut_penalty`: the search's price of a plan is the net's times 1 + penalty × the tables it
    cuts into columns (at most CUT_PENALTY_CAP counted), the same in the scorer and in the last
    stage's pricer; a plan cutting no table is priced as without it, and 0 plans as before."""
    from dreamshard.planners import splits
    from dreamshard.planners.dreamshard import NetPricer
    from dreamshard.planners.scoring import CUT_PENALTY_CAP, PieceScorer

    _, test_half = split_pool(pool, 0)
    task = sample_tasks(test_half, 1, (20, 20), 4, 3 * 10**9, seed=6)[0]
    model = get_planner("dreamshard", model=str(trained)).model
    plain, dear = PieceScorer(model, task), PieceScorer(model, task, cut_penalty=0.02)
    whole = splits.whole(task)
    wide = [i for i, w in enumerate(whole) if w.width >= 12]  # tables that cut into thirds
    assert len(wide) >= CUT_PENALTY_CAP + 2
    rng = np.random.default_rng(1)
    for n in (0, 1, 3, CUT_PENALTY_CAP + 2):
        pieces = [p for i, w in enumerate(whole) for p in (splits.cut(w, 2 + i % 2) if i in wide[:n] else [w])]  # halves and thirds
        devices = rng.integers(task.devices, size=len(pieces))
        assert plain.cuts(plain.state(pieces, devices)) == pytest.approx(n)
        factor = 1 + 0.02 * min(n, CUT_PENALTY_CAP)
        assert dear.score(dear.state(pieces, devices)) == pytest.approx(plain.score(plain.state(pieces, devices)) * factor, rel=1e-6)
        keys = [(p.table, p.start, p.stop) for p in pieces]
        got = NetPricer(dear, 1).totals(keys, devices[None])[0]
        assert got == pytest.approx(plain.device_costs(plain.state(pieces, devices)).sum(-1) * float(model.cost_net.scale) * factor, rel=1e-5)
    a = get_planner("dreamshard", model=str(trained)).plan(task)
    assert get_planner("dreamshard", model=str(trained), cut_penalty=0.0).plan(task).layout() == a.layout()
    get_planner("dreamshard", model=str(trained), cut_penalty=0.05).plan(task).check()
    for bad in (-0.1, 1.0, "0.1", True):
        with pytest.raises(ValueError, match="cut_penalty"):
            get_planner("dreamshard", cut_penalty=bad)
