"""A TBE whose tables live in memory tiers (tiers.py): HBM, host memory read directly (uvm), or host
memory behind an HBM row cache (uvm_caching) — any kernel of this package underneath, unchanged.

Host memory on a GPU: pinned host memory (``torch.empty(..., pin_memory=True)``: cudaHostAlloc) is
mapped into every GPU's address space under unified virtual addressing, at the same address as on
the host (CUDA programming guide, "Unified Virtual Address Space"); `host_mapped` wraps that
memory as a CUDA tensor through ``__cuda_array_interface__`` (``torch.as_tensor(obj,
device="cuda")`` makes a CUDA tensor of the pointer without a copy, keeping the owner alive), so
torch ops and Triton kernels read and write it like device memory, every access crossing the host
link (PCIe). Where libcudart can be found, the device pointer is asked of
``cudaHostGetDevicePointer`` rather than assumed. On a CPU, host memory is the device's memory:
the same code runs with plain tensors (the CPU path the runners and tests use).

The tiers of one device run as at most two kernels:
  - one over the HBM tables and the caches of the cached tables: a cache is a table of
    ``slots`` rows in HBM, and a cached table's indices are mapped to cache slots first;
  - one over the uvm tables, whose weights (and Adagrad state) were allocated in host memory.

The row cache (`RowCache`, LRU as FBGEMM's default, write-back): before the forward, the
prefetch takes the batch's distinct rows, looks each up in a row → slot map (in HBM), marks the
hits as used now, picks for the misses the least recently used slots (``topk`` of the slots'
last-use steps), writes the rows it evicts back to host memory (every cached row may have been
updated by a backward), loads the missing rows (and their Adagrad state) from host memory, and
rewrites the batch's indices as slot numbers. The kernel then runs unchanged on the cache, and its
backward updates the cached rows in place. The prefetch holds a whole batch, so a cache must have
at least a batch's distinct rows (tiers.min_cache_rows sizes it so). It syncs with the host once
per forward (the batch's distinct rows and misses), as do the group bounds: the tiered path
measures that, the all-HBM path is untouched.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Sequence

import torch

from dreamshard.costs.kernels import KERNELS, unavailable_reason
from dreamshard.costs.kernels.base import TBE, KernelUnavailable, init_table_
from dreamshard.tiers import TIERS, Tier, cache_rows

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


class RowCache:
    """An LRU, write-back HBM cache of one table's rows held in host memory (see the module doc).
    `cache` (and `cache_state`) are the kernel's own views of the slots; `host` (and `host_state`)
    the table in host memory."""

    def __init__(self, host: torch.Tensor, cache: torch.Tensor, host_state: torch.Tensor | None = None, cache_state: torch.Tensor | None = None):
        self.host, self.cache, self.host_state, self.cache_state = host, cache, host_state, cache_state
        self.rows, self.slots = host.shape[0], cache.shape[0]
        device = cache.device
        self.slot_row = torch.full((self.slots,), -1, dtype=torch.int64, device=device)
        self.slot_time = torch.full((self.slots,), -1, dtype=torch.int64, device=device)
        self.row_slot = torch.full((self.rows,), -1, dtype=torch.int32, device=device)  # the index: CACHE_INDEX_BYTES a row
        self.step = 0
        self.lookups = self.misses = self.evictions = 0  # since the last reset_stats

    def reset_stats(self) -> None:
        self.lookups = self.misses = self.evictions = 0

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.misses / self.lookups if self.lookups else 1.0

    def prefetch(self, indices: torch.Tensor) -> torch.Tensor:
        """The batch's indices of this table as cache slots, the missing rows loaded first."""
        self.step += 1
        if indices.numel() == 0:
            return indices
        rows, inverse = torch.unique(indices, return_inverse=True)
        if rows.numel() > self.slots:
            raise RuntimeError(f"a batch reads {rows.numel():,} distinct rows of a table whose cache holds {self.slots:,}: "
                               "the cache must hold a batch's rows (give it a larger cache ratio)")
        slots = self.row_slot[rows].to(torch.int64)
        hit = slots >= 0
        self.slot_time[slots[hit]] = self.step
        miss = ~hit
        missing = rows[miss]
        k = missing.numel()
        if k:
            # the least recently used slots (never used: -1); this batch's hits are the newest, so
            # none of them is taken while a batch fits
            victims = torch.topk(self.slot_time, k, largest=False, sorted=False).indices
            old = self.slot_row[victims]
            held = old >= 0
            old_rows, old_slots = old[held], victims[held]
            self.evictions += old_rows.numel()
            if old_rows.numel():  # write back: a cached row may have been updated by any backward since it was loaded
                self.host.index_copy_(0, old_rows, self.cache[old_slots])
                if self.host_state is not None:
                    self.host_state.index_copy_(0, old_rows, self.cache_state[old_slots])
                self.row_slot[old_rows] = -1
            self.cache.index_copy_(0, victims, self.host[missing])
            if self.host_state is not None:
                self.cache_state.index_copy_(0, victims, self.host_state[missing])
            self.slot_row[victims] = missing
            self.row_slot[missing] = victims.to(torch.int32)
            self.slot_time[victims] = self.step
            slots[miss] = victims
        self.lookups += indices.numel()
        self.misses += k
        return slots[inverse]

    def flush(self) -> None:
        """Write every cached row back to host memory (the host copy is then the table)."""
        held = self.slot_row >= 0
        if held.any():
            self.host.index_copy_(0, self.slot_row[held], self.cache[held])
            if self.host_state is not None:
                self.host_state.index_copy_(0, self.slot_row[held], self.cache_state[held])

    def table(self) -> torch.Tensor:
        """The table's current rows (a copy): host rows with the cached ones over them."""
        out = self.host.clone()
        held = self.slot_row >= 0
        out[self.slot_row[held]] = self.cache[held]
        return out

    def state(self) -> torch.Tensor | None:
        if self.host_state is None:
            return None
        out = self.host_state.clone()
        held = self.slot_row >= 0
        out[self.slot_row[held]] = self.cache_state[held]
        return out

    def load(self, w: torch.Tensor) -> None:
        """Overwrite the table (host rows and the cached copies)."""
        self.host.copy_(w)
        held = self.slot_row >= 0
        self.cache[held] = self.host[self.slot_row[held]]


