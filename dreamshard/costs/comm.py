"""The all-to-all model: per-device latency of the embedding all-to-alls (DESIGN.md §1, §4).

Byte counts. In the forward all-to-all of a table-wise placement on D devices, device d holds the
pooled outputs of its tables for the whole batch, ``[B, dimsum_d]``, and keeps the ``B/D``
samples of its own slice. It sends ``B/D · dimsum_d · elt`` bytes to each of the other D−1
devices and receives ``B/D · dimsum_j · elt`` from each other device j:

    send_d = B · dimsum_d · elt · (D−1)/D          recv_d = (B/D) · Σ_{j≠d} dimsum_j · elt

The backward all-to-all of the output gradients is the same exchange reversed (send ↔ recv).
Its own slice is a local copy and is not counted.

Time. Per device,

    t_d = latency + (max(send_d, recv_d) + serial_fraction · min(send_d, recv_d)) / bandwidth

``serial_fraction`` ∈ [0, 1] says how much the two directions get in each other's way. On a
full-duplex link (NVLink) a device's sends and receives overlap and the larger direction bounds
the time (0); where one resource moves both (loopback TCP copied by the same few CPU cores) they
add up (1). It is fitted, not assumed: the calibration includes skewed exchanges (send ≠ recv,
same max) next to balanced ones, which is what tells the two apart. Measured here (2-core CPU,
gloo): 1.0 — balanced 4 MB exchanges take about twice as long as skewed 4 MB + 1 MB ones.

Calibration (``calibrate``) runs real all-to-alls of the same shape the distributed runner
does (``torch.distributed.all_to_all_single`` with uneven splits, one process per device: gloo on
CPU, NCCL on CUDA) over a designed set of per-rank byte counts, and ``fit`` minimises the
*relative* squared error (times span four decades; an absolute fit would ignore the small ones).

Row-wise tables (plan.py, rowshard.py) are exchanged by collectives instead: the forward sums the
devices' partial pooled outputs by a **reduce-scatter** over all D devices of one [B, Σ dim]
buffer (every device then holds its B/D samples, as after the all-to-all; a device without a shard
of some row-wise table puts zeros in its columns), the backward spreads the output gradients back
by an **all-gather**. A ring moves (D−1)/D of the buffer into and out of every device for either:

    t = latency + ring_bytes / bandwidth,        ring_bytes = N · (D−1)/D,  N = B · Σ dim · elt

with (latency, bandwidth) per collective fitted to real ones (``measure_collectives``,
``benchmarks/gpu_collectives.py``) and kept in the comm model (``CommModel.reduce_scatter`` /
``all_gather``, or the simulator calibration's ``comm`` entry, under the same keys). Until a model
has them, they are derived from its all-to-all fit (``collective_ms``): a ring collective moves,
per device, what a balanced all-to-all of the same buffer moves ((D−1)/D of it sent and as much
received), so it is priced as that all-to-all — latency + (1 + serial_fraction) · ring_bytes /
bandwidth; the sum's adds are not priced. That rule is not fitted (docs/rowwise.md).
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
DEFAULT_CHUNKS = {
    "cpu": [256, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20],
    "cuda": [1 << 10, 16 << 10, 256 << 10, 4 << 20, 32 << 20, 128 << 20, 256 << 20],
}
SKEW = 4  # skewed exchange: rank 0's chunks are SKEW × the others'
COLLECTIVES = ("reduce_scatter", "all_gather")


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


def alltoall_ms(comm: dict, send, recv):
    """One device's all-to-all ms from a comm model's parameters (``CommModel.params()`` or a
    calibration's ``comm``): latency + (max + serial_fraction·min)(send, recv) / bandwidth, 0 where
    nothing moves. Numbers or arrays. The one formula: `CommModel.predict`, the simulator and
    the learned cost net's `CommFormula` all price the all-to-all through it."""
    send, recv = np.asarray(send, dtype=np.float64), np.asarray(recv, dtype=np.float64)
    hi, lo = np.maximum(send, recv), np.minimum(send, recv)
    t = comm["latency_ms"] + (hi + comm.get("serial_fraction", 0.0) * lo) / (comm["bandwidth_GBps"] * 1e6)
    out = np.where(hi > 0, t, 0.0)
    return float(out) if out.ndim == 0 else out


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
        t = fit["latency_ms"] + moved / (fit["bandwidth_GBps"] * 1e6)
    else:
        t = comm["latency_ms"] + (1.0 + comm.get("serial_fraction", 0.0)) * moved / (comm["bandwidth_GBps"] * 1e6)
    out = np.where(moved > 0, t, 0.0)
    return float(out) if out.ndim == 0 else out


def rowwise_ms(comm: dict, rowwise_dim: int, batch_size: int, elt: int, devices: int) -> tuple[float, float]:
    """(forward reduce-scatter ms, backward all-gather ms) of the row-wise tables' exchange: one
    [B, rowwise_dim] buffer over all devices; every device takes the same time."""
    n = batch_size * rowwise_dim * elt
    return collective_ms(comm, "reduce_scatter", n, devices), collective_ms(comm, "all_gather", n, devices)


def comm_params_problem(params, serial_required: bool = False) -> str | None:
    """What is wrong with a collective model's parameters ({latency_ms, bandwidth_GBps,
    serial_fraction (0 where absent, unless `serial_required`)}), or None. The one check of them: the
    comm model, a calibration's copy and a trained model's each raise it as their own error."""
    if not isinstance(params, dict):
        return "expected an object with latency_ms and bandwidth_GBps"
    for key, ok, want in (("latency_ms", lambda v: v >= 0, "a finite number >= 0"),
                          ("bandwidth_GBps", lambda v: v > 0, "a finite number > 0"),
                          ("serial_fraction", lambda v: 0 <= v <= 1, "a number in [0, 1]")):
        v = params.get(key, 0.0 if key == "serial_fraction" and not serial_required else None)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v)):
            return f"{key} must be {want}, got {v!r:.40}"
    return None


