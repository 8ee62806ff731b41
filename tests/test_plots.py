"""Figures (the `plots` extra): the functions write non-empty PNG and SVG files; `compare --out`,
`measure --plot` and `train --plot` write theirs; without matplotlib a requested figure is one line
naming the extra, and `compare --out` still writes its tables."""

from __future__ import annotations

import json
import math
import sys

import pytest
from cli_helpers import invoke, one_line_error, small_pool

from dreamshard import plots
from dreamshard.costs.base import CostReport, DeviceCost

pytest.importorskip("matplotlib")  # the package's `plots` extra; `make` installs it


def is_png(path) -> bool:
    data = path.read_bytes()
    return data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def is_svg(path) -> bool:
    text = path.read_text()
    return text.lstrip().startswith("<?xml") and "<svg" in text and len(text) > 1000


def report(totals: list[float]) -> CostReport:
    return CostReport([DeviceCost(0.1 * t, 0.05 * t, 0.05 * t, 0.8 * t) for t in totals], "sim (test)", "sim", "CPU", 65536)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return small_pool(tmp_path_factory, 40, 5)


@pytest.fixture(scope="module")
def tasks(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks")
    r = invoke("data", "tasks", "--pool", pool, "--tables", "8:12", "--devices", 2, "--max-memory", "80GB", "--num-train", 3, "--num-test", 2, "--out", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("suffix,check", [(".png", is_png), (".svg", is_svg)])
def test_each_figure_function_writes_a_file(tmp_path, suffix, check):
    rows = [(setting, planner, value) for setting in ("mixed 60x4", "rmc 120x8") for planner, value in (("dreamshard", -5.1), ("oracle", -6.0), ("neuroshard", math.nan))]
    assert check(plots.grouped_bars(rows, tmp_path / f"bars{suffix}", "% below the best heuristic", reference=0.0))
    assert check(plots.grouped_bars([("", "a", 1.0), ("", "b", 2.0)], tmp_path / f"one{suffix}", "ms"))
    assert check(plots.planner_costs([("dreamshard", 3.8, 1.01), ("lookup", 4.9, 1.3), ("rnn", math.nan, math.nan)], tmp_path / f"costs{suffix}"))
    assert check(plots.device_components([("a", report([1.0, 2.0, 1.5])), ("b", report([1.2] * 20))], tmp_path / f"devices{suffix}", "title"))
    # each learned planner's log keys (dreamshard, autoshard, rnn)
    logs = {"dreamshard": [{"iteration": i, "collect/measured_ms": 4 - i / 10, "rl/predicted_ms": 3.9, "cost/mape_overall": 0.3 / (i + 1),
                            "cost/mape_device": 0.2, "rl/policy_loss": 0.01 * i, "rl/loss": 1.0, "eval/mean_ms": math.nan} for i in range(4)],
            "autoshard": [{"iteration": i, "collect/measured_ms": 5.0, "cost/mape": 0.1, "rl/pg_loss": -0.1, "rl/loss": 2.0} for i in range(3)],
            "rnn": [{"iteration": i, "collect/measured_ms": 6.0 - i, "rl/loss": 0.5} for i in range(2)]}
    for name, rows in logs.items():
        assert check(plots.training_curves(rows, tmp_path / f"{name}{suffix}", name))


def test_a_log_with_nothing_to_draw_and_a_name_of_another_format_are_one_line(tmp_path):
    from dreamshard.validation import OptionError

    with pytest.raises(OptionError, match="no numbers to draw"):
        plots.training_curves([{"iteration": 0, "seconds": 1.0}], tmp_path / "c.png")
    with pytest.raises(OptionError, match=r"c\.pdf: give a file ending in \.png or \.svg"):
        plots.check_path(tmp_path / "c.pdf", "--plot")


def test_compare_out_writes_its_figures_beside_its_tables(tasks, tmp_path):
    r = invoke("compare", "--tasks", tasks / "test.jsonl", "--planners", "lookup,size_lookup,random", "--split", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    for name in ("planners", "devices"):
        assert is_png(tmp_path / "cmp" / f"{name}.png") and is_svg(tmp_path / "cmp" / f"{name}.svg")
    assert (tmp_path / "cmp" / "results.md").is_file()
    assert "lookup --split" in (tmp_path / "cmp" / "planners.svg").read_text()  # SVG text stays text: the planners are named in it


def test_measure_plot_and_train_plot(tasks, tmp_path):
    plan = tmp_path / "p.jsonl"
    assert invoke("plan", "--tasks", tasks / "test.jsonl", "--planner", "lookup", "--out", plan, "--quiet").exit_code == 0
    r = invoke("measure", plan, "--backend", "sim", "--plot", tmp_path / "m.svg")
    assert r.exit_code == 0, r.output
    assert is_svg(tmp_path / "m.svg") and "lookup plan 2" in (tmp_path / "m.svg").read_text() and f"{tmp_path / 'm.svg'}" in "".join(r.stdout.split())
    r = invoke("train", "--tasks", tasks / "train.jsonl", "--out", tmp_path / "m.pt", "--iterations", 2, "--budget", 2, "--config", "paper",
               "--log", tmp_path / "log.jsonl", "--plot", tmp_path / "curves.png", "--threads", 1)
    assert r.exit_code == 0, r.output
    assert is_png(tmp_path / "curves.png") and f"curves: {tmp_path / 'curves.png'}" in " ".join(r.stdout.split())  # the console wraps long lines
    line = one_line_error(invoke("train", "--tasks", tasks / "train.jsonl", "--out", tmp_path / "n.pt", "--plot", tmp_path / "c.png"))
    assert "--plot draws the curves of the --log file" in line and not (tmp_path / "n.pt").exists()


@pytest.fixture
def no_matplotlib(monkeypatch):
    """As where the `plots` extra is not installed: importing matplotlib fails."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_without_matplotlib_a_figure_is_one_line_naming_the_extra(no_matplotlib, tasks, tmp_path):
    plan = tmp_path / "p.jsonl"
    assert invoke("plan", "--tasks", tasks / "test.jsonl", "--planner", "lookup", "--out", plan, "--quiet").exit_code == 0
    line = one_line_error(invoke("measure", plan, "--backend", "sim", "--plot", tmp_path / "m.png"))
    assert line == 'error: --plot needs matplotlib, which is not installed here: pip install "dreamshard[plots]"'
    line = one_line_error(invoke("train", "--tasks", tasks / "train.jsonl", "--out", tmp_path / "m.pt", "--log", tmp_path / "l.jsonl", "--plot", tmp_path / "c.png"))
    assert 'pip install "dreamshard[plots]"' in line and not (tmp_path / "m.pt").exists() and not (tmp_path / "l.jsonl").exists()
    # compare --out: the tables still, and a note instead of the figures
    r = invoke("compare", "--tasks", tasks / "test.jsonl", "--planners", "lookup", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert "no figures: they need matplotlib" in r.stdout and sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["results.csv", "results.json", "results.md"]
    doc = json.loads(invoke("compare", "--tasks", tasks / "test.jsonl", "--planners", "lookup", "--out", tmp_path / "cmp2", "--json").stdout)
    assert len(doc["wrote"]) == 3
