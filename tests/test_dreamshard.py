"""DreamShard: the nets' invariances, the batched MDP, checkpoints, and a short real training run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dreamshard.costs.sim import SimBackend
from dreamshard.costs.terms import SHARED_WIDTH, shared_terms
from dreamshard.learned.dreamshard import Config, get_config, train
from dreamshard.learned.mdp import EpisodeBatch, FastPlayer, predict, prepare, rollout
from dreamshard.learned.nets import CostNet, DreamShardModel, PolicyNet, plan_cost
from dreamshard.planners import get_planner
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tables import NUM_FEATURES, TableSpec
from dreamshard.tasks import Task, Workload, sample_tasks, save_tasks, split_pool
from dreamshard.validation import ModelError

HEURISTICS = ["random", "size", "dim", "lookup", "size_lookup"]


def canonical(placement) -> list[int]:
    """Devices relabelled in order of first use: empty devices tie exactly, and which of them a
    float argmax picks may differ with the tensor shapes; the placements are the same up to that."""
    names: dict[int, int] = {}
    return [names.setdefault(int(d), len(names)) if d >= 0 else -1 for d in placement]


@pytest.fixture(scope="module")
def pool():
    return synth_pool(PoolConfig(tables=200, seed=0))


def small_config(**kw) -> Config:
    base = dict(iterations=3, measurements_per_iteration=3, cost_steps=10, cost_batch=8, rl_batches=2, rl_tasks_per_batch=2, rl_episodes_per_task=3, best_of=4)
    return get_config("default", **{**base, **kw})


# --------------------------------------------------------------------------------------------
# nets
# --------------------------------------------------------------------------------------------


def test_cost_net_is_invariant_to_table_order_and_device_labels():
    torch.manual_seed(0)
    net = CostNet()
    E, T, D = 3, 11, 4
    x = torch.rand(E, T, NUM_FEATURES)
    placement = torch.randint(0, D, (E, T))
    mask = torch.ones(E, D, dtype=torch.bool)
    costs, overall = net(x, placement, mask)
    perm = torch.randperm(T)
    costs_t, overall_t = net(x[:, perm], placement[:, perm], mask)
    assert torch.allclose(costs, costs_t, atol=1e-5) and torch.allclose(overall, overall_t, atol=1e-5)
    relabel = torch.randperm(D)  # device d becomes relabel[d]
    costs_d, overall_d = net(x, relabel[placement], mask)
    assert torch.allclose(costs_d[:, relabel], costs, atol=1e-5) and torch.allclose(overall_d, overall, atol=1e-5)


@pytest.mark.parametrize("T,D", [(1, 1), (5, 7), (150, 64)])
def test_nets_take_any_table_and_device_count_and_ignore_padding(T, D):
    torch.manual_seed(1)
    net, policy = CostNet(), PolicyNet(sees_table=True)
    x = torch.rand(1, T, NUM_FEATURES)
    placement = torch.randint(0, D, (1, T))
    costs, overall = net(x, placement, torch.ones(1, D, dtype=torch.bool))
    assert costs.shape == (1, D, 3) and overall.shape == (1,) and torch.isfinite(costs).all()
    # the same placement padded with 3 phantom tables (placement -1) and 2 phantom devices
    xp = torch.cat([x, torch.rand(1, 3, NUM_FEATURES)], 1)
    pp = torch.cat([placement, torch.full((1, 3), -1)], 1)
    mp = torch.cat([torch.ones(1, D, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool)], 1)
    costs_p, overall_p = net(xp, pp, mp)
    assert torch.allclose(costs_p[:, :D], costs, atol=1e-5) and torch.allclose(overall_p, overall, atol=1e-5)
    z = policy.encode(x).sum(1, keepdim=True).expand(1, D, -1)
    logits = policy.logits(z, costs, costs, policy.encode(x)[:, 0])
    assert logits.shape == (1, D)


@pytest.mark.parametrize("sees_table", [False, True])
def test_policy_logits_follow_the_devices(sees_table):
    torch.manual_seed(2)
    policy = PolicyNet(sees_table)
    z, c, a, t = torch.rand(2, 6, 32), torch.rand(2, 6, 3), torch.rand(2, 6, 3), torch.rand(2, 32)
    perm = torch.randperm(6)
    logits = policy.logits(z, c, a, t)
    assert torch.allclose(policy.logits(z[:, perm], c[:, perm], a[:, perm], t), logits[:, perm], atol=1e-6)


def test_plan_cost_scores():
    dev = torch.tensor([[[1.0, 2.0, 0.5], [0.1, 0.1, 0.1]]])
    assert float(plan_cost(dev, torch.tensor([9.0]), "max_device")[0]) == pytest.approx(3.5)
    assert float(plan_cost(dev, torch.tensor([9.0]), "overall")[0]) == 9.0
    assert float(plan_cost(dev.numpy(), np.array([9.0]), "max_device")[0]) == pytest.approx(3.5)


# --------------------------------------------------------------------------------------------
# the estimated MDP
# --------------------------------------------------------------------------------------------


@st.composite
def small_tasks(draw):
    n = draw(st.integers(1, 9))
    tables = [TableSpec(f"t{i}", draw(st.integers(1, 4000)), draw(st.sampled_from([4, 16, 64])), draw(st.floats(0, 30))) for i in range(n)]
    devices = draw(st.integers(1, 4))
    total = sum(t.bytes() for t in tables)
    cap = draw(st.integers(max(max(t.bytes() for t in tables), total // devices), total + 1))
    return Task(tables, devices, cap)


@settings(max_examples=40, deadline=None)
@given(st.lists(small_tasks(), min_size=1, max_size=4), st.integers(0, 2**16), st.booleans())
def test_mdp_never_exceeds_memory(tasks, seed, keep_room):
    torch.manual_seed(3)
    model = DreamShardModel.create(True, "fixed")
    items = [prepare(t, "fixed") for t in tasks for _ in range(5)]
    with torch.no_grad():
        ro = rollout(model.cost_net, model.policy, EpisodeBatch.of(items), generator=torch.Generator().manual_seed(seed), keep_room=keep_room)
    for e, task in enumerate(t for t in tasks for _ in range(5)):
        placement = ro.placement[e, : len(task.tables)].numpy()
        used = np.zeros(task.devices, np.int64)
        for table, d in zip(task.tables, placement):
            if d >= 0:
                assert d < task.devices
                used[d] += table.bytes()
        assert (used <= task.max_memory_bytes).all()
        assert bool(ro.stuck[e]) == bool((placement < 0).any())  # complete unless it ran out of memory
        assert (ro.placement[e, len(task.tables) :] == -1).all()  # padding tables never placed


def test_keep_room_does_not_strand_the_big_table():
    # 2 devices of 3200 B; four 800 B tables and one of 2400 B: fits only if the small ones
    # leave 2400 B free on one device. Sampled episodes strand it without the look-ahead.
    tables = [TableSpec(f"s{i}", 100, 4, 1.0 + i) for i in range(4)] + [TableSpec("big", 300, 4, 0.5)]
    task = Task(tables, 2, 3200)
    torch.manual_seed(6)
    model = DreamShardModel.create(True, "fixed")
    batch = EpisodeBatch.of([prepare(task, "fixed")] * 200)
    with torch.no_grad():
        free = rollout(model.cost_net, model.policy, batch, generator=torch.Generator().manual_seed(0))
        safe = rollout(model.cost_net, model.policy, batch, generator=torch.Generator().manual_seed(0), keep_room=True)
    assert free.stuck.any() and not safe.stuck.any()


def test_batched_episodes_equal_one_at_a_time(pool):
    torch.manual_seed(4)
    model = DreamShardModel.create(True, "fixed")
    tasks = [Task(pool[:7], 3, 10**12), Task(pool[10:40], 8, 10**12), Task(pool[50:52], 1, 10**12), Task(pool[60:75], 5, 10**12)]
    items = [prepare(t, "fixed") for t in tasks]
    with torch.no_grad():
        together = rollout(model.cost_net, model.policy, EpisodeBatch.of(items), greedy=True)
        for e, p in enumerate(items):
            alone = rollout(model.cost_net, model.policy, EpisodeBatch.of([p]), greedy=True)
            T, D = len(p.sizes), p.devices
            assert canonical(together.placement[e, :T]) == canonical(alone.placement[0])
            assert torch.allclose(together.log_prob[e].sum(), alone.log_prob[0].sum(), atol=1e-5)
            assert torch.allclose(together.overall[e], alone.overall[0], atol=1e-5)
            assert torch.allclose(together.device_costs[e, :D].sort(0).values, alone.device_costs[0].sort(0).values, atol=1e-5)


@pytest.mark.parametrize("sees_table,keep_room", [(False, False), (True, False), (True, True)])
def test_fast_player_plays_the_same_episodes(pool, sees_table, keep_room):
    torch.manual_seed(5)
    model = DreamShardModel.create(sees_table, "fixed")
    player = FastPlayer(model.cost_net, model.policy, keep_room)
    for task in (Task(pool[:40], 8, 10**12), Task(pool[100:103], 2, 10**12), Task(pool[40:90], 4, 2 * 10**9), Task(pool[90:120], 3, 10**9)):
        p = prepare(task, "fixed")
        with torch.no_grad():
            ro = rollout(model.cost_net, model.policy, EpisodeBatch.of([p]), greedy=True, keep_room=keep_room)
        placement, stuck, costs, overall = player.play(p, np.array([True]))
        assert bool(stuck[0]) == bool(ro.stuck[0])
        assert canonical(placement[0]) == canonical(ro.placement[0])
        assert np.allclose(np.sort(costs[0], axis=0), np.sort(ro.device_costs[0].numpy(), axis=0), atol=1e-4)
        assert overall[0] == pytest.approx(float(ro.overall[0]), abs=1e-4)


# --------------------------------------------------------------------------------------------
# training loop: checkpoints and resume
# --------------------------------------------------------------------------------------------


def test_resume_after_a_kill_continues_exactly(pool, tmp_path):
    train_half, _ = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 6, (8, 14), 3, 10**12, seed=0)
    sim, cfg = SimBackend(), small_config(iterations=3)
    straight = train(cfg, tasks, sim, tmp_path / "a.pt", log=tmp_path / "a.jsonl", progress=False)
    # "killed" after 1 iteration, then after 1 more, then finished
    train(cfg, tasks, sim, tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, stop_after=1)
    assert not (tmp_path / "b.pt").exists() and (tmp_path / "b.pt.ckpt").exists()
    train(cfg, tasks, sim, tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, resume=True, stop_after=1)
    resumed = train(cfg, tasks, sim, tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, resume=True)
    for a, b in ((straight.cost_net, resumed.cost_net), (straight.policy, resumed.policy)):
        for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(va, vb), k
    strip = lambda path: [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in path.read_text().splitlines()]
    assert strip(tmp_path / "a.jsonl") == strip(tmp_path / "b.jsonl")
    assert [r["iteration"] for r in strip(tmp_path / "b.jsonl")] == [0, 1, 2]
    loaded = DreamShardModel.load(tmp_path / "b.pt")
    assert loaded.meta["measurements"] == 9 and (tmp_path / "b.pt").stat().st_size < 2_000_000
    with pytest.raises(ValueError, match="options differ"):
        train(small_config(iterations=4, lr=1e-3), tasks, sim, tmp_path / "b.pt", progress=False, resume=True)
    # a checkpoint written before an option existed resumes where the option has its default, not otherwise
    ck = torch.load(tmp_path / "b.pt.ckpt", weights_only=False)
    del ck["config"]["search_rank"]
    torch.save(ck, tmp_path / "b.pt.ckpt")
    assert train(cfg, tasks, sim, tmp_path / "b.pt", progress=False, resume=True).meta["measurements"] == 9
    with pytest.raises(ValueError, match=r"options differ from the checkpoint's \(.*search_rank"):
        train(dataclasses.replace(cfg, prior_plans=2, search_plans=2, search_rank=1.0), tasks, sim, tmp_path / "b.pt", progress=False, resume=True, prior=sim, search=lambda *a: [])


class CountingBackend(SimBackend):
    """The default simulator, counting the plans it prices."""

    def __init__(self, calibration=None):
        super().__init__(calibration)
        self.plans = 0

    def evaluate(self, shards, workload=Workload()):
        self.plans += 1
        return super().evaluate(shards, workload)


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_simulator_prior_fits_the_cost_net_before_any_measurement_and_costs_no_budget(pool, tmp_path):
    """The prior's plans are priced by the prior backend only; the budget counts the real ones;
    the cost net predicts the first real plans (held-out: not fitted on yet) far better with it."""
    train_half, _ = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 6, (8, 14), 3, 10**12, seed=0)
    cfg = small_config(iterations=2, measurements_per_iteration=4)
    first_error = {}
    for plans in (0, 300):
        real, prior = CountingBackend(), CountingBackend()
        run = small_config(iterations=2, measurements_per_iteration=4, prior_plans=plans, prior_epochs=11)
        model = train(run, tasks, real, tmp_path / f"m{plans}.pt", log=tmp_path / f"m{plans}.jsonl", progress=False, prior=prior if plans else None)
        rows = [json.loads(line) for line in (tmp_path / f"m{plans}.jsonl").read_text().splitlines()]
        assert real.plans == cfg.total_budget() == model.meta["measurements"] == rows[-1]["measurements"]
        assert prior.plans == plans and rows[0].get("prior/plans", 0) == plans and "prior/plans" not in rows[1]
        first_error[plans] = rows[0]["cost/mape_overall"]
    assert model.meta["prior_backend"] == SimBackend().name
    assert first_error[300] < 0.15 < first_error[0], first_error


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_resume_with_a_prior_continues_exactly(pool, tmp_path):
    train_half, _ = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 6, (8, 14), 3, 10**12, seed=0)
    sim, cfg = SimBackend(), small_config(iterations=3, prior_plans=40, prior_epochs=6, prior_share=0.5)
    prior = SimBackend("dreamshard/data/calibrations/cpu_fbgemm.json")  # another cost surface than the backend's
    straight = train(cfg, tasks, sim, tmp_path / "a.pt", log=tmp_path / "a.jsonl", progress=False, prior=prior)
    train(cfg, tasks, sim, tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, stop_after=1, prior=prior)
    ck = torch.load(tmp_path / "b.pt.ckpt", weights_only=False)
    # kept: one feature array per task of pieces (the learned cuts give a plan its own pieces), shared by its plans
    assert len(ck["prior_buffer"]["x_index"]) == 40 and len(ck["prior_buffer"]["x"]) <= 40
    with pytest.raises(ValueError, match="no prior backend prices them"):
        train(cfg, tasks, sim, tmp_path / "b.pt", progress=False, resume=True)  # a prior needs its backend (a learned module imports none)
    with pytest.raises(ValueError, match="prior is simulated"):
        train(cfg, tasks, sim, tmp_path / "b.pt", progress=False, resume=True, prior=SimBackend())  # another simulator than the checkpoint's
    resumed = train(cfg, tasks, sim, tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, resume=True, prior=prior)
    for a, b in ((straight.cost_net, resumed.cost_net), (straight.policy, resumed.policy)):
        for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(va, vb), k
    strip = lambda path: [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "prior/seconds")} for line in path.read_text().splitlines()]
    assert strip(tmp_path / "a.jsonl") == strip(tmp_path / "b.jsonl")
    # dropped once real plans exist (share 0): nothing of the prior's plans is checkpointed
    train(small_config(iterations=2, prior_plans=40, prior_epochs=6, prior_share=0.0), tasks, sim, tmp_path / "c.pt", progress=False, stop_after=1, prior=prior)
    assert torch.load(tmp_path / "c.pt.ckpt", weights_only=False)["prior_buffer"]["x_index"] == []


def test_prior_options_are_checked(pool, tmp_path):
    for bad, msg in ((dict(prior_plans=-1), "prior_plans must be >= 0"), (dict(prior_share=1.0), "prior_share must be in"), (dict(prior_epochs=-5), "prior_epochs")):
        with pytest.raises(ValueError, match=msg) as e:
            small_config(**bad)
        assert "\n" not in str(e.value)
    tasks = sample_tasks(split_pool(pool, 0)[0], 2, (4, 6), 2, 10**12, seed=0)
    with pytest.raises(ValueError, match="prior_plans is 0"):
        train(small_config(), tasks, SimBackend(), tmp_path / "m.pt", progress=False, prior=SimBackend())


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_search_plans_refine_the_cost_net_after_training_and_a_cut_refinement_resumes(pool, tmp_path):
    """`search_plans`: plans around the planner's search, priced by the prior only (the budget
    counts the real plans), then more cost-net steps; a run cut during them (here: the search
    fails) keeps its iterations, and resuming does the refinement alone."""
    from dreamshard.planners.dreamshard import DreamShardPlanner

    tasks = sample_tasks(split_pool(pool, 0)[0], 4, (8, 14), 3, 10**12, seed=0)
    cfg = small_config(iterations=2, prior_plans=20, prior_epochs=2, search_plans=24, search_steps=5, search_rank=1.0)
    real, prior = CountingBackend(), CountingBackend()
    planner = DreamShardPlanner.fit(tasks, real, tmp_path / "m.pt", cfg, progress=False, prior=prior)
    assert real.plans == cfg.total_budget() == planner.model.meta["measurements"]
    assert prior.plans == 20 + planner.model.meta["search"]["search/plans"] and planner.model.meta["search"]["search/plans"] == 24
    assert DreamShardModel.load(tmp_path / "m.pt").meta["search"] == planner.model.meta["search"]
    assert np.isfinite(planner.model.meta["search"]["search/rank_loss"])
    # `search_measured`: pairs near the search's plan measured by the real backend (beyond the
    # budget; the model's meta counts them), the prior pricing the same as without
    near_real, near_prior = CountingBackend(), CountingBackend()
    near = DreamShardPlanner.fit(tasks, near_real, tmp_path / "n.pt", dataclasses.replace(cfg, search_measured=4), progress=False, prior=near_prior)
    measured = near.model.meta["search"]["search/measured"]
    assert measured in (2, 4) and near_real.plans == cfg.total_budget() + measured == near.model.meta["measurements"]
    assert near_prior.plans == prior.plans
    unrefined = train(small_config(iterations=2, prior_plans=20, prior_epochs=2), tasks, CountingBackend(), tmp_path / "u.pt", progress=False, prior=CountingBackend())
    assert not torch.equal(unrefined.cost_net.heads[0][0].weight, planner.model.cost_net.heads[0][0].weight)
    for k, v in unrefined.policy.state_dict().items():  # the policy is not touched
        assert torch.equal(v, planner.model.policy.state_dict()[k]), k

    def broken(model, task, n, rng):
        raise KeyboardInterrupt  # the run killed while it plans the search's plans

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tasks, SimBackend(), tmp_path / "k.pt", progress=False, prior=SimBackend(), search=broken)
    assert torch.load(tmp_path / "k.pt.ckpt", weights_only=False)["iteration"] == 2  # the iterations are kept
    on_one = lambda model, task, n, rng: [(task, np.zeros(len(task.tables), np.int64))] * n  # every table on device 0
    resumed = train(cfg, tasks, SimBackend(), tmp_path / "k.pt", progress=False, resume=True, prior=SimBackend(), search=on_one)
    assert resumed.meta["search"]["search/plans"] == 24 and DreamShardModel.load(tmp_path / "k.pt").meta["search"] == resumed.meta["search"]
    again = train(cfg, tasks, SimBackend(), tmp_path / "k.pt", progress=False, resume=True, prior=SimBackend(), search=broken)  # finished: not again
    assert again.meta["search"] == resumed.meta["search"]


def test_rank_loss_is_zero_for_an_error_of_one_share_per_task_and_grows_with_its_spread():
    """`search_rank`'s term: the net may be off by one share on every plan of a task; a plan it
    prices off by another share costs, and groups are apart (task 1's share is not task 0's)."""
    from dreamshard.learned.dreamshard import group_draw, rank_loss

    rng = np.random.default_rng(0)
    target = torch.from_numpy(rng.uniform(0.5, 2.0, (6, 3, 3)).astype(np.float32))
    mask = torch.tensor([[True, True, True]] * 3 + [[True, True, False]] * 3)
    target[~mask] = 0.0
    b = {"device_costs": target, "device_mask": mask}
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    share = torch.tensor([1.1, 1.1, 1.1, 0.8, 0.8, 0.8]).view(6, 1, 1)
    pred = target.clone()
    pred[..., :2] *= share  # the compute off by one share per task; the exchange is the target's
    steps = (target.sum(-1) + torch.where(mask, 0.0, -torch.inf)).amax(-1)
    pred_steps = (pred.sum(-1) + torch.where(mask, 0.0, -torch.inf)).amax(-1)
    # a constant share of compute is not a constant share of the step: the loss is its spread
    err = (pred_steps - steps) / steps
    want = sum(((err[groups == g] - err[groups == g].mean()) ** 2).sum() for g in (0, 1)) / 4
    assert torch.isclose(rank_loss(pred, b, torch.tensor(1.0), groups), want)
    no_comm = {"device_costs": target * torch.tensor([1.0, 1.0, 0.0]), "device_mask": mask}
    whole = no_comm["device_costs"] * share  # the step off by one share per task: nothing to order differently
    assert rank_loss(whole, no_comm, torch.tensor(1.0), groups).item() < 1e-12
    whole[1] *= 1.2
    assert rank_loss(whole, no_comm, torch.tensor(1.0), groups).item() > 1e-3
    picked = group_draw(np.array([0] * 5 + [1] * 7), 10, rng)
    task_of = np.array([0] * 5 + [1] * 7)[picked]
    assert len(picked) == 10 and all(len(set(task_of[k:k + 4])) == 1 for k in (0, 4, 8))


def test_search_plans_options_are_checked(pool, tmp_path):
    with pytest.raises(ValueError, match="search_plans are priced by the prior"):
        small_config(search_plans=10)
    with pytest.raises(ValueError, match="search_rank weighs differences"):
        small_config(prior_plans=5, search_rank=1.0)
    with pytest.raises(ValueError, match="search_measured measures plans of the refinement"):
        small_config(prior_plans=5, search_measured=2)
    with pytest.raises(ValueError, match="give an even number, not 3"):
        small_config(prior_plans=5, search_plans=10, search_measured=3)
    with pytest.raises(ValueError, match="search_steps must be >= 0"):
        small_config(prior_plans=5, search_steps=-1)
    tasks = sample_tasks(split_pool(pool, 0)[0], 2, (4, 6), 2, 10**12, seed=0)
    with pytest.raises(ValueError, match="search_plans needs the planner's search"):
        train(small_config(prior_plans=5, search_plans=10), tasks, SimBackend(), tmp_path / "m.pt", progress=False, prior=SimBackend())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), changes=st.integers(0, 12))
def test_perturbed_plans_tile_every_table_within_memory(seed, changes):
    """The search's perturbed plans: every table's columns tiled once, row pieces where they
    were, every device within memory."""
    from dreamshard.planners import splits
    from dreamshard.planners.dreamshard import perturbed

    rng = np.random.default_rng(seed)
    task = sample_tasks(synth_pool(PoolConfig(tables=40, seed=1)), 1, (6, 10), 3, 3 * 10**9, seed=seed % 1000)[0]
    plan = get_planner("lookup", split=True).plan(task)
    rows = splits.row_split(task, 0, 2)
    base = [s for s in plan.shards if s.table != 0] + [replace_device(p, d) for p, d in zip(rows, (0, 1))] if rows else list(plan.shards)
    before = np.zeros(task.devices)
    np.add.at(before, [s.device for s in base], splits.sizes(task, base))
    assume(before.max() <= task.max_memory_bytes)
    pieces, devices = perturbed(task, [replace_device(s, -1) for s in base], [s.device for s in base], changes, rng)
    for t in range(len(task.tables)):
        mine = sorted((p.start, p.stop) for p in pieces if p.table == t and not p.is_row_shard)
        if mine:
            assert mine[0][0] == 0 and mine[-1][1] == task.tables[t].dim and all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
    assert [(p, d) for p, d in zip(pieces, devices) if p.is_row_shard] == [(replace_device(s, -1), s.device) for s in base if s.is_row_shard]
    used = np.zeros(task.devices)
    np.add.at(used, devices, splits.sizes(task, pieces))
    assert used.max() <= task.max_memory_bytes


def replace_device(shard, device):
    from dataclasses import replace

    return replace(shard, device=device)


def test_cost_loss_ignores_unmeasured_targets():
    """A shard timed alone (calibration records) has no all-to-all and no plan cost: NaN targets
    add nothing to the loss, and the comm and overall heads get no gradient from it."""
    from dreamshard.learned.dreamshard import cost_loss
    from dreamshard.learned.nets import Measured, collate

    torch.manual_seed(0)
    net = CostNet()
    x = np.random.default_rng(0).random((3, NUM_FEATURES)).astype(np.float32)
    shard = Measured(x, np.zeros(3, np.int64), np.array([[0.2, 0.9, np.nan]], np.float32), float("nan"))
    loss = cost_loss(net, collate([shard]))
    with torch.no_grad():
        dev, _ = net(*[collate([shard])[k] for k in ("x", "placement", "device_mask")])
    assert float(loss.detach()) == pytest.approx(float((dev[0, 0, 0] - 0.2) ** 2 + (dev[0, 0, 1] - 0.9) ** 2), rel=1e-5)
    loss.backward()
    assert net.heads[2][0].weight.grad.abs().sum() == 0 and net.overall_head[0].weight.grad.abs().sum() == 0
    assert net.heads[0][0].weight.grad.abs().sum() > 0


def test_replay_buffer_stores_a_shared_feature_array_once():
    from dreamshard.learned.nets import Measured, ReplayBuffer

    x = np.ones((4, NUM_FEATURES), np.float32)
    buffer = ReplayBuffer()
    for d in range(5):
        buffer.add(Measured(x, np.full(4, d % 2, np.int64), np.full((2, 3), d, np.float32), float(d)))
    buffer.add(Measured(np.zeros((2, NUM_FEATURES), np.float32), np.zeros(2, np.int64), np.ones((1, 3), np.float32), 1.0))
    state = buffer.state_dict()
    assert len(state["x"]) == 2 and state["x_index"] == [0, 0, 0, 0, 0, 1]
    loaded = ReplayBuffer()
    loaded.load_state_dict(state)
    for a, b in zip(buffer.items, loaded.items):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.placement, b.placement) and np.array_equal(a.device_costs, b.device_costs) and a.overall == b.overall


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_learned_planner_role_fit_save_load_plan(pool, tmp_path):
    """`DreamShardPlanner.fit` is `train` behind the role; save → load plans the same."""
    from dreamshard.planners.base import LearnedPlanner
    from dreamshard.planners.dreamshard import DreamShardPlanner

    train_half, test_half = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 4, (6, 10), 2, 10**12, seed=1)
    sim, cfg = SimBackend(), small_config(iterations=2)
    planner = DreamShardPlanner.fit(tasks, sim, tmp_path / "m.pt", cfg, progress=False, best_of=2)
    assert isinstance(planner, LearnedPlanner) and planner.kind == "learned" and planner.best_of == 2
    direct = train(cfg, tasks, sim, tmp_path / "direct.pt", progress=False)
    for a, b in ((planner.model.cost_net, direct.cost_net), (planner.model.policy, direct.policy)):
        for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(va, vb), k
    planner.save(tmp_path / "saved.pt")
    loaded = DreamShardPlanner.load(tmp_path / "saved.pt", best_of=2)
    for task in sample_tasks(test_half, 3, (8, 12), 3, 10**12, seed=2):
        assert loaded.plan(task).placement == planner.plan(task).placement


def test_advantages_normalise_per_task_and_penalise_stuck_episodes():
    from dreamshard.learned.dreamshard import advantages

    returns = torch.tensor([-1.0, -2.0, -3.0, -10.0, -20.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    ok = torch.tensor([True, True, True, True, True, False])
    per_task = advantages(returns, groups, ok, "task")
    assert torch.allclose(per_task[:3], torch.tensor([1.0, 0.0, -1.0]))
    assert per_task[5] == per_task[4] < per_task[3]  # stuck: its task's worst return
    whole = advantages(returns, groups, ok, "batch")
    assert whole[0] > whole[3] > whole[5] and abs(float(whole.mean())) < 1e-6


def test_budget_is_spread_over_iterations():
    cfg = get_config("paper", iterations=4, budget=10)
    assert [cfg.measurements_at(i) for i in range(4)] == [3, 3, 2, 2]
    assert get_config("paper").total_budget() == 100


# --------------------------------------------------------------------------------------------
# planner and CLI
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "m.pt"
    train_half, _ = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 4, (6, 10), 2, 10**12, seed=1)
    train(small_config(iterations=1), tasks, SimBackend(), out, progress=False)
    return out


@settings(max_examples=25, deadline=None)
@given(small_tasks())
def test_planner_respects_memory_and_reports_predictions(tiny_model, task):
    from dreamshard.packing import pack

    if pack(task.sizes(), task.max_memory_bytes, task.devices) is None:
        return
    plan = get_planner("dreamshard", model=str(tiny_model)).plan(task)
    plan.check()
    pred = plan.predicted
    assert len(pred["devices"]) == task.devices and set(pred["devices"][0]) == {"fwd_comp_ms", "bwd_comp_ms", "comm_ms", "total_ms"}
    assert pred["max_device_ms"] == pytest.approx(max(d["total_ms"] for d in pred["devices"]))


def test_model_file_errors(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_text("not a model")
    with pytest.raises(ModelError, match="cannot read this model file") as e:
        DreamShardModel.load(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="no such model"):
        DreamShardModel.load(tmp_path / "none.pt")


def test_cli_train_and_plan(pool, tmp_path, tiny_model):
    from dreamshard.cli import cli
    from dreamshard.plan import load_plans

    from dreamshard.tables import save_tables

    save_tables(pool, tmp_path / "tables.csv")
    train_half, test_half = split_pool(pool, 0)
    save_tasks(sample_tasks(train_half, 3, (5, 8), 2, 10**12, seed=2, pool=str(tmp_path)), tmp_path / "train.jsonl")
    save_tasks(sample_tasks(test_half, 2, (5, 8), 2, 10**12, seed=3, pool=str(tmp_path)), tmp_path / "test.jsonl")
    r = CliRunner().invoke(cli, ["train", "--tasks", str(tmp_path / "train.jsonl"), "--backend", "gpu", "--out", str(tmp_path / "m.pt")])
    assert r.exit_code == 2 and "--backend" in r.output
    (tmp_path / "x.json").write_text("{}")
    r = CliRunner().invoke(cli, ["train", "--tasks", str(tmp_path / "train.jsonl"), "--backend", "torch", "--calibration", str(tmp_path / "x.json"), "--out", str(tmp_path / "m.pt")])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--calibration is for --backend sim" in r.output
    # measured by a real kernel: the torch kernel on CPU, one device's shard at a time
    r = CliRunner().invoke(cli, ["train", "--tasks", str(tmp_path / "train.jsonl"), "--backend", "torch", "--device", "cpu", "--batch-size", "64",
                                 "--out", str(tmp_path / "k.pt"), "--iterations", "1", "--budget", "2", "--config", "paper", "--log", str(tmp_path / "klog.jsonl")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "klog.jsonl").read_text().splitlines()[0])["measurements"] == 2
    assert DreamShardModel.load(tmp_path / "k.pt").meta["backend"] == "torch/sequential"
    # resuming against another backend would mix two backends' costs in one replay buffer
    r = CliRunner().invoke(cli, ["train", "--tasks", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "k.pt"), "--iterations", "1", "--budget", "2",
                                 "--config", "paper", "--batch-size", "64", "--resume"])
    assert r.exit_code == 2 and "torch/sequential" in r.output
    # a small but complete run through the CLI (the options the config sets are overridden here)
    r = CliRunner().invoke(cli, ["train", "--tasks", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "m.pt"), "--iterations", "1", "--budget", "2", "--config", "paper", "--log", str(tmp_path / "log.jsonl")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])["measurements"] == 2
    r = CliRunner().invoke(cli, ["plan", "--tasks", str(tmp_path / "test.jsonl"), "--planner", "dreamshard", "--model", str(tmp_path / "m.pt"), "--out", str(tmp_path / "p.jsonl")])
    assert r.exit_code == 0, r.output
    plans = load_plans(tmp_path / "p.jsonl")
    assert len(plans) == 2 and all(p.planner == "dreamshard" and p.predicted for p in plans)
    r = CliRunner().invoke(cli, ["plan", "--tasks", str(tmp_path / "test.jsonl"), "--planner", "lookup", "--model", str(tmp_path / "m.pt"), "--out", str(tmp_path / "q.jsonl")])
    assert r.exit_code == 2 and "--model is for the planners with a model (autoshard, dreamshard, neuroshard, rnn)" in r.output


def test_cli_train_with_a_prior(pool, tmp_path):
    from dreamshard.cli import cli
    from dreamshard.tables import save_tables

    save_tables(pool, tmp_path / "tables.csv")
    save_tasks(sample_tasks(split_pool(pool, 0)[0], 3, (5, 8), 2, 10**12, seed=2, pool=str(tmp_path)), tmp_path / "train.jsonl")
    base = ["train", "--tasks", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "m.pt"), "--iterations", "1", "--budget", "2"]
    for extra, msg in ((["--prior-plans", "-1"], "--prior-plans must be >= 0, got -1"),
                       (["--prior-plans", "5", "--planner", "autoshard"], "--prior-plans is for --planner dreamshard, not autoshard"),
                       (["--prior-plans", "5"], "--prior-plans: the backend is already the simulator that prices the prior")):
        r = CliRunner().invoke(cli, base + extra)
        assert r.exit_code == 2 and r.output.count("\n") == 1 and msg in r.output, r.output
    # against another cost surface (here the CPU calibration, as a kernel on real hardware would be) the prior makes sense
    r = CliRunner().invoke(cli, base + ["--backend", "sim", "--calibration", "dreamshard/data/calibrations/cpu_fbgemm.json", "--prior-plans", "20",
                                        "--log", str(tmp_path / "log.jsonl")])
    assert r.exit_code == 0, r.output
    row = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert row["prior/plans"] == 20 and row["measurements"] == 2
    meta = DreamShardModel.load(tmp_path / "m.pt").meta
    assert meta["config"]["prior_plans"] == 20 and meta["prior_backend"] == SimBackend().name and meta["measurements"] == 2


# --------------------------------------------------------------------------------------------
# acceptance: a short training run on the simulator beats random and every heuristic
# --------------------------------------------------------------------------------------------


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_short_training_beats_every_heuristic_on_held_out_tasks(pool, tmp_path):
    torch.set_num_threads(1)
    train_half, test_half = split_pool(pool, 0)  # test tables are never seen in training
    train_tasks = sample_tasks(train_half, 30, (30, 30), 4, 5 * 10**9, seed=10)
    test_tasks = sample_tasks(test_half, 30, (30, 30), 4, 5 * 10**9, seed=11)
    sim = SimBackend()
    cfg = get_config("default", iterations=4, rl_batches=25)
    train(cfg, train_tasks, sim, tmp_path / "m.pt", progress=False)

    def mean_cost(planner) -> float:  # plans priced whole: `dreamshard`'s search may split tables
        return float(np.mean([sim.evaluate_plan(planner.plan(t), cfg.batch_size).overall_ms for t in test_tasks]))

    ours = mean_cost(get_planner("dreamshard", model=str(tmp_path / "m.pt")))
    theirs = {name: mean_cost(get_planner(name)) for name in HEURISTICS}
    print(f"dreamshard {ours:.4f} ms vs {theirs}")
    assert all(ours < c for c in theirs.values()), f"dreamshard {ours:.4f} ms vs {theirs}"


# --------------------------------------------------------------------------------------------
# kernel-term features and the comm model's all-to-all (Config.kernel_features, comm)
# --------------------------------------------------------------------------------------------


def options_model(sees_table: bool, tasks, seed: int = 7, cost_linear: bool = False, shared: bool = False) -> DreamShardModel:
    """A fresh model with both options (and the cost net's linear part and its shared terms, their
    weights drawn so that they matter), as `train` makes one against the simulator."""
    from dreamshard.learned.dreamshard import create_model

    cfg = small_config(policy_sees_table=sees_table, kernel_features=True, comm="model", seed=seed, cost_linear=cost_linear, shared_terms=shared)
    model = create_model(cfg, tasks, SimBackend())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("linear_raw",) * cost_linear + ("shared_raw",) * shared:
            getattr(model.cost_net, name).copy_(torch.randn(getattr(model.cost_net, name).shape, generator=g))
    return model


def test_options_default_off_and_the_shipped_model_has_both(pool):
    for name in ("paper", "default"):
        cfg = get_config(name)
        assert cfg.kernel_features is False and cfg.comm == "head"
    # the shipped model was trained on an H100 with both options and learned cuts (docs/dreamshard.md)
    shipped = DreamShardModel.load()
    assert shipped.kernel is not None and shipped.comm is not None and shipped.cut is not None
    assert shipped.meta["config"]["kernel_features"] is True and shipped.meta["config"]["comm"] == "model"
    assert shipped.kernel.product_scale > 0  # trained on the kernel with the backward's product path
    assert shipped.kernel.cache_bytes > 0  # and the measuring GPU's L2 in its features
    # its product-path features mark the tables the kernel takes (same weights as trained, docs/dreamshard.md)
    assert shipped.kernel.product_rule == "kernel"
    # a model without them is stored as before: no keys of theirs, the table features alone
    from dreamshard.learned.dreamshard import create_model

    tasks = sample_tasks(split_pool(pool, 0)[0], 2, (4, 6), 2, 10**12, seed=0)
    plain = create_model(small_config(), tasks, SimBackend())
    state = plain.state()
    assert plain.kernel is None and plain.comm is None
    assert "kernel_features" not in state and "comm" not in state
    assert plain.cost_net.encoder[0].in_features == NUM_FEATURES + 5


def test_kernel_features_say_which_tables_take_the_product_path(pool):
    """The product path's flag and modelled time (costs/paths.py, what the simulator prices such a
    table by) follow the kernel features: for a model fitted now, on the tables the kernel takes
    (paths.product_tables); under the rule of older files ("candidate"), on every candidate of the
    path's model (paths.takes_product). A model stored without them (trained before the path)
    keeps its width and loads as it was."""
    from dataclasses import replace

    from dreamshard.costs.paths import dense_us, product_tables, takes_product
    from dreamshard.learned.nets import KERNEL_FEATURE_TERMS, KernelFeatures

    wl = Workload(65_536)
    hot = TableSpec("hot", 1_302, 192, 69.0, pool[0].bins)
    warm = TableSpec("warm", 100, 64, 10.0, distribution="uniform")  # a candidate that saves < 200 us by the model: sorted path
    tables = [hot, warm, *pool[:20]]
    tasks = [Task(tables, 2, 10**12, wl)]
    k = KernelFeatures.fit(tasks, wl.batch_size)
    x = k(tables, wl)
    lookups = np.array([t.pooling_factor * wl.batch_size for t in tables])
    arrays = (lookups, [t.rows for t in tables], [t.dim for t in tables], wl.batch_size, wl.elt_bytes)
    takes, candidate = product_tables(*arrays), takes_product(*arrays)
    assert k.product_rule == "kernel" and k.to_json()["product_rule"] == "kernel"
    assert x.shape == (len(tables), len(KERNEL_FEATURE_TERMS) + 3) and takes[0] and not takes[1] and candidate[1] and not candidate.all()
    assert np.array_equal(x[:, -2], takes.astype(np.float32))
    assert x[0, -1] == pytest.approx(dense_us(lookups[0], hot.rows, hot.dim, wl.batch_size, 2) / k.product_scale, rel=1e-5)
    assert (x[~takes, -1] == 0).all()
    older = replace(k, product_rule="candidate")
    y = older(tables, wl)
    assert np.array_equal(y[:, -2], candidate.astype(np.float32)) and y[1, -1] > 0 and np.array_equal(y[:, :-2], x[:, :-2])
    assert "product_rule" not in older.to_json()  # stored as the files before the rule: no key, read as "candidate"
    # without the path (Config.kernel_product_path false, or an older model file): 2 columns fewer, the rest the same
    old = KernelFeatures.fit(tasks, wl.batch_size, product_path=False)
    assert old.product_scale == 0 and "product_scale" not in old.to_json()
    assert np.array_equal(old(tables, wl), x[:, :-2])


def test_kernel_features_count_the_cache_of_the_backend():
    """With a cache, a table whose distinct rows overflow it has its missed repeats as cold bytes
    (terms.cache_hits), one that fits keeps its features; a model without a cache stores no key."""
    from dreamshard.learned.nets import KERNEL_FEATURE_TERMS, KernelFeatures

    wl = Workload(65_536)
    big = TableSpec("big", 440_630, 256, 288.0, distribution="uniform")
    small = TableSpec("small", 2_000, 64, 20.0, distribution="zipf:1.1")
    tasks = [Task([big, small], 2, 10**12, wl)]
    plain, cached = KernelFeatures.fit(tasks, wl.batch_size), KernelFeatures.fit(tasks, wl.batch_size, cache_bytes=60 * 2**20)
    assert "cache_bytes" not in plain.to_json() and cached.to_json()["cache_bytes"] == 60 * 2**20
    cold, warm, hot = (KERNEL_FEATURE_TERMS.index(t) for t in ("cold_bytes", "warm_bytes", "hot_bytes"))
    a, b = plain([big, small], wl) * np.array(plain.scale + (1,) * 3), cached([big, small], wl) * np.array(cached.scale + (1,) * 3)
    assert b[0, cold] > 2 * a[0, cold] and b[0, warm] + b[0, hot] < 0.5 * (a[0, warm] + a[0, hot])
    assert b[0, cold] + b[0, warm] + b[0, hot] == pytest.approx(a[0, cold] + a[0, warm] + a[0, hot], rel=1e-5)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-5)


def test_options_are_checked(pool, tmp_path):
    for bad, msg in ((dict(comm="nccl"), "comm 'nccl': use one of head, model"), (dict(kernel_features="yes"), "kernel_features must be true or false"),
                     (dict(cost_linear=True), "cost_linear weighs the kernel features"), (dict(prior_singles=True), "prior_singles needs a prior"),
                     (dict(kernel_features=True, shared_terms=True), "shared_terms are weighed by the cost net's linear part"),
                     (dict(prior_singles=True, prior_plans=4, normalization="task"), "normalization 'fixed'")):
        with pytest.raises(ValueError, match=msg) as e:
            small_config(**bad)
        assert "\n" not in str(e.value)

    class Measuring(SimBackend):  # as the distributed runner: real all-to-alls, no comm model
        def comm_params(self):
            return None

    tasks = sample_tasks(split_pool(pool, 0)[0], 2, (4, 6), 2, 10**12, seed=0)
    with pytest.raises(ValueError, match="has no comm model") as e:
        train(small_config(comm="model"), tasks, Measuring(), tmp_path / "m.pt", progress=False)
    assert "\n" not in str(e.value)
    state = options_model(False, tasks, cost_linear=True).state()
    del state["kernel_features"]  # a linear part without the features it weighs
    with pytest.raises(ModelError, match="needs kernel features"):
        DreamShardModel.from_state(state)


@pytest.mark.parametrize("sees_table,keep_room,cost_linear,shared", [(False, False, False, False), (True, True, False, False), (False, True, True, False),
                                                                    (True, False, True, True)])
def test_fast_player_plays_the_same_episodes_with_the_options(pool, sees_table, keep_room, cost_linear, shared):
    """The torch MDP (training) and the NumPy player (planning) see the same kernel features, the
    same modelled all-to-all, the same linear part and shared terms: same greedy placements, same
    predicted costs."""

    tasks = [Task(pool[:40], 8, 10**12), Task(pool[100:103], 2, 10**12), Task(pool[40:90], 4, 2 * 10**9), Task(pool[120:121], 1, 10**12)]
    model = options_model(sees_table, tasks, cost_linear=cost_linear, shared=shared)
    model.cost_net.scale.fill_(0.7)  # units of ms that are not 1: the comm model's ms are scaled like the heads'
    player = FastPlayer(model.cost_net, model.policy, keep_room, model.comm)
    for task in tasks:
        p = prepare(task, model.normalization, model.linear_features, model.kernel)
        assert p.x.shape[1] == NUM_FEATURES + 5 + 17 + SHARED_WIDTH * shared and np.array_equal(p.x, model.features(task.tables, task.workload))
        with torch.no_grad():
            ro = rollout(model.cost_net, model.policy, EpisodeBatch.of([p]), greedy=True, keep_room=keep_room, comm=model.comm)
        placement, stuck, costs, overall = player.play(p, np.array([True]))
        assert bool(stuck[0]) == bool(ro.stuck[0])
        assert canonical(placement[0]) == canonical(ro.placement[0])
        assert np.allclose(np.sort(costs[0], axis=0), np.sort(ro.device_costs[0].numpy(), axis=0), atol=1e-4)
        assert overall[0] == pytest.approx(float(ro.overall[0]), abs=1e-4)


def test_modelled_comm_is_the_simulators_all_to_all(pool):
    """With comm 'model' the torch MDP prices the all-to-all by the formula stored in the model (the
    parameters of the backend it was trained against), and the planner's search (its plan's
    prediction, the scorer) by the comm model of the task's device count: exactly what the
    simulator of the shipped cost net's GPU charges."""
    from dreamshard.planners.dreamshard import DreamShardPlanner
    from dreamshard.planners.scoring import PieceScorer
    from dreamshard.planners import splits

    tasks = sample_tasks(split_pool(pool, 0)[0], 4, (10, 16), 4, 10**12, seed=3)
    model = options_model(False, tasks)
    trained = SimBackend(comm="calibration")
    assert model.comm.params() == {k: trained.calibration.comm[k] for k in ("latency_ms", "bandwidth_GBps", "serial_fraction")}
    sim = SimBackend("h100_triton.json")  # the shipped cost net's GPU: its comm models at each device count
    planner = DreamShardPlanner(model, split=True)
    checked = 0
    for task in tasks:
        plan = planner.plan(task)
        if plan.has_row_shards():  # their reduce-scatter is added on top (scoring.py); the all-to-all alone here
            continue
        want = [d.fwd_comm_ms + d.bwd_comm_ms for d in sim.evaluate_plan(plan).devices]
        assert [d["comm_ms"] for d in plan.predicted["devices"]] == pytest.approx(want, rel=1e-5)
        # the scorer on a table-wise placement, each table on its first shard's device
        first: dict[int, int] = {}
        for s in plan.shards:
            first.setdefault(s.table, s.device)
        placement = [first[i] for i in range(len(task.tables))]
        scorer = PieceScorer(model, task)
        costs = scorer.device_costs(scorer.state(splits.whole(task), np.array(placement))) * float(model.cost_net.scale)
        shards = [[t for t, d in zip(task.tables, placement) if d == k] for k in range(task.devices)]
        assert costs[:, 2] == pytest.approx([d.fwd_comm_ms + d.bwd_comm_ms for d in sim.evaluate(shards, task.workload).devices], rel=1e-5)
        checked += 1
    assert checked >= 3


