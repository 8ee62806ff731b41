"""Memory tiers (docs/tiers.md): the tiered TBE against the float64 reference (CPU here; CUDA in
tests marked gpu), the cache hit rate predicted from the reuse bins against an LRU simulation of
actual index streams, the tier stage in the planners, plan files, validation, the simulator's
price, TorchRec's kernels and the sequential runner on mixed-tier plans."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from test_kernels import DTYPE, TOL_FWD, assert_updates, random_batch, random_shard, reference_forward, reference_update, rel

from dreamshard.costs.kernels.tiered import RowCache, TieredTBE
from dreamshard.tables import TableSpec
from dreamshard.tiers import Tier, expected_unique, hit_rate, simulate_lru

CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------
# the tiered TBE against the float64 reference
# ------------------------------------------------------------------------------------------------


def random_tiers(rng: np.random.Generator, rows: list[int], batch: int, small: bool = False) -> list[Tier]:
    """Every tier at least once where there are tables enough; caches that hold a batch (8 lookups a
    bag at most) but not the table, so rows are evicted and written back (`small`: caches of 2
    lookups a bag, which a batch overflows)."""
    kinds = ["uvm_caching", "uvm", "hbm"] + [str(rng.choice(["hbm", "uvm", "uvm_caching"])) for _ in rows[3:]]
    out = []
    for r, k in zip(rows, kinds):
        ratio = min(1.0, ((2 if small else 8) * batch + 1) / r) if k == "uvm_caching" else 0.0
        out.append(Tier(k, ratio))
    return out


def check_tiered(kernel: str, precision: str, optimizer: str, seed: int, device: str = "cpu", steps: int = 3, small: bool = False) -> TieredTBE:
    """`small`: caches smaller than a batch, with staging rows for a batch's overflow."""
    rng = np.random.default_rng(seed)
    rows, dims = random_shard(rng, 6, 300)
    rows = [max(r, 40) for r in rows]
    batch = int(rng.integers(2, 9))
    tiers = random_tiers(rng, rows, batch, small)
    lr, eps = 0.05, 1e-8
    tbe = TieredTBE(kernel, rows, dims, tiers, precision=precision, optimizer=optimizer, lr=lr, eps=eps, device=device, seed=seed,
                    overflow=[8 * batch] * len(rows) if small else None)
    tbe.inner.poison_outputs = True
    for t, (r, d) in enumerate(zip(rows, dims)):
        tbe.set_weights(t, (torch.rand(r, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed * 31 + t)) * 2 - 1).to(DTYPE[precision]).to(device))
    states = [torch.zeros(r, dtype=torch.float64) for r in rows] if optimizer == "rowwise_adagrad" else None
    empty_table = int(rng.integers(0, len(rows)))
    for step in range(steps):
        indices, offsets = random_batch(rng, rows, batch, device, empty_table)
        w_old = [tbe.weights(t).detach().clone() for t in range(len(rows))]
        out = tbe.forward(indices, offsets)
        assert out.shape == (batch, sum(dims)) and out.dtype == DTYPE[precision]
        err = rel(out, reference_forward(w_old, indices, offsets, batch))
        assert err < TOL_FWD[precision], f"tiered {kernel} forward rel err {err:.2e} (step {step}, tiers {tiers})"
        grad = torch.randn(batch, sum(dims), dtype=torch.float64, generator=torch.Generator().manual_seed(seed * 7 + step)).to(DTYPE[precision])
        tbe.backward(grad.to(device))
        ref_w, states = reference_update(w_old, states, indices, offsets, batch, grad, optimizer, lr, eps)
        assert_updates(tbe, w_old, ref_w, precision, lambda t: f"tiered {kernel} {optimizer} table {t} ({tiers[t].kind}) at step {step}")
        if states is not None:
            for t in range(len(rows)):
                got = tbe.optimizer_state(t).double().cpu()
                assert rel(got, states[t]) < 1e-5, f"table {t} ({tiers[t].kind}): Adagrad state off"
    return tbe


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("seed", [1, 2])
def test_tiered_torch_kernel_matches_reference(precision, optimizer, seed):
    tbe = check_tiered("torch", precision, optimizer, seed=seed * 13 + len(precision) + len(optimizer))
    assert tbe.caches, "a cached table in every shard"
    assert any(c.misses for c in tbe.caches.values())


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_a_cache_smaller_than_a_batch_serves_its_overflow_from_host_memory(optimizer):
    """As FBGEMM does: the misses that find no free slot are read from host memory into staging
    rows, updated there and written back after the backward; every step against the float64
    reference (weights and Adagrad state read back from host memory and cache)."""
    staged = 0
    for seed in (3, 4, 5):
        tbe = check_tiered("torch", "fp32", optimizer, seed=seed, steps=5, small=True)
        staged += sum(int((c._staged >= 0).sum()) for c in tbe.caches.values())
        assert all(c.overflow for c in tbe.caches.values())
    assert staged, "no batch overflowed a cache"


