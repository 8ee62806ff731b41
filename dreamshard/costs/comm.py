"""The comm model: what the step's collectives cost each device (docs/comm.md).

Byte counts. In the forward all-to-all of a placement on D devices, device d holds the pooled
outputs of its whole tables and column shards for the whole batch, ``[B, dimsum_d]``, and keeps the
``B/D`` samples of its own slice. It sends ``B/D · dimsum_d · elt`` bytes to each of the other D−1
devices and receives ``B/D · dimsum_j · elt`` from each other device j:

    send_d = B · dimsum_d · elt · (D−1)/D          recv_d = (B/D) · Σ_{j≠d} dimsum_j · elt

The backward all-to-all of the output gradients is the same exchange reversed (send ↔ recv).
Its own slice is a local copy and is not counted.

Time (`alltoall_ms`). With load_d = max(send_d, recv_d) + serial_fraction · min(send_d, recv_d),
a device moves (1 − coupling) · load_d + coupling · max_j load_j bytes at `bytes_ms`: latency +
bytes / bandwidth, or two rates joined at a knee. ``serial_fraction`` says how much the two
directions get in each other's way (0 on a full-duplex link, 1 where one resource moves both);
``coupling`` how far a device waits for the busiest one. Both are fitted, not assumed: the
calibration's skewed patterns (send ≠ recv, one heavy or idle rank) tell them apart.

Row-wise tables (plan.py, rowshard.py) are exchanged by collectives instead: the forward sums the
devices' partial pooled outputs by a **reduce-scatter** over all D devices of one [B, Σ dim]
buffer, the backward spreads the output gradients back by an **all-gather**. A ring moves
(D−1)/D of the buffer into and out of every device for either: t = `bytes_ms` of
ring_bytes = N · (D−1)/D, N = B · Σ dim · elt, fitted per collective (``CommModel.reduce_scatter``
/ ``all_gather``; a model without them derives them from its all-to-all fit, `collective_ms`).
A device with row shards copies its columns out of its TBE output before the collectives and its
gradients in after (`relayout_forward` / `relayout_backward`, priced by `relayout_ms` from the
model's ``relayout`` fit: per direction, a latency and a rate for each kind of column, `copies_ms`).

Calibration (``measure_comm``, ``calibrate``) runs every collective as the distributed runner
issues and times it (one process per device: gloo on CPU, NCCL on CUDA) over a designed set of
patterns and a held-out set, and ``fit_comm`` minimises the *relative* squared error (times span
four decades; an absolute fit would ignore the small ones).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Iterable, Sequence

import numpy as np

from dreamshard.validation import MAX_CHUNK_BYTES, DataError, OptionError, one_line

FORMAT = "dreamshard.comm/1"
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "comm"

# Designed per-destination chunk sizes (bytes a rank sends to each other rank). The low end pins
# the latency, the high end the bandwidth; geometric spacing weighs every decade alike.
# The sizes of a DLRM step: at B = 65,536 and fp16 a rank's chunk is B/D · 2 bytes per column of
# its all-to-all (32 KB per column on 4 GPUs: 256 KB–128 MB for dim sums of 8–4,000), the row-wise
# buffer B · 2 bytes per column (128 KB per column).
DEFAULT_CHUNKS = {
    "cpu": [256, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20],
    "cuda": [16 << 10, 128 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 192 << 20],
}
DEFAULT_BUFFERS = {
    "cpu": [4 << 10, 64 << 10, 1 << 20, 8 << 20],
    "cuda": [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20],
}
# (all-to-all columns, row-shard columns) of a rank's TBE output whose copies are timed, over
# RELAYOUT_ROWS samples (the batch of a DLRM step on GPUs)
RELAYOUT_WIDTHS = [(16, 4), (128, 16), (512, 64), (1024, 512), (3072, 128)]
HELD_OUT_WIDTHS = [(64, 8), (256, 256), (2048, 32)]
RELAYOUT_ROWS = {"cpu": 1024, "cuda": 65536}
# The held-out patterns: the same design between the fitted sizes, with another seed; chosen
# before any measurement, never fitted
HELD_OUT_CHUNKS = {
    "cpu": [1 << 10, 16 << 10, 128 << 10, 2 << 20],
    "cuda": [48 << 10, 384 << 10, 2 << 20, 8 << 20, 32 << 20, 96 << 20],
}
HELD_OUT_BUFFERS = {
    "cpu": [16 << 10, 256 << 10, 4 << 20],
    "cuda": [512 << 10, 2 << 20, 8 << 20, 32 << 20, 128 << 20],
}
SKEW = 4  # skewed exchange: rank 0's chunks are SKEW × the others'
COLLECTIVES = ("reduce_scatter", "all_gather")
RELAYOUT = "relayout"  # the copies around the row-wise collectives: a fit like theirs, of bytes moved


def alltoall_bytes_array(dim_sums: np.ndarray, batch_size: int, elt, total=None, devices=None) -> tuple[np.ndarray, np.ndarray]:
    """(send, recv) bytes of the forward all-to-all for dim sums of shape [..., D] (batched).

    Own slices are excluded, so one device moves nothing. The simulator costs thousands of
    placements at once through this; ``alltoall_bytes`` is the one-placement view of it.
    `total` (default: the sum over the last axis) is the all-to-all's whole width and `devices`
    (default: the last axis's length) its device count, each broadcast against [..., 1]: the
    learned cost net prices a device of a plan still being built, or of a batch padded to more
    devices, with its task's (learned/nets.py, `CommFormula`). `elt` may be an array too.
    """
    dim_sums = np.asarray(dim_sums, dtype=np.float64)
    D = dim_sums.shape[-1] if devices is None else devices
    total = dim_sums.sum(axis=-1, keepdims=True) if total is None else total
    send = batch_size * dim_sums * elt * (D - 1) / D
    recv = (batch_size / D) * (total - dim_sums) * elt
    return send, recv


def bytes_ms(fit: dict, moved):
    """latency + moved / bandwidth, or, with a knee (``knee_bytes`` > 0), the bytes up to the knee
    at ``knee_bandwidth_GBps`` and the rest at ``bandwidth_GBps``: the time of moving `moved` bytes
    (numbers or arrays) by one fitted collective. The one form of every fit here."""
    moved = np.asarray(moved, dtype=np.float64)
    k = fit.get("knee_bytes") or 0.0
    if k:
        t = fit["latency_ms"] + np.minimum(moved, k) / (fit["knee_bandwidth_GBps"] * 1e6) + np.maximum(moved - k, 0.0) / (fit["bandwidth_GBps"] * 1e6)
    else:
        t = fit["latency_ms"] + moved / (fit["bandwidth_GBps"] * 1e6)
    return t


def alltoall_ms(comm: dict, send, recv):
    """Every device's all-to-all ms from a comm model's parameters (``CommModel.params()`` or a
    calibration's ``comm``). `send` and `recv` are arrays [..., D], the last axis the devices of
    one exchange (numbers: one device seen alone). With a device's load

        load_d = max(send_d, recv_d) + serial_fraction · min(send_d, recv_d)

    t_d = `bytes_ms` of (1 − coupling) · load_d + coupling · max_j load_j (latency + load / bandwidth,
    with a knee where the model has one), 0 where the device moves nothing. ``coupling`` (0 where absent) says how far a device waits for the busiest
    one: in NCCL's all-to-all every pair exchanges at once, so a device that sends and receives
    little still waits for its chunk from the busiest peer. The one formula: `CommModel`, the
    simulator and the learned cost net's `CommFormula` all price the all-to-all through it."""
    send, recv = np.asarray(send, dtype=np.float64), np.asarray(recv, dtype=np.float64)
    hi, lo = np.maximum(send, recv), np.minimum(send, recv)
    load = hi + comm.get("serial_fraction", 0.0) * lo
    k = comm.get("coupling", 0.0)
    if k and load.ndim:
        load = (1.0 - k) * load + k * load.max(axis=-1, keepdims=True)
    out = np.where(hi > 0, bytes_ms(comm, load), 0.0)
    return float(out) if out.ndim == 0 else out


def chunks_traffic(chunks_bytes, backward: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(send[..., D], recv[..., D]) bytes of the runner's exchange where rank d sends
    `chunks_bytes[..., d]` to every other rank (the forward; the backward reverses it)."""
    c = np.asarray(chunks_bytes, dtype=np.float64)
    D = c.shape[-1]
    send, recv = c * (D - 1), c.sum(axis=-1, keepdims=True) - c
    return (recv, send) if backward else (send, recv)


def alltoall_bytes(dim_sums: Sequence[int], batch_size: int, elt: int) -> tuple[list[float], list[float]]:
    """(send[D], recv[D]) bytes of the *forward* all-to-all of pooled outputs; backward = reversed.

    ``dim_sums[d]`` is the sum of the dims of the tables on device d, ``elt`` the bytes per
    element of the outputs (2 for fp16). Own slices are excluded.
    """
    if len(dim_sums) == 0:
        return [], []
    send, recv = alltoall_bytes_array(np.array(dim_sums), batch_size, elt)
    return send.tolist(), recv.tolist()


def ring_bytes(buffer_bytes, devices: int):
    """Bytes a ring reduce-scatter (of an N-byte input) or all-gather (into an N-byte output)
    sends out of, and receives into, each of `devices` ranks: N · (D−1)/D. Numbers or arrays."""
    return np.asarray(buffer_bytes, dtype=np.float64) * (devices - 1) / devices


def collective_ms(comm: dict, kind: str, buffer_bytes, devices: int):
    """Per-device ms of a reduce-scatter or all-gather (`kind`) of an N-byte buffer over `devices`
    ranks, from a comm model's parameters (``CommModel.params()`` or a calibration's ``comm``):
    its own fit under ``comm[kind]`` if it has one, else the all-to-all rule of the module
    docstring. 0 where nothing moves (one device, an empty buffer). Numbers or arrays."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}: one of {COLLECTIVES}")
    moved = ring_bytes(buffer_bytes, devices)
    fit = comm.get(kind)
    if fit:
        t = bytes_ms(fit, moved)
    else:
        t = comm["latency_ms"] + (1.0 + comm.get("serial_fraction", 0.0)) * moved / (comm["bandwidth_GBps"] * 1e6)
    out = np.where(moved > 0, t, 0.0)
    return float(out) if out.ndim == 0 else out


def rowwise_ms(comm: dict, rowwise_dim: int, batch_size: int, elt: int, devices: int) -> tuple[float, float]:
    """(forward reduce-scatter ms, backward all-gather ms) of the row-wise tables' exchange: one
    [B, rowwise_dim] buffer over all devices; every device takes the same time."""
    n = batch_size * rowwise_dim * elt
    return collective_ms(comm, "reduce_scatter", n, devices), collective_ms(comm, "all_gather", n, devices)


def relayout_ms(comm: dict, a2a_dims, row_dims, batch_size: int, elt):
    """(forward ms[..., D], backward ms[..., D]) of the column copies of a device that holds row
    shards (`relayout_forward` / `relayout_backward`): its TBE output has its all-to-all columns
    (`a2a_dims`) and its row shards' columns (`row_dims`) side by side, so both are copied out
    before the collectives and their gradients copied in after: 2 · B · a2a · elt and 2 · B · row ·
    elt bytes read and written each way, priced by `copies_ms`. The forward copies come
    before the all-to-all and the reduce-scatter, which every rank leaves together: every device
    pays the slowest device's; the backward ones are each device's own. 0 for a device without
    row shards (its output goes to the all-to-all as it is) or where the model has no fit."""
    rows = np.asarray(row_dims, dtype=np.float64)
    fit = comm.get("relayout")
    if not fit:
        z = np.zeros_like(rows)
        return z, z
    a2a = np.asarray(a2a_dims, dtype=np.float64)
    fwd, bwd = (np.where(rows > 0, copies_ms(fit, d, 2.0 * batch_size * a2a * elt, 2.0 * batch_size * rows * elt), 0.0) for d in ("fwd", "bwd"))
    return np.broadcast_to(fwd.max(axis=-1, keepdims=True), fwd.shape).copy(), bwd


def copies_ms(fit: dict, direction: str, a2a_bytes, row_bytes):
    """ms of one direction's column copies moving `a2a_bytes` of all-to-all columns and `row_bytes`
    of row-shard columns (read and written): a fit per direction (``fit[direction]``: latency, a
    rate for each kind of column — the row shards' columns are gathered or scattered by index, the
    all-to-all's copied as a block, and the backward makes one more pass; `fit_relayout`), or a
    model's older fit of their sum (`bytes_ms`)."""
    f = fit.get(direction)
    if f is None:
        return bytes_ms(fit, np.asarray(a2a_bytes, dtype=np.float64) + row_bytes)
    return f["latency_ms"] + np.asarray(a2a_bytes, dtype=np.float64) / (f["a2a_GBps"] * 1e6) + np.asarray(row_bytes, dtype=np.float64) / (f["row_GBps"] * 1e6)


def relayout_problem(fit) -> str | None:
    """What is wrong with a relayout fit (`copies_ms`: per direction, or an older `bytes_ms` one), or None."""
    if not isinstance(fit, dict) or "fwd" not in fit:
        return comm_params_problem(fit)
    for d in ("fwd", "bwd"):
        f = fit.get(d)
        for key, ok in (("latency_ms", lambda v: v >= 0), ("a2a_GBps", lambda v: v > 0), ("row_GBps", lambda v: v > 0)):
            v = f.get(key) if isinstance(f, dict) else None
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v)):
                return f"{d}.{key} must be a finite number {'>= 0' if key == 'latency_ms' else '> 0'}, got {v!r:.40}"
    return None


