"""The report module: planners evaluated on tasks with the simulator, summaries consistent with the
per-task rows, infeasible tasks recorded, Markdown/CSV/JSON, and the `compare` and `demo` commands."""

import csv
import json
import math
import statistics
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dreamshard.cli import cli
from dreamshard.costs.base import CostBackend, CostReport, DeviceCost
from dreamshard.costs.sim import SimBackend
from dreamshard.plan import Plan, Shard
from dreamshard.planners import PLANNERS, Planner, get_planner
from dreamshard.report import CSV_COLUMNS, evaluate, missing_arguments
from dreamshard.synth import PoolConfig, synth_pool, write_pool
from dreamshard.tasks import Task, Workload, sample_tasks, save_tasks

NAMES = ["random", "size", "lookup", "size_lookup"]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("pool")
    config = PoolConfig(tables=40, seed=3)
    tables = synth_pool(config)
    write_pool(tables, out, config)
    return out, tables


@pytest.fixture(scope="module")
def tasks(pool):
    """Four placeable tasks and, at index 2, one no planner can place (1 byte per device)."""
    out, tables = pool
    ok = sample_tasks(tables, 4, (5, 10), 2, 80 * 10**9, seed=7, pool=str(out))
    return ok[:2] + [Task(tables[:6], 2, 1, pool=str(out))] + ok[2:]


@pytest.fixture(scope="module")
def results(tasks):
    return evaluate(NAMES, tasks, SimBackend())