def test_kernels_refuse_host_tables_that_are_not_tables():
    from dreamshard.costs.kernels.torch_tbe import TorchTBE

    with pytest.raises(ValueError, match="host_tables: indices of the 2 tables"):
        TorchTBE([10, 20], [8, 8], host_tables=[2])


def test_tiered_kernel_evicts_and_writes_back():
    """A cache of a batch's rows on a table read at random: most rows pass through it, evicted and
    written back, and the table read back is the reference's after every step (check_tiered)."""
    evictions = sum(c.evictions for seed in range(5, 8) for c in check_tiered("torch", "fp32", "sgd", seed=seed, steps=6).caches.values())
    assert evictions > 0, "no seed evicted a row"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("kernel", ["triton", "torch"])
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_tiered_kernel_matches_reference_cuda(kernel, precision, optimizer):
    tbe = check_tiered(kernel, precision, optimizer, seed=41 + len(kernel) + len(precision), device="cuda")
    assert tbe.caches


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_small_caches_overflow_to_host_memory_cuda(optimizer):
    tbe = check_tiered("triton", "fp32", optimizer, seed=7, device="cuda", steps=5, small=True)
    assert any(int((c._staged >= 0).sum()) for c in tbe.caches.values()), "no batch overflowed a cache"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_host_mapped_memory_is_host_memory_on_the_gpu():
    from dreamshard.costs.kernels.host_memory import host_mapped

    x = host_mapped(1 << 20, torch.float32, "cuda")
    assert x.is_cuda
    x.fill_(3.0)  # written by a GPU kernel, into host memory
    torch.cuda.synchronize()
    assert float(x.sum()) == 3.0 * (1 << 20)
    free_before = torch.cuda.mem_get_info()[0]
    y = host_mapped(256 << 20, torch.float16, "cuda")  # 512 MB of host memory: no HBM taken
    assert torch.cuda.mem_get_info()[0] >= free_before - (64 << 20)
    del y


# ------------------------------------------------------------------------------------------------
# the hit rate from the reuse bins against an LRU simulation of actual streams
# ------------------------------------------------------------------------------------------------

STREAM_TABLES = [(100_000, 2.0, "zipf:1.05"), (400_000, 5.0, "zipf:0.9"), (200_000, 1.0, "zipf:1.2"), (50_000, 3.0, "uniform"),
                 (800_000, 10.0, "zipf:0.7"), (150_000, 20.0, "zipf:1.0")]


def stream_table(rows: int, pooling: float, distribution: str) -> TableSpec:
    from dreamshard.bins import reuse_bins

    return TableSpec("x", rows, 16, pooling, tuple(reuse_bins(rows, pooling, distribution)), distribution=distribution, seed=3)


@pytest.mark.parametrize("rows, pooling, distribution", STREAM_TABLES)
def test_hit_rate_from_bins_within_5_points_of_lru(rows, pooling, distribution):
    """The acceptance target: predicted (from the table's 17 bins only) against measured (an LRU
    cache replaying its index stream, streams.py), caches from 1.3 to 20 batches' distinct rows."""
    from dreamshard.streams import table_bags
    from dreamshard.tiers import expected_unique

    B, n, warm = 4096, 10, 3
    t = stream_table(rows, pooling, distribution)
    batches = [table_bags(t, B, s)[1].numpy() for s in range(n)]
    U = expected_unique(t, B)
    assert abs(U - np.mean([len(np.unique(b)) for b in batches])) < 0.15 * U  # the batch's distinct rows, from the bins
    for factor in (1.3, 3, 20):
        C = min(rows, int(factor * max(U, max(len(np.unique(b)) for b in batches))))
        measured = simulate_lru(batches, C, rows, warmup=warm)
        predicted = hit_rate(t, C, B, batches=n, warmup=warm)
        assert abs(predicted - measured) < 0.05, f"{distribution} rows {rows}: cache {C}: predicted {predicted:.3f}, LRU {measured:.3f}"


def _window_misses(stream: np.ndarray, window: int) -> int:
    """Lookups of the stream, beyond each row's first, whose row is not among the last `window`
    distinct rows read (an LRU of `window` rows replayed)."""
    from collections import OrderedDict

    lru: OrderedDict = OrderedDict()
    seen, misses = set(), 0
    for r in stream.tolist():
        if r in lru:
            lru.move_to_end(r)
        else:
            misses += r in seen
            seen.add(r)
            lru[r] = None
            if len(lru) > window:
                lru.popitem(last=False)
    return misses


