"""Host memory that GPU kernels address directly: the uvm tier's tables and the row caches' host copies
(kernels/tiered.py).

Pinned host memory (``torch.empty(..., pin_memory=True)``: cudaHostAlloc) is mapped into every
GPU's address space under unified virtual addressing, at the same address as on the host (CUDA
programming guide, "Unified Virtual Address Space"); `host_mapped` wraps that memory as a CUDA
tensor through ``__cuda_array_interface__`` (``torch.as_tensor(obj, device="cuda")`` makes a CUDA
tensor of the pointer without a copy, keeping the owner alive), so torch ops and Triton kernels read
and write it like device memory, every access crossing the host link (PCIe). Where libcudart can be
found, the device pointer is asked of ``cudaHostGetDevicePointer`` rather than assumed. On a CPU,
host memory is the device's memory: plain tensors.

Because the address space is one, a kernel can reach a host table from the base pointer of its HBM
buffer: `element_offset` gives the distance in elements (negative where the host memory lies
below), so one fused launch reads tables in HBM and in host memory alike (kernels/triton_tbe.py).
"""

from __future__ import annotations

import ctypes

import torch

_TYPESTR = {torch.float16: "<f2", torch.float32: "<f4", torch.int64: "<i8", torch.int32: "<i4"}


class _HostArray:
    """A pinned host tensor seen as CUDA memory (``__cuda_array_interface__``); it keeps the host
    tensor alive for as long as a tensor made from it lives."""

    def __init__(self, host: torch.Tensor, pointer: int):
        self.host = host
        self.__cuda_array_interface__ = {"shape": tuple(host.shape), "typestr": _TYPESTR[host.dtype], "data": (pointer, False), "version": 3, "strides": None}


def _cudart():
    """The CUDA runtime torch loaded (ctypes), or None where it cannot be found."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
        for path in sorted(paths):
            return ctypes.CDLL(path)
    except OSError:
        pass
    return None


def device_pointer(host_pointer: int) -> int:
    """The device address of pinned host memory: cudaHostGetDevicePointer where libcudart is found,
    else the host address itself (what unified virtual addressing guarantees for pinned memory)."""
    rt = _cudart()
    if rt is not None:
        out = ctypes.c_void_p()
        if rt.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(host_pointer), 0) == 0 and out.value:
            return int(out.value)
    return host_pointer


def host_mapped(numel: int, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A flat tensor of `numel` elements in host memory that kernels on `device` address directly:
    on CUDA pinned host memory mapped into the GPU (see the module doc), on a CPU a plain tensor."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.empty(numel, dtype=dtype)
    host = torch.empty(max(numel, 1), dtype=dtype, pin_memory=True)
    return torch.as_tensor(_HostArray(host, device_pointer(host.data_ptr())), device=device)[:numel]


def release_cached_host_memory() -> None:
    """Give the pinned memory that torch's host allocator keeps cached (each block a power of two)
    back to the system: the next TBE rarely asks for the same sizes (a no-op where torch has no such
    cache, a CPU build)."""
    getattr(torch._C, "_host_emptyCache", lambda: None)()


def element_offset(base: torch.Tensor, t: torch.Tensor, align: int = 1) -> int:
    """Where `t` starts, in elements of `base`'s dtype counted from `base`'s start (any sign): what a
    kernel given `base` adds to reach `t`. The two must share a dtype and the distance must be a
    multiple of `align` elements (the kernels' vector loads assume it)."""
    if t.dtype != base.dtype or t.device != base.device:
        raise ValueError(f"element_offset: {t.dtype} on {t.device} from a base of {base.dtype} on {base.device}")
    size = base.element_size()
    diff = t.data_ptr() - base.data_ptr()
    if diff % (size * align):
        raise ValueError(f"host memory at {t.data_ptr():#x} is not {size * align}-byte aligned to {base.data_ptr():#x}")
    return diff // size