def check_collective_fit(fit, what: str) -> None:
    problem = None if fit is None else comm_params_problem(fit)
    if problem:
        raise ValueError(f"{what}: {problem}")


def fit_collective(points: Iterable[dict], **meta) -> dict:
    """(latency, bandwidth) of one collective from points {"buffer_bytes", "devices", "ms"}: the
    least-squares fit of relative error of t = latency + ring_bytes / bandwidth."""
    pts = list(points)
    if len(pts) < 2:
        raise ValueError(f"fitting a collective needs at least 2 measurements, got {len(pts)}")
    x = np.array([float(ring_bytes(p["buffer_bytes"], p["devices"])) for p in pts])
    t = np.array([float(p["ms"]) for p in pts])
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("collective measurements must have finite times > 0 ms")
    a, b = _fit_line(x, t)
    if b <= 0:
        raise ValueError("cannot fit a bandwidth: the time does not grow with the bytes; measure larger sizes")
    rel = np.abs((a + b * x - t) / t)
    return {"latency_ms": a, "bandwidth_GBps": 1e-6 / b, "points": len(pts), "median_rel_error": float(np.median(rel)),
            "max_rel_error": float(rel.max()), **meta}


@dataclass
class CommModel:
    """t_d = latency_ms + (max(send, recv) + serial_fraction·min(send, recv)) / bandwidth."""

    latency_ms: float
    bandwidth_GBps: float  # 1 GB = 1e9 bytes
    serial_fraction: float = 0.0  # 0: directions overlap (full duplex); 1: they add up
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

    def __post_init__(self) -> None:
        problem = comm_params_problem({"latency_ms": self.latency_ms, "bandwidth_GBps": self.bandwidth_GBps, "serial_fraction": self.serial_fraction})
        if problem:
            raise ValueError(f"comm model: {problem}")
        for kind in COLLECTIVES:
            check_collective_fit(getattr(self, kind), f"comm model {kind}")

    def params(self) -> dict:
        """The parameters `collective_ms` reads (as a simulator calibration's ``comm`` holds them)."""
        return {"latency_ms": self.latency_ms, "bandwidth_GBps": self.bandwidth_GBps, "serial_fraction": self.serial_fraction,
                "reduce_scatter": self.reduce_scatter, "all_gather": self.all_gather}

    def rowwise_ms(self, rowwise_dim: int, batch_size: int, elt: int, devices: int) -> tuple[float, float]:
        """(reduce-scatter ms, all-gather ms) of the row-wise tables' exchange (module docstring)."""
        return rowwise_ms(self.params(), rowwise_dim, batch_size, elt, devices)

    # ------------------------------------------------------------------ predict
    def predict(self, send_bytes, recv_bytes):
        """Milliseconds for one device's all-to-all; numbers or equal-length sequences."""
        if isinstance(send_bytes, (int, float)) and isinstance(recv_bytes, (int, float)):
            return alltoall_ms(self.params(), send_bytes, recv_bytes)
        return [self.predict(float(s), float(r)) for s, r in zip(send_bytes, recv_bytes, strict=True)]

    def placement_ms(self, dim_sums: Sequence[int], batch_size: int, elt: int) -> tuple[list[float], list[float]]:
        """(forward ms[D], backward ms[D]) of a placement's two all-to-alls; zeros for D = 1."""
        if len(dim_sums) <= 1:
            return [0.0] * len(dim_sums), [0.0] * len(dim_sums)
        send, recv = alltoall_bytes(dim_sums, batch_size, elt)
        return self.predict(send, recv), self.predict(recv, send)

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit(cls, points: Iterable, **meta) -> "CommModel":
        """Fit latency, bandwidth and serial_fraction to points ``(send_bytes, recv_bytes, ms)``
        (tuples or dicts).

        Minimises Σ ((pred − t)/t)²: a weighted linear least-squares fit of (latency, 1/bandwidth)
        for each serial_fraction on a grid of 0, 0.05, …, 1, keeping the best; latency is clamped
        at 0. ``meta`` goes to the constructor (hardware, date, versions, process_group, devices).
        """
        points = list(points)
        pts = [_point(m) for m in points]
        if len(pts) < 2:
            raise ValueError(f"fitting a comm model needs at least 2 measurements, got {len(pts)}")
        s, r, t = (np.array(c, dtype=np.float64) for c in zip(*pts))
        if np.any(t <= 0) or not np.all(np.isfinite(t)):
            raise ValueError("comm measurements must have finite times > 0 ms")
        hi, lo = np.maximum(s, r), np.minimum(s, r)
        fits = {}
        for gamma in np.linspace(0.0, 1.0, 21):
            a, b = _fit_line(hi + gamma * lo, t)
            err = (a + b * (hi + gamma * lo) - t) / t
            fits[float(gamma)] = (float((err * err).sum()), a, b, np.abs(err))
        gamma = min(fits, key=lambda g: fits[g][0])
        _, latency, slope, rel = fits[gamma]
        if slope <= 0:
            raise ValueError("cannot fit a bandwidth: the all-to-all time does not grow with the bytes sent; measure larger sizes")
        model = cls(latency_ms=float(latency), bandwidth_GBps=float(1e-6 / slope), serial_fraction=round(gamma, 2), **meta)

        def summary(g: float) -> dict:
            _, a, b, e = fits[g]
            return {"latency_ms": a, "bandwidth_GBps": 1e-6 / b if b > 0 else None, "median_rel_error": float(np.median(e)), "max_rel_error": float(e.max())}

        model.fit_details = {
            "points": len(pts),
            "objective": "least squares of relative error",
            "median_rel_error": float(np.median(rel)),
            "max_rel_error": float(rel.max()),
            "alternatives": {"max(send, recv) [serial_fraction 0]": summary(0.0), "send + recv [serial_fraction 1]": summary(1.0)},
        }
        if not model.measurements:
            model.measurements = [m if isinstance(m, dict) else {"send_bytes": a, "recv_bytes": b, "ms": c} for m, (a, b, c) in zip(points, pts)]
        return model

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("path")
        for kind in COLLECTIVES:  # absent, not null: files of models without them stay as they were
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
        known = {k: d[k] for k in ("latency_ms", "bandwidth_GBps", "serial_fraction", "hardware", "date", "versions", "process_group", "devices", "fit_details", "measurements", *COLLECTIVES) if k in d}
        try:
            return cls(**known, path=str(path))
        except (TypeError, ValueError) as e:
            raise DataError(f"{path}: {one_line(e)}") from None

    def describe(self) -> str:
        bytes_ = "max(send, recv)" if self.serial_fraction == 0 else ("send + recv" if self.serial_fraction == 1 else f"(max + {self.serial_fraction:g}·min)(send, recv)")
        return f"{self.latency_ms * 1e3:.1f} µs + {bytes_} / {self.bandwidth_GBps:.2f} GB/s ({self.process_group}, {self.hardware}, {self.date})"