@pytest.mark.parametrize("rows, pooling, distribution", STREAM_TABLES[:4] + [(20_000, 30.0, "zipf:1.3")])
def test_repeat_misses_follow_an_lru_window_over_the_stream(rows, pooling, distribution):
    """tiers.repeat_misses (the uvm forward's repeated reads, costs/host.py) from the bins alone
    against an LRU window replayed on the table's index stream, windows from none to more than a
    batch: within 10% of the repeats from 300 rows (the fitted window is ~1,000 rows of 128 bytes).
    Smaller windows over the hottest tables are over-predicted (zipf 1.3, pooling 30: by 13% of the
    repeats at 100 rows, 26% at 10): the bins do not resolve the head's rates that finely."""
    from dreamshard.streams import table_bags
    from dreamshard.tiers import repeat_misses

    B = 2048
    t = stream_table(rows, pooling, distribution)
    stream = table_bags(t, B, 0)[1].numpy()
    U, L = len(np.unique(stream)), len(stream)
    assert repeat_misses(t, B, 0) == pytest.approx(t.pooling_factor * B - expected_unique(t, B), rel=1e-3)  # no window: every repeat
    assert repeat_misses(t, B, 2 * L) == 0.0
    got = [repeat_misses(t, B, w) for w in (0, 10, 100, 300, 1000)]
    assert all(a >= b for a, b in zip(got, got[1:]))  # a larger window serves more
    for window in sorted({300, 1000, U // 3}):
        measured, predicted = _window_misses(stream, window), repeat_misses(t, B, window)
        assert abs(predicted - measured) < 0.1 * (L - U) + 20, f"{distribution}: window {window}: predicted {predicted:.0f}, replayed {measured} of {L - U} repeats"


def test_row_cache_is_the_simulated_lru():
    """The kernels' cache (RowCache, torch ops) hits as the reference simulation does."""
    from dreamshard.streams import table_bags

    t = stream_table(50_000, 4.0, "zipf:1.0")
    batches = [table_bags(t, 2048, s)[1] for s in range(8)]
    C = 3 * max(int(torch.unique(b).numel()) for b in batches)
    host = torch.zeros(t.rows, 4)
    cache = RowCache(host, torch.zeros(C + 1, 4))  # C slots and the spare row
    for i, b in enumerate(batches):
        if i == 2:
            cache.reset_stats()
        slots = cache.prefetch(b)
        assert torch.equal(cache.slot_row[slots], b)  # every lookup maps to the slot holding its row
    assert abs(cache.hit_rate - simulate_lru([b.numpy() for b in batches], C, t.rows, warmup=2)) < 0.01


def test_cache_smaller_than_a_batch_hits_as_predicted():
    """A cache of a fraction of a batch's distinct rows, its overflow staged (RowCache overflow):
    its hit rate within 5 points of tiers.hit_rate's (Che's T below one batch)."""
    from dreamshard.streams import table_bags

    for rows, pooling, distribution in (STREAM_TABLES[0], STREAM_TABLES[3]):
        t = stream_table(rows, pooling, distribution)
        batches = [table_bags(t, 2048, s)[1] for s in range(8)]
        U = expected_unique(t, 2048)
        for share in (0.1, 0.6):
            C = int(share * U)
            staging = int(3 * U)
            cache = RowCache(torch.zeros(t.rows, 2), torch.zeros(C + 1 + staging, 2), overflow=staging)
            for i, b in enumerate(batches):
                if i == 3:
                    cache.reset_stats()
                cache.prefetch(b)
            predicted = hit_rate(t, C, 2048, batches=8, warmup=3)
            assert abs(cache.hit_rate - predicted) < 0.05, f"{distribution}, cache {share} of a batch: measured {cache.hit_rate:.3f}, predicted {predicted:.3f}"


def test_prefetch_pads_batches_by_at_most_an_eighth():
    from dreamshard.costs.kernels.tiered import padded

    for n in list(range(1, 300)) + [1000, 65_536, 65_537, 262_143, 700_001]:
        p = padded(n)
        assert n <= p <= max(64, 1.125 * n), (n, p)
    assert len({padded(n) for n in range(60_000, 66_000)}) <= 3  # a table's batches: a few sizes (CUDA graphs)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_prefetch_graphs_replay_the_eager_prefetch():
    """The CUDA graphs of the prefetch (one per padded size, replayed) give the slots, rows, state
    and counters of the same prefetch run op by op."""
    from dreamshard.streams import table_bags

    t = stream_table(60_000, 5.0, "zipf:0.9")
    batches = [table_bags(t, 1000 + 37 * s, s)[1].cuda() for s in range(12)]  # sizes across several padded ones
    C = 3 * max(int(torch.unique(b).numel()) for b in batches)
    g = torch.Generator().manual_seed(3)
    host, state = torch.rand(t.rows, 8, generator=g).cuda(), torch.rand(t.rows, generator=g).cuda()
    caches = [RowCache(host.clone(), torch.zeros(C + 1, 8, device="cuda"), state.clone(), torch.zeros(C + 1, device="cuda"), graphs=graphs)
              for graphs in (False, True)]
    for b in batches:
        slots = [c.prefetch(b) for c in caches]
        assert torch.equal(slots[0], slots[1])
        for c, s in zip(caches, slots):
            c.cache[s] += 1.0
            c.cache_state[s] += 0.5
    assert caches[1]._captured, "no graph captured"
    a, b = caches
    assert torch.equal(a.table(), b.table()) and torch.equal(a.state(), b.state())
    assert (a.misses, a.evictions, a.lookups) == (b.misses, b.evictions, b.lookups) and a.evictions > 0


def test_row_cache_reports_a_batch_it_cannot_hold():
    """The prefetch does not read the GPU, so a batch of more distinct rows than slots is found
    out when the counters are read: they raise, saying the cache is too small."""
    cache = RowCache(torch.zeros(100, 2), torch.zeros(9, 2))  # 8 slots and the spare row
    cache.prefetch(torch.arange(6))
    assert cache.misses == 6 and cache.evictions == 0
    cache.prefetch(torch.arange(10, 22))
    with pytest.raises(RuntimeError, match="larger cache ratio"):
        cache.hit_rate
    # a batch that hits rows it holds and misses more than the other slots: the rows without a
    # slot go to the spare row, within the cache (no index past it on any device), and it is reported
    cache = RowCache(torch.zeros(100, 2), torch.zeros(9, 2))
    cache.prefetch(torch.arange(6))
    slots = cache.prefetch(torch.cat([torch.arange(6), torch.arange(40, 50)]))
    assert int(slots.max()) <= 8
    with pytest.raises(RuntimeError, match="larger cache ratio"):
        cache.misses


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_move_rows_stops_at_its_lists_end_whatever_the_count():
    """The prefetch's copy kernel reads how many rows to move from GPU memory; a batch of more
    misses than the cache's slots makes that count larger than its index lists, and the kernel
    must stop at their end (it once read past it: an illegal address)."""
    from dreamshard.costs.kernels.tiered import _move_rows

    src = torch.arange(40.0, device="cuda").view(20, 2)
    dst = torch.zeros(6, 2, device="cuda")
    src_idx = torch.tensor([3, 5, -1], device="cuda")
    dst_idx = torch.tensor([0, 4, 2], device="cuda")
    _move_rows(src, src_idx, dst, dst_idx, torch.tensor([1000], device="cuda"))
    torch.cuda.synchronize()
    want = torch.zeros(6, 2)
    want[0], want[4] = torch.tensor([6.0, 7.0]), torch.tensor([10.0, 11.0])
    assert torch.equal(dst.cpu(), want)


def test_row_cache_moves_rows_and_state():
    """Evicted rows (and their Adagrad state) are written back, missing ones loaded, repeats in a
    batch share one slot: the cache's view of the table is the table after every prefetch."""
    g = torch.Generator().manual_seed(5)
    host, state = torch.rand(64, 3, generator=g), torch.rand(64, generator=g)
    want, want_state = host.clone(), state.clone()
    cache = RowCache(host, torch.zeros(11, 3), state, torch.zeros(11))
    for step in range(12):
        b = torch.randint(0, 64, (14,), generator=g) % (7 + step % 3) + (step * 5) % 50
        slots = cache.prefetch(b)
        assert torch.equal(cache.slot_row[slots], b)
        cache.cache[slots] += 1.0  # what a backward does to the cached rows (once a row: repeated slots write once)
        cache.cache_state[slots] += 0.5
        u = torch.unique(b)
        want[u] += 1.0
        want_state[u] += 0.5
        assert torch.equal(cache.table(), want) and torch.equal(cache.state(), want_state)
    assert cache.evictions > 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_prefetch_and_forward_never_wait_for_the_gpu():
    """The tiered forward, given its lookup ranges (as the runners give them), queues its work
    without a host sync once its prefetch graphs are captured: torch's sync debug mode raises at any sync."""
    from dreamshard.streams import shard_batch

    tables = [stream_table(200_000, 4.0, "zipf:1.0"), stream_table(50_000, 2.0, "uniform"), stream_table(80_000, 1.0, "zipf:0.8")]
    tbe = TieredTBE("triton", [t.rows for t in tables], [t.dim for t in tables], [Tier("uvm_caching", 0.3), Tier("hbm"), Tier("uvm")], device="cuda")
    batches = [shard_batch(tables, 2048, step=s, device="cuda") for s in range(4)] * 2  # the first pass captures the prefetch's graphs
    for i, (ix, off) in enumerate(batches):
        bounds = off[::2048].tolist()
        if i >= 4:
            torch.cuda.set_sync_debug_mode("error")
        try:
            tbe.forward(ix, off, bounds)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        tbe.backward(torch.zeros(2048, tbe.total_dim, dtype=tbe.dtype, device="cuda"))
    assert 0 < tbe.cache_stats()[0]["misses"] <= tbe.cache_stats()[0]["lookups"]


def test_hit_rate_edges():
    t = stream_table(10_000, 2.0, "zipf:1.0")
    assert hit_rate(t, t.rows, 4096) == 1.0  # every row fits
    U = expected_unique(t, 4096)
    repeats = 1 - U / (4096 * 2.0)  # a batch's repeats hit even where the cache holds almost nothing of it
    assert repeats <= hit_rate(t, 1, 4096) < repeats + 0.01
    rates = [hit_rate(t, c, 4096) for c in (1, 500, 0.5 * U, 3000, 5000, 8000)]
    assert rates == sorted(rates)


# ------------------------------------------------------------------------------------------------
# tasks, plans, validation
# ------------------------------------------------------------------------------------------------


def tight_task(host: int = 10**10, devices: int = 2, batch: int = 1024):
    """Tables of ~1.5x the devices' HBM, a small batch (so caches of a batch's rows are small)."""
    from dreamshard.bins import reuse_bins
    from dreamshard.tasks import Task, Workload

    rng = np.random.default_rng(0)
    tables = []
    for i in range(16):
        rows = int(rng.choice([2_000, 50_000, 400_000]))
        pf, dist = float(rng.choice([0.5, 2.0, 8.0])), f"zipf:{rng.choice([0.8, 1.0, 1.2])}"
        tables.append(TableSpec(f"t{i}", rows, int(rng.choice([16, 32, 64])), pf, tuple(reuse_bins(rows, pf, dist)), distribution=dist, seed=i))
    w = Workload(batch_size=batch)
    total = sum(t.bytes() for t in tables)
    return Task(tables, devices, int(total / 1.5 / devices), w, host_memory_bytes=host)


@pytest.mark.parametrize("planner", ["size_lookup", "lookup", "random", "dreamshard", "neuroshard"])
def test_planners_choose_tiers_when_tables_do_not_fit(planner):
    from dreamshard.planners import get_planner

    task = tight_task()
    plan = get_planner(planner).plan(task)
    plan.check()
    assert plan.has_tiers() and any(s.tier == "uvm_caching" for s in plan.shards)
    assert max(plan.device_bytes()) <= task.max_memory_bytes
    assert max(plan.device_host_bytes()) <= task.host_memory_bytes
    assert any("tiers:" in n for n in plan.notes)
    by_name = {task.tables[s.table].name: s for s in plan.shards}
    hot = max(task.tables, key=lambda t: t.pooling_factor / t.rows)
    assert by_name[hot.name].tier == "hbm", "the hottest bytes stay in HBM"


def test_tables_that_fit_stay_in_hbm_and_no_host_memory_says_so():
    from dreamshard.packing import InfeasibleError
    from dreamshard.planners import get_planner

    task = tight_task()
    roomy = type(task)(task.tables, task.devices, task.max_memory_bytes * 4, task.workload, host_memory_bytes=task.host_memory_bytes)
    assert not get_planner("size_lookup").plan(roomy).has_tiers()
    none = type(task)(task.tables, task.devices, task.max_memory_bytes, task.workload)
    with pytest.raises(InfeasibleError, match="--host-memory"):
        get_planner("size_lookup").plan(none)
    small_host = type(task)(task.tables, task.devices, task.max_memory_bytes, task.workload, host_memory_bytes=1000)
    with pytest.raises(InfeasibleError, match="host memory"):
        get_planner("size_lookup").plan(small_host)


def test_plan_file_round_trip_and_strict_reading(tmp_path):
    from dreamshard.plan import load_plans, save_plans
    from dreamshard.planners import get_planner
    from dreamshard.validation import PlanError

    plan = get_planner("size_lookup").plan(tight_task())
    save_plans([plan], tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["format"] == "dreamshard.plan/4" and d["host_memory_bytes"] == plan.task.host_memory_bytes
    back = load_plans(tmp_path / "p.json")[0]
    assert [(s.tier, s.cache_ratio) for s in back.shards] == [(s.tier, s.cache_ratio) for s in plan.shards]
    assert back.device_bytes() == plan.device_bytes() and back.device_host_bytes() == plan.device_host_bytes()

    def refused(edit, match):
        doc = json.loads((tmp_path / "p.json").read_text())
        edit(doc)
        (tmp_path / "q.json").write_text(json.dumps(doc))
        with pytest.raises(PlanError, match=match):
            load_plans(tmp_path / "q.json")

    cached = next(i for i, t in enumerate(d["tables"]) if t["shards"][0].get("tier") == "uvm_caching")
    refused(lambda doc: doc["tables"][cached]["shards"][0].update(tier="ssd"), "not one of hbm, uvm, uvm_caching")
    refused(lambda doc: doc["tables"][cached]["shards"][0].update(cache_ratio=1.5), "cache_ratio.*over the limit")
    refused(lambda doc: doc["tables"][cached]["shards"][0].update(cache_ratio="0.1"), "cache_ratio.*string")
    refused(lambda doc: doc["tables"][cached]["shards"][0].update(tier="uvm_caching", cache_ratio=0), "cache_ratio.*must be >= 1e-09")
    refused(lambda doc: doc["tables"][0]["shards"][0].update(tier="hbm", cache_ratio=0.5), "only a uvm_caching shard has a cache")
    refused(lambda doc: doc.update(host_memory_bytes=10), "in host memory, over its host_memory_bytes")
    refused(lambda doc: doc.update(host_memory_bytes=-1), "host_memory_bytes.*must be >= 0")
    refused(lambda doc: doc.update(format="dreamshard.plan/3"), "plans with tiers are dreamshard.plan/4")


def test_old_plans_load_unchanged(tmp_path):
    """A plan without tiers is written as before (/2) and every shard of a plan file without tiers is in HBM."""
    from dreamshard.plan import load_plans, save_plans
    from dreamshard.planners import get_planner

    task = tight_task()
    roomy = type(task)(task.tables, task.devices, task.max_memory_bytes * 4, task.workload)
    save_plans([get_planner("size_lookup").plan(roomy)], tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["format"] == "dreamshard.plan/2" and "host_memory_bytes" not in d and all("tier" not in s for t in d["tables"] for s in t["shards"])
    assert all(s.tier == "hbm" for s in load_plans(tmp_path / "p.json")[0].shards)


def test_task_file_host_memory(tmp_path):
    from dreamshard.tasks import load_tasks, save_tasks
    from dreamshard.validation import TaskError

    task = tight_task()
    (tmp_path / "tables.csv").write_text("")
    from dreamshard.tables import save_tables

    save_tables(task.tables, tmp_path / "tables.csv")
    task.pool = str(tmp_path)
    save_tasks([task], tmp_path / "t.jsonl")
    assert load_tasks(tmp_path / "t.jsonl")[0].host_memory_bytes == task.host_memory_bytes
    line = json.loads((tmp_path / "t.jsonl").read_text())
    for bad, match in ((-5, "must be >= 0"), ("1GB", "string"), (1.5, "not an integer")):
        (tmp_path / "b.jsonl").write_text(json.dumps({**line, "host_memory_bytes": bad}) + "\n")
        with pytest.raises(TaskError, match=match):
            load_tasks(tmp_path / "b.jsonl")


# ------------------------------------------------------------------------------------------------
# the simulator's price
# ------------------------------------------------------------------------------------------------


def test_simulator_prices_host_tiers():
    from dataclasses import replace

    from dreamshard.costs.sim import SimBackend
    from dreamshard.plan import Plan

    task = tight_task()
    roomy = type(task)(task.tables, task.devices, task.max_memory_bytes * 4, task.workload, host_memory_bytes=task.host_memory_bytes)
    base = Plan.table_wise(roomy, [i % 2 for i in range(len(task.tables))], "test")
    sim = SimBackend()
    hbm = sim.evaluate_plan(base)
    big = max(range(len(task.tables)), key=lambda i: task.tables[i].rows * task.tables[i].pooling_factor)

    def moved(tier, ratio=0.0):
        shards = [replace(s, tier=tier, cache_ratio=ratio) if s.table == big else s for s in base.shards]
        return sim.evaluate_plan(Plan(roomy, shards, "test"))

    uvm, small, large = moved("uvm"), moved("uvm_caching", 0.3), moved("uvm_caching", 0.9)
    d = base.shards[big].device
    h, lg, sm, u = (r.devices[d].total_ms for r in (hbm, large, small, uvm))
    assert h < min(lg, sm, u), (h, lg, sm, u)
    # a larger cache misses less: fewer bytes over the link (its prefetch's work per slot may still cost more)
    assert large.details["tiers"]["host_link_bytes"][d] <= small.details["tiers"]["host_link_bytes"][d]
    free = SimBackend()
    free.host_link = replace(free.host_link, prefetch_ms_per_mslot=0.0)
    assert free.evaluate_plan(Plan(roomy, [replace(s, tier="uvm_caching", cache_ratio=0.9) if s.table == big else s for s in base.shards], "test")).devices[d].total_ms <= sm
    assert uvm.details["tiers"]["host_link_bytes"][d] > 0 and large.details["tiers"]["cached_shards"][0]["predicted_hit_rate"] > 0.5
    # a per-miss term prices the smaller cache's extra misses: L·(1 − h) more of them, at its rate
    missy = SimBackend()
    missy.host_link = replace(missy.host_link, prefetch_ms_per_mmiss=1.0)
    cached = [replace(s, tier="uvm_caching", cache_ratio=0.3) if s.table == big else s for s in base.shards]
    t = task.tables[big]
    h_small = small.details["tiers"]["cached_shards"][0]["predicted_hit_rate"]
    extra = missy.evaluate_plan(Plan(roomy, cached, "test")).devices[d].fwd_comp_ms - small.devices[d].fwd_comp_ms
    assert extra == pytest.approx(task.workload.batch_size * t.pooling_factor * (1 - h_small) / 1e6, rel=1e-2)  # h as rounded in the details
    assert hbm.details.get("tiers") is None


def test_calibration_host_entry_is_checked(tmp_path):
    from dreamshard.costs.sim import Calibration, SimBackend
    from dreamshard.validation import DataError

    cal = Calibration.load()
    cal.host = {"link_GBps": 50.0, "source": "measured"}
    cal.save(tmp_path / "c.json")
    assert SimBackend(tmp_path / "c.json").host_link.link_GBps == 50.0
    cal.host = {"row_GBps": {"64": 40.0, "256": 20.0}, "prefetch_fixed_ms": 0.02, "cache_ms_per_mlookup": 0.4}  # the first entries' name kept
    cal.save(tmp_path / "r.json")
    link = SimBackend(tmp_path / "r.json").host_link
    assert (link.rate_GBps(64), link.rate_GBps(128), link.rate_GBps(512), link.rate_GBps(32)) == (40.0, 30.0, 20.0, 40.0)
    assert link.prefetch_fixed_ms == 0.02 and link.prefetch_ms_per_mlookup == 0.4 and type(link).from_json(link.to_json()) == link
    cal.host = {"link_GBps": "fast"}
    cal.save(tmp_path / "d.json")
    with pytest.raises(DataError, match="host.link_GBps"):
        Calibration.load(tmp_path / "d.json")


# ------------------------------------------------------------------------------------------------
# TorchRec
# ------------------------------------------------------------------------------------------------


def test_torchrec_sharding_plan_carries_tiers():
    pytest.importorskip("torchrec")
    from dreamshard.planners import get_planner
    from dreamshard.torchrec_io import plan_from_torchrec, to_sharding_plan, torchrec_shardings

    plan = get_planner("size_lookup").plan(tight_task())
    kinds = {name: s["compute_kernel"] for name, s in torchrec_shardings(plan).items()}
    tiers = {plan.task.tables[s.table].name: s for s in plan.shards}
    for name, kernel in kinds.items():
        assert kernel == {"hbm": "fused", "uvm": "fused_uvm", "uvm_caching": "fused_uvm_caching"}[tiers[name].tier]
    sp = to_sharding_plan(plan)
    ps = sp.plan[""][next(n for n, s in tiers.items() if s.tier == "uvm_caching")]
    assert str(ps.compute_kernel) == "fused_uvm_caching" and ps.cache_params.load_factor == tiers[ps.sharding_spec and next(n for n, s in tiers.items() if s.tier == "uvm_caching")].cache_ratio
    back = plan_from_torchrec(sp, plan.task)
    assert [(s.device, s.tier, s.cache_ratio) for s in back.shards] == [(s.device, s.tier, s.cache_ratio) for s in plan.shards]


def test_torchrec_peer_plans_with_uvm_caching():
    pytest.importorskip("torchrec")
    from dreamshard.costs.sim import SimBackend
    from dreamshard.planners import get_planner

    task = tight_task(devices=2, batch=1024)
    task = type(task)(task.tables, task.devices, int(task.max_memory_bytes * 1.05), task.workload, host_memory_bytes=task.host_memory_bytes)
    plan = get_planner("torchrec", reservation=0.0).plan(task)
    plan.check()
    assert any(s.tier == "uvm_caching" for s in plan.shards)
    assert SimBackend().evaluate_plan(plan).overall_ms > 0


# ------------------------------------------------------------------------------------------------
# the sequential runner and the command line
# ------------------------------------------------------------------------------------------------


def test_sequential_runner_measures_a_mixed_tier_plan():
    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.planners import get_planner

    plan = get_planner("size_lookup").plan(tight_task())
    report = SequentialRunner("torch", device="cpu", warmup=1, iters=2, input_sets=2).evaluate_plan(plan, batch_size=256, precision="fp32")
    assert all(d.fwd_comp_ms > 0 for d, n in zip(report.devices, [len(t) for t in plan.device_tables()]) if n)
    stats = report.details["tiers"]["cached_tables"]
    assert stats and all(0 <= s["hit_rate"] <= 1 and s["lookups"] > 0 for s in stats)


def test_sequential_runner_measures_caches_smaller_than_a_batch():
    """A plan whose caches cannot hold a batch's rows (TorchRec's planner makes such): measured, the
    overflow served from host memory, not refused."""
    from dataclasses import replace

    from dreamshard.costs.runners import SequentialRunner
    from dreamshard.planners import get_planner

    plan = get_planner("size_lookup").plan(tight_task())
    plan = replace(plan, shards=[replace(s, cache_ratio=0.001) if s.tier == "uvm_caching" else s for s in plan.shards])
    assert any(s.tier == "uvm_caching" for s in plan.shards)
    report = SequentialRunner("torch", device="cpu", warmup=1, iters=2, input_sets=2).evaluate_plan(plan, batch_size=256, precision="fp32")
    assert report.overall_ms > 0 and report.details["tiers"]["cached_tables"]


def test_cli_plan_and_measure_with_host_memory(tmp_path):
    from cli_helpers import invoke, one_line_error

    from dreamshard.tables import save_tables

    task = tight_task()
    save_tables(task.tables, tmp_path / "tables.csv")
    cap = str(task.max_memory_bytes)
    r = invoke("plan", tmp_path / "tables.csv", "--devices", 2, "--max-memory", cap, "--host-memory", "10GB", "--out", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    assert "in host memory behind an HBM cache" in r.output.replace("\n", " ")
    r = invoke("measure", tmp_path / "p.json", "--backend", "sim")
    assert r.exit_code == 0, r.output
    err = one_line_error(invoke("measure", tmp_path / "p.json", "--backend", "torch", "--runner", "distributed", "--batch-size", 64))
    assert "host memory" in err and "sequential runner" in err
    err = one_line_error(invoke("plan", tmp_path / "tables.csv", "--devices", 2, "--max-memory", cap, "--out", tmp_path / "q.json"))
    assert "--host-memory" in err
    err = one_line_error(invoke("plan", tmp_path / "tables.csv", "--devices", 2, "--max-memory", cap, "--host-memory", "lots", "--out", tmp_path / "q.json"))
    assert "lots" in err


def test_caches_grow_into_the_hbm_a_device_has_left():
    """After placement each device's free HBM goes to its host-tier shards (tier_stage.grow_caches)."""
    from dataclasses import replace

    from dreamshard.costs.sim import SimBackend
    from dreamshard.plan import Plan
    from dreamshard.planners import get_planner
    from dreamshard.tier_stage import grow_caches

    plan = get_planner("size_lookup").plan(tight_task(batch=8192))  # a batch whose misses pay for more slots (tiers.SLOT_LINK_BYTES)
    roomier = Plan(replace(plan.task, max_memory_bytes=int(plan.task.max_memory_bytes * 1.3)), plan.shards, plan.planner)
    grown, changed = grow_caches(roomier)
    assert changed > 0
    grown.check()
    before = {(s.table, s.start, s.row_start): s for s in roomier.shards}
    for s in grown.shards:
        old = before[(s.table, s.start, s.row_start)]
        if old.tier == "hbm":
            assert s.tier == "hbm"
        elif old.tier == "uvm_caching":  # a cache only grows (or its shard moves into HBM)
            assert s.tier == "hbm" or (s.tier == "uvm_caching" and s.cache_ratio >= old.cache_ratio)
    sim = SimBackend()
    assert sim.evaluate_plan(grown).overall_ms <= sim.evaluate_plan(roomier).overall_ms + 1e-9
