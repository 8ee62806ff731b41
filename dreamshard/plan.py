"""Plans: a list of shards, each a column range and a row range of one table on one device, as a
file a cost backend can measure by itself.

A table-wise plan is one full shard per table; a column-wise split cuts a table's dim into
ranges that may sit on different devices. Every column shard of a table reads the same index
stream (same rows, same lookups) and holds only its columns, so it costs the table's lookups at a
smaller width and its all-to-all follows the device's dim sum.

A row-wise split cuts a table's rows into ranges on distinct devices, each holding every column
(`rowshard.py`): a row shard looks up only the indices of the stream in its range and yields
partial pooled sums for the whole batch, which a reduce-scatter sums (costs/comm.py). On one host
table-row-wise (TorchRec's TWRW: row-wise within one host) is the same thing; on a task of several
hosts (its "topology", topology.py) a table whose row shards all lie in one host is table-row-wise,
priced so (costs/hierarchy.py) and exported so (torchrec_io.py).
A table may also be cut both ways, as a *grid* (TorchRec's grid sharding): its columns cut into
ranges, each range split by rows over distinct devices — each column range a row-wise table of
its own width to every backend (`Shard.spec`: the row shard of the column shard), its rows'
partial sums reduce-scattered with the other row-wise tables' (on several hosts, inside the host
that holds the range: table-row-wise per column block).

The plan carries every table's full spec (with its stream descriptor), so `dreamshard measure
PLAN.json` rebuilds the exact index streams with no other argument. Format `dreamshard.plan/2`
(tables, each with its list of shards, and the workload), or `dreamshard.plan/3` — the same with
`"rows": [start, stop]` on row shards, written only for plans that have some, so that a reader
of /2 refuses them by name instead of misreading them; `dreamshard.plan/1` files (one device per
table) still load. A plan with shards outside HBM (tiers.py: `"tier": "uvm"` or `"uvm_caching"`
with its `"cache_ratio"`, and the task's `host_memory_bytes`) is `dreamshard.plan/4`, for the same
reason; a shard without a tier is in HBM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Sequence

from dreamshard.files import read_text, write_text
from dreamshard.tables import TableSpec, table_from_record
from dreamshard.tasks import Task, Workload, topology_from
from dreamshard.tiers import HBM, Tier, cache_rows, hbm_bytes, host_bytes, tier_of
from dreamshard.validation import (
    loads_unique,
    DIM_MULTIPLE,
    MAX_DEVICES,
    MAX_MEMORY_BYTES,
    MAX_TABLES,
    MAX_TASKS,
    MIN_DIM,
    PlanError,
    TableError,
    one_line,
    parse_float,
    parse_int,
    require_dict,
    require_keys,
    require_list,
)

FORMAT = "dreamshard.plan/2"
ROW_FORMAT = "dreamshard.plan/3"  # a plan with row shards
TIER_FORMAT = "dreamshard.plan/4"  # a plan with shards outside HBM (tiers.py)
READS = ("dreamshard.plan/1", FORMAT, ROW_FORMAT, TIER_FORMAT)


@dataclass(frozen=True)
class Shard:
    """Columns [start, stop) and rows [row_start, row_stop) of table `table` (its index in the
    task) on device `device`; row_stop None: to the table's last row (a `Plan` stores a range that
    covers every row so)."""

    table: int
    device: int
    start: int
    stop: int
    row_start: int = 0
    row_stop: int | None = None
    tier: str = "hbm"  # where its rows live (tiers.TIERS)
    cache_ratio: float = 0.0  # uvm_caching: the share of its rows its HBM cache holds

    @property
    def width(self) -> int:
        return self.stop - self.start

    @property
    def is_row_shard(self) -> bool:
        return self.row_stop is not None or self.row_start != 0

    def row_range(self, table: TableSpec) -> tuple[int, int]:
        return self.row_start, table.rows if self.row_stop is None else self.row_stop

    def spec(self, table: TableSpec) -> TableSpec:
        """The shard as a table a kernel or model can price: a column shard has the table's
        stream at its own width; a row shard (`streams.row_shard_spec`) the table's stream
        restricted to its rows, with its measured pooling factor and bins."""
        columns = table if self.start == 0 and self.stop == table.dim else replace(table, name=f"{table.name}[{self.start}:{self.stop}]", dim=self.width)
        if self.is_row_shard:  # a grid's piece: the row shard of its column range (the same stream at its width)
            from dreamshard.streams import row_shard_spec  # torch: only for plans with row shards

            return row_shard_spec(columns, *self.row_range(table))
        return columns

    def bytes(self, table: TableSpec, precision: str = "fp16", optimizer: str = "sgd") -> int:
        """Device (HBM) memory of the shard: its rows × its columns (and its rows' optimizer state);
        outside HBM its cache and the cache's index, or nothing (tiers.hbm_bytes)."""
        a, b = self.row_range(table)
        if self.tier != "hbm":
            return hbm_bytes(b - a, self.width, self.tier, self.cache_ratio, precision, optimizer)
        # the table's formula on the shard's extent: a TableSpec built for it would validate every
        # field, most of the time of the split searches' memory checks
        return TableSpec.bytes(_Extent(b - a, self.width), precision, optimizer)

    def host_bytes(self, table: TableSpec, precision: str = "fp16", optimizer: str = "sgd") -> int:
        """Host memory of the shard: all of its bytes in a host tier, none in HBM."""
        a, b = self.row_range(table)
        return host_bytes(b - a, self.width, self.tier, precision, optimizer)

    def cache_rows(self, table: TableSpec) -> int:
        """Rows its HBM cache holds (uvm_caching), 0 otherwise."""
        a, b = self.row_range(table)
        return cache_rows(b - a, self.cache_ratio) if self.tier == "uvm_caching" else 0

    @property
    def tier_spec(self) -> Tier:
        return Tier(self.tier, self.cache_ratio)


class _Extent(NamedTuple):
    """Rows × columns, all of a TableSpec that `TableSpec.bytes` reads."""

    rows: int
    dim: int


def column_cuts(dim: int, parts: int) -> list[tuple[int, int]]:
    """`parts` column ranges of about equal width, each a multiple of DIM_MULTIPLE (the kernels'
    granularity) — the wider ones first. `parts` must be at most dim / DIM_MULTIPLE."""
    units = dim // DIM_MULTIPLE
    if not 1 <= parts <= units:
        raise ValueError(f"cannot cut dim {dim} into {parts} column ranges of at least {DIM_MULTIPLE}")
    base, extra = divmod(units, parts)
    cuts, start = [], 0
    for k in range(parts):
        stop = start + (base + (k < extra)) * DIM_MULTIPLE
        cuts.append((start, stop))
        start = stop
    return cuts


def row_cuts(rows: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous row ranges of about equal size (the larger first) that tile [0, rows)."""
    if not 1 <= parts <= rows:
        raise ValueError(f"cannot cut {rows} rows into {parts} row ranges")
    base, extra = divmod(rows, parts)
    cuts, start = [], 0
    for k in range(parts):
        stop = start + base + (k < extra)
        cuts.append((start, stop))
        start = stop
    return cuts


@dataclass
class Plan:
    task: Task
    shards: list[Shard]  # sorted by (table, start, row_start); every table's shards tile its columns or its rows
    planner: str
    predicted: dict | None = None  # planner's own predicted costs, where it has a model
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        tables = self.task.tables
        # one form per range: a row range of every row is no row range (row_stop None)
        self.shards = sorted((replace(s, row_start=0, row_stop=None) if 0 <= s.table < len(tables) and s.row_start == 0 and s.row_stop == tables[s.table].rows else s
                              for s in self.shards), key=lambda s: (s.table, s.start, s.row_start))
        if self.task.tiers is not None:  # planned under the tier stage's choice: every shard in its table's tier
            def tiered(s: Shard) -> Shard:
                t = tier_of(self.task.tiers, tables[s.table].name) if 0 <= s.table < len(tables) else HBM
                return replace(s, tier=t.kind, cache_ratio=t.cache_ratio)

            self.shards = [tiered(s) for s in self.shards]

    @staticmethod
    def table_wise(task: Task, placement: Sequence[int], planner: str, predicted: dict | None = None, notes: Sequence[str] = ()) -> "Plan":
        """One full-width shard per table: `placement[i]` is table i's device."""
        if len(placement) != len(task.tables):
            raise ValueError(f"placement has {len(placement)} entries for {len(task.tables)} tables")
        shards = [Shard(i, int(d), 0, t.dim) for i, (t, d) in enumerate(zip(task.tables, placement))]
        return Plan(task, shards, planner, predicted, list(notes))

    @property
    def devices(self) -> int:
        return self.task.devices

    @property
    def workload(self) -> Workload:
        return self.task.workload

    @property
    def is_table_wise(self) -> bool:
        return len(self.shards) == len(self.task.tables)

    @property
    def placement(self) -> list[int]:
        """Each table's device, for a table-wise plan."""
        if not self.is_table_wise:
            raise ValueError(f"plan of {self.planner} splits tables: it has no one device per table")
        return [s.device for s in self.shards]

    def split_tables(self) -> dict[str, int]:
        """Name → number of shards, for the tables cut into more than one."""
        counts: dict[int, int] = {}
        for s in self.shards:
            counts[s.table] = counts.get(s.table, 0) + 1
        return {self.task.tables[i].name: n for i, n in counts.items() if n > 1}

    def column_cut_tables(self) -> set[int]:
        """The tables (indices) the plan cuts into column pieces: some shard narrower than its table."""
        return {s.table for s in self.shards if s.start > 0 or s.stop < self.task.tables[s.table].dim}

    @property
    def kind(self) -> str:
        """table-wise, columns, rows or rows+columns: the shard kinds the plan holds beside whole tables."""
        rows, cols = self.has_row_shards(), bool(self.column_cut_tables())
        return "rows+columns" if rows and cols else "rows" if rows else "columns" if cols else "table-wise"

    def layout(self) -> list[tuple]:
        """Every shard as (table, device, columns, rows), sorted: two plans of one task with the
        same layout are the same plan (`bench.plan_hash` files measurements under it)."""
        return sorted((s.table, s.device, s.start, s.stop, s.row_start, s.row_stop) for s in self.shards)

    def shard_specs(self) -> list[TableSpec]:
        return [s.spec(self.task.tables[s.table]) for s in self.shards]

    def device_tables(self) -> list[list[TableSpec]]:
        """What each device holds, as tables a cost backend prices (list index = device)."""
        out: list[list[TableSpec]] = [[] for _ in range(self.devices)]
        for s, spec in zip(self.shards, self.shard_specs()):
            out[s.device].append(spec)
        return out

    def has_row_shards(self) -> bool:
        return any(s.is_row_shard for s in self.shards)

    def has_tiers(self) -> bool:
        """Whether some shard lives outside HBM."""
        return any(s.tier != "hbm" for s in self.shards)

    def device_host_bytes(self) -> list[int]:
        """Host memory each device's shards take (the host-tier shards')."""
        used = [0] * self.devices
        w = self.workload
        for s in self.shards:
            if s.tier != "hbm":
                used[s.device] += s.host_bytes(self.task.tables[s.table], w.precision, w.optimizer)
        return used

    def device_bytes(self) -> list[int]:
        used = [0] * self.devices
        w = self.workload
        for s in self.shards:
            used[s.device] += s.bytes(self.task.tables[s.table], w.precision, w.optimizer)
        return used

    def check(self, where: str = "plan") -> None:
        """Raise PlanError unless every shard is on a device, every table's shards tile its columns
        exactly (widths multiples of DIM_MULTIPLE, no gap, no overlap) or, for a row-wise table,
        its rows (full-width shards on distinct devices, no gap, no overlap), and no device is over
        its memory."""
        tables = self.task.tables
        cover = [0] * len(tables)  # next column each table's shards must start at
        row_wise = {s.table for s in self.shards if s.is_row_shard}
        for s in self.shards:
            if not 0 <= s.table < len(tables):
                raise PlanError(f"{where}: a shard of table {s.table}, outside 0..{len(tables) - 1}")
            t = tables[s.table]
            if not 0 <= s.device < self.devices:
                raise PlanError(f"{where}: table {t.name} on device {s.device}, outside 0..{self.devices - 1}")
            if s.table in row_wise:
                continue
            if s.start != cover[s.table] or not s.start < s.stop <= t.dim:
                raise PlanError(f"{where}: table {t.name}: shard columns [{s.start}, {s.stop}) do not continue its shards at column {cover[s.table]} within dim {t.dim}")
            if s.width < MIN_DIM or s.width % DIM_MULTIPLE:
                raise PlanError(f"{where}: table {t.name}: shard columns [{s.start}, {s.stop}) are {s.width} wide; use a multiple of {DIM_MULTIPLE}")
            cover[s.table] = s.stop
        for s in self.shards:
            if s.tier != "hbm" or s.cache_ratio:
                Tier(s.tier, s.cache_ratio).check(f"{where}: table {tables[s.table].name}", PlanError)
        for i in sorted(row_wise):
            self._check_rows(i, where)
            cover[i] = tables[i].dim
        for i, t in enumerate(tables):
            if cover[i] != t.dim:
                raise PlanError(f"{where}: table {t.name}: shards cover columns [0, {cover[i]}) of its {t.dim}")
        for d, used in enumerate(self.device_bytes()):
            if used > self.task.max_memory_bytes:
                raise PlanError(f"{where}: device {d} holds {used:,} bytes, over its max_memory_bytes {self.task.max_memory_bytes:,}")
        if self.has_tiers():
            for d, used in enumerate(self.device_host_bytes()):
                if used > self.task.host_memory_bytes:
                    raise PlanError(f"{where}: device {d} holds {used:,} bytes in host memory, over its host_memory_bytes {self.task.host_memory_bytes:,}")

    def _check_rows(self, i: int, where: str) -> None:
        """Table i's shards are row shards: their column ranges tile its columns (one range: every
        column; several: a grid), and within each range they tile its rows on distinct devices."""
        t = self.task.tables[i]
        by_columns: dict[tuple[int, int], list[Shard]] = {}
        for s in self.shards:
            if s.table == i:
                by_columns.setdefault((s.start, s.stop), []).append(s)
        cols = 0
        for (c0, c1), shards in sorted(by_columns.items()):
            span = "" if (c0, c1) == (0, t.dim) else f" in columns [{c0}, {c1})"
            if c0 != cols or not c0 < c1 <= t.dim:
                raise PlanError(f"{where}: table {t.name}: row shards of columns [{c0}, {c1}) do not continue its column ranges at column {cols} within dim {t.dim} "
                                f"(a grid's column ranges tile the table's columns)")
            if c1 - c0 < MIN_DIM or (c1 - c0) % DIM_MULTIPLE:
                raise PlanError(f"{where}: table {t.name}: shard columns [{c0}, {c1}) are {c1 - c0} wide; use a multiple of {DIM_MULTIPLE}")
            cols, cover, devices = c1, 0, set()
            for s in sorted(shards, key=lambda s: s.row_start):
                a, b = s.row_range(t)
                if a != cover or not a < b <= t.rows:
                    raise PlanError(f"{where}: table {t.name}: shard rows [{a}, {b}){span} do not continue its shards at row {cover} within its {t.rows} rows")
                if s.device in devices:
                    raise PlanError(f"{where}: table {t.name}: two of its row shards{span} on device {s.device}; put a table's row shards on distinct devices")
                devices.add(s.device)
                cover = b
            if cover != t.rows:
                raise PlanError(f"{where}: table {t.name}: shards{span} cover rows [0, {cover}) of its {t.rows}")
        if cols != t.dim:
            raise PlanError(f"{where}: table {t.name}: shards cover columns [0, {cols}) of its {t.dim}")

    def to_json(self) -> dict:
        t = self.task
        by_table: list[list[Shard]] = [[] for _ in t.tables]
        for s in self.shards:
            by_table[s.table].append(s)
        w = t.workload

        def shard_json(s: Shard, spec: TableSpec) -> dict:
            out = {"device": s.device, "columns": [s.start, s.stop]}
            if s.is_row_shard:
                out["rows"] = list(s.row_range(spec))
            out["bytes"] = s.bytes(spec, w.precision, w.optimizer)
            if s.tier != "hbm":
                out["tier"] = s.tier
                if s.tier == "uvm_caching":
                    out["cache_ratio"] = s.cache_ratio
                    out["cache_rows"] = s.cache_rows(spec)
                out["host_bytes"] = s.host_bytes(spec, w.precision, w.optimizer)
            return out

        d = {
            "format": TIER_FORMAT if self.has_tiers() else ROW_FORMAT if self.has_row_shards() else FORMAT,
            "devices": t.devices,
            "max_memory_bytes": t.max_memory_bytes,
            "planner": self.planner,
            "workload": t.workload.to_json(),
            "tables": [
                {
                    "name": spec.name,
                    "bytes": t.table_bytes(spec),
                    "spec": spec.to_dict(),
                    "shards": [shard_json(s, spec) for s in shards],
                }
                for spec, shards in zip(t.tables, by_table)
            ],
            "device_bytes": self.device_bytes(),
        }
        if t.pool:
            d["pool"] = t.pool
        if t.host_memory_bytes:
            d["host_memory_bytes"] = t.host_memory_bytes
        if self.has_tiers():
            d["device_host_bytes"] = self.device_host_bytes()
        if t.topology is not None:  # absent: one host (files of plans without one read as before)
            d["topology"] = t.topology.to_json()
        if self.predicted is not None:
            d["predicted"] = self.predicted
        if self.notes:
            d["notes"] = self.notes
        return d

    @staticmethod
    def from_json(d: dict, where: str = "plan") -> "Plan":
        """A plan from its JSON form (plan/3 or /2, or plan/1: one device per table), checked as
        strictly as a table file: every table spec, the task (devices, memory, workload, no table
        twice), every shard's device, columns and rows and every device's memory. Raises PlanError
        naming `where` and the key."""
        require_dict(d, where, f"a {FORMAT} plan", PlanError)
        version = d.get("format")
        if version not in READS:
            raise PlanError(f"{where}: not a {TIER_FORMAT} (or /3, /2, /1) file (format={version!r:.40})")
        require_keys(d, ("devices", "max_memory_bytes", "tables"), where, PlanError)
        devices = parse_int(d["devices"], where, "key 'devices'", 1, MAX_DEVICES, PlanError, text=False)
        cap = parse_int(d["max_memory_bytes"], where, "key 'max_memory_bytes'", 1, MAX_MEMORY_BYTES, PlanError, text=False)
        entries = require_list(d["tables"], where, "key 'tables'", PlanError, MAX_TABLES)
        specs, shards = [], []
        for i, e in enumerate(entries):
            at = f"{where}, table {i}"
            require_dict(e, at, "a table entry", PlanError)
            require_keys(e, ("spec", "device") if version == READS[0] else ("spec", "shards"), at, PlanError)
            try:
                spec = table_from_record(require_dict(e["spec"], f"{at}, key 'spec'", "a table spec", PlanError), f"{at}, spec", "key")
            except TableError as err:
                raise PlanError(str(err)) from None
            specs.append(spec)
            if version == READS[0]:
                shards.append(Shard(i, parse_int(e["device"], at, "key 'device'", 0, devices - 1, PlanError, text=False), 0, spec.dim))
                continue
            for k, s in enumerate(require_list(e["shards"], at, "key 'shards'", PlanError, max(spec.dim // DIM_MULTIPLE, devices))):
                sat = f"{at}, shard {k}"
                require_dict(s, sat, "a shard", PlanError)
                require_keys(s, ("device", "columns"), sat, PlanError)
                cols = require_list(s["columns"], sat, "key 'columns'", PlanError, 2)
                if len(cols) != 2:
                    raise PlanError(f"{sat}, key 'columns': expected [start, stop]")
                start = parse_int(cols[0], sat, "key 'columns' start", 0, spec.dim, PlanError, text=False)
                stop = parse_int(cols[1], sat, "key 'columns' stop", 0, spec.dim, PlanError, text=False)
                row_start, row_stop = 0, None
                if "rows" in s:
                    rows = require_list(s["rows"], sat, "key 'rows'", PlanError, 2)
                    if len(rows) != 2:
                        raise PlanError(f"{sat}, key 'rows': expected [start, stop]")
                    row_start = parse_int(rows[0], sat, "key 'rows' start", 0, spec.rows, PlanError, text=False)
                    row_stop = parse_int(rows[1], sat, "key 'rows' stop", 0, spec.rows, PlanError, text=False)
                tier = Tier()
                if "tier" in s or "cache_ratio" in s:
                    if version != TIER_FORMAT:
                        raise PlanError(f"{sat}: a tier in a {version} plan; plans with tiers are {TIER_FORMAT}")
                    ratio = s.get("cache_ratio", 0.0)
                    tier = Tier(s.get("tier", "hbm"), parse_float(ratio, sat, "key 'cache_ratio'", 0.0, 1.0, PlanError, text=False)).check(sat, PlanError)
                shards.append(Shard(i, parse_int(s["device"], sat, "key 'device'", 0, devices - 1, PlanError, text=False), start, stop, row_start, row_stop,
                                    tier.kind, tier.cache_ratio))
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
        workload = d if version == READS[0] else require_dict(d.get("workload", {}), where, "key 'workload' as an object", PlanError)
        host = parse_int(d.get("host_memory_bytes", 0), where, "key 'host_memory_bytes'", 0, MAX_MEMORY_BYTES, PlanError, text=False)
        task = Task(specs, devices, cap, Workload.from_json(workload, where, PlanError), pool, host_memory_bytes=host,
                    topology=topology_from(d, where, PlanError)).validate(where, PlanError)
        plan = Plan(task, shards, planner, predicted, notes)
        plan.check(where)
        return plan


def _indented(d: dict) -> str:
    """A plan as JSON for people: a line per key and a line per table. json's C encoder writes
    each line; json.dumps with `indent` runs the pure-Python encoder, 4.5 s for 20,000 tables."""
    parts = []
    for key, value in d.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            body = ",\n  ".join(json.dumps(item) for item in value)
            parts.append(f" {json.dumps(key)}: [\n  {body}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def is_lines(path: Path) -> bool:
    """A file of JSON lines of plans: a .jsonl name, or .jsonl.gz (gzipped: plans carry their
    tables' statistics, and a campaign's hundreds of them compress about 4×)."""
    return path.suffix == ".jsonl" or path.name.endswith(".jsonl.gz")


def save_plans(plans: Sequence[Plan], path: str | Path) -> None:
    """One plan → indented JSON; several (or a .jsonl or .jsonl.gz path) → JSON lines. Written atomically."""
    path = Path(path)
    if len(plans) == 1 and not is_lines(path):
        text = _indented(plans[0].to_json())
    else:
        text = "".join(json.dumps(p.to_json()) + "\n" for p in plans)
    write_text(path, text)


def load_plans(path: str | Path) -> list[Plan]:
    """Read a plan file (one JSON plan, or JSON lines of plans with a .jsonl or .jsonl.gz name); PlanError on any fault."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"{path}: no such file")
    try:
        text = read_text(path)
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise PlanError(f"{path}: cannot read ({one_line(getattr(e, 'strerror', None) or e)})") from None
    if is_lines(path):
        docs = [(f"{path}: line {i}", line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(docs) > MAX_TASKS:
            raise PlanError(f"{path}: {len(docs):,} plans, over the limit of {MAX_TASKS:,}")
    else:
        docs = [(str(path), text)]
    plans = []
    for where, doc in docs:
        try:
            d = loads_unique(doc, where, PlanError, lines=len(docs) == 1)
        except json.JSONDecodeError as e:
            raise PlanError(f"{where}: line {e.lineno}: invalid JSON ({e.msg})" if len(docs) == 1 else f"{where}: invalid JSON ({e.msg})") from None
        except RecursionError:
            raise PlanError(f"{where}: JSON nested too deeply") from None
        plans.append(Plan.from_json(d, where))
    if not plans:
        raise PlanError(f"{path}: no plans")
    return plans
