"""One checkpoint, one run: `MODEL.pt.ckpt` (learned.loop.Checkpoint) is never replaced by a new
run while its own run is unfinished, never resumed by a run of other tasks, backend or planner,
never shared by two runs at once, and never one of a command's other files."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from cli_helpers import invoke, one_line_error
from dreamshard.costs.sim import Calibration, SimBackend
from dreamshard.learned import autoshard, rnn
from dreamshard.learned.loop import Checkpoint
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tasks import Workload, sample_tasks
from dreamshard.validation import ModelError, OptionError


def _dreamshard_train(cfg, *args, **kwargs):
    from dreamshard.learned.dreamshard import train

    return train(cfg, *args, **kwargs)


def _config(name: str, **overrides):
    if name == "dreamshard":
        from dreamshard.learned.dreamshard import get_config

        return get_config("default", iterations=2, measurements_per_iteration=2, cost_steps=4, cost_batch=4, rl_batches=1, rl_tasks_per_batch=2,
                          rl_episodes_per_task=2, best_of=2, **overrides)
    from dreamshard.planners import PLANNERS

    return PLANNERS[name].config(iterations=2, measurements_per_iteration=2, **overrides)


LOOPS = {"autoshard": autoshard.train, "rnn": rnn.train, "dreamshard": _dreamshard_train}


@pytest.fixture(scope="module")
def tasks():
    return sample_tasks(synth_pool(PoolConfig(tables=60, seed=0)), 4, (6, 8), 2, 5 * 10**9, seed=3)


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_new_run_never_replaces_the_checkpoint_of_an_unfinished_one(name, tasks, tmp_path):
    train, cfg, out = LOOPS[name], _config(name), tmp_path / "m.pt"
    ckpt = tmp_path / "m.pt.ckpt"
    train(cfg, tasks, SimBackend(), out, progress=False, stop_after=1)  # "killed" after its first iteration
    before = ckpt.read_bytes()
    for other in sorted(LOOPS):  # a new run of any planner, with any options
        with pytest.raises(OptionError, match=rf"m\.pt\.ckpt holds an unfinished {name} training run \(1 of 2 iterations done\): continue it with --resume") as e:
            LOOPS[other](_config(other, seed=7), tasks, SimBackend(), out, progress=False)
        assert "\n" not in str(e.value)
    assert ckpt.read_bytes() == before and not out.exists()
    # resumed by another planner: its checkpoint is named, not a generic "not a checkpoint"
    other = "rnn" if name != "rnn" else "autoshard"
    with pytest.raises(ModelError, match=f"the checkpoint of a {name} training run, not of this planner's"):
        LOOPS[other](_config(other), tasks, SimBackend(), out, progress=False, resume=True)
    if name != "rnn":  # the rest is the loops' shared code (learned.loop): one planner's run shows it
        return
    # the run itself continues; once finished, a new run (other options) may replace it, as it replaces the model
    train(cfg, tasks, SimBackend(), out, progress=False, resume=True)
    assert torch.load(ckpt, weights_only=True)["iteration"] == 2
    model = train(_config(name, seed=7), tasks, SimBackend(), out, progress=False)
    assert model.meta["config"]["seed"] == 7 and torch.load(ckpt, weights_only=True)["config"]["seed"] == 7


def test_a_file_that_is_no_checkpoint_is_never_replaced(tasks, tmp_path):
    out, ckpt = tmp_path / "m.pt", tmp_path / "m.pt.ckpt"
    for content, needle in ((b"somebody's notes", "cannot read this checkpoint file"), (None, "not a training checkpoint")):
        if content is None:
            torch.save({"format": "something else", "iteration": 9}, ckpt)
            content = ckpt.read_bytes()
        else:
            ckpt.write_bytes(content)
        with pytest.raises(OptionError, match=needle) as e:
            rnn.train(_config("rnn"), tasks, SimBackend(), out, progress=False)
        assert "move it or give another --out" in str(e.value) and ckpt.read_bytes() == content and not out.exists()


def test_resume_refuses_tasks_of_the_same_names_with_other_numbers_and_another_calibration(tasks, tmp_path):
    out, cfg = tmp_path / "m.pt", _config("rnn")
    rnn.train(cfg, tasks, SimBackend(), out, progress=False, stop_after=1)
    before = (tmp_path / "m.pt.ckpt").read_bytes()
    variants = {
        "devices": [dataclasses.replace(t, devices=t.devices + 1) for t in tasks],
        "memory": [dataclasses.replace(t, max_memory_bytes=t.max_memory_bytes - 1) for t in tasks],
        "rows": [dataclasses.replace(t, tables=[dataclasses.replace(t.tables[0], rows=t.tables[0].rows + 1), *t.tables[1:]]) for t in tasks],
    }
    for what, changed in variants.items():
        with pytest.raises(OptionError, match="the same tables by name, but other table numbers, devices, memory or workload"):
            rnn.train(cfg, changed, SimBackend(), out, progress=False, resume=True)
    # another calibration under the same name (one machine, one day): not the measurements of this run
    calibration = Calibration.load()
    other = dataclasses.replace(calibration, fwd={k: v * 1.5 for k, v in calibration.fwd.items()})
    assert SimBackend(other).name == SimBackend().name
    with pytest.raises(OptionError, match="another calibration of"):
        rnn.train(cfg, tasks, SimBackend(other), out, progress=False, resume=True)
    assert (tmp_path / "m.pt.ckpt").read_bytes() == before
    # a pool moved elsewhere holds the same tables: the run continues
    moved = [dataclasses.replace(t, pool="/elsewhere") for t in tasks]
    assert rnn.train(cfg, moved, SimBackend(), out, progress=False, resume=True).meta["iterations_done"] == 2


class Intruder(SimBackend):
    """The simulator, and another run writing the same checkpoint: on its `at`-th plan it replaces
    the checkpoint file (atomically, as every run writes it)."""

    def __init__(self, ckpt, at: int):
        super().__init__()
        self.ckpt, self.at, self.calls = ckpt, at, 0

    def evaluate(self, shards, workload=Workload()):
        self.calls += 1
        if self.calls == self.at:
            tmp = self.ckpt.with_name("intruder.tmp")
            torch.save({"format": "dreamshard.rnn-checkpoint/1", "from": "another run"}, tmp)
            os.replace(tmp, self.ckpt)
        return super().evaluate(shards, workload)


@pytest.mark.parametrize("at", [1, 3])  # before its first checkpoint (the file then new), after it
def test_a_run_whose_checkpoint_another_process_replaced_stops_without_its_model(tasks, tmp_path, at):
    out, ckpt = tmp_path / "m.pt", tmp_path / "m.pt.ckpt"
    with pytest.raises(OptionError, match="replaced by another process while this run trained") as e:
        rnn.train(_config("rnn"), tasks, Intruder(ckpt, at), out, progress=False)
    assert "give each run its own --out" in str(e.value) and "\n" not in str(e.value)
    assert torch.load(ckpt, weights_only=True)["from"] == "another run" and not out.exists()


def test_the_checkpoint_path_is_checked_before_any_work(tasks, tmp_path):
    (tmp_path / "d.pt.ckpt").mkdir()
    with pytest.raises(OptionError, match=r"d\.pt\.ckpt \(the checkpoint of --out .*d\.pt\): is a folder"):
        rnn.train(_config("rnn"), tasks, SimBackend(), tmp_path / "d.pt", progress=False)
    long = tmp_path / ("x" * 252)  # the model's name fits in 255 bytes, its checkpoint's does not
    with pytest.raises(OptionError, match="a name of 257 bytes"):
        rnn.train(_config("rnn"), tasks, SimBackend(), long, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pt.ckpt"]


def test_cli_refuses_a_checkpoint_that_is_another_file_of_the_command(tmp_path):
    assert invoke("data", "synth", "--tables", "40", "--out", tmp_path / "pool").exit_code == 0
    assert invoke("data", "tasks", "--pool", tmp_path / "pool", "--tables", "4", "--devices", "2", "--max-memory", "5GB", "--num-train", "4",
                  "--num-test", "1", "--out", tmp_path).exit_code == 0
    tasks_text = (tmp_path / "train.jsonl").read_text()
    (tmp_path / "m.pt.ckpt").write_text(tasks_text)  # a task file that happens to have the checkpoint's name
    base = ["train", "--planner", "rnn", "--iterations", "2", "--budget", "4"]
    cases = [
        (["--tasks", tmp_path / "m.pt.ckpt", "--out", tmp_path / "m.pt"], "(which also writes {ckpt}): the same file as --tasks {ckpt}, which this command reads"),
        (["--tasks", tmp_path / "train.jsonl", "--eval-tasks", tmp_path / "m.pt.ckpt", "--out", tmp_path / "m.pt"], "the same file as --eval-tasks {ckpt}"),
        (["--tasks", tmp_path / "train.jsonl", "--log", tmp_path / "n.pt.ckpt", "--out", tmp_path / "n.pt"], "the same file as --out {out}.ckpt, which this command also writes"),
    ]
    for args, needle in cases:
        out = args[args.index("--out") + 1]
        r = invoke(*base, *args)
        assert needle.format(ckpt=tmp_path / "m.pt.ckpt", out=out) in one_line_error(r), r.stderr
    # a link in the checkpoint's place that points at the model (or at the task file) is the same file
    os.symlink(tmp_path / "l.pt", tmp_path / "l.pt.ckpt")
    r = invoke(*base, "--tasks", tmp_path / "train.jsonl", "--out", tmp_path / "l.pt")
    assert "the same file as --out" in one_line_error(r)
    os.symlink(tmp_path / "train.jsonl", tmp_path / "k.pt.ckpt")
    r = invoke(*base, "--tasks", tmp_path / "train.jsonl", "--out", tmp_path / "k.pt")
    assert "the same file as --tasks" in one_line_error(r)
    # the checkpoint's own place: a FIFO
    os.mkfifo(tmp_path / "f.pt.ckpt")
    r = invoke(*base, "--tasks", tmp_path / "train.jsonl", "--out", tmp_path / "f.pt")
    assert "f.pt.ckpt, written beside it, is a FIFO" in one_line_error(r)
    assert (tmp_path / "m.pt.ckpt").read_text() == tasks_text and (tmp_path / "train.jsonl").read_text() == tasks_text
    assert not any((tmp_path / n).exists() for n in ("m.pt", "n.pt", "l.pt", "k.pt", "f.pt", "n.pt.ckpt"))
    # an unfinished run's checkpoint: a new run says so in one line, --resume finishes it
    assert invoke(*base, "--tasks", tmp_path / "train.jsonl", "--out", tmp_path / "r.pt").exit_code == 0
    ck = torch.load(tmp_path / "r.pt.ckpt", weights_only=True)
    torch.save({**ck, "iteration": 1}, tmp_path / "r.pt.ckpt")
    r = invoke(*base, "--seed", "3", "--tasks", tmp_path / "train.jsonl", "--out", tmp_path / "r.pt")
    assert "holds an unfinished rnn training run (1 of 2 iterations done)" in one_line_error(r)
    assert torch.load(tmp_path / "r.pt.ckpt", weights_only=True)["config"]["seed"] == 0
