"""Memory tiers on one GPU (issue 38; docs/tiers.md): kernel correctness per tier, the host link's
bandwidth, speed per tier, the row cache's hit rate measured against the one predicted from the
reuse bins, and mixed-tier plans measured by the sequential runner beside the simulator's price.

    PYTHONPATH=. python3 benchmarks/gpu_tiers.py --out $OUT --budget-s 450           # one H100/H200, ~7 min
    PYTHONPATH=. python3 benchmarks/gpu_tiers.py --out /tmp/t --device cpu --quick   # logic check on a CPU
    PYTHONPATH=. python3 benchmarks/gpu_tiers.py --out $OUT --skip 1,4,6             # the mixed plans and the probe alone

Parts, in order, each written to $OUT as soon as it ends (summary.json rewritten, report.md at the end):
  1. correctness: the tiered TBE (kernels/tiered.py) over the Triton kernel — an HBM table, a uvm
     table and a cached table in one shard, both precisions and optimizers — against the float64
     reference of tests/test_kernels.py, outputs poisoned (tests/test_tiers.py `check_tiered`);
  2. host link: pinned host → HBM copies (cudaMemcpy), and the kernels' own access pattern — random
     rows of 32 to 512 bytes gathered from (and scattered to) host memory mapped into the GPU, from
     tables of 256 MB to 16 GB — in GB/s;
  3. speed per tier: one table (2M rows × 64, 4 lookups a sample, zipf 1.0; B = 65,536) in HBM, in
     uvm, and cached at four cache ratios, and in HBM and cached at two ratios at B/4: forward and
     backward ms measured (sequential runner's protocol) beside the simulator's price; from these
     and part 2 the calibration's `host` entry is fitted (`fit_host`: the row rates, the uvm
     kernel's share of them, the prefetch's fixed, per-lookup and per-slot terms) and written to
     $OUT/host_link.json (a calibration file's `host` entry, as is); the table is priced again with it;
  4. hit rates: the cache's measured hit rate over 30 batches (after 10 to warm it) against
     tiers.hit_rate's prediction for the same cache, on the tables of a `dlrm` pool with lookups;
  5. mixed-tier plans: tasks of pool tables at 1.5–3× the devices' HBM, planned with the tier stage
     (size_lookup and dreamshard), measured by the sequential runner (Triton, comm modelled) and priced by the
     simulator with HostLink's defaults and with the host entry fitted in part 3; each plan again
     with every shard in HBM (measured and priced), so that the report splits the error into the
     compute of the placement and the tiers' own cost, device by device, beside each cache's
     predicted and measured hit rate.
  6. the full pools (the issue's target): each family's pool of `--pools` (default: the 856-table
     `dlrm` pool) on 8 devices of 24 GB with host memory, planned by `--pool-planners` (default
     size_lookup, `dreamshard plan`'s default, and dreamshard), measured device by device beside
     the simulator's price;
  7. the tiered forward taken apart on the mixed plans' devices with caches: each prefetch and the
     kernel's forward timed on the GPU, the host's issue time beside, each prefetch's price.
`--budget-s` (default 270) stops parts 4 to 7 early; a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dreamshard.costs.host import HostLink  # noqa: E402
from dreamshard.costs.sim import Calibration, SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.tables import TableSpec  # noqa: E402
from dreamshard.tiers import Tier, cache_rows, expected_unique, hit_rate, repeat_misses  # noqa: E402


class Run:
    def __init__(self, out: Path, budget_s: float, resume: bool = False):
        """`resume`: OUT/summary.json's run, its elapsed time kept (--refit)."""
        self.out, self.t0, self.budget, self.resumed = out, time.monotonic(), budget_s, resume
        self.summary: dict = json.loads((out / "summary.json").read_text()) if resume else {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def save(self, key: str, value) -> None:
        self.summary[key] = value
        if not self.resumed:
            self.summary["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        atomic_write(self.out / "summary.json", json.dumps(self.summary, indent=1, default=str))
        print(f"[{self.summary['elapsed_s']:6.1f} s] {key}: {json.dumps(value, default=str)[:300]}", flush=True)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, reps: int = 5) -> float:
    """Median ms of `fn()` over `reps` runs (after one untimed)."""
    fn()
    sync(device)
    out = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append((time.perf_counter() - t) * 1000)
    return float(np.median(out))


# ---------------------------------------------------------------------------------------------- 1


def correctness(kernel: str, device: str) -> list[dict]:
    from test_tiers import check_tiered

    rows = []
    for precision in ("fp16", "fp32"):
        for optimizer in ("sgd", "rowwise_adagrad"):
            try:
                tbe = check_tiered(kernel, precision, optimizer, seed=41 + len(precision) + len(optimizer), device=device, steps=3)
                rows.append({"precision": precision, "optimizer": optimizer, "ok": True, "tiers": [t.kind for t in tbe.tiers],
                             "evictions": sum(c.evictions for c in tbe.caches.values())})
            except Exception as e:  # noqa: BLE001 - recorded, the campaign goes on
                rows.append({"precision": precision, "optimizer": optimizer, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    return rows


# ---------------------------------------------------------------------------------------------- 2


TABLE_SIZES = (1 << 28, 1 << 30, 1 << 32, 1 << 34)  # 256 MB to 16 GB: the pools' tables reach ~10 GB
SPARSE_ROWS, SPARSE_ROW_BYTES = 16_384, 128  # the sparse sorted gathers: a row per 16 KB to 1 MB of table


def host_link(device: str, quick: bool) -> dict:
    from dreamshard.costs.kernels.host_memory import host_mapped

    out: dict = {}
    n = (64 << 20) if not quick else (1 << 20)  # bytes moved per test
    if torch.device(device).type == "cuda":
        src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(n, dtype=torch.uint8, device=device)
        ms = timed(lambda: dst.copy_(src, non_blocking=True), device)
        out["memcpy_h2d_GBps"] = n / ms / 1e6
        ms = timed(lambda: src.copy_(dst, non_blocking=True), device)
        out["memcpy_d2h_GBps"] = n / ms / 1e6
    # the same gathers from tables of several sizes: a row read from a larger table is more often on a
    # page the GPU's address translation does not hold (one pinned buffer of the largest size, its
    # first bytes taken as the smaller tables)
    sizes = TABLE_SIZES if not quick else (1 << 22, 1 << 24)
    whole = host_mapped(sizes[-1] // 2, torch.float16, device)
    whole.fill_(1.0)
    gather, sparse, sparse_write = {}, {}, {}
    for size in sizes:
        gather[size] = {}
        for row_bytes in (32, 64, 128, 256, 512):
            dim, rows_total = row_bytes // 2, size // row_bytes
            table = whole[:rows_total * dim].view(rows_total, dim)
            k = max(1, n // row_bytes)
            idx = torch.randint(0, rows_total, (k,), device=device)
            buf = torch.empty(k, dim, dtype=torch.float16, device=device)
            ordered = idx.sort().values  # the prefetch's streams: rows in row order
            ms_read = timed(lambda: torch.index_select(table, 0, idx, out=buf), device)
            ms_write = timed(lambda: table.index_copy_(0, idx, buf), device)
            ms_sorted = timed(lambda: torch.index_select(table, 0, ordered, out=buf), device)
            gather[size][row_bytes] = {"rows": k, "read_GBps": k * row_bytes / ms_read / 1e6, "write_GBps": k * row_bytes / ms_write / 1e6,
                                       "sorted_read_GBps": k * row_bytes / ms_sorted / 1e6}
        # a sparse sorted stream (a prefetch's loads and write-backs: a few rows of a large table,
        # in row order) touches a page per row: what the page of the GPU's translation is
        k = SPARSE_ROWS if not quick else 256  # (as stored below)
        dim, rows_total = SPARSE_ROW_BYTES // 2, size // SPARSE_ROW_BYTES
        table = whole[:rows_total * dim].view(rows_total, dim)
        idx = torch.randint(0, rows_total, (k,), device=device).sort().values
        buf = torch.empty(k, dim, dtype=torch.float16, device=device)
        sparse[size] = timed(lambda: torch.index_select(table, 0, idx, out=buf), device) * 1e6 / k
        # and written (a prefetch's write-backs): not fitted yet, reported beside the reads
        sparse_write[size] = timed(lambda: table.index_copy_(0, idx, buf), device) * 1e6 / k
    del whole
    out["random_rows"] = gather
    out["sparse_sorted_ns"], out["sparse_sorted_write_ns"], out["sparse_sorted_rows"] = sparse, sparse_write, SPARSE_ROWS if not quick else 256
    return out


# ---------------------------------------------------------------------------------------------- 3


def one_table_plan(tier: Tier, table: TableSpec, batch: int, devices: int = 1):
    from dreamshard.plan import Plan, Shard
    from dreamshard.tasks import Task, Workload

    task = Task([table], devices, 10**15, Workload(batch_size=batch), host_memory_bytes=10**15)
    return Plan(task, [Shard(0, 0, 0, table.dim, tier=tier.kind, cache_ratio=tier.cache_ratio)], "gpu_tiers")


# part 3's tables by name: their index streams (the uvm forward's fit wants several shares of repeated lookups)
SPEED_TABLES = {"one": "zipf:1.0", "cold": "uniform", "warm": "zipf:0.6", "steep": "zipf:1.3"}


# and a grid for the uvm fit over pooling, skew and rows: name "p<pooling>a<zipf α>r<rows>"
UVM_GRID = [f"p{p:g}a{a:g}r{r}" for p in (1, 16, 64) for a in (0.6, 1.0, 1.3) for r in (4_000_000,)] + [f"p{p:g}a1r500000" for p in (16, 64)]


def speed_table(quick: bool, name: str = "one") -> TableSpec:
    from dreamshard.bins import reuse_bins

    if name in SPEED_TABLES:
        rows, dim, pf, dist = (2_000_000, 64, 4.0, SPEED_TABLES[name]) if not quick else (50_000, 32, 2.0, SPEED_TABLES[name])
    else:
        pf, alpha, rows = (float(x) for x in re.fullmatch(r"p([\d.]+)a([\d.]+)r(\d+)", name).groups())
        rows, dim, dist = (int(rows), 64, f"zipf:{alpha:g}") if not quick else (int(rows) // 100, 32, f"zipf:{alpha:g}")
    return TableSpec(name, rows, dim, pf, tuple(reuse_bins(rows, pf, dist)), distribution=dist, seed=1)


def speed(kernel: str, device: str, quick: bool, sim: SimBackend) -> list[dict]:
    """One table in each tier at B (and, for the fit of the prefetch's terms, in HBM and cached at
    two ratios at B/4: another number of lookups); and a cold table (uniform lookups) in HBM and
    cached at the smallest caches that hold a batch, at B and B/4: hit rates of ~10–35%, where
    most lookups miss (the fit's per-miss term). Every table also in `uvm` (at B and B/4), and two
    more skews and a grid over pooling, skew and rows (UVM_GRID) in HBM and `uvm`: the uvm fit over
    shares of repeated lookups."""
    from dreamshard.costs.runners import SequentialRunner

    big = 65_536 if not quick else 512
    runner = SequentialRunner(kernel, device=device, warmup=3 if quick else 10, iters=3 if quick else 20, input_sets=3)
    out = []
    cases = [(speed_table(quick), big, (0.05, 0.1, 0.25, 0.5), True), (speed_table(quick), big // 4, (0.1, 0.5), True),
             (speed_table(quick, "cold"), big, (0.0, 2.0), True), (speed_table(quick, "cold"), big // 4, (0.0,), True),
             (speed_table(quick, "warm"), big, (), True), (speed_table(quick, "steep"), big, (), True)]
    cases += [(speed_table(quick, name), big, (), True) for name in UVM_GRID]
    for table, batch, ratios, with_uvm in cases:
        rows, dim, pf = table.rows, table.dim, table.pooling_factor
        need = expected_unique(table, batch) * 1.3 / rows
        # a ratio above 1 is a multiple of the least cache that holds a batch
        tiers = [Tier("hbm")] + ([Tier("uvm")] if with_uvm else []) + [Tier("uvm_caching", min(1.0, r)) for r in sorted({max(need, x) if x <= 1 else need * x for x in ratios})]
        for tier in tiers:
            plan = one_table_plan(tier, table, batch)
            try:
                m = runner.evaluate_plan(plan)
                s = sim.evaluate_plan(plan)
                row = {"table": table.name, "tier": tier.kind, "cache_ratio": round(tier.cache_ratio, 4), "batch": batch, "lookups": batch * pf, "row_bytes": dim * 2, "rows": rows,
                       "fwd_ms": m.devices[0].fwd_comp_ms, "bwd_ms": m.devices[0].bwd_comp_ms, "sim_fwd_ms": s.devices[0].fwd_comp_ms, "sim_bwd_ms": s.devices[0].bwd_comp_ms}
                cached = m.details.get("tiers", {}).get("cached_tables", [])
                if cached:
                    c = cached[0]
                    row |= {"slots": c["slots"], "measured_hit_rate": c["hit_rate"], "misses_per_step": c["misses"] / runner.iters,
                            "evictions_per_step": c["evictions"] / runner.iters}
                    # the runner's steps: `warmup` untimed, then `iters` timed, each a new batch, the cache empty at first
                    row["predicted_hit_rate"] = hit_rate(table, cache_rows(rows, tier.cache_ratio), batch, batches=runner.warmup + runner.iters, warmup=runner.warmup)
            except Exception as e:  # noqa: BLE001
                row = {"table": table.name, "tier": tier.kind, "cache_ratio": tier.cache_ratio, "batch": batch, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            out.append(row)
    return out


def fit_tlb(grid: dict, sparse: dict | None = None, sparse_rows: int = SPARSE_ROWS) -> dict:
    """HostLink's address-translation terms from part 2's gathers (`grid`: table bytes → row bytes →
    rates): a row's time beyond its bytes at the smallest table's rate is tlb_miss_ns × the share of
    accesses that miss, 1 - R/T (random order), or of the pages touched (row order). R and the cost
    by least squares over a grid of R; the page, a power of two from 4 KB to 2 MB, that fits best the sparse
    sorted gathers (`sparse`: table bytes → ns a row of `sparse_rows` sorted rows; a page per row or
    fewer, as a prefetch's streams) where measured, else the dense sorted ones (a page is touched whatever its size)."""
    base = grid[min(grid)]
    ns = lambda v, b, key: b / v[key]  # noqa: E731 - GB/s is bytes per ns
    pts = [(t, b, ns(v, b, "read_GBps") - ns(base[b], b, "read_GBps")) for t, by_row in grid.items() for b, v in by_row.items()]
    y = np.array([e for _, _, e in pts])
    best = None
    for R in np.geomspace(min(grid) / 4, max(grid), 400):
        share = np.array([max(0.0, 1 - R / t) for t, _, _ in pts])
        c = float(share @ y / max(share @ share, 1e-12))
        err = float(((share * c - y) ** 2).sum())
        if c > 0 and (best is None or err < best[0]):
            best = (err, float(R), c)
    if best is None:
        return {}
    _, R, c = best
    fits = []
    for page in (2**p for p in range(12, 22)):  # 4 KB to 2 MB
        link = HostLink(tlb_reach_bytes=R, tlb_miss_ns=c, tlb_page_bytes=page)
        if sparse and len(sparse) > 1:
            err = sum((v - sparse[min(sparse)] - link.tlb_ms(sparse_rows, t, True) * 1e6 / sparse_rows) ** 2 for t, v in sparse.items())
        else:
            err = sum((ns(v, b, "sorted_read_GBps") - ns(base[b], b, "sorted_read_GBps") - link.tlb_ms(v["rows"], t, True) * 1e6 / v["rows"]) ** 2
                      for t, by_row in grid.items() for b, v in by_row.items())
        fits.append((err, page))
    return {"tlb_reach_bytes": R, "tlb_miss_ns": c, "tlb_page_bytes": float(min(fits)[1])}


def fit_host(speed_rows: list[dict], link: dict, device_name: str, quick: bool = False) -> dict:
    """The calibration's `host` entry from parts 2 and 3: the row rates measured in part 2; the uvm
    forward fitted to each uvm run's forward less the HBM forward at its batch, as the time of its
    distinct rows and of its repeated lookups that miss a window of recent rows, at the measured
    rates (the window's bytes on a log grid, the two weights by non-negative least squares on
    relative errors → `uvm_window_bytes`, `uvm_efficiency`, `uvm_repeat_share`); the backward's
    scale on two random gathers of its distinct rows (least squares); and the prefetch's work terms fitted to
    each cached run's forward less the HBM forward and the rows it moved at the measured rates:
    fixed + per million lookups + per million slots + per million missed lookups."""
    from scipy.optimize import nnls

    base = HostLink()
    grid = {int(t): {int(b): v for b, v in by_row.items()} for t, by_row in link.get("random_rows", {}).items()}
    rates = tuple(sorted((float(b), v["read_GBps"]) for b, v in grid[min(grid)].items())) if grid else ()
    sparse = {int(t): float(v) for t, v in link.get("sparse_sorted_ns", {}).items()}
    host = replace(HostLink(row_GBps=rates or base.row_GBps), **(fit_tlb(grid, sparse, int(link.get("sparse_sorted_rows", SPARSE_ROWS))) if len(grid) > 1 else {}))
    table_bytes = lambda r: r["rows"] * r["row_bytes"]  # noqa: E731
    key = lambda r: (r.get("table", "one"), r["batch"])  # noqa: E731
    hbm = {key(r): r for r in speed_rows if r.get("tier") == "hbm" and "fwd_ms" in r}  # each table and batch in HBM: what the tiers add to
    out: dict = {}
    uvm = [r for r in speed_rows if r.get("tier") == "uvm" and "fwd_ms" in r and key(r) in hbm]
    uvm_terms = {}
    if len(uvm) >= 2:
        # the tables fit within the TLB's reach (256 MB): no translation term
        sectors = [math.ceil(r["row_bytes"] / host.sector_bytes) * host.sector_bytes for r in uvm]
        ms_row = [b / (host.rate_GBps(b) * 1e6) for b in sectors]
        y_fwd = np.array([r["fwd_ms"] - hbm[key(r)]["fwd_ms"] for r in uvm])
        tables = {r["table"]: speed_table(quick, r["table"]) for r in uvm}
        unique = [expected_unique(tables[r["table"]], r["batch"]) for r in uvm]

        def fwd_fit(window: float):  # (relative rms error, coefficients, design) of the window's best weights
            A = np.array([[u * m, repeat_misses(tables[r["table"]], r["batch"], window / b) * m] for r, u, m, b in zip(uvm, unique, ms_row, sectors)])
            x, _ = nnls(A / y_fwd[:, None], np.ones(len(uvm)))  # relative errors: tables of 0.05–10 ms alike
            return float(np.sqrt(np.mean((A @ x / y_fwd - 1) ** 2))), x, A

        window = min(np.geomspace(2**14, 2**30, 161), key=lambda w: fwd_fit(w)[0])
        _, x, A = fwd_fit(window)
        if x[0] > 0:
            uvm_terms = {"uvm_efficiency": float(1 / x[0]), "uvm_repeat_share": float(x[1] / x[0]), "uvm_window_bytes": float(window)}
        # the backward: its distinct rows read and written back, against two random gathers of them
        a = np.array([2 * u * m for u, m in zip(unique, ms_row)])
        y = np.array([r["bwd_ms"] - hbm[key(r)]["bwd_ms"] for r in uvm])
        uvm_terms["uvm_backward_scale"] = float(max(a @ y, 0.0) / (a @ a))
        out["uvm_points"] = [{"table": r["table"], "batch": r["batch"], "lookups": r["lookups"], "unique": u, "link_ms": float(yf),
                              "fitted_ms": float(f @ x), "bwd_link_ms": float(yb), "bwd_fitted_ms": float(ab * uvm_terms["uvm_backward_scale"])}
                             for r, u, f, yf, ab, yb in zip(uvm, unique, A, y_fwd, a, y)]
    A, y, pts = [], [], []
    for r in speed_rows:
        if r.get("tier") != "uvm_caching" or "fwd_ms" not in r or key(r) not in hbm:
            continue
        sector = math.ceil(r["row_bytes"] / host.sector_bytes) * host.sector_bytes
        moved_ms = ((r["misses_per_step"] + r["evictions_per_step"]) * sector / (host.rate_GBps(sector) * 1e6)
                    + host.tlb_ms(r["misses_per_step"], table_bytes(r), True) + host.tlb_ms(r["evictions_per_step"], table_bytes(r), True))
        rest = r["fwd_ms"] - hbm[key(r)]["fwd_ms"] - moved_ms
        misses = r["lookups"] * (1 - r["measured_hit_rate"])  # as the simulator counts them: L·(1 − h)
        A.append([1.0, r["lookups"] / 1e6, r["slots"] / 1e6, misses / 1e6])
        y.append(rest)
        pts.append({"table": r.get("table", "one"), "batch": r["batch"], "slots": r["slots"], "hit_rate": r["measured_hit_rate"], "prefetch_work_ms": rest, "moved_ms": moved_ms})
    terms = {}
    if len(A) >= 4:
        x, _ = nnls(np.array(A), np.array(y))
        terms = {"prefetch_fixed_ms": float(x[0]), "prefetch_ms_per_mlookup": float(x[1]), "prefetch_ms_per_mslot": float(x[2]), "prefetch_ms_per_mmiss": float(x[3])}
        for p, a in zip(pts, A):
            p["fitted_ms"] = float(np.dot(a, x))
    fitted = replace(host, **uvm_terms, **terms, source=f"fitted by benchmarks/gpu_tiers.py on {device_name}")
    out["host"] = fitted.to_json()
    out["points"] = pts
    out["fitted"] = ["row_GBps"] * bool(rates) + ["tlb_reach_bytes", "tlb_miss_ns", "tlb_page_bytes"] * (len(grid) > 1) + sorted(uvm_terms) + sorted(terms)
    return out


# ---------------------------------------------------------------------------------------------- 4


def hit_rates(device: str, quick: bool, run: Run) -> list[dict]:
    from dreamshard.costs.kernels.tiered import RowCache
    from dreamshard.streams import table_bags
    from dreamshard.synth import PoolConfig, synth_pool

    pool = synth_pool(PoolConfig(tables=856, seed=11))
    batch = 65_536 if not quick else 1024
    warm, n = (10, 40) if not quick else (3, 8)
    chosen = [t for t in pool if t.pooling_factor > 0.2 and t.rows > 20_000][: (24 if not quick else 3)]
    out = []
    for t in chosen:
        if run.left() < 150:
            break
        U = expected_unique(t, batch)
        for factor in (1.5, 4.0, 16.0):
            C = min(t.rows, int(math.ceil(factor * U)))
            cache = RowCache(torch.zeros(t.rows, 4, device=device), torch.zeros(C + 1, 4, device=device))  # C slots and the spare row; 4 columns stand for any width
            try:
                for s in range(n):
                    if s == warm:
                        cache.reset_stats()
                    cache.prefetch(table_bags(t, batch, s, device)[1])
                measured = cache.hit_rate  # raises where a batch did not fit the cache
            except RuntimeError as e:
                out.append({"table": t.name, "cache_rows": C, "error": str(e)[:200]})
                continue
            pred = hit_rate(t, C, batch, batches=n, warmup=warm)
            out.append({"table": t.name, "rows": t.rows, "pooling": t.pooling_factor, "distribution": t.distribution, "cache_rows": C,
                        "measured": measured, "predicted": pred, "diff_points": 100 * (pred - cache.hit_rate)})
    return out


# ---------------------------------------------------------------------------------------------- 5


def phases(report) -> list[list[float]]:
    """Each device's forward compute, backward compute and collectives (ms) of a cost report."""
    return [[round(d.fwd_comp_ms, 4), round(d.bwd_comp_ms, 4), round(d.fwd_comm_ms + d.bwd_comm_ms, 4)] for d in report.devices]


def mixed_plans(kernel: str, device: str, quick: bool, run: Run, sims: dict[str, SimBackend], plans: list) -> list[dict]:
    """Part 5; each plan measured is appended to `plans` (the probe's, part 7)."""
    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.planners import get_planner
    from dreamshard.synth import PoolConfig, synth_pool
    from dreamshard.tasks import Task, Workload

    pool = synth_pool(PoolConfig(tables=856, seed=12))
    rng = np.random.default_rng(0)
    batch = 65_536 if not quick else 512
    runner = SequentialRunner(kernel, device=device, warmup=3 if quick else 5, iters=2 if quick else 10, input_sets=3)
    settings = [(40, 2, 1.5), (40, 2, 3.0), (80, 4, 2.0), (60, 4, 3.0)] if not quick else [(8, 2, 2.0)]
    out = []
    for k, devices, ratio in settings:
        idx = sorted(rng.choice(len(pool), size=k, replace=False))
        tables = [pool[i] for i in idx]
        total = sum(t.bytes() for t in tables)
        task = Task(tables, devices, int(total / ratio / devices), Workload(batch_size=batch), host_memory_bytes=int(4 * total))
        for name in ("size_lookup", "dreamshard"):
            if run.left() < 30:
                return out
            try:
                plan = get_planner(name).plan(task)
                t0 = time.monotonic()
                m = runner.evaluate_plan(plan)
                plans.append((f"{k}/{devices}/{ratio} {name}", plan, m))
                row = {"tables": k, "devices": devices, "bytes_over_hbm": ratio, "planner": name, "measured_ms": m.overall_ms,
                       "tiers": {x: sum(s.tier == x for s in plan.shards) for x in ("hbm", "uvm", "uvm_caching")},
                       "measured_hit_rates": [round(c["hit_rate"], 4) for c in m.details.get("tiers", {}).get("cached_tables", [])],
                       "seconds": round(time.monotonic() - t0, 1)}
                for label, sim in sims.items():
                    s = sim.evaluate_plan(plan)
                    row[f"sim_ms_{label}"] = s.overall_ms
                    row[f"sim_err_{label}"] = (s.overall_ms - m.overall_ms) / m.overall_ms
                # where the error lies: each device's phases, each cache's hit rate, and the same
                # placement with every shard in HBM (the GPU's 80 GB hold any one device's shards)
                used = "measured" if "measured" in sims else "default"  # the fitted host terms where part 3 fitted them
                s = sims[used].evaluate_plan(plan)
                hbm = replace(plan, shards=[replace(x, tier="hbm", cache_ratio=0.0) for x in plan.shards])
                mh, sh = runner.evaluate_plan(hbm), sims[used].evaluate_plan(hbm)
                row.update({"sim_used": used, "measured_devices": phases(m), "sim_devices": phases(s), "hbm_measured_devices": phases(mh),
                            "hbm_sim_devices": phases(sh), "hbm_measured_ms": mh.overall_ms, "hbm_sim_ms": sh.overall_ms,
                            "measured_caches": m.details.get("tiers", {}).get("cached_tables", []), "sim_caches": s.details.get("tiers", {}).get("cached_shards", []),
                            "host_link_bytes": s.details.get("tiers", {}).get("host_link_bytes", [])})
            except Exception as e:  # noqa: BLE001
                row = {"tables": k, "devices": devices, "planner": name, "error": f"{type(e).__name__}: {str(e)[:300]}", "trace": traceback.format_exc()[-800:]}
            out.append(row)
            run.save("mixed_plans", out)
    return out


# ---------------------------------------------------------------------------------------------- 6


def full_pool(kernel: str, device: str, quick: bool, run: Run, sims: dict[str, SimBackend], pools: list[str], planners: list[str]) -> list[dict]:
    """The issue's target: each family's full pool (`data synth --family F --seed 0`; `dlrm`: its
    856 tables) on 8 devices of 24 GB with host memory, planned by each of `planners` (size_lookup
    is `dreamshard plan`'s default), measured device by device by the sequential runner on this
    one GPU; pool by pool, each pool's plans in order."""
    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.families import synth_family
    from dreamshard.tasks import Task, Workload

    gb = 1 << 30
    runner = SequentialRunner(kernel, device=device, warmup=3 if quick else 5, iters=2 if quick else 10, input_sets=3)
    out = []
    for family in pools:
        pool = synth_family(family, 40 if quick else None, seed=0)
        devices, hbm = (8, 24 * gb) if not quick else (2, int(sum(t.bytes() for t in pool) / 1.5 / 2))
        task = Task(pool, devices, hbm, Workload(batch_size=65_536 if not quick else 512), host_memory_bytes=512 * gb if not quick else 4 * hbm)
        for name in planners:
            if run.left() < 90:
                return out
            out.append(_full_pool_plan(family, name, task, runner, sims))
            run.save("full_pool", out)
    return out


def _full_pool_plan(family: str, name: str, task, runner, sims: dict[str, SimBackend]) -> dict:
    """One full-pool plan made by planner `name`, measured and priced (part 6)."""
    from dreamshard.planners import get_planner

    gb = 1 << 30
    try:
        plan = get_planner(name).plan(task)
        t0 = time.monotonic()
        m = runner.evaluate_plan(plan)
        row = {"pool": family, "planner": name, "tables": len(task.tables), "devices": task.devices, "hbm_gb": task.max_memory_bytes / gb,
               "measured_ms": m.overall_ms, "seconds": round(time.monotonic() - t0, 1),
               "tiers": {x: sum(s.tier == x for s in plan.shards) for x in ("hbm", "uvm", "uvm_caching")},
               "measured_devices": phases(m),
               "measured_caches": m.details.get("tiers", {}).get("cached_tables", [])}
        for label, sim in sims.items():
            r = sim.evaluate_plan(plan)
            row[f"sim_ms_{label}"] = r.overall_ms
            row[f"sim_err_{label}"] = (r.overall_ms - m.overall_ms) / m.overall_ms
            row[f"sim_devices_{label}"] = phases(r)
            row[f"sim_caches_{label}"] = r.details.get("tiers", {}).get("cached_shards", [])
        return row
    except Exception as e:  # noqa: BLE001
        return {"pool": family, "planner": name, "error": f"{type(e).__name__}: {str(e)[:300]}", "trace": traceback.format_exc()[-800:]}


# ---------------------------------------------------------------------------------------------- 7


def _time_prefetches(tbe, tables: list, B: int, device: str, steps: int, warm: int = 5, profile: bool = False) -> dict:
    """The tiered forward of `tbe` taken apart over `steps` steps (after `warm`): each cache's prefetch
    and then the kernel's forward, each timed alone by the runner's clock (its GPU work: the GPU kept
    busy while the host enqueues it, runners/launch.py `_Clock`), and the host's time to issue each
    prefetch; with `profile`, torch.profiler's table of three more batches' prefetches (ops by their
    own CPU time)."""
    from dreamshard.costs.runners.launch import _Clock
    from dreamshard.streams import shard_batch

    dev = torch.device(device)
    clock = _Clock(dev)
    grad = torch.zeros(B, tbe.total_dim, dtype=tbe.dtype, device=device)
    caches = list(tbe.caches.items())
    gpu, issue, inner_ms = np.zeros(len(caches)), np.zeros(len(caches)), []
    for i in range(warm + steps):
        ix, off = shard_batch(tables, B, step=i, device=device)
        bounds = off[::B].tolist()
        if i == warm:
            tbe.reset_cache_stats()
        slots = ix.clone()
        for k, (t, cache) in enumerate(caches):
            clock.sync()
            a = clock.start()
            h0 = time.perf_counter()
            cache.prefetch(ix[bounds[t]:bounds[t + 1]], out=slots[bounds[t]:bounds[t + 1]])
            h1 = time.perf_counter()
            b = clock.mark()
            clock.sync()
            if i >= warm:
                issue[k] += (h1 - h0) * 1000 / steps
                gpu[k] += clock.ms(a, b) / steps
        clock.sync()
        a = clock.start()
        tbe.inner.forward(slots, off)
        b = clock.mark()
        clock.sync()
        if i >= warm:
            inner_ms.append(clock.ms(a, b))
        tbe.backward(grad)
    out = {"issue": issue, "gpu": gpu, "kernel_forward_ms": round(float(np.median(inner_ms)), 4) if inner_ms else None}
    if profile:  # the prefetches alone, three more batches (made first)
        batches = [shard_batch(tables, B, step=warm + steps + i, device=device) for i in range(3)]
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        sync(device)
        with torch.profiler.profile(activities=activities) as prof:
            for ix, off in batches:
                bounds = off[::B].tolist()
                for t, cache in caches:
                    cache.prefetch(ix[bounds[t]:bounds[t + 1]])
                sync(device)
        out["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return out


def probe(kernel: str, device: str, plans: list, link: HostLink, run: Run, steps: int = 8) -> list[dict]:
    """Where a device's tiers' cost goes: for each device with cached shards (of the mixed plans),
    the tiered forward taken apart (`_time_prefetches`) beside the simulator's price of each prefetch
    (its work and the rows it moves, with the hit rate predicted and again with the one measured).
    The first such device is also profiled, timed with Python's garbage collector off, and each of its
    cached tables timed again alone in a TBE of its own (is a prefetch's cost its own, or its shard's?)."""
    import gc

    from dreamshard.costs.kernels.host_memory import release_cached_host_memory
    from dreamshard.costs.kernels.tiered import TieredTBE
    from dreamshard.costs.runners.distributed import build_checked_tbe

    on_gpu = torch.device(device).type == "cuda"
    out = []
    for label, plan, _ in plans:
        w = plan.workload
        B, elt = w.batch_size, w.elt_bytes
        specs = plan.shard_specs()
        for d in range(plan.devices):
            ours = [(s, spec) for s, spec in zip(plan.shards, specs) if s.device == d]
            if not any(s.tier == "uvm_caching" for s, _ in ours) or run.left() < 20:
                continue
            tables = [spec for _, spec in ours]
            tiers = [Tier(s.tier, s.cache_ratio) for s, _ in ours]
            first = not out
            tbe = build_checked_tbe(kernel, tables, w.precision, w.optimizer, device, tiers=tiers)
            got = _time_prefetches(tbe, tables, B, device, steps, profile=first)
            stats = tbe.cache_stats()
            extra: dict = {}
            if first:
                gc.disable()
                try:
                    extra["issue_without_gc"] = [round(float(x), 4) for x in _time_prefetches(tbe, tables, B, device, steps)["issue"]]
                finally:
                    gc.enable()
                extra["profile"] = got.get("profile")
            rows = []
            for k, (t, cache) in enumerate(tbe.caches.items()):
                spec = tables[t]
                L = B * spec.pooling_factor
                h_pred, h_meas = hit_rate(spec, cache.slots, B), stats[t]["hit_rate"]
                adagrad = w.optimizer == "rowwise_adagrad"
                priced = lambda h: link.cached_ms(L, cache.slots, h, spec.dim * elt, spec.rows, adagrad)[0]  # noqa: E731
                row = {"table": spec.name, "rows": spec.rows, "dim": spec.dim, "lookups": round(L), "slots": cache.slots, "hit_predicted": round(h_pred, 4),
                       "hit_measured": round(h_meas, 4), "prefetch_gpu_ms": round(float(got["gpu"][k]), 4), "prefetch_issue_ms": round(float(got["issue"][k]), 4),
                       "priced_ms": round(priced(h_pred), 4), "priced_at_measured_hit_ms": round(priced(h_meas), 4),
                       "moved_ms_at_measured_hit": round(priced(h_meas) - link.prefetch_ms(L, cache.slots, L * (1 - h_meas)), 4)}
                if first:
                    alone = TieredTBE(kernel, [spec.rows], [spec.dim], [tiers[t]], precision=w.precision, optimizer=w.optimizer, device=device)
                    a = _time_prefetches(alone, [spec], B, device, steps)
                    row |= {"alone_issue_ms": round(float(a["issue"][0]), 4), "alone_gpu_ms": round(float(a["gpu"][0]), 4)}
                    del alone
                rows.append(row)
            out.append({"plan": label, "device": d, "tables": len(tables), "uvm": sum(tr.kind == "uvm" for tr in tiers),
                        "kernel_forward_ms": got["kernel_forward_ms"], "caches": rows, **extra})
            del tbe
            if on_gpu:
                torch.cuda.empty_cache()
                release_cached_host_memory()
            run.save("probe", out)
    return out


# ----------------------------------------------------------------------------------------------


def report(summary: dict) -> str:
    lines = ["# Memory tiers on one GPU (benchmarks/gpu_tiers.py)", "", f"device: {summary.get('device')}; started {summary.get('started')}; {summary.get('elapsed_s')} s", ""]
    lines += ["## Correctness (float64 reference, poisoned outputs)", ""] + [f"- {r['precision']} {r['optimizer']}: {'ok' if r['ok'] else 'FAILED ' + r.get('error', '')}"
                                                                          for r in summary.get("correctness", [])] + [""]
    link = summary.get("host_link", {})
    if link:
        lines += ["## Host link", "", f"- pinned copies: H2D {link.get('memcpy_h2d_GBps', float('nan')):.1f} GB/s, D2H {link.get('memcpy_d2h_GBps', float('nan')):.1f} GB/s"]
        rr = link.get("random_rows", {})
        if rr:
            widths = list(next(iter(rr.values())))
            lines += ["", "Random rows gathered from (and scattered to) host-mapped memory, GB/s read / write, by row and table size:", "",
                      "| table | " + " | ".join(f"{b} B rows" for b in widths) + " |", "|---" * (len(widths) + 1) + "|"]
            lines += [f"| {int(t) / 2**30:g} GB | " + " | ".join(f"{v[b]['read_GBps']:.1f} / {v[b]['write_GBps']:.1f}" for b in widths) + " |" for t, v in rr.items()]
        sp = link.get("sparse_sorted_ns", {})
        if sp:
            lines += ["", f"{link.get('sparse_sorted_rows')} sorted rows of {SPARSE_ROW_BYTES} B gathered from a table of "
                      + ", ".join(f"{int(t) / 2**30:g} GB: {v:.1f} ns a row" for t, v in sp.items())]
            spw = link.get("sparse_sorted_write_ns", {})
            if spw:
                lines += ["", "and written to it: " + ", ".join(f"{int(t) / 2**30:g} GB: {v:.1f} ns a row" for t, v in spw.items())]
        lines += [""]
    lines += ["## One table per tier (measured vs simulated, ms)", "", "sim: HostLink's defaults; fitted: with the host entry fitted below", "",
              "| table | tier | cache ratio | batch | fwd | bwd | sim fwd | sim bwd | fitted fwd | fitted bwd | hit measured | hit predicted |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for r in summary.get("speed", []):
        if "error" in r:
            lines.append(f"| {r.get('table', 'one')} | {r['tier']} | {r['cache_ratio']} | {r.get('batch')} | error: {r['error'][:80]} ||||||||")
        else:
            lines.append(f"| {r.get('table', 'one')} | {r['tier']} | {r['cache_ratio']} | {r.get('batch')} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['sim_fwd_ms']:.3f} | {r['sim_bwd_ms']:.3f} | "
                         f"{r.get('sim_fwd_ms_fitted', nan):.3f} | {r.get('sim_bwd_ms_fitted', nan):.3f} | {r.get('measured_hit_rate', nan):.3f} | {r.get('predicted_hit_rate', nan):.3f} |")
    fit = summary.get("host_fit")
    if fit:
        h = fit["host"]
        lines += ["", "## Fitted host terms (calibration `host` entry: host_link.json)", "",
                  f"- fitted: {', '.join(fit['fitted']) or 'nothing'} (row rates: the table above)",
                  f"- uvm forward: efficiency {h['uvm_efficiency']:.3f}, repeated lookups beyond a {h.get('uvm_window_bytes', 0.0) / 1024:.0f} KB window read again at {h.get('uvm_repeat_share', 1.0):.3f}; prefetch: {h['prefetch_fixed_ms']:.4f} ms + {h['prefetch_ms_per_mlookup']:.4f} ms per M lookups + "
                  f"{h['prefetch_ms_per_mslot']:.4f} ms per M slots + {h.get('prefetch_ms_per_mmiss', 0.0):.4f} ms per M missed lookups",
                  f"- address translation: reach {h.get('tlb_reach_bytes', 0) / 2**30:.2f} GB, {h.get('tlb_miss_ns', 0):.1f} ns a miss, pages of {h.get('tlb_page_bytes', 0) / 1024:g} KB", "",
                  "| table | batch | slots | hit rate | prefetch work ms (measured) | fitted | rows moved ms |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {p.get('table', 'one')} | {p['batch']} | {p['slots']} | {p.get('hit_rate', nan):.3f} | {p['prefetch_work_ms']:.3f} | {p.get('fitted_ms', nan):.3f} | {p['moved_ms']:.3f} |"
                  for p in fit.get("points", [])]
        if fit.get("uvm_points"):
            lines += ["", f"The uvm forward and backward: their time beyond the HBM kernel's, measured and fitted (forward: distinct rows and the repeated "
                      f"lookups beyond a window of {h.get('uvm_window_bytes', 0.0) / 1024:.0f} KB of recent rows, at the row rates; backward: {h.get('uvm_backward_scale', 1.0):.3f} of two random gathers of the distinct rows)", "",
                      "| table | batch | lookups | distinct rows | forward measured ms | fitted | backward measured ms | fitted |", "|---|---|---|---|---|---|---|---|"]
            lines += [f"| {p['table']} | {p['batch']} | {p['lookups']:.0f} | {p['unique']:.0f} | {p['link_ms']:.3f} | {p['fitted_ms']:.3f} | "
                      f"{p.get('bwd_link_ms', nan):.3f} | {p.get('bwd_fitted_ms', nan):.3f} |" for p in fit["uvm_points"]]
    hr = [r for r in summary.get("hit_rates", []) if "measured" in r]
    if hr:
        d = np.abs([r["diff_points"] for r in hr])
        lines += ["", "## Hit rate: measured vs predicted from the reuse bins", "", f"{len(hr)} (table, cache) pairs: mean |diff| {d.mean():.2f} points, max {d.max():.2f}; "
                  f"within 5 points: {int((d <= 5).sum())} of {len(hr)}"]
    mp = [r for r in summary.get("mixed_plans", []) if "measured_ms" in r]
    if mp:
        lines += ["", "## Mixed-tier plans (sequential runner, comm modelled)", "", "| tables | devices | bytes/HBM | planner | tiers | measured ms | sim (defaults) | err | sim (fitted here) | err |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in mp:
            lines.append(f"| {r['tables']} | {r['devices']} | {r['bytes_over_hbm']} | {r['planner']} | {r['tiers']} | {r['measured_ms']:.3f} | {r.get('sim_ms_default', float('nan')):.3f} | "
                         f"{100 * r.get('sim_err_default', float('nan')):+.1f}% | {r.get('sim_ms_measured', float('nan')):.3f} | {100 * r.get('sim_err_measured', float('nan')):+.1f}% |")
        lines += ["", "Where the error lies (the simulator of the last column above): each device's forward and backward compute, measured / simulated "
                  "(ms), with its shards in their tiers and again all in HBM; the tiers' own cost is the difference.", "",
                  "| plan | device | fwd | bwd | all-HBM fwd | all-HBM bwd | tiers' cost measured | simulated | host-link MB |", "|---|---|---|---|---|---|---|---|---|"]
        for r in mp:
            if "measured_devices" not in r:
                continue
            for d, (m, s, mh, sh) in enumerate(zip(r["measured_devices"], r["sim_devices"], r["hbm_measured_devices"], r["hbm_sim_devices"])):
                extra_m, extra_s = m[0] + m[1] - mh[0] - mh[1], s[0] + s[1] - sh[0] - sh[1]
                link = r["host_link_bytes"][d] / 1e6 if d < len(r["host_link_bytes"]) else 0.0
                lines.append(f"| {r['tables']}/{r['devices']}/{r['bytes_over_hbm']} {r['planner']} | {d} | {m[0]:.3f} / {s[0]:.3f} | {m[1]:.3f} / {s[1]:.3f} | "
                             f"{mh[0]:.3f} / {sh[0]:.3f} | {mh[1]:.3f} / {sh[1]:.3f} | {extra_m:.3f} | {extra_s:.3f} | {link:.0f} |")
        caches = [(r, c) for r in mp for c in r.get("sim_caches", [])]
        if caches:
            lines += ["", "Each cached shard: predicted hit rate (reuse bins) and measured (the runner, same table name)", "",
                      "| plan | table | device | cache rows | predicted | measured |", "|---|---|---|---|---|---|"]
            for r, c in caches:
                got = [x["hit_rate"] for x in r.get("measured_caches", []) if x.get("table") == c["table"]]
                lines.append(f"| {r['tables']}/{r['devices']}/{r['bytes_over_hbm']} {r['planner']} | {c['table']} | {c['device']} | {c['cache_rows']} | "
                             f"{c['predicted_hit_rate']:.3f} | {', '.join(f'{g:.3f}' for g in got) or 'n/a'} |")
    failed = [r for r in summary.get("full_pool", []) if "error" in r]
    if failed:
        lines += ["", "## Full pools not measured", "", *(f"- {r.get('pool', 'dlrm')}, {r['planner']}: {r['error']}" for r in failed)]
    fp = [r for r in summary.get("full_pool", []) if "measured_ms" in r]
    if fp:
        lines += ["", "## The full pools: each family's pool (seed 0), 8 devices of 24 GB and host memory (sequential runner, comm modelled)", "",
                  "| pool | tables | planner | tiers | measured ms | sim (defaults) | err | sim (fitted here) | err | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in fp:
            lines.append(f"| {r.get('pool', 'dlrm')} | {r['tables']} | {r['planner']} | {r['tiers']} | {r['measured_ms']:.3f} | {r.get('sim_ms_default', nan):.3f} | {100 * r.get('sim_err_default', nan):+.1f}% | "
                         f"{r.get('sim_ms_measured', nan):.3f} | {100 * r.get('sim_err_measured', nan):+.1f}% | {r['seconds']} |")
        label = "measured" if "sim_devices_measured" in fp[0] else "default"
        lines += ["", f"Each device's compute, measured / simulated (ms; the simulator with the {'host entry fitted here' if label == 'measured' else 'defaults'})", "",
                  "| pool | planner | device | fwd | bwd |", "|---|---|---|---|---|"]
        for r in fp:
            for d, (m, x) in enumerate(zip(r["measured_devices"], r[f"sim_devices_{label}"])):
                lines.append(f"| {r.get('pool', 'dlrm')} | {r['planner']} | {d} | {m[0]:.3f} / {x[0]:.3f} | {m[1]:.3f} / {x[1]:.3f} |")
    pr = summary.get("probe", [])
    if pr:
        lines += ["", "## The tiered forward taken apart (devices of the mixed plans with caches)", "",
                  "Each cache's prefetch timed alone by the runner's clock (its GPU work) and the host's time to issue it, beside its price (the fitted "
                  "host entry) at the predicted and at the measured hit rate; then the kernel's forward over the device's tables (timed the same way).", "",
                  "| plan | device | table | dim | lookups | slots | hit pred / meas | prefetch GPU ms | issue ms | priced | priced at measured hit | rows moved ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in pr:
            for c in r["caches"]:
                lines.append(f"| {r['plan']} | {r['device']} | {c['table']} | {c['dim']} | {c['lookups']} | {c['slots']} | {c['hit_predicted']:.3f} / {c['hit_measured']:.3f} | "
                             f"{c['prefetch_gpu_ms']:.3f} | {c['prefetch_issue_ms']:.3f} | {c['priced_ms']:.3f} | {c['priced_at_measured_hit_ms']:.3f} | {c['moved_ms_at_measured_hit']:.3f} |")
            lines.append(f"| {r['plan']} | {r['device']} | kernel forward ({r['tables']} tables, {r['uvm']} uvm) |||||| {r['kernel_forward_ms'] or nan:.3f} |||||")
        first = pr[0]
        alone = [c for c in first["caches"] if "alone_issue_ms" in c]
        if alone:
            lines += ["", f"The first device ({first['plan']}, device {first['device']}): each prefetch's issue time (ms) in its shard, in its shard with "
                      "Python's garbage collector off, and alone in a TBE of one table (issue / GPU span)", "",
                      "| table | in its shard | GC off | alone |", "|---|---|---|---|"]
            for c, g in zip(first["caches"], first.get("issue_without_gc", [nan] * len(first["caches"]))):
                lines.append(f"| {c['table']} | {c['prefetch_issue_ms']:.3f} | {g:.3f} | {c['alone_issue_ms']:.3f} / {c['alone_gpu_ms']:.3f} |")
        if first.get("profile"):
            lines += ["", "Its prefetches profiled (three batches; torch.profiler, ops by their own CPU time):", "", "```", first["profile"], "```"]
    return "\n".join(lines) + "\n"


def refit(run: Run, out: Path, quick: bool) -> SimBackend:
    """The host entry fitted to the run's parts 2 and 3 (`fit_host`), written to OUT/host_link.json,
    and the one-table runs priced with it; → the simulator with it."""
    fit = fit_host(run.summary["speed"], run.summary["host_link"], run.summary["device"], quick)
    run.save("host_fit", fit)
    cal = Calibration.load()
    cal.host = fit["host"]
    sim = SimBackend(cal)
    # the calibration snippet: a calibration file's `host` entry (dreamshard calibrate's output takes it as is)
    atomic_write(out / "host_link.json", json.dumps(cal.host, indent=1))
    for r in run.summary["speed"]:
        if "fwd_ms" in r:
            s = sim.evaluate_plan(one_table_plan(Tier(r["tier"], r["cache_ratio"]), speed_table(quick, r["table"]), r["batch"]))
            r["sim_fwd_ms_fitted"], r["sim_bwd_ms_fitted"] = s.devices[0].fwd_comp_ms, s.devices[0].bwd_comp_ms
    run.save("speed", run.summary["speed"])
    return sim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernel", default=None, help="default: triton on CUDA, torch on a CPU")
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--quick", action="store_true", help="logic check: tiny sizes")
    ap.add_argument("--skip", default="", help="parts not to run, of 1, 4, 5, 6 and 7 (e.g. 1,4,6; 7 probes 5's plans)")
    ap.add_argument("--pools", default="dlrm", help="part 6: the families whose full pools are planned and measured, in order (default: dlrm)")
    ap.add_argument("--pool-planners", default="size_lookup,dreamshard", help="part 6: the planners of each pool, in order")
    ap.add_argument("--refit", action="store_true", help="no GPU: fit the host entry again to OUT/summary.json's parts 2 and 3 "
                    "(host_link.json, the one-table rows' fitted prices, report.md; the plans keep the prices of their call)")
    args = ap.parse_args()
    if args.refit:
        run = Run(Path(args.out), 0.0, resume=True)
        refit(run, Path(args.out), run.summary.get("quick", args.quick))
        atomic_write(Path(args.out) / "report.md", report(run.summary))
        return
    skip = {int(x) for x in args.skip.split(",") if x.strip()}
    if skip - {1, 4, 5, 6, 7}:
        ap.error(f"--skip: parts 1, 4, 5, 6 and 7 can be skipped (2 and 3 feed them), got {args.skip}")
    from dreamshard.families import FAMILIES
    from dreamshard.planners.base import PLANNERS
    import dreamshard.planners  # noqa: F401  (registers every planner)
    for what, given, known in (("--pools", args.pools, FAMILIES), ("--pool-planners", args.pool_planners, PLANNERS)):
        unknown = [x for x in given.split(",") if x not in known]
        if unknown:
            ap.error(f"{what}: unknown {unknown[0]!r}; choose from {', '.join(known)}")
    kernel = args.kernel or ("triton" if args.device.startswith("cuda") else "torch")
    run = Run(Path(args.out), args.budget_s)
    run.save("device", torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu")
    run.save("kernel", kernel)
    run.save("quick", args.quick)
    if 1 not in skip:
        run.save("correctness", correctness(kernel, args.device))
    try:
        link = host_link(args.device, args.quick)
    except Exception as e:  # noqa: BLE001
        link = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    run.save("host_link", link)
    sims = {"default": SimBackend()}
    speed_rows = speed(kernel, args.device, args.quick, sims["default"])
    run.save("speed", speed_rows)
    if "random_rows" in link:
        sims["measured"] = refit(run, Path(args.out), args.quick)
    if 4 not in skip:
        run.save("hit_rates", hit_rates(args.device, args.quick, run))
    plans: list = []
    if 5 not in skip:
        mixed_plans(kernel, args.device, args.quick, run, sims, plans)
    if 6 not in skip:
        full_pool(kernel, args.device, args.quick, run, sims, args.pools.split(","), args.pool_planners.split(","))
    if 7 not in skip:
        probe(kernel, args.device, plans, sims.get("measured", sims["default"]).host_link, run)
    atomic_write(Path(args.out) / "report.md", report(run.summary))
    print((Path(args.out) / "report.md").read_text())


if __name__ == "__main__":
    main()
