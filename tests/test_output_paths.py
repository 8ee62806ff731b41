"""Output paths that cannot destroy (issue 34): an `--out` that is an input of the command, not a
regular file (FIFO, device node, folder), a name the filesystem cannot hold, or a path ending in
"/" is refused with one line and exit status 2 before any work; every write failure (torch's zip
writer on a full disk included) is one line, and the old file stays as it was."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dreamshard import files
from dreamshard.cli import cli
from dreamshard.files import atomic_write
from dreamshard.validation import OptionError
from cli_helpers import invoke, one_line_error, small_pool

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    return small_pool(tmp_path_factory, 6, 3)


@pytest.fixture()
def plan_file(pool, tmp_path) -> Path:
    out = tmp_path / "p.json"
    r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", out)
    assert r.exit_code == 0, r.stderr
    return out


def test_out_that_is_an_input_is_refused_and_the_input_kept(pool, plan_file, tmp_path):
    tables = tmp_path / "t.csv"
    tables.write_bytes((pool / "tables.csv").read_bytes())
    link = tmp_path / "link.csv"
    link.symlink_to(tables)
    plan_text = plan_file.read_text()
    cases = [
        (["plan", tables, "--devices", 2, "--max-memory", "10TB", "--out", tables], tables),
        (["plan", tables, "--devices", 2, "--max-memory", "10TB", "--out", link], tables),  # the same file through a link
        (["measure", plan_file, "--backend", "sim", "--out", plan_file], plan_file),
        (["export", "torchrec", plan_file, "--out", plan_file], plan_file),
    ]
    for args, victim in cases:
        before = victim.read_bytes()
        line = one_line_error(invoke(*args))
        assert "the same file as" in line and "which this command reads" in line, line
        assert victim.read_bytes() == before
    assert plan_file.read_text() == plan_text


def test_two_outputs_of_one_command_that_are_one_file_are_refused(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("{}\n")
    line = one_line_error(invoke("train", "--tasks", tasks, "--out", tmp_path / "m.pt", "--log", tmp_path / "m.pt"))
    assert "--log" in line and "also writes" in line and not (tmp_path / "m.pt").exists()


def test_out_onto_a_fifo_a_device_a_folder_a_long_name_or_a_trailing_slash(pool, tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    # a private device node, never /dev/null itself: a regressed writer run as root would replace it
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        device = fifo  # not root: no device node can be made (nor replaced)
    for out, needle in ((fifo, "is a FIFO, not a regular file"), (device, "is a device node" if device != fifo else "is a FIFO"),
                        (tmp_path / "folder", "is a folder"), (tmp_path / ("x" * 256), "over the limit of 255 bytes"),
                        (f"{tmp_path}/x.json/", "ends in '/'")):
        line = one_line_error(invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", out))
        assert needle in line, line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and (device == fifo or stat.S_ISCHR(os.stat(device).st_mode))
    assert not (tmp_path / "x.json").exists()


def test_a_long_name_that_fits_is_written(pool, tmp_path):
    """A name of 250 bytes is legal: its temporary file must not push it over the limit."""
    out = tmp_path / ("p" * 245 + ".json")
    r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", out)
    assert r.exit_code == 0, r.stderr
    assert json.loads(out.read_text())["devices"] == 2 and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_writers_without_an_out_option_refuse_a_fifo_too(tmp_path):
    """The atomic writer itself refuses: `data synth --out DIR` writes DIR/tables.csv."""
    os.mkfifo(tmp_path / "tables.csv")
    line = one_line_error(invoke("data", "synth", "--tables", 2, "--out", tmp_path))
    assert "tables.csv: is a FIFO" in line and stat.S_ISFIFO(os.stat(tmp_path / "tables.csv").st_mode)
    with pytest.raises(OptionError, match="is a FIFO"):
        atomic_write(tmp_path / "tables.csv", "x")


def test_full_disk_under_torch_save_is_one_line_and_the_old_file_kept(tmp_path, monkeypatch):
    """torch's zip writer turns the OSError of a full disk into a RuntimeError of its own: the
    atomic writer still reports the write failure as one OptionError, and the old file stays."""
    target = tmp_path / "m.pt"
    atomic_write(target, b"old model")

    class FullDisk:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, b):
            if self.written + len(b) > 64:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(b)
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(files, "open", lambda p, mode: FullDisk(open(p, mode)), raising=False)
    with pytest.raises(OptionError, match=r"m\.pt: cannot write \(No space left on device\)"):
        atomic_write(target, lambda f: torch.save({"w": torch.zeros(1000)}, f))
    assert target.read_bytes() == b"old model" and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_subprocess_fifo_acceptance(pool, tmp_path):
    """The issue's acceptance: one line, exit 2, the FIFO still a FIFO."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    script = Path(sys.executable).with_name("dreamshard")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "dreamshard.cli"]
    p = subprocess.run([*cmd, "plan", str(pool / "tables.csv"), "--devices", "2", "--max-memory", "1GB", "--out", str(fifo)],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "is a FIFO" in p.stderr, p.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_training_log_that_cannot_grow_is_one_line(tmp_path, monkeypatch):
    """The log grows by a line an iteration (appended, not rewritten): a full disk there is the
    same one-line error, and the lines before it stay."""
    from dreamshard.learned.loop import RunLog

    log = RunLog(tmp_path / "run.jsonl", resume=False, start=0)
    log.write({"iteration": 0})
    real_open = open

    def full(p, mode="r", *args, **kwargs):
        if "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(p, mode, *args, **kwargs)

    monkeypatch.setattr(files, "open", full, raising=False)
    with pytest.raises(OptionError, match=r"run\.jsonl: cannot write \(No space left on device\)"):
        log.write({"iteration": 1})
    assert (tmp_path / "run.jsonl").read_text() == '{"iteration": 0}\n'


def test_an_out_that_is_a_symlink_stays_one_and_its_file_is_written(pool, tmp_path):
    target = tmp_path / "real" / "p.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", link)
    assert r.exit_code == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["format"].startswith("dreamshard.plan/")
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "missing.json")
    atomic_write(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "missing.json").read_text() == "x"