def comm_params_problem(params, serial_required: bool = False) -> str | None:
    """What is wrong with a collective model's parameters ({latency_ms, bandwidth_GBps,
    serial_fraction (0 where absent, unless `serial_required`), coupling (0 where absent)}), or None. The one check of them: the
    comm model, a calibration's copy and a trained model's each raise it as their own error."""
    if not isinstance(params, dict):
        return "expected an object with latency_ms and bandwidth_GBps"
    for key, ok, want in (("latency_ms", lambda v: v >= 0, "a finite number >= 0"),
                          ("bandwidth_GBps", lambda v: v > 0, "a finite number > 0"),
                          ("serial_fraction", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
                          ("coupling", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
                          ("knee_bytes", lambda v: v >= 0, "a finite number >= 0")):
        v = params.get(key, 0.0 if key in ("coupling", "knee_bytes") or (key == "serial_fraction" and not serial_required) else None)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v)):
            return f"{key} must be {want}, got {v!r:.40}"
    if params.get("knee_bytes"):
        v = params.get("knee_bandwidth_GBps")
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            return f"knee_bandwidth_GBps must be a finite number > 0 where knee_bytes is set, got {v!r:.40}"
    return None


def check_collective_fit(fit, what: str) -> None:
    problem = None if fit is None else comm_params_problem(fit)
    if problem:
        raise ValueError(f"{what}: {problem}")


