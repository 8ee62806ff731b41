"""Memory tiers (docs/tiers.md): the tiered TBE against the float64 reference (CPU here; CUDA in
tests marked gpu), the cache hit rate predicted from the reuse bins against an LRU simulation of
actual index streams, the tier stage in the planners, plan files, validation, the simulator's
price, TorchRec's kernels and the sequential runner on mixed-tier plans."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from test_kernels import DTYPE, TOL_FWD, TOL_UPD, random_batch, random_shard, reference_forward, reference_update, rel

from dreamshard.costs.kernels.tiered import RowCache, TieredTBE
from dreamshard.tables import TableSpec
from dreamshard.tiers import Tier, hit_rate, simulate_lru

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


def random_tiers(rng: np.random.Generator, rows: list[int], batch: int) -> list[Tier]:
    """Every tier at least once where there are tables enough; caches that hold a batch (8 lookups a
    bag at most) but not the table, so rows are evicted and written back."""
    kinds = ["uvm_caching", "uvm", "hbm"] + [str(rng.choice(["hbm", "uvm", "uvm_caching"])) for _ in rows[3:]]
    out = []
    for r, k in zip(rows, kinds):
        ratio = min(1.0, (8 * batch + 1) / r) if k == "uvm_caching" else 0.0
        out.append(Tier(k, ratio))
    return out


def check_tiered(kernel: str, precision: str, optimizer: str, seed: int, device: str = "cpu", steps: int = 3) -> TieredTBE:
    rng = np.random.default_rng(seed)
    rows, dims = random_shard(rng, 6, 300)
    rows = [max(r, 40) for r in rows]
    batch = int(rng.integers(2, 9))
    tiers = random_tiers(rng, rows, batch)
    lr, eps = 0.05, 1e-8
    tbe = TieredTBE(kernel, rows, dims, tiers, precision=precision, optimizer=optimizer, lr=lr, eps=eps, device=device, seed=seed)
    tbe.poison_outputs = True
    for inner in tbe.inner:
        if inner is not None:
            inner.poison_outputs = True
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
        for t in range(len(rows)):
            w_new = tbe.weights(t).detach().double().cpu()
            upd, ref_upd = w_new - w_old[t].double().cpu(), ref_w[t] - w_old[t].double().cpu()
            touched = ref_upd.abs().sum(dim=1) > 0
            assert torch.equal(w_new[~touched], w_old[t].double().cpu()[~touched]), f"table {t} ({tiers[t].kind}): rows without lookups changed"
            if touched.any():
                err = rel(upd, ref_upd)
                assert err < TOL_UPD[precision], f"tiered {kernel} {optimizer} update of table {t} ({tiers[t].kind}) rel err {err:.2e} at step {step}"
            if states is not None:
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
def test_host_mapped_memory_is_host_memory_on_the_gpu():
    from dreamshard.costs.kernels.tiered import host_mapped

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


def test_row_cache_is_the_simulated_lru():
    """The kernels' cache (RowCache, torch ops) hits as the reference simulation does."""
    from dreamshard.streams import table_bags

    t = stream_table(50_000, 4.0, "zipf:1.0")
    batches = [table_bags(t, 2048, s)[1] for s in range(8)]
    C = 3 * max(int(torch.unique(b).numel()) for b in batches)
    host = torch.zeros(t.rows, 4)
    cache = RowCache(host, torch.zeros(C, 4))
    for i, b in enumerate(batches):
        if i == 2:
            cache.reset_stats()
        slots = cache.prefetch(b)
        assert torch.equal(cache.slot_row[slots], b)  # every lookup maps to the slot holding its row
    assert abs(cache.hit_rate - simulate_lru([b.numpy() for b in batches], C, t.rows, warmup=2)) < 0.01


def test_hit_rate_edges():
    t = stream_table(10_000, 2.0, "zipf:1.0")
    assert hit_rate(t, t.rows, 4096) == 1.0  # every row fits
    assert hit_rate(t, 1, 4096) == 0.0  # a cache that cannot hold a batch does not run
    rates = [hit_rate(t, c, 4096) for c in (3000, 5000, 8000)]
    assert rates == sorted(rates)
