"""Tasks: a set of tables to place on D devices, each with a memory cap (DESIGN.md §2).

A task file is JSON lines, one task per line:
  {"tables": ["t3", "t17", ...], "devices": 8, "max_memory_bytes": 5000000000, "pool": "/abs/pool"}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from dreamshard.files import atomic_write
from dreamshard.tables import OPTIMIZERS, PRECISION_BYTES, TableSpec, load_tables
from dreamshard.validation import (
    MAX_DEVICES,
    MAX_MEMORY_BYTES,
    MAX_TABLES,
    MAX_TASKS,
    InputError,
    TaskError,
    one_line,
    parse_choice,
    parse_int,
    parse_str,
    require_dict,
    require_keys,
    require_list,
)

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_memory(text: str | int) -> int:
    """'5GB' → 5e9, '5GiB' → 5·2^30, '512MB', or plain bytes; at least 1 byte, at most MAX_MEMORY_BYTES."""
    if isinstance(text, bool):
        raise InputError(f"memory {text!r}: use a number with an optional unit, e.g. 5GB, 5GiB, 512MB or 5000000000")
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        unit = m.group(2).upper() if m else None
        if not m or unit not in _UNITS:
            raise InputError(f"memory {str(text)!r:.40}: use a number with an optional unit, e.g. 5GB, 5GiB, 512MB or 5000000000")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise InputError(f"memory {text!r} must be at least 1 byte")
    if value > MAX_MEMORY_BYTES:
        raise InputError(f"memory {text!r} is over the limit of {format_bytes(MAX_MEMORY_BYTES)} per device")
    return value


def format_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def parse_range(text: str) -> tuple[int, int]:
    """'80' → (80, 80); '20:100' → (20, 100)."""
    try:
        parts = [int(p) for p in str(text).split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1] <= MAX_TABLES:
        raise InputError(f"table count {str(text)!r:.40}: use T or LO:HI with 1 <= LO <= HI <= {MAX_TABLES:,}")
    return parts[0], parts[1]


@dataclass
class Task:
    tables: list[TableSpec]
    devices: int
    max_memory_bytes: int
    precision: str = "fp16"
    optimizer: str = "sgd"
    pool: str | None = None  # where the table names resolve
    meta: dict = field(default_factory=dict)

    def validate(self, where: str = "task", error: type[InputError] = TaskError) -> "Task":
        """Raise `error` (naming `where`) unless this is a task a planner may be given: 1..MAX_TABLES
        tables, each once; 1..MAX_DEVICES devices; 1..MAX_MEMORY_BYTES per device; a known
        precision and optimizer. Returns the task."""
        require_list(self.tables, where, "key 'tables'", error, MAX_TABLES)
        parse_int(self.devices, where, "key 'devices'", 1, MAX_DEVICES, error)
        parse_int(self.max_memory_bytes, where, "key 'max_memory_bytes'", 1, MAX_MEMORY_BYTES, error)
        parse_choice(self.precision, where, "key 'precision'", PRECISION_BYTES, error)
        parse_choice(self.optimizer, where, "key 'optimizer'", OPTIMIZERS, error)
        seen: set[str] = set()
        for t in self.tables:
            if t.name in seen:
                raise error(f"{where}, key 'tables': table {t.name!r} is listed twice")
            seen.add(t.name)
        return self

    def to_json(self) -> dict:
        d = {"tables": [t.name for t in self.tables], "devices": self.devices, "max_memory_bytes": self.max_memory_bytes, "precision": self.precision, "optimizer": self.optimizer}
        if self.pool:
            d["pool"] = self.pool
        return d


TASK_KEYS = ("tables", "devices", "max_memory_bytes")


def load_tasks(path: str | Path, tables: Sequence[TableSpec] | None = None) -> list[Task]:
    """Read a task file; table names resolve in `tables` or in each line's pool. Raises TaskError
    naming the file, line and key (TableError for a pool's table file)."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read ({one_line(getattr(e, 'strerror', None) or e)})") from None
    pools: dict[str, dict[str, TableSpec]] = {}
    by_name = {t.name: t for t in tables} if tables is not None else None
    tasks = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {line_no}"
        if len(tasks) >= MAX_TASKS:
            raise TaskError(f"{where}: more than {MAX_TASKS:,} tasks (the limit)")
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: invalid JSON ({e.msg})") from None
        except RecursionError:
            raise TaskError(f"{where}: JSON nested too deeply") from None
        require_dict(d, where, "a task", TaskError)
        require_keys(d, TASK_KEYS, where, TaskError)
        names = require_list(d["tables"], where, "key 'tables'", TaskError, MAX_TABLES)
        for i, n in enumerate(names):
            parse_str(n, where, f"key 'tables' entry {i}", TaskError)
        devices = parse_int(d["devices"], where, "key 'devices'", 1, MAX_DEVICES, TaskError)
        cap = parse_int(d["max_memory_bytes"], where, "key 'max_memory_bytes'", 1, MAX_MEMORY_BYTES, TaskError)
        precision = parse_choice(d.get("precision", "fp16"), where, "key 'precision'", PRECISION_BYTES, TaskError)
        optimizer = parse_choice(d.get("optimizer", "sgd"), where, "key 'optimizer'", OPTIMIZERS, TaskError)
        pool = d.get("pool")
        if pool is not None:
            pool = parse_str(pool, where, "key 'pool'", TaskError)
        lookup = by_name
        if lookup is None:
            if not pool:
                raise TaskError(f"{where}: task names no pool; pass the table file")
            if pool not in pools:
                pool_file = Path(pool) / "tables.csv"
                if not pool_file.is_file():
                    raise TaskError(f"{where}, key 'pool': no table file {pool_file}")
                pools[pool] = {t.name: t for t in load_tables(pool_file)}
            lookup = pools[pool]
        missing = [n for n in names if n not in lookup]
        if missing:
            raise TaskError(f"{where}, key 'tables': unknown table {missing[0]!r:.60}")
        tasks.append(Task([lookup[n] for n in names], devices, cap, precision, optimizer, pool).validate(where))
    if not tasks:
        raise TaskError(f"{path}: no tasks")
    return tasks


def save_tasks(tasks: Sequence[Task], path: str | Path) -> None:
    atomic_write(path, "".join(json.dumps(t.to_json()) + "\n" for t in tasks))


def split_pool(tables: Sequence[TableSpec], seed: int) -> tuple[list[TableSpec], list[TableSpec]]:
    """50/50 split of the pool into train and test tables (DESIGN.md §2)."""
    order = np.random.default_rng(seed).permutation(len(tables))
    half = len(tables) // 2
    return [tables[i] for i in sorted(order[:half])], [tables[i] for i in sorted(order[half:])]


def sample_tasks(
    tables: Sequence[TableSpec],
    n: int,
    count: tuple[int, int],
    devices: int,
    max_memory: int,
    seed: int,
    pool: str | None = None,
    precision: str = "fp16",
    optimizer: str = "sgd",
    max_tries: int = 100,
) -> list[Task]:
    """`n` random table subsets that can be placed within memory (infeasible draws are redrawn)."""
    from dreamshard.planners.memory import feasible  # planners import tasks

    rng = np.random.default_rng(seed)
    tasks: list[Task] = []
    while len(tasks) < n:
        for _ in range(max_tries):
            k = int(rng.integers(count[0], count[1] + 1))
            if k > len(tables):
                raise InputError(f"tasks of {k} tables asked from a pool of {len(tables)}")
            chosen = [tables[i] for i in sorted(rng.choice(len(tables), size=k, replace=False))]
            task = Task(chosen, devices, max_memory, precision, optimizer, pool)
            if feasible(task):
                tasks.append(task)
                break
        else:
            raise InputError(f"no placeable task in {max_tries} draws: {devices} devices × {format_bytes(max_memory)} is too small for these tables")
    return tasks
