"""The package as pip and a user see it (licence, version, extras) and the CLI's output for scripts:
`--version`, `--json`, `--quiet`, piped widths, and commands that compute nothing not importing torch."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dreamshard

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def dreamshard_cli(*args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "dreamshard.cli", *map(str, args)], capture_output=True, text=True, env=env, timeout=240)


def pyproject_version() -> str:
    return re.search(r'^version = "([^"]+)"', PYPROJECT, re.MULTILINE).group(1)


def test_version_is_the_projects_and_the_cli_prints_it():
    assert dreamshard.__version__ == pyproject_version()
    p = dreamshard_cli("--version")
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.strip() == f"dreamshard, version {pyproject_version()}"


def test_version_of_a_source_tree_never_installed_comes_from_pyproject(monkeypatch):
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert dreamshard._version() == pyproject_version()


def test_licence_file_and_spdx_declaration():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) the dreamshard authors")
    assert re.search(r'^license = "MIT"$', PYPROJECT, re.MULTILINE)
    assert re.search(r'^license-files = \["LICENSE"\]$', PYPROJECT, re.MULTILINE)


def test_extras_pin_what_the_makefile_installs():
    """[torchrec] is the exact torchrec/fbgemm pairing the Makefile installs; a drift between the
    two would make `pip install .[torchrec]` test something else than `make test`."""
    makefile = (ROOT / "Makefile").read_text()
    extra = re.search(r"^torchrec = \[(.*)\]$", PYPROJECT, re.MULTILINE).group(1)
    pins = re.findall(r'"([^"]+)"', extra)
    assert sorted(pins) == ["fbgemm-gpu-cpu==1.8.0", "torchrec==1.8.0"]
    for pin in pins:
        assert pin in makefile
    for extra in ("gpu", "plots"):
        assert re.search(rf"^{extra} = \[", PYPROJECT, re.MULTILINE)
    torch_pin = re.search(r"torch==([0-9.]+)", makefile).group(1)
    assert re.search(r'"torch>=2\.11,<2\.14"', PYPROJECT) and torch_pin.startswith(("2.11", "2.12", "2.13"))
