"""TorchRec integration: tables from a TorchRec model, dreamshard plans as TorchRec
`ShardingPlan`s and back, the pieces that pin TorchRec's planner to a plan, and `dreamshard
export torchrec`. The drop-in planner built on them is `dreamshard.sharding_planner`; the
planners import this module, and that one imports the planners. Step by step:

    task = task_from_torchrec(model, world_size, hbm_bytes, global_batch, batches=sample_kjts)   # or table_stats= / constraints=
    sharding_plan = to_sharding_plan(get_planner("size_lookup").plan(task), module=model, device_type="cuda")

The mapping (docs/torchrec.md): a table with one full-width shard → `table_wise` on its device's
rank; a table cut into column shards → `column_wise` (or `table_column_wise`), one TorchRec shard
per column shard, offsets [0, start] and sizes [rows, width], the ranks in column order; a table
split by rows → `row_wise`, TorchRec's layout (`row_wise_cuts`): rank r of all D holds rows
[r·b, (r+1)·b), b = ceil(rows / D), the last ones what is left (possibly none: a rank past the
table's rows holds a shard of 0 rows); or `table_row_wise`, the same layout over the ranks of one
host of `local_world_size`; a grid (column ranges, each split by rows) → `grid_shard`: column
blocks of one width, each in that table-row-wise layout over the ranks of its own host. A row
split of another layout (uneven blocks, other ranks, a rank order that is not the row order) has
no TorchRec form: `NotExpressibleError` says which layout it needs. Data-parallel shards have no
form in our plans: `NotExpressibleError`.

TorchRec is imported lazily (it is slow to import and absent on the GPU machines): importing this
module costs nothing; the functions that need TorchRec raise `TorchRecUnavailable` (one line)
where it cannot be imported. `torchrec_shardings` and the `export` command need no TorchRec.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

import click

from dreamshard.bins import NUM_BINS, REFERENCE_BATCH
from dreamshard.files import OutPath, atomic_write
from dreamshard.plan import Plan, Shard, load_plans
from dreamshard.tables import TableSpec, load_tables, table_from_record
from dreamshard.tasks import Task, Workload
from dreamshard.tiers import COMPUTE_KERNELS, TIER_OF_KERNEL, Tier
from dreamshard.torchrec_quiet import quiet  # noqa: F401  (tio.quiet(): the integration's callers use it from here)
from dreamshard.validation import DataError, NoPlanError, OptionError, PlanError, TableError, one_line

FORMAT = "dreamshard.torchrec/1"  # `export torchrec`'s JSON
Offered = "tuple[str, tuple[str, ...]] | None"  # (compute device, the sharding types TorchRec's sharders offer there): `offered_types`
# TorchRec's sharding types of an EmbeddingBagCollection, and those our plans can express.
ALL_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise", "data_parallel", "grid_shard")
COLUMN_TYPES = ("column_wise", "table_column_wise")
ROW_TYPES = ("row_wise", "table_row_wise")
GRID = "grid_shard"
EXPRESSIBLE = ("table_wise",) + COLUMN_TYPES + ROW_TYPES + (GRID,)
NOT_EXPRESSIBLE_WHY = "our plans have table-wise, column, row and grid shards"  # why data-parallel shards are refused
# "fused": the optimizer runs inside FBGEMM's TBE backward (what our cost backends measure);
# "dense": plain autograd weights, for setups that want an ordinary optimizer.
KERNELS = ("fused", "dense")
DEVICE_TYPES = ("cuda", "cpu")
PRECISIONS = {"FP32": "fp32", "FP16": "fp16"}  # TorchRec DataType name → our precision


class TorchRecUnavailable(OptionError):
    """TorchRec (1.8, with fbgemm-gpu-cpu) cannot be imported here (e.g. the GPU machines)."""


class NotExpressibleError(NoPlanError):
    """A sharding one side cannot express: TorchRec's data-parallel shards in our plans; in
    TorchRec, row splits not of its row-wise layout."""


class ConstraintError(NoPlanError):
    """The user's TorchRec ParameterConstraints ask for what dreamshard cannot plan (a sharding type
    or compute kernel it lacks, lists that disagree) or rule out every plan of the task within
    memory; the message names the table and the constraint."""


def row_wise_cuts(rows: int, ranks: int) -> list[tuple[int, int]]:
    """TorchRec's row-wise layout of `rows` over `ranks` (torchrec.distributed.sharding_plan.
    _calculate_rw_shard_sizes_and_offsets, which its RW input dist buckets indices by): rank r
    holds [r·b, (r+1)·b) with b = ceil(rows / ranks), clipped to the table, so the last ranks may
    hold fewer rows or none (an empty range (rows, rows)). 10 rows on 4 ranks: 3, 3, 3, 1."""
    if not (rows >= 1 and ranks >= 1):
        raise ValueError(f"cannot lay out {rows} rows over {ranks} ranks")
    b = -(-rows // ranks)
    return [(min(r * b, rows), min((r + 1) * b, rows)) for r in range(ranks)]


# --------------------------------------------------------------------------------------------
# TorchRec, imported lazily, and kept quiet
# --------------------------------------------------------------------------------------------


def _load() -> SimpleNamespace:
    """Not cached: after the first call these imports are dictionary look-ups in sys.modules, and
    an import that fails (a patched or broken environment) fails every time, not just the first."""
    import torch  # noqa: F401
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.planner.types import Partitioner, PlannerError, PlannerErrorType, Stats
    from torchrec.distributed.planner.types import Shard as PlannerShard
    from torchrec.distributed.types import CacheAlgorithm, CacheParams, EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "torch"})


def import_torchrec(who: str = "the TorchRec integration") -> SimpleNamespace:
    """TorchRec's classes this module uses, or TorchRecUnavailable naming `who` needed them."""
    try:
        return _load()
    except Exception as e:  # ImportError, or a torchrec/fbgemm build that fails to load (undefined symbols)
        raise TorchRecUnavailable(
            f"{who} needs torchrec 1.8 on the CPU (the .venv of `make test` has it), which cannot be imported here: {one_line(e)[:200]}"
        ) from None


# --------------------------------------------------------------------------------------------
# Tables from TorchRec
# --------------------------------------------------------------------------------------------


