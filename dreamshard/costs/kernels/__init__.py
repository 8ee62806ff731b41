"""Fused table-batched embedding (TBE) kernels behind one interface (see ``base.TBE``).

    from dreamshard.costs.kernels import make_tbe, available_kernels, KERNELS
    tbe = make_tbe("triton", rows=[...], dims=[...], precision="fp16", optimizer="sgd", device="cuda")
    out = tbe.forward(indices, offsets)      # FBGEMM layout, [B, sum(dims)]
    tbe.backward(grad_out)                   # fused optimizer update in place

Kernels:
  - ``torch``: per-table ``embedding_bag`` + ``index_add_``; everywhere; the reference/baseline;
  - ``fbgemm``: FBGEMM ``SplitTableBatchedEmbeddingBagsCodegen``; wherever ``fbgemm_gpu`` loads
    (CPU through ``fbgemm-gpu-cpu``; CUDA with the CUDA build);
  - ``triton``: our own fused TBE; CUDA devices with ``triton`` installed.

``fbgemm_gpu`` and ``triton`` are imported only when asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch

from dreamshard.costs.kernels.base import TBE, KernelUnavailable


@dataclass(frozen=True)
class KernelSpec:
    name: str
    module: str
    cls: str
    summary: str


KERNELS: dict[str, KernelSpec] = {
    "torch": KernelSpec("torch", "dreamshard.costs.kernels.torch_tbe", "TorchTBE", "per-table embedding_bag + index_add_ (reference)"),
    "fbgemm": KernelSpec("fbgemm", "dreamshard.costs.kernels.fbgemm_tbe", "FbgemmTBE", "FBGEMM SplitTableBatchedEmbeddingBagsCodegen"),
    "triton": KernelSpec("triton", "dreamshard.costs.kernels.triton_tbe", "TritonTBE", "fused Triton TBE (CUDA)"),
}


@lru_cache(maxsize=None)
def _fbgemm_problem() -> str | None:
    """None if fbgemm_gpu loads, else why not (one line)."""
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return "fbgemm_gpu is not installed"
    try:
        import fbgemm_gpu  # noqa: F401
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen  # noqa: F401
    except Exception as e:  # an undefined-symbol OSError from a build that does not match torch, say
        return f"fbgemm_gpu does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


@lru_cache(maxsize=None)
def _triton_problem() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        import triton  # noqa: F401
    except Exception as e:
        return f"triton does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def unavailable_reason(kernel: str, device: str | torch.device = "cpu") -> str | None:
    """None if ``kernel`` can run on ``device``, else a one-line reason."""
    if kernel not in KERNELS:
        return f"unknown kernel {kernel!r}: choose one of {sorted(KERNELS)}"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available here"
    if device.type not in ("cpu", "cuda"):
        return f"device type {device.type!r} is not supported (cpu or cuda)"
    if kernel == "torch":
        return None
    if kernel == "fbgemm":
        problem = _fbgemm_problem()
        if problem:
            return problem
        if device.type == "cuda":
            import fbgemm_gpu

            if getattr(fbgemm_gpu, "__variant__", "") == "cpu":
                return "the installed fbgemm_gpu is the CPU build (fbgemm-gpu-cpu); CUDA needs the fbgemm-gpu CUDA build"
        return None
    # triton
    if device.type != "cuda" and not _interpreting():
        return "triton kernel needs a CUDA device (TRITON_INTERPRET=1 runs it on CPU, slowly, for debugging)"
    return _triton_problem()


def available_kernels(device: str | torch.device = "cpu") -> list[str]:
    """Kernels that can run on ``device``, e.g. ["torch", "fbgemm"] on a CPU with fbgemm-gpu-cpu.

    The Triton interpreter (TRITON_INTERPRET=1) is a debugging aid and never listed for CPU.
    """
    device = torch.device(device)
    out = []
    for name in KERNELS:
        if name == "triton" and device.type != "cuda":
            continue
        if unavailable_reason(name, device) is None:
            out.append(name)
    return out


def make_tbe(
    kernel: str,
    rows: Sequence[int],
    dims: Sequence[int],
    precision: str = "fp16",
    optimizer: str = "sgd",
    lr: float = 0.01,
    eps: float = 1e-8,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> TBE:
    """Build a TBE of ``kernel`` holding tables ``rows[t] x dims[t]`` on ``device``.

    Raises ``KernelUnavailable`` (a RuntimeError) when the kernel cannot run there, ``ValueError``
    for bad arguments.
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(KERNELS)}")
    problem = unavailable_reason(kernel, device)
    if problem:
        raise KernelUnavailable(f"{kernel}: {problem}")
    spec = KERNELS[kernel]
    cls = getattr(importlib.import_module(spec.module), spec.cls)
    return cls(rows, dims, precision=precision, optimizer=optimizer, lr=lr, eps=eps, device=device, seed=seed)


__all__ = ["KERNELS", "KernelSpec", "KernelUnavailable", "TBE", "available_kernels", "make_tbe", "unavailable_reason"]
