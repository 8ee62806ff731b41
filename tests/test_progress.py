"""Progress that says how long: the CLI's lines off a terminal, training's estimate up front and its
time left, the threads a training run takes, and the rank correlation the training log reports."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dreamshard import progress
from dreamshard.learned import loop


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_clock():
    assert [progress.clock(s) for s in (0, 7, 83, 3723, -1)] == ["0:00", "0:07", "1:23", "1:02:03", "0:00"]


def test_lines_say_nothing_for_a_quick_stage_then_a_line_with_the_time_left_and_one_at_its_end():
    out, now = io.StringIO(), FakeClock()
    with progress.Lines(out, every=10, now=now) as bar:
        quick = bar.add_task("quick", total=3)
        for _ in range(3):
            now.t += 1
            bar.advance(quick)
        assert out.getvalue() == ""  # a stage under 10 s: nothing, so a refused command keeps its one line
        job = bar.add_task("planning and pricing", total=40)
        now.t += 12
        bar.advance(job, 12)  # 12 of 40 in 12 s: 28 left at 1 s each
        assert out.getvalue() == "planning and pricing: 12/40, 0:12 elapsed, about 0:28 left\n"
        now.t += 5
        bar.advance(job, 5)  # under 10 s since the last line
        assert out.getvalue().count("\n") == 1
        search = bar.add_task("search", total=None)
        now.t += 11
        bar.update(search, completed=3)  # no total: a count, no time left
        assert out.getvalue().splitlines()[-1] == "search: 3, 0:11 elapsed"
        now.t += 23
        bar.advance(job, 23)
    assert out.getvalue().splitlines()[-2:] == ["planning and pricing: 40/40, done in 0:51", "search: 3, 0:34 elapsed"]


def test_remaining_is_the_rate_so_far():
    assert progress.remaining(0, 10, 5.0) is None and progress.remaining(3, None, 5.0) is None
    assert progress.remaining(4, 10, 8.0) == pytest.approx(12.0)


def test_training_progress_off_a_terminal_is_a_line_per_iteration_with_the_time_left():
    out = io.StringIO()
    bar = loop.Progress(True, 3, 0, {"collect/measured_ms": "measured"}, estimate_s=90.0, stream=out)
    for it in range(3):
        bar.phase(it, "measuring")
        bar.done(it, {"collect/measured_ms": 4.25, "eval/mean_ms": float("nan")})
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("estimated time: about 1:30 for 3 iterations")
    assert re.fullmatch(r"iteration 1/3 done in 0:00 · measured 4\.250 ms · 0:00 elapsed(, about 0:00 left)?", lines[1]), lines[1]
    assert lines[3].startswith("iteration 3/3 done") and "left" not in lines[3] and len(lines) == 4


def test_training_time_left_follows_the_iterations_done_less_the_current_one():
    bar = loop.Progress(False, 10, 2, {}, estimate_s=80.0)
    now = FakeClock()
    bar.now, bar.t0, bar.it_start = now, now.t, now.t
    now.t += 20
    assert bar.remaining() == pytest.approx(60.0)  # the estimate, less the time spent
    bar.phase(2, "measuring")
    now.t += 6
    bar.done(2, {})  # one iteration of 6 s; 7 to go
    assert bar.remaining() == pytest.approx(42.0)
    bar.phase(3, "measuring")
    now.t += 4
    assert bar.remaining() == pytest.approx(38.0)  # it moves within an iteration


def test_spearman_is_scipys():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    for n in (3, 7, 50):
        a, b = rng.integers(0, 5, n).astype(float), rng.normal(size=n)  # ties in a
        assert loop.spearman(a, b) == pytest.approx(float(spearmanr(a, b).statistic), abs=1e-12)
    assert np.isnan(loop.spearman(np.ones(5), np.arange(5.0))) and np.isnan(loop.spearman(np.arange(2.0), np.arange(2.0)))
    assert np.isnan(loop.spearman(np.array([1.0, np.nan, 3.0]), np.arange(3.0)))


# --------------------------------------------------------------------------------------------
# a training run's estimate and threads
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def one_thread():
    """Small nets on a shared machine: a second thread only spins (see cli.training_threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from cli_helpers import small_pool

    from dreamshard.synth import load_pool
    from dreamshard.tasks import sample_tasks, split_pool

    pool = small_pool(tmp_path_factory, 120, 0)
    train_half, _ = split_pool(load_pool(pool), 0)
    return sample_tasks(train_half, 4, (8, 12), 2, 10**12, seed=2, pool=str(pool))


def tiny_config():
    from dreamshard.learned.dreamshard import get_config

    return get_config("default", iterations=2, measurements_per_iteration=3, cost_steps=5, cost_batch=8, rl_batches=2, rl_episodes_per_task=3, best_of=2)


def test_the_estimate_times_every_phase_and_leaves_the_run_as_it_would_be(tasks, tmp_path):
    from dreamshard.costs.sim import SimBackend
    from dreamshard.learned.dreamshard import create_model, estimate_seconds, time_steps, train
    from dreamshard.learned.mdp import cut_set, prepare

    cfg = tiny_config()
    model = create_model(cfg, tasks, SimBackend())
    prepared = [prepare(t, cfg.normalization, cfg.linear_features, model.kernel) for t in tasks]
    before = {k: v.clone() for k, v in model.cost_net.state_dict().items()}
    steps = time_steps(cfg, model, tasks, prepared, [cut_set(t, model) for t in tasks], SimBackend(), tasks[:1])
    assert set(steps) == {"sample", "measure", "cost_step", "rl_batch", "eval_task"} and all(v > 0 for v in steps.values())
    assert all(torch.equal(before[k], v) for k, v in model.cost_net.state_dict().items())
    whole = estimate_seconds(cfg, steps, 0, eval_tasks=1)
    assert whole > estimate_seconds(cfg, steps, 1, eval_tasks=1) > 0 and estimate_seconds(cfg, steps, 2) == 0
    # the probe runs only with progress on: both runs log the same numbers
    logs = []
    for shown in (True, False):
        log = tmp_path / f"log{shown}.jsonl"
        train(cfg, tasks, SimBackend(), tmp_path / f"m{shown}.pt", log=log, progress=shown)
        logs.append([{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in log.read_text().splitlines()])
    assert logs[0] == logs[1]


def test_training_takes_one_thread_unless_told(monkeypatch):
    from dreamshard.cli import training_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(3)
    assert training_threads(None, cpu_kernel=False) == 1 == torch.get_num_threads()
    assert training_threads(2, cpu_kernel=False) == 2 == torch.get_num_threads()
    torch.set_num_threads(3)
    assert training_threads(None, cpu_kernel=True) == 3  # a kernel measured on the CPU keeps torch's threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert training_threads(None, cpu_kernel=False) == 3


def test_cli_train_off_a_terminal_says_how_long(tasks, tmp_path):
    from dreamshard.cli import cli
    from dreamshard.tasks import save_tasks

    save_tasks(tasks, tmp_path / "train.jsonl")
    r = CliRunner().invoke(cli, ["train", "--tasks", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "m.pt"), "--iterations", "2", "--budget", "4",
                                 "--config", "paper"])
    assert r.exit_code == 0, r.output
    assert "measured plans, 1 CPU thread" in r.stdout
    lines = r.stderr.splitlines()
    assert lines[0].startswith("estimated time: about ") and lines[1].startswith("iteration 1/2 done in ") and lines[2].startswith("iteration 2/2 done in ")
    assert "left" in lines[1] and "elapsed" in lines[2]


def test_planning_commands_take_one_thread_without_importing_torch_for_it(tasks, tmp_path):
    """plan, compare and demo: torch (where a learned planner loads it) at one thread, set through
    $OMP_NUM_THREADS before it loads, so a heuristic's plan still never imports it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from dreamshard.tasks import save_tasks

    save_tasks(tasks, tmp_path / "t.jsonl")
    code = ("import os, sys\nfrom dreamshard.cli import cli\ntry:\n    cli(sys.argv[1:], prog_name='dreamshard')\nexcept SystemExit:\n    pass\n"
            "torch = sys.modules.get('torch')\nprint(os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads() if torch else 'no torch', file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for args, expected in ((["plan", "--tasks", tmp_path / "t.jsonl", "--planner", "lookup", "--out", tmp_path / "p.jsonl", "--quiet"], "1 no torch"),
                           (["compare", "--tasks", tmp_path / "t.jsonl", "--planners", "lookup,dreamshard", "--quiet"], "1 1")):
        p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env, timeout=240)
        assert p.stderr.strip().splitlines()[-1] == expected, p.stderr
