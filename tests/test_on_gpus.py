"""benchmarks/on_gpus.py: one command per GPU at once, each told its GPU, the first failure as the
call's status, and OUT packed into one file without the checkpoints."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def on_gpus(out: Path, *commands: str, gpus: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/on_gpus.py", "--gpus", str(gpus), "--out", str(out), "--tar", "all.tgz", *commands],
                          cwd=ROOT, capture_output=True, text=True)


def test_each_command_on_its_gpu(tmp_path):
    done = on_gpus(tmp_path, f"echo $CUDA_VISIBLE_DEVICES > {tmp_path}/a.txt; echo x > {tmp_path}/m.pt.ckpt", "echo $CUDA_VISIBLE_DEVICES")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.txt").read_text().strip() == "0" and (tmp_path / "gpu1.log").read_text().strip() == "1"
    with tarfile.open(tmp_path / "all.tgz") as tar:
        assert sorted(tar.getnames()) == ["a.txt", "gpu0.log", "gpu1.log"]


def test_a_failure_is_the_status_and_too_many_commands_refused(tmp_path):
    assert on_gpus(tmp_path, "true", "exit 3").returncode == 3
    refused = on_gpus(tmp_path, "true", "true", "true")
    assert refused.returncode != 0 and "3 commands for 2 GPUs" in refused.stderr
