"""Plans: which device each table goes to, as a file a cost backend can measure by itself.

The plan carries every table's full spec (with its stream descriptor), so `dreamshard measure
PLAN.json` rebuilds the exact index streams with no other argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from dreamshard.files import atomic_write
from dreamshard.tables import TableSpec, table_from_record
from dreamshard.tasks import Task
from dreamshard.validation import (
    MAX_DEVICES,
    MAX_MEMORY_BYTES,
    MAX_TABLES,
    MAX_TASKS,
    PlanError,
    TableError,
    one_line,
    parse_int,
    require_dict,
    require_keys,
    require_list,
)

FORMAT = "dreamshard.plan/1"


@dataclass
class Plan:
    task: Task
    placement: list[int]  # device of each table of task.tables
    planner: str
    predicted: dict | None = None  # planner's own predicted costs, where it has a model
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.placement) != len(self.task.tables):
            raise ValueError(f"placement has {len(self.placement)} entries for {len(self.task.tables)} tables")

    @property
    def devices(self) -> int:
        return self.task.devices

    def shards(self) -> list[list[TableSpec]]:
        shards: list[list[TableSpec]] = [[] for _ in range(self.devices)]
        for table, d in zip(self.task.tables, self.placement):
            shards[d].append(table)
        return shards

    def device_bytes(self) -> list[int]:
        used = [0] * self.devices
        for table, d in zip(self.task.tables, self.placement):
            used[d] += table.bytes(self.task.precision, self.task.optimizer)
        return used

    def check(self, where: str = "plan") -> None:
        """Raise PlanError if a table is off the devices or a device is over its memory."""
        for t, d in zip(self.task.tables, self.placement):
            if not 0 <= d < self.devices:
                raise PlanError(f"{where}: table {t.name} on device {d}, outside 0..{self.devices - 1}")
        for d, used in enumerate(self.device_bytes()):
            if used > self.task.max_memory_bytes:
                raise PlanError(f"{where}: device {d} holds {used:,} bytes, over its max_memory_bytes {self.task.max_memory_bytes:,}")

    def to_json(self) -> dict:
        t = self.task
        d = {
            "format": FORMAT,
            "devices": t.devices,
            "max_memory_bytes": t.max_memory_bytes,
            "planner": self.planner,
            "precision": t.precision,
            "optimizer": t.optimizer,
            "tables": [
                {"name": s.name, "device": dev, "bytes": s.bytes(t.precision, t.optimizer), "spec": s.to_dict()}
                for s, dev in zip(t.tables, self.placement)
            ],
            "device_bytes": self.device_bytes(),
        }
        if t.pool:
            d["pool"] = t.pool
        if self.predicted is not None:
            d["predicted"] = self.predicted
        if self.notes:
            d["notes"] = self.notes
        return d

    @staticmethod
    def from_json(d: dict, where: str = "plan") -> "Plan":
        """A plan from its JSON form, checked as strictly as a table file: every table spec, the
        task (devices, memory, precision, optimizer, no table twice), every device number and
        every device's memory. Raises PlanError naming `where` and the key."""
        require_dict(d, where, f"a {FORMAT} plan", PlanError)
        if d.get("format") != FORMAT:
            raise PlanError(f"{where}: not a {FORMAT} file (format={d.get('format')!r:.40})")
        require_keys(d, ("devices", "max_memory_bytes", "tables"), where, PlanError)
        devices = parse_int(d["devices"], where, "key 'devices'", 1, MAX_DEVICES, PlanError)
        cap = parse_int(d["max_memory_bytes"], where, "key 'max_memory_bytes'", 1, MAX_MEMORY_BYTES, PlanError)
        entries = require_list(d["tables"], where, "key 'tables'", PlanError, MAX_TABLES)
        specs, placement = [], []
        for i, e in enumerate(entries):
            at = f"{where}, table {i}"
            require_dict(e, at, "a table entry", PlanError)
            require_keys(e, ("spec", "device"), at, PlanError)
            try:
                specs.append(table_from_record(require_dict(e["spec"], f"{at}, key 'spec'", "a table spec", PlanError), f"{at}, spec", "key"))
            except TableError as err:
                raise PlanError(str(err)) from None
            placement.append(parse_int(e["device"], at, "key 'device'", 0, devices - 1, PlanError))
        planner = d.get("planner", "?")
        if not isinstance(planner, str):
            raise PlanError(f"{where}, key 'planner': {planner!r:.40} must be a string")
        predicted = d.get("predicted")
        if predicted is not None and not isinstance(predicted, dict):
            raise PlanError(f"{where}, key 'predicted': expected an object or null")
        notes = d.get("notes", [])
        if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
            raise PlanError(f"{where}, key 'notes': expected a list of strings")
        pool = d.get("pool")
        if pool is not None and not isinstance(pool, str):
            raise PlanError(f"{where}, key 'pool': {pool!r:.40} must be a string")
        task = Task(specs, devices, cap, d.get("precision", "fp16"), d.get("optimizer", "sgd"), pool).validate(where, PlanError)
        plan = Plan(task, placement, planner, predicted, notes)
        plan.check(where)
        return plan


def save_plans(plans: Sequence[Plan], path: str | Path) -> None:
    """One plan → indented JSON; several (or a .jsonl path) → JSON lines. Written atomically."""
    path = Path(path)
    if len(plans) == 1 and path.suffix != ".jsonl":
        text = json.dumps(plans[0].to_json(), indent=1)
    else:
        text = "".join(json.dumps(p.to_json()) + "\n" for p in plans)
    atomic_write(path, text)


def load_plans(path: str | Path) -> list[Plan]:
    """Read a plan file (one JSON plan, or JSON lines of plans with a .jsonl name); PlanError on any fault."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"{path}: no such file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"{path}: cannot read ({one_line(getattr(e, 'strerror', None) or e)})") from None
    if path.suffix == ".jsonl":
        docs = [(f"{path}: line {i}", line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(docs) > MAX_TASKS:
            raise PlanError(f"{path}: {len(docs):,} plans, over the limit of {MAX_TASKS:,}")
    else:
        docs = [(str(path), text)]
    plans = []
    for where, doc in docs:
        try:
            d = json.loads(doc)
        except json.JSONDecodeError as e:
            raise PlanError(f"{where}: line {e.lineno}: invalid JSON ({e.msg})" if len(docs) == 1 else f"{where}: invalid JSON ({e.msg})") from None
        except RecursionError:
            raise PlanError(f"{where}: JSON nested too deeply") from None
        plans.append(Plan.from_json(d, where))
    if not plans:
        raise PlanError(f"{path}: no plans")
    return plans
