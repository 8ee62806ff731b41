"""A TBE whose tables live in memory tiers (tiers.py): HBM, host memory read directly (uvm), or host
memory behind an HBM row cache (uvm_caching) — any kernel of this package underneath, unchanged.

The tiers of one device run as the kernel's own launches over all of its tables: a uvm table's
weights (and Adagrad state) are allocated in host memory mapped into the GPU (kernels/host_memory.py;
the kernel's ``host_tables``), which its launches reach as they reach HBM; a cached table is, to the
kernel, a table of ``slots`` rows in HBM (its cache), and the batch's indices of it are rewritten as
cache slots first. Nothing else is added to the kernel's forward and backward: no copies of the
inputs beyond the one the caches' slots are written into, none of the output or the gradient.

The row cache (`RowCache`, LRU as FBGEMM's default, write-back): before the forward, the
prefetch sorts the batch's lookups of the table, looks each row up in a row → slot map (int32 in
HBM, a direct map: CACHE_INDEX_BYTES a row), marks the hits as used now, gives the k missing
rows the k least recently used slots it does not hit (the slots are kept in LRU order: the j-th
missing row takes the j-th, and the slots used now move to the end of the order by a stable
partition, elementwise work over the slots, no sort), writes the rows it evicts back to host memory (every cached row may have been
updated by a backward), loads the missing rows (and their Adagrad state) from host memory, and
rewrites the batch's indices as slot numbers. The kernel then runs unchanged on the cache, and its
backward updates the cached rows in place. The batch is padded (by at most an eighth, with a spare
row that hits a spare slot) to one of a few sizes, and on a GPU each size's prefetch is a CUDA graph
captured once and replayed: one launch for its ~80 ops, which the host otherwise took longer to
issue than the GPU took to run. All of it is GPU work whose shapes the host knows (the
batch's lookups, the slots): the host never waits for the GPU, and the rows moved — as many as the
GPU found missing — are moved by a small Triton kernel that reads their count from GPU memory,
gathering the missing rows straight from the host-mapped table (no staging copy). FBGEMM's
LRU cache (`lru_cache_populate`, `lxu_cache_lookup`) keeps its bookkeeping on the GPU too, but in
a 32-way set-associative map: less HBM than this direct map, victims chosen within a set. The
tier stage gives a cache at least a batch's distinct rows (tiers.min_cache_rows); a smaller cache
(TorchRec's planner gives some) has the misses that find no free slot served from host memory, as
FBGEMM serves them: such a row is read into a staging row of HBM after the cache's slots for this
batch only (not cached), updated there by the backward and written back to host memory after it
(`overflow` staging rows: the runners give a small cache its shortfall to tiers.min_cache_rows, HBM
beyond the plan's). A batch that outgrows the staging rows too is found when the counters are read
(they raise). Each table's lookup range (offsets[::B]) is given by the caller where it knows it, as a
TorchRec input carries it (the runners do); otherwise the forward reads it first, one host sync.
"""

from __future__ import annotations

import importlib
from typing import Sequence

import torch

from dreamshard.costs.kernels import KERNELS, unavailable_reason
from dreamshard.costs.kernels.base import TBE, KernelUnavailable, init_table_
from dreamshard.costs.kernels.host_memory import host_mapped
from dreamshard.tiers import TIERS, Tier, cache_rows


def _move_rows_torch(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor, count: torch.Tensor) -> None:
    """dst[dst_idx[i]] = src[src_idx[i]] for i < count where both indices are >= 0 (reads `count`:
    a host sync on a GPU, nothing on a CPU)."""
    k = int(count)
    s, d = src_idx[:k], dst_idx[:k]
    keep = (s >= 0) & (d >= 0)
    if not bool(keep.all()):
        s, d = s[keep], d[keep]
    if s.numel():
        dst.index_copy_(0, d, src[s])


