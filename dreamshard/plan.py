"""Plans: which device each table goes to, as a file a cost backend can measure by itself.

The plan carries every table's full spec (with its stream descriptor), so `dreamshard measure
PLAN.json` rebuilds the exact index streams with no other argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from dreamshard.tables import TableError, TableSpec
from dreamshard.tasks import Task

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

    def check(self) -> None:
        """Raise ValueError if a table is off the devices or a device is over its memory."""
        for t, d in zip(self.task.tables, self.placement):
            if not 0 <= d < self.devices:
                raise ValueError(f"table {t.name} on device {d}, outside 0..{self.devices - 1}")
        for d, used in enumerate(self.device_bytes()):
            if used > self.task.max_memory_bytes:
                raise ValueError(f"device {d} holds {used} bytes, over its {self.task.max_memory_bytes}")

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
        if d.get("format") != FORMAT:
            raise TableError(f"{where}: not a {FORMAT} file (format={d.get('format')!r})")
        try:
            specs = [TableSpec.from_dict(e["spec"]) for e in d["tables"]]
            task = Task(specs, int(d["devices"]), int(d["max_memory_bytes"]), d.get("precision", "fp16"), d.get("optimizer", "sgd"), d.get("pool"))
            plan = Plan(task, [int(e["device"]) for e in d["tables"]], d.get("planner", "?"), d.get("predicted"), d.get("notes", []))
        except (KeyError, TypeError, ValueError) as e:
            raise TableError(f"{where}: malformed plan ({type(e).__name__}: {e})") from None
        try:
            plan.check()
        except ValueError as e:
            raise TableError(f"{where}: {e}") from None
        return plan


def save_plans(plans: Sequence[Plan], path: str | Path) -> None:
    """One plan → indented JSON; several (or a .jsonl path) → JSON lines. Written atomically."""
    path = Path(path)
    if len(plans) == 1 and path.suffix != ".jsonl":
        text = json.dumps(plans[0].to_json(), indent=1)
    else:
        text = "".join(json.dumps(p.to_json()) + "\n" for p in plans)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_plans(path: str | Path) -> list[Plan]:
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    text = path.read_text()
    try:
        if path.suffix == ".jsonl":
            return [Plan.from_json(json.loads(line), f"{path}: line {i}") for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        return [Plan.from_json(json.loads(text), str(path))]
    except json.JSONDecodeError as e:
        raise TableError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
