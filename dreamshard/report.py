"""Planners compared on tasks: plan every task with every planner, price each plan with one cost
backend, and tabulate (the CLI's `demo` and `compare`, and the benchmarks).

`evaluate(planners, tasks, backend)` gives `Results`: one `Row` per (task, planner) — the plan, its
CostReport, the planning and pricing wall times, the tables it split, its notes, or the
`NoPlanError` that the planner raised — and a `PlannerSummary` per planner. Every table and
file the results make says which backend produced the costs (`CostReport.source`), so a simulated
number is never read as a measured one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from dreamshard.costs.base import CostBackend, CostReport
from dreamshard.files import atomic_write, one_writer
from dreamshard.plan import Plan
from dreamshard.tasks import Task
from dreamshard.validation import NoPlanError

if TYPE_CHECKING:  # the registry imports torch; Results alone does not need it
    from rich.table import Table

    from dreamshard.planners import Planner

CSV_COLUMNS = ("task", "planner", "overall_ms", "planning_ms", "split_tables", "source", "error")
TIE = 1e-9  # relative: costs this close to a task's best count as wins (identical plans price identically, up to rounding)


@dataclass
class Row:
    """One planner on one task: its plan and cost, or the NoPlanError it raised (`error`)."""

    task: int  # index in the evaluated task list
    planner: str
    plan: Plan | None
    report: CostReport | None
    planning_ms: float  # wall time of planner.plan(task), failed attempts included
    pricing_ms: float = 0.0  # wall time of the backend's pricing (0 when there was no plan)
    split_tables: dict[str, int] = field(default_factory=dict)  # table name → shards, for split tables
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None

    @property
    def overall_ms(self) -> float:
        """The plan's cost (max over devices); nan for a task the planner could not place."""
        return self.report.overall_ms if self.report is not None else math.nan

    @property
    def source(self) -> str:
        return self.report.source if self.report is not None else ""

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "planner": self.planner,
            "overall_ms": self.report.overall_ms if self.report is not None else None,
            "planning_ms": self.planning_ms,
            "pricing_ms": self.pricing_ms,
            "split_tables": self.split_tables,
            "notes": self.notes,
            "error": self.error,
            "report": self.report.to_json() if self.report is not None else None,
        }


