"""FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``: the production fused TBE.

Runs wherever ``fbgemm_gpu`` imports: on CPU through ``fbgemm-gpu-cpu`` (checked with 1.8.0 and
torch 2.13: fp16 and fp32 weights, exact SGD and exact row-wise Adagrad all run), on CUDA with the
CUDA build. The optimizer is fused into the autograd backward: ``out.backward(grad)`` updates the
weights in place. Stochastic rounding is switched off so fp16 updates round to nearest, like the
other kernels.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dreamshard.costs.kernels.base import TBE, KernelUnavailable, init_table_


def _fbgemm():
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as e:  # ImportError, or an undefined-symbol OSError from a mismatched build
        raise KernelUnavailable(f"fbgemm_gpu is not installed or does not load ({type(e).__name__}: {e})".splitlines()[0]) from e
    return EmbOptimType, SparseType, EmbeddingLocation, PoolingMode, ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen


class FbgemmTBE(TBE):
    kernel = "fbgemm"

    def __init__(self, rows: Sequence[int], dims: Sequence[int], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cpu", seed: int = 0) -> None:
        super().__init__(rows, dims, precision, optimizer, lr, eps, device, seed)
        EmbOptimType, SparseType, EmbeddingLocation, PoolingMode, ComputeDevice, Codegen = _fbgemm()
        if self.device.type == "cuda":
            location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
        elif self.device.type == "cpu":
            location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
        else:
            raise KernelUnavailable(f"fbgemm kernel supports cpu and cuda devices, not {self.device.type}")
        sparse = {"fp16": SparseType.FP16, "fp32": SparseType.FP32}[self.precision]
        optim = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[self.optimizer]
        try:
            self._tbe = Codegen(
                embedding_specs=[(r, d, location, compute) for r, d in zip(self.rows, self.dims)],
                optimizer=optim,
                weights_precision=sparse,
                output_dtype=sparse,
                pooling_mode=PoolingMode.SUM,
                learning_rate=self.lr,
                eps=self.eps,
                stochastic_rounding=False,
                device=self.device,
            )
        except Exception as e:
            raise KernelUnavailable(
                f"fbgemm TBE could not be built for precision={self.precision} optimizer={self.optimizer} on {self.device}: "
                f"{type(e).__name__}: {e}".splitlines()[0]
            ) from e
        with torch.no_grad():
            for t, w in enumerate(self._tbe.split_embedding_weights()):
                init_table_(w, self.seed, t)
        self._out = None
        self._batch = None

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = self._check_inputs(indices, offsets)
        out = self._tbe(indices.long(), offsets.long())
        self._out, self._batch = out, batch
        return out.detach()

    def backward(self, grad_output: torch.Tensor) -> None:
        if self._out is None:
            raise RuntimeError("backward() needs a forward() first")
        self._check_grad(grad_output, self._batch)
        # retain_graph: backward may be replayed on the same forward (benchmarks do), as with the other kernels
        self._out.backward(grad_output.to(self._out.dtype), retain_graph=True)

    def weights(self, t: int) -> torch.Tensor:
        self._check_table(t)
        return self._tbe.split_embedding_weights()[t].detach()

    def set_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_weights(t, w)
        with torch.no_grad():
            self._tbe.split_embedding_weights()[t].copy_(w)