def _point(m) -> tuple[float, float, float]:
    if isinstance(m, dict):
        return float(m["send_bytes"]), float(m["recv_bytes"]), float(m["ms"])
    s, r, t = m
    return float(s), float(r), float(t)


def _fit_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, b) minimising Σ ((a + b·x − t)/t)², with a >= 0."""
    A = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if a < 0:
        u = x / t
        a, b = 0.0, float(u.sum() / max((u * u).sum(), 1e-300))
    return float(a), float(b)


def default_model_path(device_type: str) -> Path:
    """The shipped model for this kind of device: data/comm/cpu_gloo.json, or a *nccl*.json."""
    if device_type == "cpu":
        path = DATA_DIR / "cpu_gloo.json"
        if path.is_file():
            return path
    else:
        found = sorted(DATA_DIR.glob("*nccl*.json"))
        if found:
            return found[0]
    raise OptionError(
        f"no comm model shipped for {device_type} devices: run `dreamshard calibrate comm --out FILE` "
        f"on a machine with 2 or more of them and pass --comm-model FILE"
    )


def load_comm_model(model: "CommModel | str | Path | None", device_type: str = "cpu") -> CommModel:
    """A CommModel from an instance, a file, or (None) the default shipped for ``device_type``."""
    if isinstance(model, CommModel):
        return model
    return CommModel.load(model if model is not None else default_model_path(device_type))


# --------------------------------------------------------------------------------------------
# Calibration: real all-to-alls
# --------------------------------------------------------------------------------------------


def design_patterns(devices: int, chunk_bytes: Sequence[int], elt: int = 2) -> list[list[int]]:
    """Per-rank chunk sizes (elements each rank sends to every rank) of the calibration runs.

    For every size: a balanced exchange (every rank sends the same) and a skewed one (rank 0
    sends SKEW × what the others send), so that send ≠ recv appears in the data.
    """
    patterns = []
    for b in chunk_bytes:
        n = max(1, int(b) // elt)
        patterns.append([n] * devices)
        if devices > 1:
            patterns.append([n] + [max(1, n // SKEW)] * (devices - 1))
    return patterns


def alltoall_worker(job: dict, rank: int, world: int, device, clock, barrier) -> dict:
    """One rank of the calibration (the launcher's worker, see ``measure_alltoall``)."""
    import torch
    import torch.distributed as dist

    dtype = torch.float16
    elt = 2
    points = []
    for chunks in job["patterns"]:
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
                a = clock.mark()
                dist.all_to_all_single(recv, send, out_splits, in_splits)
                b = clock.mark()
                clock.sync()
                if i >= job["warmup"]:
                    times.append(clock.ms(a, b))
            own_in, own_out = in_splits[rank], out_splits[rank]
            points.append({
                "direction": direction,
                "pattern": "balanced" if len(set(chunks)) == 1 else "skewed",
                "send_bytes": (sum(in_splits) - own_in) * elt,
                "recv_bytes": (sum(out_splits) - own_out) * elt,
                "ms": median(times),
                "rank": rank,
            })
            del send, recv
    return {"points": points}


def measure_alltoall(devices: int = 2, chunk_bytes: Sequence[int] | None = None, device_type: str = "cpu",
                     iters: int = 10, warmup: int = 3, timeout_s: float = 300.0) -> tuple[list[dict], dict]:
    """Real all-to-alls, one process per device; returns (points, info) — one point per rank,
    pattern and direction, its median time over ``iters``."""
    # Not at the top: importing the runners package runs its __init__, whose sequential runner
    # imports this module (a cycle at import time only, through the package).
    from dreamshard.costs.runners.launch import launch

    if devices < 2:
        raise OptionError("calibrating the all-to-all needs --devices 2 or more")
    chunks = list(chunk_bytes) if chunk_bytes else DEFAULT_CHUNKS[device_type]
    job = {"patterns": design_patterns(devices, chunks), "iters": iters, "warmup": warmup}
    results, info = launch(f"{__name__}:alltoall_worker", job, devices, device_type, timeout_s)
    return [p for r in results for p in r["points"]], info


def collectives_worker(job: dict, rank: int, world: int, device, clock, barrier) -> dict:
    """One rank of ``measure_collectives``: for every buffer size, a balanced all_to_all_single,
    a reduce-scatter and an all-gather, each timed as the all-to-all calibration times it
    (barrier, marks around the op, medians), and each checked once for the right result."""
    import torch

    dtype = torch.float16
    elt = 2
    ops = {"all_to_all": all_to_all_fn, "reduce_scatter": reduce_scatter_fn, "all_gather": all_gather_fn}
    points = []
    for size in job["sizes"]:
        n = max(world, size // elt // world * world)  # elements of the full buffer, a multiple of the ranks
        for op in job["ops"]:
            full = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
            part = torch.full((n // world,), float(rank + 1), dtype=dtype, device=device)
            if op == "all_to_all":
                src, dst, expect = full, torch.empty(n, dtype=dtype, device=device), None
            elif op == "reduce_scatter":
                src, dst, expect = full, torch.empty(n // world, dtype=dtype, device=device), world * (world + 1) / 2
            else:
                src, dst, expect = part, torch.empty(n, dtype=dtype, device=device), None
            times = []
            for i in range(job["warmup"] + job["iters"]):
                barrier()
                a = clock.mark()
                ops[op](dst, src)
                b = clock.mark()
                clock.sync()
                if i >= job["warmup"]:
                    times.append(clock.ms(a, b))
            # the op did what it says (on the last run's output): a wrong emulation fails loudly
            want = (torch.arange(world, device=device, dtype=torch.float32) + 1).repeat_interleave(n // world) if expect is None else torch.full_like(dst, expect, dtype=torch.float32)
            if not torch.equal(dst.float(), want):
                raise RuntimeError(f"{op} of {n * elt} bytes on rank {rank} gave a wrong result")
            points.append({"op": op, "buffer_bytes": n * elt, "devices": world, "ms": median(times), "rank": rank})
            del src, dst, full, part
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


def all_to_all_fn(output, input) -> None:
    """Balanced all-to-all of a buffer (1/D of it to every rank)."""
    import torch.distributed as dist

    dist.all_to_all_single(output, input)


def measure_collectives(devices: int, sizes: Sequence[int], device_type: str = "cpu", iters: int = 10, warmup: int = 3,
                        ops: Sequence[str] = ("all_to_all", *COLLECTIVES), timeout_s: float = 300.0) -> tuple[list[dict], dict]:
    """Real all-to-alls, reduce-scatters and all-gathers of full buffers of `sizes` bytes (fp16),
    one process per device; (points, info), a point per rank, op and size (median ms)."""
    from dreamshard.costs.runners.launch import launch  # see measure_alltoall

    if devices < 2:
        raise OptionError("measuring collectives needs 2 or more devices")
    job = {"sizes": [int(s) for s in sizes], "ops": list(ops), "iters": iters, "warmup": warmup}
    results, info = launch(f"{__name__}:collectives_worker", job, devices, device_type, timeout_s)
    return [p for r in results for p in r["points"]], info


def calibrate(devices: int = 2, chunk_bytes: Sequence[int] | None = None, device_type: str = "cpu",
              iters: int = 10, warmup: int = 3, timeout_s: float = 300.0) -> CommModel:
    """Measure real all-to-alls here and fit the model (with hardware, date and versions)."""
    from dreamshard.costs.hardware import describe_hardware, software_versions

    points, info = measure_alltoall(devices, chunk_bytes, device_type, iters, warmup, timeout_s)
    return CommModel.fit(
        points,
        hardware=describe_hardware(device_type, devices),
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        versions=software_versions(),
        process_group=info["process_group"],
        devices=devices,
    )


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