def test_scorer_features_are_the_planners(pool):
    """The split search's scorer and the policy's MDP compute a table's features by one path
    (`table_features` with the model's stored kernel scale): the same state rows, whatever other
    tables the task holds (the scale is the model's, not the task's)."""
    from dreamshard.learned.mdp import NumpyCostNet
    from dreamshard.planners import splits
    from dreamshard.planners.scoring import PieceScorer

    tasks = sample_tasks(split_pool(pool, 0)[0], 3, (6, 10), 3, 10**12, seed=4)
    model = options_model(True, tasks)
    scale = model.kernel.scale
    big, small = Task(pool[:60], 4, 10**12), Task(pool[:5], 4, 10**12)
    rows = PieceScorer(model, big).rows([splits.whole(big)])[0]
    x = prepare(big, model.normalization, model.linear_features, model.kernel).x
    net = NumpyCostNet(model.cost_net)
    assert np.allclose(rows[:, : net.nP + net.Wo1.shape[0]], net.rows(x), atol=1e-6)
    assert np.array_equal(prepare(small, "fixed", True, model.kernel).x, x[:5]) and model.kernel.scale == scale


def test_scorer_prices_the_shared_terms_as_the_torch_net(pool):
    """The split search's scorer (NumPy state rows) prices a device's compute with the shared terms
    as the torch cost net does, by `costs` and by `compute` (the searches' greedy)."""
    from dreamshard.planners import splits
    from dreamshard.planners.scoring import PieceScorer

    tasks = sample_tasks(split_pool(pool, 0)[0], 3, (20, 30), 4, 10**12, seed=4)
    model = options_model(False, tasks, cost_linear=True, shared=True)
    rng = np.random.default_rng(1)
    for task in tasks:
        placement = rng.integers(task.devices, size=len(task.tables))
        scorer = PieceScorer(model, task)
        state = scorer.state(splits.whole(task), placement)
        got = scorer.device_costs(state)[:, :2]
        x = torch.from_numpy(model.features(task.tables, task.workload))
        with torch.no_grad():
            want = model.cost_net(x[None], torch.from_numpy(placement)[None], torch.ones(1, task.devices, dtype=torch.bool))[0][0, :, :2].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(scorer.net.compute(state[:, : scorer.net.nP]), want.sum(1), rtol=1e-4, atol=1e-4)
        # what the greedy carries (the heads' and the scalar columns, the presences as bits): the same compute
        keep, bits = scorer.net.compute_columns(state)
        assert len(keep) < scorer.net.nP / 2 and bits[0].dtype == np.uint64
        np.testing.assert_allclose(scorer.net.compute(state[:, keep], bits), want.sum(1), rtol=1e-4, atol=1e-4)


