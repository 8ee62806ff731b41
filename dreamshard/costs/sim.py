"""The calibrated cost simulator: the four per-device components of a step in microseconds.

What drives a fused table-batched embedding op, and the term that models it:
  - one launch (plus set-up) per shard, shared by all its tables → `launch`: fusion makes a
    shard's cost sub-additive in its tables; the backward's fixed part (key building, sort, a
    launch or two per dim class) is paid only by a shard that has lookups at all → `active`;
  - a little scheduling work per table in the forward → `tables`;
  - per lookup: an index read and a loop trip → `lookups`;
  - gathered row bytes, in 32-byte sectors (a 4-dim fp16 row still moves 32 bytes: small dims
    are inefficient) → split by how often the row is reused in the batch: first touches
    (`cold_bytes`, from DRAM), rows used 2–16 times (`warm_bytes`, partly cached), rows used more
    (`hot_bytes`, mostly in L2) — the split comes from the table's reuse histogram; where the rows a
    table touches overflow the device's L2 (`Calibration.cache_bytes`), the repeats that miss it
    count as first touches (terms.cache_hits: a 225 MB table read 43 times per row is DRAM-bound);
  - pooled output written (`out_bytes`);
  - backward: gradient rows read once per lookup (`grad_bytes`), then one read-modify-write of
    each touched row and its optimizer state (`update_bytes`); sorting lookups by row scales with
    `lookups`; reduction of repeated rows (`warm_bytes`, `hot_bytes`: rows hit by many lookups
    are reduced across slices and fixed up).
Each component is a non-negative linear combination of these terms, fitted per hardware and
kernel by `dreamshard calibrate` (NNLS on relative error); the fixed terms are what keeps a tiny
shard from costing nothing.

Our Triton kernel (costs/kernels/triton_tbe.py, tiled backward) has its own terms, which follow its
tile geometry (KERNEL_TERMS; the geometry is mirrored below and a test checks it against the kernel):
  - forward `programs`: one program per (table, block of 1024 // DP bags), DP = dim rounded up to a
    power of two, each a chain of dependent loads: a dim-1024 table runs B programs, a dim-4 one
    B/256; `wide_programs`: the same count for a shard with any dim over 256, which the kernel
    launches with 8 warps and the wide branches' registers (fewer programs resident per SM);
    `masked_gather_bytes`: gathered row bytes of dims that are not a power of two, read with
    8-byte instead of 16-byte loads;
  - backward `tiles`: level-0 programs, one per (tile of P sorted lookups, column block of TW),
    P·TW ≈ 4096 elements (P 16..64), each three dependent round trips: per lookup this is 1/64 for
    dims ≤ 64, 1/32 at 128, 1/16 per 256-column block — no padding to a power of two (192 = 3 × 64);
    `masked_grad_bytes`: gradient bytes of tables whose dim is not a multiple of their block width
    (8-byte loads); `launches`: one per level and tile class (levels k ≥ 1 fold 2 entries per tile
    of the level below until one tile is left; tables of one class share a level's launch), each a
    short serial step; the sort and key building stay per lookup (`lookups`), the row updates per
    distinct row (`update_bytes`); reuse does not add work (rows are summed in-tile by a matrix
    product), so the backward has no warm/hot terms. The collectives are priced by the comm model
(costs/comm.py) the runners use: for a GPU calibration, the NCCL model shipped for that GPU and the
plan's device count (`SimBackend.comm_for`), fitted to real collectives as the distributed runner
issues them.

The kernel's backward takes a second path for hot small tables (a count matrix times the gradient,
costs/paths.py), chosen per table (paths.product_tables). A calibration marked `product_path`
prices the tables that path takes by the path's own fitted time instead of by their backward terms
(`product_candidates`); `calibrate.fit` marks a calibration so when its records were measured with
the path, and fits the backward's terms to what those tables leave (`product_path_split`).

A row shard (rowshard.py) is priced as the table it is: its rows, its measured lookups (its
pooling factor is its measured share of the table's) and its measured reuse bins. It leaves the
all-to-all: its table's partial outputs are summed by the reduce-scatter of the row-wise tables
over all devices, and their gradients all-gathered back — the same time on every device
(comm.collective_ms) — and the copies of its device's columns around them (comm.relayout_ms).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from dreamshard.costs.base import CostBackend, CostReport, DeviceCost
from dreamshard.costs.comm import (alltoall_bytes_array, alltoall_ms, comm_params_problem, default_model_path, describe_choice, load_comm_model,
                                   relayout_ms, rowwise_ms)
from dreamshard.costs.hardware import gpu_slug
from dreamshard.costs.host import HostLink, tier_ms
from dreamshard.costs.hierarchy import topology_comm_ms
from dreamshard.costs.paths import dense_us, product_tables, table_arrays
# the per-table counts: shape arithmetic shared with the learned cost net's features (costs/terms.py)
from dreamshard.costs.terms import FWD_CLASSES, TERMS, TILE_CLASS, TILE_CLASSES, WIDE_DIM, fwd_class, table_terms, wide_grad_factor
from dreamshard.rowshard import RowShardSpec, rowwise_tables
from dreamshard.tables import TableSpec
from dreamshard.files import atomic_write
from dreamshard.tasks import Workload
from dreamshard.topology import Topology, several_hosts
from dreamshard.validation import DataError, OptionError, one_line, parse_float, parse_int, require_dict

FWD_TERMS = ("launch", "tables", "lookups", "cold_bytes", "warm_bytes", "hot_bytes", "out_bytes")
BWD_TERMS = ("launch", "active", "tables", "lookups", "grad_bytes", "update_bytes", "warm_bytes", "hot_bytes")
# Terms whose worth depends on the kernel: a fit keeps one only if it lowers the cross-validated
# error. Per-table work is real in FBGEMM's CPU backward (a loop over tables) but not in our Triton
# backward, whose launches are per dim class: there the term only chases noise.
OPTIONAL_TERMS = ("tables",)
# The Triton kernel's own term sets (see the module doc): a fit for kernel "triton" uses these. Its
# backward returns at once without lookups, so its fixed cost is `active`'s alone (with `launch`
# beside it a fit on shards that all have lookups could not tell the two apart).
TRITON_FWD_TERMS = ("launch", "tables", "lookups", "cold_bytes", "warm_bytes", "hot_bytes", "out_bytes", "programs", "wide_programs", "masked_gather_bytes",
                    "branch_lookups")
TRITON_BWD_TERMS = ("active", "lookups", "tiles", "grad_bytes", "masked_grad_bytes", "update_bytes", "launches", "wide_grad_bytes")
KERNEL_TERMS = {"triton": (TRITON_FWD_TERMS, TRITON_BWD_TERMS)}  # any other kernel: FWD_TERMS, BWD_TERMS
# The shipped calibration of each GPU, fitted to today's Triton kernel on the training families
# (product path, L2, shards of up to 128 tables; the H200's also the devices of the searches' plans,
# which a search keeps where the price is low; docs/simulator.md). The simulator prices for the
# GPU visible here; on a machine without one, with the H200's calibration that the simulator
# figures in docs/ were made with (they stay reproducible where no GPU is).
SHIPPED_CALIBRATIONS = {"h100": "h100_triton_large_shards.json", "h200": "h200_triton_search_shards.json"}
DEFAULT_CALIBRATION = "h200_triton_tiles2.json"


def default_calibration() -> str:
    """The shipped calibration's file name the simulator prices with when given none. Asked
    without importing torch where no one has yet (a heuristic's plan never loads it, and the CLI
    sets torch's threads before it does): the NVIDIA driver names the GPU in /proc."""
    import sys

    if "torch" in sys.modules:
        from dreamshard.costs.comm import local_gpu

        gpu = local_gpu()
    else:
        from dreamshard.costs.hardware import gpu_slug

        models = [line.split(":", 1)[1].strip() for f in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
                  for line in f.read_text(errors="replace").splitlines() if line.startswith("Model:")]
        gpu = gpu_slug(models[0]) if models else None
    return SHIPPED_CALIBRATIONS.get(gpu or "", DEFAULT_CALIBRATION)

@dataclass
class Calibration:
    """Fitted coefficients (ms per unit of each term) and where they came from."""

    hardware: str
    kernel: str
    batch_size: int
    fwd: dict[str, float]
    bwd: dict[str, float]
    comm: dict  # all-to-all model (costs/comm.py): latency_ms, bandwidth_GBps, serial_fraction, source
    date: str = ""
    versions: dict = field(default_factory=dict)
    fit: dict = field(default_factory=dict)  # training-set errors and sample counts
    # price the Triton kernel's product path (costs/paths.py) over these terms: for a
    # calibration whose records were measured before the kernel had it, to price today's kernel
    product_path: bool = False
    # the device's last-level cache (bytes) the forward's gathers are priced against (terms.cache_hits);
    # 0: none (every repeated row may hit: the files fitted before 2026-11-25)
    cache_bytes: float = 0.0
    # how host-tier shards are priced (costs/host.py HostLink: host-link bandwidth, the row cache's
    # work); missing keys take HostLink's defaults until a GPU measures them (docs/tiers.md)
    host: dict = field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        atomic_write(path, json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(path: str | Path | None = None) -> "Calibration":
        shipped = resources.files("dreamshard").joinpath("data/calibrations")
        if path is None or (not Path(path).is_file() and Path(path).name == str(path) and shipped.joinpath(str(path)).is_file()):
            path = None if path is None else str(path)  # one of the package's files by its name
            text = shipped.joinpath(path or default_calibration()).read_text()
        else:
            path = Path(path)
            if not path.is_file():
                raise DataError(f"{path}: no such calibration file")
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise DataError(f"{path}: cannot read ({one_line(getattr(e, 'strerror', None) or e)})") from None
        where = str(path or default_calibration())
        try:
            cal = Calibration(**json.loads(text))
        except (TypeError, json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{where}: not a calibration file ({one_line(e)})") from None
        return cal._checked(where)

    def _checked(self, where: str) -> "Calibration":
        """The numbers the simulator computes with, checked (and made numbers) where a file is read:
        DataError naming the key."""
        for part in ("fwd", "bwd"):
            setattr(self, part, {term: parse_float(v, where, f"{part}.{term}", 0.0, error=DataError)
                                 for term, v in require_dict(getattr(self, part), where, f"the {part} coefficients", DataError).items()})
        self.batch_size = parse_int(self.batch_size, where, "batch_size", 1, error=DataError)
        self.cache_bytes = parse_float(self.cache_bytes, where, "cache_bytes", 0.0, error=DataError)
        problem = comm_params_problem(require_dict(self.comm, where, "the all-to-all model 'comm'", DataError))
        if problem:
            raise DataError(f"{where}, comm: {problem}")
        if not isinstance(self.product_path, bool):
            raise DataError(f"{where}, product_path: {self.product_path!r:.40} is not true or false")
        HostLink.from_json(require_dict(self.host, where, "the host-tier prices 'host'", DataError), where)
        return self

    @property
    def label(self) -> str:
        short = "H200" if "H200" in self.hardware else self.hardware
        # the date tells two calibrations of one machine apart (the v4 kernel's of 2026-11-22, the families' of 2026-11-23)
        return f"simulated ({short} calibration of {self.date})" if self.date else f"simulated ({short} calibration)"



def shard_terms(P: np.ndarray, flat: np.ndarray, n_shards: int, dims: np.ndarray, workload: Workload = Workload(),
                columns: Sequence[int] | None = None) -> np.ndarray:
    """[n_shards, len(TERMS)] terms of the shards that tables make when the i-th of `flat` (table
    i % T, T = len(P), so several placements of the same tables can be stacked) goes to shard
    flat[i]: sums of the tables' terms, except SHARD_TERMS (launch: the shard has a table; active:
    it has lookups; wide_programs: its programs if any dim is over WIDE_DIM; launches: per tile
    class, the most levels of its tables — tables of one class share each level's launch;
    wide_grad_bytes: its gradient bytes weighted by its width, `terms.wide_grad_factor`;
    branch_lookups: its lookups times the forward's branches beyond the first, `terms.fwd_class`).
    `columns`: compute only these (the others stay 0)."""
    cols = range(len(TERMS)) if columns is None else columns
    reps = len(flat) // max(len(P), 1)

    def stacked(values: np.ndarray) -> np.ndarray:
        return np.broadcast_to(values, (reps, len(values))).ravel()

    def summed(j: int) -> np.ndarray:  # a term's sum over each shard's tables: the scatter-add that makes shards
        return np.bincount(flat, weights=stacked(P[:, j]), minlength=n_shards)

    out = np.zeros((n_shards, len(TERMS)))
    for j in cols:
        if TERMS[j] not in ("launch", "active", "launches", "wide_grad_bytes", "branch_lookups"):
            out[:, j] = summed(j)
    lk = TERMS.index("lookups")
    lookups = out[:, lk] if lk in cols else summed(lk)
    out[:, TERMS.index("launch")] = np.bincount(flat, minlength=n_shards) > 0
    out[:, TERMS.index("active")] = lookups > 0
    wp = TERMS.index("wide_programs")
    if wp in cols:
        widest = np.zeros(n_shards)
        np.maximum.at(widest, flat, stacked(dims))
        out[:, wp] *= widest > WIDE_DIM
    la = TERMS.index("launches")
    if la in cols:
        cls = TILE_CLASS[workload.optimizer == "rowwise_adagrad"][np.minimum(dims.astype(np.int64), 1024)]
        per_class = np.zeros(n_shards * TILE_CLASSES)
        np.maximum.at(per_class, flat * TILE_CLASSES + stacked(cls), stacked(P[:, la]))
        out[:, la] = per_class.reshape(n_shards, TILE_CLASSES).sum(axis=1)
    wg = TERMS.index("wide_grad_bytes")
    if wg in cols:
        gb = TERMS.index("grad_bytes")
        width = np.bincount(flat, weights=stacked(dims), minlength=n_shards)
        out[:, wg] = (out[:, gb] if gb in cols else summed(gb)) * wide_grad_factor(width)
    bl = TERMS.index("branch_lookups")
    if bl in cols:
        # every program of the forward's one launch carries the code of every branch (one per dim
        # class) its shard has: the more branches, the slower each lookup (measured, docs/simulator.md)
        present = np.zeros(n_shards * FWD_CLASSES, dtype=bool)
        present[flat * FWD_CLASSES + stacked(fwd_class(dims))] = True
        branches = present.reshape(n_shards, FWD_CLASSES).sum(axis=1)
        out[:, bl] = lookups * np.maximum(branches - 1, 0)
    return out


# terms a shard has once, whatever its tables, or of all its tables together: not a table's own backward
_SHARD_ONLY = np.isin(np.array(TERMS), ("launch", "active", "launches", "wide_programs", "wide_grad_bytes", "branch_lookups"))


def product_candidates(tables: Sequence[TableSpec], P: np.ndarray, bwd: np.ndarray, workload: Workload) -> tuple[np.ndarray, ...]:
    """The tables the product path takes (paths.product_tables, wherever they are placed) → (their
    indices, and the change pricing each by the path instead of by the calibration's terms makes, ms)."""
    lookups, rows, dims = table_arrays(tables, workload.batch_size)
    cand = np.flatnonzero(product_tables(lookups, rows, dims, workload.batch_size, workload.elt_bytes))
    us = dense_us(lookups[cand], rows[cand], dims[cand], workload.batch_size, workload.elt_bytes)
    return cand, us / 1000.0 - P[cand][:, ~_SHARD_ONLY] @ bwd[~_SHARD_ONLY]


def _coef(cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    # every term the file was fitted with counts, so a file fitted with other term sets still works
    fwd = np.array([cal.fwd.get(t, 0.0) for t in TERMS])
    bwd = np.array([cal.bwd.get(t, 0.0) for t in TERMS])
    return fwd, bwd


class SimBackend(CostBackend):
    """Analytic cost surface fitted to real measurements; answers in microseconds."""

    instant = True

    def __init__(self, calibration: str | Path | Calibration | None = None, product_path: bool | None = None, comm: str = "shipped"):
        """`product_path`: price the Triton kernel's product path for the tables it takes (default:
        as the calibration says). `comm`: "shipped" prices the collectives of a GPU calibration
        with the comm model shipped for its GPU and each plan's device count (`comm_for`), as the
        runners do; "calibration" with the calibration's own ``comm`` entry at every device count
        (the price of the simulator before per-device-count models, which models trained with
        ``comm="model"`` carry)."""
        if comm not in ("shipped", "calibration"):
            raise OptionError(f"simulator comm {comm!r:.40}: 'shipped' or 'calibration'")
        self.comm = comm
        self.calibration = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
        self.product_path = self.calibration.product_path if product_path is None else bool(product_path)
        self.name = self.calibration.label
        self._fwd, self._bwd = _coef(self.calibration)
        self._shipped: dict[int, dict] = {}  # device count → the shipped comm model's parameters (comm_for)
        self._product_cache: tuple | None = None  # (terms, workload, product_candidates): a search passes one terms array each call
        # only the terms this calibration prices (a search costs thousands of placements)
        self._columns = [j for j in range(len(TERMS)) if self._fwd[j] or self._bwd[j]]
        self.host_link = HostLink.from_json(self.calibration.host)

    prices_tiers = True

    def evaluate_plan(self, plan, batch_size: int | None = None, precision: str | None = None) -> CostReport:
        """The plan's cost; its host-tier shards (tiers.py) add the host link's and the row cache's
        time to their devices' compute (costs/host.py)."""
        report = super().evaluate_plan(plan, batch_size, precision)
        if not plan.has_tiers():
            return report
        fwd, bwd, details = tier_ms(plan, batch_size, self.host_link, precision)
        for d, cost in enumerate(report.devices):
            cost.fwd_comp_ms += float(fwd[d])
            cost.bwd_comp_ms += float(bwd[d])
        report.details["tiers"] = details
        return report

    def table_terms(self, tables: Sequence[TableSpec], workload: Workload = Workload()) -> np.ndarray:
        """terms.table_terms with this calibration's cache: what `costs_batch(terms=)` reuses."""
        return table_terms(tables, workload, self.calibration.cache_bytes)

    def comm_for(self, devices: int) -> dict:
        """The collectives' parameters for `devices` devices: for a calibration of a GPU (NCCL), the
        comm model shipped for that GPU and device count (`comm.default_model_path`: the runners'
        price); else (gloo, or a model given in the calibration file alone) the calibration's own."""
        comm = self.calibration.comm
        if self.comm == "calibration" or devices < 2 or "nccl" not in str(comm.get("source", "")):
            return comm
        if devices not in self._shipped:
            gpu = gpu_slug(self.calibration.hardware)
            path = default_model_path("cuda", devices, gpu)
            note = describe_choice(path, devices, gpu)
            self._shipped[devices] = {**load_comm_model(path).params(), "source": path.name + (f" ({note})" if note else "")}
        return self._shipped[devices]

    def comm_params(self) -> dict:
        return self.calibration.comm

    def cache_bytes(self) -> float:
        return float(self.calibration.cache_bytes)

    def costs_batch(self, tables: Sequence[TableSpec], placements: np.ndarray, devices: int, workload: Workload = Workload(), terms: np.ndarray | None = None,
                    topology: Topology | None = None) -> np.ndarray:
        """Costs of N placements of the same tables at once: [N, D, 4] (fwd comp, fwd comm, bwd comm, bwd comp).

        `placements` is [N, T] device ids. Pass `terms` (table_terms of these tables) to reuse it.
        `topology` (of `devices` devices): several hosts price the collectives in two levels
        (costs/hierarchy.py: inside a host the shipped model of its GPU count, between hosts the
        topology's links); None or one host: one host of `devices`.
        """
        placements = np.asarray(placements, dtype=np.int64).reshape(-1, len(tables))
        N, T = placements.shape
        P = self.table_terms(tables, workload) if terms is None else terms
        flat = (placements + np.arange(N)[:, None] * devices).ravel()
        dims = np.array([t.dim for t in tables], dtype=np.float64)
        shard = shard_terms(P, flat, N * devices, dims, workload, self._columns)
        nonempty = shard[:, TERMS.index("launch")] > 0
        fwd = np.where(nonempty, shard @ self._fwd, 0.0)
        bwd = np.where(nonempty, shard @ self._bwd, 0.0)
        if self.product_path and T:
            if self._product_cache is None or self._product_cache[0] is not P or self._product_cache[1] != workload:
                self._product_cache = (P, workload, product_candidates(tables, P, self._bwd, workload))
            cand, delta = self._product_cache[2]
            if len(cand):
                bwd += np.bincount(flat.reshape(N, T)[:, cand].ravel(), weights=np.tile(delta, N), minlength=N * devices)
        rw_dim = sum(t.dim for t in rowwise_tables(tables))
        is_row = np.array([isinstance(t, RowShardSpec) for t in tables], dtype=bool)
        if rw_dim:  # row shards are not in the all-to-all
            row_cols = np.bincount(flat, weights=np.broadcast_to(np.where(is_row, dims, 0.0), (N, T)).ravel(), minlength=N * devices).reshape(N, devices)
            dims[is_row] = 0.0
        dim_sums = np.bincount(flat, weights=np.broadcast_to(dims, (N, T)).ravel(), minlength=N * devices).reshape(N, devices)
        sent, recv = alltoall_bytes_array(dim_sums, workload.batch_size, workload.elt_bytes)
        out = np.empty((N, devices, 4))
        out[..., 0] = fwd.reshape(N, devices)
        out[..., 3] = bwd.reshape(N, devices)
        if several_hosts(topology) is not None:
            if topology.devices != devices:
                raise ValueError(f"a topology of {topology.devices} devices for a placement on {devices}")
            cols = row_cols if rw_dim else np.zeros((N, devices))
            out[..., 1], out[..., 2] = topology_comm_ms(self.comm_for(topology.gpus_per_host), tables, placements, dim_sums, cols, workload, topology)
            return out
        comm = self.comm_for(devices)
        out[..., 1] = alltoall_ms(comm, sent, recv)
        out[..., 2] = alltoall_ms(comm, recv, sent)
        if rw_dim:
            rs, ag = rowwise_ms(comm, rw_dim, workload.batch_size, workload.elt_bytes, devices)
            copy_f, copy_b = relayout_ms(comm, dim_sums, row_cols, workload.batch_size, workload.elt_bytes)
            out[..., 1] += rs + copy_f
            out[..., 2] += ag + copy_b
        return out

    def _costs_of_shards(self, shards: Sequence[Sequence[TableSpec]], workload: Workload, topology: Topology | None = None) -> np.ndarray:
        """[D, 4] costs of one placement given as shards: costs_batch of a batch of one."""
        tables = [t for s in shards for t in s]
        placement = np.repeat(np.arange(len(shards)), [len(s) for s in shards])
        return self.costs_batch(tables, placement[None, :], len(shards), workload, topology=topology)[0]

    def shard_compute(self, shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload()) -> np.ndarray:
        """[S, 2] predicted (fwd, bwd) compute of each shard on its own."""
        return self._costs_of_shards(shards, workload)[:, [0, 3]]

    supports_topology = True

    def evaluate(self, shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload(), topology: Topology | None = None) -> CostReport:
        c = self._costs_of_shards(shards, workload, topology)
        multi = several_hosts(topology) is not None
        comm = self.calibration.comm.get("source", "?")
        if multi:
            comm = f"inside each host: {self.comm_for(topology.gpus_per_host).get('source', '?')}; between hosts: {topology.inter_host_GBps:g} GB/s per GPU, {topology.inter_host_latency_us:g} µs"
        return CostReport(
            devices=[DeviceCost(*map(float, row)) for row in c],
            backend=self.name,
            runner="sim",
            hardware=f"simulated: {self.calibration.hardware}, {self.calibration.kernel} kernel",
            batch_size=workload.batch_size,
            precision=workload.precision,
            optimizer=workload.optimizer,
            comm_modelled=True,
            details={"calibration_date": self.calibration.date, "comm": comm, **({"topology": topology.to_json()} if multi else {})},
        )


def overall(costs: np.ndarray) -> np.ndarray:
    """The paper's cost of each placement from costs_batch output: max over devices of the sum."""
    return costs.sum(axis=-1).max(axis=-1)


def fit_coefficients(X: np.ndarray, y: np.ndarray, names: Sequence[str], offset: np.ndarray | None = None) -> dict[str, float]:
    """Non-negative least squares on relative error: every shard counts the same, large or small.
    `offset` [S]: a known part of each y that the terms do not price (the product path's time):
    X·w + offset fitted to y, the error still relative to all of y."""
    from scipy.optimize import nnls

    cols = [TERMS.index(n) for n in names]
    A = X[:, cols] / y[:, None]
    scale = np.maximum(np.abs(A).max(axis=0), 1e-30)  # condition the columns
    w, _ = nnls(A / scale, np.ones(len(y)) - (0.0 if offset is None else offset / y))
    return {n: float(v) for n, v in zip(names, w / scale)}


def cross_validated_mape(X: np.ndarray, y: np.ndarray, names: Sequence[str], folds: int = 10, seed: int = 0, offset: np.ndarray | None = None) -> float:
    """MAPE of fit_coefficients on held-out folds of the shards (fixed random folds)."""
    offset = np.zeros(len(y)) if offset is None else offset
    idx = np.random.default_rng(seed).permutation(len(y))
    pred = np.empty(len(y))
    for k in range(folds):
        test = idx[k::folds]
        train = np.setdiff1d(idx, test)
        coef = fit_coefficients(X[train], y[train], names, offset[train])
        pred[test] = X[test][:, [TERMS.index(n) for n in names]] @ np.array([coef[n] for n in names]) + offset[test]
    return mape(pred, y)


def select_terms(X: np.ndarray, y: np.ndarray, names: Sequence[str], offset: np.ndarray | None = None) -> tuple[tuple[str, ...], dict[str, float]]:
    """The term set, with or without the optional terms, of lower cross-validated MAPE."""
    candidates = {"all terms": tuple(names), "without " + ", ".join(OPTIONAL_TERMS): tuple(n for n in names if n not in OPTIONAL_TERMS)}
    errors = {label: cross_validated_mape(X, y, terms, offset=offset) for label, terms in candidates.items()}
    return candidates[min(errors, key=errors.get)], errors


def shard_term_matrix(shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload(), cache_bytes: float = 0.0) -> np.ndarray:
    """[S, len(TERMS)]: each shard's terms (shard_terms)."""
    tables = [t for s in shards for t in s]
    flat = np.repeat(np.arange(len(shards)), [len(s) for s in shards])
    return shard_terms(table_terms(tables, workload, cache_bytes), flat, len(shards), np.array([t.dim for t in tables], dtype=np.float64), workload)


def product_path_split(shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload(), cache_bytes: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per shard, of the tables the backward's product path takes: the sum of their own terms
    ([S, len(TERMS)], the shard-level ones 0) and of their product-path times ([S] ms) — what a
    calibration marked `product_path` prices by the path instead of by the terms (product_candidates)."""
    tables = [t for s in shards for t in s]
    flat = np.repeat(np.arange(len(shards)), [len(s) for s in shards])
    P = table_terms(tables, workload, cache_bytes)
    lookups, rows, dims = table_arrays(tables, workload.batch_size)
    takes = product_tables(lookups, rows, dims, workload.batch_size, workload.elt_bytes)
    own = np.where(takes[:, None] & ~_SHARD_ONLY[None, :], P, 0.0)
    dense = np.where(takes, dense_us(lookups, rows, dims, workload.batch_size, workload.elt_bytes) / 1000.0, 0.0)
    out = np.zeros((len(shards), len(TERMS)))
    np.add.at(out, flat, own)
    return out, np.bincount(flat, weights=dense, minlength=len(shards))


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true) * 100)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else math.nan