def fit_relayout(points: Iterable[dict]) -> dict:
    """The `copies_ms` fit of the column copies from relayout points ({"direction", "a2a_cols",
    "row_cols", "rows", "bytes", "ms"}): per direction, latency + all-to-all bytes / a2a_GBps + row
    bytes / row_GBps, minimising Σ ((pred − t)/t)² with every term >= 0."""
    from scipy.optimize import nnls

    pts = list(points)
    out: dict = {}
    for d in ("fwd", "bwd"):
        mine = [p for p in pts if p.get("direction") == d]
        if len(mine) < 3:
            raise ValueError(f"fitting the {d} copies needs at least 3 widths, got {len(mine)}")
        X, t = np.array([_copy_bytes(p) for p in mine]), np.array([float(p["ms"]) for p in mine])
        (lat, inv_a, inv_r), _ = nnls(np.column_stack([np.ones(len(mine)), X]) / t[:, None], np.ones(len(mine)))
        if inv_a <= 0 or inv_r <= 0:
            raise ValueError(f"cannot fit the {d} copies: their time does not grow with both kinds of columns; measure wider ones")
        out[d] = {"latency_ms": float(lat), "a2a_GBps": float(1e-6 / inv_a), "row_GBps": float(1e-6 / inv_r)}
    rel = np.array([abs(point_ms({RELAYOUT: out}, p) / float(p["ms"]) - 1.0) for p in pts])
    return {**out, "points": len(pts), "median_rel_error": float(np.median(rel)), "max_rel_error": float(rel.max())}


def _copy_bytes(p: dict) -> tuple[float, float]:
    """(all-to-all bytes, row-shard bytes) a relayout point's copies read and write."""
    elt = float(p["bytes"]) / (2.0 * p["rows"] * (p["a2a_cols"] + p["row_cols"]))
    return 2.0 * p["rows"] * p["a2a_cols"] * elt, 2.0 * p["rows"] * p["row_cols"] * elt


def fit_collective(points: Iterable[dict], **meta) -> dict:
    """The `bytes_ms` fit of one collective from points {"buffer_bytes", "devices", "ms"}: the
    least-squares fit of relative error of t = latency + ring_bytes / bandwidth (`_fit_bytes`: with
    a knee where that fits better). Relayout points ({"bytes", "ms"}: bytes read and written) fit
    t = latency + bytes / bandwidth alike."""
    pts = list(points)
    if len(pts) < 2:
        raise ValueError(f"fitting a collective needs at least 2 measurements, got {len(pts)}")
    x = np.array([float(p["bytes"]) if "bytes" in p else float(ring_bytes(p["buffer_bytes"], p["devices"])) for p in pts])
    t = np.array([float(p["ms"]) for p in pts])
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("collective measurements must have finite times > 0 ms")
    _, fit = _fit_bytes(x, t)
    if fit["bandwidth_GBps"] <= 0:
        raise ValueError("cannot fit a bandwidth: the time does not grow with the bytes; measure larger sizes")
    rel = np.abs(bytes_ms(fit, x) / t - 1.0)
    return {**fit, "points": len(pts), "median_rel_error": float(np.median(rel)), "max_rel_error": float(rel.max()), **meta}