def test_the_greedy_of_the_search_on_the_columns_compute_reads_places_as_on_every_column(pool, monkeypatch):
    """greedy_batch carries a shared-terms net's compute columns and presence bits
    (`compute_columns`) and makes the full states after its last step: the same placements and
    costs as on every pre-activation column, step by step."""
    from dreamshard.planners import scoring, splits
    from dreamshard.planners.scoring import PieceScorer, greedy_batch

    tasks = sample_tasks(split_pool(pool, 0)[0], 2, (20, 30), 4, 10**12, seed=4)
    model = options_model(False, tasks, cost_linear=True, shared=True)
    caps = np.array([1.0, 1.2])
    for task in tasks:
        pieces = [splits.whole(task), [q for t, p in enumerate(splits.whole(task)) for q in (splits.cut(p, 2) if t < 3 else [p])]]
        got = [greedy_batch(PieceScorer(model, task), [ps], caps) for ps in pieces]
        with monkeypatch.context() as m:
            m.setattr(scoring.NumpyCostNet, "compute_columns", lambda self, rows: (np.arange(self.nP), None))
            want = [greedy_batch(PieceScorer(model, task), [ps], caps) for ps in pieces]
        for (cost, devices, _), (cost0, devices0, _) in zip(got, want):
            np.testing.assert_allclose(cost, cost0, rtol=1e-5)
            assert np.array_equal(devices, devices0)


