"""The learned peers: AutoShard (planner `autoshard`) and the RNN placer (`rnn`) — their maths,
their training against the simulator, their model files, resuming, and the CLI."""

from __future__ import annotations

import json

from dataclasses import replace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dreamshard import shipped
from dreamshard.cli import cli
from dreamshard.costs.sim import SimBackend
from dreamshard.learned import autoshard, rnn, sequence
from dreamshard.learned.loop import measure
from dreamshard.planners import get_planner
from dreamshard.planners.autoshard import AutoShardPlanner
from dreamshard.planners.rnn import RNNPlanner
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tasks import Task, sample_tasks, split_pool
from dreamshard.validation import ModelError, NoPlanError, OptionError

PEERS = {"autoshard": (AutoShardPlanner, autoshard), "rnn": (RNNPlanner, rnn)}


@pytest.fixture(scope="module")
def tasks():
    train_half, test_half = split_pool(synth_pool(PoolConfig(tables=200, seed=0)), 0)  # test tables never seen in training
    return sample_tasks(train_half, 30, (20, 30), 4, 5 * 10**9, seed=10), sample_tasks(test_half, 20, (20, 30), 4, 5 * 10**9, seed=11)


# --------------------------------------------------------------------------------------------
# the maths
# --------------------------------------------------------------------------------------------


def test_vtrace_on_policy_is_the_monte_carlo_return_and_clips_off_policy_weights():
    torch.manual_seed(0)
    E, T = 3, 6
    values = torch.randn(E, T)
    rewards = torch.zeros(E, T)
    rewards[:, -1] = torch.tensor([0.5, -0.2, 0.9])
    discounts = torch.ones(E, T)
    discounts[:, -1] = 0.0
    logp = torch.randn(E, T)
    vs, adv = autoshard.vtrace(logp, logp, rewards, values, discounts)
    # on-policy, undiscounted, one reward at the end: every step's target is that reward
    assert torch.allclose(vs, rewards[:, -1:].expand(E, T), atol=1e-6)
    assert torch.allclose(adv, rewards[:, -1:] - values, atol=1e-6)
    # off-policy: the importance weight of a step is clipped at rho_bar
    target = logp + torch.log(torch.full((E, T), 3.0))  # the learner thinks every action 3x likelier
    _, adv3 = autoshard.vtrace(logp, target, rewards, values, discounts, rho_bar=1.0, c_bar=1.0)
    assert torch.allclose(adv3, adv, atol=1e-6)
    _, adv_big = autoshard.vtrace(logp, target, rewards, values, discounts, rho_bar=10.0, c_bar=1.0)
    assert torch.allclose(adv_big[:, -1], 3.0 * adv[:, -1], atol=1e-5)


def test_reward_is_balance_or_the_overflow():
    p = sequence.Prepared(np.zeros((3, 21), np.float32), np.array([60, 60, 30]), 100, 2)
    assert autoshard.reward(p, np.array([0, 1, 1]), np.array([2.0, 4.0])) == pytest.approx(0.5)
    assert autoshard.reward(p, np.array([0, 0, 1]), None) == pytest.approx(-0.2)  # device 0 at 120% of its cap


