"""Every command of the README runs as written.

The README's ```bash / ```sh / ```console blocks are run line by line, in order, in one temporary
directory, with this Python's `dreamshard` on PATH and this checkout first on PYTHONPATH, so a
broken example fails the suite. A trailing comment marks the lines that cannot run here, and they
are reported as skipped with the reason (`pytest -rs` lists them):

- `# setup` — `make demo` / `make test` build the environment this test runs in;
- `# gpu` — needs CUDA; run when CUDA is present and DREAMSHARD_README_GPU=1;
- `# long` — minutes on a small CPU; run by `make test-long` (the `long` test below runs the whole
  sequence, long lines included, in its own directory).

The README's ```python block (the TorchRec section) is run as a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELL_LANGS = ("bash", "sh", "console")
MARK = re.compile(r"#\s*(setup|gpu|long)\b")
HANG_S = 900  # a bound only a hang exceeds: the slowest line takes about a minute on 2 busy cores


def blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of every fenced block."""
    out, lang, start, body = [], None, 0, []
    for i, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and lang is None:
            lang, start, body = fence.group(1), i + 1, []
        elif line.startswith("```") and lang is not None:
            out.append((lang, start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"README: the block opened at line {start - 1} is not closed"
    return out


def commands(text: str) -> list[tuple[int, str, str | None]]:
    """(README line, command, mark or None) of every shell line, continuations joined."""
    out = []
    for lang, start, body in blocks(text):
        if lang not in SHELL_LANGS:
            continue
        pending, first = "", None
        for i, line in enumerate(body.splitlines()):
            if first is None:
                first = start + i
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            cmd, first_line, pending, first = pending.strip(), first, "", None
            if not cmd or cmd.startswith("#"):
                continue
            code, _, comment = cmd.partition(" #")
            mark = MARK.match("#" + comment.strip()) if comment else None
            out.append((first_line, code.strip(), mark.group(1) if mark else None))
    return out


def python_snippets(text: str) -> list[tuple[int, str]]:
    return [(start, body) for lang, start, body in blocks(text) if lang == "python"]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e.get("PATH", "")
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def run(cmd: str, cwd: Path, where: str) -> None:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=cwd, env=env(), capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, f"{where}: `{cmd}` exited {r.returncode}\n{r.stderr[-3000:]}\n{r.stdout[-2000:]}"


def gpu_here() -> bool:
    if os.environ.get("DREAMSHARD_README_GPU") != "1":
        return False
    import torch

    return torch.cuda.is_available()


TEXT = README.read_text()
COMMANDS = commands(TEXT)
SKIP_WHY = {
    "setup": "set-up: builds the environment this test runs in",
    "gpu": "needs CUDA (run with DREAMSHARD_README_GPU=1 on a GPU machine)",
    "long": "long: run by `make test-long` (test_readme_long)",
}


def skipped(mark: str | None) -> bool:
    return mark == "setup" or mark == "long" or (mark == "gpu" and not gpu_here())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, set[int]]:
    """The directory the lines run in, and the lines run there so far."""
    return tmp_path_factory.mktemp("readme"), set()


@pytest.mark.parametrize("line,cmd,mark", COMMANDS, ids=[f"L{n}" for n, _, _ in COMMANDS])
def test_readme_command(workdir: tuple[Path, set[int]], line: int, cmd: str, mark: str | None) -> None:
    if skipped(mark):
        pytest.skip(f"README line {line} ({SKIP_WHY[mark]}): {cmd}")
    where, ran = workdir
    # the lines before it first, where this process has not run them (pytest-xdist hands a worker
    # some of the lines only): a line runs where the README's reader would have run its predecessors
    for earlier, earlier_cmd, earlier_mark in COMMANDS:
        if earlier < line and earlier not in ran and not skipped(earlier_mark):
            run(earlier_cmd, where, f"README line {earlier} (before line {line})")
            ran.add(earlier)
    run(cmd, where, f"README line {line}")
    ran.add(line)


@pytest.mark.parametrize("line,code", python_snippets(TEXT), ids=lambda v: f"L{v}" if isinstance(v, int) else "code")
def test_readme_python(tmp_path: Path, line: int, code: str) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    run(f"{sys.executable} {script}", tmp_path, f"README python block at line {line}")


@pytest.mark.long
def test_readme_long(tmp_path: Path) -> None:
    """Every runnable line in order, the long ones included."""
    for line, cmd, mark in COMMANDS:
        if mark == "setup" or (mark == "gpu" and not gpu_here()):
            continue
        run(cmd, tmp_path, f"README line {line}")


def test_readme_has_commands() -> None:
    """The parser sees the README's blocks: set-up, quick start, the TorchRec snippet."""
    marks = [m for _, _, m in COMMANDS]
    assert marks.count("setup") == 3 and marks.count(None) >= 6  # make demo, make test, pip install with the extra
    assert len(python_snippets(TEXT)) == 1
    assert len(TEXT.splitlines()) <= 150


ARCHIVE = "f3e71a6"  # the last commit holding the one-off experiments the docs cite (docs/results.md)


def test_archived_paths_the_docs_cite_are_in_that_commit() -> None:
    """Every `f3e71a6:PATH` in the docs, benchmarks and code names a file or folder of that commit
    (`git show f3e71a6:PATH` works), so no citation points at nothing."""
    if subprocess.run(["git", "cat-file", "-e", f"{ARCHIVE}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"commit {ARCHIVE} is not in this clone's history (a shallow clone)")
    cited = set()
    for path in [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.md"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("dreamshard/**/*.py")]:
        cited |= {m.rstrip(".)/,") for m in re.findall(ARCHIVE + r":([A-Za-z0-9_./-]+)", path.read_text())}
    cited -= {"PATH", "benchmarks/NAME"}  # the notation itself
    assert len(cited) >= 15
    missing = [p for p in sorted(cited) if subprocess.run(["git", "cat-file", "-e", f"{ARCHIVE}:{p}"], cwd=ROOT, capture_output=True).returncode]
    assert not missing, missing