@pytest.mark.parametrize("shared", [False, True])
def test_linear_part_starts_at_the_least_squares_of_its_terms(pool, shared):
    """`fit_linear` finds non-negative weights that price device costs which are exactly a weighted
    sum of the devices' (gated) kernel terms (and of their shared terms): the cost net then prices
    them so."""
    from dreamshard.learned.dreamshard import fit_linear
    from dreamshard.learned.nets import Measured

    tasks = sample_tasks(split_pool(pool, 0)[0], 6, (8, 14), 3, 10**12, seed=5)
    model = options_model(False, tasks, cost_linear=True, shared=shared)
    net = model.cost_net
    net.scale.fill_(1.0)
    rng = np.random.default_rng(0)
    w = rng.uniform(0.0, 1.0, net.linear_raw.shape) * (rng.random(net.linear_raw.shape) < 0.7)  # some weights 0
    ws = rng.uniform(0.0, 1.0, (6, 3)) * (rng.random((6, 3)) < 0.7)

    def priced(x, placement, devices, w, ws):
        with torch.no_grad():
            terms = net.linear_inputs(torch.from_numpy(x)).numpy()
            z = net.shared_inputs(x)
        return np.stack([terms[placement == d].sum(0) @ w + (np.stack(shared_terms(z[placement == d].sum(0))) @ ws if shared else 0.0)
                         for d in range(devices)])

    items = []
    for task in tasks * 4:
        x = model.features(task.tables, task.workload)
        placement = rng.integers(task.devices, size=len(task.tables))
        items.append(Measured(x, placement, priced(x, placement, task.devices, w, ws).astype(np.float32), float("nan")))
    fit_linear(net, items)
    got = net.linear_weight().detach().numpy()
    assert got.min() >= 0
    # the terms are collinear (a gated copy equals its term where no table takes the product
    # path), so the weights are not unique: what they price is
    for m in items:
        assert np.allclose(priced(m.x, m.placement, len(m.device_costs), got, net.shared_weight().detach().numpy() if shared else None), m.device_costs,
                           rtol=1e-3, atol=1e-3)
        if shared:  # and the net's own linear outputs with its heads' parts taken out are those prices
            with torch.no_grad():
                z = net.shards(torch.from_numpy(m.x)[None], torch.from_numpy(m.placement)[None], len(m.device_costs))
                heads = torch.cat([h(z[..., : net.latent]) for h in net.heads], dim=-1)
                np.testing.assert_allclose((net.shard_costs(z) - heads)[0].numpy(), m.device_costs, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shared", [False, True])
def test_options_train_save_load_plan(pool, tmp_path, shared):
    """Both options, the linear part (and its shared terms) and the tables alone through the loop (with a prior, so every path that fits
    the cost net runs), saved and loaded with their parameters; the loaded model plans the same."""
    from dreamshard.planners.dreamshard import DreamShardPlanner

    train_half, test_half = split_pool(pool, 0)
    tasks = sample_tasks(train_half, 4, (6, 10), 3, 10**12, seed=1)
    cfg = small_config(iterations=2, kernel_features=True, comm="model", prior_plans=30, prior_epochs=2, cost_linear=True, prior_singles=True, shared_terms=shared)
    model = train(cfg, tasks, SimBackend(), tmp_path / "m.pt", log=tmp_path / "m.jsonl", progress=False, prior=SimBackend("dreamshard/data/calibrations/cpu_fbgemm.json"))
    loaded = DreamShardModel.load(tmp_path / "m.pt")
    assert loaded.cost_net.linear == model.kernel.linear_width and torch.equal(loaded.cost_net.linear_raw, model.cost_net.linear_raw)
    assert loaded.cost_net.shared == model.kernel.shared_width == (SHARED_WIDTH if shared else 0)
    if shared:
        assert torch.equal(loaded.cost_net.shared_raw, model.cost_net.shared_raw)
    assert loaded.kernel == model.kernel and loaded.comm == model.comm and loaded.comm.batch_size == cfg.batch_size
    assert model.kernel.cache_bytes == SimBackend().cache_bytes() == 60 * 2**20  # the cache of the backend trained against
    assert loaded.meta["config"]["kernel_features"] is True and loaded.meta["config"]["comm"] == "model"
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["cost/mape_device"]) for r in rows)
    assert rows[0]["prior/plans"] == 30 + len({t for task in tasks for t in task.tables})  # the prior's plans, then each distinct training table alone
    for split in (False, True):
        a, b = DreamShardPlanner(model, split=split), DreamShardPlanner(str(tmp_path / "m.pt"), split=split)
        for task in sample_tasks(test_half, 3, (8, 12), 3, 10**12, seed=2):
            pa, pb = a.plan(task), b.plan(task)
            pa.check()
            assert pa.shards == pb.shards and pa.predicted["devices"] == pb.predicted["devices"]
    state = torch.load(tmp_path / "m.pt", weights_only=False)
    for key, bad, msg in (("kernel_features", {"scale": [1.0], "batch_size": 4}, "key 'kernel_features'"),
                          ("kernel_features", {**state["kernel_features"], "product_scale": -1.0}, "product_scale"),
                          ("kernel_features", {**state["kernel_features"], "cache_bytes": "60MiB"}, "cache_bytes"),
                          ("kernel_features", {**state["kernel_features"], "product_rule": "always"}, "product_rule 'always' is not one of candidate, kernel"),
                          ("kernel_features", {**state["kernel_features"], "shared": "yes"}, "shared 'yes' is not true or false"),
                          ("comm", {**state["comm"], "bandwidth_GBps": 0.0}, "key 'comm'"), ("comm", {**state["comm"], "batch_size": "x"}, "batch_size")):
        with pytest.raises(ModelError, match=msg) as e:
            DreamShardModel.from_state({**state, key: bad})
        assert "\n" not in str(e.value)


