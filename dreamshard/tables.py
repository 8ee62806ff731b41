"""Embedding-table specs, their 21 features, and the table file formats (CSV, JSON).

A table is what a planner places: its size decides where it *may* go (memory), its access
pattern decides what it *costs* there. DreamShard describes the access pattern with a 17-bin
reuse histogram (docs/design.md §2; the bins and their maths are bins.py's).
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

# BIN_LABELS, REFERENCE_BATCH: cli.py, costs/sim.py and tasks.py import them from here
from dreamshard.bins import BIN_LABELS, NUM_BINS, REFERENCE_BATCH, reuse_bins, reuse_bins_many  # noqa: F401
from dreamshard.files import atomic_write
from dreamshard.validation import (
    load_json_document,
    DIM_MULTIPLE,
    MAX_DIM,
    MAX_POOLING_FACTOR,
    MAX_ROWS,
    MAX_SEED,
    MAX_TABLES,
    MAX_ZIPF_ALPHA,
    MIN_DIM,
    MIN_POOLING_FACTOR,
    TableError,
    one_line,
    parse_float,
    parse_int,
)

NUM_FEATURES = 4 + NUM_BINS
FEATURE_NAMES = ["dim", "rows", "pooling_factor", "size"] + [f"bin_{i}" for i in range(NUM_BINS)]
PRECISION_BYTES = {"fp16": 2, "fp32": 4}
OPTIMIZERS = ("sgd", "rowwise_adagrad")
MAX_BIN = 1.0 + 1e-6  # a bin is a fraction; rounding may put it a hair over 1


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
        """Specs built in code are held to the file formats' rules (see `check_values`)."""
        check_values(self.name, self.rows, self.dim, self.pooling_factor, self.bins, self.seed, f"table {self.name!r}", "field")

    def bytes(self, precision: str = "fp16", optimizer: str = "sgd") -> int:
        """Device memory of the table: weights, plus one fp32 per row for row-wise Adagrad."""
        state = 4 * self.rows if optimizer == "rowwise_adagrad" else 0
        return self.rows * self.dim * PRECISION_BYTES[precision] + state

    @property
    def lookup(self) -> float:
        """Floats gathered per sample: the 'lookup' cost proxy of docs/design.md §4."""
        return self.dim * self.pooling_factor

    def raw_features(self, precision: str = "fp16") -> list[float]:
        return [self.dim, self.rows, self.pooling_factor, self.bytes(precision), *self.bins]

    def to_dict(self) -> dict:
        # field by field: dataclasses.asdict deep-copies every value, 20x slower, and a plan of
        # 100,000 tables writes one of these per table
        return {"name": self.name, "rows": self.rows, "dim": self.dim, "pooling_factor": self.pooling_factor, "bins": list(self.bins),
                "distribution": self.distribution, "seed": self.seed}

    @staticmethod
    def from_dict(d: dict, where: str = "table spec") -> "TableSpec":
        """A spec from its `to_dict()` form, validated as strictly as a table file's row."""
        return table_from_record(d, where, label="key")


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


def check_values(name: str, rows: int, dim: int, pooling_factor: float, bins: Sequence[float], seed: int, where: str, label: str = "column") -> None:
    """The rules of a table on parsed values: the one check behind TableSpec (and so behind files,
    plans and specs built in code). Files are parsed first (`table_from_record`), naming the line."""
    if not isinstance(name, str) or not name.strip():
        raise TableError(f"{where}, {label} 'name': {name!r} must be a non-empty string")
    for key, value in (("rows", rows), ("dim", dim), ("seed", seed)):
        # type() first: isinstance against the numbers ABCs is slow, and every spec of a
        # 100,000-table file comes through here
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TableError(f"{where}, {label} {key!r}: {value!r} is not an integer")
    if not 1 <= rows <= MAX_ROWS:
        raise TableError(f"{where}, {label} 'rows': {rows} must be in 1..{MAX_ROWS:,} (the limit)")
    if dim < MIN_DIM or dim % DIM_MULTIPLE:
        raise TableError(f"{where}, {label} 'dim': {dim} is not a positive multiple of {DIM_MULTIPLE}")
    if dim > MAX_DIM:
        raise TableError(f"{where}, {label} 'dim': {dim} is over the limit of {MAX_DIM}")
    real = type(pooling_factor) in (float, int) or (not isinstance(pooling_factor, bool) and isinstance(pooling_factor, numbers.Real))
    if not real or not 0 <= pooling_factor <= MAX_POOLING_FACTOR:
        raise TableError(f"{where}, {label} 'pooling_factor': {pooling_factor!r} must be a finite number in 0..{MAX_POOLING_FACTOR:g}")
    if not 0 <= seed <= MAX_SEED:
        raise TableError(f"{where}, {label} 'seed': {seed} must be in 0..2^63-1")
    if len(bins) != NUM_BINS:
        raise TableError(f"{where}: expected {NUM_BINS} reuse bins, got {len(bins)}")
    if all(type(b) is float and 0.0 <= b <= MAX_BIN for b in bins):
        return
    for i, b in enumerate(bins):
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not 0.0 <= b <= MAX_BIN:
            raise TableError(f"{where}, {label} 'bin_{i}': {b!r} must be a fraction in [0, 1]")


