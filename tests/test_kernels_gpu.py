"""TBE kernels on CUDA (torch and triton) against the float64 reference of tests/test_kernels.py.

Run on a GPU machine: ``PYTHONPATH=. python3 -m pytest -q -m gpu tests/test_kernels_gpu.py``.
Skipped where CUDA is absent (CI).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_kernels import check_kernel, random_batch, rel  # noqa: E402  (tests/ is on sys.path under pytest)

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
    # few rows, many lookups: runs of one row span many backward slices (the fix-up path)
    stats = check_kernel("triton", precision, optimizer, seed=77, device="cuda", max_rows=40, batch=2048)
    assert stats["crossing_rows"] > 0


@pytest.mark.parametrize("precision,optimizer", [("fp16", "sgd"), ("fp32", "rowwise_adagrad")])
def test_triton_small_tiles(precision, optimizer):
    # tiny tiles: many bag blocks per table, and runs spanning many slices on small data
    stats = check_kernel("triton", precision, optimizer, seed=78, device="cuda", max_rows=30, batch=64,
                         fwd_lanes=16, fwd_unroll=2, bwd_lanes=8, bwd_pmin=2, bwd_reduce="scan")
    assert stats["crossing_rows"] > 0
    stats = check_kernel("triton", precision, optimizer, seed=79, device="cuda", max_rows=30, batch=64,
                         bwd_lanes=16, bwd_pmin=16, bwd_pmax=16, bwd_reduce="dot")
    assert stats["crossing_rows"] > 0


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_triton_scan_reduction(optimizer):
    # the other way of summing runs (kept as an option): same checks
    for seed in (81, 82):
        check_kernel("triton", "fp16", optimizer, seed=seed, device="cuda", bwd_reduce="scan")


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_triton_larger_tables(optimizer):
    check_kernel("triton", "fp16", optimizer, seed=9, device="cuda", max_tables=6, max_rows=50_000, batch=4096, steps=3)


def test_triton_is_deterministic():
    rng = np.random.default_rng(3)
    rows, dims = [1000, 50, 20000], [64, 12, 128]
    indices, offsets = random_batch(rng, rows, 1024, "cuda", empty_table=None)
    grad = torch.randn(1024, sum(dims), device="cuda").half()
    results = []
    for _ in range(2):
        tbe = make_tbe("triton", rows, dims, optimizer="rowwise_adagrad", device="cuda", seed=1)
        tbe.forward(indices, offsets)
        tbe.backward(grad)
        results.append([tbe.weights(t).clone() for t in range(3)])
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


def test_triton_step_never_waits_for_the_gpu():
    # A synchronising call in the step would stall the host and idle the GPU in training (and make
    # timings include host time). The first step builds the cached forward grid; the next must not sync.
    rng = np.random.default_rng(5)
    rows, dims = [500, 40, 9000], [64, 12, 128]
    tbe = make_tbe("triton", rows, dims, optimizer="rowwise_adagrad", device="cuda", seed=1)
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