def test_learner_replay_reproduces_the_actors_log_probs(tasks):
    """The learner recomputes every step at once from the played actions; it must see what the
    actor saw step by step (same logits), or V-trace's ratios and REINFORCE's gradients are wrong."""
    torch.manual_seed(0)
    prepared = [sequence.prepare(t) for t in tasks[0][:5]]
    net = autoshard.AutoShardNet()
    ep = autoshard.episodes(net, prepared)
    actions, behaviour, _ = autoshard.act(net, ep, greedy=False, generator=torch.Generator().manual_seed(1))
    logits, _ = autoshard.replay(net, ep, actions)
    target = torch.log_softmax(logits, -1).gather(-1, actions.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(target[ep.valid], behaviour[ep.valid], atol=1e-5)
    # with the devices without room masked (Config.mask_memory), at a cap tight enough to mask some
    tight = replace(ep, cap=ep.nbytes.sum(1) // ep.devices * 11 // 10)
    actions, behaviour, _ = autoshard.act(net, tight, greedy=False, generator=torch.Generator().manual_seed(1), room=True)
    logits, _ = autoshard.replay(net, tight, actions, room=True)
    assert (torch.isinf(logits) & tight.device_ok.unsqueeze(1))[tight.valid].any()  # some device of a task masked
    target = torch.log_softmax(logits, -1).gather(-1, actions.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(target[tight.valid], behaviour[tight.valid], atol=1e-5)
    assert (~tight.valid).any() and torch.isfinite(target * tight.valid).all()  # padding read back as device 0 stays finite (the loss sums it × 0)

    placer = rnn.Seq2SeqPlacer(4)
    ep = sequence.episodes(prepared, [rnn.order(p) for p in prepared])
    actions, _ = rnn.act(placer, ep, greedy=False, generator=torch.Generator().manual_seed(1))
    logits = rnn.replay(placer, ep, actions)
    # every played action is legal under the replayed masks (memory included), and every table placed
    chosen = logits.gather(-1, actions.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert torch.isfinite(chosen[ep.valid]).all() and (actions[ep.valid] >= 0).all()


def test_placements_come_back_in_the_tasks_table_order(tasks):
    task = tasks[0][0]
    p = sequence.prepare(task)
    order = rnn.order(p)
    ep = sequence.episodes([p], [order])
    actions = torch.arange(ep.x.shape[1])[None, :] % 4
    placement = sequence.placements(ep, actions)[0]
    assert all(placement[order[t]] == t % 4 for t in range(len(order)))


# --------------------------------------------------------------------------------------------
# planning: memory, wide tasks, model files
# --------------------------------------------------------------------------------------------


def untrained(name: str):
    torch.manual_seed(0)
    model = autoshard.AutoShardModel(autoshard.AutoShardNet()) if name == "autoshard" else rnn.RNNModel(rnn.Seq2SeqPlacer(4))
    return PEERS[name][0](model=model)


@pytest.mark.parametrize("name", sorted(PEERS))
def test_untrained_peer_honours_memory_on_tight_tasks(name, tasks):
    planner = untrained(name)
    for task in tasks[1][:10]:
        sizes = task.sizes()
        tight = Task(task.tables, 4, max(int(sum(sizes) / 4 * 1.1), max(sizes)), task.workload)
        plan = planner.plan(tight)
        plan.check()
        assert max(plan.device_bytes()) <= tight.max_memory_bytes


@pytest.mark.parametrize("name", sorted(PEERS))
def test_a_stranded_policy_falls_back_to_a_packing_and_says_so(name, tasks, monkeypatch):
    monkeypatch.setattr(PEERS[name][0], "placement", staticmethod(lambda net, task, *options: None))
    plan = untrained(name).plan(tasks[1][0])
    plan.check()
    assert plan.notes == [f"{'autoshard policy' if name == 'autoshard' else 'rnn placer'} ran out of memory; used a memory packing instead"]


def test_autoshard_plans_the_best_of_sampled_episodes_where_its_greedy_one_piles_tables(tasks, monkeypatch):
    """A near-uniform policy that slightly prefers fuller devices (an untrained one can): its
    greedy episode (the default, the reference's) puts every table on one device; with
    `best_of=16` the planner samples 16 episodes and keeps the one whose slowest shard its cost
    model prices lowest, the same for a seed."""
    net = autoshard.AutoShardNet()
    monkeypatch.setattr(net, "logits", lambda h, z, used, count: 1e-3 * count)
    task = tasks[1][0]
    share = lambda plan: np.bincount([s.device for s in plan.shards], minlength=task.devices).max() / len(task.tables)
    greedy = AutoShardPlanner(model=autoshard.AutoShardModel(net)).plan(task)
    assert share(greedy) == 1.0
    planner = AutoShardPlanner(model=autoshard.AutoShardModel(net), best_of=16)
    sampled = planner.plan(task)
    sampled.check()
    assert share(sampled) < 0.6 and planner.plan(task).shards == sampled.shards
    for bad in (0, -1, 2.5, True):
        with pytest.raises(OptionError, match="autoshard: best_of must be an integer >= 1"):
            AutoShardPlanner(model=autoshard.AutoShardModel(net), best_of=bad)


def test_autoshard_policy_starts_uniform_and_learns_from_its_first_update():
    """The logits MLP's last layer starts at zero: every device gets the same logit whatever it
    holds (the reference's random layer prefers devices by their summed latents), and the layer
    still gets a gradient."""
    torch.manual_seed(0)
    net = autoshard.AutoShardNet()
    z, used, count = torch.randn(5, 4, 32) * 3, torch.rand(5, 4), torch.tensor([[0, 1, 5, 9]] * 5)
    logits = net.logits(torch.randn(5, 64), z, used, count)
    assert torch.equal(logits, torch.zeros(5, 4))
    logits.log_softmax(-1)[:, 2].sum().backward()
    assert net.policy[-1].weight.grad.abs().sum() > 0


def test_rnn_has_no_plan_for_a_task_wider_than_its_model(tasks):
    """No plan for this task (NoPlanError): a file of tasks, `compare` and the demo go on."""
    planner = RNNPlanner(model=rnn.RNNModel(rnn.Seq2SeqPlacer(4)))
    task = tasks[1][0]
    with pytest.raises(NoPlanError, match="up to 4 devices"):
        planner.plan(Task(task.tables, 8, task.max_memory_bytes, task.workload))


def test_peers_need_a_model_where_none_is_shipped_and_refuse_the_wrong_file(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "MODELS_DIR", tmp_path / "none shipped")
    for name in PEERS:
        with pytest.raises(OptionError, match=f"planner {name} needs a trained model"):
            get_planner(name)
    torch.save({"format": "dreamshard.model/1"}, tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    torch.save({"format": autoshard.MODEL_FORMAT, "net": {"w": torch.zeros(1)}, "meta": {}}, tmp_path / "bad_net.pt")
    torch.save({"format": rnn.MODEL_FORMAT, "net": {}, "devices": True, "hidden": 64, "meta": {}}, tmp_path / "bad_devices.pt")
    for name, file, message in [("autoshard", "other.pt", "not a dreamshard.autoshard/1 file"), ("rnn", "other.pt", "not a dreamshard.rnn/1 file"),
                                ("autoshard", "junk.pt", "junk.pt"), ("autoshard", "bad_net.pt", "does not fit the network"),
                                ("rnn", "bad_devices.pt", "key 'devices'"), ("rnn", "missing.pt", "no such model file")]:
        with pytest.raises(ModelError, match=message):
            get_planner(name, model=str(tmp_path / file))


# --------------------------------------------------------------------------------------------
# training on the simulator
# --------------------------------------------------------------------------------------------


def sim_mean(tasks, plans) -> float:
    return float(np.mean([r.overall_ms for r in measure(SimBackend(), tasks, [p.placement for p in plans], 65_536)]))


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_autoshard_short_training_beats_random_on_unseen_tasks(tasks, tmp_path):
    """The acceptance of a learned planner: 50 iterations (400 measured plans, DreamShard's
    budget) against the simulator, then greedy plans of tasks of unseen tables."""
    torch.set_num_threads(1)
    train_tasks, test_tasks = tasks
    planner = AutoShardPlanner.fit(train_tasks, SimBackend(), tmp_path / "as.pt", AutoShardPlanner.config(), progress=False)
    ours = sim_mean(test_tasks, [planner.plan(t) for t in test_tasks])
    rand = np.mean([sim_mean(test_tasks, [get_planner("random", seed=s).plan(t) for t in test_tasks]) for s in range(3)])
    print(f"autoshard {ours:.3f} ms vs random {rand:.3f} ms")
    assert ours < rand
    assert planner.model.meta["measurements"] <= 400 and planner.model.meta["shard_measurements"] >= planner.model.meta["measurements"]
    reloaded = get_planner("autoshard", model=str(tmp_path / "as.pt"))
    assert all(reloaded.plan(t).shards == planner.plan(t).shards for t in test_tasks[:5])


# AutoShard's run is the long one (its actors and learner); the RNN placer's covers the loop's resume by default
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long) if n == "autoshard" else n for n in sorted(PEERS)])
def test_resumed_training_equals_an_uninterrupted_run(name, tasks, tmp_path):
    cls, module = PEERS[name]
    cfg = cls.config(iterations=4, measurements_per_iteration=3)
    train_tasks = tasks[0][:6]
    whole = module.train(cfg, train_tasks, SimBackend(), tmp_path / "a.pt", progress=False)
    module.train(cfg, train_tasks, SimBackend(), tmp_path / "b.pt", log=tmp_path / "b.jsonl", progress=False, stop_after=2)
    assert not (tmp_path / "b.pt").exists() and (tmp_path / "b.pt.ckpt").exists()
    resumed = module.train(cfg, train_tasks, SimBackend(), tmp_path / "b.pt", log=tmp_path / "b.jsonl", resume=True, progress=False)
    for (k, a), (_, b) in zip(whole.net.state_dict().items(), resumed.net.state_dict().items()):
        assert torch.equal(a, b), k
    rows = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3] and rows[-1]["measurements"] == whole.meta["measurements"]
    with pytest.raises(OptionError, match="options differ"):
        module.train(cls.config(iterations=5, measurements_per_iteration=3), train_tasks, SimBackend(), tmp_path / "b.pt", resume=True, progress=False)


def test_cli_trains_and_plans_with_each_peer(tmp_path):
    runner = CliRunner()
    for args in (["data", "synth", "--tables", "120", "--out", str(tmp_path / "pool")],
                 ["data", "tasks", "--pool", str(tmp_path / "pool"), "--tables", "10:20", "--devices", "4", "--max-memory", "5GB", "--num-train", "8", "--num-test", "4", "--out", str(tmp_path)]):
        assert runner.invoke(cli, args).exit_code == 0
    for name in PEERS:
        r = runner.invoke(cli, ["train", "--planner", name, "--tasks", str(tmp_path / "train.jsonl"), "--backend", "sim", "--iterations", "2",
                                "--budget", "6", "--out", str(tmp_path / f"{name}.pt")])
        assert r.exit_code == 0, r.output
        assert f"training {name} (paper config)" in r.output and "measured plans" in r.output
        r = runner.invoke(cli, ["plan", "--tasks", str(tmp_path / "test.jsonl"), "--planner", name, "--model", str(tmp_path / f"{name}.pt"), "--out", str(tmp_path / f"{name}.jsonl")])
        assert r.exit_code == 0, r.output
        assert len((tmp_path / f"{name}.jsonl").read_text().splitlines()) == 4
    r = runner.invoke(cli, ["train", "--planner", "autoshard", "--config", "masked", "--tasks", str(tmp_path / "train.jsonl"), "--backend", "sim",
                            "--iterations", "2", "--budget", "6", "--out", str(tmp_path / "masked.pt")])
    assert r.exit_code == 0 and "training autoshard (masked config)" in r.output, r.output
    for args, message in [(["--planner", "lookup"], "'lookup' is not a learned planner; choose from autoshard, dreamshard, rnn"),
                          (["--planner", "rnn", "--config", "default"], "planner rnn has no config 'default'; choose from paper")]:
        r = runner.invoke(cli, ["train", *args, "--tasks", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "x.pt")])
        assert r.exit_code == 2 and message in r.output, r.output