def _kernel_class(kernel: str):
    spec = KERNELS[kernel]
    return getattr(importlib.import_module(spec.module), spec.cls)


class TieredTBE(TBE):
    """A TBE of tables in tiers (see the module doc): `tiers[t]` says where table t's rows live."""

    def __init__(self, kernel: str, rows: Sequence[int], dims: Sequence[int], tiers: Sequence[Tier], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cpu", seed: int = 0, **kernel_options) -> None:
        super().__init__(rows, dims, precision, optimizer, lr, eps, device, seed)
        if len(tiers) != self.num_tables:
            raise ValueError(f"{len(tiers)} tiers for {self.num_tables} tables")
        for t in tiers:
            if t.kind not in TIERS:
                raise ValueError(f"tier {t.kind!r}: one of {', '.join(TIERS)}")
        if kernel not in KERNELS or kernel == "fbgemm":
            raise KernelUnavailable(f"tiers run over the torch and triton kernels (FBGEMM has its own UVM tiers), not {kernel!r}")
        problem = unavailable_reason(kernel, self.device)
        if problem:
            raise KernelUnavailable(f"{kernel}: {problem}")
        self.kernel = f"{kernel}+tiers"
        self.base_kernel = kernel
        self.tiers = list(tiers)
        cls = _kernel_class(kernel)
        # group 0: HBM tables and caches; group 1: uvm tables (weights in host memory)
        self.members = [[t for t in range(self.num_tables) if self.tiers[t].kind != "uvm"], [t for t in range(self.num_tables) if self.tiers[t].kind == "uvm"]]
        self.slots = [cache_rows(r, tr.cache_ratio) if tr.kind == "uvm_caching" else r for r, tr in zip(self.rows, self.tiers)]
        self.inner: list[TBE | None] = []
        for g, members in enumerate(self.members):
            if not members:
                self.inner.append(None)
                continue
            alloc = (lambda n, dtype: host_mapped(n, dtype, self.device)) if g == 1 else None
            self.inner.append(cls([self.slots[t] for t in members], [self.dims[t] for t in members], precision=precision, optimizer=optimizer, lr=lr, eps=eps,
                                  device=self.device, seed=seed, alloc=alloc, **kernel_options))
        self.where = {t: (g, j) for g, members in enumerate(self.members) for j, t in enumerate(members)}
        # the cached tables: their rows (and state) in host memory, initialised as an HBM table of the same seed would be
        self.caches: dict[int, RowCache] = {}
        for t, tier in enumerate(self.tiers):
            if tier.kind != "uvm_caching":
                continue
            host = host_mapped(self.rows[t] * self.dims[t], self.dtype, self.device).view(self.rows[t], self.dims[t])
            init_table_(host, self.seed, t)
            g, j = self.where[t]
            state = host_state = None
            if self.optimizer == "rowwise_adagrad":
                state = self.inner[g].optimizer_state(j)
                host_state = host_mapped(self.rows[t], torch.float32, self.device).zero_()
            self.caches[t] = RowCache(host, self.inner[g].weights(j), host_state, state)
        for t, tier in enumerate(self.tiers):  # uvm and hbm tables: the seed's weights of table t (the inner kernels seeded them by position)
            if tier.kind != "uvm_caching":
                g, j = self.where[t]
                if j != t:
                    init_table_(self.inner[g].weights(j), self.seed, t)
        self._cols = [torch.cat([torch.arange(self.col_offsets[t], self.col_offsets[t + 1]) for t in m]).to(self.device) if m else None for m in self.members]
        self._saved_batch: int | None = None

    # ---------------------------------------------------------------- weights
    def weights(self, t: int) -> torch.Tensor:
        self._check_table(t)
        if t in self.caches:
            return self.caches[t].table()
        g, j = self.where[t]
        return self.inner[g].weights(j)

    def set_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_weights(t, w)
        if t in self.caches:
            self.caches[t].load(w.to(self.device, self.dtype))
        else:
            g, j = self.where[t]
            self.inner[g].set_weights(j, w)

    def optimizer_state(self, t: int) -> torch.Tensor | None:
        self._check_table(t)
        if t in self.caches:
            return self.caches[t].state()
        g, j = self.where[t]
        return self.inner[g].optimizer_state(j)

    def cache_stats(self) -> dict[int, dict]:
        """Per cached table: slots, lookups and misses since the last reset, and the hit rate."""
        return {t: {"slots": c.slots, "lookups": c.lookups, "misses": c.misses, "evictions": c.evictions, "hit_rate": c.hit_rate} for t, c in self.caches.items()}

    def reset_cache_stats(self) -> None:
        for c in self.caches.values():
            c.reset_stats()

    # ---------------------------------------------------------------- forward / backward
    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = self._check_inputs(indices, offsets)
        out = self._new_output(batch)
        self._saved_batch = batch
        if batch == 0:
            return out
        offsets = offsets.long()
        bounds = offsets[::batch].tolist()  # each table's lookup range (one sync: the groups' inputs follow from it)
        for g, members in enumerate(self.members):
            if not members:
                continue
            parts, offs, base = [], [], 0
            for t in members:
                a, b = bounds[t], bounds[t + 1]
                ix = indices[a:b]
                if t in self.caches:
                    ix = self.caches[t].prefetch(ix.long())
                parts.append(ix.long())
                offs.append(offsets[t * batch:(t + 1) * batch] - a + base)
                base += b - a
            offs.append(torch.tensor([base], dtype=torch.int64, device=self.device))
            y = self.inner[g].forward(torch.cat(parts), torch.cat(offs))
            out.index_copy_(1, self._cols[g], y)
        return out

    def backward(self, grad_output: torch.Tensor) -> None:
        if self._saved_batch is None:
            raise RuntimeError("backward() needs a forward() first")
        self._check_grad(grad_output, self._saved_batch)
        if self._saved_batch == 0:
            return
        for g, members in enumerate(self.members):
            if members:
                self.inner[g].backward(grad_output.index_select(1, self._cols[g]).contiguous())
