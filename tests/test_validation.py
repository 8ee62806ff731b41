"""The validation layer: exit statuses, one-line errors, limits, model/checkpoint/DLRM
files, the atomic writer, and which worker a failed measurement names."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import torch

from dreamshard import validation
from dreamshard.cli import cli
from dreamshard.costs.runners.distributed import failure_message
from dreamshard.files import atomic_write, remove_stale_temps
from dreamshard.learned.nets import DreamShardModel
from dreamshard.validation import DataError, InputError, ModelError, check_dlrm_file, parse_float, parse_int
from cli_helpers import invoke, one_line_error, small_pool

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    return small_pool(tmp_path_factory, 6, 2)


# --------------------------------------------------------------------------------------------
# Exit statuses
# --------------------------------------------------------------------------------------------


def _command_paths(group: click.Group, prefix=()):
    yield prefix
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _command_paths(cmd, prefix + (name,))
        else:
            yield prefix + (name,)


@pytest.mark.parametrize("path", list(_command_paths(cli)), ids=lambda p: " ".join(p) or "dreamshard")
def test_help_exits_0_on_every_command(path):
    for flag in ("--help", "-h"):
        r = invoke(*path, flag)
        assert r.exit_code == 0 and "Usage:" in r.stdout and r.stderr == "", (path, r.stderr)


def test_version_and_bare_group_exit_0():
    r = invoke("--version")
    assert r.exit_code == 0 and "version" in r.stdout
    r = invoke("data")
    assert r.exit_code == 0 and "Usage:" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["plan", "--bogus"], "No such option '--bogus'"),
    (["plan", "--devices", "2"], "Missing option '--out'"),
    (["nope"], "No such command 'nope'"),
    (["plan", "--devices", "x", "--out", "o.json"], "'x' is not a valid integer"),
    (["plan", "--devices", "2000", "--out", "o.json"], "2000 is not in the range 1<=x<=1024"),
    (["measure", "no_such_plan.json"], "does not exist"),
    (["measure", "--timeout", "nan", "p.json"], "nan is not a number"),
])
def test_usage_errors_are_one_line_exit_2(args, needle):
    assert needle in one_line_error(invoke(*args))


def test_a_bug_keeps_its_traceback(pool, tmp_path, monkeypatch):
    """Only typed input errors become one line: any other exception is a bug and propagates."""
    from dreamshard.planners import PLANNERS

    def broken(self, task):
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(PLANNERS["size"], "plan", broken)
    r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--planner", "size", "--out", tmp_path / "o.json")
    assert isinstance(r.exception, ValueError) and not isinstance(r.exception, InputError) and r.exit_code == 1
    assert not (tmp_path / "o.json").exists()


# --------------------------------------------------------------------------------------------
# Field parsers and limits
# --------------------------------------------------------------------------------------------


def test_parse_int_is_exact_and_strict():
    assert parse_int("9223372036854775807", "f", "k", 0) == 2**63 - 1  # not rounded through a float
    assert parse_int("12", "f", "k", 1) == parse_int(12.0, "f", "k", 1) == parse_int("1e1", "f", "k", 1) + 2 == 12
    for bad, needle in [(2.7, "not an integer"), (True, "true is not a number"), (None, "null is not a number"), ("nan", "not an integer"),
                        ("1e30", "over the limit of 1,000"), ([], "is not a number"), ("", "is not a number"), (-1, "must be >= 0")]:
        with pytest.raises(InputError, match=re.escape(needle)):
            parse_int(bad, "f", "k", 0, 1000)
    assert parse_float("0.5", "f", "k") == 0.5
    for bad in ("nan", "inf", float("nan"), 10**400, "-1", False):
        with pytest.raises(InputError):
            parse_float(bad, "f", "k", 0.0, 100.0)


def test_limits_are_documented():
    usage = (ROOT / "docs" / "usage.md").read_text()
    section = usage[usage.index("## Limits"):usage.index("## Scale")]
    for needle in ("1,024", "100,000", "10^12", "4 – 1,024", "10,000", "10^15", "2^22", "2^63", "10,000,000", "7 days", "4 GiB"):
        assert needle in section, needle
    assert validation.MAX_DEVICES == 1024 and validation.MAX_TABLES == 100_000 and validation.MAX_ROWS == 10**12 and validation.MAX_DIM == 1024
    assert validation.MAX_MEMORY_BYTES == 10**15 and validation.MAX_BATCH_SIZE == 2**22 and validation.MAX_CHUNK_BYTES == 4 * 2**30


def test_absurd_sizes_are_refused_up_front(pool, tmp_path):
    plan = tmp_path / "p.json"
    assert invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", plan).exit_code == 0
    d = json.loads(plan.read_text())
    for key, value in (("devices", 10**9), ("max_memory_bytes", 10**18)):
        bad = tmp_path / f"{key}.json"
        bad.write_text(json.dumps({**d, key: value}))
        t = time.process_time()  # CPU time: refused up front, not after sizing 10^9 devices; a busy machine does not count
        line = one_line_error(invoke("measure", bad, "--backend", "sim"))
        assert time.process_time() - t < 5 and f"'{key}'" in line and "over the limit" in line
    r = invoke("measure", plan, "--backend", "sim", "--batch-size", 2**30)
    assert "4194304" in one_line_error(r)


# --------------------------------------------------------------------------------------------
# Model files, checkpoints, DLRM files
# --------------------------------------------------------------------------------------------


def test_model_file_missing_keys_or_unreadable(pool, tmp_path):
    good = DreamShardModel.create(False, "fixed").state()
    cases = {
        "missing.pt": {k: v for k, v in good.items() if k != "policy"},
        "shapes.pt": {**good, "cost_net": {k: torch.zeros(3, 3) for k in good["cost_net"]}},
        "types.pt": {**good, "best_of": "many"},
        "list.pt": [1, 2, 3],
    }
    for name, obj in cases.items():
        torch.save(obj, tmp_path / name)
    (tmp_path / "text.pt").write_text("not a model\n" * 5)
    for name, needle in (("missing.pt", "missing key 'policy'"), ("shapes.pt", "key 'cost_net': does not fit"), ("types.pt", "key 'best_of'"),
                         ("list.pt", "not a dreamshard.model/1 file"), ("text.pt", "cannot read this model file")):
        with pytest.raises(ModelError, match=re.escape(needle)):
            DreamShardModel.load(tmp_path / name)
        r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--planner", "dreamshard", "--model", tmp_path / name, "--out", tmp_path / "o.json")
        assert needle in one_line_error(r) and str(tmp_path / name) in r.stderr
    assert not (tmp_path / "o.json").exists()


def test_checkpoint_that_is_not_ours(pool, tmp_path):
    from dreamshard.tasks import sample_tasks, save_tasks, split_pool
    from dreamshard.tables import load_tables

    tables = load_tables(pool / "tables.csv")
    save_tasks(sample_tasks(split_pool(tables, 0)[0], 2, (2, 3), 2, 10**13, seed=1, pool=str(pool)), tmp_path / "train.jsonl")
    from dreamshard.learned.dreamshard import CHECKPOINT_FORMAT

    ckpt = tmp_path / "m.pt.ckpt"
    cases = [([1, 2], "not a dreamshard checkpoint"), ({"format": CHECKPOINT_FORMAT}, "missing key 'config'"),
             ({"format": CHECKPOINT_FORMAT, "config": [], "tasks": []}, "key 'config': expected a dict"), (None, "cannot read this checkpoint file")]
    for obj, needle in cases:
        if obj is None:
            ckpt.write_text("garbage")
        else:
            torch.save(obj, ckpt)
        r = invoke("train", "--tasks", tmp_path / "train.jsonl", "--out", tmp_path / "m.pt", "--iterations", 1, "--budget", 1, "--resume")
        assert needle in one_line_error(r) and str(ckpt) in r.stderr
    assert not (tmp_path / "m.pt").exists()


def _dlrm(path: Path, indices, offsets, lengths) -> Path:
    torch.save((indices, offsets, lengths), path)
    return path


def test_dlrm_files_negative_or_float_indices_refused(tmp_path):
    ok = _dlrm(tmp_path / "ok.pt", torch.tensor([0, 5, 3, 3]), torch.tensor([0, 1, 2, 3, 4]), torch.tensor([[1, 1], [1, 1]]))
    check_dlrm_file(ok)
    r = invoke("data", "dlrm", ok, "--out", tmp_path / "pool", "--dim", 8)
    assert r.exit_code == 0, r.stderr
    rows = (tmp_path / "pool" / "tables.csv").read_text().splitlines()[1:]
    assert [int(line.split(",")[1]) for line in rows] == [6, 4]  # rows = max index + 1
    cases = [
        ("neg.pt", (torch.tensor([1, -18, 3, 0]), torch.tensor([0, 1, 2, 3, 4]), torch.tensor([[1, 1], [1, 1]])), "index -18 at position 1 is negative"),
        ("float.pt", (torch.tensor([1.5, 2.7, 3.0, 0.0]), torch.tensor([0, 1, 2, 3, 4]), torch.tensor([[1, 1], [1, 1]])), "indices are float32, not integers"),
        ("offsets.pt", (torch.tensor([1, 2, 3, 0]), torch.tensor([0, 1, 2, 4]), torch.tensor([[1, 1], [1, 1]])), "offsets"),
        ("back.pt", (torch.tensor([1, 2, 3, 0]), torch.tensor([0, 3, 2, 3, 4]), torch.tensor([[3, -1], [1, 1]])), "must not decrease"),
        ("lengths.pt", (torch.tensor([1, 2, 3, 0]), torch.tensor([0, 1, 2, 3, 4]), torch.tensor([[2, 0], [1, 1]])), "lengths differ"),
        ("dims.pt", (torch.tensor([1, 2]), torch.tensor([0, 1, 2]), torch.tensor([1, 1])), "lengths must have 2 dimensions"),
    ]
    for name, data, needle in cases:
        path = _dlrm(tmp_path / name, *data)
        with pytest.raises(DataError, match=re.escape(needle)):
            check_dlrm_file(path)
        out = tmp_path / f"out_{name}"
        line = one_line_error(invoke("data", "dlrm", path, "--out", out))
        assert needle in line and str(path) in line and not out.exists()
    (tmp_path / "junk.pt.gz").write_bytes(b"\x1f\x8b not really gzip")
    assert "cannot read this DLRM dataset file" in one_line_error(invoke("data", "dlrm", tmp_path / "junk.pt.gz", "--out", tmp_path / "o"))


# --------------------------------------------------------------------------------------------
# The atomic writer
# --------------------------------------------------------------------------------------------


def test_atomic_write_cleans_up_after_a_failure(tmp_path):
    target = tmp_path / "m.pt"
    atomic_write(target, "old")

    def fails(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fails)
    assert target.read_text() == "old" and not list(tmp_path.glob("m.pt.tmp*"))


def start_stuck_writer(target: Path, setup: str = "") -> tuple[subprocess.Popen, Path]:
    """A process whose atomic_write of `target` hangs mid-write (after running `setup`), and the
    temporary file it is writing, once that exists."""
    code = (f"import sys, time; from dreamshard.files import atomic_write; {setup}"
            "atomic_write(sys.argv[1], lambda f: (f.write(b'partial'), f.flush(), time.sleep(60)))")
    p = subprocess.Popen([sys.executable, "-c", code, str(target)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    temp = target.with_name(f"{target.name}.tmp{p.pid}")
    for _ in range(200):
        if temp.exists():
            break
        time.sleep(0.05)
    assert temp.exists()
    return p, temp


def test_temp_file_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """A checkpoint write killed outright (SIGKILL) leaves NAME.tmp<pid>; the next write removes it."""
    target = tmp_path / "m.pt.ckpt"
    p, temp = start_stuck_writer(target)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert temp.exists() and not target.exists()  # the killed write left its temporary file
    live = tmp_path / f"m.pt.ckpt.tmp{os.getppid()}"  # a live writer's temp file is left alone
    live.write_text("in progress")
    atomic_write(target, b"checkpoint")
    assert target.read_bytes() == b"checkpoint" and not temp.exists() and live.exists()
    assert remove_stale_temps(target) == []


def test_sigterm_during_a_write_leaves_no_temp_file(tmp_path):
    target = tmp_path / "m.pt"
    p, temp = start_stuck_writer(target, "from dreamshard.cli import exit_on_sigterm; exit_on_sigterm(); ")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=300) == 128 + signal.SIGTERM
    assert not temp.exists() and not target.exists()


def test_output_path_under_a_regular_file(pool, tmp_path):
    (tmp_path / "file").write_text("x")
    for args in (["plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", tmp_path / "file" / "p.json"],
                 ["data", "synth", "--tables", 2, "--out", tmp_path / "file" / "pool"],
                 ["data", "tasks", "--pool", pool, "--tables", 1, "--devices", 1, "--max-memory", "10TB", "--out", tmp_path / "file"]):
        assert "is a file, not a folder" in one_line_error(invoke(*args))


# --------------------------------------------------------------------------------------------
# Which worker a failed measurement names
# --------------------------------------------------------------------------------------------


def test_killed_worker_is_named_not_the_peer_that_lost_it(tmp_path):
    """Worker 1 is killed; worker 0 then raises 'connection closed', stamped *before* the launcher
    noticed worker 1 was gone. The message names worker 1."""
    now = time.time()
    (tmp_path / "rank0.err").write_text(json.dumps({"time": now - 0.05, "error": "RuntimeError: Connection closed by peer [127.0.0.1]:1234"}))
    msg = failure_message([(0, 1), (1, -signal.SIGKILL)], 2, tmp_path, {0: now, 1: now})
    assert "worker 1 of 2 was killed by SIGKILL" in msg and "1 other worker failed after it" in msg
    # a worker that raised first, alone, is named with its error
    msg = failure_message([(0, 1)], 2, tmp_path, {0: now})
    assert msg.startswith("measurement failed: worker 0 of 2 raised RuntimeError: Connection closed")
    # of two that raised, the earlier one
    (tmp_path / "rank1.err").write_text(json.dumps({"time": now - 1.0, "error": "ValueError: the real cause"}))
    assert "worker 1 of 2 raised ValueError: the real cause" in failure_message([(0, 1), (1, 1)], 2, tmp_path, {0: now, 1: now})
