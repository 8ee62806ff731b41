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

from dreamshard.tables import TableError, TableSpec, load_tables

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_memory(text: str | int) -> int:
    """'5GB' → 5e9, '5GiB' → 5·2^30, '512MB', or plain bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"memory {text!r}: use a number with an optional unit, e.g. 5GB, 5GiB, 512MB or 5000000000")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"memory {text!r} must be positive")
    return int(value)


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
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1]:
        raise ValueError(f"table count {text!r}: use T or LO:HI with 1 <= LO <= HI")
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

    def to_json(self) -> dict:
        d = {"tables": [t.name for t in self.tables], "devices": self.devices, "max_memory_bytes": self.max_memory_bytes, "precision": self.precision, "optimizer": self.optimizer}
        if self.pool:
            d["pool"] = self.pool
        return d


def load_tasks(path: str | Path, tables: Sequence[TableSpec] | None = None) -> list[Task]:
    """Read a task file; table names resolve in `tables` or in each line's pool."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    pools: dict[str, dict[str, TableSpec]] = {}
    by_name = {t.name: t for t in tables} if tables is not None else None
    tasks = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {line_no}"
        try:
            d = json.loads(line)
            names, devices, cap = d["tables"], int(d["devices"]), int(d["max_memory_bytes"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise TableError(f"{where}: not a task ({type(e).__name__}: {e})") from None
        lookup = by_name
        if lookup is None:
            pool = d.get("pool")
            if not pool:
                raise TableError(f"{where}: task names no pool; pass the table file")
            if pool not in pools:
                pools[pool] = {t.name: t for t in load_tables(Path(pool) / "tables.csv")}
            lookup = pools[pool]
        missing = [n for n in names if n not in lookup]
        if missing:
            raise TableError(f"{where}: unknown table {missing[0]!r}")
        if devices < 1 or cap < 1:
            raise TableError(f"{where}: devices and max_memory_bytes must be positive")
        tasks.append(Task([lookup[n] for n in names], devices, cap, d.get("precision", "fp16"), d.get("optimizer", "sgd"), d.get("pool")))
    if not tasks:
        raise TableError(f"{path}: no tasks")
    return tasks


def save_tasks(tasks: Sequence[Task], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))


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
                raise ValueError(f"tasks of {k} tables asked from a pool of {len(tables)}")
            chosen = [tables[i] for i in sorted(rng.choice(len(tables), size=k, replace=False))]
            task = Task(chosen, devices, max_memory, precision, optimizer, pool)
            if feasible(task):
                tasks.append(task)
                break
        else:
            raise ValueError(f"no placeable task in {max_tries} draws: {devices} devices × {format_bytes(max_memory)} is too small for these tables")
    return tasks
