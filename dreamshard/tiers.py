"""Memory tiers: where a shard's rows live, what that costs in memory, the hit rate of an HBM row
cache predicted from the reuse bins, and the options the tier stage (tier_stage.py) chooses among
(docs/tiers.md).

Three tiers, TorchRec's compute kernels (FBGEMM's placements):
  - ``hbm`` (`fused`): the rows in the GPU's memory;
  - ``uvm`` (`fused_uvm`): the rows in the host's memory, mapped into the GPU's address space and
    read by the kernel over the host link (PCIe) at every lookup;
  - ``uvm_caching`` (`fused_uvm_caching`): the rows in host memory behind a row cache in HBM of
    ``cache_ratio`` × the shard's rows. Before each batch a prefetch maps the batch's rows to cache
    slots, loads the missing rows from host memory (writing back the least recently used rows it
    evicts) and the unchanged kernel reads and updates the cache.

Memory: an ``hbm`` shard holds its weights (and optimizer state) in HBM; a host-tier shard holds
them in host memory, and a ``uvm_caching`` one also holds, in HBM, its cache (cached rows × width)
and the cache's index (CACHE_INDEX_BYTES per row of the shard: the row → slot map).

The hit rate (`hit_rate`, derivation in docs/tiers.md): an LRU cache of C rows hits an access iff
fewer than C distinct rows were touched since the row's previous access (its reuse distance).
Under the independent reference model, with rows of per-batch rates λ, the rows touched in the
last T batches number D(T) = Σ (1 - e^{-λT}) (Che's approximation: the cache holds the rows of the
last T_C batches, D(T_C) = C). The reuse bins give the rates: bin i ≥ 1 holds rows read about
BIN_MEAN[i] times a batch (a fit of a Poisson mixture, `_groups`); the rows read less than about
twice a batch, which the bins do not resolve, continue the popularity curve as a power law over
their ranks (`_power_tail`). This module imports no planner, task or backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from dreamshard.bins import BIN_MEAN, REFERENCE_BATCH
from dreamshard.tables import PRECISION_BYTES, TableSpec
from dreamshard.validation import InputError, parse_choice, parse_float


TIERS = ("hbm", "uvm", "uvm_caching")
HOST_TIERS = ("uvm", "uvm_caching")
# TorchRec's EmbeddingComputeKernel of each tier (torchrec/distributed/embedding_types.py)
COMPUTE_KERNELS = {"hbm": "fused", "uvm": "fused_uvm", "uvm_caching": "fused_uvm_caching"}
TIER_OF_KERNEL = {k: t for t, k in COMPUTE_KERNELS.items()}
CACHE_INDEX_BYTES = 4  # HBM per row of a cached shard: its row → slot map (int32)
# cache ratios the tier stage tries: the share of a table's rows its cache holds
CACHE_RATIOS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75)
# the HBM share the tier stage fills before the planner places the shards (the rest is slack for
# packing whole tables into devices); each fill that leaves the planner no placement is retried lower
FILLS = (0.95, 0.9, 0.8, 0.65, 0.5)
# a cache must hold a batch's distinct rows (the prefetch loads all of them before the kernel runs),
# with this margin over the expected number
CACHE_MARGIN = 1.25
# the row cache's prefetch keeps its slots in LRU order, GPU work per slot every step: the tier stage
# counts it as the host-link bytes that take as long (costs/host.py HostLink's defaults, fitted on
# an H100: 0.11 ms per million slots, ~40 GB/s: 4 bytes a slot)
SLOT_LINK_BYTES = 4.0


@dataclass(frozen=True)
class Tier:
    """A table's (or shard's) tier; `cache_ratio`: cached rows / rows, in (0, 1], for uvm_caching."""

    kind: str = "hbm"
    cache_ratio: float = 0.0

    def check(self, where: str, error: type[InputError] = InputError) -> "Tier":
        parse_choice(self.kind, where, "key 'tier'", TIERS, error)
        if self.kind == "uvm_caching":
            parse_float(self.cache_ratio, where, "key 'cache_ratio'", 1e-9, 1.0, error, text=False)
            if self.cache_ratio <= 0:
                raise error(f"{where}, key 'cache_ratio': a uvm_caching shard needs a cache ratio in (0, 1]")
        elif self.cache_ratio:
            raise error(f"{where}, key 'cache_ratio': only a uvm_caching shard has a cache (tier {self.kind})")
        return self


HBM = Tier()


def cache_rows(rows: int, ratio: float) -> int:
    """Slots of a cache of `ratio` × `rows` rows: at least one, at most every row."""
    return min(int(rows), max(1, math.ceil(ratio * rows - 1e-9)))


def full_bytes(rows: int, width: int, precision: str, optimizer: str) -> int:
    """Weights (and row-wise Adagrad's fp32 per row) of `rows` × `width`: TableSpec.bytes's formula."""
    return rows * width * PRECISION_BYTES[precision] + (4 * rows if optimizer == "rowwise_adagrad" else 0)


def hbm_bytes(rows: int, width: int, kind: str, ratio: float, precision: str, optimizer: str) -> int:
    """HBM a shard of `rows` × `width` takes in tier `kind`: everything (hbm), nothing (uvm), its
    cache and the cache's index (uvm_caching; the optimizer state stays in host memory)."""
    if kind == "hbm":
        return full_bytes(rows, width, precision, optimizer)
    if kind == "uvm":
        return 0
    return cache_rows(rows, ratio) * width * PRECISION_BYTES[precision] + CACHE_INDEX_BYTES * rows


def host_bytes(rows: int, width: int, kind: str, precision: str, optimizer: str) -> int:
    """Host memory a shard takes: all of its bytes in a host tier, none in HBM."""
    return 0 if kind == "hbm" else full_bytes(rows, width, precision, optimizer)


# --------------------------------------------------------------------------------------------
# The hit rate of an LRU row cache, from the reuse bins
# --------------------------------------------------------------------------------------------


_GRID = np.exp(np.linspace(np.log(1e-5), np.log(1.6 * 2.0**15), 96))  # candidate rates per reference batch


@lru_cache(maxsize=1)
def _grid_bins() -> tuple[np.ndarray, np.ndarray]:
    """[17, grid] each: P(a row of rate λ_j has its reference-batch count in bin i), and its
    expected count there (E[C; C in bin i])."""
    from dreamshard.bins import _poisson_bins

    p, lookups = _poisson_bins(_GRID)
    return p.T, lookups.T


@lru_cache(maxsize=65536)
def _groups(rows: int, pooling_factor: float, bins: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(rates λ per REFERENCE_BATCH, rows with that rate) of a table, from its reuse bins.

    U distinct rows are read in a reference batch of L = B·pooling lookups; bin i holds n_i = U·b_i
    of them, each read about BIN_MEAN[i] times, so L = U Σ b_i BIN_MEAN[i] gives U. A row of rate λ
    has a Poisson(λ) count, so the bins are a Poisson mixture of the rows' rates: the rates are
    recovered by non-negative least squares over a grid of rates (rows w_j at λ_j) with
        Σ_j w_j P(count in bin i | λ_j) = n_i,   Σ_j w_j = rows,   Σ_j w_j λ_j = L
    (each equation relative to its size). Taking each row's count as its rate instead would keep
    the counts' Poisson noise as spread in the rates, which overstates the hit rate (a near-uniform
    table by ~10 points)."""
    from scipy.optimize import nnls

    L = REFERENCE_BATCH * float(pooling_factor)
    b = np.asarray(bins, np.float64)
    per_row = float(b @ BIN_MEAN)
    if L <= 0 or per_row <= 0:
        return np.zeros(0), np.zeros(0)
    U = L / per_row  # a first estimate: BIN_MEAN is a bin's mean count only roughly
    P, K = _grid_bins()
    A = np.vstack([P, np.ones(len(_GRID)), _GRID])
    for _ in range(4):  # refit with each bin's mean count under the previous fit (a few rounds settle)
        y = np.concatenate([U * b, [float(rows), L]])
        scale = 1.0 / np.concatenate([U * (b + 1e-2), [float(rows) / 10, L / 10]])  # the totals are exact: held tighter
        w, _ = nnls(A * scale[:, None], y * scale)
        mean = np.where(P @ w > 0, (K @ w) / np.maximum(P @ w, 1e-300), BIN_MEAN)
        U = L / max(float(b @ mean), 1e-12)
    keep = w > 1e-9 * max(rows, 1)
    return _power_tail(_GRID[keep], w[keep], float(rows), L)


TAIL_RATE = 2.0  # rows below this many reads a reference batch: their rates are not resolved by the bins
TAIL_GROUPS = 64


def _power_tail(lam: np.ndarray, w: np.ndarray, rows: float, L: float) -> tuple[np.ndarray, np.ndarray]:
    """The fit's rows of rate < TAIL_RATE replaced by a power law over their ranks.

    A batch's bins tell a row read 0, 1 or 2 times from one read 1/100th as often only through
    their totals: the fit meets those (the tail's rows, lookups and distinct rows) with a few
    rates, most often one group of rows read about once a batch and the rest at ~0, which
    overstates how often a row is read again a few batches later (hit rates of caches that hold
    many batches' rows by up to 30 points on zipf tables). The tail is taken instead as the rest
    of the popularity curve: rates λ(j) = c·(1 + j/s)^-a over its ranks j (s: the rows above it),
    c and a meeting the tail's lookups and distinct rows as the fit has them. Tables of power-law
    popularity (the synthetic zipf streams) are then predicted within ~2 points of an LRU replay;
    a tail flatter than a power law can spread (a uniform table: a = 0, every rate the same)."""
    res = lam >= TAIL_RATE
    K0, L0 = float(w[res].sum()), float(w[res] @ lam[res])
    Nt, Lt = rows - K0, L - L0
    Ut = float(w[~res] @ -np.expm1(-lam[~res]))
    if Nt < 2 or Lt <= 0 or Ut <= 0:
        return lam, w
    edges = np.unique(np.concatenate([[0.0], np.geomspace(1.0, Nt, TAIL_GROUPS)]))
    lo_j, hi_j = edges[:-1], edges[1:]
    count = hi_j - lo_j
    s = K0 + 1.0

    def rates(a: float) -> np.ndarray:  # each group's mean of (1 + j/s)^-a, scaled to the tail's lookups
        if abs(a - 1) < 1e-9:
            shape = np.log((s + hi_j) / (s + lo_j))
        else:
            shape = ((1 + hi_j / s) ** (1 - a) - (1 + lo_j / s) ** (1 - a)) / (1 - a)
        shape = shape / count
        return shape * (Lt / float(count @ shape))

    def distinct(a: float) -> float:  # falls as a rises: the lookups crowd into fewer rows
        return float(count @ -np.expm1(-rates(a)))

    a = 0.0
    if distinct(0.0) > Ut:
        lo, hi = 0.0, 6.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if distinct(mid) > Ut else (lo, mid)
        a = (lo + hi) / 2
    return np.concatenate([lam[res], rates(a)]), np.concatenate([w[res], count])


def rate_groups(table: TableSpec) -> tuple[np.ndarray, np.ndarray]:
    return _groups(int(table.rows), float(table.pooling_factor), tuple(float(x) for x in table.bins))


def expected_unique(table: TableSpec, batch_size: int = REFERENCE_BATCH) -> float:
    """Expected distinct rows a batch of `batch_size` samples reads (what a cache must hold)."""
    lam, n = rate_groups(table)
    return float(n @ -np.expm1(-lam * batch_size / REFERENCE_BATCH))


def hit_rate(table: TableSpec, rows_cached: int, batch_size: int = REFERENCE_BATCH, batches: int | None = None, warmup: int = 0) -> float:
    """Predicted share of the lookups of a batch that an LRU cache of `rows_cached` rows, filled
    batch by batch (the prefetch), serves: every repeat inside the batch hits (the row was loaded
    for its first lookup), and a batch's first lookup of a row hits iff the row was read in the last
    T batches, where the rows read in T batches fill the cache (Che's approximation; docs/tiers.md):

        D(T) = Σ_g n_g (1 - e^{-λ_g T}) = C,   hits = (L - U) + Σ_g n_g (1 - e^{-λ_g}) (1 - e^{-λ_g T})

    with λ_g the groups' per-batch rates at this batch size, L = Σ n_g λ_g lookups and
    U = Σ n_g (1 - e^{-λ_g}) distinct rows a batch. A cache smaller than a batch's distinct rows
    (C < U) holds part of the last batch's rows, T < 1: its overflow is read into staging rows once
    a batch (kernels/tiered.py), so a batch's repeats still hit. That is the steady state;
    with `batches`, the mean over batches `warmup`..`batches`-1 of a cache that started empty
    (batch t can only hit rows read in its t batches before: T becomes min(T, t)), what a short
    measurement sees."""
    lam, n = rate_groups(table)
    if not len(lam):
        return 1.0
    lam = lam * (batch_size / REFERENCE_BATCH)
    L = float(n @ lam)
    first = -np.expm1(-lam)
    U = float(n @ first)
    C = float(rows_cached)
    T = math.inf if C >= n.sum() - 0.5 or C >= table.rows else _che_time(lam, n, C, U)  # inf: every row fits, never misses after its first touch
    ts = [T] if batches is None else [min(T, float(t)) for t in range(warmup, batches)]
    if L <= 0 or not ts:
        return 1.0
    rates = [((L - U) + float(n @ (first * -np.expm1(-lam * min(t, 1e300))))) / L for t in ts]
    return min(1.0, max(0.0, sum(rates) / len(rates)))


def _che_time(lam: np.ndarray, n: np.ndarray, C: float, U: float) -> float:
    """T with D(T) = Σ_g n_g (1 - e^{-λ_g T}) = C rows (in batches; U = D(1))."""
    lo, hi = (1e-12, 1.0) if C < U else (1.0, 2.0)
    while float(n @ -np.expm1(-lam * hi)) < C and hi < 1e15:
        lo, hi = hi, hi * 2
    for _ in range(60):  # bisection on log T: D(T) increases in T
        mid = math.sqrt(lo * hi)
        if float(n @ -np.expm1(-lam * mid)) < C:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def repeat_misses(table: TableSpec, batch_size: int, window_rows: float) -> float:
    """Expected lookups of a batch, beyond each row's first, whose row is not among the last
    `window_rows` distinct rows read: an LRU window over one batch's stream, Che's approximation as
    in `hit_rate` (the window holds the rows read in the last T of the batch, D(T) = window_rows).
    A row of rate λ is read as a Poisson process over the batch [0, 1]; a lookup at t misses if the
    row's previous lookup is more than T before it and within the batch:
    ∫_T^1 λ (e^{-λT} - e^{-λt}) dt = λ(1 - T) e^{-λT} - (e^{-λT} - e^{-λ}) per row.
    What a `uvm` forward reads over the host link again (costs/host.py)."""
    return _repeat_misses(int(table.rows), float(table.pooling_factor), tuple(float(x) for x in table.bins), int(batch_size), float(window_rows))


@lru_cache(maxsize=65536)
def _repeat_misses(rows: int, pooling_factor: float, bins: tuple[float, ...], batch_size: int, window_rows: float) -> float:
    lam, n = _groups(rows, pooling_factor, bins)
    if not len(lam):
        return 0.0
    lam = lam * (batch_size / REFERENCE_BATCH)
    first = -np.expm1(-lam)
    U = float(n @ first)
    if window_rows <= 0:
        return float(n @ (lam - first))
    if window_rows >= U:
        return 0.0
    T = _che_time(lam, n, window_rows, U)
    kept = np.exp(-lam * T)
    return float(n @ (lam * (1 - T) * kept - (kept - np.exp(-lam))))


def min_cache_rows(table: TableSpec, batch_size: int) -> int:
    """The fewest cache rows the tier stage gives a table: a batch's expected distinct rows, with margin."""
    return min(int(table.rows), math.ceil(CACHE_MARGIN * expected_unique(table, batch_size)) + 1)


def simulate_lru(batches: Sequence[np.ndarray], rows_cached: int, rows: int, warmup: int = 1) -> float:
    """The measured hit rate of the batch-prefetch LRU cache (the one the kernels implement,
    costs/kernels/tiered.py) on actual index batches of one table: the share of the lookups of the
    batches after `warmup` whose row was in the cache or already loaded for the same batch. The
    reference `hit_rate` is tested against (tests/test_tiers.py)."""
    C = int(rows_cached)
    slot_row = np.full(C, -1, np.int64)
    slot_time = np.full(C, -1, np.int64)
    where: dict[int, int] | np.ndarray = np.full(rows, -1, np.int64) if rows <= 50_000_000 else {}
    hits = lookups = 0
    for t, batch in enumerate(batches):
        batch = np.asarray(batch, np.int64)
        u = np.unique(batch)
        if len(u) > C:
            raise ValueError(f"a batch reads {len(u):,} distinct rows, more than the cache's {C:,}")
        slots = where[u] if isinstance(where, np.ndarray) else np.array([where.get(int(r), -1) for r in u], np.int64)
        hit = slots >= 0
        slot_time[slots[hit]] = t
        miss = u[~hit]
        if len(miss):
            victims = np.argpartition(slot_time, len(miss) - 1)[: len(miss)] if len(miss) < C else np.arange(C)
            old = slot_row[victims]
            if isinstance(where, np.ndarray):
                where[old[old >= 0]] = -1
                where[miss] = victims
            else:
                for r in old[old >= 0]:
                    where.pop(int(r), None)
                where.update(zip(miss.tolist(), victims.tolist()))
            slot_row[victims], slot_time[victims] = miss, t
        if t >= warmup:
            hits += len(batch) - len(miss)
            lookups += len(batch)
    return hits / lookups if lookups else 1.0


# --------------------------------------------------------------------------------------------
# The tier stage: which tables leave HBM, and how much cache each keeps
# --------------------------------------------------------------------------------------------


def link_bytes(table: TableSpec, kind: str, ratio: float, batch_size: int, elt: int) -> float:
    """Bytes a step moves over the host link for a table in a tier (the tier stage's measure; the
    simulator prices them, costs/sim.py): uvm reads a row per lookup and reads and writes each
    distinct row in the backward; uvm_caching loads each missed row and writes back the row it
    evicts, and its prefetch's work per slot counts as SLOT_LINK_BYTES a slot (so a cache grows
    only while its hits pay for its slots); hbm nothing."""
    if kind == "hbm":
        return 0.0
    row = table.dim * elt
    lookups = batch_size * table.pooling_factor
    if kind == "uvm":
        return lookups * row + 2 * expected_unique(table, batch_size) * row
    slots = cache_rows(table.rows, ratio)
    return 2 * lookups * (1 - hit_rate(table, slots, batch_size)) * row + SLOT_LINK_BYTES * slots


def _options(table: TableSpec, cap: int, batch_size: int, precision: str, optimizer: str) -> list[tuple[int, float, Tier]]:
    """(HBM bytes, host-link bytes a step, tier) of the table's choices that fit a device, on their
    lower convex hull (what a greedy by link bytes saved per HBM byte can take in order)."""
    elt = PRECISION_BYTES[precision]
    out = [(0, link_bytes(table, "uvm", 0.0, batch_size, elt), Tier("uvm"))]
    need = min_cache_rows(table, batch_size)
    for r in CACHE_RATIOS:
        if cache_rows(table.rows, r) < need:
            continue
        hb = hbm_bytes(table.rows, table.dim, "uvm_caching", r, precision, optimizer)
        if hb <= cap:
            out.append((hb, link_bytes(table, "uvm_caching", r, batch_size, elt), Tier("uvm_caching", r)))
    full = full_bytes(table.rows, table.dim, precision, optimizer)
    if full <= cap:
        out.append((full, 0.0, HBM))
    out.sort(key=lambda o: (o[0], o[1]))
    hull: list[tuple[int, float, Tier]] = []
    for o in out:  # keep the points that lower the link bytes at a falling rate per HBM byte
        if hull and o[1] >= hull[-1][1]:
            continue
        while len(hull) >= 2:
            (x0, y0, _), (x1, y1, _) = hull[-2], hull[-1]
            if (y0 - y1) * (o[0] - x1) <= (y1 - o[1]) * (x1 - x0):  # the middle point saves less per byte than the next step
                hull.pop()
            else:
                break
        hull.append(o)
    return hull


def tier_of(tiers: "dict[str, Tier] | None", name: str) -> Tier:
    """Table `name`'s tier in a task's `tiers` (None: every table in HBM)."""
    return (tiers or {}).get(name, HBM)