def test_prior_span_adds_tasks_of_span_tables_to_the_prior(pool, tmp_path):
    """Config.prior_span: tasks of span tables like the training tasks (table counts, devices,
    memory) priced by the prior beside theirs (plans and tables alone); the RL stays on the training tasks."""
    from dataclasses import replace

    from dreamshard.families import family_of
    from dreamshard.learned.dreamshard import span_tasks

    tasks = sample_tasks(split_pool(pool, 0)[0], 4, (6, 10), 3, 10**12, seed=1)
    cfg = small_config(iterations=1, kernel_features=True, prior_plans=20, prior_epochs=1, prior_singles=True, prior_span=3)
    span = span_tasks(cfg, tasks)
    assert len(span) == 3 and span_tasks(replace(cfg, prior_span=0), tasks) == []
    assert all(6 <= len(t.tables) <= 10 and t.devices == 3 and t.max_memory_bytes == 10**12 for t in span)
    assert all(family_of(x.name) is None for t in span for x in t.tables)
    model = train(cfg, tasks, SimBackend(), tmp_path / "m.pt", log=tmp_path / "m.jsonl", progress=False, prior=SimBackend("dreamshard/data/calibrations/cpu_fbgemm.json"))
    row = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert row["prior/plans"] == 20 + len({x for t in [*tasks, *span] for x in t.tables})
    assert model.meta["config"]["prior_span"] == 3
    with pytest.raises(ValueError, match="prior_span adds tasks to the prior's: set prior_plans >= 1 too"):
        small_config(prior_span=2)


