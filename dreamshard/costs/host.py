"""The price of memory tiers (tiers.py): host-link bytes and the HBM row cache's work, added to a
shard's compute by the simulator (costs/sim.py `SimBackend.evaluate_plan`; docs/tiers.md).

Per step, for a shard of L lookups, U distinct rows (expected, from its reuse bins), C cache slots
and rows of r bytes (r rounded up to the link's 32-byte sector), the link moving rows of that size
at `row_GBps(r)` (GPU gathers and scatters of random rows of host-mapped memory, measured by
benchmarks/gpu_tiers.py per row size):
  - ``uvm``: the forward reads each distinct row over the host link, and its repeated lookups
    again unless the row was read within the last `uvm_window_bytes` of distinct rows (the GPU's
    caches: tiers.repeat_misses, M of them), at a weight `uvm_repeat_share`: (U + s·M)·r at the
    kernel's share `uvm_efficiency` of the gather rate; the backward reads
    and writes back each distinct row (2·U·r, in row order, at `uvm_backward_scale` of two random
    gathers' time) — the kernel's gathers and updates go to host memory;
  - ``uvm_caching``: the prefetch before the forward (kernels/tiered.py `RowCache.prefetch`) costs
    its GPU work — `prefetch_fixed_ms` (its ~30 small launches), `prefetch_ms_per_mlookup` per
    million lookups (sorting them, the map look-up, the slot rewrite), `prefetch_ms_per_mslot`
    per million slots (keeping the slots in LRU order: a few elementwise passes over them) and
    `prefetch_ms_per_mmiss` per million missed lookups (L·(1 − h): giving them slots, the map's
    updates for the rows loaded and evicted; 0 unless fitted) — and the rows
    it moves: it loads the rows the cache misses and writes back the rows it evicts
    (2·L·(1 - h)·r, h the hit rate predicted from the bins, tiers.hit_rate: every missed row is
    loaded, and once the cache is full every load evicts a row the backward updated); the kernel
    then reads and updates the cache in HBM;
  - row-wise Adagrad's state stays in host memory in both: 2·U·4 bytes in the backward (a cached
    shard's moves it with its rows: 2·L·(1 - h) sectors more).
Address translation: the GPU reaches host memory through its own page tables, and a table larger
than what its TLB covers (`tlb_reach_bytes`, ~0.9 GB on an H100) misses there: rows gathered in
random order (the uvm forward) cost `tlb_miss_ns` more on the share of them that miss (random
32-byte rows: 20 GB/s from a 256 MB table, 3.4 from 1 GB, 1.2 from 16 GB); rows in row order (the
prefetch's loads and write-backs, the uvm backward) miss once a page at most (`tlb_misses`).
The link's time is bytes / rate plus the misses, added to the compute (no overlap is modelled: the
prefetch and the kernel run one after the other on one stream, as the runners time them).

`HostLink`'s defaults are the committed H100 run's (benchmarks/results/gpu_tiers/: NVIDIA H100 80GB
HBM3, PCIe Gen5): the row rates measured there (reads of a 256 MB table; writes within 10% of
them), the address-translation terms and the prefetch's work terms fitted there (benchmarks/
gpu_tiers.py writes a calibration `host` entry with every field: docs/tiers.md). The prefetch's
fixed part is its CUDA graph's launch and its kernels' gaps (0.32 ms: one launch, so it depends little on
the host).
`link_GBps` is the single-number link (PCIe Gen5 x16's 64 GB/s per direction) for a calibration
that gives no row rates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from dreamshard.tiers import expected_unique, hit_rate, repeat_misses
from dreamshard.validation import DataError, parse_float


# GPU gathers of random rows from host-mapped memory (a 256 MB table), GB/s by row bytes: the committed
# run of benchmarks/gpu_tiers.py (benchmarks/results/gpu_tiers/host_link.json: NVIDIA H100 80GB HBM3, PCIe Gen5)
H100_ROW_GBPS = ((32, 21.7), (64, 41.7), (128, 49.9), (256, 50.2), (512, 48.6))


_RENAMED = {"cache_fixed_ms": "prefetch_fixed_ms", "cache_ms_per_mlookup": "prefetch_ms_per_mlookup"}  # the first host entries' names


@dataclass(frozen=True)
class HostLink:
    """How host-tier shards are priced (see the module doc); a calibration's `host` entry sets any
    field, benchmarks/gpu_tiers.py fits them all."""

    link_GBps: float = 64.0  # host link, per direction: PCIe Gen5 x16 peak; used only where row_GBps is empty
    sector_bytes: float = 32.0  # a row read over the link moves whole 32-byte sectors (as the simulator's gathers)
    row_GBps: tuple[tuple[float, float], ...] = H100_ROW_GBPS  # (row bytes, GB/s) of random-row gathers: H100 measured
    # the prefetch's work, the uvm kernel's rate and the address translation, fitted there too
    uvm_efficiency: float = 0.875  # the uvm kernel's share of the gather rate
    uvm_repeat_share: float = 0.694  # the weight of a uvm forward's repeated lookups that miss the window, against a first read
    uvm_window_bytes: float = 106464.0  # the distinct rows' bytes within which a uvm forward's repeated lookup is served on the GPU
    uvm_backward_scale: float = 0.573  # the uvm backward's row time over two random gathers of its rows
    prefetch_fixed_ms: float = 0.325  # the prefetch's fixed cost per cached shard (its CUDA graph's launch and its kernels' gaps)
    prefetch_ms_per_mlookup: float = 0.347  # per million lookups: their sort, the map look-up, the rewrite
    prefetch_ms_per_mslot: float = 0.109  # per million cache slots: their LRU order, a few elementwise passes
    prefetch_ms_per_mmiss: float = 0.0  # per million missed lookups: their slots, the map's updates (fitted 0: hit rates 6-36% measured)
    # the GPU's address translation of host memory (see tlb_misses): what its TLB covers, the cost of a
    # miss beyond the rows' own bytes, and the page a sorted stream of rows misses once at most
    tlb_reach_bytes: float = 0.88e9
    tlb_miss_ns: float = 26.2
    tlb_page_bytes: float = 512.0 * 1024
    source: str = "defaults: fitted by benchmarks/gpu_tiers.py on NVIDIA H100 80GB HBM3 (benchmarks/results/gpu_tiers)"

    def rate_GBps(self, row_bytes: float) -> float:
        """GB/s of a random-row gather or scatter of rows of `row_bytes` (sector-rounded): the row
        table interpolated in log2(row bytes), its end values beyond it; link_GBps without a table."""
        if not self.row_GBps:
            return self.link_GBps
        pts = sorted(self.row_GBps)
        xs = np.log2([max(float(b), 1.0) for b, _ in pts])
        return float(np.interp(math.log2(max(row_bytes, 1.0)), xs, [float(g) for _, g in pts]))

    def tlb_misses(self, rows: float, table_bytes: float, in_order: bool) -> float:
        """Address-translation misses of `rows` row accesses to a table of `table_bytes` in host memory:
        a table larger than the TLB's reach R misses on a share 1 - R/T of its pages' accesses; rows
        read in random order miss that share of the accesses, rows read in row order (the sorted
        streams: the prefetch's loads and write-backs, the uvm backward) that share of the pages they
        touch, N (1 - e^(-rows/N)) of the table's N pages."""
        if self.tlb_miss_ns <= 0 or table_bytes <= self.tlb_reach_bytes or rows <= 0:
            return 0.0
        if in_order:
            pages = table_bytes / self.tlb_page_bytes
            rows = pages * -math.expm1(-rows / pages)
        return rows * (1.0 - self.tlb_reach_bytes / table_bytes)

    def tlb_ms(self, rows: float, table_bytes: float, in_order: bool) -> float:
        return self.tlb_misses(rows, table_bytes, in_order) * self.tlb_miss_ns / 1e6

    def prefetch_ms(self, lookups: float, slots: float, misses: float = 0.0) -> float:
        """The prefetch's GPU work for a cached shard (rows moved not included)."""
        return (self.prefetch_fixed_ms + lookups / 1e6 * self.prefetch_ms_per_mlookup + slots / 1e6 * self.prefetch_ms_per_mslot
                + misses / 1e6 * self.prefetch_ms_per_mmiss)

    def cached_ms(self, lookups: float, slots: float, hit: float, row_bytes: float, rows: float, adagrad: bool = False) -> tuple[float, float]:
        """(ms, bytes over the link) of a cached shard's prefetch: its work, the rows it loads and the
        rows it writes back (each missed lookup: one of each once the cache is full; both streams in
        row order), row-wise Adagrad's state with them."""
        sector_row = math.ceil(row_bytes / self.sector_bytes) * self.sector_bytes
        misses = lookups * (1 - hit)
        link_bytes = 2 * misses * (sector_row + (4 if adagrad else 0))
        ms = (self.prefetch_ms(lookups, slots, misses) + 2 * misses * sector_row / (self.rate_GBps(sector_row) * 1e6)
              + 2 * self.tlb_ms(misses, rows * row_bytes, True))
        if adagrad:
            ms += 2 * misses * self.sector_bytes / (self.rate_GBps(self.sector_bytes) * 1e6) + 2 * self.tlb_ms(misses, rows * 4.0, True)
        return ms, link_bytes

    @staticmethod
    def from_json(d: dict | None, where: str = "calibration") -> "HostLink":
        """From a calibration's `host` entry (missing keys keep their defaults). `row_GBps`: an
        object of row bytes → GB/s (or a list of pairs)."""
        if not d:
            return HostLink()
        d = {_RENAMED.get(k, k): v for k, v in d.items()}
        known = {f.name for f in fields(HostLink)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"{where}, host: unknown key {unknown[0]!r}; keys: {', '.join(sorted(known))}")
        values: dict = {k: parse_float(v, where, f"host.{k}", 0.0, error=DataError, text=False) for k, v in d.items() if k not in ("source", "row_GBps")}
        if "link_GBps" in values and values["link_GBps"] <= 0:
            raise DataError(f"{where}, host.link_GBps: must be > 0")
        if "row_GBps" in d:
            rows = d["row_GBps"]
            pairs = list(rows.items()) if isinstance(rows, dict) else rows
            if not isinstance(pairs, list) or any(not isinstance(p, (list, tuple)) or len(p) != 2 for p in pairs):
                raise DataError(f"{where}, host.row_GBps: an object of row bytes → GB/s")
            out = []
            for b, g in pairs:
                try:
                    b = float(b)
                except (TypeError, ValueError):
                    raise DataError(f"{where}, host.row_GBps: row bytes {b!r} is not a number") from None
                g = parse_float(g, where, f"host.row_GBps[{b:g}]", 0.0, error=DataError, text=False)
                if b <= 0 or g <= 0:
                    raise DataError(f"{where}, host.row_GBps: row bytes and GB/s must be > 0")
                out.append((b, g))
            values["row_GBps"] = tuple(sorted(out))
        return HostLink(**values, **({"source": str(d["source"])} if "source" in d else {}))

    def to_json(self) -> dict:
        d = asdict(self)
        d["row_GBps"] = {f"{b:g}": g for b, g in self.row_GBps}
        return d


def shard_ms(link: HostLink, spec, kind: str, slots: int, batch_size: int, elt: int, adagrad: bool) -> tuple[float, float, float, float | None]:
    """(forward ms, backward ms, bytes over the link, predicted hit rate or None) that a shard of
    `spec` in host tier `kind` adds to its device's step (a cached one with `slots` cache rows): see
    the module doc (`tier_ms` sums it over a plan's shards)."""

    row = spec.dim * elt
    lookups = batch_size * spec.pooling_factor
    if kind == "uvm_caching":
        h = hit_rate(spec, slots, batch_size)
        ms, moved = link.cached_ms(lookups, slots, h, row, spec.rows, adagrad)
        return ms, 0.0, moved, h
    sector_row = math.ceil(row / link.sector_bytes) * link.sector_bytes
    per_ms = 1.0 / (link.rate_GBps(sector_row) * 1e6)  # bytes of rows this wide → ms
    unique = expected_unique(spec, batch_size)
    table = spec.rows * row  # host bytes of the shard's rows
    # the forward gathers rows in lookup order; the backward reads and writes its distinct rows in row order
    reads = unique + link.uvm_repeat_share * repeat_misses(spec, batch_size, link.uvm_window_bytes / sector_row)
    fwd = reads * sector_row * per_ms / max(link.uvm_efficiency, 1e-6) + link.tlb_ms(reads, table, False)
    bwd = 2 * unique * sector_row * per_ms * link.uvm_backward_scale + 2 * link.tlb_ms(unique, table, True)
    moved = reads * sector_row + 2 * unique * sector_row
    if adagrad:  # the state's 4 bytes a row: a sector each
        bwd += 2 * unique * link.sector_bytes / (link.rate_GBps(link.sector_bytes) * 1e6) + 2 * link.tlb_ms(unique, spec.rows * 4.0, True)
        moved += 2 * unique * 4
    return fwd, bwd, moved, None


def tier_ms(plan, batch_size: int | None = None, link: HostLink = HostLink(), precision: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(forward ms [D], backward ms [D], details) that the plan's host-tier shards add to their
    devices' compute (`shard_ms`). details: per device the bytes over the link, and per cached shard
    its predicted hit rate."""
    D = plan.devices
    w = plan.workload.with_overrides(batch_size, precision)
    fwd, bwd = np.zeros(D), np.zeros(D)
    link_bytes = np.zeros(D)
    cached = []
    for s, spec in zip(plan.shards, plan.shard_specs()):
        if s.tier == "hbm":
            continue
        slots = s.cache_rows(plan.task.tables[s.table]) if s.tier == "uvm_caching" else 0
        f, b, moved, h = shard_ms(link, spec, s.tier, slots, w.batch_size, w.elt_bytes, w.optimizer == "rowwise_adagrad")
        fwd[s.device] += f
        bwd[s.device] += b
        link_bytes[s.device] += moved
        if h is not None:
            cached.append({"table": spec.name, "device": s.device, "cache_rows": slots, "predicted_hit_rate": round(h, 4)})
    details = {"host_link": link.to_json(), "host_link_bytes": [int(x) for x in link_bytes], "cached_shards": cached}
    return fwd, bwd, details
