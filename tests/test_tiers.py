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
