"""The price of memory tiers (tiers.py): host-link bytes and the HBM row cache's work, added to a
shard's compute by the simulator (costs/sim.py `SimBackend.evaluate_plan`; docs/tiers.md).

Per step, for a shard of L lookups, U distinct rows (expected, from its reuse bins) and rows of
r bytes (r rounded up to the link's sector):
  - ``uvm``: the forward reads a row over the host link per lookup (L·r); the backward reads and
    writes back each distinct row (2·U·r) — the kernel's gathers and updates go to host memory;
  - ``uvm_caching``: the prefetch before the forward loads the rows the cache misses and writes
    back the rows it evicts (2·L·(1 - h)·r, h the hit rate predicted from the bins,
    tiers.hit_rate: every missed row is loaded, and once the cache is full every load evicts a
    row the backward updated), plus its own work (a fixed part and a part per lookup: unique,
    map look-up, victim selection); the kernel then reads and updates the cache in HBM;
  - row-wise Adagrad's state stays in host memory in both: 2·U·4 bytes in the backward.
The link's time is bytes / bandwidth, added to the compute (no overlap is modelled: the prefetch
and the kernel run one after the other on one stream, as the runners time them).

`HostLink`'s defaults: `link_GBps` is PCIe Gen5 x16's 64 GB/s per direction — NVIDIA's H100 SXM
and H200 SXM datasheets give "PCIe Gen5: 128 GB/s" (both directions together) — a peak that
real reads of scattered rows do not reach; `benchmarks/gpu_tiers.py` measures the link and the
cache's costs on a GPU, and a calibration's `host` entry replaces the defaults with measured values.
The cache's two work terms are estimates until then (docs/tiers.md says so).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from dreamshard.tiers import expected_unique, hit_rate
from dreamshard.validation import DataError, parse_float


@dataclass(frozen=True)
class HostLink:
    """How host-tier shards are priced (see the module doc)."""

    link_GBps: float = 64.0  # host link, per direction: PCIe Gen5 x16 peak (H100/H200 SXM datasheets: 128 GB/s both ways)
    sector_bytes: float = 32.0  # a row read over the link moves whole 32-byte sectors (as the simulator's gathers)
    cache_fixed_ms: float = 0.05  # the cache prefetch's fixed cost per cached shard (estimate, not yet measured)
    cache_ms_per_mlookup: float = 0.3  # its cost per million lookups: unique, slot look-up, victims (estimate, not yet measured)
    source: str = "defaults: PCIe Gen5 x16 peak per direction; cache work estimated, not measured"

    @staticmethod
    def from_json(d: dict | None, where: str = "calibration") -> "HostLink":
        """From a calibration's `host` entry (missing keys keep their defaults)."""
        if not d:
            return HostLink()
        known = {f.name for f in fields(HostLink)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"{where}, host: unknown key {unknown[0]!r}; keys: {', '.join(sorted(known))}")
        values = {k: parse_float(v, where, f"host.{k}", 0.0, error=DataError, text=False) for k, v in d.items() if k != "source"}
        if "link_GBps" in values and values["link_GBps"] <= 0:
            raise DataError(f"{where}, host.link_GBps: must be > 0")
        return HostLink(**values, **({"source": str(d["source"])} if "source" in d else {}))

    def to_json(self) -> dict:
        return asdict(self)


def tier_ms(plan, batch_size: int | None = None, link: HostLink = HostLink(), precision: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(forward ms [D], backward ms [D], details) that the plan's host-tier shards add to their
    devices' compute: see the module doc. details: per device the bytes over the link, and per
    cached shard its predicted hit rate."""
    D = plan.devices
    w = plan.workload.with_overrides(batch_size, precision)
    B, elt = w.batch_size, w.elt_bytes
    fwd, bwd = np.zeros(D), np.zeros(D)
    link_bytes = np.zeros(D)
    cached = []
    per_ms = 1.0 / (link.link_GBps * 1e6)  # bytes → ms
    specs = plan.shard_specs()
    for s, spec in zip(plan.shards, specs):
        if s.tier == "hbm":
            continue
        row = spec.dim * elt
        sector_row = math.ceil(row / link.sector_bytes) * link.sector_bytes
        lookups = B * spec.pooling_factor
        unique = expected_unique(spec, B)
        state = 2 * unique * 4 if w.optimizer == "rowwise_adagrad" else 0.0
        if s.tier == "uvm":
            f, b = lookups * sector_row, 2 * unique * sector_row + state
            fwd[s.device] += f * per_ms
            bwd[s.device] += b * per_ms
        else:
            rows = s.cache_rows(plan.task.tables[s.table])
            h = hit_rate(spec, rows, B)
            f, b = 2 * lookups * (1 - h) * sector_row, state
            fwd[s.device] += link.cache_fixed_ms + lookups / 1e6 * link.cache_ms_per_mlookup + f * per_ms
            bwd[s.device] += b * per_ms
            cached.append({"table": spec.name, "device": s.device, "cache_rows": rows, "predicted_hit_rate": round(h, 4)})
        link_bytes[s.device] += f + b
    details = {"host_link": link.to_json(), "host_link_bytes": [int(x) for x in link_bytes], "cached_shards": cached}
    return fwd, bwd, details
