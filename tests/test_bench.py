"""The results suite (`dreamshard bench`): rows for every planner, task and split, per-setting
training, resume after a torn write, the cells' arithmetic, measured costs, and the CLI's refusals."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import pytest

from cli_helpers import invoke, one_line_error
from dreamshard import bench
from dreamshard.costs.sim import SimBackend
from dreamshard.synth import PoolConfig, synth_pool

GB = 10**9
SETTINGS = [bench.Setting("paper", "DLRM-8 (2)", "dlrm", 8, 2, 5 * GB, 2, 2, dim=16),
            bench.Setting("families", "wide 6 (2)", "wide", 6, 2, 16 * GB, 0, 1)]
# the planners of the test: the heuristics, the RNN placer and DreamShard trained per setting (a
# budget of 2 measured plans), neuroshard on its cost net, the oracle (AutoShard's training and
# TorchRec take minutes: their rows are made the same way)
LABELS = (*bench.HEURISTICS, "rnn", "dreamshard --no-split", "dreamshard", "neuroshard", "oracle")
FIELD = ("dreamshard", "neuroshard", "oracle")


@pytest.fixture(scope="module")
def small_pools():
    return {"dlrm": synth_pool(PoolConfig(tables=40, seed=3)), "wide": synth_pool(PoolConfig(tables=30, seed=4))}


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory, small_pools):
    mp = pytest.MonkeyPatch()
    mp.setattr(bench, "pool_of", lambda s, cache: [replace(t, dim=s.dim) for t in small_pools[s.family]] if s.dim else small_pools[s.family])
    run = bench.Run(tmp_path_factory.mktemp("bench"))
    bench.run_suite(run, SETTINGS, SimBackend(), train_budget=2, oracle_budget=200, say=lambda line: None, labels=LABELS)
    yield run, mp
    mp.undo()


def test_every_planner_on_every_task_and_split(suite_run):
    run, _ = suite_run
    rows = run.rows()
    by_split: dict[tuple, set] = {}
    for r in rows:
        by_split.setdefault((r["setting"], r["split"], r["task"]), set()).add(r["planner"])
    # train rows: the paper's columns only; test rows: those and the field (the shipped model too where trained)
    assert by_split[("DLRM-8 (2)", "train", 0)] == set(bench.PAPER_COLUMNS)
    assert by_split[("DLRM-8 (2)", "test", 1)] == set(bench.PAPER_COLUMNS + FIELD + ("dreamshard (shipped)",))
    assert by_split[("wide 6 (2)", "test", 0)] == set(bench.PAPER_COLUMNS + FIELD)
    assert len(by_split) == 5
    for r in rows:
        assert r["ms"] is not None or r["error"], r  # a planner that could not be built says why
    # per-setting models: trained on the paper setting's train tasks, used by the learned planners there
    models = sorted(p.name for p in (run.folder / "models").glob("*.pt"))
    assert models == ["paper-dlrm-8-2-s0-dreamshard.pt", "paper-dlrm-8-2-s0-rnn.pt"]
    dream = [r for r in rows if r["setting"] == "DLRM-8 (2)" and r["planner"] == "dreamshard"]
    assert all(r["trained"] and r["measurements"] == 2 for r in dream if r["ms"] is not None)
    # every test plan is in plans.jsonl under its hash, for measuring elsewhere
    hashes = {n[len("hash "):] for p in map(json.loads, run.plans_path.read_text().splitlines()) for n in p["notes"] if n.startswith("hash ")}
    assert {r["plan"] for r in rows if r["split"] == "test" and r["ms"] is not None} <= hashes


def test_resume_redoes_only_a_torn_task(suite_run):
    run, _ = suite_run
    before = run.rows()
    text = run.rows_path.read_text()
    run.rows_path.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # a kill in the middle of the last line
    torn = bench.task_key(json.loads(text.splitlines()[-1]))
    assert len({bench.task_key(r) for r in run.rows()}) == 4 and not any(bench.task_key(r) == torn for r in run.rows())
    bench.run_suite(run, SETTINGS, SimBackend(), train_budget=2, oracle_budget=200, say=lambda line: None, labels=LABELS)
    after = run.rows()
    assert run.done() == {(*bench.task_key(r), r["planner"]) for r in before}
    assert sorted((bench.task_key(r), r["planner"]) for r in after) == sorted((bench.task_key(r), r["planner"]) for r in before)


def test_cells_arithmetic():
    def row(planner, task, ms, seed=0):
        return {"setting": "S", "split": "test", "seed": seed, "task": task, "planner": planner, "ms": ms, "planning_ms": 1.0, "measurements": 0}

    rows = [row("random", 0, 2.0), row("random", 1, 4.0), row("lookup", 0, 1.0), row("lookup", 1, 2.0), row("size", 0, 3.0), row("size", 1, 3.0),
            row("dreamshard", 0, 0.8), row("dreamshard", 1, 1.6), row("oracle", 0, 1.0), row("oracle", 1, 1.6),
            row("torchrec", 0, None), row("torchrec", 1, 5.0)]
    cs = {c.planner: c for c in bench.cells(rows)}
    d = cs["dreamshard"]
    assert d.tasks == 2 and math.isclose(d.mean_ms, 1.2)
    assert math.isclose(d.over_random, 3.0 / 1.2 - 1) and math.isclose(d.vs_best_heuristic, 1.2 / 1.5 - 1) and math.isclose(d.vs_oracle, 1.2 / 1.3 - 1)
    assert math.isnan(d.std_ms)  # one seed
    assert cs["torchrec"].failed == 1 and math.isclose(cs["torchrec"].mean_ms, 5.0)  # the task it placed; the others over both
    two = bench.cells(rows + [{**r, "seed": 1, "ms": None if r["ms"] is None else r["ms"] * 2} for r in rows])
    assert math.isclose({c.planner: c for c in two}["dreamshard"].std_ms, math.sqrt(((1.2 - 1.8) ** 2 + (2.4 - 1.8) ** 2) / 1))


def test_report_from_measured_costs(suite_run, tmp_path):
    run, _ = suite_run
    rows = [r for r in run.rows() if r["split"] == "test" and r["ms"] is not None]
    costs = tmp_path / "measured.csv"
    with open(costs, "w", newline="") as fh:
        w = csv.DictWriter(fh, ["setting", "seed", "task", "plan", "measured_ms"])
        w.writeheader()
        for r in {(r["setting"], r["seed"], r["task"], r["plan"]): r for r in rows}.values():
            w.writerow({"setting": r["setting"], "seed": r["seed"], "task": r["task"], "plan": r["plan"], "measured_ms": 2 * r["ms"]})
    measured = {(c.setting, c.planner): c.mean_ms for c in bench.cells(bench.with_costs(run.rows(), bench.read_costs(costs)))}
    simulated = {(c.setting, c.planner): c.mean_ms for c in bench.cells([r for r in run.rows() if r["split"] == "test"])}
    assert measured.keys() == simulated.keys()
    assert all(math.isclose(measured[k], 2 * simulated[k]) for k in measured if not math.isnan(measured[k]))
    paths = bench.write_report(run, costs, tmp_path)
    assert "measured (measured.csv)" in paths[0].read_text() and paths[1].read_text().startswith("setting,split,planner")


def test_markdown_names_the_tables(suite_run):
    run, _ = suite_run
    text = bench.markdown(bench.cells(run.rows()), "sim")
    assert "## The paper's table" in text and "| DLRM-8 (2) | train |" in text and "## Where `dreamshard` is not the lowest mean on the test tasks" in text


@pytest.mark.parametrize("args, message", [
    (["--quick", "--tasks", "3"], "--tasks has no effect with --quick"),
    (["--suite", "paper,nope"], "--suite: nope: choose from paper, families, mlperf"),
    (["--runner", "distributed"], "--runner has no effect with --backend sim"),
])
def test_bench_paper_refusals(tmp_path, args, message):
    assert message in one_line_error(invoke("bench", "paper", "--out", tmp_path / "b", *args))


def test_bench_report_of_an_empty_run(tmp_path):
    assert "no results yet" in one_line_error(invoke("bench", "report", tmp_path))


def test_bench_paper_refuses_a_run_made_otherwise(tmp_path):
    out = tmp_path / "b"
    bench.Run(out).check_config({"settings": ["DLRM-20 (4)"], "tasks": [[3, 3]], "seeds": 1, "train_budget": 0, "oracle_budget": 1000, "backend": "x"})
    bench.Run(out).check_config({"settings": ["DLRM-20 (4)"], "tasks": [[3, 3]], "seeds": 1, "train_budget": 0, "oracle_budget": 1000, "backend": "x"})  # the same: resumes
    line = one_line_error(invoke("bench", "paper", "--out", out, "--quick", "--seeds", 2))
    assert "was made with other parameters" in line and "seeds 1 → 2" in line


def test_bench_paper_quick_through_the_cli(tmp_path, monkeypatch, small_pools):
    """The command end to end, on one tiny setting: its table printed, its files written, a second
    call resumes with nothing to do."""
    monkeypatch.setattr(bench, "quick_settings", lambda: [bench.Setting("paper", "DLRM-6 (2)", "dlrm", 6, 2, 5 * GB, 1, 1, dim=16)])
    monkeypatch.setattr(bench, "pool_of", lambda s, cache: [replace(t, dim=s.dim) for t in small_pools[s.family]])
    out = tmp_path / "b"
    r = invoke("bench", "paper", "--quick", "--out", out, "--planners", "lookup,size_lookup,random,dreamshard,oracle")
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert "## The paper's table" in r.stdout and "| DLRM-6 (2) | train |" in r.stdout and (out / "results.csv").exists()
    rows = bench.Run(out).rows()
    assert {x["planner"] for x in rows} == {"lookup", "size_lookup", "random", "dreamshard", "oracle"}
    again = invoke("bench", "paper", "--quick", "--out", out, "--planners", "lookup,size_lookup,random,dreamshard,oracle")
    assert again.exit_code == 0 and len(bench.Run(out).rows()) == len(rows)


@pytest.mark.long
def test_gpu_bench_all_on_a_cpu(tmp_path):
    """benchmarks/gpu_bench.py all, the logic on a CPU (--cpu --quick: the torch kernel, small tables):
    rows of every setting, measured test plans, and a report of them."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(root / "benchmarks/gpu_bench.py"), "all", "--cpu", "--quick", "--out", str(out), "--work", str(tmp_path / "work"),
                        "--jobs", "2", "--budget-s", "900"], capture_output=True, text=True, cwd=root, timeout=1500)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = bench.Run(out).rows()
    assert {x["setting"] for x in rows} == {s.name for s in bench.quick_settings()}
    measured = bench.read_costs(out / "measured.csv")
    assert measured and all(v > 0 for v in measured.values())
    assert bench.cells(bench.with_costs(rows, measured))