def test_cli_train_options(pool, tmp_path):
    from dreamshard.cli import cli
    from dreamshard.tables import save_tables

    save_tables(pool, tmp_path / "tables.csv")
    save_tasks(sample_tasks(split_pool(pool, 0)[0], 3, (5, 8), 2, 10**12, seed=2, pool=str(tmp_path)), tmp_path / "train.jsonl")
    base = ["train", "--tasks", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "m.pt"), "--iterations", "1", "--budget", "2"]
    r = CliRunner().invoke(cli, ["train", "--help"])
    assert r.exit_code == 0 and "--kernel-features" in r.output and "--comm" in r.output
    for extra, msg in ((["--comm", "nccl"], "--comm: 'nccl' is not 'head' or 'model'"),
                       (["--comm", "model", "--planner", "rnn"], "--comm is for --planner dreamshard, not rnn"),
                       (["--kernel-features", "--planner", "autoshard"], "--kernel-features is for --planner dreamshard, not autoshard"),
                       (["--comm", "model", "--backend", "torch", "--runner", "distributed"], "--comm model: the distributed runner measures real all-to-alls"),
                       (["--prior-singles", "--planner", "rnn"], "--prior-singles is for --planner dreamshard, not rnn"),
                       (["--cost-linear"], "cost_linear weighs the kernel features: set kernel_features true too"),
                       (["--kernel-features", "--shared-terms"], "shared_terms are weighed by the cost net's linear part"),
                       (["--prior-singles"], "prior_singles needs a prior"), (["--prior-span", "3"], "prior_span adds tasks to the prior's"),
                       (["--prior-span", "3", "--planner", "rnn"], "--prior-span is for --planner dreamshard, not rnn"),
                       (["--search-rank", "2"], "search_rank weighs differences"), (["--search-rank", "2", "--planner", "rnn"], "--search-rank is for --planner dreamshard")):
        r = CliRunner().invoke(cli, base + extra)
        assert r.exit_code == 2 and r.output.count("\n") == 1 and msg in r.output, r.output
    r = CliRunner().invoke(cli, base + ["--kernel-features", "--comm", "model"])
    assert r.exit_code == 0, r.output
    model = DreamShardModel.load(tmp_path / "m.pt")
    assert model.kernel is not None and model.comm is not None and model.meta["config"]["comm"] == "model"
    # the shipped model's recipe: the linear part and the tables alone in the prior (and the shared terms)
    r = CliRunner().invoke(cli, base + ["--kernel-features", "--comm", "model", "--cost-linear", "--prior-plans", "6", "--prior-singles", "--prior-span", "2",
                                        "--shared-terms", "--calibration", "dreamshard/data/calibrations/cpu_fbgemm.json", "--out", str(tmp_path / "r.pt")])
    assert r.exit_code == 0, r.output
    model = DreamShardModel.load(tmp_path / "r.pt")
    assert model.cost_net.linear == model.kernel.linear_width and model.meta["config"]["prior_singles"] and model.meta["config"]["prior_span"] == 2
    assert model.kernel.shared and model.cost_net.shared == SHARED_WIDTH and model.meta["config"]["shared_terms"]
    assert (model.cost_net.shared_weight() > 1e-5).any()  # started by fit_linear on the prior, not left near 0


