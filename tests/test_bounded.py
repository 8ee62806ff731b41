"""Bounded work (issue 34): `plan --budget` sets each search planner's own bound, is refused by
the planners without a search, the searches report progress, and the oracle on a measured
backend refuses up front a default budget that would take hours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dreamshard.costs.sim import SimBackend
from dreamshard.plan import load_plans
from dreamshard.planners import get_planner
from dreamshard.planners.dreamshard import DreamShardPlanner
from dreamshard.planners.neuroshard import NeuroShardPlanner
from dreamshard.tables import load_tables
from dreamshard.tasks import Task
from cli_helpers import invoke, one_line_error

FOUR = "name,rows,dim,pooling_factor,distribution\na,1000,16,4,uniform\nb,2000,32,8,uniform\nc,500,16,2,uniform\nd,3000,64,10,uniform\n"




@pytest.fixture()
def four(tmp_path) -> Path:
    (tmp_path / "tables.csv").write_text(FOUR)
    return tmp_path / "tables.csv"


def test_oracle_on_a_measured_backend_refuses_a_default_budget_of_hours(four, tmp_path):
    # 4 tables at the reference batch (65,536) on CPU: seconds an evaluation, 20,000 of them
    line = one_line_error(invoke("plan", four, "--devices", 2, "--max-memory", "1GB", "--planner", "oracle", "--backend", "torch", "--out", tmp_path / "p.json"))
    assert "default budget of 20,000 evaluations" in line and "--budget" in line and " h " in line, line
    assert not (tmp_path / "p.json").exists()


def test_oracle_on_a_measured_backend_runs_within_its_budget(four, tmp_path):
    # a small batch keeps each measurement to milliseconds
    task = {"tables": list("abcd"), "devices": 2, "max_memory_bytes": 10**9, "pool": str(four.parent), "batch_size": 512}
    (tmp_path / "t.jsonl").write_text(json.dumps(task) + "\n")
    r = invoke("plan", "--tasks", tmp_path / "t.jsonl", "--planner", "oracle", "--backend", "torch", "--budget", 50, "--out", tmp_path / "p.jsonl")
    assert r.exit_code == 0, r.output
    (plan,) = load_plans(tmp_path / "p.jsonl")
    assert plan.predicted["evaluations"] == 50


def test_budget_sets_each_search_planners_own_bound(four, tmp_path, monkeypatch):
    seen = {}
    for cls, option in ((NeuroShardPlanner, "depth"), (DreamShardPlanner, "max_splits")):
        real = cls.plan
        monkeypatch.setattr(cls, "plan", lambda self, task, real=real, cls=cls, option=option: (seen.__setitem__(cls.name, getattr(self, option)), real(self, task))[1])
    r = invoke("plan", four, "--devices", 2, "--max-memory", "1GB", "--planner", "neuroshard", "--budget", 3, "--out", tmp_path / "n.json")
    assert r.exit_code == 0, r.output
    r = invoke("plan", four, "--devices", 2, "--max-memory", "1GB", "--planner", "dreamshard", "--split", "--budget", 2, "--out", tmp_path / "d.json")
    assert r.exit_code == 0, r.output
    assert seen == {"neuroshard": 3, "dreamshard": 2}
    r = invoke("plan", four, "--devices", 2, "--max-memory", "1GB", "--planner", "oracle", "--backend", "sim", "--budget", 30, "--out", tmp_path / "o.json")
    assert r.exit_code == 0, r.output
    assert load_plans(tmp_path / "o.json")[0].predicted["evaluations"] == 30


@pytest.mark.parametrize("args", [["--planner", "lookup"], ["--planner", "dreamshard", "--no-split"], ["--planner", "size_lookup", "--split"]])
def test_budget_is_refused_where_there_is_no_search(args, four, tmp_path):
    line = one_line_error(invoke("plan", four, "--devices", 2, "--max-memory", "1GB", *args, "--budget", 5, "--out", tmp_path / "p.json"))
    assert "--budget is for the search planners" in line and "oracle" in line
    assert not (tmp_path / "p.json").exists()


def test_searches_report_their_progress(four):
    task = Task(load_tables(four), 2, 10**9)
    for planner, total in ((get_planner("oracle", backend=SimBackend(), budget=40), 40), (get_planner("neuroshard", depth=3), 3)):
        calls = []
        planner.progress = lambda done, all_: calls.append((done, all_))
        planner.plan(task)
        assert calls and all(t == total and 0 <= d <= total for d, t in calls), calls
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)
