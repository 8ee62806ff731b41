"""Progress that says how long: a rich bar on a terminal, plain lines with an ETA everywhere else
(a pipe, a file, a job scheduler's log), where a bar would print nothing until it ends.

`bar(console)` is what the CLI's long loops use; `Lines` stands in for rich's `Progress` off a
terminal (the few methods the CLI calls), and `Remaining` is the ETA column of the bars on one.
Training has its own (`learned.loop.Progress`), with a line per iteration; both share `clock`.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

# Off a terminal a stage prints nothing for its first LINE_EVERY_S seconds (a quick command's
# stderr stays empty, or its one error line), then a line every LINE_EVERY_S seconds and one when
# it ends.
LINE_EVERY_S = 10.0


def clock(seconds: float) -> str:
    """7 → '0:07', 83 → '1:23', 3723 → '1:02:03'."""
    s = max(0, int(round(seconds)))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def remaining(done: float, total: float | None, elapsed: float) -> float | None:
    """Seconds left at the rate so far (None before any work is done, or without a total)."""
    if not total or done <= 0:
        return None
    return max(0.0, elapsed / done * (total - done))


class Remaining(ProgressColumn):
    """'about 1:23 left' from the task's own rate since it started (rich's TimeRemainingColumn
    looks at the last 30 s only, so a loop whose steps take longer never shows an ETA)."""

    def render(self, task) -> Text:
        left = remaining(task.completed, task.total, task.elapsed or 0.0)
        return Text("" if left is None or task.finished else f"about {clock(left)} left", style="progress.remaining")


class Lines:
    """rich's Progress as the CLI uses it (`add_task`, `advance`, `update`), printing one plain
    line per long stage instead: 'planning and pricing: 12/40, 0:21 elapsed, about 0:49 left'."""

    def __init__(self, stream: TextIO | None = None, every: float = LINE_EVERY_S, now: Callable[[], float] = time.monotonic):
        self.stream, self.every, self.now = stream, every, now
        self.tasks: dict[int, dict] = {}

    def __enter__(self) -> "Lines":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            for job in self.tasks:
                self._finish(job)

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **_) -> int:
        job = len(self.tasks)
        t = self.now()
        self.tasks[job] = {"description": description, "total": total, "completed": completed, "start": t, "printed": None, "ended": False}
        return job

    def advance(self, job: int, advance: float = 1) -> None:
        self.update(job, advance=advance)

    def update(self, job: int, completed: float | None = None, total: float | None = None, advance: float | None = None,
               description: str | None = None, **_) -> None:
        task = self.tasks[job]
        if description is not None:
            task["description"] = description
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance:
            task["completed"] += advance
        if task["total"] and task["completed"] >= task["total"]:
            self._finish(job)
            return
        task["ended"] = False
        t = self.now()
        if t - (task["printed"] if task["printed"] is not None else task["start"]) >= self.every:
            self._print(job, t)

    def _finish(self, job: int) -> None:
        task = self.tasks[job]
        if task["printed"] is not None and not task["ended"]:  # a stage that printed a line says that it ended
            self._print(job, self.now())
            task["ended"] = True

    def _print(self, job: int, t: float) -> None:
        task = self.tasks[job]
        elapsed = t - task["start"]
        done, total = task["completed"], task["total"]
        count = f"{done:g}/{total:g}" if total else f"{done:g}"
        if total and done >= total:
            tail = f"done in {clock(elapsed)}"
        else:
            left = remaining(done, total, elapsed)
            tail = f"{clock(elapsed)} elapsed" + (f", about {clock(left)} left" if left is not None else "")
        print(f"{task['description'].strip()}: {count}, {tail}", file=self.stream or sys.stderr, flush=True)
        task["printed"] = t


def bar(console: Console, transient: bool = True) -> RichProgress | Lines:
    """A progress bar on `console` where it is a terminal, else `Lines` on the same stream."""
    if not console.is_terminal:
        return Lines(console.file)
    return RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), Remaining(), console=console,
                        transient=transient)
