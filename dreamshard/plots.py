"""Figures: matplotlib (the `plots` extra: `pip install "dreamshard[plots]"`), imported only when
a figure is drawn. Each function takes plain numbers and writes one file, PNG or SVG by its
suffix (atomically, as every file the package writes); figures are drawn on their own `Figure`,
never through pyplot, so no backend or global state of the caller's is touched.

- `grouped_bars(rows, path, ...)`: a tidy table of (group, series, value) rows as bars, e.g. per
  setting the improvement of each planner; `bars` draws the same on an axis of a larger figure;
- `planner_costs(rows, path)`: planners' mean cost beside their ratio to the best (`compare`);
- `device_components(panels, path)`: per-device stacked fwd comp, fwd comm, bwd comm, bwd comp of
  plans side by side (`compare --out`, `measure --plot`);
- `training_curves(rows, path)`: a training log's measured cost, cost-net error and policy loss
  (`train --plot`);
- `compare_figures(results, folder)`: what `compare --out` adds to its tables.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from dreamshard.files import atomic_write
from dreamshard.validation import OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostReport
    from dreamshard.report import Results

EXTRA = 'pip install "dreamshard[plots]"'
SUFFIXES = (".png", ".svg")
# a device's four phases, in the order a step runs them
COMPONENTS = (("fwd_comp_ms", "fwd comp"), ("fwd_comm_ms", "fwd comm"), ("bwd_comm_ms", "bwd comm"), ("bwd_comp_ms", "bwd comp"))
COMPONENT_COLORS = ("#4c72b0", "#8fb0de", "#f0b27a", "#dd8452")
DPI = 150
MAX_LABELLED_BARS = 16  # above this, bars carry no value labels (they would overlap)


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def require(what: str) -> None:
    """OptionError (one line naming the extra) where matplotlib is not installed; the CLI calls it
    before any work, so a run is not spent to fail at its figure."""
    if not available():
        raise OptionError(f"{what} needs matplotlib, which is not installed here: {EXTRA}")


def check_path(path: str | Path, what: str) -> None:
    """OptionError unless `path` names a PNG or SVG file."""
    if Path(path).suffix.lower() not in SUFFIXES:
        raise OptionError(f"{what} {path}: give a file ending in .png or .svg")


def _figure(width: float, height: float):
    require("drawing a figure")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save(fig, path: str | Path) -> Path:
    """`fig` to `path` as PNG or SVG (by the suffix). SVG keeps its text as text and carries no
    date, so the same figure is the same file."""
    import matplotlib

    path = Path(path)
    check_path(path, "figure")
    fmt = path.suffix.lower()[1:]
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dreamshard"}):
        fig.savefig(buf, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else {"Software": None})
    atomic_write(path, buf.getvalue())
    return path


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


# --------------------------------------------------------------------------------------------
# Bars from a tidy table
# --------------------------------------------------------------------------------------------


def bars(ax, rows: Iterable[tuple[str, str, float]], ylabel: str, value_format: str = "{:.3g}", reference: float | None = None,
         series_order: Sequence[str] | None = None) -> None:
    """Draw (group, series, value) rows on `ax`: one cluster of bars per group (in first-seen
    order), one bar per series in it (`series_order`, else first seen), a legend where there
    are several groups. A missing or non-finite value leaves its slot empty. `reference`: a
    horizontal line (0 for changes, 1 for ratios)."""
    rows = list(rows)
    groups = list(dict.fromkeys(g for g, _, _ in rows))
    series = list(series_order) if series_order is not None else list(dict.fromkeys(s for _, s, _ in rows))
    value = {(g, s): v for g, s, v in rows}
    colors = _palette(len(series))
    if len(groups) == 1:  # one cluster: the series are the x axis, named there
        xs = range(len(series))
        vals = [value.get((groups[0], s)) for s in series]
        drawn = ax.bar([x for x, v in zip(xs, vals) if _finite(v)], [v for v in vals if _finite(v)],
                       color=[c for c, v in zip(colors, vals) if _finite(v)])
        tilt = len(series) > 2 and max((len(s) for s in series), default=0) > 6  # long names side by side would run into each other
        ax.set_xticks(list(xs), series, rotation=30 if tilt else 0, ha="right" if tilt else "center")
        if len(series) <= MAX_LABELLED_BARS:
            ax.bar_label(drawn, [value_format.format(v) for v in vals if _finite(v)], fontsize=7, padding=2)
        if groups[0]:
            ax.set_xlabel(groups[0])
    else:
        width = 0.8 / max(1, len(series))
        for k, (s, color) in enumerate(zip(series, colors)):
            pts = [(i + (k - (len(series) - 1) / 2) * width, value.get((g, s))) for i, g in enumerate(groups)]
            pts = [(x, v) for x, v in pts if _finite(v)]
            if pts:
                drawn = ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=s, color=color)
                if len(groups) * len(series) <= MAX_LABELLED_BARS:
                    ax.bar_label(drawn, [value_format.format(v) for _, v in pts], fontsize=6, padding=2)
        tilt = len(groups) > 2 and max(len(g) for g in groups) > 10
        ax.set_xticks(range(len(groups)), groups, rotation=30 if tilt else 0, ha="right" if tilt else "center")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    if reference is not None:
        ax.axhline(reference, color="0.3", linewidth=0.8)
    ax.margins(y=0.12)  # room for the value labels
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def grouped_bars(rows: Iterable[tuple[str, str, float]], path: str | Path, ylabel: str, title: str | None = None, value_format: str = "{:.3g}",
                 reference: float | None = None, series_order: Sequence[str] | None = None) -> Path:
    """A figure of `bars` (e.g. rows of (setting, planner, % below the best heuristic))."""
    rows = list(rows)
    groups = len({g for g, _, _ in rows})
    series = len({s for _, s, _ in rows})
    fig = _figure(max(5.0, min(16.0, 1.2 + 0.35 * groups * series + 0.4 * groups)), 3.6)
    bars(fig.add_subplot(), rows, ylabel, value_format, reference, series_order)
    if title:
        fig.suptitle(title, fontsize=9)
    return save(fig, path)


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# --------------------------------------------------------------------------------------------
# compare: planners' costs, and the per-device phases of the best plans
# --------------------------------------------------------------------------------------------


def planner_costs(rows: Sequence[tuple[str, float, float]], path: str | Path, title: str | None = None) -> Path:
    """(planner, mean ms, mean ratio to the best plan of each task) rows, best first: the mean
    cost beside how far above the best each planner is (its ratio − 1, in %)."""
    fig = _figure(max(7.0, min(16.0, 2.0 + 0.55 * len(rows) * 2)), 3.8)
    left, right = fig.subplots(1, 2)
    names = [p for p, _, _ in rows]
    bars(left, [("", p, m) for p, m, _ in rows], "mean cost (ms)", "{:.3f}", series_order=names)
    bars(right, [("", p, (r - 1) * 100 if _finite(r) else None) for p, _, r in rows], "% above each task's best (mean)", "{:+.1f}", 0.0,
         series_order=names)
    if title:
        fig.suptitle(title, fontsize=9)
    return save(fig, path)


def device_components(panels: Sequence[tuple[str, "CostReport"]], path: str | Path, title: str | None = None) -> Path:
    """Per (label, CostReport): each device's fwd comp, fwd comm, bwd comm and bwd comp stacked,
    side by side on one scale; the slowest device, whose total is the plan's cost, marked."""
    if not panels:
        raise OptionError("no plan to draw")
    n = len(panels)
    most = max(len(r.devices) for _, r in panels)
    fig = _figure(min(18.0, max(4.5, n * (1.2 + 0.12 * most))), 3.8)
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    for ax, (label, report) in zip(axes, panels):
        devices = range(len(report.devices))
        bottom = [0.0] * len(report.devices)
        for (key, name), color in zip(COMPONENTS, COMPONENT_COLORS):
            heights = [getattr(d, key) for d in report.devices]
            ax.bar(devices, heights, 0.8, bottom=bottom, label=name, color=color)
            bottom = [b + h for b, h in zip(bottom, heights)]
        slowest = max(devices, key=lambda d: bottom[d])
        ax.annotate("slowest", (slowest, bottom[slowest]), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
        ax.margins(y=0.1)
        ax.set_title(f"{label}\n{report.overall_ms:.3f} ms", fontsize=8)
        ax.set_xlabel("device")
        step = max(1, len(report.devices) // 8)
        ax.set_xticks(range(0, len(report.devices), step))
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("ms per step")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title, fontsize=9)
    return save(fig, path)


def compare_figures(results: "Results", folder: str | Path, best: int = 4) -> list[Path]:
    """`compare --out`'s figures, each as PNG and SVG: planners.* (`planner_costs` of every
    planner) and devices.* (`device_components` of the `best` best planners' plans of the first
    task that they all placed, or of as many as placed the first task)."""
    folder = Path(folder)
    ranked = results.ranked()
    title = results.title()
    rows = [(s.planner, s.mean_ms, s.mean_ratio_to_best) for s in ranked]
    out = [planner_costs(rows, folder / f"planners{suffix}", title) for suffix in SUFFIXES]
    placed = [s.planner for s in ranked if s.failures < s.tasks]
    for task in range(results.tasks):
        got = {r.planner: r for r in results.rows if r.task == task and r.ok}
        if all(p in got for p in placed[:best]) or task == results.tasks - 1:
            panels = [(p, got[p].report) for p in placed if p in got][:best]
            if panels:
                what = f"per-device phases of the {len(panels)} best planners' plans, task {task + 1}" if results.tasks > 1 else "per-device phases of the best planners' plans"
                out += [device_components(panels, folder / f"devices{suffix}", f"{what} — {results.source}") for suffix in SUFFIXES]
            break
    return out


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------

# (panel, y label, [(log key, legend, scale)]): the keys each learned planner's loop logs
# (learned/dreamshard.py, autoshard.py, rnn.py); a panel whose keys a log lacks is left out
CURVES = (
    ("step cost", "ms", [("collect/measured_ms", "measured, sampled plans", 1.0), ("eval/mean_ms", "measured, eval tasks", 1.0),
                         ("rl/predicted_ms", "cost net's, RL episodes", 1.0)]),
    ("cost-net error on fresh plans", "%", [("cost/mape_overall", "plan", 100.0), ("cost/mape_device", "device", 100.0), ("cost/mape", "shard", 100.0)]),
    ("policy loss", "", [("rl/policy_loss", "policy gradient", 1.0), ("rl/pg_loss", "policy gradient", 1.0), ("rl/loss", "loss", 1.0)]),
)


def training_curves(rows: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """A training log's rows (one per iteration) as curves over the iterations: measured (and
    predicted) step cost, the cost net's error on the plans it had not seen, the policy loss."""
    panels = []
    for name, unit, keys in CURVES:
        lines = []
        for key, legend, scale in keys:
            pts = [(r["iteration"] + 1, r[key] * scale) for r in rows if _finite(r.get(key)) and _finite(r.get("iteration"))]
            if pts and not (key == "rl/loss" and lines):  # rnn logs only rl/loss; the others' policy part says more
                lines.append((legend, pts))
        if lines:
            panels.append((name, unit, lines))
    if not panels:
        raise OptionError("the training log has no numbers to draw")
    fig = _figure(3.6 * len(panels), 3.2)
    for ax, (name, unit, lines) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for legend, pts in lines:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=legend)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("iteration")
        if unit:
            ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return save(fig, path)