def embedding_configs(source: Any) -> list[tuple[str, Any]]:
    """(module path, EmbeddingBagConfig) of every table of `source`: an EmbeddingBagCollection, a
    model holding some, or a list of EmbeddingBagConfigs (path ""). Table names must be unique:
    they are our tables' names and TorchRec's plan keys."""
    tr = import_torchrec()
    if isinstance(source, tr.EmbeddingBagCollection):
        found = [("", c) for c in source.embedding_bag_configs()]
    elif hasattr(source, "named_modules"):
        found = [(path, c) for path, m in source.named_modules() if isinstance(m, tr.EmbeddingBagCollection) for c in m.embedding_bag_configs()]
    elif isinstance(source, (list, tuple)) and all(isinstance(c, tr.EmbeddingBagConfig) for c in source):
        found = [("", c) for c in source]
    else:
        raise TableError(f"tables from TorchRec: expected an EmbeddingBagCollection, a model holding one, or a list of EmbeddingBagConfig, got {type(source).__name__}")
    if not found:
        raise TableError(f"tables from TorchRec: {type(source).__name__} holds no EmbeddingBagCollection tables")
    seen: set[str] = set()
    for _, c in found:
        if c.name in seen:
            raise TableError(f"tables from TorchRec: two tables are named {c.name!r}; table names must be unique")
        seen.add(c.name)
    return found


def precision_of(configs: Iterable[Any]) -> str:
    """Our workload precision from the tables' TorchRec data_type (one for all of them)."""
    kinds = {}
    for c in configs:
        name = getattr(c.data_type, "name", str(c.data_type))
        if name not in PRECISIONS:
            raise TableError(f"table {c.name!r}: data_type {name} is not one of {', '.join(PRECISIONS)} (the precisions dreamshard prices)")
        kinds.setdefault(PRECISIONS[name], c.name)
    if len(kinds) > 1:
        raise TableError(f"tables {' and '.join(repr(n) for n in kinds.values())} differ in data_type; a dreamshard task has one precision")
    return next(iter(kinds))


def measure_batches(batches: Iterable[Any], configs: Sequence[Any], max_samples: int = REFERENCE_BATCH) -> dict[str, dict]:
    """Per table, the pooling factor and reuse bins measured on a sample of KeyedJaggedTensor
    batches: pooling = mean lookups per sample (summed over the table's features); bins = the reuse
    histogram of its indices over the first `max_samples` samples (65,536 by default: the batch the
    bins are defined on; on a smaller sample the counts, and so the bins, are lower). The counting
    is streams.empirical_reuse's (bins.count_bins). Raises DataError naming the batch and feature."""
    import torch

    from dreamshard.streams import empirical_reuse

    owner = {f: c for c in configs for f in c.feature_names}
    lookups = {c.name: 0 for c in configs}
    indices: dict[str, list] = {c.name: [] for c in configs}
    samples = 0
    for b, kjt in enumerate(batches):
        if samples >= max_samples:
            break
        if not all(hasattr(kjt, a) for a in ("to_dict", "stride")):
            raise DataError(f"batches: batch {b} is a {type(kjt).__name__}, not a KeyedJaggedTensor")
        features = kjt.to_dict()
        missing = next((f for f in owner if f not in features), None)
        if missing is not None:
            raise DataError(f"batches: batch {b} has no feature {missing!r} (of table {owner[missing].name!r}); it has {', '.join(features) or 'none'}")
        take = min(int(kjt.stride()), max_samples - samples)
        for f, c in owner.items():
            jt = features[f]
            lengths = jt.lengths()[:take]
            ix = jt.values()[: int(lengths.sum())]
            if ix.numel() and (int(ix.min()) < 0 or int(ix.max()) >= c.num_embeddings):
                bad = int(ix.min()) if int(ix.min()) < 0 else int(ix.max())
                raise DataError(f"batches: batch {b}, feature {f!r}: index {bad} is outside table {c.name!r}'s {c.num_embeddings} rows")
            lookups[c.name] += int(lengths.sum())
            indices[c.name].append(ix.reshape(-1).to(torch.int64))
        samples += take
    if samples == 0:
        raise DataError("batches: no samples (give at least one non-empty KeyedJaggedTensor)")
    out = {}
    for c in configs:
        stats = empirical_reuse(torch.cat(indices[c.name]) if indices[c.name] else torch.zeros(0, dtype=torch.int64))
        out[c.name] = {"pooling_factor": lookups[c.name] / samples, "bins": tuple(stats["bins"]), "samples": samples, "lookups": lookups[c.name]}
    return out


def _stats_records(stats: str | Path | Mapping[str, Mapping], configs: Sequence[Any]) -> dict[str, TableSpec]:
    """Specs from the user's `table_stats`: a table file of ours (rows and dim must be the model's),
    or a mapping name → {pooling_factor, bins or distribution[, seed]} completed with the model's
    rows and dim."""
    model = {c.name: c for c in configs}
    if isinstance(stats, (str, Path)):
        given = {t.name: t for t in load_tables(stats)}
        where = str(stats)
        for name, t in given.items():
            if name in model and (t.rows, t.dim) != (model[name].num_embeddings, model[name].embedding_dim):
                c = model[name]
                raise TableError(f"{where}: table {name!r} has {t.rows} rows × dim {t.dim}, the model's has {c.num_embeddings} × {c.embedding_dim}")
    elif isinstance(stats, Mapping):
        where, given = "table_stats", {}
        for name, rec in stats.items():
            if not isinstance(rec, Mapping):
                raise TableError(f"table_stats, table {name!r}: expected an object with pooling_factor and bins or distribution, got {type(rec).__name__}")
            if name in model:
                c = model[name]
                full = {**dict(rec), "name": name, "rows": c.num_embeddings, "dim": c.embedding_dim}
                given[name] = table_from_record(full, f"table_stats, table {name!r}", "key")
            else:
                given[name] = None
    else:
        raise TableError(f"table_stats: expected a table file path or a mapping of table name to statistics, got {type(stats).__name__}")
    unknown = next((n for n in given if n not in model), None)
    if unknown is not None:
        raise TableError(f"{where}: table {unknown!r} is not a table of the model (its tables: {', '.join(list(model)[:8])}{', ...' if len(model) > 8 else ''})")
    return given


def _listed(value: Any) -> list:
    """A constraint's list as plain strings or numbers (TorchRec's enums by their value)."""
    return [getattr(x, "value", x) for x in value]


