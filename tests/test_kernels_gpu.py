"""TBE kernels on CUDA (torch and triton) against the float64 reference of tests/test_kernels.py.

Run on a GPU machine: ``PYTHONPATH=. python3 -m pytest -q -m gpu tests/test_kernels_gpu.py``.
Skipped where CUDA is absent (CI).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_kernels import check_kernel, check_product_rounds, random_batch, rel  # noqa: E402  (tests/ is on sys.path under pytest)

from dreamshard.costs.kernels import available_kernels, make_tbe  # noqa: E402

GPU_KERNELS = [k for k in ("torch", "triton") if k in available_kernels("cuda")]


def test_triton_is_available_on_cuda():
    assert "triton" in available_kernels("cuda"), "triton should run wherever CUDA and the triton package are"


@pytest.mark.parametrize("kernel", GPU_KERNELS)
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kernel_matches_reference_cuda(kernel, precision, optimizer, seed):
    check_kernel(kernel, precision, optimizer, seed=seed * 100 + 11, device="cuda")


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_triton_hot_rows(precision, optimizer):
    # few rows, many lookups: on the sorted path runs of one row span many tiles (summed in the
    # levels above); on the product path every table is a count matrix times its gradient
    stats = check_kernel("triton", precision, optimizer, seed=77, device="cuda", max_rows=40, batch=2048, bwd_dense=0)
    assert stats["crossing_rows"] > 0 and stats["dense_tables"] == 0
    stats = check_kernel("triton", precision, optimizer, seed=77, device="cuda", max_rows=40, batch=2048, bwd_dense=float("inf"))
    assert stats["dense_tables"] > 0 and stats["tiles"] == 0
    # both paths in one backward (tables of up to 30 rows counted, the others sorted)
    stats = check_kernel("triton", precision, optimizer, seed=15, device="cuda", max_rows=60, batch=3000,
                         bwd_dense=float("inf"), bwd_dense_rows=30)
    assert stats["dense_tables"] > 0 and stats["tiles"] > 0


@pytest.mark.parametrize("precision,optimizer", [("fp16", "sgd"), ("fp32", "rowwise_adagrad"), ("fp16", "rowwise_adagrad")])
def test_triton_small_tiles(precision, optimizer):
    # 16-lookup tiles at every level: hot rows cross many tiles and are summed over several levels ...
    stats = check_kernel("triton", precision, optimizer, seed=78, device="cuda", max_rows=30, batch=64, bwd_dense=0,
                         fwd_lanes=16, fwd_unroll=2, bwd_lanes=16, bwd_pmax=16, bwd_up_lanes=16)
    assert stats["crossing_rows"] > 0 and stats["levels"] >= 3
    # ... and 16-column blocks
    stats = check_kernel("triton", precision, optimizer, seed=79, device="cuda", max_rows=30, batch=64, bwd_dense=0,
                         bwd_lanes=16, bwd_pmax=16, bwd_up_lanes=16, bwd_max_tw=16)
    assert stats["crossing_rows"] > 0


REGIMES = {  # (rows, mean lookups per bag): hits per touched row ~1, ~10s, ~1000s, and rows over many tiles (several levels)
    "cold": (500_000, 3),
    "warm": (20_000, 8),
    "hot": (50, 30),
    "split": (3, 60),
}


def _regime_batch(rng, rows, pooling, batch, device, zipf):
    lengths = rng.poisson(pooling, size=batch)
    n = int(lengths.sum())
    ranks = np.minimum(rng.zipf(1.2, size=n) - 1, rows - 1) if zipf else rng.integers(0, rows, size=n)
    offsets = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return torch.from_numpy(ranks.astype(np.int64)).to(device), torch.from_numpy(offsets).to(device)


PATHS = {"sorted": dict(bwd_dense=0), "product": dict(bwd_dense=float("inf"), bwd_dense_rows=1 << 20)}


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("dim", [4, 12, 24, 48, 64, 96, 192, 320, 384, 1000, 1024])
@pytest.mark.parametrize("precision,optimizer", [("fp16", "sgd"), ("fp32", "rowwise_adagrad")])
@pytest.mark.parametrize("path", list(PATHS))
def test_triton_regimes_and_dims(regime, dim, precision, optimizer, path):
    """One table per case against the float64 reference: every run-length regime x every dim class,
    on each backward path (the product path where its count matrix is small enough)."""
    from test_kernels import DTYPE, TOL_FWD, TOL_UPD, reference_forward, reference_update

    from dreamshard.costs.kernels.triton_tbe import TritonTBE

    rows, pooling = REGIMES[regime]
    if path == "product" and regime == "cold":
        pytest.skip("a 500k-row count matrix is past the product path's memory cap: the sorted path's case")
    rng = np.random.default_rng(zlib.crc32(f"{regime}{dim}{precision}".encode()))
    batch = 4096
    indices, offsets = _regime_batch(rng, rows, pooling, batch, "cuda", zipf=regime != "cold")
    lr, eps = 0.05, 1e-8
    tbe = TritonTBE([rows], [dim], precision=precision, optimizer=optimizer, lr=lr, eps=eps, device="cuda", seed=3, **PATHS[path])
    tbe.poison_outputs = True
    w0 = (torch.rand(rows, dim, device="cuda", dtype=torch.float64) * 2 - 1).to(DTYPE[precision])
    tbe.set_weights(0, w0)
    out = tbe.forward(indices, offsets)
    grad = torch.randn(batch, dim, device="cuda", dtype=torch.float64).to(DTYPE[precision])
    tbe.backward(grad)
    # the reference on the touched rows only (a 2M-row float64 table would be slow on the host)
    touched = torch.unique(indices)
    local = torch.searchsorted(touched, indices)
    states = [torch.zeros(touched.numel(), dtype=torch.float64)] if optimizer != "sgd" else None
    ref_w, _ = reference_update([w0[touched]], states, local, offsets, batch, grad, optimizer, lr, eps)
    assert rel(out, reference_forward([w0[touched]], local, offsets, batch)) < TOL_FWD[precision]
    w_new = tbe.weights(0)
    upd, ref_upd = w_new[touched].double().cpu() - w0[touched].double().cpu(), ref_w[0] - w0[touched].double().cpu()
    assert rel(upd, ref_upd) < TOL_UPD[precision], f"{regime} dim {dim}: {tbe.last_backward_stats}"
    untouched = torch.ones(rows, dtype=torch.bool, device="cuda")
    untouched[touched] = False
    assert torch.equal(w_new[untouched], w0[untouched]), "rows without lookups changed"
    assert tbe.last_backward_stats["dense_tables"] == (path == "product")
    if regime == "split" and path == "sorted":
        assert tbe.last_backward_stats["crossing_rows"] > 0


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_triton_larger_tables(optimizer):
    check_kernel("triton", "fp16", optimizer, seed=9, device="cuda", max_tables=6, max_rows=50_000, batch=4096, steps=3)


def test_triton_product_path_in_rounds():
    check_product_rounds("cuda")


@pytest.mark.parametrize("narrow", [(64, 4), (16, 2)])
def test_triton_narrow_tile_shapes(narrow):
    """Column blocks of <= 32 columns in tiles of other lengths and warps than the default 32 and 1."""
    for seed, (precision, optimizer) in enumerate([("fp16", "sgd"), ("fp32", "rowwise_adagrad")]):
        check_kernel("triton", precision, optimizer, seed=90 + seed, device="cuda", max_rows=3000, batch=256, bwd_dense=0,
                     bwd_narrow_pmax=narrow[0], bwd_narrow_warps=narrow[1])


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_triton_int32_offsets_match_int64(optimizer):
    """The tiles' int32 addressing (where every offset fits) sums in the same order as int64: the
    same weights, bit for bit, on tables of every regime and a masked dim."""
    from dreamshard.costs.kernels.triton_tbe import TritonTBE

    rng = np.random.default_rng(4)
    rows, dims = [500_000, 20_000, 50, 3], [128, 12, 64, 320]
    indices, offsets = random_batch(rng, rows, 2048, "cuda", empty_table=None)
    grad = torch.randn(2048, sum(dims), device="cuda").half()
    results = []
    for i32 in (True, False):
        tbe = TritonTBE(rows, dims, optimizer=optimizer, device="cuda", seed=1, bwd_dense=0, bwd_i32=i32)
        tbe.forward(indices, offsets)
        tbe.backward(grad)
        results.append([tbe.weights(t).clone() for t in range(4)])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dense", [0, float("inf")])
def test_triton_is_deterministic(dense):
    from dreamshard.costs.kernels.triton_tbe import TritonTBE

    rng = np.random.default_rng(3)
    rows, dims = [1000, 50, 20000, 7], [64, 12, 128, 320]
    indices, offsets = random_batch(rng, rows, 1024, "cuda", empty_table=None)
    grad = torch.randn(1024, sum(dims), device="cuda").half()
    results = []
    for _ in range(2):
        tbe = TritonTBE(rows, dims, optimizer="rowwise_adagrad", device="cuda", seed=1, bwd_dense=dense)
        tbe.forward(indices, offsets)
        tbe.backward(grad)
        results.append([tbe.weights(t).clone() for t in range(4)])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_triton_matches_torch_on_cuda():
    rng = np.random.default_rng(4)
    rows, dims = [3000, 70, 100_000, 9], [32, 20, 128, 4]
    indices, offsets = random_batch(rng, rows, 2048, "cuda", empty_table=3)
    grad = torch.randn(2048, sum(dims), device="cuda").half()
    tri = make_tbe("triton", rows, dims, device="cuda", seed=2)
    ref = make_tbe("torch", rows, dims, device="cuda", seed=2)
    for t in range(len(rows)):
        assert torch.equal(tri.weights(t), ref.weights(t))  # same seeded init on one device
    assert rel(tri.forward(indices, offsets), ref.forward(indices, offsets)) < 2e-3
    tri.backward(grad)
    ref.backward(grad)
    for t in range(len(rows)):
        assert rel(tri.weights(t), ref.weights(t)) < 2e-3


@pytest.mark.parametrize("dense", [0, float("inf")])
def test_triton_step_never_waits_for_the_gpu(dense):
    # A synchronising call in the step would stall the host and idle the GPU in training (and make
    # timings include host time). The first step builds the cached forward grid; the next must not sync.
    from dreamshard.costs.kernels.triton_tbe import TritonTBE

    rng = np.random.default_rng(5)
    rows, dims = [500, 40, 9000, 3], [64, 12, 128, 192]
    tbe = TritonTBE(rows, dims, optimizer="rowwise_adagrad", device="cuda", seed=1, bwd_dense=dense)
    grad = torch.randn(512, sum(dims), device="cuda").half()
    for step in range(3):
        indices, offsets = random_batch(rng, rows, 512, "cuda", empty_table=None)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if step else "default")
        try:
            tbe.forward(indices, offsets)
            tbe.backward(grad)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert tbe.last_backward_stats["lookups"] == indices.numel()
    assert (tbe.last_backward_stats["dense_tables"] > 0) == (dense > 0)