def test_no_learned_module_or_planner_imports_a_cost_backend():
    """The layering rule (data → task → planner → plan → cost backend): learned and planner
    modules may use the comm model's arithmetic (costs/comm.py; on several hosts costs/hierarchy.py), the host tiers' (costs/host.py), the per-table work counts
    (costs/terms.py) and the backward paths' model (costs/paths.py), never a backend — not at
    import and not inside a function."""
    import ast
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1] / "dreamshard"
    allowed = {"dreamshard.costs", "dreamshard.costs.comm", "dreamshard.costs.hierarchy", "dreamshard.costs.host", "dreamshard.costs.terms", "dreamshard.costs.paths", "dreamshard.costs.base", "dreamshard.costs.hardware"}
    for package in ("learned", "planners"):
        for path in sorted((root / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                for name in names:
                    if name.startswith("dreamshard.costs"):
                        assert name in allowed, f"{path.name} imports {name}"
    code = ("import sys, dreamshard.planners, dreamshard.learned.dreamshard, dreamshard.learned.autoshard, dreamshard.learned.rnn; "
            "print(sorted(m for m in sys.modules if m.startswith('dreamshard.costs')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['dreamshard.costs', 'dreamshard.costs.comm', 'dreamshard.costs.paths', 'dreamshard.costs.terms']"


def test_the_heuristics_plans_compete_with_the_policys_by_the_cost_net():
    """By default the plan is the cheapest by the model's cost net of the policy's plan and the
    greedy heuristics' (the note names a heuristic that won); with heuristic_candidates=False it
    is the policy's alone. Hot tables at tight memory, where heuristics do win."""
    from dreamshard.families import synth_family
    from dreamshard.planners.heuristics import GREEDY_PLANNERS

    planner, policy_only = get_planner("dreamshard", split=False), get_planner("dreamshard", heuristic_candidates=False, split=False)
    model = planner.model
    for task in sample_tasks(synth_family("hot", 200, 3), 8, (20, 40), 4, 4 * 10**9, seed=8):
        plan, own = planner.plan(task), policy_only.plan(task)
        assert own.notes == []
        p = prepare(task, model.normalization, model.linear_features, model.kernel)
        placements = [own.placement] + [cls().plan(task).placement for cls in GREEDY_PLANNERS]
        dev, ov = predict(model.cost_net, EpisodeBatch.of([p] * len(placements)), torch.tensor(placements), model.comm)
        costs = plan_cost(dev, ov, model.score).numpy() * float(model.cost_net.scale)
        assert plan.predicted["max_device_ms"] == pytest.approx(costs.min(), rel=1e-5)
        assert plan.placement == placements[int(costs.argmin())]
        assert bool(plan.notes) == (plan.placement != own.placement)


def test_a_heuristic_plan_replaces_a_policy_plan_the_cost_net_prices_dearer(pool, monkeypatch):
    """A policy that piles every table on device 0: a heuristic's balanced plan wins, and the note
    says which."""
    import dreamshard.planners.dreamshard as ds

    monkeypatch.setattr(ds, "best_placement", lambda model, p, *a, **k: (np.zeros(len(p.sizes), int), None, None))
    planner = get_planner("dreamshard", split=False)
    for task in sample_tasks(pool, 3, (20, 30), 4, 10**12, seed=5):
        plan = planner.plan(task)
        assert len(set(plan.placement)) > 1
        assert len(plan.notes) == 1 and plan.notes[0].startswith("used the ") and plan.notes[0].endswith("plan: the cost net predicts it cheaper than the policy's")


def test_a_stuck_policy_falls_back_to_the_heuristic_plan_its_cost_net_prices_cheapest(pool, monkeypatch):
    """Every episode out of memory: the plan is one of the greedy heuristics', the cheapest by the
    model's own cost net, with that prediction, and the note says which."""
    import dreamshard.planners.dreamshard as ds
    from dreamshard.learned.nets import plan_cost
    from dreamshard.planners.heuristics import GREEDY_PLANNERS

    monkeypatch.setattr(ds, "best_placement", lambda *a, **k: (None, None, None))
    planner = get_planner("dreamshard", split=False)
    model = planner.model
    for task in sample_tasks(pool, 4, (20, 30), 4, 10**12, seed=5):
        plan = planner.plan(task)
        p = prepare(task, model.normalization, model.linear_features, model.kernel)
        costs = {}
        for cls in GREEDY_PLANNERS:
            q = cls().plan(task)
            dev, ov = ds.predict(model.cost_net, EpisodeBatch.of([p]), torch.tensor([q.placement]), model.comm)
            costs[q.planner] = (q.placement, float(plan_cost(dev, ov, model.score)[0]) * float(model.cost_net.scale))
        best = min(costs, key=lambda k: costs[k][1])
        assert plan.placement == costs[best][0]
        assert plan.notes == [f"dreamshard policy ran out of memory; used the {best} plan, the cheapest of the greedy heuristics' by the cost net"]
        assert plan.predicted["max_device_ms"] == pytest.approx(costs[best][1], rel=1e-5)