@dataclass
class CommModel:
    """The all-to-all (`alltoall_ms`: latency, bandwidth, serial_fraction, coupling) and the
    row-wise collectives (`collective_ms`: each its latency and bandwidth) of one interconnect at
    one device count."""

    latency_ms: float
    bandwidth_GBps: float  # 1 GB = 1e9 bytes
    serial_fraction: float = 0.0  # 0: directions overlap (full duplex); 1: they add up
    coupling: float = 0.0  # 0: a device's own traffic; 1: the busiest device's (alltoall_ms)
    knee_bytes: float = 0.0  # 0: one bandwidth; else the bytes up to here move at knee_bandwidth_GBps (bytes_ms)
    knee_bandwidth_GBps: float = 0.0
    hardware: str = "?"
    date: str = ""
    versions: dict = field(default_factory=dict)
    process_group: str = "?"  # "gloo" or "nccl"
    devices: int = 2  # devices the calibration ran on
    fit_details: dict = field(default_factory=dict)  # n points, relative errors, alternatives
    measurements: list = field(default_factory=list)  # the raw points the fit used
    path: str | None = field(default=None, compare=False)  # where it was loaded from, if anywhere
    # fitted reduce-scatter / all-gather ({"latency_ms", "bandwidth_GBps", ...}); None: derived
    # from the all-to-all fit (module docstring)
    reduce_scatter: dict | None = None
    all_gather: dict | None = None
    relayout: dict | None = None  # the column copies of a device with row shards (`relayout_ms`); None: not priced

    def __post_init__(self) -> None:
        problem = comm_params_problem({"latency_ms": self.latency_ms, "bandwidth_GBps": self.bandwidth_GBps, "serial_fraction": self.serial_fraction,
                                       "coupling": self.coupling, "knee_bytes": self.knee_bytes, "knee_bandwidth_GBps": self.knee_bandwidth_GBps})
        if problem:
            raise ValueError(f"comm model: {problem}")
        for kind in COLLECTIVES:
            check_collective_fit(getattr(self, kind), f"comm model {kind}")
        problem = None if self.relayout is None else relayout_problem(self.relayout)
        if problem:
            raise ValueError(f"comm model relayout: {problem}")

    def params(self) -> dict:
        """The parameters `alltoall_ms` and `collective_ms` read (as a simulator calibration's ``comm`` holds them)."""
        return {"latency_ms": self.latency_ms, "bandwidth_GBps": self.bandwidth_GBps, "serial_fraction": self.serial_fraction,
                "coupling": self.coupling, "knee_bytes": self.knee_bytes, "knee_bandwidth_GBps": self.knee_bandwidth_GBps,
                "reduce_scatter": self.reduce_scatter, "all_gather": self.all_gather, "relayout": self.relayout}

    def rowwise_ms(self, rowwise_dim: int, batch_size: int, elt: int, devices: int) -> tuple[float, float]:
        """(reduce-scatter ms, all-gather ms) of the row-wise tables' exchange (module docstring)."""
        return rowwise_ms(self.params(), rowwise_dim, batch_size, elt, devices)

    # ------------------------------------------------------------------ predict
    def predict(self, send_bytes, recv_bytes):
        """Milliseconds of the all-to-all: a number for one device seen alone, or a list for the
        devices of one exchange (equal-length sequences, one entry per device)."""
        if isinstance(send_bytes, (int, float)) and isinstance(recv_bytes, (int, float)):
            return alltoall_ms(self.params(), send_bytes, recv_bytes)
        send, recv = np.asarray(send_bytes, dtype=np.float64), np.asarray(recv_bytes, dtype=np.float64)
        if send.shape != recv.shape:
            raise ValueError(f"send and recv must have one entry per device, got {send.shape} and {recv.shape}")
        return alltoall_ms(self.params(), send, recv).tolist()

    def placement_ms(self, dim_sums: Sequence[int], batch_size: int, elt: int) -> tuple[list[float], list[float]]:
        """(forward ms[D], backward ms[D]) of a placement's two all-to-alls; zeros for D = 1."""
        if len(dim_sums) <= 1:
            return [0.0] * len(dim_sums), [0.0] * len(dim_sums)
        send, recv = alltoall_bytes(dim_sums, batch_size, elt)
        return self.predict(send, recv), self.predict(recv, send)

    def point_ms(self, point: dict) -> float:
        """The model's ms for one calibration point of ``measure_comm`` (its op, rank and pattern)."""
        return point_ms(self.params(), point)

    def errors(self, points: Sequence[dict]) -> dict:
        """{op: {points, median_rel_error, max_rel_error}} of the model on calibration points."""
        return point_errors(self.params(), points)

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit(cls, points: Iterable, **meta) -> "CommModel":
        """Fit the all-to-all's latency, bandwidth, serial_fraction and coupling to points: dicts of
        ``measure_comm`` (with the pattern's ``chunks_bytes``, ``rank`` and ``direction``), or
        ``(send_bytes, recv_bytes, ms)`` of one device seen alone (coupling stays 0).

        Minimises Σ ((pred − t)/t)²: for each (serial_fraction, coupling) on a grid of 0, 0.05, …, 1,
        the `_fit_bytes` fit of the loads (latency and bandwidth, with a knee where it fits better),
        keeping the best; latency is clamped at 0. ``meta`` goes to the constructor (hardware, date, versions, process_group,
        devices, the collectives' fits).
        """
        points = list(points)
        if len(points) < 2:
            raise ValueError(f"fitting a comm model needs at least 2 measurements, got {len(points)}")
        own, peak, t = _fit_loads(points)
        if np.any(t <= 0) or not np.all(np.isfinite(t)):
            raise ValueError("comm measurements must have finite times > 0 ms")
        grid = np.round(np.linspace(0.0, 1.0, 21), 2)
        couplings = grid if peak is not None else np.zeros(1)
        fits = {}
        for gamma in grid:
            for k in couplings:
                x = own[gamma] if peak is None else (1 - k) * own[gamma] + k * peak[gamma]
                sse, fit = _fit_bytes(x, t)
                fits[(float(gamma), float(k))] = (sse, fit, np.abs(bytes_ms(fit, x) / t - 1.0))
        best = min(fits, key=lambda g: fits[g][0])
        _, fit, rel = fits[best]
        if fit["bandwidth_GBps"] <= 0:
            raise ValueError("cannot fit a bandwidth: the all-to-all time does not grow with the bytes sent; measure larger sizes")
        model = cls(latency_ms=fit["latency_ms"], bandwidth_GBps=fit["bandwidth_GBps"], serial_fraction=best[0], coupling=best[1],
                    knee_bytes=fit.get("knee_bytes", 0.0), knee_bandwidth_GBps=fit.get("knee_bandwidth_GBps", 0.0), **meta)

        def summary(key: tuple) -> dict:
            _, f, e = fits[key]
            return {**f, "median_rel_error": float(np.median(e)), "max_rel_error": float(e.max())}

        alternatives = {"max(send, recv) [serial_fraction 0, coupling 0]": summary((0.0, 0.0)),
                        "send + recv [serial_fraction 1, coupling 0]": summary((1.0, 0.0))}
        if peak is not None:
            alternatives[f"own load only [serial_fraction {best[0]:g}, coupling 0]"] = summary((best[0], 0.0))
        model.fit_details = {"points": len(points), "objective": "least squares of relative error", "median_rel_error": float(np.median(rel)),
                             "max_rel_error": float(rel.max()), "alternatives": alternatives}
        if not model.measurements:
            model.measurements = [m if isinstance(m, dict) else {"send_bytes": m[0], "recv_bytes": m[1], "ms": m[2]} for m in points]
        return model

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("path")
        for kind in (*COLLECTIVES, RELAYOUT):  # absent, not null: files of models without them stay as they were
            if d[kind] is None:
                d.pop(kind)
        return {"format": FORMAT, **d}

    def save(self, path: str | Path) -> None:
        """Atomic write."""
        from dreamshard.files import atomic_write

        atomic_write(path, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "CommModel":
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: no such comm model file")
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: invalid JSON ({getattr(e, 'msg', e)})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise DataError(f"{path}: not a {FORMAT} file (make one with `dreamshard calibrate comm --out FILE`)")
        known = {k: d[k] for k in ("latency_ms", "bandwidth_GBps", "serial_fraction", "coupling", "knee_bytes", "knee_bandwidth_GBps", "hardware", "date", "versions", "process_group", "devices", "fit_details", "measurements", *COLLECTIVES, RELAYOUT) if k in d}
        try:
            return cls(**known, path=str(path))
        except (TypeError, ValueError) as e:
            raise DataError(f"{path}: {one_line(e)}") from None

    def describe(self) -> str:
        bytes_ = "max(send, recv)" if self.serial_fraction == 0 else ("send + recv" if self.serial_fraction == 1 else f"(max + {self.serial_fraction:g}·min)(send, recv)")
        coupled = f", coupling {self.coupling:g}" if self.coupling else ""
        rate = (f"{self.bandwidth_GBps:.1f} GB/s" if not self.knee_bytes else
                f"{self.knee_bandwidth_GBps:.1f} GB/s up to {self.knee_bytes / 1e6:.3g} MB, {self.bandwidth_GBps:.1f} GB/s beyond")
        return f"{self.latency_ms * 1e3:.1f} µs + {bytes_} / {rate}{coupled} ({self.process_group}, {self.hardware}, {self.date})"


def _point_traffic(p: dict) -> tuple[np.ndarray, np.ndarray, int]:
    """(send[D], recv[D], rank) of a calibration point with its pattern; one device alone otherwise."""
    if "chunks_bytes" in p:
        send, recv = chunks_traffic(p["chunks_bytes"], backward=p.get("direction") == "bwd")
        return send, recv, int(p["rank"])
    return np.array([float(p["send_bytes"])]), np.array([float(p["recv_bytes"])]), 0


def point_ms(comm: dict, p: dict) -> float:
    """The model's ms for one calibration point: an all-to-all (with its pattern, or one device
    alone) or a reduce-scatter / all-gather of its buffer."""
    op = p.get("op", "all_to_all")
    if op in COLLECTIVES:
        return float(collective_ms(comm, op, p["buffer_bytes"], p["devices"]))
    if op == RELAYOUT:
        fit = comm[RELAYOUT]
        return float(copies_ms(fit, p["direction"], *_copy_bytes(p)) if "fwd" in fit else bytes_ms(fit, p["bytes"]))
    send, recv, rank = _point_traffic(p)
    return float(np.atleast_1d(alltoall_ms(comm, send, recv))[rank])


def point_errors(comm: dict, points: Sequence[dict]) -> dict:
    """{op: {points, median_rel_error, max_rel_error}} of parameters `comm` on calibration points."""
    out = {}
    for op in sorted({p.get("op", "all_to_all") for p in points}):
        pts = [p for p in points if p.get("op", "all_to_all") == op]
        rel = np.array([abs(point_ms(comm, p) / float(p["ms"]) - 1.0) for p in pts])
        out[op] = {"points": len(pts), "median_rel_error": float(np.median(rel)), "max_rel_error": float(rel.max())}
    return out


def _fit_loads(points: list) -> tuple[dict, dict | None, np.ndarray]:
    """For every serial_fraction γ of the fit's grid: each point's own load max + γ·min and, where
    every point has its pattern, the busiest device's (None otherwise); and the times."""
    rows = [m if isinstance(m, dict) else {"send_bytes": m[0], "recv_bytes": m[1], "ms": m[2]} for m in points]
    traffic = [_point_traffic(p) for p in rows]
    t = np.array([float(p["ms"]) for p in rows])
    patterned = all("chunks_bytes" in p for p in rows)
    own, peak = {}, {} if patterned else None
    for gamma in np.round(np.linspace(0.0, 1.0, 21), 2):
        loads = [np.maximum(s, r) + gamma * np.minimum(s, r) for s, r, _ in traffic]
        own[float(gamma)] = np.array([load[rank] for load, (_, _, rank) in zip(loads, traffic)])
        if patterned:
            peak[float(gamma)] = np.array([load.max() for load in loads])
    return own, peak, t


def _fit_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, b) minimising Σ ((a + b·x − t)/t)², with a >= 0."""
    A = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if a < 0:
        u = x / t
        a, b = 0.0, float(u.sum() / max((u * u).sum(), 1e-300))
    return float(a), float(b)


KNEES = np.geomspace(64 << 10, 1 << 30, 29)  # where a fit may put its knee (bytes)


def _fit_bytes(x: np.ndarray, t: np.ndarray) -> tuple[float, dict]:
    """The `bytes_ms` fit of times `t` to byte counts `x`, minimising Σ ((pred − t)/t)²: the
    straight line, or, where it fits better, two lines joined at a knee from KNEES (a weighted
    linear least-squares fit of (latency, 1/knee bandwidth, 1/bandwidth) for each knee with ≥ 3
    points on either side, kept where the information criterion says it pays; the bandwidth above
    the knee must be the higher: NCCL's protocols move small messages at a lower rate than large
    ones). (sum of squared relative errors, parameters)."""
    a, b = _fit_line(x, t)
    e = (a + b * x - t) / t
    line = best = (float(e @ e), {"latency_ms": a, "bandwidth_GBps": 1e-6 / b if b > 0 else -1.0})
    for k in KNEES if line[0] > 0 else ():
        below = int((x <= k).sum())
        if below < 3 or len(x) - below < 3:
            continue
        A = np.stack([np.ones_like(x), np.minimum(x, k), np.maximum(x - k, 0.0)], axis=1) / t[:, None]
        (a, s1, s2), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        if a < 0 or s2 <= 0 or s1 < s2:
            continue
        e = A @ np.array([a, s1, s2]) - 1.0
        # a knee is two more parameters (where, and the second rate): it must pay for them by the
        # Bayesian information criterion, or noise about one line would bend it
        if float(e @ e) < best[0] and len(x) * math.log(max(float(e @ e), 1e-300) / line[0]) + 2 * math.log(len(x)) < 0:
            best = (float(e @ e), {"latency_ms": float(a), "bandwidth_GBps": float(1e-6 / s2), "knee_bytes": float(k), "knee_bandwidth_GBps": float(1e-6 / s1)})
    return best


DEFAULT_GPU = "h100"  # the GPU of the shipped cost nets and comm models: planning on a CPU plans for it


def shipped_models() -> dict[tuple[str, int], Path]:
    """(GPU, device count) → the shipped NCCL comm model file (data/comm/<gpu>_nccl_<D>gpu.json)."""
    out = {}
    for path in DATA_DIR.glob("*_nccl_*gpu.json"):
        gpu, _, count = path.stem.rpartition("_nccl_")
        if count[:-3].isdigit():
            out[(gpu, int(count[:-3]))] = path
    return out


def default_model_path(device_type: str, devices: int = 2, gpu: str | None = None) -> Path:
    """The shipped model for `devices` devices of this kind: data/comm/cpu_gloo.json on CPU; on
    CUDA the model of `gpu` (default: the GPU visible here, else DEFAULT_GPU) fitted on `devices`
    devices, else on the nearest count fitted (the larger on a tie: a model fitted on more devices
    has seen more contention), else the nearest count of another GPU. `describe_choice` says which."""
    if device_type == "cpu":
        path = DATA_DIR / "cpu_gloo.json"
        if path.is_file():
            return path
    else:
        models = shipped_models()
        if models:
            gpu = gpu or local_gpu() or DEFAULT_GPU
            pool = [k for k in models if k[0] == gpu] or list(models)
            key = min(pool, key=lambda k: (abs(k[1] - devices), -k[1], k[0] != DEFAULT_GPU, k[0]))
            return models[key]
    raise OptionError(
        f"no comm model shipped for {device_type} devices: run `dreamshard calibrate comm --out FILE` "
        f"on a machine with 2 or more of them and pass --comm-model FILE"
    )


def local_gpu() -> str | None:
    """This machine's GPU as the shipped models name it (h100, h200, ...), None without CUDA."""
    from dreamshard.costs.hardware import gpu_slug

    return gpu_slug()


