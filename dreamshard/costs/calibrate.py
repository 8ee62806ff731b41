"""Calibrating the simulator on real hardware, and validating it on what it never saw.

calibrate: measure a designed set of random shards (table count 1–64, log-uniform, drawn from a
synthetic pool; some all-small-dim and all-large-dim shards to pin the dim terms) with a real
kernel, fit the simulator's coefficients (sim.fit_coefficients), record hardware and versions.
validate: measure *held-out* shards — drawn from a pool of another seed, so none of their tables
was seen — and whole placements of held-out tasks, and compare with the simulator.
Every measurement is kept as a JSON line, so a fit or a report can be redone without the GPU.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dreamshard.costs.sim import (BWD_TERMS, FWD_TERMS, KERNEL_TERMS, Calibration, SimBackend, fit_coefficients, mape, product_path_split, select_terms,
                                  shard_term_matrix, spearman)
from dreamshard.families import HELD_OUT_FAMILIES, family_of, shard_bucket
from dreamshard.files import read_text, write_text
from dreamshard.tables import OPTIMIZERS, PRECISION_BYTES, TableSpec
from dreamshard.tasks import Workload
from dreamshard.validation import (MAX_BATCH_SIZE, MAX_TABLES, MAX_TASKS, DataError, InputError, parse_choice, parse_float, parse_int, require_dict, require_keys,
                                   require_list)

SIZE_BUCKETS = ((1, 2), (3, 8), (9, 20), (21, 10**9))  # table counts the validation report breaks errors down by
MAX_SHARD_BYTES = {"cuda": 16 * 10**9, "cpu": 10**9}  # keep each measured shard well inside memory


@dataclass
class ShardRecord:
    tables: list[TableSpec]
    batch_size: int
    precision: str
    optimizer: str
    fwd_ms: float
    bwd_ms: float
    placement: int | None = None  # index of the whole placement this shard belongs to, if any
    device: int | None = None
    hardware: str = ""  # where it was measured, so a fit made elsewhere still says so
    versions: dict | None = None
    family: str | None = None  # the table family it was drawn from (dreamshard/families.py), if any
    # measured with a kernel whose backward takes the product path for hot small tables (costs/paths.py;
    # our Triton TBE): a fit prices those tables by the path, not by their terms
    product_path: bool = False

    @property
    def workload(self) -> Workload:
        return Workload(self.batch_size, self.precision, self.optimizer)

    def to_json(self) -> dict:
        return {"tables": [t.to_dict() for t in self.tables], "batch_size": self.batch_size, "precision": self.precision, "optimizer": self.optimizer,
                "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "placement": self.placement, "device": self.device,
                "hardware": self.hardware, "versions": self.versions, "family": self.family, "product_path": self.product_path}

    @staticmethod
    def from_json(d: dict, where: str = "record") -> "ShardRecord":
        """A record from its `to_json()` form, checked key by key (DataError naming `where` and the
        key): a fit or a report on a NaN, negative or zero time, or on a shard without tables
        outside a placement, would be silently wrong."""
        require_dict(d, where, "a shard record", DataError)
        require_keys(d, ("tables", "batch_size", "precision", "optimizer", "fwd_ms", "bwd_ms"), where, DataError)
        tables = require_list(d["tables"], where, "key 'tables'", DataError, MAX_TABLES, nonempty=False)
        placement = _optional_index(d.get("placement"), where, "placement")
        device = _optional_index(d.get("device"), where, "device")
        if not tables and placement is None:  # an empty device of a whole placement is the one shard without tables
            raise DataError(f"{where}, key 'tables': the list is empty; only an empty device of a placement (key 'placement') has no tables")
        specs = [TableSpec.from_dict(require_dict(t, f"{where}, key 'tables' entry {i}", "a table spec", DataError), f"{where}, key 'tables' entry {i}")
                 for i, t in enumerate(tables)]
        times = {}
        for key in ("fwd_ms", "bwd_ms"):
            times[key] = parse_float(d[key], where, f"key {key!r}", 0.0, None, DataError, text=False)
            if tables and times[key] <= 0:
                raise DataError(f"{where}, key {key!r}: {times[key]:g} ms; a measured shard takes a positive time")
            if not tables and times[key] != 0:
                raise DataError(f"{where}, key {key!r}: {times[key]:g} ms for a device without tables; an empty device takes no time")
        for key, kind in (("hardware", str), ("versions", dict), ("family", str), ("product_path", bool)):
            if d.get(key) is not None and not isinstance(d[key], kind):
                raise DataError(f"{where}, key {key!r}: {d[key]!r:.40} is not a {kind.__name__}")
        return ShardRecord(specs, parse_int(d["batch_size"], where, "key 'batch_size'", 1, MAX_BATCH_SIZE, DataError, text=False),
                           parse_choice(d["precision"], where, "key 'precision'", PRECISION_BYTES, DataError),
                           parse_choice(d["optimizer"], where, "key 'optimizer'", OPTIMIZERS, DataError), times["fwd_ms"], times["bwd_ms"],
                           placement, device, d.get("hardware") or "", d.get("versions"), d.get("family"), bool(d.get("product_path", False)))


def _optional_index(value, where: str, key: str) -> int | None:
    return None if value is None else parse_int(value, where, f"key {key!r}", 0, MAX_TASKS, DataError, text=False)


def save_records(records: Sequence[ShardRecord], path: str | Path) -> None:
    """JSON lines, one record a line; gzipped where the name ends in .gz (records of many tables
    compress about 8 times)."""
    write_text(path, "".join(json.dumps(r.to_json()) + "\n" for r in records))


def load_records(path: str | Path) -> list[ShardRecord]:
    """Measurements from `save_records`; DataError naming the line and key if one is not a valid
    record, or if no record is of a shard with tables."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such records file")
    try:
        text = read_text(path, errors="replace")
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({e}); a records file is JSON lines, gzipped where its name ends in .gz") from None
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {i}: invalid JSON ({e.msg}); a records file is JSON lines, one shard record a line") from None
        except RecursionError:
            raise DataError(f"{path}: line {i}: JSON nested too deeply") from None
        try:
            records.append(ShardRecord.from_json(d, f"{path}: line {i}"))
        except InputError as e:
            raise DataError(str(e)) from None
    if not any(r.tables for r in records):
        raise DataError(f"{path}: no records of measured shards" if records else f"{path}: no records")
    return records


