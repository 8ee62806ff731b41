"""Embedding-table specs, their 21 features, and the table file formats (CSV, JSON).

A table is what a planner places: its size decides where it *may* go (memory), its access
pattern decides what it *costs* there. DreamShard describes the access pattern with a 17-bin
reuse histogram (DESIGN.md §2): bin i holds the fraction of the table's distinct accessed rows
whose access count in one batch falls in (0,1], (1,2], (2,4], ..., (2^14, 2^15], and > 2^15.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

NUM_BINS = 17
BIN_EDGES = [0] + [2**i for i in range(16)]  # lower edges: (0,1], (1,2], (2,4], ... , (2^15, inf)
BIN_LABELS = [f"({BIN_EDGES[i]},{BIN_EDGES[i + 1]}]" for i in range(16)] + [f"({2**15},inf)"]
NUM_FEATURES = 4 + NUM_BINS
FEATURE_NAMES = ["dim", "rows", "pooling_factor", "size"] + [f"bin_{i}" for i in range(NUM_BINS)]
PRECISION_BYTES = {"fp16": 2, "fp32": 4}
OPTIMIZERS = ("sgd", "rowwise_adagrad")
REFERENCE_BATCH = 65_536  # batch size at which reuse bins are defined (the 2021 DLRM file's)


class TableError(ValueError):
    """A table file or spec is invalid; the message names the place and what to fix."""


@dataclass(frozen=True)
class TableSpec:
    """One embedding table.

    `distribution` says where the table's index stream comes from: `uniform`, `zipf:<alpha>`
    (synthetic, regenerated from `seed`), or `dlrm:<file>#<t>` (table t of a DLRM-format file).
    """

    name: str
    rows: int
    dim: int
    pooling_factor: float
    bins: tuple[float, ...] = field(default=(1.0,) + (0.0,) * (NUM_BINS - 1))
    distribution: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.bins) != NUM_BINS:
            raise TableError(f"table {self.name!r}: expected {NUM_BINS} reuse bins, got {len(self.bins)}")

    def bytes(self, precision: str = "fp16", optimizer: str = "sgd") -> int:
        """Device memory of the table: weights, plus one fp32 per row for row-wise Adagrad."""
        state = 4 * self.rows if optimizer == "rowwise_adagrad" else 0
        return self.rows * self.dim * PRECISION_BYTES[precision] + state

    @property
    def lookup(self) -> float:
        """Floats gathered per sample: the 'lookup' cost proxy of DESIGN.md §2."""
        return self.dim * self.pooling_factor

    def raw_features(self, precision: str = "fp16") -> list[float]:
        return [self.dim, self.rows, self.pooling_factor, self.bytes(precision), *self.bins]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bins"] = list(self.bins)
        return d

    @staticmethod
    def from_dict(d: dict) -> "TableSpec":
        return TableSpec(
            name=str(d["name"]),
            rows=int(d["rows"]),
            dim=int(d["dim"]),
            pooling_factor=float(d["pooling_factor"]),
            bins=tuple(float(b) for b in d.get("bins", (1.0,) + (0.0,) * (NUM_BINS - 1))),
            distribution=d.get("distribution"),
            seed=int(d.get("seed", 0)),
        )


# --------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------

# Fixed log-scale references: a table's features do not depend on which other tables share its
# task, so a cost net trained on one task mix means the same thing on another.
_LOG_SCALE = {"dim": math.log2(256), "rows": math.log10(1e9), "pooling_factor": math.log1p(1000.0), "size": math.log10(1e12)}


def features(tables: Sequence[TableSpec], normalization: str = "fixed", precision: str = "fp16") -> np.ndarray:
    """The [T, 21] feature matrix.

    `fixed` (default): dim → log2(dim)/8, rows → log10(rows)/9, pooling → log1p(pf)/log1p(1000),
    size → log10(bytes)/12; bins unchanged. Every value lands in about [0, 1] for any realistic
    table, independently of the task.

    `task`: the reference code's scheme — dim/rows/pooling/size z-scored across the tables of
    this task (bins unchanged). A table's features then change with its companions.
    """
    raw = np.array([t.raw_features(precision) for t in tables], dtype=np.float64).reshape(-1, NUM_FEATURES)
    out = raw.copy()
    if normalization == "fixed":
        out[:, 0] = np.log2(np.maximum(raw[:, 0], 1)) / _LOG_SCALE["dim"]
        out[:, 1] = np.log10(np.maximum(raw[:, 1], 1)) / _LOG_SCALE["rows"]
        out[:, 2] = np.log1p(raw[:, 2]) / _LOG_SCALE["pooling_factor"]
        out[:, 3] = np.log10(np.maximum(raw[:, 3], 1)) / _LOG_SCALE["size"]
    elif normalization == "task":
        head = raw[:, :4]
        std = head.std(axis=0)
        out[:, :4] = (head - head.mean(axis=0)) / np.where(std > 0, std, 1.0)
    else:
        raise ValueError(f"unknown feature normalization {normalization!r} (use 'fixed' or 'task')")
    return out.astype(np.float32)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------

BIN_COLUMNS = [f"bin_{i}" for i in range(NUM_BINS)]
REQUIRED_COLUMNS = ["name", "rows", "dim", "pooling_factor"]


def _parse_int(text: str, where: str, column: str, minimum: int) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TableError(f"{where}, column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise TableError(f"{where}, column {column!r}: {text!r} is not an integer")
    if value < minimum:
        raise TableError(f"{where}, column {column!r}: {text!r} must be >= {minimum}")
    return int(value)


def _parse_float(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TableError(f"{where}, column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TableError(f"{where}, column {column!r}: {text!r} is not finite")
    if value < 0:
        raise TableError(f"{where}, column {column!r}: {text!r} must be >= 0")
    return value


def validate_distribution(text: str, where: str) -> str:
    text = text.strip()
    if text == "uniform":
        return text
    if text.startswith("zipf:"):
        try:
            alpha = float(text[5:])
        except ValueError:
            alpha = float("nan")
        if not (math.isfinite(alpha) and alpha > 0):
            raise TableError(f"{where}, column 'distribution': {text!r} needs a positive alpha, e.g. zipf:1.05")
        return text
    if text.startswith("dlrm:") and "#" in text:
        return text
    raise TableError(f"{where}, column 'distribution': {text!r} is not 'uniform', 'zipf:<alpha>' or 'dlrm:<file>#<t>'")


def table_from_record(rec: dict, where: str) -> TableSpec:
    """Validate one record (a CSV row or JSON object) and build its spec, deriving bins if asked."""
    from dreamshard.streams import reuse_bins  # streams imports this module

    for col in REQUIRED_COLUMNS:
        if rec.get(col) in (None, ""):
            raise TableError(f"{where}: missing value in column {col!r}")
    name = str(rec["name"]).strip()
    rows = _parse_int(str(rec["rows"]), where, "rows", 1)
    dim = _parse_int(str(rec["dim"]), where, "dim", 1)
    if dim % 4:
        raise TableError(f"{where}, column 'dim': {dim} is not a positive multiple of 4")
    pf = _parse_float(str(rec["pooling_factor"]), where, "pooling_factor")
    seed = _parse_int(str(rec.get("seed") or 0), where, "seed", 0)
    distribution = rec.get("distribution") or None
    if distribution is not None:
        distribution = validate_distribution(str(distribution), where)
    bin_values = [rec.get(c) for c in BIN_COLUMNS]
    if "bins" in rec and isinstance(rec["bins"], list):
        bin_values = rec["bins"]
    given = [v not in (None, "") for v in bin_values]
    if any(given):
        if not all(given):
            missing = next(c for c, g in zip(BIN_COLUMNS, given) if not g)
            raise TableError(f"{where}: missing value in column {missing!r} (give all of bin_0..bin_16 or none)")
        bins = tuple(_parse_float(str(v), where, c) for v, c in zip(bin_values, BIN_COLUMNS))
        total = sum(bins)
        if pf > 0 and abs(total - 1.0) > 1e-3:
            raise TableError(f"{where}: bin_0..bin_16 sum to {total:.4f}, expected 1")
    elif distribution is not None and not distribution.startswith("dlrm:"):
        bins = tuple(reuse_bins(rows, pf, distribution))
    else:
        raise TableError(f"{where}: give either bin_0..bin_16 or a 'distribution' column")
    return TableSpec(name=name, rows=rows, dim=dim, pooling_factor=pf, bins=bins, distribution=distribution, seed=seed)


def _check_unique(tables: list[TableSpec], path: Path, lines: list[int]) -> None:
    seen: dict[str, int] = {}
    for t, line in zip(tables, lines):
        if t.name in seen:
            raise TableError(f"{path}: line {line}, column 'name': duplicate table name {t.name!r} (first on line {seen[t.name]})")
        seen[t.name] = line


def load_tables(path: str | Path) -> list[TableSpec]:
    """Read a table file (.csv or .json); raises TableError naming file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise TableError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
        records = data["tables"] if isinstance(data, dict) and "tables" in data else data
        if not isinstance(records, list):
            raise TableError(f"{path}: expected a list of tables or {{\"tables\": [...]}}")
        tables = [table_from_record(r, f"{path}: table {i}") for i, r in enumerate(records)]
        lines = list(range(len(tables)))
    else:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise TableError(f"{path}: line 1: missing column {missing[0]!r} (header needs {','.join(REQUIRED_COLUMNS)})")
            tables, lines = [], []
            for rec in reader:
                line = reader.line_num
                if None in rec:
                    raise TableError(f"{path}: line {line}: more fields than header columns")
                tables.append(table_from_record(rec, f"{path}: line {line}"))
                lines.append(line)
    if not tables:
        raise TableError(f"{path}: no tables")
    _check_unique(tables, path, lines)
    return tables


def save_tables(tables: Iterable[TableSpec], path: str | Path) -> None:
    path = Path(path)
    tables = list(tables)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps({"tables": [t.to_dict() for t in tables]}, indent=1))
        return
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUIRED_COLUMNS + ["distribution", "seed"] + BIN_COLUMNS)
        for t in tables:
            w.writerow([t.name, t.rows, t.dim, f"{t.pooling_factor:.6g}", t.distribution or "", t.seed] + [f"{b:.6g}" for b in t.bins])
