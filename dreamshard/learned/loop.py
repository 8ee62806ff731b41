"""What a learned planner's training loop needs besides its own maths, so that each new learned
planner (AutoShard, an RNN placer) writes only its loop:

- `Measurer`: the cost backend as training meets it — sampled table-wise plans priced at the
  training batch (one backend call per workload), counted against the budget of real
  measurements; `complete` turns a stuck episode into a memory packing so it can be measured;
- `Checkpoint`: the full state of a run beside its model (`MODEL.pt.ckpt`), written atomically
  after every iteration, checked key by key on load, refused on resume if the run differs, never
  replaced by a new run while its own run is unfinished, nor shared by two runs at once;
- `RunLog` (one JSON line per iteration) and `Progress` (on stderr, with the time left);
- `run_meta`: where a model came from; `mape`, `spearman`: a cost model's accuracy;
- `check_training_tasks` (refused up front: nothing to train on) and `finished_run` (the end of
  a run resumed after its last iteration: the model file as the last checkpoint holds it).

None of it knows a particular planner's nets; the backend is always passed in.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from dreamshard.files import append_line, atomic_write, load_torch_file, target_problem
from dreamshard.packing import infeasible_error, pack
from dreamshard.plan import Plan
from dreamshard.tasks import Task, Workload
from dreamshard.validation import MAX_BUDGET, MAX_ITERS, ModelError, OptionError, TaskError, one_line, require_keys

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend, CostReport


@dataclass
class BudgetConfig:
    """What every learned planner's config starts with: the outer loop and its budget of real
    measurements (each planner's `Config` adds its own hyperparameters after these)."""

    name: str = "paper"
    seed: int = 0
    iterations: int = 10
    measurements_per_iteration: int = 10  # plans sampled and measured per iteration
    budget: int | None = None  # real measurements (measured plans) in all; None → iterations × measurements_per_iteration
    batch_size: int = 65_536  # workload batch the backend measures at

    def total_budget(self) -> int:
        return self.iterations * self.measurements_per_iteration if self.budget is None else self.budget

    def measurements_at(self, iteration: int) -> int:
        """The budget spread evenly over the iterations (earlier ones take the remainder)."""
        return spread(self.total_budget(), self.iterations, iteration)

    # A loop that learns only from the plans it measures in the same iteration (on-policy: AutoShard,
    # the RNN placer) needs one measurement in every iteration; DreamShard also learns from its
    # replay buffer, so an iteration without a new measurement still trains.
    measures_every_iteration = False

    def validate(self):
        for f in ("iterations", "measurements_per_iteration"):
            if getattr(self, f) < 1:
                raise OptionError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.budget is not None and self.budget < 1:
            raise OptionError(f"budget must be >= 1 real measurement, got {self.budget}")
        if self.measures_every_iteration and self.total_budget() < self.iterations:
            raise OptionError(f"budget {self.total_budget()} is below iterations {self.iterations}: this planner learns in an iteration only from "
                              f"the plans it measures in it, so each iteration needs at least one; raise --budget or lower --iterations")
        return self


def make_config(configs: dict, name: str, overrides: dict):
    """A learned planner's named config (its `CONFIGS`) with the given overrides (None: keep)."""
    if name not in configs:
        raise OptionError(f"unknown config {name!r}; choose from {', '.join(configs)}")
    return dataclasses.replace(configs[name], **{k: v for k, v in overrides.items() if v is not None}).validate()


# --------------------------------------------------------------------------------------------
# Measuring sampled plans
# --------------------------------------------------------------------------------------------


def spread(budget: int, iterations: int, iteration: int) -> int:
    """A budget spread evenly over the iterations (earlier ones take the remainder)."""
    return budget // iterations + (1 if iteration < budget % iterations else 0)


def measure(backend: CostBackend, tasks: Sequence[Task], placements: Sequence[Sequence[int]], batch_size: int) -> list[CostReport]:
    """Real costs of table-wise placements at the training batch: one backend call per workload."""
    reports = [None] * len(tasks)
    groups: dict[Workload, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault(t.workload.with_overrides(batch_size), []).append(i)
    for workload, idx in groups.items():
        shards = [Plan.table_wise(tasks[i], placements[i], "sampled").device_tables() for i in idx]
        for i, r in zip(idx, backend.evaluate_many(shards, workload)):
            reports[i] = r
    return reports


def check_training_tasks(tasks: Sequence[Task], eval_tasks: Sequence[Task] | None = None, where: str = "", eval_where: str = "") -> None:
    """TaskError before any training unless some training task can be placed within its devices'
    memory (a run on tasks none of which fits would measure nothing and write a model trained on
    nothing), and every eval task can (each is placed and measured after every iteration).
    `where`, `eval_where`: the files the tasks came from, to name in the error."""
    where, eval_where = (f"{w}: " if w else "" for w in (where, eval_where))
    if not tasks:
        raise TaskError(f"{where}no training tasks")

    def reason(task: Task) -> str:
        return str(infeasible_error([t.name for t in task.tables], task.sizes(), task.max_memory_bytes, task.devices))

    if all(pack(task.sizes(), task.max_memory_bytes, task.devices) is None for task in tasks):
        raise TaskError(f"{where}no training task can be placed within its devices' memory, so there is nothing to measure (task 1 of {len(tasks)}: {reason(tasks[0])})")
    for i, task in enumerate(eval_tasks or []):
        if pack(task.sizes(), task.max_memory_bytes, task.devices) is None:
            raise TaskError(f"{eval_where}eval task {i + 1} of {len(eval_tasks)} cannot be placed within its devices' memory, so it cannot be measured: {reason(task)}")


def complete(task: Task, placement: np.ndarray | None, stuck: bool) -> np.ndarray:
    """A stuck episode's placement replaced by a memory packing (so it can still be measured)."""
    if not stuck:
        return placement
    packed = pack(task.sizes(), task.max_memory_bytes, task.devices)
    if packed is None:
        raise TaskError(f"a training task of {len(task.tables)} tables does not fit on {task.devices} devices")
    return np.array(packed, np.int64)


class Measurer:
    """The only place a training loop meets its cost backend. `sample` prices plans sampled for
    training and counts them against `budget` real measurements; `evaluate` prices plans beyond
    the budget (held-out tasks that report progress; DreamShard's plans near its search's,
    `Config.search_measured`, which its model's meta counts) and counts nothing."""

    def __init__(self, backend: CostBackend, batch_size: int, budget: int, used: int = 0):
        self.backend, self.batch_size, self.budget, self.used = backend, batch_size, budget, used

    def left(self) -> int:
        return self.budget - self.used

    def sample(self, tasks: Sequence[Task], placements: Sequence[Sequence[int]]) -> list[CostReport]:
        if len(tasks) > self.left():
            raise ValueError(f"{len(tasks)} measurements asked, {self.left()} left of the budget of {self.budget}")
        reports = measure(self.backend, tasks, placements, self.batch_size)
        self.used += len(tasks)
        return reports

    def evaluate(self, tasks: Sequence[Task], placements: Sequence[Sequence[int]]) -> list[CostReport]:
        return measure(self.backend, tasks, placements, self.batch_size)

    def mean_cost(self, tasks: Sequence[Task], placements: Sequence[Sequence[int]]) -> float:
        """Mean overall ms of placements priced by `evaluate` (a loop's eval/mean_ms)."""
        return float(np.mean([r.overall_ms for r in self.evaluate(tasks, placements)]))


def decay_lr(optimizer: torch.optim.Optimizer, lr: float, iteration: int, iterations: int) -> float:
    """Set every parameter group to `lr` decayed linearly to 0 over the iterations (the reference
    codes' LambdaLR) at `iteration`; → the rate set."""
    rate = lr * (1 - iteration / iterations)
    for group in optimizer.param_groups:
        group["lr"] = rate
    return rate


# --------------------------------------------------------------------------------------------
# Checkpoints and model files
# --------------------------------------------------------------------------------------------


def atomic_save(obj, path: str | Path) -> None:
    """torch.save through the project's one atomic writer (files.atomic_write)."""
    atomic_write(path, lambda f: torch.save(obj, f))


class NetFile:
    """A trained network and its provenance as one model file: {"format", "net" (state dict),
    "meta", and the `shape` the network is built from}. A subclass names its `FORMAT`, its
    `PLANNER` (for the hint in errors) and how to `build` its network from a shape."""

    FORMAT = "?"
    PLANNER = "?"
    SHAPE: tuple[str, ...] = ()  # integer keys the network is built from

    def __init__(self, net: torch.nn.Module, meta: dict | None = None):
        self.net, self.meta = net, dict(meta or {})

    @classmethod
    def build(cls, shape: dict) -> torch.nn.Module:
        raise NotImplementedError

    def shape(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"format": self.FORMAT, "net": self.net.state_dict(), "meta": self.meta, **self.shape()}

    def save(self, path: str | Path) -> None:
        """Atomic write (a kill mid-save never leaves a broken model file)."""
        atomic_save(self.state(), path)

    @classmethod
    def from_state(cls, state, where: str):
        """The model of `state()`; ModelError naming `where` and the key for anything else."""
        if not isinstance(state, dict) or state.get("format") != cls.FORMAT:
            raise ModelError(f"{where}: not a {cls.FORMAT} file (train one with `dreamshard train --planner {cls.PLANNER}`)")
        require_keys(state, ("net", "meta", *cls.SHAPE), where, ModelError)
        if not isinstance(state["net"], dict) or not isinstance(state["meta"], dict):
            raise ModelError(f"{where}: keys 'net' and 'meta' must be dicts")
        for key in cls.SHAPE:
            if not isinstance(state[key], int) or isinstance(state[key], bool) or not 1 <= state[key] <= 4096:
                raise ModelError(f"{where}, key {key!r}: {state[key]!r:.40} is not an integer in 1..4096")
        net = cls.build({k: state[k] for k in cls.SHAPE})
        try:
            net.load_state_dict(state["net"])
        except (RuntimeError, TypeError, KeyError, AttributeError) as e:  # missing/unexpected keys, shapes, non-tensors
            raise ModelError(f"{where}, key 'net': does not fit the network ({one_line(e)[:200]})") from None
        net.eval()
        return cls(net, state["meta"])

    @classmethod
    def load(cls, path: str | Path):
        if not Path(path).is_file():
            raise ModelError(f"{path}: no such model file")
        return cls.from_state(load_torch_file(path, "model", ModelError), str(path))


# what every checkpoint carries besides its planner's own state: which run, how far
RUN_KEYS = {"config": dict, "tasks": list, "backend": str, "iteration": int, "measurements": int}
# which run, more closely (checked where present): every number of the tasks, the simulator's calibration
DIGEST_KEYS = ("task_digest", "backend_digest")
# every learned planner's checkpoint format: "dreamshard.checkpoint/1", "dreamshard.rnn-checkpoint/1", ...
_CHECKPOINT_FORMAT = re.compile(r"dreamshard\.(?:(\w+)-)?checkpoint/\d+")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:32]


def task_digest(tasks: Sequence[Task]) -> str:
    """What a run's tasks are, beyond their table names: every table's numbers, the devices, the
    memory and the workload (two task files of the same names may differ in any of them). Not
    the pool's path: a pool moved elsewhere holds the same tables."""
    return _digest([[t.devices, t.max_memory_bytes, t.workload.to_json(),
                     [[s.name, s.rows, s.dim, s.pooling_factor, list(s.bins), s.distribution, s.seed] for s in t.tables]] for t in tasks])


def backend_digest(backend: CostBackend) -> str:
    """The simulator's calibration and pricing options ("" for a backend that measures): two
    calibrations of one machine on one day share a name but not their costs."""
    calibration = getattr(backend, "calibration", None)
    if not dataclasses.is_dataclass(calibration):
        return ""
    return _digest([dataclasses.asdict(calibration), getattr(backend, "comm", None), getattr(backend, "product_path", None)])


def _identity(path: Path) -> tuple | None:
    """The file at `path` as this process last saw it (None: no file). Every atomic write makes a
    new file, so another writer's checkpoint differs in inode, time or size."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class Checkpoint:
    """The full state of a training run in `MODEL.pt.ckpt` beside its model: the run (config,
    task table names and a digest of their numbers, backend), how far it got (iterations done,
    real measurements) and the planner's own state under `keys` (name → type: nets, optimizer,
    replay buffer, random streams), so that a resumed run gives the numbers of an uninterrupted
    one.

    One checkpoint belongs to one run: `start` refuses a new run over the checkpoint of an
    unfinished one (or over a file that is no checkpoint), `resume` one of other options, tasks
    or backend, and `save` (and `check_unchanged`, before the model is written) stops a run whose
    checkpoint another process replaced since (two runs given the same --out at once)."""

    def __init__(self, out: str | Path, fmt: str, keys: dict[str, type], config, tasks: Sequence[Task], backend: CostBackend):
        out = Path(out)
        self.out, self.path = out, out.with_name(out.name + ".ckpt")
        self.format, self.keys = fmt, {**RUN_KEYS, **keys}
        self.config = dataclasses.asdict(config)
        # an option added since a checkpoint was written: that run had its default
        self._defaults = {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}
        self.tasks = [[t.name for t in task.tables] for task in tasks]
        self.backend = backend.name
        self.digests = {"task_digest": task_digest(tasks), "backend_digest": backend_digest(backend)}
        self._seen: tuple | None = None  # the checkpoint file as this run left it (or found it)

    def start(self, resume: bool) -> dict | None:
        """Before any work: the checkpoint to continue from (`resume`), or None for a new run,
        after checking that its path can be written and that nothing of another run is lost."""
        problem = target_problem(self.path)
        if problem:
            raise OptionError(f"{self.path} (the checkpoint of --out {self.out}): {problem}")
        if resume:
            return self.resume()
        if self.path.exists():
            self._refuse_unless_finished()
        self._seen = _identity(self.path)
        return None

    def _refuse_unless_finished(self) -> None:
        """OptionError unless the file at the checkpoint's path is the checkpoint of a finished run
        (of any learned planner), which a new run may replace as it replaces that run's model."""
        fresh = f"continue it with --resume, or delete {self.path} or give another --out to start a new run"
        try:
            ck = load_torch_file(self.path, "checkpoint", ModelError)
        except ModelError as e:
            raise OptionError(f"{e}; a training run writes its checkpoint there: move it or give another --out") from None
        m = _CHECKPOINT_FORMAT.fullmatch(str(ck.get("format"))) if isinstance(ck, dict) else None
        if m is None:
            raise OptionError(f"{self.path}: not a training checkpoint, and a training run writes its checkpoint there: move it or give another --out")
        planner = m.group(1) or "dreamshard"
        config = ck.get("config") if isinstance(ck.get("config"), dict) else {}
        done, total = ck.get("iteration"), config.get("iterations")
        if not (isinstance(done, int) and isinstance(total, int) and done >= total):
            progress = f"{done} of {total} iterations done" if isinstance(done, int) and isinstance(total, int) else "its progress unreadable"
            raise OptionError(f"{self.path} holds an unfinished {planner} training run ({progress}): {fresh}")

    def save(self, iteration: int, measurements: int, **state) -> None:
        """Atomically: a kill mid-save leaves the previous checkpoint."""
        self.check_unchanged()
        run = {"config": self.config, "tasks": self.tasks, "backend": self.backend, **self.digests, "iteration": iteration, "measurements": measurements}
        atomic_save({"format": self.format, **run, **state}, self.path)
        self._seen = _identity(self.path)

    def check_unchanged(self) -> None:
        """OptionError if another process replaced (or removed) the checkpoint since this run last
        wrote or read it: two runs writing one checkpoint would each resume the other's state."""
        if _identity(self.path) != self._seen:
            raise OptionError(f"{self.path}: replaced by another process while this run trained (two runs given --out {self.out}?); "
                              f"this run stops without writing its model: give each run its own --out")

    def load(self) -> dict:
        """The checkpoint, its keys and their types checked; ModelError otherwise."""
        path = self.path
        ck = load_torch_file(path, "checkpoint", ModelError)
        m = _CHECKPOINT_FORMAT.fullmatch(str(ck.get("format"))) if isinstance(ck, dict) else None
        if m is not None and ck.get("format") != self.format:
            raise ModelError(f"{path}: the checkpoint of a {m.group(1) or 'dreamshard'} training run, not of this planner's; "
                             f"resume it with that --planner, or give another --out")
        if not isinstance(ck, dict) or ck.get("format") != self.format:
            raise ModelError(f"{path}: not a dreamshard checkpoint (delete it, or start without --resume)")
        for key, kind in self.keys.items():
            if key not in ck:
                raise ModelError(f"{path}: missing key {key!r} (delete it, or start without --resume)")
            if not isinstance(ck[key], kind) or (kind is int and isinstance(ck[key], bool)):
                raise ModelError(f"{path}, key {key!r}: expected a {kind.__name__}, got {type(ck[key]).__name__}")
        for key in DIGEST_KEYS:
            if key in ck and not isinstance(ck[key], str):
                raise ModelError(f"{path}, key {key!r}: expected a str, got {type(ck[key]).__name__}")
        if not 0 <= ck["measurements"] <= MAX_BUDGET or not 0 <= ck["iteration"] <= MAX_ITERS:
            raise ModelError(f"{path}: iteration {ck['iteration']} / measurements {ck['measurements']} out of range")
        return ck

    def resume(self) -> dict:
        """The checkpoint of this very run (same options, tasks and backend); OptionError otherwise."""
        if not self.path.is_file():
            raise OptionError(f"--resume: no checkpoint {self.path} (start without --resume)")
        seen = _identity(self.path)
        ck = self.load()
        stored = {**{k: v for k, v in self._defaults.items() if k not in ck["config"]}, **ck["config"]}
        if stored != self.config:
            changed = [k for k, v in self.config.items() if stored.get(k) != v]
            raise OptionError(f"--resume: options differ from the checkpoint's ({', '.join(changed) or 'unknown keys'}); rerun with the same ones")
        if ck["tasks"] != self.tasks:
            raise OptionError(f"--resume: the training tasks differ from the checkpoint's ({self.path})")
        if ck.get("task_digest", self.digests["task_digest"]) != self.digests["task_digest"]:
            raise OptionError(f"--resume: the training tasks differ from the checkpoint's ({self.path}): the same tables by name, "
                              f"but other table numbers, devices, memory or workload; rerun with the same task file and pool")
        if ck["backend"] != self.backend:  # one replay buffer must not mix two backends' costs
            raise OptionError(f"--resume: the checkpoint's measurements come from {ck['backend']}, not {self.backend}; rerun with the same backend")
        if ck.get("backend_digest", self.digests["backend_digest"]) != self.digests["backend_digest"]:
            raise OptionError(f"--resume: the checkpoint's measurements come from another calibration of {self.backend}; rerun with the same --calibration")
        self._seen = seen
        return ck

    def restore(self, ck: dict, restorers: dict[str, Callable[[object], object]]) -> None:
        """Hand each saved value to its restorer; a tampered value names its key (ModelError)."""
        for key, restore in restorers.items():
            try:
                restore(ck[key])
            except (RuntimeError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
                raise ModelError(f"{self.path}, key {key!r}: cannot be restored ({type(e).__name__}: {one_line(e)[:200]})") from None


def finished_run(checkpoint: Checkpoint, ck: dict, iterations: int, out: str | Path, from_state: Callable[[dict, str], Any]):
    """The end of a resumed run whose checkpoint `ck` has all `iterations` done (None while some
    remain): the model is the last checkpoint's, with its metadata. The model file is left as it
    was where it holds exactly that model; else (a kill between the last checkpoint and the model
    save, or a file from another run) it is written from the checkpoint, atomically. The log is
    not touched. The model's `end_note` says which, for the command to print."""
    if ck["iteration"] < iterations:
        return None
    state = ck["model"]
    model = from_state(state, f"{checkpoint.path}, key 'model'")
    out = Path(out)
    try:
        existing = load_torch_file(out, "model", ModelError) if out.is_file() else None
    except ModelError:  # unreadable: rewritten from the checkpoint
        existing = None
    done = f"{ck['iteration']} iterations, {ck['measurements']} measured plans"
    if isinstance(existing, dict) and existing.get("format") == state.get("format") and existing.get("meta") == state.get("meta"):
        model.end_note = f"{out}: this run had already finished ({done}); the model is left as it was"
    else:
        atomic_save(state, out)
        model.end_note = f"wrote {out} from the last checkpoint of the finished run ({done})"
    return model


def numpy_rng_restorer(rng: np.random.Generator) -> Callable[[dict], None]:
    return lambda state: setattr(rng.bit_generator, "state", state)


# --------------------------------------------------------------------------------------------
# Progress: the log, the bar, the model's provenance, accuracy
# --------------------------------------------------------------------------------------------


class RunLog:
    """The JSONL log, one line of numbers per iteration (or nothing, without a path). A resumed
    run keeps the lines of finished iterations only: a kill between the log write and the
    checkpoint must not leave a duplicate line once the iteration is redone."""

    def __init__(self, path: str | Path | None, resume: bool, start: int, command: str = "train"):
        self.path = Path(path) if path else None
        if not self.path:
            return
        old = self.path.read_text(errors="replace").splitlines() if (resume and self.path.is_file()) else []
        kept = []
        for i, line in enumerate(old, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                done = int(row.get("iteration", -1)) < start
            except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
                raise OptionError(f"--log {self.path}: line {i} is not a log line of `{command}`; give another --log file") from None
            if done:
                kept.append(line + "\n")
        atomic_write(self.path, "".join(kept))

    def write(self, row: dict) -> None:
        if self.path:
            append_line(self.path, json.dumps(row))


class Progress:
    """Training progress on stderr that says how long: an estimate up front where the loop gives
    one (`estimate_s`, the seconds its iterations left should take, timed on a probe), then, on a
    terminal, a bar with the phase, the last iteration's numbers (its log row's keys named in
    `shown`, key → label) and the time left; elsewhere (a pipe, a file, a job scheduler's log) a
    line per iteration with the same. The time left follows the run: the iterations done so far
    (the estimate until the first is), less the time spent in the current one."""

    def __init__(self, enabled: bool, total: int, start: int, shown: dict[str, str], estimate_s: float | None = None, stream=None):
        import sys
        import time

        self.total, self.start, self.shown, self.last = total, start, shown, ""
        self.enabled, self.estimate, self.times = enabled, estimate_s, []
        self.now = time.monotonic
        self.t0 = self.it_start = self.now()
        self.current: int | None = None
        self.stream = stream or sys.stderr
        self.bar = None
        if not enabled:
            return
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        if self.terminal:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar
            from rich.text import Text

            from dreamshard.progress import clock

            progress = self

            class Left(ProgressColumn):
                def render(self, task) -> Text:
                    left = progress.remaining()
                    return Text("" if left is None else f"about {clock(left)} left", style="progress.remaining")

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), Left(), console=Console(file=self.stream))
            self.bar.start()
            self.job = self.bar.add_task("training", total=total, completed=start)
        if estimate_s is not None and total > start:
            self.say(f"estimated time: about {self.clock(estimate_s)} for {total - start} iteration{'s' if total - start > 1 else ''} "
                     "(each step timed once here; the time left is updated as they run)")

    @staticmethod
    def clock(seconds: float) -> str:
        from dreamshard.progress import clock

        return clock(seconds)

    def say(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar:
            self.bar.console.print(line, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)

    def remaining(self) -> float | None:
        """Seconds left: the mean iteration so far times those left, less the current one's time."""
        left = self.total - self.start - len(self.times)
        if left <= 0:
            return 0.0
        if self.times:
            return max(0.0, left * sum(self.times) / len(self.times) - (self.now() - self.it_start))
        if self.estimate is not None:
            return max(0.0, self.estimate - (self.now() - self.t0))
        return None

    def stage(self, what: str) -> None:
        """A stage before the iterations (a prior's fit) or after them (the search's plans): the bar's text, or a line."""
        if self.bar:
            self.bar.update(self.job, description=what)
        elif self.enabled:
            self.say(f"{what} ...")

    def phase(self, it: int, what: str) -> None:
        if it != self.current:  # an iteration's first phase: its clock starts
            self.current, self.it_start = it, self.now()
        if self.bar:
            self.bar.update(self.job, description=f"iteration {it + 1}: {what}{self.last}")

    def done(self, it: int, row: dict) -> None:
        if self.current != it:
            self.current, self.it_start = it, self.now()
        took = self.now() - self.it_start
        self.times.append(took)
        self.it_start = self.now()
        bits = [f"{label} {row[k]:.3f} ms" for k, label in self.shown.items() if k in row and not math.isnan(row[k])]
        self.last = " · " + ", ".join(bits) if bits else ""
        if self.bar:
            self.bar.update(self.job, advance=1, description=f"iteration {it + 1} done{self.last}")
        elif self.enabled:
            left = self.remaining()
            when = f"{self.clock(self.now() - self.t0)} elapsed" + (f", about {self.clock(left)} left" if left else "")
            print(f"iteration {it + 1}/{self.total} done in {self.clock(took)}{self.last} · {when}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar:
            self.bar.stop()
            self.bar = None


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_meta(config, backend: str, tasks: Sequence[Task], used: int, iterations: int) -> dict:
    """A trained model's provenance: its config, backend, measurements, training tasks, date, versions."""
    import dreamshard.costs.hardware as hw

    tables = sorted({t.name for task in tasks for t in task.tables})
    return {
        "config": dataclasses.asdict(config),
        "backend": backend,
        "measurements": used,
        "iterations_done": iterations,
        "train_tasks": len(tasks),
        "train_tables": len(tables),
        "table_counts": [min(len(t.tables) for t in tasks), max(len(t.tables) for t in tasks)],
        "device_counts": sorted({t.devices for t in tasks}),
        "date": now(),
        "versions": {k: str(v) for k, v in hw.software_versions().items()},
    }


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / np.maximum(true, 1e-12)))


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their mean rank (scipy.stats.rankdata's "average")."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(x)]
    out = np.empty(len(x))
    out[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (scipy.stats.spearmanr's, in NumPy: importing scipy.stats
    costs a training run a second or more); nan for fewer than 3 points, constants or nans."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 3 or np.isnan(a).any() or np.isnan(b).any() or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])