def constraint_text(name: str, field: str, value: Any) -> str:
    """How an error names the user's constraint: "table 't0': ParameterConstraints(sharding_types=['table_wise'])"."""
    shown = _listed(value) if isinstance(value, (list, tuple)) else getattr(value, "value", value)
    return f"table {name!r}: ParameterConstraints({field}={shown!r})"


def constraint_lookups(name: str, constraint: Any, features: Sequence[str], rank_batch_size: float | None = None) -> float:
    """Lookups per sample of a table by its TorchRec ParameterConstraints, as TorchRec's estimators
    count them: the sum over its features of pooling_factors × num_poolings (1 each when unset),
    each feature's batch_sizes (when set) relative to the per-rank batch `rank_batch_size`. The
    lists must be one entry per feature, of equal length; `feature_names`, when set, must be the
    table's own features. Raises ConstraintError naming the constraint."""
    pf = _listed(getattr(constraint, "pooling_factors", None) or [])
    if not pf:
        raise ConstraintError(f"{constraint_text(name, 'pooling_factors', pf)}: no pooling factor (lookups per sample) to plan with")
    lengths = {"pooling_factors": len(pf)}
    for field in ("num_poolings", "batch_sizes", "feature_names"):
        value = getattr(constraint, field, None)
        if value:
            lengths[field] = len(value)
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}={getattr(constraint, k)!r}" for k in lengths)
        raise ConstraintError(f"table {name!r}: ParameterConstraints({shown}) differ in length; TorchRec takes one entry per feature")
    named = getattr(constraint, "feature_names", None)
    stranger = next((f for f in named or [] if f not in features), None)
    if stranger is not None:
        raise ConstraintError(f"{constraint_text(name, 'feature_names', named)}: {stranger!r} is not a feature of the table (its features: {', '.join(features)})")
    poolings = _listed(getattr(constraint, "num_poolings", None) or [1.0] * len(pf))
    batches = getattr(constraint, "batch_sizes", None)
    if batches and not rank_batch_size:
        raise ConstraintError(f"{constraint_text(name, 'batch_sizes', batches)}: per-feature batch sizes need the per-rank batch size (task_from_torchrec and ShardingPlanner give it)")
    scale = [b / rank_batch_size for b in batches] if batches else [1.0] * len(pf)
    total = 0.0
    for field, values in (("pooling_factors", pf), ("num_poolings", poolings)):
        bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf")), None)
        if bad is not None:
            raise ConstraintError(f"{constraint_text(name, field, values)}: {bad!r} is not a number >= 0")
    for p, n, k in zip(pf, poolings, scale):
        total += float(p) * float(n) * k
    return total


def tables_from_torchrec(
    source: Any,
    *,
    table_stats: str | Path | Mapping[str, Mapping] | None = None,
    batches: Iterable[Any] | None = None,
    constraints: Mapping[str, Any] | None = None,
    distribution: str | None = None,
    max_samples: int = REFERENCE_BATCH,
    rank_batch_size: float | None = None,
) -> list[TableSpec]:
    """Our TableSpecs of a TorchRec model's tables (rows, dim and name from its EmbeddingBagConfigs),
    in the model's order. Each table's pooling factor and reuse bins come from, first to last:
    `table_stats` (a table file of ours, or name → {pooling_factor, bins | distribution});
    `batches` (KeyedJaggedTensors, measured: `measure_batches`); `constraints` (TorchRec's
    ParameterConstraints: lookups per sample by `constraint_lookups`, its per-feature batch_sizes
    relative to `rank_batch_size`, the per-rank batch) with the reuse of `distribution`
    ("uniform" or "zipf:<alpha>"). A table none of them describes is a TableError."""
    found = embedding_configs(source)
    configs = [c for _, c in found]
    given = _stats_records(table_stats, configs) if table_stats is not None else {}
    measured = measure_batches(batches, configs, max_samples) if batches is not None else {}
    specs = []
    for c in configs:
        where = f"table {c.name!r}"
        if given.get(c.name) is not None:
            specs.append(given[c.name])
            continue
        rec: dict[str, Any] = {"name": c.name, "rows": c.num_embeddings, "dim": c.embedding_dim}
        if c.name in measured:
            m = measured[c.name]
            rec.update(pooling_factor=m["pooling_factor"], bins=list(m["bins"]) if m["lookups"] else [0.0] * NUM_BINS)
        elif constraints is not None and c.name in constraints:
            lookups = constraint_lookups(c.name, constraints[c.name], list(c.feature_names), rank_batch_size)
            if distribution is None:
                raise TableError(f"{where}: constraints give its pooling factor but not its reuse; pass distribution='zipf:<alpha>' or 'uniform', or table_stats with bins")
            rec.update(pooling_factor=lookups, distribution=distribution)
        else:
            raise TableError(f"{where}: no pooling factor or reuse statistics; give table_stats, batches (KeyedJaggedTensors) or constraints with a distribution")
        specs.append(table_from_record(rec, where, "key"))
    return specs


def task_from_torchrec(source: Any, devices: int, max_memory_bytes: int, batch_size: int = REFERENCE_BATCH, optimizer: str = "sgd", **statistics) -> Task:
    """The task of placing a TorchRec model's tables on `devices` ranks of `max_memory_bytes`
    each, at global `batch_size` (every rank's samples together: TorchRec's per-rank batch ×
    `devices`), the precision of the tables' data_type; `statistics` as for
    `tables_from_torchrec`. Raises TaskError/TableError on bad values."""
    statistics.setdefault("rank_batch_size", batch_size / devices if isinstance(devices, int) and devices > 0 else None)
    tables = tables_from_torchrec(source, **statistics)
    precision = precision_of(c for _, c in embedding_configs(source))
    return Task(tables, devices, max_memory_bytes, Workload(batch_size, precision, optimizer)).validate("task from TorchRec")


# --------------------------------------------------------------------------------------------
# Our plan → TorchRec's terms, and back
# --------------------------------------------------------------------------------------------


def _check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise OptionError(f"{name} {value!r:.40} is not one of {', '.join(choices)}")
    return value


def placement(rank: int, device_type: str, local_world_size: int) -> str:
    """TorchRec's placement string of a shard: "rank:3/cuda:3" (device = rank within its host), "rank:3/cpu"."""
    return f"rank:{rank}/cuda:{rank % local_world_size}" if device_type == "cuda" else f"rank:{rank}/cpu"


