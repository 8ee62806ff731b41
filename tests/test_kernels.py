"""TBE kernels against a float64 reference written here (CPU: torch, fbgemm when it loads).

Every check draws fresh random shards and batches: mixed dims 4..1024 (powers of two and not),
duplicate indices (small, skewed tables), empty bags, a table with no lookups at all; both
precisions, both optimizers, two training steps (so Adagrad's state carries over).
`tests/test_kernels_gpu.py` runs the same checks on CUDA (torch and triton).
"""

from __future__ import annotations

import importlib
import os
import zlib

import numpy as np
import pytest
import torch

from dreamshard.costs.kernels import KERNELS, KernelUnavailable, available_kernels, make_tbe

CPU_KERNELS = [k for k in ("torch", "fbgemm") if k in available_kernels("cpu")]
TOL_FWD = {"fp16": 2e-3, "fp32": 1e-5}
TOL_UPD = {"fp16": 5e-3, "fp32": 1e-5}
DTYPE = {"fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny ops: intra-op threads only add sync overhead (70 ms per index_add_ on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------
# random shards and batches, and the float64 reference
# ------------------------------------------------------------------------------------------------


def random_shard(rng: np.random.Generator, max_tables: int = 6, max_rows: int = 300) -> tuple[list[int], list[int]]:
    t = int(rng.integers(2, max_tables + 1))
    dims = [int(4 * rng.integers(1, 65)) for _ in range(t)]  # multiples of 4 in [4, 256]
    dims[0] = int(rng.choice([4, 8, 16, 32, 64, 128, 256, 512, 1024]))  # at least one power of two
    if t > 2:  # and one that is not, wide ones included
        dims[1] = int(rng.choice([12, 20, 24, 44, 48, 96, 100, 192, 252, 320, 384, 1000]))
    rows = [int(rng.integers(1, max_rows)) for _ in range(t)]
    return rows, dims


def random_batch(rng: np.random.Generator, rows: list[int], batch: int, device: str | torch.device, empty_table: int | None):
    """FBGEMM-layout (indices, offsets): skewed rows (duplicates), empty bags, one table with no lookups."""
    lengths, indices = [], []
    for t, r in enumerate(rows):
        ln = rng.integers(0, 9, size=batch)
        ln[rng.random(batch) < 0.2] = 0
        if t == empty_table:
            ln[:] = 0
        n = int(ln.sum())
        hot = rng.integers(0, r, size=max(1, r // 10))
        ix = np.where(rng.random(n) < 0.5, rng.choice(hot, size=n), rng.integers(0, r, size=n))
        lengths.append(ln)
        indices.append(ix)
    lengths = np.concatenate(lengths)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return (torch.from_numpy(np.concatenate(indices).astype(np.int64)).to(device), torch.from_numpy(offsets).to(device))


def reference_forward(weights: list[torch.Tensor], indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
    """float64 sum pooling, straight from the definition."""
    idx, off = indices.cpu().long(), offsets.cpu().long()
    outs = []
    for t, w in enumerate(weights):
        w = w.cpu().double()
        o = torch.zeros(batch, w.shape[1], dtype=torch.float64)
        lengths = torch.diff(off[t * batch:(t + 1) * batch + 1])
        bag = torch.repeat_interleave(torch.arange(batch), lengths)
        pos = torch.arange(int(off[t * batch]), int(off[(t + 1) * batch]))
        o.index_add_(0, bag, w[idx[pos]])
        outs.append(o)
    return torch.cat(outs, dim=1)


def reference_update(weights, states, indices, offsets, batch, grad, optimizer, lr, eps):
    """float64 weights and Adagrad states after one fused-optimizer step (inputs upcast, not modified)."""
    idx, off, grad = indices.cpu().long(), offsets.cpu().long(), grad.cpu().double()
    new_w, new_s, col = [], [], 0
    for t, w in enumerate(weights):
        w = w.cpu().double().clone()
        d = w.shape[1]
        lengths = torch.diff(off[t * batch:(t + 1) * batch + 1])
        bag = torch.repeat_interleave(torch.arange(batch), lengths)
        pos = torch.arange(int(off[t * batch]), int(off[(t + 1) * batch]))
        g = torch.zeros_like(w)
        g.index_add_(0, idx[pos], grad[bag, col:col + d])
        touched = torch.unique(idx[pos])
        s = states[t].clone() if states is not None else None
        if optimizer == "sgd":
            w[touched] -= lr * g[touched]
        else:
            s[touched] += (g[touched] ** 2).mean(dim=1)
            w[touched] -= lr * g[touched] / (s[touched].sqrt() + eps).unsqueeze(1)
        new_w.append(w)
        new_s.append(s)
        col += d
    return new_w, (new_s if optimizer != "sgd" else None)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all(), "non-finite values (an unwritten output?)"
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def assert_updates(tbe, w_old, ref_w, precision: str, what) -> None:
    """Every table's update against the float64 reference's: rows without lookups unchanged, the
    others within TOL_UPD. `what(t)` names table t in a failure."""
    for t in range(len(w_old)):
        w_new = tbe.weights(t).detach().double().cpu()
        upd, ref_upd = w_new - w_old[t].double().cpu(), ref_w[t] - w_old[t].double().cpu()
        touched = ref_upd.abs().sum(dim=1) > 0
        assert torch.equal(w_new[~touched], w_old[t].double().cpu()[~touched]), f"{what(t)}: rows without lookups changed"
        if touched.any():
            err = rel(upd, ref_upd)
            assert err < TOL_UPD[precision], f"{what(t)}: update rel err {err:.2e}"


def check_kernel(kernel: str, precision: str, optimizer: str, seed: int, device: str | torch.device = "cpu",
                 steps: int = 2, max_tables: int = 6, max_rows: int = 300, batch: int | None = None, **kernel_kwargs) -> dict:
    rng = np.random.default_rng(seed)
    rows, dims = random_shard(rng, max_tables, max_rows)
    batch = batch or int(rng.integers(1, 48))
    lr, eps = 0.05, 1e-8
    if kernel_kwargs:  # tuning knobs of one kernel class (small tiles make every code path run on small data)
        spec = KERNELS[kernel]
        cls = getattr(importlib.import_module(spec.module), spec.cls)
        tbe = cls(rows, dims, precision=precision, optimizer=optimizer, lr=lr, eps=eps, device=device, seed=seed, **kernel_kwargs)
    else:
        tbe = make_tbe(kernel, rows, dims, precision=precision, optimizer=optimizer, lr=lr, eps=eps, device=device, seed=seed)
    tbe.poison_outputs = True
    assert (tbe.kernel, tbe.precision, tbe.optimizer, torch.device(tbe.device).type) == (kernel, precision, optimizer, torch.device(device).type)
    # fresh random weights (not only the init), so the test does not lean on the initialiser
    for t, (r, d) in enumerate(zip(rows, dims)):
        tbe.set_weights(t, (torch.rand(r, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed * 31 + t)) * 2 - 1).to(DTYPE[precision]).to(device))
    states = [torch.zeros(r, dtype=torch.float64) for r in rows] if optimizer == "rowwise_adagrad" else None
    empty_table = int(rng.integers(0, len(rows)))
    for step in range(steps):
        indices, offsets = random_batch(rng, rows, batch, device, empty_table)
        w_old = [tbe.weights(t).detach().clone() for t in range(len(rows))]
        out = tbe.forward(indices, offsets)
        assert out.shape == (batch, sum(dims)) and out.dtype == DTYPE[precision]
        ref = reference_forward(w_old, indices, offsets, batch)
        err = rel(out, ref)
        assert err < TOL_FWD[precision], f"{kernel} forward rel err {err:.2e} (step {step}, dims {dims}, rows {rows}, B {batch})"
        c0 = sum(dims[:empty_table])
        assert out[:, c0:c0 + dims[empty_table]].abs().max().item() == 0.0, "a table with no lookups must pool to 0"
        grad = torch.randn(batch, sum(dims), dtype=torch.float64, generator=torch.Generator().manual_seed(seed * 7 + step))
        grad = grad.to(DTYPE[precision])
        tbe.backward(grad.to(device))
        ref_w, states = reference_update(w_old, states, indices, offsets, batch, grad, optimizer, lr, eps)
        assert_updates(tbe, w_old, ref_w, precision, lambda t: f"{kernel} {optimizer} table {t} (dim {dims[t]}) at step {step}")
    return dict(getattr(tbe, "last_backward_stats", {}))


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kernel_matches_reference(kernel, precision, optimizer, seed):
    check_kernel(kernel, precision, optimizer, seed=seed * 1000 + zlib.crc32(f"{kernel}{precision}{optimizer}".encode()) % 997)


def test_torch_and_fbgemm_agree_on_a_larger_batch():
    if "fbgemm" not in CPU_KERNELS:
        pytest.skip("fbgemm_gpu does not load here")
    rows, dims = [5000, 300, 70_000, 40], [64, 12, 128, 4]
    outs, weights = [], []
    for kernel in ("torch", "fbgemm"):
        tbe = make_tbe(kernel, rows, dims, precision="fp16", optimizer="rowwise_adagrad", seed=3)
        r = np.random.default_rng(11)
        for _ in range(2):
            indices, offsets = random_batch(r, rows, 512, "cpu", empty_table=None)
            out = tbe.forward(indices, offsets)
            tbe.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).half())
        outs.append(out)
        weights.append([tbe.weights(t).clone() for t in range(len(rows))])
    assert rel(outs[1], outs[0]) < 2e-3
    for a, b in zip(*weights):
        assert rel(b, a) < 2e-3


def test_same_seed_same_initial_weights():
    for kernel in CPU_KERNELS:
        a = make_tbe(kernel, [50, 7], [8, 20], seed=4)
        b = make_tbe("torch", [50, 7], [8, 20], seed=4)
        c = make_tbe("torch", [50, 7], [8, 20], seed=5)
        for t in range(2):
            assert torch.equal(a.weights(t), b.weights(t))
            assert a.weights(t).abs().max() <= 0.01
        assert not torch.equal(b.weights(0), c.weights(0))


def test_registry_and_errors():
    assert set(KERNELS) == {"torch", "fbgemm", "triton"}
    cpu = available_kernels("cpu")
    assert cpu[0] == "torch" and "triton" not in cpu
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(KernelUnavailable, match="CUDA"):
            make_tbe("triton", [10], [8], device="cpu")
    with pytest.raises(ValueError, match="unknown kernel"):
        make_tbe("cutlass", [10], [8])
    with pytest.raises(ValueError, match="multiple of 4"):
        make_tbe("torch", [10], [6])
    with pytest.raises(ValueError, match="multiple of 4"):
        make_tbe("torch", [10], [1028])
    with pytest.raises(ValueError, match="precision"):
        make_tbe("torch", [10], [8], precision="bf16")
    with pytest.raises(ValueError, match="optimizer"):
        make_tbe("torch", [10], [8], optimizer="adam")
    if not torch.cuda.is_available():
        with pytest.raises(KernelUnavailable):
            make_tbe("torch", [10], [8], device="cuda")
    tbe = make_tbe("torch", [10, 3], [8, 4])
    with pytest.raises(ValueError, match="T\\*B\\+1"):
        tbe.forward(torch.zeros(0, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="forward"):
        tbe.backward(torch.zeros(1, 12))


def test_fbgemm_unavailable_is_explained(monkeypatch):
    import dreamshard.costs.kernels as k

    monkeypatch.setattr(k, "_fbgemm_problem", lambda: "fbgemm_gpu is not installed")
    assert "fbgemm" not in k.available_kernels("cpu")
    with pytest.raises(KernelUnavailable, match="fbgemm_gpu is not installed"):
        k.make_tbe("fbgemm", [10], [8])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="set TRITON_INTERPRET=1 (and install triton) to run the Triton kernel on CPU")
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_triton_interpreter(precision, optimizer):
    pytest.importorskip("triton")
    check_kernel("triton", precision, optimizer, seed=5, max_tables=4, max_rows=60, batch=12)
    # the sorted path alone (bwd_dense=0), 16-lookup tiles at every level: hot rows cross many tiles
    # and are summed over several levels
    stats = check_kernel("triton", precision, optimizer, seed=6, max_tables=4, max_rows=20, batch=16, bwd_dense=0,
                         fwd_lanes=16, fwd_unroll=2, bwd_lanes=16, bwd_pmax=16, bwd_up_lanes=16)
    assert stats["crossing_rows"] > 0 and stats["levels"] >= 2 and stats["dense_tables"] == 0
    # ... and 16-column blocks (SGD cuts every dim into blocks, the last one masked)
    stats = check_kernel("triton", precision, optimizer, seed=7, max_tables=4, max_rows=10, batch=16, bwd_dense=0,
                         bwd_lanes=16, bwd_pmax=16, bwd_up_lanes=16, bwd_max_tw=16)
    assert stats["crossing_rows"] > 0
    # ... and with int64 offsets in the tiles (int32 wherever they fit, as here)
    stats = check_kernel("triton", precision, optimizer, seed=7, max_tables=4, max_rows=10, batch=16, bwd_dense=0,
                         bwd_lanes=16, bwd_pmax=16, bwd_up_lanes=16, bwd_max_tw=16, bwd_i32=False)
    assert stats["crossing_rows"] > 0
    # the product path for every table, then beside the sorted path in one backward (tables of up to
    # 30 rows counted, the others sorted: the sorted path's lookups packed)
    stats = check_kernel("triton", precision, optimizer, seed=8, max_tables=4, max_rows=60, batch=70, bwd_dense=float("inf"))
    assert stats["dense_tables"] > 0 and stats["tiles"] == 0
    stats = check_kernel("triton", precision, optimizer, seed=15, max_tables=6, max_rows=60, batch=40,
                         bwd_dense=float("inf"), bwd_dense_rows=30, bwd_lanes=16, bwd_pmax=16, bwd_up_lanes=16)
    assert stats["dense_tables"] > 0 and stats["tiles"] > 0


def check_product_rounds(device: str) -> None:
    """A count buffer that holds one table's count matrix at a time: every table still takes the
    product path, in a round of its own, with the update right (check_kernel) and bit for bit the
    weights of one round (a table's gradient does not depend on the tables counted beside it)."""
    from dreamshard.costs.kernels.triton_tbe import TritonTBE
    from dreamshard.costs.paths import count_elems

    batch = 40
    one = int(count_elems(64, batch))  # every table of up to 64 rows, one per round
    for optimizer in ("sgd", "rowwise_adagrad"):
        stats = check_kernel("triton", "fp16", optimizer, seed=16, device=device, max_tables=4, max_rows=60, batch=batch,
                             bwd_dense=float("inf"), bwd_dense_elems=one)
        assert stats["dense_rounds"] == stats["dense_tables"] >= 2
    rng = np.random.default_rng(17)
    rows, dims = [50, 7, 60, 33], [16, 12, 24, 8]
    indices, offsets = random_batch(rng, rows, batch, device, empty_table=None)
    grad = torch.randn(batch, sum(dims), generator=torch.Generator().manual_seed(2)).half().to(device)
    weights = []
    for cap in (one, 8 * one):
        tbe = TritonTBE(rows, dims, optimizer="rowwise_adagrad", device=device, seed=1, bwd_dense=float("inf"), bwd_dense_elems=cap)
        tbe.forward(indices, offsets)
        tbe.backward(grad)
        assert tbe.last_backward_stats["dense_rounds"] == (4 if cap == one else 1)
        weights.append([tbe.weights(t).clone() for t in range(len(rows))])
    for a, b in zip(*weights):
        assert torch.equal(a, b)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="set TRITON_INTERPRET=1 (and install triton) to run the Triton kernel on CPU")