class Halves(Planner):
    """Splits the widest table into two column halves on devices 0 and 1; the rest as `size` does."""

    name = "halves"

    def plan(self, task):
        base = get_planner("size").plan(task)
        wide = max(range(len(task.tables)), key=lambda i: task.tables[i].dim)
        dim = task.tables[wide].dim
        shards = [s for s in base.shards if s.table != wide] + [Shard(wide, 0, 0, dim // 2), Shard(wide, 1, dim // 2, dim)]
        return Plan(task, shards, self.name)


class Scaled(CostBackend):
    """A stand-in for a measured backend: the simulator's costs doubled, labelled as measured."""

    name = "fake/sequential"

    def evaluate(self, shards, workload=Workload()):
        r = SimBackend().evaluate(shards, workload)
        devices = [DeviceCost(*(2 * x for x in (d.fwd_comp_ms, d.fwd_comm_ms, d.bwd_comm_ms, d.bwd_comp_ms))) for d in r.devices]
        return CostReport(devices, "fake", "sequential", "test hardware", r.batch_size, r.precision, r.optimizer)


def test_rows_cover_every_task_and_planner(results, tasks):
    assert results.planners == NAMES and results.tasks == len(tasks)
    assert [(r.task, r.planner) for r in results.rows] == [(i, n) for i in range(len(tasks)) for n in NAMES]
    sim = SimBackend()
    for r in results.rows:
        assert r.planning_ms >= 0
        if r.task == 2:  # infeasible: recorded, not raised
            assert not r.ok and r.plan is None and r.report is None and math.isnan(r.overall_ms)
            assert "cannot place 6 tables" in r.error
            continue
        assert r.ok and r.error is None and r.split_tables == {}
        r.plan.check()  # within memory
        assert r.plan.task is tasks[r.task] and r.plan.planner == r.planner
        assert r.source == sim.name and r.report.source == sim.name
        assert r.overall_ms == pytest.approx(sim.evaluate_plan(r.plan).overall_ms, rel=1e-12)
    assert results.source == sim.name


def test_summary_matches_rows(results, tasks):
    best = [min((r.overall_ms for r in results.rows if r.task == i and r.ok), default=math.nan) for i in range(len(tasks))]
    summary = results.summary()
    assert list(summary) == NAMES
    for name, s in summary.items():
        rows = [r for r in results.rows if r.planner == name]
        costs = [r.overall_ms for r in rows if r.ok]
        assert s.tasks == len(tasks) and s.failures == 1 and len(costs) == len(tasks) - 1
        assert s.mean_ms == pytest.approx(statistics.fmean(costs))
        assert s.median_ms == pytest.approx(statistics.median(costs))
        assert s.mean_ratio_to_best == pytest.approx(statistics.fmean([r.overall_ms / best[r.task] for r in rows if r.ok]))
        assert s.mean_ratio_to_best >= 1
        assert s.wins == sum(r.ok and r.overall_ms == best[r.task] for r in rows)
        assert s.mean_planning_ms == pytest.approx(statistics.fmean([r.planning_ms for r in rows]))
        assert s.split == 0
        assert results.costs(name) == [r.overall_ms for r in rows]
    # every placed task has at least one winner, and a planner winning every task is at ratio 1
    assert sum(s.wins for s in summary.values()) >= len(tasks) - 1
    assert all(s.mean_ratio_to_best == pytest.approx(1) for s in summary.values() if s.wins == len(tasks) - 1)
    assert results.mean_ratio("size", "size") == pytest.approx(1)
    ranked = results.ranked()
    assert [s.mean_ratio_to_best for s in ranked] == sorted(s.mean_ratio_to_best for s in ranked)


def test_split_plans_and_instances(tasks):
    seen = []
    r = evaluate({"halves": Halves(), "size": get_planner("size")}, tasks[:2], SimBackend(), progress=seen.append)
    assert seen == r.rows and len(seen) == 4
    for row in r.of("halves"):
        row.plan.check()
        wide = max(row.plan.task.tables, key=lambda t: t.dim)
        assert row.split_tables == {wide.name: 2}
    assert r.summary()["halves"].split == 2 and r.summary()["size"].split == 0


def test_markdown_states_source_and_round_trips(results):
    md = results.to_markdown()
    assert SimBackend().name in md.splitlines()[0]
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| planner") and not line.startswith("| ---")]
    parsed = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    summary = results.summary()
    assert set(parsed) == set(NAMES)
    for name, (mean, median, ratio, wins, planning, split, infeasible) in parsed.items():
        s = summary[name]
        assert float(mean) == pytest.approx(s.mean_ms, abs=5e-5) and float(median) == pytest.approx(s.median_ms, abs=5e-5)
        assert float(ratio) == pytest.approx(s.mean_ratio_to_best, abs=5e-5)
        assert (int(wins), int(split), int(infeasible)) == (s.wins, s.split, s.failures)
        assert float(planning) == pytest.approx(s.mean_planning_ms, abs=0.05)
    assert "size: infeasible on 1 of 5 tasks, first task 2: " in md


def test_csv_round_trip(results, tmp_path):
    path = tmp_path / "r.csv"
    results.to_csv(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        back = list(reader)
    assert len(back) == len(results.rows)
    for r, b in zip(results.rows, back):
        assert (int(b["task"]), b["planner"], float(b["planning_ms"]), int(b["split_tables"])) == (r.task, r.planner, r.planning_ms, len(r.split_tables))
        if r.ok:
            assert float(b["overall_ms"]) == r.overall_ms and b["source"] == r.source and b["error"] == ""
        else:
            assert b["overall_ms"] == "" and b["source"] == "" and b["error"] == r.error


def test_json_is_strict_and_complete(results):
    d = json.loads(json.dumps(results.to_json(), allow_nan=False))  # no NaN for the infeasible task
    assert d["source"] == SimBackend().name and d["tasks"] == 5 and d["planners"] == NAMES
    assert len(d["rows"]) == len(results.rows)
    assert [s["planner"] for s in d["summary"]] == NAMES
    failed = [x for x in d["rows"] if x["task"] == 2]
    assert all(x["overall_ms"] is None and x["report"] is None and x["error"] for x in failed)
    ok = next(x for x in d["rows"] if x["report"])
    assert ok["report"]["source"] == SimBackend().name and ok["overall_ms"] == ok["report"]["overall_ms"]


def test_priced_by_keeps_plans_and_says_where_costs_come_from(results):
    measured = results.priced_by(Scaled())
    assert measured.source.startswith("measured: fake kernel") and measured.source != results.source
    assert "measured: fake kernel" in measured.summary_table().title and "simulated" not in measured.to_markdown().splitlines()[0]
    for a, b in zip(results.rows, measured.rows):
        assert b.plan is a.plan and b.planning_ms == a.planning_ms and b.error == a.error
        if a.ok:
            assert b.overall_ms == pytest.approx(2 * a.overall_ms)


def test_write_files(results, tmp_path):
    paths = results.write(tmp_path / "out")
    assert [p.name for p in paths] == ["results.md", "results.csv", "results.json"]
    assert all(p.is_file() for p in paths)
    assert not list((tmp_path / "out").glob("*.tmp*"))


@pytest.fixture
def needy_planner(monkeypatch):
    """A registered planner that cannot be built without an argument."""

    class Needy(Planner):
        name = "needy"

        def __init__(self, budget):
            self.budget = budget

        def plan(self, task):
            raise AssertionError("never built")

    monkeypatch.setitem(PLANNERS, "needy", Needy)
    return "needy"


def test_missing_arguments(needy_planner):
    assert missing_arguments(needy_planner) == ["budget"]
    assert all(missing_arguments(n) == [] for n in NAMES + ["dreamshard", "dim"])


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def task_file(tasks, tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    save_tasks(tasks, path)
    return path


def test_compare_writes_results(task_file, tmp_path):
    r = run("compare", "--tasks", task_file, "--planners", "lookup,size,dreamshard", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())  # the table title may wrap
    assert SimBackend().name in out and "dreamshard" in out and "infeasible on 1 of 5 tasks" in out
    for name in ("results.md", "results.csv", "results.json"):
        assert (tmp_path / "cmp" / name).is_file()
    d = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert d["planners"] == ["lookup", "size", "dreamshard"] and len(d["rows"]) == 15


def test_compare_every_planner_by_default(task_file):
    r = run("compare", "--tasks", task_file)
    assert r.exit_code == 0, r.output
    assert all(name in r.output for name in PLANNERS if not missing_arguments(name))  # oracle needs a backend


@pytest.mark.parametrize(
    "planners, needle",
    [
        ("lookup,nope", "--planners: unknown planner 'nope'"),
        ("lookup,,size", "an empty name"),
        ("lookup,lookup", "lookup is listed twice"),
    ],
)
def test_compare_bad_planner_is_one_line_exit_2(task_file, tmp_path, planners, needle):
    p = subprocess.run([sys.executable, "-m", "dreamshard.cli", "compare", "--tasks", str(task_file), "--planners", planners, "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_compare_refuses_planner_needing_arguments(task_file, needy_planner):
    r = CliRunner().invoke(cli, ["compare", "--tasks", str(task_file), "--planners", f"lookup,{needy_planner}"])
    assert r.exit_code == 2 and "needy needs budget" in r.output


def test_compare_refuses_runner_with_sim(task_file):
    r = CliRunner().invoke(cli, ["compare", "--tasks", str(task_file), "--runner", "distributed"])
    assert r.exit_code == 2 and "--runner has no effect with --backend sim" in r.output


def test_demo_every_planner(tmp_path, needy_planner, monkeypatch):
    from dreamshard import cli as cli_module

    monkeypatch.setattr(cli_module.console, "width", cli_module.PIPED_WIDTH)  # as piped without $COLUMNS (pytest-xdist sets COLUMNS=80)
    r = run("demo", "--workdir", tmp_path / "demo", "--devices", 2, "--tables", 10)
    assert r.exit_code == 0, r.output
    table = r.output[r.output.index("embedding step cost"):]
    for name, cls in PLANNERS.items():
        if not missing_arguments(name):
            assert f"\n{name} " in table  # every planner that plans with its defaults in the summary table ...
            if "split" in cls.options():
                assert f"\n{name} --" in table  # ... and those that cut tables the other way too (--split, --no-split)
    assert "best table-wise plan:" in r.output
    assert "skipped planner needy: it needs budget" in r.output
    assert "skipped planner oracle: it needs backend" in r.output
    assert "vs random" in r.output and SimBackend().name in " ".join(r.output.split())  # the title may wrap