def validate_distribution(text: str, where: str, label: str = "column") -> str:
    text = text.strip()
    if text == "uniform":
        return text
    if text.startswith("zipf:"):
        try:
            alpha = float(text[5:])
        except ValueError:
            alpha = float("nan")
        if not (math.isfinite(alpha) and 0 < alpha <= MAX_ZIPF_ALPHA):
            raise TableError(f"{where}, {label} 'distribution': {text!r} needs an alpha in (0, {MAX_ZIPF_ALPHA:g}], e.g. zipf:1.05")
        return text
    if text.startswith("dlrm:") and "#" in text:
        path, _, t = text[5:].rpartition("#")
        if path and t.isdigit():
            return text
    raise TableError(f"{where}, {label} 'distribution': {text!r} is not 'uniform', 'zipf:<alpha>' or 'dlrm:<file>#<table number>'")


# Placeholder bins of a spec whose bins are still to be derived from its distribution (in one
# batch for a whole file: `load_tables`); recognised by identity.
_PENDING_BINS = (1.0,) + (0.0,) * (NUM_BINS - 1)


def _fractions(values: list, text: bool) -> tuple[float, ...] | None:
    """The bins as parse_float reads them when every one is a fraction in [0, MAX_BIN], else None.
    A table's 17 bins through parse_float one by one were a third of loading 100,000 tables."""
    if not text and any(isinstance(v, (str, bool)) for v in values):
        return None
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if all(0.0 <= v <= MAX_BIN for v in out) else None  # nan fails both comparisons