@pytest.mark.long
def test_gpu_bench_measures_with_both_runners_on_a_cpu(tmp_path):
    """benchmarks/gpu_bench.py plan --devices 4, then measure --distributed on a CPU (4 gloo
    processes, the torch kernel, small tables): each plan of the run's first test task in both
    runners' files, the same keys, and a summary saying how each file was measured."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run, out = tmp_path / "run", tmp_path / "out"
    script = [sys.executable, str(root / "benchmarks/gpu_bench.py")]
    r = subprocess.run(script + ["plan", "--quick", "--devices", "4", "--splits", "test", "--jobs", "2", "--out", str(run)],
                       capture_output=True, text=True, cwd=root, timeout=1500)  # a hang guard only
    assert r.returncode == 0, r.stderr[-2000:]
    lines = (run / "plans.jsonl").read_text().splitlines()
    first = [ln for ln in lines if json.loads(ln)["notes"][:3] == json.loads(lines[0])["notes"][:3]][:3]
    assert first and all(json.loads(ln)["devices"] == 4 for ln in first)
    (run / "plans.jsonl").write_text("\n".join(first) + "\n")
    r = subprocess.run(script + ["measure", str(run), "--out", str(out), "--distributed", "--cpu", "--quick", "--batch", "2"],
                       capture_output=True, text=True, cwd=root, timeout=1500)
    assert r.returncode == 0, r.stderr[-2000:]
    dist, seq = bench.read_costs(out / "distributed.csv"), bench.read_costs(out / "sequential.csv")
    assert len(dist) == len(first) and set(dist) == set(seq) and all(v > 0 for v in (*dist.values(), *seq.values()))
    how = json.loads((out / "summary.json").read_text())["how"]
    assert "distributed runner" in how["distributed.csv"] and "sequential runner" in how["sequential.csv"]