def describe_choice(path: Path, devices: int, gpu: str | None = None) -> str:
    """What a report says of a shipped model used for `devices` devices of `gpu` where it was fitted
    on another device count or GPU ("" where it was fitted for them, or is not a shipped file)."""
    if Path(path).resolve().parent != DATA_DIR:
        return ""
    fitted_gpu, _, count = Path(path).stem.rpartition("_nccl_")
    notes = []
    if count.endswith("gpu") and count[:-3].isdigit() and int(count[:-3]) != devices:
        notes.append(f"fitted on {count[:-3]} devices, the nearest count shipped to {devices}")
    if gpu and fitted_gpu and fitted_gpu != gpu:
        notes.append(f"fitted on {fitted_gpu.upper()}, none shipped for {gpu.upper()}")
    return "; ".join(notes)


def load_comm_model(model: "CommModel | str | Path | None", device_type: str = "cpu", devices: int = 2, gpu: str | None = None) -> CommModel:
    """A CommModel from an instance, a file, or (None) the default shipped for `devices` devices
    of ``device_type`` (`default_model_path`)."""
    if isinstance(model, CommModel):
        return model
    return CommModel.load(model if model is not None else default_model_path(device_type, devices, gpu))


# --------------------------------------------------------------------------------------------
# Calibration: real all-to-alls
# --------------------------------------------------------------------------------------------