@dataclass
class PlannerSummary:
    """One planner over every task. Costs are over the tasks it placed; `failures` counts the rest."""

    planner: str
    tasks: int
    failures: int  # tasks on which it raised NoPlanError
    mean_ms: float  # nan when it placed no task
    median_ms: float
    mean_ratio_to_best: float  # mean of cost / the lowest cost any planner reached on that task
    wins: int  # tasks where its cost is that lowest one (ties count for every tied planner)
    mean_planning_ms: float  # over every attempt, failed ones included
    split: int  # plans that split at least one table


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _finite_or_none(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass
class Results:
    rows: list[Row]  # task-major: every planner's row of task 0, then of task 1, ...
    planners: list[str]  # in the order they were given
    tasks: int
    backend: str  # the backend's name; each row's `source` says exactly what priced it

    def of(self, planner: str) -> list[Row]:
        return [r for r in self.rows if r.planner == planner]

    def costs(self, planner: str) -> list[float]:
        """The planner's cost of every task in order (nan where it could not place the task)."""
        return [r.overall_ms for r in self.of(planner)]

    def best(self) -> list[float]:
        """The lowest cost any planner reached on each task (nan where none placed it)."""
        out = [math.nan] * self.tasks
        for r in self.rows:
            if r.ok and not r.overall_ms >= out[r.task]:  # `not >=`: replaces nan too
                out[r.task] = r.overall_ms
        return out

    def mean_ratio(self, planner: str, baseline: str) -> float:
        """Mean over the tasks both placed of the planner's cost / the baseline's."""
        pairs = [(a, b) for a, b in zip(self.costs(planner), self.costs(baseline)) if not (math.isnan(a) or math.isnan(b))]
        return _mean([a / b for a, b in pairs])

    def summary(self) -> dict[str, PlannerSummary]:
        best = self.best()
        out = {}
        for name in self.planners:
            rows = self.of(name)
            placed = [r for r in rows if r.ok]
            costs = [r.overall_ms for r in placed]
            out[name] = PlannerSummary(
                planner=name,
                tasks=len(rows),
                failures=len(rows) - len(placed),
                mean_ms=_mean(costs),
                median_ms=_median(costs),
                mean_ratio_to_best=_mean([r.overall_ms / best[r.task] for r in placed]),
                wins=sum(r.overall_ms <= best[r.task] * (1 + TIE) for r in placed),
                mean_planning_ms=_mean([r.planning_ms for r in rows]),
                split=sum(bool(r.split_tables) for r in placed),
            )
        return out

    def ranked(self) -> list[PlannerSummary]:
        """Summaries best first: by mean ratio to the best plan, planners that placed nothing last."""
        return sorted(self.summary().values(), key=lambda s: (math.isnan(s.mean_ratio_to_best), s.mean_ratio_to_best, s.mean_ms))

    @property
    def source(self) -> str:
        """Which backend produced the costs, as every table states it."""
        sources = list(dict.fromkeys(r.source for r in self.rows if r.ok))
        return "; ".join(sources) if sources else f"{self.backend} (no plan priced)"

    def workload(self) -> str:
        """The priced workload: 'B=65,536, fp16, sgd' (values that differ between tasks joined by '/')."""
        reports = [r.report for r in self.rows if r.ok]
        if not reports:
            return ""
        parts = [[f"B={b:,}" for b in (r.batch_size for r in reports)], [r.precision for r in reports], [r.optimizer for r in reports]]
        return ", ".join("/".join(dict.fromkeys(p)) for p in parts)

    def title(self) -> str:
        what = "embedding step cost" + (f" over {self.tasks} tasks" if self.tasks > 1 else "")
        return f"{what}, {self.workload()} — {self.source}" if self.workload() else f"{what} — {self.source}"

    def summary_table(self, baseline: str | None = None) -> "Table":
        """The rich table the CLI prints, best planner first; `baseline` adds a 'vs BASELINE' column.
        One task: its cost per planner (a mean, a median and wins would repeat it)."""
        from rich import box
        from rich.table import Table

        one = self.tasks == 1
        # columns separated by spaces only and short headers: nine columns fit in 80
        t = Table(title=self.title(), box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
        t.add_column("planner", no_wrap=True)  # a name is what the user types: never cut
        cols = ["cost ms"] if one else ["mean ms", "median"]
        cols += ["vs best"] + ([f"vs {baseline}"] if baseline else []) + ([] if one else ["wins"]) + ["plan ms", "split", "no plan"]
        for col in cols:
            t.add_column(col, justify="right", no_wrap=True)
        for s in self.ranked():
            row = [s.planner, _ms(s.mean_ms, 3)] + ([] if one else [_ms(s.median_ms, 3)]) + [_pct(s.mean_ratio_to_best)]
            if baseline:
                row.append(_pct(self.mean_ratio(s.planner, baseline)))
            row += ([] if one else [str(s.wins)]) + [f"{s.mean_planning_ms:.1f}", str(s.split), str(s.failures)]
            t.add_row(*row)
        return t

    def note_lines(self) -> list[str]:
        """Each planner's distinct notes with their task counts, and its first infeasible task."""
        lines = []
        for name in self.planners:
            rows = self.of(name)
            counts: dict[str, int] = {}
            for r in rows:
                for n in r.notes:
                    counts[n] = counts.get(n, 0) + 1
            lines += [f"{name}: {n} ({k} of {len(rows)} tasks)" for n, k in counts.items()]
            failed = [r for r in rows if not r.ok]
            if failed:
                lines.append(f"{name}: infeasible on {len(failed)} of {len(rows)} tasks, first task {failed[0].task}: {failed[0].error}")
        return lines

    def to_markdown(self) -> str:
        lines = [
            f"Costs: {self.source}. {self.tasks} task{'s' if self.tasks != 1 else ''}" + (f", {self.workload()}" if self.workload() else "") + ".",
            "",
            "| planner | mean ms | median ms | mean ratio to best | wins | mean planning ms | plans that split | infeasible |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in self.ranked():
            lines.append(f"| {s.planner} | {_ms(s.mean_ms)} | {_ms(s.median_ms)} | {_ratio(s.mean_ratio_to_best)} | {s.wins} | {s.mean_planning_ms:.1f} | {s.split} | {s.failures} |")
        lines += [
            "",
            "Cost: max over devices of one step's embedding work. Mean and median over the tasks each planner placed; ratio to best: "
            "its cost / the lowest cost any planner reached on the same task, averaged; wins count ties.",
        ]
        notes = self.note_lines()
        if notes:
            lines += ["", *[f"- {n}" for n in notes]]
        return "\n".join(lines) + "\n"

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for r in self.rows:
            w.writerow([r.task, r.planner, "" if not r.ok else repr(r.overall_ms), repr(r.planning_ms), len(r.split_tables), r.source, r.error or ""])
        return buf.getvalue()

    def to_csv(self, path: str | Path) -> None:
        """One line per (task, planner); overall_ms and source empty where the task was infeasible."""
        atomic_write(path, self.csv_text())

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "source": self.source,
            "tasks": self.tasks,
            "planners": self.planners,
            "summary": [{k: _finite_or_none(v) if isinstance(v, float) else v for k, v in asdict(s).items()} for s in self.summary().values()],
            "rows": [r.to_json() for r in self.rows],
        }

    def write(self, out_dir: str | Path) -> list[Path]:
        """results.md, results.csv and results.json in `out_dir`, each written atomically."""
        out = Path(out_dir)
        paths = [out / "results.md", out / "results.csv", out / "results.json"]
        with one_writer(out):  # the three of one comparison
            atomic_write(paths[0], self.to_markdown())
            self.to_csv(paths[1])
            atomic_write(paths[2], json.dumps(self.to_json(), indent=1))
        return paths

    def priced_by(self, backend: CostBackend, batch_size: int | None = None) -> "Results":
        """The same plans priced by another backend (e.g. measured and simulated), without planning again."""
        rows = []
        for r in self.rows:
            report, pricing_ms = _price(r.plan, backend, batch_size) if r.plan is not None else (None, 0.0)
            rows.append(Row(r.task, r.planner, r.plan, report, r.planning_ms, pricing_ms, r.split_tables, r.notes, r.error))
        return Results(rows, self.planners, self.tasks, backend.name)


def _ms(x: float, digits: int = 4) -> str:
    return "—" if math.isnan(x) else f"{x:.{digits}f}"


def _pct(ratio: float) -> str:
    return "—" if math.isnan(ratio) else f"{ratio - 1:+.1%}"


def _ratio(ratio: float) -> str:
    return "—" if math.isnan(ratio) else f"{ratio:.4f}"


def _price(plan: Plan, backend: CostBackend, batch_size: int | None) -> tuple[CostReport, float]:
    t0 = time.perf_counter()
    report = backend.evaluate_plan(plan, batch_size)
    return report, (time.perf_counter() - t0) * 1000


def resolve(planners: Mapping[str, "Planner"] | Sequence[str]) -> dict[str, "Planner"]:
    """name → Planner: a mapping as given, or registered names built with their defaults."""
    if isinstance(planners, Mapping):
        return dict(planners)
    from dreamshard.planners import get_planner

    return {name: get_planner(name) for name in ([planners] if isinstance(planners, str) else planners)}


def evaluate(
    planners: Mapping[str, "Planner"] | Sequence[str],
    tasks: Sequence[Task],
    backend: CostBackend,
    batch_size: int | None = None,
    progress: Callable[[Row], None] | None = None,
) -> Results:
    """Plan every task with every planner and price each plan with `backend` (at each task's own
    batch size, or at `batch_size`). A planner having no plan for a task (NoPlanError: none within
    memory, a sharding our plans cannot express, a peer failing on it) is recorded in that row;
    any other exception is a bug and propagates. `progress` is called with each finished row."""
    chosen = resolve(planners)
    rows = []
    for i, task in enumerate(tasks):
        for name, planner in chosen.items():
            t0 = time.perf_counter()
            try:
                plan = planner.plan(task)
            except NoPlanError as e:  # no plan for this task (within memory, expressible, or a peer's failure on it)
                row = Row(i, name, None, None, (time.perf_counter() - t0) * 1000, error=str(e))
            else:
                planning_ms = (time.perf_counter() - t0) * 1000
                report, pricing_ms = _price(plan, backend, batch_size)
                row = Row(i, name, plan, report, planning_ms, pricing_ms, plan.split_tables(), list(plan.notes))
            rows.append(row)
            if progress:
                progress(row)
    return Results(rows, list(chosen), len(tasks), backend.name)


def missing_arguments(name: str) -> list[str]:
    """The constructor arguments a registered planner cannot do without (none for those that
    plan with their defaults): the demo skips such planners, `compare` refuses them."""
    import inspect

    from dreamshard.planners import PLANNERS

    cls = PLANNERS[name]
    params = inspect.signature(cls).parameters.values()
    return [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)] + list(getattr(cls, "requires", ()))
