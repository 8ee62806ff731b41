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


def alltoall_bytes_array(dim_sums: np.ndarray, batch_size: int, elt: int) -> tuple[np.ndarray, np.ndarray]:
    """(send, recv) bytes of the forward all-to-all for dim sums of shape [..., D] (batched).

    Own slices are excluded, so one device moves nothing. The simulator costs thousands of
    placements at once through this; ``alltoall_bytes`` is the one-placement view of it.
    """
    dim_sums = np.asarray(dim_sums, dtype=np.float64)
    D = dim_sums.shape[-1]
    send = batch_size * dim_sums * elt * (D - 1) / D
    recv = (batch_size / D) * (dim_sums.sum(axis=-1, keepdims=True) - dim_sums) * elt
    return send, recv


def alltoall_bytes(dim_sums: Sequence[int], batch_size: int, elt: int) -> tuple[list[float], list[float]]:
    """(send[D], recv[D]) bytes of the *forward* all-to-all of pooled outputs; backward = reversed.

    ``dim_sums[d]`` is the sum of the dims of the tables on device d, ``elt`` the bytes per
    element of the outputs (2 for fp16). Own slices are excluded.
    """
    if len(dim_sums) == 0:
        return [], []
    send, recv = alltoall_bytes_array(np.array(dim_sums), batch_size, elt)
    return send.tolist(), recv.tolist()


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

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"comm model latency must be finite and >= 0 ms, got {self.latency_ms}")
        if not (math.isfinite(self.bandwidth_GBps) and self.bandwidth_GBps > 0):
            raise ValueError(f"comm model bandwidth must be finite and > 0 GB/s, got {self.bandwidth_GBps}")
        if not 0.0 <= self.serial_fraction <= 1.0:
            raise ValueError(f"comm model serial_fraction must be in [0, 1], got {self.serial_fraction}")

    # ------------------------------------------------------------------ predict
    def predict(self, send_bytes, recv_bytes):
        """Milliseconds for one device's all-to-all; numbers or equal-length sequences."""
        if isinstance(send_bytes, (int, float)) and isinstance(recv_bytes, (int, float)):
            hi, lo = max(send_bytes, recv_bytes), min(send_bytes, recv_bytes)
            return self.latency_ms + (hi + self.serial_fraction * lo) / (self.bandwidth_GBps * 1e6)
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
        known = {k: d[k] for k in ("latency_ms", "bandwidth_GBps", "serial_fraction", "hardware", "date", "versions", "process_group", "devices", "fit_details", "measurements") if k in d}
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
