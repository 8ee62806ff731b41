"""Duplicate JSON keys (issue 34): a plan, task or JSON table file in which an object names a key
twice is refused with one line naming the file, the line and the key (json would keep the last)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dreamshard.plan import load_plans
from dreamshard.tables import load_tables
from dreamshard.tasks import load_tasks
from dreamshard.validation import PlanError, TableError, TaskError, loads_unique
from cli_helpers import invoke, one_line_error

TABLES = "name,rows,dim,pooling_factor,distribution\na,1000,16,4,uniform\nb,2000,32,8,uniform\n"




@pytest.fixture()
def plan_file(tmp_path) -> Path:
    (tmp_path / "tables.csv").write_text(TABLES)
    r = invoke("plan", tmp_path / "tables.csv", "--devices", 2, "--max-memory", "1GB", "--planner", "lookup", "--out", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    return tmp_path / "p.json"


def test_a_plan_naming_a_key_twice_is_refused_with_file_line_and_key(plan_file, tmp_path):
    text = plan_file.read_text()
    assert '\n "devices": 2,\n' in text
    bad = text.replace('\n "devices": 2,\n', '\n "devices": 2,\n "devices": 1,\n', 1)  # json.loads would read 1 device
    line = bad.splitlines().index(' "devices": 1,') + 1
    plan_file.write_text(bad)
    with pytest.raises(PlanError, match=rf"p.json: line {line}: key 'devices' is given twice"):
        load_plans(plan_file)
    msg = one_line_error(invoke("measure", plan_file, "--backend", "sim", "--out", tmp_path / "r.json"))
    assert f"p.json: line {line}: key 'devices'" in msg
    assert not (tmp_path / "r.json").exists()


def test_a_nested_duplicate_is_found_at_its_line(plan_file):
    d = json.loads(plan_file.read_text())
    text = json.dumps(d, indent=1)
    bad = text.replace('"dim": 32,', '"dim": 32,\n"dim": 16,', 1)
    plan_file.write_text(bad)
    line = bad.splitlines().index('"dim": 16,') + 1
    with pytest.raises(PlanError, match=rf"line {line}: key 'dim' is given twice"):
        load_plans(plan_file)


def test_plan_lines_tasks_and_json_tables_refuse_duplicate_keys(plan_file, tmp_path):
    d = json.loads(plan_file.read_text())
    one = json.dumps(d)
    (tmp_path / "p.jsonl").write_text(one + "\n" + one.replace('"planner": "lookup"', '"planner": "lookup", "planner": "x"', 1) + "\n")
    with pytest.raises(PlanError, match=r"p.jsonl: line 2: key 'planner' is given twice"):
        load_plans(tmp_path / "p.jsonl")
    (tmp_path / "t.jsonl").write_text('{"tables": ["a"], "devices": 2, "max_memory_bytes": 1000000000, "devices": 1, "pool": "%s"}\n' % tmp_path)
    msg = one_line_error(invoke("plan", "--tasks", tmp_path / "t.jsonl", "--out", tmp_path / "q.jsonl"))
    assert "t.jsonl: line 1: key 'devices' is given twice" in msg
    with pytest.raises(TaskError):
        load_tasks(tmp_path / "t.jsonl")
    (tmp_path / "x.json").write_text('{"tables": [\n {"name": "a", "rows": 10, "dim": 16,\n  "dim": 8, "pooling_factor": 1, "distribution": "uniform"}]}\n')
    with pytest.raises(TableError, match=r"x.json: line 3: key 'dim' is given twice"):
        load_tables(tmp_path / "x.json")


def test_unique_keys_load_as_before():
    text = '{"a": {"b": 1, "c": [{"b": 2}, {}]}, "b": [1, {"a": 3}]}'
    assert loads_unique(text, "x", PlanError) == json.loads(text)
