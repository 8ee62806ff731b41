"""The CLI end to end on a small pool: exit codes, one-line errors, files written."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dreamshard.cli import cli
from dreamshard.plan import load_plans


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("pool")
    r = run("data", "synth", "--out", out, "--tables", 40, "--seed", 3)
    assert r.exit_code == 0, r.output
    return out


def test_synth_tasks_plan(pool, tmp_path):
    r = run("data", "stats", pool)
    assert r.exit_code == 0 and "lookup-weighted" in r.output
    r = run("data", "tasks", "--pool", pool, "--tables", "5:8", "--devices", 2, "--max-memory", "80GB", "--num-train", 4, "--num-test", 3, "--out", tmp_path / "tasks")
    assert r.exit_code == 0, r.output
    train = (tmp_path / "tasks" / "train.jsonl").read_text().splitlines()
    test = (tmp_path / "tasks" / "test.jsonl").read_text().splitlines()
    assert len(train) == 4 and len(test) == 3
    train_names = {n for line in train for n in json.loads(line)["tables"]}
    test_names = {n for line in test for n in json.loads(line)["tables"]}
    assert not train_names & test_names  # the pool is split: test tables are unseen
    r = run("plan", "--tasks", tmp_path / "tasks" / "test.jsonl", "--planner", "size_lookup", "--out", tmp_path / "p.jsonl")
    assert r.exit_code == 0, r.output
    plans = load_plans(tmp_path / "p.jsonl")
    assert len(plans) == 3 and all(p.planner == "size_lookup" for p in plans)
    r = run("plan", pool / "tables.csv", "--devices", 4, "--max-memory", "80GiB", "--planner", "lookup", "--out", tmp_path / "one.json")
    assert r.exit_code == 0, r.output
    (plan,) = load_plans(tmp_path / "one.json")
    assert len(plan.task.tables) == 40 and plan.task.max_memory_bytes == 80 * 2**30
    assert plan.task.tables[0].distribution  # the plan carries the stream descriptors


def test_a_task_file_is_planned_past_the_tasks_a_planner_cannot_place(pool, tmp_path):
    """One task of a file that no placement fits must not cost the user the plans of the others:
    they are written, the unplaced one is named with its reason; a file of none is an error."""
    r = run("data", "tasks", "--pool", pool, "--tables", "5:8", "--devices", 2, "--max-memory", "80GB", "--num-train", 0, "--num-test", 2, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    lines = (tmp_path / "test.jsonl").read_text().splitlines()
    tight = json.loads(lines[0]) | {"max_memory_bytes": 1000}
    (tmp_path / "mixed.jsonl").write_text("\n".join([json.dumps(tight), lines[1]]) + "\n")
    (tmp_path / "none.jsonl").write_text(json.dumps(tight) + "\n")
    r = run("plan", "--tasks", tmp_path / "mixed.jsonl", "--planner", "lookup", "--out", tmp_path / "p.jsonl")
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "task 1 (line 1 of" in out and "has no plan from lookup: cannot place" in out and "1 of 2 tasks have none" in out
    assert [len(p.task.tables) for p in load_plans(tmp_path / "p.jsonl")] == [len(json.loads(lines[1])["tables"])]
    r = CliRunner().invoke(cli, ["plan", "--tasks", str(tmp_path / "none.jsonl"), "--planner", "lookup", "--out", str(tmp_path / "q.jsonl")])
    assert r.exit_code == 2 and "no task of" in r.output and "cannot place" in r.output and not (tmp_path / "q.jsonl").exists()


def test_planners_lists_registry():
    r = run("planners")
    assert r.exit_code == 0 and "size_lookup" in r.output and "random" in r.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--devices", "2", "--max-memory", "1KB", "--planner", "size"], "cannot place 40 tables needing"),
        (["--devices", "2", "--max-memory", "5 parsecs", "--planner", "size"], "memory '5 parsecs'"),
        (["--devices", "2", "--max-memory", "5GB", "--planner", "nope"], "unknown planner 'nope'"),
    ],
)
def test_bad_input_is_one_line_exit_2(pool, tmp_path, args, needle):
    p = subprocess.run([sys.executable, "-m", "dreamshard.cli", "plan", str(pool / "tables.csv"), *args, "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_bad_table_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,rows,dim,pooling_factor,distribution\na,12,5,1,uniform\n")
    p = subprocess.run([sys.executable, "-m", "dreamshard.cli", "plan", str(bad), "--devices", "2", "--max-memory", "1GB", "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == f"error: {bad}: line 2, column 'dim': 5 is not a positive multiple of 4"


def test_plan_verify_measures_the_seeds_plans_with_the_backend(pool, tmp_path):
    """`plan --planner dreamshard --verify K --backend B`: the kept plan carries the backend's
    measurements of the K seeds' plans; --verify without --backend (or the reverse for dreamshard),
    or for a planner without it, is a one-line error."""
    from cli_helpers import invoke, one_line_error

    r = run("plan", pool / "tables.csv", "--devices", 4, "--max-memory", "80GiB", "--planner", "dreamshard", "--verify", 2, "--backend", "sim",
            "--out", tmp_path / "v.json")
    assert r.exit_code == 0, r.output
    (plan,) = load_plans(tmp_path / "v.json")
    got = plan.predicted["verified"]
    assert got["backend"].startswith("simulated") and 1 <= len(got["plans"]) <= 2 and got["seed"] in (0, 1)
    assert "verified: the fastest of" in plan.notes[-1]
    base = [pool / "tables.csv", "--devices", 4, "--max-memory", "80GiB", "--out", tmp_path / "w.json"]
    assert "--verify K and --backend go together" in one_line_error(invoke("plan", *base, "--planner", "dreamshard", "--verify", 2))
    assert "--verify K and --backend go together" in one_line_error(invoke("plan", *base, "--planner", "dreamshard", "--backend", "sim"))
    assert "--verify is for dreamshard, not 'lookup'" in one_line_error(invoke("plan", *base, "--planner", "lookup", "--verify", 2))