def _extent(shard: Shard, table: TableSpec) -> tuple[int, int, int, int]:
    """(first row, first column, rows, columns) of a shard: a row shard's own range, else every row."""
    r0, r1 = shard.row_range(table)
    return r0, shard.start, r1 - r0, shard.width


def allowed_types(name: str, constraint: Any = None, column_type: str = "column_wise", offered: Offered = None) -> tuple[str, ...]:
    """The TorchRec sharding types table `name` may take, in the order a layout tries them: without
    a `sharding_types` constraint table_wise, `column_type`, row_wise, table_row_wise; with one,
    those of EXPRESSIBLE it lists (a whole table is also a column_wise or table_column_wise
    table of one shard, as TorchRec shards a table no wider than its column block). `offered`
    (device, types): only the types TorchRec's sharders offer with the fused kernel on that
    compute device (`offered_types`). Raises ConstraintError naming the constraint when it lists a
    type TorchRec lacks, or none of ours, or none offered."""
    given = getattr(constraint, "sharding_types", None) if constraint is not None else None
    if not given:
        out = ("table_wise", column_type, "row_wise", "table_row_wise", GRID)
        return tuple(k for k in out if k in offered[1]) if offered else out
    kinds = [str(k) for k in _listed(given)]
    bad = next((k for k in kinds if k not in ALL_TYPES), None)
    if bad is not None:
        raise ConstraintError(f"{constraint_text(name, 'sharding_types', kinds)}: {bad!r} is not a TorchRec sharding type ({', '.join(ALL_TYPES)})")
    order = ("table_wise", column_type, *(k for k in COLUMN_TYPES if k != column_type), *ROW_TYPES, GRID)
    out = tuple(k for k in order if k in kinds)
    if not out:
        raise ConstraintError(f"{constraint_text(name, 'sharding_types', kinds)} allows none of the sharding types dreamshard plans ({', '.join(EXPRESSIBLE)}: {NOT_EXPRESSIBLE_WHY})")
    if offered and not set(out) & set(offered[1]):
        raise ConstraintError(f"{constraint_text(name, 'sharding_types', kinds)}: TorchRec's sharders offer none of these with the fused kernel on {offered[0]} "
                              f"(they offer {', '.join(k for k in EXPRESSIBLE if k in offered[1])})")
    return tuple(k for k in out if k in offered[1]) if offered else out


def offered_types(sharders: Sequence[Any], compute_device: str) -> Offered:
    """(compute_device, the sharding types of EXPRESSIBLE that the sharders of
    EmbeddingBagCollections offer there with the fused kernel): TorchRec's CPU sharder, for one,
    has no row-wise types."""
    tr = import_torchrec()
    ebc = [s for s in sharders if getattr(s, "module_type", None) is tr.EmbeddingBagCollection] or list(sharders)  # TorchRec matches a sharder by exact type
    kinds = {k for s in ebc for k in s.sharding_types(compute_device) if "fused" in [str(getattr(x, "value", x)) for x in s.compute_kernels(k, compute_device)]}
    return compute_device, tuple(k for k in EXPRESSIBLE if k in kinds)


def check_kernel(name: str, constraint: Any, compute_kernel: str) -> None:
    """ConstraintError unless the constraint's compute_kernels (when set) include `compute_kernel`."""
    kernels = getattr(constraint, "compute_kernels", None) if constraint is not None else None
    if kernels and compute_kernel not in [str(k) for k in _listed(kernels)]:
        why = " (dreamshard plans tables in HBM with FBGEMM's fused TBE, the optimizer fused into its backward)" if compute_kernel == "fused" else ""
        raise ConstraintError(f"{constraint_text(name, 'compute_kernels', kernels)} leaves out {compute_kernel!r}, the kernel of the plan{why}")


def _layout(t: TableSpec, shards: Sequence[Shard]) -> str:
    """A table's shards in words, for errors: "whole on rank 1", "in 3 column shards of widths 24, 20, 20 on ranks 1, 0, 1"."""
    rows = [_extent(s, t) for s in shards]
    if len(shards) == 1 and rows[0][2] == t.rows and shards[0].width == t.dim:
        return f"whole on rank {shards[0].device}"
    if all(e[2] == t.rows for e in rows):
        return f"in {len(shards)} column shards of widths {', '.join(str(s.width) for s in shards)} on ranks {', '.join(str(s.device) for s in shards)}"
    return f"in {len(shards)} row shards {', '.join(f'[{e[0]}, {e[0] + e[2]}) on {s.device}' for s, e in zip(shards[:4], rows))}{', ...' if len(shards) > 4 else ''}"