def table_from_record(rec: dict, where: str, label: str = "column", derive_bins: bool = True) -> TableSpec:
    """Validate one record (a CSV row, or a JSON object with `label` "key") and build its spec,
    deriving bins from the distribution if none are given (with derive_bins=False, leaving
    `_PENDING_BINS` for the caller to fill in a batch)."""
    if not isinstance(rec, dict):
        raise TableError(f"{where}: expected a table (an object with {', '.join(REQUIRED_COLUMNS)}), got {type(rec).__name__} {rec!r:.40}")
    for col in REQUIRED_COLUMNS:
        if rec.get(col) in (None, ""):
            raise TableError(f"{where}: missing value in {label} {col!r}")
    if not isinstance(rec["name"], (str, int)) or isinstance(rec["name"], bool):
        raise TableError(f"{where}, {label} 'name': {rec['name']!r:.40} must be a string")
    name = str(rec["name"]).strip()
    if not name:
        raise TableError(f"{where}: missing value in {label} 'name'")

    def at(col: str) -> str:
        return f"{label} {col!r}"

    text = label != "key"  # a CSV cell is text; a JSON value must be a number where a number belongs

    rows = parse_int(rec["rows"], where, at("rows"), 1, MAX_ROWS, TableError, text=text)
    dim = parse_int(rec["dim"], where, at("dim"), 1, MAX_DIM, TableError, text=text)
    if dim % DIM_MULTIPLE:
        raise TableError(f"{where}, {at('dim')}: {dim} is not a positive multiple of {DIM_MULTIPLE}")
    pf = parse_float(rec["pooling_factor"], where, at("pooling_factor"), 0.0, MAX_POOLING_FACTOR, TableError, text=text)
    if 0 < pf < MIN_POOLING_FACTOR:
        raise TableError(f"{where}, {at('pooling_factor')}: {pf:g} is below {MIN_POOLING_FACTOR:g} (the limit); give 0 for a table that is never looked up")
    seed = parse_int(rec.get("seed") if rec.get("seed") not in (None, "") else 0, where, at("seed"), 0, MAX_SEED, TableError, text=text)
    distribution = rec.get("distribution")
    if distribution in (None, ""):
        distribution = None
    elif not isinstance(distribution, str):
        raise TableError(f"{where}, {at('distribution')}: {distribution!r:.40} must be a string")
    else:
        distribution = validate_distribution(distribution, where, label)
    bin_values = [rec.get(c) for c in BIN_COLUMNS]
    given = [v not in (None, "") for v in bin_values]
    if "bins" in rec and rec["bins"] is not None:  # JSON: a list of 17 numbers, every one given
        if not isinstance(rec["bins"], list) or len(rec["bins"]) != NUM_BINS:
            raise TableError(f"{where}, {at('bins')}: expected a list of {NUM_BINS} fractions")
        bin_values, given = rec["bins"], [True] * NUM_BINS
    if any(given):
        if not all(given):
            missing = next(c for c, g in zip(BIN_COLUMNS, given) if not g)
            raise TableError(f"{where}: missing value in {at(missing)} (give all of bin_0..bin_16 or none)")
        bins = _fractions(bin_values, text)
        if bins is None:  # one is not a fraction: the parser names it
            bins = tuple(parse_float(v, where, at(c), 0.0, MAX_BIN, TableError, text=text) for v, c in zip(bin_values, BIN_COLUMNS))
        total = sum(bins)
        if pf > 0 and abs(total - 1.0) > 1e-3:
            raise TableError(f"{where}: bin_0..bin_16 sum to {total:.4f}, expected 1")
    elif distribution is not None and not distribution.startswith("dlrm:"):
        bins = tuple(reuse_bins(rows, pf, distribution)) if derive_bins else _PENDING_BINS
    else:
        raise TableError(f"{where}: give either bin_0..bin_16 or a 'distribution' {label}")
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
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"{path}: cannot read ({one_line(getattr(e, 'strerror', None) or e)})") from None
    if path.suffix.lower() == ".json":
        data = load_json_document(text, str(path), TableError)
        records = data["tables"] if isinstance(data, dict) and "tables" in data else data
        if not isinstance(records, list):
            raise TableError(f"{path}: expected a list of tables or {{\"tables\": [...]}}")
        if len(records) > MAX_TABLES:
            raise TableError(f"{path}: {len(records):,} tables, over the limit of {MAX_TABLES:,}")
        tables = [table_from_record(r, f"{path}: table {i}", "key", derive_bins=False) for i, r in enumerate(records)]
        lines = list(range(len(tables)))
    else:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            header = reader.fieldnames or []
            twice = next((c for i, c in enumerate(header) if c in header[:i]), None)
            if twice is not None:  # csv.DictReader would keep the last of the two silently
                raise TableError(f"{path}: line 1: column {twice!r:.60} is in the header twice")
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise TableError(f"{path}: line 1: missing column {missing[0]!r} (header needs {','.join(REQUIRED_COLUMNS)})")
            tables, lines = [], []
            for rec in reader:
                line = reader.line_num
                if None in rec:
                    raise TableError(f"{path}: line {line}: more fields than header columns")
                if len(tables) >= MAX_TABLES:
                    raise TableError(f"{path}: line {line}: more than {MAX_TABLES:,} tables (the limit)")
                tables.append(table_from_record(rec, f"{path}: line {line}", derive_bins=False))
                lines.append(line)
        except csv.Error as e:
            raise TableError(f"{path}: line {reader.line_num}: not CSV ({one_line(e)})") from None
    if not tables:
        raise TableError(f"{path}: no tables")
    _check_unique(tables, path, lines)
    return _derive_pending_bins(tables)


def _derive_pending_bins(tables: list[TableSpec]) -> list[TableSpec]:
    """Fill the bins left pending by `table_from_record` in one batched call (~20,000 tables/s;
    one call per table was ~150 tables/s)."""
    pending = [i for i, t in enumerate(tables) if t.bins is _PENDING_BINS]
    if pending:
        bins = reuse_bins_many([tables[i].rows for i in pending], [tables[i].pooling_factor for i in pending], [tables[i].distribution for i in pending])
        for i, b in zip(pending, bins):
            tables[i] = replace(tables[i], bins=tuple(b.tolist()))
    return tables


def save_tables(tables: Iterable[TableSpec], path: str | Path) -> None:
    path = Path(path)
    tables = list(tables)
    if path.suffix.lower() == ".json":
        atomic_write(path, json.dumps({"tables": [t.to_dict() for t in tables]}, indent=1))
        return
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(REQUIRED_COLUMNS + ["distribution", "seed"] + BIN_COLUMNS)
    for t in tables:
        w.writerow([t.name, t.rows, t.dim, f"{t.pooling_factor:.6g}", t.distribution or "", t.seed] + [f"{b:.6g}" for b in t.bins])
    atomic_write(path, f.getvalue())