def fit_problem(records: Sequence[ShardRecord], kernel: str) -> str | None:
    """Why `fit` cannot fit these records (None if it can): too few measured shards to determine
    the kernel's terms (the fit solves for one coefficient per term, forward and backward)."""
    shards = sum(1 for r in records if r.tables)
    need = max(len(names) for names in KERNEL_TERMS.get(kernel, (FWD_TERMS, BWD_TERMS)))
    if shards < need:
        return f"{shards} measured shard{'s' if shards != 1 else ''}; fitting the {need} terms of {kernel}'s cost model needs at least {need}"
    return None


def design_shards(n: int, seed: int, max_bytes: int, max_tables: int = 64, precision: str = "fp16",
                  pool: Sequence[TableSpec] | None = None) -> list[list[TableSpec]]:
    """`n` random shards from `pool` (default: the synthetic pool of this seed): mixed, small-dim-only
    and large-dim-only (a pool without such tables gives mixed shards instead)."""
    from dreamshard.synth import PoolConfig, synth_pool

    pool = synth_pool(PoolConfig(seed=seed)) if pool is None else list(pool)
    rng = np.random.default_rng(seed)
    small = [t for t in pool if t.dim <= 16]
    large = [t for t in pool if t.dim >= 64]
    shards = []
    for i in range(n):
        source = (small if i % 5 == 3 else large if i % 5 == 4 else pool) or pool
        k = int(np.clip(round(np.exp(rng.uniform(0, np.log(max_tables)))), 1, len(source)))
        chosen, used = [], 0
        for j in rng.permutation(len(source)):
            size = source[j].bytes(precision)
            if used + size <= max_bytes:
                chosen.append(source[j])
                used += size
            if len(chosen) == k:
                break
        shards.append(chosen)
    return shards


def design_placements(n: int, seed: int, max_bytes: int, precision: str = "fp16") -> list[list[list[TableSpec]]]:
    """`n` whole placements (as per-device shards) of random tasks, 16–96 tables on 2–8 devices,
    placed by the heuristic planners in turn, each device capped so its shard can be measured."""
    from dreamshard.planners import get_planner
    from dreamshard.synth import PoolConfig, synth_pool
    from dreamshard.tasks import sample_tasks

    pool = synth_pool(PoolConfig(seed=seed))
    rng = np.random.default_rng(seed)
    names = ["random", "size", "dim", "lookup", "size_lookup"]
    placements = []
    for i in range(n):
        devices = int(rng.integers(2, 9))
        task = sample_tasks(pool, 1, (16, 96), devices, max_bytes, seed=seed * 1000 + i, workload=Workload(precision=precision))[0]
        placements.append(get_planner(names[i % len(names)]).plan(task).device_tables())
    return placements