def _sharding(t: TableSpec, shards: list[Shard], devices: int, local: int, device_type: str, compute_kernel: str, kinds: Sequence[str],
              min_width: int | None = None) -> dict | str:
    """One table's ParameterSharding as plain data: the first of `kinds` that expresses its shards,
    or why none does. table_wise: one full shard. column_wise: full-row shards in column order,
    each at least `min_width` wide (TorchRec's min_partition) when there are several;
    table_column_wise: the same on the ranks of one host. row_wise: TorchRec's row layout over
    all ranks (rank r, block r: DMP's RW input dist sends an index to rank index // b, so no
    other assignment runs); table_row_wise: that layout over the ranks of one host, in their
    order."""
    shards = sorted(shards, key=lambda s: (s.row_start, s.start))
    full = all(_extent(s, t)[2] == t.rows for s in shards)
    ours = [(s.device, *s.row_range(t)) for s in shards]
    host = shards[0].device // local
    why: list[str] = []

    def entry(kind: str, pieces: Iterable[tuple[int, int, int, int, int]]) -> dict:
        pieces = list(pieces)
        return {"sharding_type": kind, "compute_kernel": compute_kernel, "ranks": [p[0] for p in pieces],
                "shards": [{"rank": r, "offsets": [a, c], "sizes": [n, w], "placement": placement(r, device_type, local)} for r, a, c, n, w in pieces]}

    for kind in kinds:
        if kind == "table_wise" and full and len(shards) == 1 and shards[0].width == t.dim:
            return entry(kind, [(shards[0].device, 0, 0, t.rows, t.dim)])
        if kind in COLUMN_TYPES and full:
            if kind == "table_column_wise" and len({s.device // local for s in shards}) > 1:
                why.append(f"table_column_wise shards must share one host of {local} ranks; its ranks are {[s.device for s in shards]}")
                continue
            if min_width and len(shards) > 1 and min(s.width for s in shards) < min_width:
                why.append(f"min_partition {min_width} is wider than its narrowest column shard")  # (table_sharding names the constraint)
                continue
            return entry(kind, [(s.device, 0, s.start, t.rows, s.width) for s in shards])
        if kind == GRID and not full:
            got = _grid(t, shards, local)
            if isinstance(got, str):
                why.append(got)
                continue
            return entry(kind, got)
        if kind in ROW_TYPES and all(s.width == t.dim for s in shards):
            ranks = list(range(devices)) if kind == "row_wise" else list(range(host * local, (host + 1) * local))
            cuts = row_wise_cuts(t.rows, len(ranks))
            if _holding(ranks, cuts) == ours:
                return entry(kind, [(r, a, 0, b - a, t.dim) for r, (a, b) in zip(ranks, cuts)])
            if not full:
                b = -(-t.rows // devices)
                why.append(f"row shards {', '.join(f'[{a}, {z}) on {d}' for d, a, z in ours[:4])}{', ...' if len(ours) > 4 else ''} are not TorchRec's row-wise layout: "
                           f"rank r of all {devices} holds rows [r·{b}, (r+1)·{b}) (ceil(rows / ranks) each; table_row_wise: the same over one host's {local} ranks)")
    return why[0] if why else ""


def _holding(ranks: Sequence[int], cuts: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(rank, first row, row stop) of each rank of TorchRec's row-wise layout (`row_wise_cuts`)
    that holds rows: what a table's row shards must be, in row order, to export as that layout."""
    return [(r, a, b) for r, (a, b) in zip(ranks, cuts) if a < b]


def _grid(t: TableSpec, shards: Sequence[Shard], local: int) -> list[tuple[int, int, int, int, int]] | str:
    """A grid's pieces (rank, first row, first column, rows, width) in TorchRec's grid layout
    (torchrec.distributed.sharding_plan.grid_shard): column blocks of one width in column order,
    block k table-row-wise over every rank of one host, each block on a host of its own; or why
    the shards are not that."""
    blocks: dict[tuple[int, int], list[Shard]] = {}
    for s in shards:
        blocks.setdefault((s.start, s.stop), []).append(s)
    widths = {b - a for a, b in blocks}
    if len(blocks) < 2 or len(widths) > 1:
        return f"its column ranges {sorted(blocks)} are not grid_shard's column blocks of one width"
    pieces, hosts = [], []
    for (c0, c1), block in sorted(blocks.items()):
        block = sorted(block, key=lambda s: s.row_start)
        host = block[0].device // local
        ranks = list(range(host * local, (host + 1) * local))
        cuts = row_wise_cuts(t.rows, local)
        if _holding(ranks, cuts) != [(s.device, *s.row_range(t)) for s in block]:
            return (f"its column block [{c0}, {c1}) is not split table-row-wise in TorchRec's layout: rank r of one host's {local} holds rows "
                    f"[r·{cuts[0][1]}, (r+1)·{cuts[0][1]})")
        if host in hosts:
            return f"two of its column blocks are on host {host}; grid_shard puts each block on a host of its own"
        hosts.append(host)
        pieces += [(r, a, c0, b - a, c1 - c0) for r, (a, b) in zip(ranks, cuts)]
    return pieces


def torchrec_shardings(plan: Plan, device_type: str = "cuda", compute_kernel: str = "fused", column_type: str = "column_wise",
                       local_world_size: int | None = None, constraints: Mapping[str, Any] | None = None, offered: Offered = None) -> dict[str, dict]:
    """Per table name, its TorchRec ParameterSharding as plain data (no TorchRec needed):
    sharding_type, compute_kernel, ranks and shards [{rank, offsets, sizes, placement}].
    A table-wise table → table_wise on its device; a column-split one → `column_type`
    (column_wise, or table_column_wise, whose ranks must share a host of `local_world_size`);
    a row-split one → row_wise or table_row_wise in TorchRec's layout. `constraints` (TorchRec
    ParameterConstraints by table name) restrict each table to its `sharding_types`
    (`allowed_types`), its column shards to `min_partition` and its kernel to its
    `compute_kernels`: a plan they do not allow raises ConstraintError naming the constraint,
    one no type expresses NotExpressibleError. `offered`: only the types TorchRec's sharders offer
    on a compute device (`offered_types`)."""
    _check_choice(device_type, "device_type", DEVICE_TYPES)
    _check_choice(compute_kernel, "compute_kernel", KERNELS)
    _check_choice(column_type, "column_type", COLUMN_TYPES)
    # ranks per host: given, else the plan's topology's GPUs per host, else one host of every device
    local = (plan.task.machine.gpus_per_host if local_world_size is None else local_world_size)
    if not (isinstance(local, int) and 1 <= local and plan.devices % local == 0):
        raise OptionError(f"local_world_size {local!r:.40} must be a positive divisor of the plan's {plan.devices} devices")
    by_table: list[list[Shard]] = [[] for _ in plan.task.tables]
    for s in plan.shards:
        by_table[s.table].append(s)
    return {t.name: table_sharding(t, shards, plan.devices, local, constraints.get(t.name) if constraints else None, device_type, compute_kernel, column_type, offered)
            for t, shards in zip(plan.task.tables, by_table)}


def table_sharding(t: TableSpec, shards: Sequence[Shard], devices: int, local: int, constraint: Any = None, device_type: str = "cuda",
                   compute_kernel: str = "fused", column_type: str = "column_wise", offered: Offered = None) -> dict:
    """One table's ParameterSharding as plain data (`torchrec_shardings`), within its TorchRec
    `constraint`: ConstraintError naming the constraint where it does not allow the shards,
    NotExpressibleError where no sharding type expresses them."""
    c = constraint
    tier = shards[0].tier_spec if shards else Tier()
    if any(s.tier_spec != tier for s in shards):
        raise NotExpressibleError(f"table {t.name}: its shards are in different memory tiers; TorchRec gives a table one compute kernel")
    if tier.kind != "hbm":  # a host tier is its own kernel (fused_uvm, fused_uvm_caching), whatever the HBM tables use
        compute_kernel = COMPUTE_KERNELS[tier.kind]
    check_kernel(t.name, c, compute_kernel)
    kinds = allowed_types(t.name, c, column_type, offered)
    ordered = sorted(shards, key=lambda s: (s.row_start, s.start))
    got = _sharding(t, ordered, devices, local, device_type, compute_kernel, kinds, getattr(c, "min_partition", None) if c is not None else None)
    if not isinstance(got, str):
        if tier.kind == "uvm_caching":
            got["cache_load_factor"] = tier.cache_ratio  # TorchRec's CacheParams.load_factor: cached rows / rows
        return got
    held = _layout(t, ordered)
    if c is not None and got.startswith("min_partition"):
        raise ConstraintError(f"{constraint_text(t.name, 'min_partition', c.min_partition)}: the plan holds it {held}, narrower than that")
    if c is not None and getattr(c, "sharding_types", None):
        raise ConstraintError(f"{constraint_text(t.name, 'sharding_types', c.sharding_types)}: the plan holds it {held}, which they do not allow" + (f" ({got})" if got else ""))
    if offered:
        elsewhere = _sharding(t, ordered, devices, local, device_type, compute_kernel, allowed_types(t.name, c, column_type))
        if isinstance(elsewhere, dict):
            raise NotExpressibleError(f"table {t.name}: the plan holds it {held}, {elsewhere['sharding_type']}, which TorchRec's sharders do not offer on {offered[0]} "
                                      f"(they offer {', '.join(offered[1])})")
    raise NotExpressibleError(f"table {t.name}: " + (got or f"the plan holds it {held}, which none of {', '.join(kinds)} expresses"))


def to_sharding_plan(plan: Plan, module: Any = None, module_path: str | None = None, device_type: str = "cuda", compute_kernel: str = "fused",
                     column_type: str = "column_wise", local_world_size: int | None = None, constraints: Mapping[str, Any] | None = None):
    """The dreamshard plan as a TorchRec `ShardingPlan` for `DistributedModelParallel`.

    With `module` (the model DMP will shard, or its EmbeddingBagCollection) each table goes under
    its EBC's path in that model, and the model's tables must be the plan's (names, rows and dims);
    without, every table goes under `module_path` ("" when DMP is handed the EBC itself).
    `constraints`: TorchRec ParameterConstraints the sharding types must honour (`torchrec_shardings`)."""
    tr = import_torchrec("to_sharding_plan")
    shardings = torchrec_shardings(plan, device_type, compute_kernel, column_type, local_world_size, constraints)
    if module is not None:
        found = embedding_configs(module)
        paths = {c.name: p for p, c in found}
        specs = {t.name: t for t in plan.task.tables}
        for _, c in found:
            t = specs.get(c.name)
            if t is None:
                raise PlanError(f"plan: the model's table {c.name!r} is not in the plan (its tables: {', '.join(list(specs)[:8])})")
            if (t.rows, t.dim) != (c.num_embeddings, c.embedding_dim):
                raise PlanError(f"plan: table {c.name!r} is {t.rows} rows × dim {t.dim}, the model's is {c.num_embeddings} × {c.embedding_dim}")
        extra = next((n for n in specs if n not in paths), None)
        if extra is not None:
            raise PlanError(f"plan: table {extra!r} is not a table of the model")
    else:
        paths = {name: module_path or "" for name in shardings}
    modules: dict[str, Any] = {}
    for name, s in shardings.items():
        spec = tr.EnumerableShardingSpec([tr.ShardMetadata(shard_offsets=list(x["offsets"]), shard_sizes=list(x["sizes"]), placement=x["placement"]) for x in s["shards"]])
        cache = tr.CacheParams(algorithm=tr.CacheAlgorithm.LRU, load_factor=s["cache_load_factor"]) if "cache_load_factor" in s else None
        modules.setdefault(paths[name], tr.EmbeddingModuleShardingPlan())[name] = tr.ParameterSharding(
            sharding_type=s["sharding_type"], compute_kernel=s["compute_kernel"], ranks=list(s["ranks"]), sharding_spec=spec, cache_params=cache)
    return tr.ShardingPlan(modules)


def tier_from_torchrec(compute_kernel: Any, load_factor: Any, where: str) -> Tier:
    """Our tier of a TorchRec compute kernel (fused and dense: HBM; fused_uvm; fused_uvm_caching
    with its cache load factor, TorchRec's 0.2 where it gives none); PlanError for another kernel."""
    kernel = str(getattr(compute_kernel, "value", compute_kernel))
    if kernel in KERNELS:
        return Tier()
    if kernel not in TIER_OF_KERNEL:
        raise PlanError(f"{where}: compute kernel {kernel!r:.40} has no tier in our plans (fused, dense, fused_uvm, fused_uvm_caching)")
    kind = TIER_OF_KERNEL[kernel]
    if kind != "uvm_caching":
        return Tier(kind)
    ratio = 0.2 if load_factor is None else load_factor
    if not (isinstance(ratio, (int, float)) and 0 < ratio <= 1):
        raise PlanError(f"{where}: cache load factor {ratio!r:.40} must be in (0, 1]")
    return Tier(kind, float(ratio))


def shards_from_torchrec(kind: str, name: str, table: int, pieces: Iterable[tuple[int, int, int, int, int]], who: str, tier: Tier = Tier()) -> list[Shard]:
    """Our shards of TorchRec's shards of one table: `pieces` are (rank, row offset, rows, column
    offset, width). The one conversion behind `plan_from_torchrec` and the torchrec planner: a
    row-wise or table-row-wise shard keeps its row range (TorchRec's shards of 0 rows, on ranks
    past a table's last row, hold nothing and are dropped); table-wise and column shards are
    every row; a grid's keep both ranges. Data-parallel shards raise NotExpressibleError: "{who}
    {kind} for table {name}: ..."."""
    if kind not in EXPRESSIBLE:
        raise NotExpressibleError(f"{who} {kind} for table {name}: not expressible ({NOT_EXPRESSIBLE_WHY})")
    out = []
    for rank, row, rows, start, width in pieces:
        if kind in ROW_TYPES or kind == GRID:
            if int(rows) > 0:
                out.append(Shard(table, int(rank), int(start), int(start) + int(width), int(row), int(row) + int(rows), tier.kind, tier.cache_ratio))
        else:
            out.append(Shard(table, int(rank), int(start), int(start) + int(width), tier=tier.kind, cache_ratio=tier.cache_ratio))
    return out


def _rank_of(placement_: Any, where: str) -> int:
    rank = getattr(placement_, "rank", None)
    if callable(rank):
        rank = rank()
    if rank is None:  # a placement string "rank:3/cuda:3"
        text = str(placement_)
        try:
            rank = int(text.split("/")[0].removeprefix("rank:"))
        except ValueError:
            raise PlanError(f"{where}: placement {text!r:.40} names no rank") from None
    return int(rank)


def plan_from_torchrec(sharding_plan: Any, task: Task, planner: str = "torchrec") -> Plan:
    """Our plan of a TorchRec ShardingPlan (or one module's plan) for `task`'s tables (which
    carries what TorchRec's plan lacks: pooling, reuse, devices, memory, workload). Every table
    of the task must be in the plan once; the result is checked as a plan file is (PlanError)."""
    modules = getattr(sharding_plan, "plan", None)
    modules = modules if isinstance(modules, Mapping) else {"": sharding_plan}
    index = {t.name: i for i, t in enumerate(task.tables)}
    shards: list[Shard] = []
    seen: set[str] = set()
    for path, module_plan in modules.items():
        for name, ps in module_plan.items():
            where = f"TorchRec plan, {path + '.' if path else ''}{name}"
            if name not in index:
                raise PlanError(f"{where}: not a table of the task")
            if name in seen:
                raise PlanError(f"{where}: the table is planned twice")
            seen.add(name)
            t = task.tables[index[name]]
            kind = str(getattr(ps.sharding_type, "value", ps.sharding_type))
            if kind not in EXPRESSIBLE:
                shards_from_torchrec(kind, name, index[name], [], "the TorchRec plan has")
            spec_shards = getattr(ps.sharding_spec, "shards", None)
            if not spec_shards:
                raise PlanError(f"{where}: {kind} with no shards in its sharding_spec")
            pieces = []
            for m in sorted(spec_shards, key=lambda m: (m.shard_offsets[0], m.shard_offsets[1])):
                if kind not in ROW_TYPES and kind != GRID and (m.shard_offsets[0] != 0 or m.shard_sizes[0] != t.rows):
                    raise NotExpressibleError(f"{where}: {kind} with a shard of rows [{m.shard_offsets[0]}, {m.shard_offsets[0] + m.shard_sizes[0]}) of its {t.rows}: split a table by rows or by columns, not both")
                pieces.append((_rank_of(m.placement, where), m.shard_offsets[0], m.shard_sizes[0], m.shard_offsets[1], m.shard_sizes[1]))
            tier = tier_from_torchrec(ps.compute_kernel, getattr(getattr(ps, "cache_params", None), "load_factor", None), where)
            shards += shards_from_torchrec(kind, name, index[name], pieces, "the TorchRec plan has", tier)
    missing = next((t.name for t in task.tables if t.name not in seen), None)
    if missing is not None:
        raise PlanError(f"TorchRec plan: table {missing!r} of the task is not in it")
    plan = Plan(task, shards, planner, notes=["converted from a TorchRec ShardingPlan"])
    plan.check("TorchRec plan")
    return plan


# --------------------------------------------------------------------------------------------
# Planning inside TorchRec's planner
# --------------------------------------------------------------------------------------------


def constraints_for(plan: Plan, constraints: Mapping[str, Any] | None = None, local_world_size: int | None = None, compute_kernel: str = "fused",
                    column_type: str = "column_wise") -> dict[str, Any]:
    """TorchRec ParameterConstraints that leave its enumerator one option per table, the plan's:
    its sharding type (`torchrec_shardings`, within the user's `constraints`) and
    `compute_kernel`; a table cut into equal column shards (or a grid's blocks) gets their width as `min_partition`,
    so that TorchRec's own enumerator makes them (it makes only equal ones; `dreamshard_enumerator`
    makes any). The user's constraints are kept otherwise (pooling factors default to the plan's)."""
    tr = import_torchrec("constraints_for")
    shardings = torchrec_shardings(plan, "cpu", compute_kernel, column_type, local_world_size, constraints)
    out = {}
    for t in plan.task.tables:
        s = shardings[t.name]
        widths = {x["sizes"][1] for x in s["shards"]}
        c = copy.copy(constraints[t.name]) if constraints and t.name in constraints else tr.ParameterConstraints(pooling_factors=[max(float(t.pooling_factor), 1e-9)])
        c.sharding_types = [s["sharding_type"]]
        c.compute_kernels = [s["compute_kernel"]]  # a host-tier table's own kernel (fused_uvm, fused_uvm_caching)
        if "cache_load_factor" in s:
            c.cache_params = tr.CacheParams(algorithm=tr.CacheAlgorithm.LRU, load_factor=s["cache_load_factor"])
        if s["sharding_type"] in (*COLUMN_TYPES, GRID) and len(widths) == 1:  # a grid's column blocks too
            c.min_partition = widths.pop()
        out[t.name] = c
    return out


@lru_cache(maxsize=1)
def _enumerator_class() -> type:
    tr = import_torchrec("the dreamshard enumerator")

    class DreamShardEnumerator(tr.EmbeddingEnumerator):
        """TorchRec's EmbeddingEnumerator whose column-wise options hold a dreamshard plan's column
        shards (any widths, in column order) instead of TorchRec's equal blocks, estimated again
        by TorchRec's perf and storage estimators."""

        def __init__(self, shardings: Mapping[str, dict], **kwargs) -> None:
            super().__init__(**kwargs)
            self.shardings = shardings

        def enumerate(self, module, sharders):
            options = super().enumerate(module, sharders)
            changed = False
            for so in options:
                ours = self.shardings.get(so.name)
                if ours is not None and so.sharding_type in COLUMN_TYPES and so.sharding_type == ours["sharding_type"]:
                    so.shards = [tr.PlannerShard(size=list(x["sizes"]), offset=list(x["offsets"])) for x in ours["shards"]]
                    changed = True
            if changed:
                self.populate_estimates(options)
            return options

    return DreamShardEnumerator


def dreamshard_enumerator(plan: Plan, topology: Any, batch_size: int, constraints: Mapping[str, Any] | None = None, local_world_size: int | None = None):
    """A TorchRec Enumerator (a `DreamShardEnumerator`) for `plan` on `topology` at TorchRec's
    per-rank `batch_size`: hand it, with `constraints_for(plan, ...)` as its and the planner's
    constraints, and `dreamshard_partitioner(plan)`, to `EmbeddingShardingPlanner`."""
    shardings = torchrec_shardings(plan, "cpu", "fused", "column_wise", local_world_size, constraints)
    return _enumerator_class()(shardings, topology=topology, batch_size=batch_size, constraints=dict(constraints) if constraints else None)


@lru_cache(maxsize=1)
def _partitioner_class() -> type:
    tr = import_torchrec("the dreamshard partitioner")

    class DreamShardPartitioner(tr.Partitioner):
        """A TorchRec `Partitioner` that assigns every shard the rank of a dreamshard plan: a
        proposal whose options are not the plan's (sharding type, column offsets and widths) is
        refused with a PlannerError, as one that does not fit is; TorchRec's storage estimate of
        each shard is checked against what its reservation left on the rank."""

        def __init__(self, plan: Plan) -> None:
            self.plan = plan
            self.shards: dict[str, list[tuple[Shard, tuple]]] = {}  # table name → its shards and their extents, in TorchRec's order
            for s in plan.shards:
                t = plan.task.tables[s.table]
                self.shards.setdefault(t.name, []).append((s, _extent(s, t)))
            for pieces in self.shards.values():
                pieces.sort(key=lambda p: (p[1][0], p[1][1]))

        def partition(self, proposal, storage_constraint):
            devices = [copy.deepcopy(d.storage) for d in storage_constraint.devices]
            if len(devices) != self.plan.devices:
                raise tr.PlannerError(f"the dreamshard plan is for {self.plan.devices} ranks, the topology has {len(devices)}", tr.PlannerErrorType.PARTITION)
            for so in proposal:
                ours = self.shards.get(so.name)
                if ours is None:
                    raise tr.PlannerError(f"table {so.name} is not in the dreamshard plan", tr.PlannerErrorType.PARTITION)
                ordered = sorted(so.shards, key=lambda s: (s.offset[0], s.offset[1]))
                theirs = [s for s in ordered if s.size[0] > 0]
                if [(s.offset[0], s.offset[1], s.size[0], s.size[1]) for s in theirs] != [extent for _, extent in ours]:
                    raise tr.PlannerError(f"table {so.name}: TorchRec's {so.sharding_type} shards are not the dreamshard plan's", tr.PlannerErrorType.PARTITION)
                for k, shard in enumerate(ordered):  # row-wise shards of 0 rows (ranks past the last row): the rank of their block
                    if shard.size[0] == 0:
                        shard.rank = ours[0][0].device + k
                for shard, (mine, _) in zip(theirs, ours):
                    shard.rank = mine.device
                    left = devices[mine.device] - shard.storage
                    if left.hbm < 0 or left.ddr < 0:
                        raise tr.PlannerError(
                            f"rank {mine.device}: table {so.name}'s shard needs {shard.storage.hbm:,} bytes of HBM and {shard.storage.ddr:,} of DDR by TorchRec's estimate; "
                            f"{devices[mine.device].hbm:,} and {devices[mine.device].ddr:,} are left", tr.PlannerErrorType.INSUFFICIENT_STORAGE)
                    devices[mine.device] = left
            return proposal

    return DreamShardPartitioner


def dreamshard_partitioner(plan: Plan):
    """A TorchRec Partitioner (a `DreamShardPartitioner`) pinned to `plan`: hand it to
    `EmbeddingShardingPlanner(partitioner=..., constraints=constraints_for(plan))`."""
    return _partitioner_class()(plan)


# --------------------------------------------------------------------------------------------
# `dreamshard export torchrec PLAN.json [--out FILE]` (registered in cli.py)
# --------------------------------------------------------------------------------------------


def export_json(plan: Plan, device_type: str = "cuda", compute_kernel: str = "fused", column_type: str = "column_wise", local_world_size: int | None = None) -> dict:
    """The plan in TorchRec's terms, as JSON: per table its ParameterSharding (`torchrec_shardings`)."""
    return {
        "format": FORMAT,
        "world_size": plan.devices,
        "device_type": device_type,
        "planner": plan.planner,
        "tables": torchrec_shardings(plan, device_type, compute_kernel, column_type, local_world_size),
    }


# Plain click groups: the root group of cli.py (whose `main` turns InputError into one line and
# exit status 2) runs them once `cli.add_command(export)` registers this group; importing cli.py
# here would make an import cycle with that line.
# -h as well as --help even when the group is invoked on its own (click caches a command's help
# option the first time it is asked for, from whichever context asked)
@click.group("export", context_settings={"help_option_names": ["-h", "--help"]})
def export() -> None:
    """Write plans in other systems' terms."""


@export.command("torchrec")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--out", type=OutPath(), help="JSON file to write  [default: print to stdout]")
@click.option("--device-type", default="cuda", show_default=True, type=click.Choice(DEVICE_TYPES), help="device of each shard's placement")
@click.option("--compute-kernel", default="fused", show_default=True, type=click.Choice(KERNELS), help="TorchRec compute kernel of every table")
@click.option("--column-type", default="column_wise", show_default=True, type=click.Choice(COLUMN_TYPES), help="TorchRec sharding type of a column-split table")
@click.option("--local-world-size", type=click.IntRange(1), help="ranks per host (cuda device = rank mod this)  [default: the plan topology's GPUs per host, else all ranks on one host]")
def export_torchrec(plan_file: str, out: str | None, device_type: str, compute_kernel: str, column_type: str, local_world_size: int | None) -> None:
    """Print or write a dreamshard plan as TorchRec ParameterShardings: per table its sharding
    type, compute kernel, ranks and shards (offsets, sizes, placement). Needs no TorchRec."""
    plans = load_plans(plan_file)
    if len(plans) != 1:
        raise PlanError(f"{plan_file}: {len(plans)} plans; export takes a file of one plan")
    text = json.dumps(export_json(plans[0], device_type, compute_kernel, column_type, local_world_size), indent=1)
    if out is None:
        click.echo(text)
    else:
        atomic_write(Path(out), text + "\n")
        click.echo(f"wrote the {plans[0].planner} plan in TorchRec's terms ({len(plans[0].task.tables)} tables, {plans[0].devices} ranks) to {out}", err=True)
