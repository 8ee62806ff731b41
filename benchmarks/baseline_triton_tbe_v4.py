# Frozen copy of our own Triton TBE as of commit 0905498 (backward v4: fixed-size slices + serial
# fix-up), kept only so that benchmarks/kernels_grid.py and kernels_gpu.py --baseline can time the
# kernel before and after the range-based backward in one call on the same GPU. Not used by the
# package; dims up to 256 only.
"""A fused TBE of our own in Triton, for CUDA machines without FBGEMM.

Layout: all tables live in one flat weight buffer (table t at element ``w_off[t]``, row-major
``[rows, dim]``, each table's start padded to 16 elements), with per-table metadata arrays
(dim class, dim, weight offset, output column offset, first global row).

forward - ONE launch over every table of the shard. The grid is a flat list of programs, each a
(table, block of bags) pair; a program handles ``BAGS = FWD_LANES // DP`` bags of one table as a
``[BAGS, DP]`` tile (``DP`` = dim rounded up to a power of two), walks the bags' lookups in step
(unrolled), gathers the rows with 16-byte vector loads and accumulates in fp32. Mixed dims share
the launch through a branch on the table's dim class, each branch compiled with its own tile
shape (all power-of-two classes are compiled in, plus the other-dim classes if the shard has any).

backward - no atomics on the weights:
  1. one launch writes, per lookup, its global row (``row_start[t] + index``) and its bag
     (lookup-parallel, coalesced; the bag comes from a binary search over ``offsets``);
  2. ``torch.sort`` (stable radix sort, int32 keys) groups the lookups by global row;
  3. fixed-size slices of the sorted lookups, per table (one launch per dim class, so each is
     compiled for one tile shape and its register count): a program gathers the output-gradient
     rows of its slice's lookups as a ``[P, TW]`` tile, sums each run of equal rows in fp32 (by
     default a 0/1 ``[P, P]`` "same run" matrix times the tile, on the tensor cores for fp16 -
     exact products, fp32 accumulation; ``bwd_reduce="scan"``: a segmented scan) and applies the
     optimizer to every row whose run lies inside the slice (one read-modify-write of the row);
  4. rows whose run crosses slice boundaries (hot rows) were left as fp32 partial sums, one per
     slice: a fix-up launch per class, one program per slice, checks whether such a run begins
     in its slice, sums the partials along the run and updates the row once.
Every row is updated exactly once, with a fixed summation order (deterministic). The backward
never waits for the GPU: the slice grid needs each table's lookup count, which the forward
already copied to the host on a side stream, and the fix-up finds its work on the device. So
the host can enqueue a training step ahead of the GPU, as with FBGEMM's TBE.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from dreamshard.costs.kernels.base import TBE, init_table_

DP_CLASSES = (4, 8, 16, 32, 64, 128, 256)
NUM_DP = len(DP_CLASSES)  # the kernels spell it as the literal 7 (the interpreter can't mix constexpr and int)
assert NUM_DP == 7
ALIGN = 16  # table starts in the flat buffer are multiples of this many elements

# Tunables (the defaults were chosen on an H200: docs/kernels.md).
FWD_LANES = 1024  # elements of one forward tile: BAGS = FWD_LANES // DP
FWD_UNROLL = 4  # lookups per bag issued together
FWD_WARPS = 4
BWD_LANES = 2048  # elements of one backward tile: P = min(max(BWD_LANES // DP, BWD_PMIN), BWD_PMAX) lookups
BWD_PMIN = 16
BWD_PMAX = 64
BWD_REDUCE = "dot"  # how a slice's runs are summed: "dot" (0/1 matrix product) or "scan" (segmented scan)
BWD_WARPS = 4
KEYS_BLOCK = 1024  # lookups per program of the key-building launch
FIX_QLANES = 2048  # elements per step of the fix-up launch: Q = min(max(FIX_QLANES // DP, 16), 256) slices
FIX_WARPS = 2


def _dp(dim: int) -> int:
    return max(4, 1 << (int(dim) - 1).bit_length())


def _dim_class(dim: int) -> int:
    """0..6: power-of-two dims 4..256 (no column mask); 7..13: other dims, masked, class of DP."""
    dp = _dp(dim)
    return DP_CLASSES.index(dp) + (0 if dp == dim else NUM_DP)


def _fwd_bags(dim: int, lanes: int) -> int:
    return max(1, lanes // _dp(dim))


def _bwd_slice(dim: int, lanes: int, pmin: int, pmax: int) -> int:
    return min(max(lanes // _dp(dim), pmin), pmax)


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tile(indices_ptr, offsets_ptr, w_ptr, out_ptr, t, blk, B, D, w_off, col_off, sumD,
              DP: tl.constexpr, EXACT: tl.constexpr, LANES: tl.constexpr, UNROLL: tl.constexpr,
              VEC: tl.constexpr):
    BAGS: tl.constexpr = max(LANES // DP, 1)
    bag = blk * BAGS + tl.arange(0, BAGS)
    bmask = bag < B
    seg = t.to(tl.int64) * B + bag
    # bag bounds kept 2-D ([BAGS, 1]) so index loads, masks and row gathers share one layout
    start = tl.load(offsets_ptr + seg[:, None], mask=bmask[:, None], other=0)
    end = tl.load(offsets_ptr + seg[:, None] + 1, mask=bmask[:, None], other=0)
    maxlen = tl.max(tl.max(end - start, axis=1), axis=0)
    col = tl.arange(0, DP)[None, :]
    if EXACT:
        cmask = col < DP
    else:
        cmask = col < D
    acc = tl.zeros((BAGS, DP), dtype=tl.float32)
    for j in range(0, maxlen, UNROLL):
        for u in tl.static_range(UNROLL):
            p = start + (j + u)
            lm = p < end
            idx = tl.load(indices_ptr + p, mask=lm, other=0)
            if EXACT:
                row = tl.multiple_of(w_off + idx.to(tl.int64) * DP, [VEC, VEC])
                w = tl.load(w_ptr + row + col, mask=lm, other=0.0)
            else:
                row = tl.multiple_of(w_off + idx.to(tl.int64) * D, [4, 4])
                w = tl.load(w_ptr + row + col, mask=lm & cmask, other=0.0)
            acc += w.to(tl.float32)
    o = tl.multiple_of(bag.to(tl.int64) * sumD + col_off, 4)
    if EXACT:
        tl.store(out_ptr + o[:, None] + col[None, :], acc.to(out_ptr.dtype.element_ty), mask=bmask[:, None])
    else:
        tl.store(out_ptr + o[:, None] + col[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=bmask[:, None] & cmask[None, :])


@triton.jit
def _fwd_kernel(indices_ptr, offsets_ptr, w_ptr, out_ptr, meta_ptr, prog_table_ptr, pfirst_ptr, T, B, sumD,
                CLASSES: tl.constexpr, LANES: tl.constexpr, UNROLL: tl.constexpr, VEC: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.load(prog_table_ptr + pid)
    blk = pid - tl.load(pfirst_ptr + t)
    cls = tl.load(meta_ptr + t)
    D = tl.load(meta_ptr + T + t)
    w_off = tl.multiple_of(tl.load(meta_ptr + 2 * T + t), 16)
    col_off = tl.load(meta_ptr + 3 * T + t)
    # one branch per dim class the shard may have, unrolled at compile time: Triton needs each tile
    # width as a compile-time constant (classes 0..6 exact power-of-two dims, 7..13 masked)
    for c in tl.static_range(14):
        if CLASSES & (1 << c):
            if cls == c:
                DP: tl.constexpr = 4 << (c % 7)
                if c < 7:
                    _fwd_tile(indices_ptr, offsets_ptr, w_ptr, out_ptr, t, blk, B, D, w_off, col_off, sumD, DP, True, LANES, UNROLL, min(VEC, DP))
                else:
                    _fwd_tile(indices_ptr, offsets_ptr, w_ptr, out_ptr, t, blk, B, D, w_off, col_off, sumD, DP, False, LANES, UNROLL, 4)


# ------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------


@triton.jit
def _keys_kernel(indices_ptr, offsets_ptr, row_start_ptr, bstart_ptr, keys_ptr, segid_ptr, N, B, BLOCK: tl.constexpr):
    """For lookup i of bag (t, b): keys[i] = row_start[t] + indices[i] (its global row), segid[i] = t*B + b.

    One program per BLOCK consecutive lookups (coalesced reads and writes). The bag of each lookup is
    found by a vectorised binary search over offsets, inside the bag range [bstart[pid], bstart[pid+1]]
    that a torch.searchsorted found for the block's first lookups."""
    pid = tl.program_id(0)
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    lo0 = tl.load(bstart_ptr + pid)
    hi0 = tl.load(bstart_ptr + pid + 1) + 1  # invariant: offsets[lo] <= i < offsets[hi]
    steps = 0
    while (hi0 - lo0) > (1 << steps):
        steps += 1
    lo = tl.zeros((BLOCK,), dtype=tl.int64) + lo0
    hi = tl.zeros((BLOCK,), dtype=tl.int64) + hi0
    for _ in range(steps):
        mid = (lo + hi) // 2
        below = tl.load(offsets_ptr + mid, mask=m, other=0) <= i
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    t = lo // B
    idx = tl.load(indices_ptr + i, mask=m, other=0)
    rs = tl.load(row_start_ptr + t, mask=m, other=0)
    tl.store(keys_ptr + i, (rs + idx).to(keys_ptr.dtype.element_ty), mask=m)
    tl.store(segid_ptr + i, lo.to(tl.int32), mask=m)