# --------------------------------------------------------------------------------------------
# the end of a run: every learned loop's (learned.loop.finished_run, check_training_tasks)
# --------------------------------------------------------------------------------------------


def _dreamshard_train(cfg, *args, **kwargs):
    from dreamshard.learned.dreamshard import train

    return train(cfg, *args, **kwargs)


def _small(name: str):
    if name == "dreamshard":
        from dreamshard.learned.dreamshard import get_config

        return get_config("default", iterations=2, measurements_per_iteration=2, cost_steps=4, cost_batch=4, rl_batches=1, rl_tasks_per_batch=2,
                          rl_episodes_per_task=2, best_of=2)
    return PEERS[name][0].config(iterations=2, measurements_per_iteration=2)


LOOPS = {"autoshard": autoshard.train, "rnn": rnn.train, "dreamshard": _dreamshard_train}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_resume_of_a_finished_run_leaves_the_model_or_recovers_it_from_the_checkpoint(name, tasks, tmp_path):
    train, cfg, train_tasks = LOOPS[name], _small(name), tasks[0][:4]
    out, log = tmp_path / "m.pt", tmp_path / "m.jsonl"
    whole = train(cfg, train_tasks, SimBackend(), out, log=log, progress=False)
    model_bytes, log_text = out.read_bytes(), log.read_text()
    assert getattr(whole, "end_note", None) is None and whole.meta["measurements"] == 4
    # resumed once finished: the model file and the log as they were, the model with its metadata
    again = train(cfg, train_tasks, SimBackend(), out, log=log, resume=True, progress=False)
    assert "already finished" in again.end_note and out.read_bytes() == model_bytes and log.read_text() == log_text
    assert again.meta == whole.meta
    # killed between the last checkpoint and the model save (no model file, or another run's)
    for damage in ("missing", "other"):
        if damage == "missing":
            out.unlink()
        else:
            out.write_bytes(b"another run's file")
        recovered = train(cfg, train_tasks, SimBackend(), out, log=log, resume=True, progress=False)
        assert "from the last checkpoint" in recovered.end_note and log.read_text() == log_text
        saved = torch.load(out, weights_only=True)
        assert saved["meta"] == whole.meta and saved["meta"]["measurements"] == 4
        for key, value in whole.state().items():
            if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
                assert all(torch.equal(value[k], saved[key][k]) for k in value), key


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_tasks_none_of_which_fit_are_refused_before_training(name, tasks, tmp_path):
    from dreamshard.validation import TaskError

    tight = [Task(t.tables, t.devices, 1000, t.workload, t.pool) for t in tasks[0][:3]]
    with pytest.raises(TaskError, match="no training task can be placed"):
        LOOPS[name](_small(name), tight, SimBackend(), tmp_path / "m.pt", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_resume_of_a_finished_run_and_the_refusals_up_front(tmp_path):
    runner = CliRunner()
    for args in (["data", "synth", "--tables", "40", "--out", str(tmp_path / "pool")],
                 ["data", "tasks", "--pool", str(tmp_path / "pool"), "--tables", "4", "--devices", "2", "--max-memory", "5GB", "--num-train", "4", "--num-test", "1", "--out", str(tmp_path)]):
        assert runner.invoke(cli, args).exit_code == 0
    base = ["train", "--tasks", str(tmp_path / "train.jsonl"), "--iterations", "2", "--budget", "4", "--batch-size", "1024"]
    for name in PEERS:
        out = tmp_path / f"{name}.pt"
        assert runner.invoke(cli, [*base, "--planner", name, "--out", str(out)]).exit_code == 0
        before = out.read_bytes()
        r = runner.invoke(cli, [*base, "--planner", name, "--out", str(out), "--resume"])
        assert r.exit_code == 0 and r.exception is None, r.output
        assert f"{out}: this run had already finished (2 iterations, 4 measured plans); the model is left as it was" in r.stdout.splitlines()
        assert out.read_bytes() == before
        # a budget too small for a loop that learns from each iteration's measurements
        r = runner.invoke(cli, ["train", "--planner", name, "--tasks", str(tmp_path / "train.jsonl"), "--iterations", "3", "--budget", "1", "--out", str(tmp_path / "small.pt")])
        assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and "budget 1 is below iterations 3" in r.stderr, r.stderr
    tight = tmp_path / "tight.jsonl"
    tight.write_text("".join(json.dumps({**json.loads(line), "max_memory_bytes": 1000}) + "\n" for line in (tmp_path / "train.jsonl").read_text().splitlines()))
    for name in LOOPS:
        r = runner.invoke(cli, ["train", "--planner", name, "--tasks", str(tight), "--out", str(tmp_path / "tight.pt")])
        assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.stdout, r.stderr)
        assert f"{tight}: no training task can be placed" in r.stderr and not (tmp_path / "tight.pt").exists()