def measure_shards(shards: Sequence[Sequence[TableSpec]], kernel: str, device: str, workload: Workload,
                   progress: Callable[[], None] | None = None, **runner_kwargs) -> list[ShardRecord]:
    """Each shard's forward and backward compute, measured with the sequential runner's protocol."""
    from dreamshard.costs.runners.sequential import SequentialRunner

    runner = SequentialRunner(kernel, device=device, **runner_kwargs)
    records = []
    for shard in shards:
        report = runner.evaluate([list(shard)], workload)
        d = report.devices[0]
        records.append(ShardRecord(list(shard), workload.batch_size, workload.precision, workload.optimizer, d.fwd_comp_ms, d.bwd_comp_ms,
                                   hardware=report.hardware, versions=report.details.get("versions"), product_path=takes_product_path(kernel)))
        if progress:
            progress()
    return records


def takes_product_path(kernel: str) -> bool:
    """Whether measurements of this kernel take the backward's product path for hot small tables."""
    return kernel == "triton"


def records_product_path(records: Sequence[ShardRecord]) -> bool:
    """Whether a set of records was measured with the product path (DataError for a mix: one
    calibration prices either the one kernel or the other)."""
    flags = {r.product_path for r in records if r.tables}
    if len(flags) > 1:
        raise DataError("the records mix measurements with and without the backward's product path (an older Triton TBE): "
                        "fit or validate one kernel's records at a time")
    return flags == {True}


def fit(records: Sequence[ShardRecord], kernel: str, comm: dict, cache_bytes: float = 0.0, backward_of: Calibration | None = None) -> Calibration:
    """Fit forward and backward coefficients to measured shards (all at one batch/precision), with
    the kernel's own terms where it has them (sim.KERNEL_TERMS: our Triton kernel's tile geometry),
    else the generic ones; each component keeps the optional terms only if they lower the
    cross-validated error (select_terms). Records measured with the product path: the tables the
    path takes are priced by its model (sim.product_path_split), the backward's terms fitted to the
    rest, and the calibration prices the path as the simulator does. `cache_bytes`: the device's
    L2 (Calibration.cache_bytes). `backward_of`: keep that calibration's backward and fit only the
    forward (a forward term changed, while the records' backward paths are no longer today's choice)."""
    records = [r for r in records if r.tables]  # an empty device of a placement (validation records) has no terms to fit
    held = [f for f in map(record_family, records) if f in HELD_OUT_FAMILIES]
    if held:
        raise DataError(f"{len(held)} of the {len(records)} records are of a held-out family ({', '.join(sorted(set(held)))}): nothing is calibrated "
                        f"on {', '.join(HELD_OUT_FAMILIES)} (fit on the training families' records, e.g. gpu_families.py's calib_records.jsonl)")
    problem = fit_problem(records, kernel)
    if problem:
        raise DataError(problem)
    r0 = records[0]
    product = records_product_path(records)
    hardware, versions = r0.hardware or "?", r0.versions
    shards = [r.tables for r in records]
    X = shard_term_matrix(shards, r0.workload, cache_bytes)
    fwd = np.array([r.fwd_ms for r in records])
    bwd = np.array([r.bwd_ms for r in records])
    Xb, dense_ms = X, None
    if product:
        own, dense_ms = product_path_split(shards, r0.workload, cache_bytes)
        Xb = X - own
    fwd_names, bwd_names = KERNEL_TERMS.get(kernel, (FWD_TERMS, BWD_TERMS))
    fwd_terms, fwd_cv = select_terms(X, fwd, fwd_names)
    if backward_of is None:
        bwd_terms, bwd_cv = select_terms(Xb, bwd, bwd_names, dense_ms)
        bwd_coef = fit_coefficients(Xb, bwd, bwd_terms, dense_ms)
    else:
        bwd_terms, bwd_coef = tuple(backward_of.bwd), dict(backward_of.bwd)
        bwd_cv = f"kept from the calibration of {backward_of.date}"
    cal = Calibration(
        hardware=hardware,
        kernel=kernel,
        batch_size=r0.batch_size,
        fwd=fit_coefficients(X, fwd, fwd_terms),
        bwd=bwd_coef,
        comm=comm,
        date=datetime.date.today().isoformat(),
        versions=versions or {},
        product_path=product,
        cache_bytes=float(cache_bytes),
    )
    pred = SimBackend(cal).shard_compute(shards, r0.workload)
    cal.fit = {"shards": len(records), "fwd_mape": mape(pred[:, 0], fwd), "bwd_mape": mape(pred[:, 1], bwd),
               "total_mape": mape(pred.sum(1), fwd + bwd), "precision": r0.precision, "optimizer": r0.optimizer,
               "terms": {"fwd": list(fwd_terms), "bwd": list(bwd_terms)},
               "term_selection": {"fwd_cv_mape": fwd_cv, "bwd_cv_mape": bwd_cv},
               "families": sorted({f for f in map(record_family, records) if f})}
    return cal


