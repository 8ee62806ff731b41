"""The package as pip and a user see it (licence, version, extras) and the CLI's output for scripts:
`--version`, `--json`, `--quiet`, piped widths, and commands that compute nothing not importing torch."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import small_pool

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


# --------------------------------------------------------------------------------------------
# output for scripts and pipes
# --------------------------------------------------------------------------------------------


def piped(*args, columns=None):
    """The CLI with stdout a pipe, as `dreamshard ... | less` or `> file` has it."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = str(columns)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "dreamshard.cli", *map(str, args)], capture_output=True, text=True, env=env, timeout=240)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return small_pool(tmp_path_factory, 40, 3)


@pytest.mark.parametrize("args", [["planners"], ["planners", "--json"], ["--help"], ["plan", "--help"]])
def test_commands_that_compute_nothing_do_not_import_torch(args):
    """Listing the registry took 3 s on a small machine when it imported torch (the learned
    planners' nets); now their modules bind the nets when a planner is built."""
    code = ("import sys\nfrom dreamshard.cli import cli\ntry:\n    cli(sys.argv[1:], prog_name='dreamshard')\nexcept SystemExit:\n    pass\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=240)
    assert p.stderr.strip().splitlines()[-1] == "no torch", p.stderr


def test_planners_json_is_the_registry():
    from dreamshard.planners import PLANNERS

    p = piped("planners", "--json")
    assert p.returncode == 0 and p.stderr == ""
    entries = {e["name"]: e for e in __import__("json").loads(p.stdout)["planners"]}
    assert sorted(entries) == sorted(PLANNERS)
    assert entries["dreamshard"]["kind"] == "learned" and entries["dreamshard"]["options"]["split"] is True  # its search splits by default (--no-split)
    from dreamshard import shipped

    assert entries["autoshard"]["requires"] == ([] if shipped.available("autoshard") else ["model"]) and entries["oracle"]["options"]["backend"] is None
    assert all(e["description"] for e in entries.values())


def test_a_learned_planner_still_builds_and_trains_through_its_lazy_names():
    """The names bound on first need are the nets' own (a planner built, its configs read)."""
    from dreamshard.learned import autoshard, mdp
    from dreamshard.planners import PLANNERS
    from dreamshard.planners import dreamshard as ds

    assert PLANNERS["autoshard"].Model is autoshard.AutoShardModel and PLANNERS["autoshard"].train is autoshard.train
    assert "default" in PLANNERS["dreamshard"].CONFIGS and PLANNERS["dreamshard"].config().name == "default"
    assert ds.best_placement is mdp.best_placement  # read from outside before any planner is built
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ds.nope


def test_plan_json_and_quiet_tell_the_same_plan(pool, tmp_path):
    import json

    out = tmp_path / "p.json"
    args = ["plan", pool / "tables.csv", "--devices", 4, "--max-memory", "80GB", "--planner", "dreamshard", "--split", "--out", out]
    p = piped(*args, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["planner"] == "dreamshard" and doc["out"] == str(out) and doc["unplaced"] == []
    (plan,) = doc["plans"]
    assert plan["task"] == 1 and plan["tables"] == 40 and plan["devices"] == 4 and len(plan["per_device"]) == 4
    assert sum(d["tables"] for d in plan["per_device"]) >= 40
    assert plan["predicted"]["source"].startswith("dreamshard cost net") and plan["predicted"]["overall_ms"] > 0
    q = piped(*args, "--quiet")
    assert q.returncode == 0 and q.stdout.splitlines() == [doc["summary"]]
    summary = doc["summary"]
    assert summary.startswith("dreamshard: 40 tables on 4 devices, ") and f"wrote 1 plan to {out}" in summary
    assert f"predicted step {plan['predicted']['overall_ms']:.3f} ms, the planner's own estimate by the dreamshard cost net" in summary
    r = piped(*args)  # the tables, then the same line last
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == summary


def test_plan_summary_of_a_task_file_and_of_a_planner_without_estimate(pool, tmp_path):
    import json

    p = piped("data", "tasks", "--pool", pool, "--tables", "5:8", "--devices", 2, "--max-memory", "80GB", "--num-train", 0, "--num-test", 3, "--out", tmp_path)
    assert p.returncode == 0, p.stderr
    lines = (tmp_path / "test.jsonl").read_text().splitlines()
    lines[1] = json.dumps(json.loads(lines[1]) | {"max_memory_bytes": 1000})  # no placement fits this one
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    args = ["plan", "--tasks", tmp_path / "mixed.jsonl", "--planner", "lookup", "--out", tmp_path / "p.jsonl"]
    q = piped(*args, "--quiet")
    assert q.returncode == 0 and len(q.stdout.splitlines()) == 1
    assert q.stdout.startswith("lookup: 2 plans on 2 devices, none split; no predicted step (lookup gives no estimate")
    assert "1 of 3 tasks have none; each plan carries its task" in q.stdout and "warnings above" not in q.stdout
    doc = json.loads(piped(*args, "--json").stdout)
    assert [x["task"] for x in doc["plans"]] == [1, 3] and doc["unplaced"][0]["task"] == 2 and "cannot place" in doc["unplaced"][0]["error"]
    assert all(x["predicted"] is None for x in doc["plans"])


def test_plan_json_with_quiet_is_refused_in_one_line(pool, tmp_path):
    p = piped("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "80GB", "--out", tmp_path / "p.json", "--json", "--quiet")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--json and --quiet" in p.stderr
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("columns", [None, 80])
def test_piped_output_has_a_readable_width_and_whole_planner_names(columns):
    """Piped: $COLUMNS, else 100 columns (not a forced 132 that wraps in the reader's terminal);
    the name column is never cut, whatever the width."""
    from dreamshard.planners import PLANNERS

    p = piped("planners", columns=columns)
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    widest = max(len(line) for line in lines)
    assert widest <= (columns or 100)
    if columns is None:
        assert widest > 80  # not rich's 80 for a pipe: the descriptions fill the 100 columns
    names = {line.split("│")[1].strip() for line in lines if line.startswith("│")} - {""}
    assert names == set(PLANNERS)


def test_measure_says_which_number_is_the_simulators_and_which_the_planners(pool, tmp_path):
    from dreamshard.costs.sim import DEFAULT_CALIBRATION

    plan = tmp_path / "p.json"
    assert piped("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "80GB", "--planner", "dreamshard", "--out", plan, "--quiet").returncode == 0
    p = piped("measure", plan, "--backend", "sim", "--out", tmp_path / "cost.json")
    assert p.returncode == 0, p.stderr
    assert f"simulator (calibration {DEFAULT_CALIBRATION}): " in p.stdout and "overall (max over devices of the total)" in p.stdout
    from dreamshard import shipped

    assert f"dreamshard cost net ({shipped.label('dreamshard')}), the planner's own estimate: " in p.stdout  # the shipped model this machine plans with


@pytest.fixture(scope="module")
def task_file(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks")
    p = piped("data", "tasks", "--pool", pool, "--tables", "8:12", "--devices", 2, "--max-memory", "80GB", "--num-train", 0, "--num-test", 2, "--out", out)
    assert p.returncode == 0, p.stderr
    return out / "test.jsonl"


def test_compare_json_quiet_model_and_split(task_file, tmp_path):
    """A user's model beside the planners (its planner read off the file), each planner that can
    cut tables also the other way; --json a document on stdout, --quiet the line the tables end with."""
    import json

    from dreamshard import shipped

    model = shipped.model_path("dreamshard")
    args = ["compare", "--tasks", task_file, "--planners", "lookup,size", "--model", f"mine={model}", "--split"]
    doc = json.loads(piped(*args, "--json").stdout)
    assert doc["planners"] == ["lookup", "lookup --split", "size", "size --split", "mine", "mine --no-split"]
    assert len(doc["rows"]) == 2 * 6 and doc["wrote"] == [] and {s["planner"] for s in doc["summary"]} == set(doc["planners"])
    q = piped(*args, "--quiet")
    assert q.returncode == 0 and len(q.stdout.splitlines()) == 1 and q.stdout.startswith("best on 2 tasks: ") and q.stderr == ""
    full = piped(*args, columns=80)
    assert full.returncode == 0 and full.stdout.splitlines()[-1] == q.stdout.strip()
    assert max(len(line) for line in full.stdout.splitlines()[:-1]) <= 80 and "…" not in full.stdout  # short headers: nothing cut at 80 columns
    assert "\nmine --no-split " in full.stdout and "no plan" in full.stdout


@pytest.mark.parametrize("value,needle", [("mine", "give NAME=FILE"), ("=m.pt", "give NAME=FILE"), ("lookup={model}", "the name 'lookup' is already a planner"),
                                          ("mine=nope.pt", "mine=nope.pt: no such file"), ("mine={tasks}", "cannot read this model file")])
def test_compare_model_refused_in_one_line(task_file, value, needle):
    from dreamshard import shipped

    p = piped("compare", "--tasks", task_file, "--planners", "lookup", "--model", value.format(model=shipped.model_path("dreamshard"), tasks=task_file))
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and needle in p.stderr and p.stdout == "", p.stderr


def test_compare_model_of_a_peer_and_a_file_of_no_planner(task_file, tmp_path):
    import json

    import torch

    from dreamshard import shipped

    doc = json.loads(piped("compare", "--tasks", task_file, "--planners", "lookup", "--model", f"peer={shipped.model_path('autoshard')}", "--json").stdout)
    assert doc["planners"] == ["lookup", "peer"] and all(r["error"] is None for r in doc["rows"])
    torch.save({"format": "something/1"}, tmp_path / "x.pt")
    p = piped("compare", "--tasks", task_file, "--model", f"x={tmp_path / 'x.pt'}")
    assert p.returncode == 2 and "not a model of a learned planner (autoshard, dreamshard, rnn)" in p.stderr and len(p.stderr.splitlines()) == 1


def test_data_stats_json(pool):
    import json

    doc = json.loads(piped("data", "stats", pool, "--json").stdout)
    assert doc["this_pool"]["tables"] == 40 and doc["published"]["tables"] == 856 and len(doc["this_pool"]["lookup_hist"]) == len(doc["bins"])
    assert 0 <= doc["l1_lookup_hist"] <= 2 and doc["reference"] == "2021"


def test_many_devices_show_the_slowest_in_80_columns(pool, tmp_path):
    plan = tmp_path / "p.json"
    assert piped("plan", pool / "tables.csv", "--devices", 24, "--max-memory", "80GB", "--planner", "lookup", "--out", plan, "--quiet").returncode == 0
    p = piped("measure", plan, "--backend", "sim", columns=80)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in p.stdout
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["device"])
    rows = lines[header + 2 : header + 2 + 8]
    report = __import__("json").loads((tmp_path / "p.cost-sim.json").read_text())
    totals = [sum(d[k] for k in ("fwd_comp_ms", "fwd_comm_ms", "bwd_comm_ms", "bwd_comp_ms")) for d in report["devices"]]
    slowest = sorted(sorted(range(24), key=lambda d: -totals[d])[:8])
    assert [int(r.split()[0]) for r in rows] == slowest  # the 8 slowest, in device order
    assert "16 of 24 devices not shown: these are the 8 slowest" in " ".join(p.stdout.split())
    q = piped("plan", pool / "tables.csv", "--devices", 12, "--max-memory", "80GB", "--planner", "lookup", "--out", tmp_path / "q.json", columns=80)
    assert "not shown" not in q.stdout and sum(1 for line in q.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()) == 12