def _move_rows(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor, count: torch.Tensor) -> None:
    """`_move_rows_torch`'s copy without a host sync on a GPU: a Triton kernel over as many rows as
    the index lists hold, each program reading the count from GPU memory and moving only rows
    below it (the rest of the grid does nothing). src and dst: 2-D, rows of unit column stride;
    either may be host memory mapped into the GPU (`host_mapped`)."""
    if src.device.type != "cuda" or triton is None or src.stride(1) != 1 or dst.stride(1) != 1:
        _move_rows_torch(src, src_idx, dst, dst_idx, count)
        return
    n, dim = src_idx.numel(), src.shape[1]
    if n == 0:
        return
    block_d = max(16, min(256, 1 << (dim - 1).bit_length()))
    block_r = max(1, 2048 // block_d)
    _move_kernel[(triton.cdiv(n, block_r),)](src, src_idx, dst, dst_idx, count, n, dim, src.stride(0), dst.stride(0), BLOCK_R=block_r, BLOCK_D=block_d,
                                             num_warps=4)


try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU path needs no Triton
    triton = None

if triton is not None:

    @triton.jit
    def _move_kernel(src, src_idx, dst, dst_idx, count_ptr, n, dim, src_stride, dst_stride, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """dst[dst_idx[i]] = src[src_idx[i]] for i < *count_ptr and i < n (the lists' length: a
        count of more misses than a cache has slots runs past them), both indices >= 0."""
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        count = tl.load(count_ptr)
        live = (r < count) & (r < n)
        s = tl.load(src_idx + r, mask=live, other=-1)
        d = tl.load(dst_idx + r, mask=live, other=-1)
        live = live & (s >= 0) & (d >= 0)
        for c0 in range(0, dim, BLOCK_D):
            c = c0 + tl.arange(0, BLOCK_D)
            mask = live[:, None] & (c[None, :] < dim)
            v = tl.load(src + s[:, None] * src_stride + c[None, :], mask=mask)
            tl.store(dst + d[:, None] * dst_stride + c[None, :], v, mask=mask)


def padded(n: int) -> int:
    """The batch size a prefetch of n lookups runs at: n rounded up to 1/8 of its power of two (at
    most 12.5% of padding; a table's batches vary by a few percent, so one or two sizes, each a
    CUDA graph, serve it)."""
    if n <= 64:
        return 64
    step = 1 << max(0, (n - 1).bit_length() - 4)
    return -(-n // step) * step


_POOLS: dict = {}


def _graph_pool(device: torch.device):
    """One CUDA graph memory pool per device, shared by every row cache's prefetch graphs."""
    if device not in _POOLS:
        _POOLS[device] = torch.cuda.graph_pool_handle()
    return _POOLS[device]


class RowCache:
    """An LRU, write-back HBM cache of one table's rows held in host memory (see the module doc).
    `cache` (and `cache_state`) are the kernel's own views of the slots, a spare row and, last,
    `overflow` staging rows; `host` (and `host_state`) the table in host memory. The misses of a
    batch that find no free slot take the staging rows for that batch (`write_back` after the
    backward returns them to host memory); a batch of more still sends the rest to the spare row
    (found out when the counters are read, `_check`): the kernels never index past the cache,
    whatever the batch.

    All of the bookkeeping is tensors on the cache's device and every op has a shape the host knows
    (the batch's lookups, the slots), so a prefetch never waits for the GPU: the row → slot map
    (`row_slot`, one int32 per row and a spare entry), each slot's row and last-use step
    (`slot_row`, `slot_time`, and a spare slot that masked-out writes go to), the slots in LRU
    order (`order`) and the counters.
    The rows moved (misses loaded, victims written back) are as many as the GPU found: their
    lists are compacted to the front and moved by a kernel that reads their count from GPU memory
    (`_move_rows`)."""

    def __init__(self, host: torch.Tensor, cache: torch.Tensor, host_state: torch.Tensor | None = None, cache_state: torch.Tensor | None = None,
                 graphs: bool | None = None, overflow: int = 0):
        self.host, self.cache, self.host_state, self.cache_state = host, cache, host_state, cache_state
        self.overflow = int(overflow)
        self.rows, self.slots = host.shape[0], cache.shape[0] - 1 - self.overflow  # then the spare slot, then the staging rows
        if self.slots < 1 or self.overflow < 0:
            raise ValueError(f"a row cache needs a slot and the spare row: got {cache.shape[0]} rows for {self.overflow} staging rows")
        device = self.device = cache.device
        # this batch's staged rows (host row or -1) and their rows in `cache`: what `write_back` returns
        self._staged = torch.full((self.overflow,), -1, dtype=torch.int64, device=device)
        self._staging = torch.arange(self.slots + 1, self.slots + 1 + self.overflow, dtype=torch.int64, device=device)
        self._staged_count = torch.full((1,), self.overflow, dtype=torch.int64, device=device)
        self.slot_row = torch.full((self.slots + 1,), -1, dtype=torch.int64, device=device)  # + the spare slot
        self.slot_time = torch.full((self.slots + 1,), -1, dtype=torch.int32, device=device)
        self.order = torch.arange(self.slots, dtype=torch.int64, device=device)  # the slots, least recently used first
        # the index: CACHE_INDEX_BYTES a row, and a spare entry (row `rows`, what a batch is padded
        # with) that maps to the spare slot: a padded lookup hits there and touches no cached row
        self.row_slot = torch.full((self.rows + 1,), -1, dtype=torch.int32, device=device)
        self.row_slot[-1] = self.slots
        self._step = torch.zeros((), dtype=torch.int32, device=device)  # the prefetches so far (on the device: a graph replays it)
        self._lookups = 0
        self._counts = torch.zeros(3, dtype=torch.int64, device=device)  # misses, evictions, batches that overflowed the cache
        self._minus1 = torch.tensor(-1, dtype=torch.int32, device=device)
        # on a GPU each padded batch size's prefetch is captured once as a CUDA graph and replayed: one
        # launch instead of ~80 small ones, whose issue took the host longer than their GPU work
        self.graphs = device.type == "cuda" if graphs is None else bool(graphs)
        self._captured: dict[int, tuple] = {}

    # ------------------------------------------------------------ counters (read the GPU: not in a timed step)
    def reset_stats(self) -> None:
        self._lookups = 0
        self._counts.zero_()

    def _check(self) -> torch.Tensor:
        counts = self._counts.cpu()
        if int(counts[2]):
            raise RuntimeError(f"{int(counts[2])} batches read more distinct rows of a table than its cache holds ({self.slots:,} rows, {self.overflow:,} staging): "
                               "the cache must hold a batch's rows (give it a larger cache ratio); the rows computed since are wrong")
        return counts

    @property
    def lookups(self) -> int:
        return self._lookups

    @property
    def misses(self) -> int:
        return int(self._check()[0])

    @property
    def evictions(self) -> int:
        return int(self._check()[1])

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.misses / self._lookups if self._lookups else 1.0

    # ------------------------------------------------------------ the prefetch
    def prefetch(self, indices: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The batch's indices of this table as cache slots (into `out` where given), the missing rows
        loaded first (no host sync). The batch is padded to a size of `padded` with the spare row;
        on a GPU that size's prefetch runs as a CUDA graph, captured the first time."""
        n = indices.numel()
        if out is None:
            out = torch.empty(n, dtype=torch.int64, device=self.device)
        if n == 0:
            return out
        size = padded(n)
        if self.graphs:
            if size not in self._captured:
                # a table's batches vary by a few percent: the sizes around this one too, so that a
                # capture (a device sync, some ms) does not fall among the steps that follow
                for near in sorted({padded(int(n * 0.96)), size, padded(int(n * 1.04))}):
                    if near not in self._captured:
                        self._capture(near)
            graph, inp, res = self._captured[size]
            inp[:n].copy_(indices)
            inp[n:].fill_(self.rows)
            graph.replay()
        else:
            inp = torch.full((size,), self.rows, dtype=torch.int64, device=self.device)
            inp[:n] = indices
            res = self._prefetch(inp)
        out.copy_(res[:n])
        self._lookups += n
        return out

    def _capture(self, size: int) -> None:
        """The CUDA graph of the prefetch of `size` lookups, its input buffer and its output. Warmed up
        first on a batch of spare rows (all hits on the spare slot: the cache unchanged) to compile
        the kernels; every cache of the process shares one memory pool (its prefetches run one at a
        time on one stream, and each output is copied out before the next)."""
        inp = torch.full((size,), self.rows, dtype=torch.int64, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._prefetch(inp)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=_graph_pool(self.device)):
            res = self._prefetch(inp)
        self._captured[size] = (graph, inp, res)

    def _prefetch(self, indices: torch.Tensor) -> torch.Tensor:
        """The prefetch of a padded batch (module doc); only ops of shapes the host knows, and no
        Python state changed (a CUDA graph replays it)."""
        n = indices.numel()
        self._step.add_(1)
        step, S, dev = self._step, self.slots, self.device
        rows, order = torch.sort(indices.long())
        first = torch.ones(n, dtype=torch.bool, device=dev)
        torch.ne(rows[1:], rows[:-1], out=first[1:])  # a row's first lookup in sorted order
        slot = self.row_slot[rows].long()  # -1: not cached
        hit = slot >= 0
        spare = torch.full_like(slot, S)
        # the hits are used now (the spare slot takes the rest); index_put_, not index_fill_, whose
        # tensor value is read by the host (a sync, which a CUDA graph cannot capture)
        self.slot_time.index_put_((torch.where(hit, slot, spare),), step.expand(n))
        miss = first & ~hit  # one per missing row
        rank = torch.cumsum(miss, 0) - 1  # a missing row's rank among the misses, the same at its every lookup
        k = rank[-1:] + 1  # misses (a 1-element tensor: never read by the host here)
        # the victims: the k least recently used slots (`order`: the slots, least recently used first)
        # that this batch does not hit; then `order` again, the slots used now moved to its end in a
        # stable partition (no sort)
        used = self.slot_time[self.order] == step
        older = torch.cumsum(~used, 0) - 1  # rank of each slot not used now, in LRU order
        free, X = older[-1:] + 1, self.overflow  # the slots not used now; the staging rows
        self._counts[2:].add_(k > free + X)  # more misses than free slots and staging rows: the batch does not fit
        take = ~used & (older < k)
        m = min(n, S + X)
        victims = torch.full((m + 1,), S, dtype=torch.int64, device=dev).index_put_((torch.where(take, older, torch.full_like(older, m)),), self.order)[:m]
        if X:  # the misses past the free slots take the staging rows, in rank order
            j = torch.arange(m, device=dev)
            victims = torch.where((j >= free) & (j < free + X), S + 1 + j - free, victims)
        moved = used | take
        stay = torch.cumsum(~moved, 0) - 1
        pos = torch.where(moved, stay[-1:] + torch.cumsum(moved, 0), stay)
        self.order.copy_(torch.empty_like(self.order).index_put_((pos,), self.order))
        new = torch.where(hit, slot, victims[rank.clamp(0, m - 1)])
        # the missing rows in rank order (positions past the misses: -1)
        at = torch.where(miss & (rank < m), rank, torch.full_like(rank, m))
        load_rows = torch.full((m + 1,), -1, dtype=torch.int64, device=dev).index_put_((at,), rows)[:m]
        cached = victims < S  # a slot of the cache (not the spare one or a staging row)
        vslot = victims.clamp(max=S)  # the bookkeeping's entry: staging rows share the spare one, which holds no row
        old = self.slot_row[vslot]  # the rows evicted (-1: an empty slot, past the misses, or staged)
        evicted = old >= 0
        n_evicted = evicted.sum()
        self._counts[:2].add_(torch.stack([k[0], n_evicted]))
        # write back what is evicted (a cached row may have been updated by any backward since it was
        # loaded), in row order as the loads are: a sorted stream misses the GPU's translation of host
        # addresses once a page at most, the slots' LRU order once a row (costs/host.py tlb_misses)
        back, order_back = torch.sort(torch.where(evicted, old, torch.full_like(old, self.rows)))
        from_slots = victims[order_back]
        _move_rows(self.cache, from_slots, self.host, back, n_evicted.view(1))
        _move_rows(self.host, load_rows, self.cache, victims, k)
        if self.host_state is not None:
            _move_rows(self.cache_state.view(-1, 1), from_slots, self.host_state.view(-1, 1), back, n_evicted.view(1))
            _move_rows(self.host_state.view(-1, 1), load_rows, self.cache_state.view(-1, 1), victims, k)
        spare_row = torch.full_like(old, self.rows)
        self.row_slot.index_put_((torch.where(evicted, old, spare_row),), self._minus1)
        self.row_slot.index_put_((torch.where((load_rows >= 0) & cached, load_rows, spare_row),), victims.to(torch.int32))
        self.slot_row.index_put_((vslot,), torch.where(cached, load_rows, torch.full_like(load_rows, -1)))  # the spare entry stays -1
        self.slot_time.index_put_((vslot,), step.expand(m))
        if X:  # the staged rows, for `write_back`: staging row i holds this batch's (free + i)-th miss
            i = free + torch.arange(X, device=dev)
            self._staged.copy_(torch.where(i < torch.minimum(k, torch.full_like(k, m)), load_rows[i.clamp(max=m - 1)], torch.full_like(i, -1)))
        self.row_slot[-1:].fill_(S)  # the spare entry back to the spare slot (a kernel, not a host write, which would wait for the GPU)
        out = torch.empty_like(new)
        out[order] = new
        return out

    def write_back(self) -> None:
        """The staged rows of the last batch (and their state), updated by its backward, back to host
        memory (no host sync: the copy reads which rows from GPU memory)."""
        if self.overflow:
            _move_rows(self.cache, self._staging, self.host, self._staged, self._staged_count)
            if self.host_state is not None:
                _move_rows(self.cache_state.view(-1, 1), self._staging, self.host_state.view(-1, 1), self._staged, self._staged_count)

    def flush(self) -> None:
        """Write every cached row back to host memory (the host copy is then the table)."""
        held = self.slot_row[:self.slots] >= 0
        if held.any():
            self.host.index_copy_(0, self.slot_row[:self.slots][held], self.cache[:self.slots][held])
            if self.host_state is not None:
                self.host_state.index_copy_(0, self.slot_row[:self.slots][held], self.cache_state[:self.slots][held])

    def table(self) -> torch.Tensor:
        """The table's current rows (a copy): host rows with the cached ones over them."""
        self._check()
        out = self.host.clone()
        held = self.slot_row[:self.slots] >= 0
        out[self.slot_row[:self.slots][held]] = self.cache[:self.slots][held]
        return out

    def state(self) -> torch.Tensor | None:
        if self.host_state is None:
            return None
        out = self.host_state.clone()
        held = self.slot_row[:self.slots] >= 0
        out[self.slot_row[:self.slots][held]] = self.cache_state[:self.slots][held]
        return out

    def load(self, w: torch.Tensor) -> None:
        """Overwrite the table (host rows and the cached copies)."""
        self.host.copy_(w)
        held = self.slot_row[:self.slots] >= 0
        self.cache[:self.slots][held] = self.host[self.slot_row[:self.slots][held]]


def _kernel_class(kernel: str):
    spec = KERNELS[kernel]
    return getattr(importlib.import_module(spec.module), spec.cls)


class TieredTBE(TBE):
    """A TBE of tables in tiers (see the module doc): `tiers[t]` says where table t's rows live."""

    def __init__(self, kernel: str, rows: Sequence[int], dims: Sequence[int], tiers: Sequence[Tier], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cpu", seed: int = 0, overflow: Sequence[int] | None = None,
                 **kernel_options) -> None:
        """`overflow[t]`: staging rows of table t's cache for the misses a batch has beyond its free
        slots (RowCache; 0 where absent)."""
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
        self.tiers = list(tiers)
        self.slots = [cache_rows(r, tr.cache_ratio) if tr.kind == "uvm_caching" else r for r, tr in zip(self.rows, self.tiers)]
        # one kernel over every table, seeded as this TBE (table t of the seed); a cached table is its
        # cache to it: its slots and the spare row (RowCache)
        self.overflow = [int(x) if tr.kind == "uvm_caching" else 0 for x, tr in zip(overflow or [0] * self.num_tables, self.tiers)]
        inner_rows = [s + 1 + x if tr.kind == "uvm_caching" else s for s, x, tr in zip(self.slots, self.overflow, self.tiers)]
        self.inner = _kernel_class(kernel)(inner_rows, self.dims, precision=precision, optimizer=optimizer, lr=lr, eps=eps, device=self.device,
                                           seed=seed, host_tables=[t for t, tr in enumerate(self.tiers) if tr.kind == "uvm"], **kernel_options)
        # the cached tables: their rows (and state) in host memory, initialised as an HBM table of the same seed would be
        self.caches: dict[int, RowCache] = {}
        for t, tier in enumerate(self.tiers):
            if tier.kind != "uvm_caching":
                continue
            host = host_mapped(self.rows[t] * self.dims[t], self.dtype, self.device).view(self.rows[t], self.dims[t])
            init_table_(host, self.seed, t)
            host_state = None
            if self.optimizer == "rowwise_adagrad":
                host_state = host_mapped(self.rows[t], torch.float32, self.device).zero_()
            self.caches[t] = RowCache(host, self.inner.weights(t), host_state, self.inner.optimizer_state(t), overflow=self.overflow[t])

    # ---------------------------------------------------------------- weights
    def weights(self, t: int) -> torch.Tensor:
        self._check_table(t)
        if t in self.caches:
            return self.caches[t].table()
        return self.inner.weights(t)

    def set_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_weights(t, w)
        if t in self.caches:
            self.caches[t].load(w.to(self.device, self.dtype))
        else:
            self.inner.set_weights(t, w)

    def optimizer_state(self, t: int) -> torch.Tensor | None:
        self._check_table(t)
        if t in self.caches:
            return self.caches[t].state()
        return self.inner.optimizer_state(t)

    def cache_stats(self) -> dict[int, dict]:
        """Per cached table: slots, lookups and misses since the last reset, and the hit rate."""
        return {t: {"slots": c.slots, "lookups": c.lookups, "misses": c.misses, "evictions": c.evictions, "hit_rate": c.hit_rate} for t, c in self.caches.items()}

    def reset_cache_stats(self) -> None:
        for c in self.caches.values():
            c.reset_stats()

    # ---------------------------------------------------------------- forward / backward
    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, bounds: Sequence[int] | None = None) -> torch.Tensor:
        """`bounds`: each table's first lookup and the end (offsets[::B], T+1 host ints) where the
        caller knows them, as a TorchRec input does (its lengths per key); else, where there are
        caches, read from the GPU here (one host sync, before any of this forward's work is queued)."""
        batch = self._check_inputs(indices, offsets)
        if self.caches and batch:
            if bounds is None:
                bounds = offsets[::batch].tolist()
            elif len(bounds) != self.num_tables + 1:
                raise ValueError(f"bounds: {self.num_tables + 1} entries (offsets[::B]), got {len(bounds)}")
            slots = indices.clone()
            for t, cache in self.caches.items():
                cache.prefetch(indices[bounds[t]:bounds[t + 1]], out=slots[bounds[t]:bounds[t + 1]])
            indices = slots
        return self.inner.forward(indices, offsets)

    def backward(self, grad_output: torch.Tensor) -> None:
        self.inner.backward(grad_output)
        for cache in self.caches.values():
            cache.write_back()