def validation_report(cal: Calibration, records: Sequence[ShardRecord]) -> dict:
    """Per-shard MAPE/Spearman of fwd, bwd, total compute; placement overall-cost error; worst shards.
    Priced with the backward's product path where the records were measured with it."""
    everything, records = records, [r for r in records if r.tables]
    sim = SimBackend(cal, product_path=records_product_path(records))
    r0 = records[0]
    pred = sim.shard_compute([r.tables for r in records], r0.workload)
    fwd = np.array([r.fwd_ms for r in records])
    bwd = np.array([r.bwd_ms for r in records])
    tot = fwd + bwd
    err = (pred.sum(1) - tot) / tot
    sizes = np.array([len(r.tables) for r in records])
    worst = np.argsort(-np.abs(err), kind="stable")[:8]
    report = {
        "calibration": {"hardware": cal.hardware, "kernel": cal.kernel, "date": cal.date},
        "shards": len(records),
        "fwd": {"mape": mape(pred[:, 0], fwd), "spearman": spearman(pred[:, 0], fwd)},
        "bwd": {"mape": mape(pred[:, 1], bwd), "spearman": spearman(pred[:, 1], bwd)},
        "total": {"mape": mape(pred.sum(1), tot), "spearman": spearman(pred.sum(1), tot)},
        # total compute by shard size: tiny shards are where fixed costs dominate
        "by_size": [{"tables": f"{lo}–{hi}" if hi < 10**9 else f"{lo}+", "shards": int(m.sum()), "mape": mape(pred.sum(1)[m], tot[m]),
                     "mean_signed_error": float(np.mean(err[m]) * 100)}
                    for lo, hi in SIZE_BUCKETS for m in [(sizes >= lo) & (sizes <= hi)] if m.any()],
        "worst": [{"tables": len(records[i].tables), "dims": sorted({t.dim for t in records[i].tables}),
                   "lookups_per_sample": round(sum(t.pooling_factor for t in records[i].tables), 1),
                   "measured_ms": round(float(tot[i]), 4), "simulated_ms": round(float(pred[i].sum()), 4), "error": round(float(err[i]) * 100, 1)}
                  for i in worst],
    }
    # Total compute by table family (the held-out ones marked) and by shape bucket of the shard's
    # dominant table (families.shard_bucket): where the model fails, not only how much on average.
    families = [record_family(r) for r in records]
    buckets = [shard_bucket(r.tables, r0.batch_size) for r in records]

    def breakdown(keys: Sequence[str]) -> list[dict]:
        keys = np.array(keys, dtype=object)
        return [{"key": k, "shards": int(m.sum()), "mape": mape(pred.sum(1)[m], tot[m]), "mean_signed_error": float(np.mean(err[m]) * 100),
                 "fwd_mape": mape(pred[m, 0], fwd[m]), "bwd_mape": mape(pred[m, 1], bwd[m]), "held_out": k in HELD_OUT_FAMILIES}
                for k in sorted(set(keys.tolist())) for m in [keys == k]]

    if any(f is not None for f in families):
        report["by_family"] = breakdown([f or "?" for f in families])
    report["by_bucket"] = {axis: breakdown([b[axis] for b in buckets]) for axis in ("dim", "hits", "pooling", "tables")}
    # Whole placements: measured overall = max_d(measured compute + modelled comm); the
    # simulator's comm is the same model, so this error is the compute model's, summed and maxed.
    groups: dict[int, list[ShardRecord]] = {}
    for r in everything:
        if r.placement is not None:
            groups.setdefault(r.placement, []).append(r)
    if groups:
        meas, simd, fams = [], [], []
        for recs in groups.values():
            recs = sorted(recs, key=lambda r: r.device)
            shards = [r.tables for r in recs]
            c = sim.evaluate(shards, r0.workload)
            meas.append(max(r.fwd_ms + r.bwd_ms + d.fwd_comm_ms + d.bwd_comm_ms for r, d in zip(recs, c.devices)))
            simd.append(c.overall_ms)
            fams.append(next((f for f in map(record_family, recs) if f), None))
        meas, simd = np.array(meas), np.array(simd)
        report["placements"] = {"count": len(meas), "mape": mape(simd, meas), "spearman": spearman(simd, meas)}
        if any(fams):
            fams = np.array([f or "?" for f in fams], dtype=object)
            report["placements_by_family"] = [{"key": k, "count": int(m.sum()), "mape": mape(simd[m], meas[m]),
                                               "mean_signed_error": float(np.mean((simd[m] - meas[m]) / meas[m]) * 100), "held_out": k in HELD_OUT_FAMILIES}
                                              for k in sorted(set(fams.tolist())) for m in [fams == k]]
    return report


def record_family(record: ShardRecord) -> str | None:
    """A record's family: the one it says, else the one its tables' names follow (if they agree)."""
    if record.family:
        return record.family
    names = {family_of(t.name) for t in record.tables}
    return names.pop() if len(names) == 1 else None