def design_patterns(devices: int, chunk_bytes: Sequence[int], elt: int = 2, seed: int = 0) -> list[tuple[str, list[int]]]:
    """(shape, per-rank chunk sizes) of the calibration runs: rank d sends chunks[d] elements to
    every rank, as in the runner's exchange, where rank d's chunk is B/D · (its all-to-all dim sum).

    For every size n, the shapes plans produce: ``balanced`` (every rank n), ``heavy`` (rank 0 sends
    SKEW × n), ``light`` (the last rank n / SKEW), ``ramp`` (n to SKEW·n over the ranks), ``idle``
    (the last rank sends nothing: all its tables are row-wise) and ``random`` (lognormal around n,
    from `seed`). With 2 devices ``light`` and ``ramp`` repeat ``heavy`` and are left out. A
    held-out set is the same design at other sizes and another seed.
    """
    rng = np.random.default_rng(seed)
    patterns = []
    for b in chunk_bytes:
        n = max(1, int(b) // elt)
        shapes = {"balanced": [n] * devices}
        if devices > 1:
            shapes["heavy"] = [n * SKEW] + [n] * (devices - 1)
            if devices > 2:
                shapes["light"] = [n] * (devices - 1) + [max(1, n // SKEW)]
                shapes["ramp"] = [max(1, round(n * (1 + (SKEW - 1) * d / (devices - 1)))) for d in range(devices)]
            shapes["idle"] = [n] * (devices - 1) + [0]
            shapes["random"] = [max(1, int(n * x)) for x in rng.lognormal(0.0, 0.8, devices)]
        patterns += [(shape, [_aligned(c, elt) for c in chunks]) for shape, chunks in shapes.items()]
    return patterns


ALIGN_BYTES = 512  # the runner's chunks are B/D · dim sum · elt bytes: multiples of this at any usual batch


def _aligned(elements: int, elt: int) -> int:
    """`elements` rounded to whole ALIGN_BYTES (at least one) where it is that large: NCCL moves an
    unaligned chunk markedly slower (4 × H100: up to 1.9× at 69 MB), and the runner never sends one."""
    per = ALIGN_BYTES // elt
    return elements if elements < per else max(per, round(elements / per) * per)


def alltoall_worker(job: dict, rank: int, world: int, device, clock, barrier) -> dict:
    """One rank's all-to-alls of every pattern of `job["patterns"]` (``measure_comm``)."""
    import torch
    import torch.distributed as dist

    dtype = torch.float16
    elt = 2
    points = []
    for shape, chunks in job["patterns"]:
        # forward: rank d sends chunks[d] elements to every rank; backward: the reverse
        for direction in ("fwd", "bwd"):
            if direction == "fwd":
                in_splits, out_splits = [chunks[rank]] * world, list(chunks)
            else:
                in_splits, out_splits = list(chunks), [chunks[rank]] * world
            send = torch.ones(sum(in_splits), dtype=dtype, device=device)
            recv = torch.empty(sum(out_splits), dtype=dtype, device=device)
            times = []
            for i in range(job["warmup"] + job["iters"]):
                barrier()
                a = clock.start_together()  # as the runner times its comm phases
                dist.all_to_all_single(recv, send, out_splits, in_splits)
                b = clock.mark()
                clock.sync()
                if i >= job["warmup"]:
                    times.append(clock.ms(a, b))
            own_in, own_out = in_splits[rank], out_splits[rank]
            points.append({
                "direction": direction,
                "pattern": shape,
                "chunks_bytes": [c * elt for c in chunks],
                "send_bytes": (sum(in_splits) - own_in) * elt,
                "recv_bytes": (sum(out_splits) - own_out) * elt,
                "ms": median(times),
                "rank": rank,
            })
            del send, recv
    return {"points": points}


def collectives_worker(job: dict, rank: int, world: int, device, clock, barrier) -> dict:
    """One rank's reduce-scatters and all-gathers (`job["ops"]`) of every buffer size, each timed as
    the runner times its comm phases (barrier, aligned start, medians) and checked once for the
    right result."""
    import torch

    dtype = torch.float16
    elt = 2
    ops = {"reduce_scatter": reduce_scatter_fn, "all_gather": all_gather_fn}
    points = []
    for size in job["sizes"]:
        n = max(world, size // elt // world * world)  # elements of the full buffer, a multiple of the ranks
        for op in job["ops"]:
            if op == "reduce_scatter":
                src, dst = torch.full((n,), float(rank + 1), dtype=dtype, device=device), torch.empty(n // world, dtype=dtype, device=device)
                want = torch.full((n // world,), world * (world + 1) / 2, device=device)
            else:
                src, dst = torch.full((n // world,), float(rank + 1), dtype=dtype, device=device), torch.empty(n, dtype=dtype, device=device)
                want = (torch.arange(world, device=device, dtype=torch.float32) + 1).repeat_interleave(n // world)
            times = []
            for i in range(job["warmup"] + job["iters"]):
                barrier()
                a = clock.start_together()
                ops[op](dst, src)
                b = clock.mark()
                clock.sync()
                if i >= job["warmup"]:
                    times.append(clock.ms(a, b))
            # the op did what it says (on the last run's output): a wrong emulation fails loudly
            if not torch.equal(dst.float(), want):
                raise RuntimeError(f"{op} of {n * elt} bytes on rank {rank} gave a wrong result")
            points.append({"op": op, "buffer_bytes": n * elt, "devices": world, "ms": median(times), "rank": rank})
            del src, dst
    return {"points": points}


def reduce_scatter_fn(output, input) -> None:
    """Sum-reduce-scatter of `input` (the full buffer) into `output` (this rank's 1/D):
    ``reduce_scatter_single`` (torch ≥ 2.13, where ``reduce_scatter_tensor`` is deprecated), else
    ``reduce_scatter_tensor``. Gloo runs it natively in torch 2.13 (checked by the tests)."""
    import torch.distributed as dist

    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, input)


def all_gather_fn(output, input) -> None:
    """All-gather of every rank's `input` (1/D of the buffer) into `output`, in rank order."""
    import torch.distributed as dist

    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, input)


def relayout_forward(out, a2a_cols: int, cols, rs_in):
    """The forward copies of a rank with row shards: its all-to-all columns of the TBE output
    `out` made contiguous (returned, flat), its row shards' columns copied into the reduce-scatter
    buffer `rs_in` at `cols` (one indexed copy, whatever the number of tables)."""
    rs_in.index_copy_(1, cols, out[:, a2a_cols:])
    return out[:, :a2a_cols].contiguous().view(-1)


def relayout_backward(grad_full, a2a_grad, ag_out, cols) -> None:
    """The backward copies of a rank with row shards: the all-to-all's gradient (`a2a_grad`,
    [B, a2a columns]) and its row shards' columns of the all-gather's output into the TBE's
    output gradient `grad_full`."""
    a = a2a_grad.shape[1]
    grad_full[:, :a] = a2a_grad
    grad_full[:, a:] = ag_out.index_select(1, cols)


def relayout_points(job: dict, rank: int, device, clock) -> list[dict]:
    """The runner's column copies (`relayout_forward` and `relayout_backward`) of a rank whose TBE
    output has `a` all-to-all columns and `r` row-shard columns (`job["widths"]`), over
    `job["rows"]` samples, each timed on its own (medians); a point per width, direction."""
    import torch

    dtype, elt, B = torch.float16, 2, job["rows"]
    points = []
    for a, r in job["widths"]:
        out = torch.rand(B, a + r, device=device).to(dtype)
        cols = torch.arange(r, device=device) * 2  # every other column of a buffer twice as wide, as tables without shards here leave gaps
        rs_in = torch.zeros(B, 2 * r, dtype=dtype, device=device)
        grad_full, a2a_grad, ag_out = torch.empty_like(out), torch.rand(B, a, device=device).to(dtype), torch.rand(B, 2 * r, device=device).to(dtype)
        for direction, op in (("fwd", lambda: relayout_forward(out, a, cols, rs_in)), ("bwd", lambda: relayout_backward(grad_full, a2a_grad, ag_out, cols))):
            times = []
            for i in range(job["warmup"] + job["iters"]):
                clock.sync()
                t0 = clock.start()
                op()
                t1 = clock.mark()
                clock.sync()
                if i >= job["warmup"]:
                    times.append(clock.ms(t0, t1))
            points.append({"op": RELAYOUT, "direction": direction, "a2a_cols": a, "row_cols": r, "rows": B, "bytes": 2 * B * (a + r) * elt,
                           "ms": median(times), "rank": rank})
        del out, rs_in, grad_full, a2a_grad, ag_out
    return points


def calibration_worker(job: dict, rank: int, world: int, device, clock, barrier) -> dict:
    """One rank of ``measure_comm``: for each set (fitted, held out) the all-to-all patterns, the
    reduce-scatters and all-gathers, and the column copies; every point tagged with its set."""
    points = []
    for name, part in job["sets"].items():
        common = {"iters": job["iters"], "warmup": job["warmup"]}
        a2a = alltoall_worker({**common, "patterns": part["patterns"]}, rank, world, device, clock, barrier)["points"]
        coll = collectives_worker({**common, "sizes": part["sizes"], "ops": list(COLLECTIVES)}, rank, world, device, clock, barrier)["points"]
        copies = relayout_points({**common, "widths": part["widths"], "rows": job["relayout_rows"]}, rank, device, clock)
        points += [{**p, "op": "all_to_all", "set": name} for p in a2a] + [{**p, "set": name} for p in coll + copies]
    return {"points": points}


def measure_comm(devices: int = 2, device_type: str = "cpu", iters: int = 10, warmup: int = 3, timeout_s: float = 300.0,
                 chunk_bytes: Sequence[int] | None = None, buffer_bytes: Sequence[int] | None = None) -> tuple[list[dict], dict]:
    """Every collective the runner issues, measured as it issues them, one process per device: the
    all-to-all over `design_patterns` of `chunk_bytes`, the reduce-scatter and all-gather of
    `buffer_bytes` buffers (the "fit" set), and the held-out set (HELD_OUT_CHUNKS/BUFFERS, another
    pattern seed). (points, info); a point per rank, pattern or size, direction and set."""
    # Not at the top: importing the runners package runs its __init__, whose sequential runner
    # imports this module (a cycle at import time only, through the package).
    from dreamshard.costs.runners.launch import launch

    if devices < 2:
        raise OptionError("calibrating the collectives needs --devices 2 or more")
    sets = {"fit": (list(chunk_bytes or DEFAULT_CHUNKS[device_type]), list(buffer_bytes or DEFAULT_BUFFERS[device_type]), RELAYOUT_WIDTHS, 0),
            "held_out": (HELD_OUT_CHUNKS[device_type], HELD_OUT_BUFFERS[device_type], HELD_OUT_WIDTHS, 1)}
    job = {"iters": iters, "warmup": warmup, "relayout_rows": RELAYOUT_ROWS[device_type],
           "sets": {name: {"patterns": design_patterns(devices, chunks, seed=seed), "sizes": sizes, "widths": widths}
                    for name, (chunks, sizes, widths, seed) in sets.items()}}
    results, info = launch(f"{__name__}:calibration_worker", job, devices, device_type, timeout_s)
    return [p for r in results for p in r["points"]], info


def calibrate(devices: int = 2, chunk_bytes: Sequence[int] | None = None, device_type: str = "cpu",
              iters: int = 10, warmup: int = 3, timeout_s: float = 300.0, buffer_bytes: Sequence[int] | None = None) -> CommModel:
    """Measure the runner's collectives here and fit the model (with hardware, date and versions)."""
    from dreamshard.costs.hardware import describe_hardware, software_versions

    points, info = measure_comm(devices, device_type, iters, warmup, timeout_s, chunk_bytes, buffer_bytes)
    return fit_comm(points, hardware=describe_hardware(device_type, devices), date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    versions=software_versions(), process_group=info["process_group"], devices=devices)


def fit_comm(points: Sequence[dict], **meta) -> CommModel:
    """A CommModel fitted to the "fit" points of ``measure_comm`` (all-to-all and both collectives),
    with its errors on the "held_out" points in ``fit_details["held_out"]``; every point kept in
    ``measurements``."""
    points = list(points)
    # chunks the runner never sends (not whole ALIGN_BYTES: measured by an older design) are kept, not fitted
    runner_like = [p for p in points if all(c % ALIGN_BYTES == 0 or c < ALIGN_BYTES for c in p.get("chunks_bytes", ()))]
    fit = [p for p in runner_like if p.get("set", "fit") == "fit"]
    held = [p for p in runner_like if p.get("set") == "held_out"]
    a2a = [p for p in fit if p.get("op", "all_to_all") == "all_to_all"]
    collectives = {kind: fit_collective([p for p in fit if p.get("op") == kind]) for kind in COLLECTIVES if any(p.get("op") == kind for p in fit)}
    copies = [p for p in fit if p.get("op") == RELAYOUT]
    if copies:
        collectives[RELAYOUT] = fit_relayout(copies) if all("a2a_cols" in p for p in copies) else fit_collective(copies)
    model = CommModel.fit(a2a, measurements=points, **collectives, **meta)
    if held:
        model.fit_details["held_out"] = model.errors(held)
    if len(runner_like) < len(points):
        model.fit_details["not_fitted"] = f"{len(points) - len(runner_like)} points of unaligned chunks (not whole {ALIGN_BYTES} bytes), which the runner never sends"
    return model


def parse_sizes(text: str) -> list[int]:
    """'256,4KB,1MB' → bytes (KB/MB/GB = powers of 1024 here: these are buffer sizes)."""
    units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
    out = []
    for part in str(text).split(","):
        part = part.strip().upper()
        num = part.rstrip("KMGIB")
        unit = part[len(num):]
        try:
            value = float(num) * units[unit]
        except (ValueError, KeyError):
            raise OptionError(f"--sizes: {part!r:.40}: use bytes with an optional unit, e.g. 256,4KB,1MB") from None
        if not 2 <= value <= MAX_CHUNK_BYTES:  # also rejects nan and inf
            raise OptionError(f"--sizes: {part!r:.40} must be from 2 bytes to {MAX_CHUNK_BYTES:,} bytes (the limit)")
        out.append(int(value))
    return out