@triton.jit
def _seg_add(f1, v1, f2, v2):
    return f1 | f2, tl.where(f2 != 0, v2, v1 + v2)


@triton.jit
def _apply_rows(w_ptr, state_ptr, key, waddr, w, st, g, wmask2, rmask, D, lr, eps, ADAGRAD: tl.constexpr):
    """Optimizer update of rows (one per tile row): fp32 gradient sums g [R, DP], current rows w
    (loaded by the caller, any dtype) and, for Adagrad, their states st [R]."""
    if ADAGRAD:
        st = st + tl.sum(g * g, axis=1) / D.to(tl.float32)
        tl.store(state_ptr + key, st, mask=rmask)
        upd = tl.div_rn(g, (tl.sqrt_rn(st) + eps)[:, None] + tl.zeros_like(g))
    else:
        upd = g
    tl.store(w_ptr + waddr, (w.to(tl.float32) - lr * upd).to(w_ptr.dtype.element_ty), mask=wmask2)


@triton.jit
def _bwd_tile(keys_ptr, perm_ptr, segid_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr,
              pid, t, slice_no, s0, send, N, B, D, w_off, col_off, row_start, sumD, slot, lr, eps,
              DP: tl.constexpr, EXACT: tl.constexpr, LANES: tl.constexpr, PMIN: tl.constexpr, PMAX: tl.constexpr,
              MINW: tl.constexpr, ADAGRAD: tl.constexpr, VEC: tl.constexpr):
    # MINW = 16: reduce runs with a matrix product (tile width padded to 16); MINW = 1: segmented scan
    P: tl.constexpr = min(max(LANES // DP, PMIN), PMAX)
    TW: tl.constexpr = max(DP, MINW)
    FULL: tl.constexpr = EXACT and TW == DP
    s = s0 + slice_no.to(tl.int64) * P
    n = tl.minimum(send - s, P)
    lane = tl.arange(0, P)
    m = lane < n
    pos = s + lane
    lookup = tl.load(perm_ptr + pos, mask=m, other=0)
    key = tl.load(keys_ptr + pos, mask=m, other=-1)
    key_prev = tl.load(keys_ptr + pos - 1, mask=m & (pos > 0), other=-2)
    key_next = tl.load(keys_ptr + pos + 1, mask=m & (pos + 1 < N), other=-3)
    is_start = (key != key_prev) | (lane == 0)
    last_lane = lane == n - 1
    is_end = m & ((key != key_next) | last_lane)
    seg_no = tl.cumsum(is_start.to(tl.int32), axis=0)
    nseg = tl.max(tl.where(m, seg_no, 0), axis=0)
    head_p = tl.max(tl.where((lane == 0) & m & (key == key_prev), 1, 0), axis=0)
    tail_p = tl.max(tl.where(last_lane & m & (key == key_next), 1, 0), axis=0)
    # rows whose whole run lies in this slice are updated here: issue their loads now, so they
    # overlap the gradient gather below
    complete = is_end & ((head_p == 0) | (seg_no != 1)) & ((tail_p == 0) | (lane != n - 1))
    local = (key - row_start).to(tl.int64)
    col = tl.arange(0, TW)
    if FULL:
        cmask = col < TW
        waddr = tl.multiple_of(w_off + local * DP, VEC)[:, None] + col[None, :]
        wmask = tl.broadcast_to(complete[:, None], (P, TW))
    else:
        cmask = col < D
        waddr = tl.multiple_of(w_off + local * D, 4)[:, None] + col[None, :]
        wmask = complete[:, None] & cmask[None, :]
    w = tl.load(w_ptr + waddr, mask=wmask, other=0.0)
    if ADAGRAD:
        st = tl.load(state_ptr + key, mask=complete, other=0.0)
    else:
        st = tl.zeros((P,), dtype=tl.float32)
    # gather the output gradient of each lookup's bag
    seg = tl.load(segid_ptr + lookup, mask=m, other=0)
    b = (seg - t * B).to(tl.int64)
    gaddr = tl.multiple_of(b * sumD + col_off, 4)
    g = tl.load(grad_ptr + gaddr[:, None] + col[None, :], mask=m[:, None] & cmask[None, :], other=0.0)
    if MINW >= 16:
        # acc[i] = sum of g[k] over the lookups k of i's run: a 0/1 [P, P] matrix times g, fp32 accumulation
        same = seg_no[:, None] == seg_no[None, :]
        if g.dtype == tl.float16:
            acc = tl.dot(same.to(tl.float16), g, out_dtype=tl.float32)
        else:
            acc = tl.dot(same.to(tl.float32), g.to(tl.float32), input_precision="ieee")
    else:
        flags = tl.broadcast_to(is_start.to(tl.int32)[:, None], (P, TW))
        _, acc = tl.associative_scan((flags, g.to(tl.float32)), 0, _seg_add)
    _apply_rows(w_ptr, state_ptr, key, waddr, w, st, acc, wmask, complete, D, lr, eps, ADAGRAD)
    # runs that cross the slice's boundaries: leave fp32 partial sums for the fix-up launch
    first_partial = (head_p != 0) | ((tail_p != 0) & (nseg == 1))
    wr_first = is_end & (seg_no == 1) & first_partial
    wr_last = last_lane & m & (tail_p != 0)
    sl = tl.multiple_of(slot + tl.zeros((P,), dtype=tl.int64), 4)
    tl.store(slot_first_ptr + sl[:, None] + col[None, :], acc, mask=wr_first[:, None] & cmask[None, :])
    tl.store(slot_last_ptr + sl[:, None] + col[None, :], acc, mask=wr_last[:, None] & cmask[None, :])
    # bit 0: a run crosses into the next slice; bit 1: one run only; bit 2: a run comes from the previous
    # slice; bit 3: a crossing run begins here (the fix-up launch starts from these slices)
    single = (nseg == 1).to(tl.int32)
    begins = tail_p * (1 - head_p * single)
    tl.store(flags_ptr + pid, (tail_p + 2 * single + 4 * head_p + 8 * begins).to(tl.int8))


@triton.jit
def _bwd_kernel(keys_ptr, perm_ptr, segid_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr,
                meta_ptr, prog_table_ptr, dyn_ptr, pid_base, T, N, B, sumD, lr, eps,
                CLASSES: tl.constexpr, LANES: tl.constexpr, PMIN: tl.constexpr, PMAX: tl.constexpr, MINW: tl.constexpr,
                ADAGRAD: tl.constexpr, VEC: tl.constexpr):
    pid = tl.program_id(0) + pid_base
    t = tl.load(prog_table_ptr + pid)
    cls = tl.load(meta_ptr + t)
    D = tl.load(meta_ptr + T + t)
    w_off = tl.multiple_of(tl.load(meta_ptr + 2 * T + t), 16)
    col_off = tl.load(meta_ptr + 3 * T + t)
    row_start = tl.load(meta_ptr + 4 * T + t)
    slice_no = pid - tl.load(dyn_ptr + t)  # dyn: [pfirst, lookup start, lookup end, slot base] x T
    s0 = tl.load(dyn_ptr + T + t)
    send = tl.load(dyn_ptr + 2 * T + t)
    slot = tl.load(dyn_ptr + 3 * T + t) + slice_no.to(tl.int64) * D
    for c in tl.static_range(14):  # as in _fwd_kernel
        if CLASSES & (1 << c):
            if cls == c:
                DP: tl.constexpr = 4 << (c % 7)
                if c < 7:
                    _bwd_tile(keys_ptr, perm_ptr, segid_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, pid, t, slice_no, s0, send, N, B, D, w_off, col_off, row_start, sumD, slot, lr, eps, DP, True, LANES, PMIN, PMAX, MINW, ADAGRAD, min(VEC, DP))
                else:
                    _bwd_tile(keys_ptr, perm_ptr, segid_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, pid, t, slice_no, s0, send, N, B, D, w_off, col_off, row_start, sumD, slot, lr, eps, DP, False, LANES, PMIN, PMAX, MINW, ADAGRAD, 4)


@triton.jit
def _fix_row(keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, p0, nprog, s0, send, slot_base, pfirst,
             D, w_off, row_start, lr, eps, DP: tl.constexpr, EXACT: tl.constexpr, LANES: tl.constexpr, PMIN: tl.constexpr,
             PMAX: tl.constexpr, QLANES: tl.constexpr, ADAGRAD: tl.constexpr):
    """The run that begins (crossing) in slice p0: its row is the key of p0's last lookup; it continues
    through the slices whose flags say 'one run, crossing' and ends in the first slice that is not.
    Sum p0's tail partial and the head partials of the slices after it, then update the row."""
    P: tl.constexpr = min(max(LANES // DP, PMIN), PMAX)  # the backward launch's slice length
    Q: tl.constexpr = min(max(QLANES // DP, 16), 256)
    col = tl.arange(0, DP)
    if EXACT:
        cmask = col < DP
    else:
        cmask = col < D
    last = tl.minimum(s0 + (p0 - pfirst + 1) * P, send) - 1
    key = tl.load(keys_ptr + last).to(tl.int64)
    acc = tl.load(slot_last_ptr + slot_base + (p0 - pfirst) * D + col, mask=cmask, other=0.0)
    acc2 = tl.zeros((Q, DP), dtype=tl.float32)
    q0 = p0 + 1
    more = p0 >= 0
    while more:
        q = q0 + tl.arange(0, Q)
        f = tl.load(flags_ptr + q, mask=q < nprog, other=0).to(tl.int32)
        through = (f & 3) == 3  # one run, crossing into the next slice
        stop = tl.min(tl.where(through, nprog, q), axis=0)  # the slice where the run ends
        qa = slot_base + (q - pfirst) * D
        acc2 += tl.load(slot_first_ptr + qa[:, None] + col[None, :], mask=(q <= stop)[:, None] & cmask[None, :], other=0.0)
        more = stop >= q0 + Q
        q0 += Q
    g = (acc + tl.sum(acc2, axis=0))[None, :]
    waddr = (w_off + (key - row_start) * D + col)[None, :]
    keys = key + tl.zeros((1,), dtype=tl.int64)
    rmask = keys >= 0
    wmask = rmask[:, None] & cmask[None, :]
    w = tl.load(w_ptr + waddr, mask=wmask, other=0.0)
    if ADAGRAD:
        st = tl.load(state_ptr + keys, mask=rmask, other=0.0)
    else:
        st = tl.zeros((1,), dtype=tl.float32)
    _apply_rows(w_ptr, state_ptr, keys, waddr, w, st, g, wmask, rmask, D, lr, eps, ADAGRAD)


@triton.jit
def _fix_at(p0, keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, meta_ptr, prog_table_ptr,
            dyn_ptr, T, nprog, lr, eps, CLASSES: tl.constexpr, LANES: tl.constexpr, PMIN: tl.constexpr,
            PMAX: tl.constexpr, QLANES: tl.constexpr, ADAGRAD: tl.constexpr):
    """Fix up the crossing run that begins in slice p0 (its table's dim class picks the tile)."""
    t = tl.load(prog_table_ptr + p0)
    cls = tl.load(meta_ptr + t)
    D = tl.load(meta_ptr + T + t)
    w_off = tl.load(meta_ptr + 2 * T + t)
    row_start = tl.load(meta_ptr + 4 * T + t)
    pfirst = tl.load(dyn_ptr + t)
    s0 = tl.load(dyn_ptr + T + t)
    send = tl.load(dyn_ptr + 2 * T + t)
    slot_base = tl.load(dyn_ptr + 3 * T + t)
    for c in tl.static_range(14):  # as in _fwd_kernel
        if CLASSES & (1 << c):
            if cls == c:
                _fix_row(keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, p0, nprog, s0, send, slot_base, pfirst, D, w_off, row_start, lr, eps, 4 << (c % 7), c < 7, LANES, PMIN, PMAX, QLANES, ADAGRAD)


@triton.jit
def _fix_kernel(keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, first, meta_ptr, prog_table_ptr,
                dyn_ptr, T, nprog, lr, eps, CLASSES: tl.constexpr, LANES: tl.constexpr, PMIN: tl.constexpr,
                PMAX: tl.constexpr, QLANES: tl.constexpr, ADAGRAD: tl.constexpr):
    """One program per slice of one backward launch: if a crossing run begins in the slice, fix it
    up. The programs read the flags themselves, so the host never reads them back (no sync); most
    exit after one load."""
    p0 = first + tl.program_id(0)
    if (tl.load(flags_ptr + p0).to(tl.int32) & 8) != 0:
        _fix_at(p0, keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, meta_ptr, prog_table_ptr,
                dyn_ptr, T, nprog, lr, eps, CLASSES, LANES, PMIN, PMAX, QLANES, ADAGRAD)


# ------------------------------------------------------------------------------------------------
# the TBE
# ------------------------------------------------------------------------------------------------


class TritonTBE(TBE):
    kernel = "triton"

    def __init__(self, rows: Sequence[int], dims: Sequence[int], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cuda", seed: int = 0,
                 fwd_lanes: int = FWD_LANES, fwd_unroll: int = FWD_UNROLL, fwd_warps: int = FWD_WARPS,
                 bwd_lanes: int = BWD_LANES, bwd_pmin: int = BWD_PMIN, bwd_warps: int = BWD_WARPS,
                 bwd_reduce: str = BWD_REDUCE, bwd_pmax: int | None = None) -> None:
        super().__init__(rows, dims, precision, optimizer, lr, eps, device, seed)
        self.fwd_lanes, self.fwd_unroll, self.fwd_warps = int(fwd_lanes), int(fwd_unroll), int(fwd_warps)
        self.bwd_lanes, self.bwd_pmin, self.bwd_warps = int(bwd_lanes), int(bwd_pmin), int(bwd_warps)
        if bwd_reduce not in ("dot", "scan"):
            raise ValueError(f"bwd_reduce must be 'dot' or 'scan', got {bwd_reduce!r}")
        self.bwd_reduce = bwd_reduce
        self.bwd_pmax = int(bwd_pmax if bwd_pmax is not None else (BWD_PMAX if bwd_reduce == "dot" else 1 << 30))
        if bwd_reduce == "dot" and (self.bwd_pmin < 16 or self.bwd_pmax < 16):
            raise ValueError("bwd_reduce='dot' needs bwd_pmin and bwd_pmax >= 16 (tl.dot's smallest tile)")
        for name in ("fwd_lanes", "bwd_lanes", "bwd_pmin", "bwd_pmax"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        T = self.num_tables
        self._w_off, self._row_start = [], [0]
        off = 0
        for r, d in zip(self.rows, self.dims):
            self._w_off.append(off)
            off += -(-r * d // ALIGN) * ALIGN
            self._row_start.append(self._row_start[-1] + r)
        self._flat = torch.empty(max(off, 1), dtype=self.dtype, device=self.device)
        for t in range(T):
            init_table_(self._table_view(t), self.seed, t)
        total_rows = self._row_start[-1]
        self._key_dtype = torch.int32 if total_rows < 2**31 - 1 else torch.int64
        self._state = torch.zeros(total_rows, dtype=torch.float32, device=self.device) if self.optimizer == "rowwise_adagrad" else None
        self._cls = [_dim_class(d) for d in self.dims]
        # Branches compiled into the kernels: every power-of-two class, plus every other-dim class if the
        # shard has any other dim. Two compiled variants per dtype/optimizer serve every shard (a
        # compile of the backward costs seconds; one per class subset would recompile per shard).
        self._classes = (1 << NUM_DP) - 1
        if any(c >= NUM_DP for c in self._cls):
            self._classes = (1 << (2 * NUM_DP)) - 1
        meta = torch.tensor([self._cls, self.dims, self._w_off, self.col_offsets[:-1], self._row_start[:-1]], dtype=torch.int64)
        self._meta = meta.to(self.device).contiguous()
        self._row_start_dev = torch.tensor(self._row_start[:-1], dtype=torch.int64, device=self.device)
        self._vec = 16 // self._flat.element_size()  # elements per 16-byte vector
        self._fwd_grid_cache: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._bwd_order = sorted(range(T), key=lambda t: (self._cls[t], t))
        self._bwd_order_dev = torch.tensor(self._bwd_order, dtype=torch.int32, device=self.device)
        self._bwd_p = [_bwd_slice(d, self.bwd_lanes, self.bwd_pmin, self.bwd_pmax) for d in self.dims]
        self._saved = None
        self._last = None  # (lookups, slices, flags) of the last backward, for last_backward_stats
        # the per-table lookup counts, read back to the host during the forward (see _prefetch_bounds)
        on_gpu = self.device.type == "cuda"
        self._bounds_host = torch.empty(T + 1, dtype=torch.int64, pin_memory=on_gpu)
        self._bounds_ready = torch.cuda.Event() if on_gpu else None
        self._side = torch.cuda.Stream(self.device) if on_gpu else None

    # ---------------------------------------------------------------- weights
    def _table_view(self, t: int) -> torch.Tensor:
        o = self._w_off[t]
        return self._flat[o:o + self.rows[t] * self.dims[t]].view(self.rows[t], self.dims[t])

    def weights(self, t: int) -> torch.Tensor:
        self._check_table(t)
        return self._table_view(t)

    def set_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_weights(t, w)
        self._table_view(t).copy_(w)

    # ---------------------------------------------------------------- forward
    def _fwd_grid(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = self._fwd_grid_cache.get(batch)
        if g is None:
            counts = [-(-batch // _fwd_bags(d, self.fwd_lanes)) for d in self.dims]
            pfirst = [0]
            for c in counts:
                pfirst.append(pfirst[-1] + c)
            prog_table = torch.repeat_interleave(
                torch.arange(self.num_tables, dtype=torch.int32, device=self.device), torch.tensor(counts, device=self.device), output_size=pfirst[-1]
            )
            g = (prog_table, torch.tensor(pfirst[:-1], dtype=torch.int64, device=self.device), pfirst[-1])
            self._fwd_grid_cache[batch] = g
        return g

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = self._check_inputs(indices, offsets)
        indices = indices.contiguous()
        offsets = offsets.contiguous()
        out = self._new_output(batch)
        self._saved = (indices, offsets, batch)
        if batch == 0:
            return out
        self._prefetch_bounds(offsets, batch)
        prog_table, pfirst, nprog = self._fwd_grid(batch)
        _fwd_kernel[(nprog,)](
            indices, offsets, self._flat, out, self._meta, prog_table, pfirst, self.num_tables, batch, self.total_dim,
            CLASSES=self._classes, LANES=self.fwd_lanes, UNROLL=self.fwd_unroll, VEC=self._vec, num_warps=self.fwd_warps,
        )
        return out

    def _prefetch_bounds(self, offsets: torch.Tensor, batch: int) -> None:
        """Copy each table's lookup range (offsets[t * batch]) to the host on a side stream.

        The backward's grid (slices per table) depends on these counts. Reading them back in the
        backward would stall the host until the GPU drained its queue and leave the GPU idle while
        the host then launched the backward; read now, they are on the host long before the
        backward needs them, and the backward never waits for the GPU."""
        if self._side is None:  # the Triton interpreter runs on CPU tensors
            self._bounds_host.copy_(offsets[::batch])
            return
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)  # the offsets are written on the main stream
        with torch.cuda.stream(self._side):
            self._bounds_host.copy_(offsets[::batch], non_blocking=True)
            self._bounds_ready.record(self._side)
        offsets.record_stream(self._side)

    @property
    def last_backward_stats(self) -> dict[str, int]:
        """Lookups, slices and crossing (hot) rows of the last backward; reads the GPU, so only for tests."""
        if self._last is None:
            return {}
        n, nprog, flags = self._last
        return {"lookups": n, "slices": nprog, "crossing_rows": int(((flags.to(torch.int32) & 8) != 0).sum()) if flags is not None else 0}

    # ---------------------------------------------------------------- backward
    def backward(self, grad_output: torch.Tensor) -> None:
        if self._saved is None:
            raise RuntimeError("backward() needs a forward() first")
        indices, offsets, batch = self._saved
        self._check_grad(grad_output, batch)
        n = indices.numel()
        if batch == 0 or n == 0:
            return
        T, dev = self.num_tables, self.device
        grad = grad_output.to(self.dtype).contiguous()
        # 1. global row and bag of every lookup
        keys = torch.empty(n, dtype=self._key_dtype, device=dev)
        segid = torch.empty(n, dtype=torch.int32, device=dev)
        nblk = triton.cdiv(n, KEYS_BLOCK)
        first = torch.arange(0, nblk * KEYS_BLOCK, KEYS_BLOCK, device=dev, dtype=offsets.dtype)
        bstart = torch.searchsorted(offsets, first, right=True) - 1  # bag of each block's first lookup
        bstart = torch.cat([bstart, torch.full((1,), offsets.numel() - 2, dtype=bstart.dtype, device=dev)])
        _keys_kernel[(nblk,)](indices, offsets, self._row_start_dev, bstart, keys, segid, n, batch, BLOCK=KEYS_BLOCK, num_warps=4)
        # 2. group by row
        keys_sorted, perm = torch.sort(keys, stable=True)
        # 3. slices of the sorted lookups, per table
        if self._bounds_ready is not None:
            self._bounds_ready.synchronize()  # copied during the forward: long done, no GPU stall
        bounds = self._bounds_host.tolist()  # [T+1] lookup range of each table
        counts = [-(-(bounds[t + 1] - bounds[t]) // self._bwd_p[t]) for t in range(T)]
        # slices are numbered table by table, tables grouped by dim class: one launch per class, each
        # compiled for its own tile shape (registers are sized for the largest branch of a kernel)
        pfirst, slot_base = [0] * T, [0] * T
        nprog = nslot = 0
        launches = []
        for t in self._bwd_order:
            if launches and launches[-1][0] == self._cls[t]:
                launches[-1][2] += counts[t]
            else:
                launches.append([self._cls[t], nprog, counts[t]])
            pfirst[t], slot_base[t] = nprog, nslot
            nprog += counts[t]
            nslot += counts[t] * self.dims[t]
        dyn_host = torch.tensor([pfirst, bounds[:-1], bounds[1:], slot_base, [counts[t] for t in self._bwd_order]], dtype=torch.int64)
        dyn = dyn_host.to(dev, non_blocking=True).contiguous()
        prog_table = torch.repeat_interleave(self._bwd_order_dev, dyn[4], output_size=nprog)
        slot_first = torch.empty(max(nslot, 1), dtype=torch.float32, device=dev)
        slot_last = torch.empty(max(nslot, 1), dtype=torch.float32, device=dev)
        flags = torch.empty(nprog, dtype=torch.int8, device=dev)
        adagrad = self.optimizer == "rowwise_adagrad"
        state = self._state if adagrad else self._flat  # unused pointer when SGD
        for cls, first, count in launches:
            if count == 0:
                continue
            _bwd_kernel[(count,)](
                keys_sorted, perm, segid, grad, self._flat, state, slot_first, slot_last, flags,
                self._meta, prog_table, dyn, first, T, n, batch, self.total_dim, self.lr, self.eps,
                CLASSES=1 << cls, LANES=self.bwd_lanes, PMIN=self.bwd_pmin, PMAX=self.bwd_pmax,
                MINW=16 if self.bwd_reduce == "dot" else 1, ADAGRAD=adagrad, VEC=self._vec,
                num_warps=self.bwd_warps,
            )
        # 4. rows whose run crosses slices: one fix-up program per slice, which checks the slice's flags
        # itself (one launch per class, like the backward's; no host read-back)
        self._last = (n, nprog, flags)
        for cls, first, count in launches:
            if count == 0:
                continue
            _fix_kernel[(count,)](
                keys_sorted, self._flat, state, slot_first, slot_last, flags, first, self._meta, prog_table, dyn,
                T, nprog, self.lr, self.eps, CLASSES=1 << cls, LANES=self.bwd_lanes, PMIN=self.bwd_pmin, PMAX=self.bwd_pmax,
                QLANES=FIX_QLANES, ADAGRAD=adagrad, num_warps=FIX_WARPS if DP_CLASSES[cls % NUM_DP] < 128 else 4,
            )