def test_eval_tasks_that_cannot_be_placed_are_refused_before_training(tmp_path):
    """Each eval task is placed and measured after every iteration: one that fits nowhere is
    refused up front, naming its file and place, not after the first iteration's work."""
    runner = CliRunner()
    for args in (["data", "synth", "--tables", "40", "--out", str(tmp_path / "pool")],
                 ["data", "tasks", "--pool", str(tmp_path / "pool"), "--tables", "4", "--devices", "2", "--max-memory", "5GB", "--num-train", "3", "--num-test", "2", "--out", str(tmp_path)]):
        assert runner.invoke(cli, args).exit_code == 0
    lines = (tmp_path / "test.jsonl").read_text().splitlines()
    (tmp_path / "eval.jsonl").write_text(lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "max_memory_bytes": 1000}) + "\n")
    for name in ("rnn", "autoshard"):
        r = runner.invoke(cli, ["train", "--planner", name, "--tasks", str(tmp_path / "train.jsonl"), "--eval-tasks", str(tmp_path / "eval.jsonl"),
                                "--iterations", "1", "--budget", "2", "--out", str(tmp_path / "m.pt")])
        assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.stdout, r.stderr)
        assert f"{tmp_path / 'eval.jsonl'}: eval task 2 of 2 cannot be placed" in r.stderr and not (tmp_path / "m.pt").exists()


def test_autoshard_memory_plots_training_curves_and_refuses_bad_usage(tmp_path):
    """benchmarks/autoshard_memory.py plot: one figure of the logs' reward and overflow curves; a
    bad command line gets its usage line, not a traceback."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "ref_400.jsonl"
    log.write_text("".join(json.dumps({"measurements": 8 * (i + 1), "collect/reward": 0.1 + i / 100, "collect/overflow": 0.2}) + "\n" for i in range(12)))
    done = subprocess.run([sys.executable, "benchmarks/autoshard_memory.py", "plot", str(tmp_path / "c.png"), str(log)], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "benchmarks/autoshard_memory.py", "rf", "400"], cwd=root, capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("usage: autoshard_memory.py") and "Traceback" not in bad.stderr
