"""Tasks: a set of tables to place on D devices, each with a memory cap (docs/design.md §2).

A task file is JSON lines, one task per line:
  {"tables": ["t3", "t17", ...], "devices": 8, "max_memory_bytes": 5000000000, "pool": "/abs/pool"}
with optional workload keys "batch_size" (default 65536), "precision" (fp16) and "optimizer" (sgd),
and "host_memory_bytes" (default 0): each device's host memory for tables that do not fit in HBM
(docs/tiers.md);
and an optional "topology" (topology.py: hosts × GPUs per host and their links) whose device count
is the task's; a task without one is one host of its devices; and "row_layouts" (ROW_LAYOUTS,
default "any"): the row splits a planner may make, "torchrec" for TorchRec's layouts only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from dreamshard.files import atomic_write
from dreamshard.packing import format_bytes, pack
from dreamshard.tables import OPTIMIZERS, PRECISION_BYTES, REFERENCE_BATCH, TableSpec, load_tables
from dreamshard.tiers import Tier, hbm_bytes
from dreamshard.topology import Topology, one_host
from dreamshard.validation import (
    loads_unique,
    MAX_BATCH_SIZE,
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


@dataclass(frozen=True)
class Workload:
    """What one training step does with the tables: its global batch size, the weights'
    precision and the optimizer fused into the backward. Memory follows precision and optimizer;
    every cost follows all three."""

    batch_size: int = REFERENCE_BATCH
    precision: str = "fp16"
    optimizer: str = "sgd"

    def validate(self, where: str = "workload", error: type[InputError] = TaskError) -> "Workload":
        parse_int(self.batch_size, where, "key 'batch_size'", 1, MAX_BATCH_SIZE, error)
        parse_choice(self.precision, where, "key 'precision'", PRECISION_BYTES, error)
        parse_choice(self.optimizer, where, "key 'optimizer'", OPTIMIZERS, error)
        return self

    @property
    def elt_bytes(self) -> int:
        return PRECISION_BYTES[self.precision]

    def with_overrides(self, batch_size: int | None = None, precision: str | None = None) -> "Workload":
        """This workload measured at another batch size or precision (None: keep)."""
        return replace(self, batch_size=self.batch_size if batch_size is None else batch_size, precision=precision or self.precision)

    def to_json(self) -> dict:
        return {"batch_size": self.batch_size, "precision": self.precision, "optimizer": self.optimizer}

    @staticmethod
    def from_json(d: dict, where: str, error: type[InputError] = TaskError) -> "Workload":
        """From a task or plan object's keys; a missing key takes its default."""
        return Workload(
            parse_int(d.get("batch_size", REFERENCE_BATCH), where, "key 'batch_size'", 1, MAX_BATCH_SIZE, error, text=False),
            parse_choice(d.get("precision", "fp16"), where, "key 'precision'", PRECISION_BYTES, error),
            parse_choice(d.get("optimizer", "sgd"), where, "key 'optimizer'", OPTIMIZERS, error),
        )


# The row splits a planner may make: "any" — a table's rows over k devices (2, 4, ..., every
# device, a host's GPUs; docs/rowwise.md), which our runners run; "torchrec" — TorchRec's row_wise
# (every device, block r on device r) and table_row_wise (a host's GPUs in order) alone, so that the
# plan exports to TorchRec (docs/torchrec.md)
ROW_LAYOUTS = ("any", "torchrec")


@dataclass
class Task:
    tables: list[TableSpec]
    devices: int
    max_memory_bytes: int
    workload: Workload = Workload()
    pool: str | None = None  # where the table names resolve
    meta: dict = field(default_factory=dict)
    # per-device host memory for tables that leave HBM (tiers.py); 0: every shard in HBM
    host_memory_bytes: int = 0
    # the tier stage's choice (table name → tier), set by tier_stage.plan_with_tiers before a planner
    # places the task; None: every table in HBM. The sizes a planner packs follow it (table_bytes).
    tiers: dict[str, Tier] | None = None
    # the machine (topology.py); None: one host of `devices` GPUs
    topology: Topology | None = None
    row_layouts: str = "any"  # ROW_LAYOUTS

    @property
    def machine(self) -> Topology:
        """The task's topology, or the one host a task without one is."""
        return self.topology if self.topology is not None else one_host(self.devices)

    def validate(self, where: str = "task", error: type[InputError] = TaskError) -> "Task":
        """Raise `error` (naming `where`) unless this is a task a planner may be given: 1..MAX_TABLES
        tables, each once; 1..MAX_DEVICES devices; 1..MAX_MEMORY_BYTES per device; a valid
        workload. Returns the task."""
        require_list(self.tables, where, "key 'tables'", error, MAX_TABLES)
        parse_int(self.devices, where, "key 'devices'", 1, MAX_DEVICES, error)
        parse_int(self.max_memory_bytes, where, "key 'max_memory_bytes'", 1, MAX_MEMORY_BYTES, error)
        self.workload.validate(where, error)
        parse_int(self.host_memory_bytes, where, "key 'host_memory_bytes'", 0, MAX_MEMORY_BYTES, error)
        parse_choice(self.row_layouts, where, "key 'row_layouts'", ROW_LAYOUTS, error)
        if self.topology is not None:
            self.topology.validate(f"{where}, key 'topology'", error)
            if self.topology.devices != self.devices:
                raise error(f"{where}, key 'topology': {self.topology.hosts} hosts × {self.topology.gpus_per_host} GPUs is {self.topology.devices} devices, "
                            f"but the task has {self.devices}")
        seen: set[str] = set()
        for t in self.tables:
            if t.name in seen:
                raise error(f"{where}, key 'tables': table {t.name!r} is listed twice")
            seen.add(t.name)
        return self

    def table_bytes(self, table: TableSpec) -> int:
        """HBM the table takes on a device: all its bytes, or under the task's tiers its cache (or nothing)."""
        tier = None
        if self.tiers:
            tier = self.tiers.get(table.name)
            if tier is None and table.name.endswith("]") and "[" in table.name:  # a piece's spec ("t[0:16]", "t[rows 0:9]"): its table's tier
                tier = self.tiers.get(table.name[:table.name.rindex("[")])
        if tier is not None and tier.kind != "hbm":
            return hbm_bytes(table.rows, table.dim, tier.kind, tier.cache_ratio, self.workload.precision, self.workload.optimizer)
        return table.bytes(self.workload.precision, self.workload.optimizer)

    def sizes(self) -> list[int]:
        """Bytes of each table under this task's workload."""
        return [self.table_bytes(t) for t in self.tables]

    def to_json(self) -> dict:
        d = {"tables": [t.name for t in self.tables], "devices": self.devices, "max_memory_bytes": self.max_memory_bytes, **self.workload.to_json()}
        if self.pool:
            d["pool"] = self.pool
        if self.host_memory_bytes:
            d["host_memory_bytes"] = self.host_memory_bytes
        if self.topology is not None:
            d["topology"] = self.topology.to_json()
        if self.row_layouts != "any":
            d["row_layouts"] = self.row_layouts
        return d