def test_triton_interpreter_product_path_in_rounds():
    pytest.importorskip("triton")
    check_product_rounds("cpu")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="set TRITON_INTERPRET=1 (and install triton) to run the Triton kernel on CPU")
def test_triton_interpreter_long_bags_stay_on_the_sorted_path():
    """fp16 counts are exact up to 2,048: a table with a longer bag is sorted, and still right; a
    table whose bag repeats one row 100 times (in several runs of the counting launch) is counted."""
    pytest.importorskip("triton")
    from dreamshard.costs.kernels.triton_tbe import DENSE_MAX_COUNT, TritonTBE

    rows, dims, batch = [8, 5], [16, 12], 3
    lengths = [[2, DENSE_MAX_COUNT + 1, 0], [4, 1, 100]]
    ix = [np.zeros(sum(lengths[0]), dtype=np.int64), np.concatenate([np.arange(5) % 5, np.full(100, 3)])]
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(np.concatenate(lengths))]))
    indices = torch.from_numpy(np.concatenate(ix))
    tbe = TritonTBE(rows, dims, device="cpu", bwd_dense=float("inf"))
    w0 = [tbe.weights(t).clone() for t in range(2)]
    tbe.forward(indices, offsets)
    grad = torch.randn(batch, sum(dims), generator=torch.Generator().manual_seed(1)).half()
    tbe.backward(grad)
    assert tbe.last_backward_stats["dense_tables"] == 1  # the second table
    ref, _ = reference_update(w0, None, indices, offsets, batch, grad, "sgd", tbe.lr, tbe.eps)
    for t in range(2):
        assert rel(tbe.weights(t) - w0[t].double(), ref[t] - w0[t].double()) < TOL_UPD["fp16"]