def topology_from(d: dict, where: str, error: type[InputError] = TaskError) -> Topology | None:
    """The optional "topology" of a task or plan object (None where absent: one host)."""
    value = d.get("topology")
    return None if value is None else Topology.from_json(value, f"{where}, key 'topology'", error)


TASK_KEYS = ("tables", "devices", "max_memory_bytes")


def _json_lines_hint(text: str) -> str:
    """What to say after 'invalid JSON' in a task file: a JSON document written over several lines
    (a pretty-printed task or plan) parses as a whole, but a task file holds one task a line."""
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return "; a task file is JSON lines, one task object a line"
    return "; this file is one JSON document over several lines, but a task file is JSON lines: one task object a line"


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
            d = loads_unique(line, where, TaskError, lines=False)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: invalid JSON ({e.msg}){_json_lines_hint(text)}") from None
        except RecursionError:
            raise TaskError(f"{where}: JSON nested too deeply") from None
        if isinstance(d, dict) and str(d.get("format", "")).startswith("dreamshard.plan"):
            raise TaskError(f"{where}: this is a plan, not a task; a task file (from `dreamshard data tasks`) is JSON lines of tasks")
        require_dict(d, where, "a task", TaskError)
        require_keys(d, TASK_KEYS, where, TaskError)
        names = require_list(d["tables"], where, "key 'tables'", TaskError, MAX_TABLES)
        for i, n in enumerate(names):
            parse_str(n, where, f"key 'tables' entry {i}", TaskError)
        devices = parse_int(d["devices"], where, "key 'devices'", 1, MAX_DEVICES, TaskError, text=False)
        cap = parse_int(d["max_memory_bytes"], where, "key 'max_memory_bytes'", 1, MAX_MEMORY_BYTES, TaskError, text=False)
        workload = Workload.from_json(d, where)
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
        host = parse_int(d.get("host_memory_bytes", 0), where, "key 'host_memory_bytes'", 0, MAX_MEMORY_BYTES, TaskError, text=False)
        layouts = parse_choice(d.get("row_layouts", "any"), where, "key 'row_layouts'", ROW_LAYOUTS, TaskError)
        tasks.append(Task([lookup[n] for n in names], devices, cap, workload, pool, host_memory_bytes=host, topology=topology_from(d, where),
                          row_layouts=layouts).validate(where))
    if not tasks:
        raise TaskError(f"{path}: no tasks")
    return tasks


def save_tasks(tasks: Sequence[Task], path: str | Path) -> None:
    atomic_write(path, "".join(json.dumps(t.to_json()) + "\n" for t in tasks))


def split_pool(tables: Sequence[TableSpec], seed: int) -> tuple[list[TableSpec], list[TableSpec]]:
    """50/50 split of the pool into train and test tables (docs/design.md §2)."""
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
    workload: Workload = Workload(),
    max_tries: int = 100,
    refused: list[int] | None = None,
    topology: Topology | None = None,
) -> list[Task]:
    """`n` random table subsets that can be placed within memory. A draw that cannot be placed is
    drawn again, which favours small tables where memory is tight: `refused[0]` (where given) is
    increased by the number of such draws, for the caller to report."""
    rng = np.random.default_rng(seed)
    tasks: list[Task] = []
    while len(tasks) < n:
        for _ in range(max_tries):
            k = int(rng.integers(count[0], count[1] + 1))
            if k > len(tables):
                raise InputError(f"tasks of {k} tables asked from a pool of {len(tables)}")
            chosen = [tables[i] for i in sorted(rng.choice(len(tables), size=k, replace=False))]
            task = Task(chosen, devices, max_memory, workload, pool, topology=topology)
            if pack(task.sizes(), max_memory, devices) is not None:
                tasks.append(task)
                break
            if refused is not None:
                refused[0] += 1
        else:
            raise InputError(f"no placeable task in {max_tries} draws: {devices} devices × {format_bytes(max_memory)} is too small for these tables")
    return tasks
