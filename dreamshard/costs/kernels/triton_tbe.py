"""A fused TBE of our own in Triton, for CUDA machines without FBGEMM.

Layout: all tables live in one flat weight buffer (table t at element ``w_off[t]``, row-major
``[rows, dim]``, each table's start padded to 16 elements), with per-table metadata arrays
(dim class, dim, weight offset, output column offset, first global row).

forward - ONE launch over every table of the shard. The grid is a flat list of programs, each a
(table, block of bags) pair; a program handles ``BAGS = FWD_LANES // DP`` bags of one table as a
``[BAGS, DP]`` tile (``DP`` = dim rounded up to a power of two, up to 1,024), walks the bags'
lookups in step (unrolled), gathers the rows with 16-byte vector loads and accumulates in fp32.
Mixed dims share the launch through a branch on the table's dim class, each branch compiled with
its own tile shape. Masked columns move no bytes, so a padded tile costs lanes, not bandwidth.

backward - no atomics on the weights, every row updated once, in a fixed summation order:
  1. one launch writes, per lookup, its global row (``row_start[t] + index``) and its bag
     (lookup-parallel, coalesced; the bag comes from a binary search over ``offsets``);
  2. ``torch.sort`` (stable radix sort, int32 keys) groups the lookups by global row;
  3. the sorted lookups of each table are cut into equal *ranges* (thousands of lookups: as many
     ranges as keep every SM busy, see ``_ranges``), and each range into *column blocks* of the
     table's dim (``TW`` columns, chosen per dim so that dims like 192 or 320 are covered by
     3 x 64 and 5 x 64 columns, not padded to 256 or 512). One program per (range, column
     block) walks its range in chunks of ``P`` lookups: it gathers the chunk's output-gradient
     rows as a ``[P, TW]`` tile, sums the lookups of each row with a 0/1 "same row" ``[P, P]``
     matrix times the tile (tensor cores for fp16: exact products, fp32 accumulation), adds the
     sum carried over from the previous chunk to the chunk's first row (through the range's
     partial-sum slot: a carry held in registers cost ~80 of them), and applies the optimizer
     once to every row whose lookups all lie in the range. So a hot row is summed chunk after
     chunk within its ranges, with one partial per range, not one per chunk;
  4. rows whose lookups cross range boundaries (only the first and last row of a range can)
     leave fp32 partial sums; a fix-up launch, one program per range, checks whether such a row
     begins in its range, sums the partials along the row's ranges and updates the row once.
A range holds thousands of lookups, so even a row read millions of times spans only a few
hundred ranges. The backward never waits for the GPU: the range grid needs each table's lookup
count, which the forward already copied to the host on a side stream, and the fix-up finds its
work on the device. So the host can enqueue a training step ahead of the GPU, as with FBGEMM's TBE.
Row-wise Adagrad needs a row's whole gradient before any column is updated, so its tables use
one column block of the dim rounded up to a power of two.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from dreamshard.costs.kernels.base import TBE, init_table_

DP_CLASSES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
NUM_DP = len(DP_CLASSES)  # the kernels spell it as the literal 9 (the interpreter can't mix constexpr and int)
assert NUM_DP == 9
ALIGN = 16  # table starts in the flat buffer are multiples of this many elements

# Tunables (the defaults were chosen on an H200: docs/kernels.md).
FWD_LANES = 1024  # elements of one forward tile: BAGS = FWD_LANES // DP
FWD_UNROLL = 4  # lookups per bag issued together
FWD_WARPS = 4
BWD_LANES = 1024  # elements of one backward chunk: P = min(max(BWD_LANES // TW, 16), BWD_PMAX) lookups
BWD_PMAX = 32  # the [P, P] 'same row' matrix lives in registers: 32 x 32 at most
BWD_MAX_TW = 256  # widest column block of an SGD backward (wider dims are cut into blocks)
BWD_PROGRAMS = 32768  # (range, column block) programs a backward aims for: enough to fill every SM a few times
BWD_MAX_CHUNKS = 512  # at most this many chunks per range (bounds a program's serial walk)
BWD_WARPS = 4
KEYS_BLOCK = 1024  # lookups per program of the key-building launch
FIX_QLANES = 2048  # elements per step of the fix-up launch: Q = min(max(FIX_QLANES // TW, 16), 256) ranges
FIX_WARPS = 2
TW_CLASSES = (16, 32, 64, 128, 256, 512, 1024)  # backward tile widths (tl.dot needs >= 16)
NUM_TW = len(TW_CLASSES)  # spelled as the literal 7 in the kernels
assert NUM_TW == 7


def _dp(dim: int) -> int:
    return max(4, 1 << (int(dim) - 1).bit_length())


def _dim_class(dim: int) -> int:
    """0..8: power-of-two dims 4..1024 (no column mask); 9..17: other dims, masked, class of DP."""
    dp = _dp(dim)
    return DP_CLASSES.index(dp) + (0 if dp == dim else NUM_DP)


def _fwd_bags(dim: int, lanes: int) -> int:
    return max(1, lanes // _dp(dim))


def _bwd_tile_width(dim: int, whole_row: bool, max_tw: int) -> int:
    """Columns of one backward block for a table of this dim.

    A whole row (row-wise Adagrad needs every column's gradient before it updates one): the dim
    rounded up to a power of two. Otherwise the width whose blocks cover the dim with the fewest
    padded columns, each block costing about 16 more elements (its own pass over the chunk's
    keys, positions and bags): 192 -> 3 x 64, 320 -> 5 x 64, 48 -> 1 x 64, 1024 -> 4 x 256."""
    if whole_row:
        return max(TW_CLASSES[0], 1 << (int(dim) - 1).bit_length())
    best = None
    for tw in TW_CLASSES:
        if tw > max_tw:
            break
        blocks = -(-dim // tw)
        cost = blocks * tw + 16 * blocks
        if best is None or cost < best[0] or (cost == best[0] and tw > best[1]):
            best = (cost, tw)
    return best[1]


def _bwd_class(dim: int, tw: int) -> int:
    """0..6: dims that are a multiple of the block width (no column mask); 7..13: masked."""
    return TW_CLASSES.index(tw) + (0 if dim % tw == 0 else NUM_TW)


def _chunk(tw: int, lanes: int, pmax: int) -> int:
    return min(max(lanes // tw, 16), pmax)


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
    # width as a compile-time constant (classes 0..8 exact power-of-two dims, 9..17 masked)
    for c in tl.static_range(18):
        if CLASSES & (1 << c):
            if cls == c:
                DP: tl.constexpr = 4 << (c % 9)
                if c < 9:
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
def _apply_rows(w_ptr, state_ptr, key, waddr, w, st, g, wmask2, rmask, D, lr, eps, ADAGRAD: tl.constexpr):
    """Optimizer update of rows (one per tile row): fp32 gradient sums g [R, TW], current rows w
    (loaded by the caller, any dtype) and, for Adagrad, their states st [R] (g then covers the
    whole row)."""
    if ADAGRAD:
        st = st + tl.sum(g * g, axis=1) / D.to(tl.float32)
        tl.store(state_ptr + key, st, mask=rmask)
        upd = tl.div_rn(g, (tl.sqrt_rn(st) + eps)[:, None] + tl.zeros_like(g))
    else:
        upd = g
    tl.store(w_ptr + waddr, (w.to(tl.float32) - lr * upd).to(w_ptr.dtype.element_ty), mask=wmask2)


@triton.jit
def _bwd_range(keys_ptr, segs_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr,
               pid, cb, t, r0, r1, s0, send, B, D, w_off, col_off, row_start, sumD, slot, lr, eps,
               TW: tl.constexpr, EXACT: tl.constexpr, P: tl.constexpr, ADAGRAD: tl.constexpr, VEC: tl.constexpr):
    """Sorted lookups [r0, r1) of table t, columns [cb*TW, cb*TW + TW) of its dim (see the module doc)."""
    kfirst = tl.load(keys_ptr + r0)
    klast = tl.load(keys_ptr + r1 - 1)
    # a row can cross the range's ends only as its first or last row (the keys are sorted)
    head_p = tl.load(keys_ptr + r0 - 1, mask=r0 > s0, other=-1) == kfirst
    tail_p = tl.load(keys_ptr + r1, mask=r1 < send, other=-1) == klast
    single = kfirst == klast
    c0 = cb * TW
    col = tl.arange(0, TW)
    if EXACT:
        cmask = col < TW
    else:
        cmask = (c0 + col) < D
    lane = tl.arange(0, P)
    sl = tl.multiple_of(slot + c0 + tl.zeros((P,), dtype=tl.int64), 4)
    for s in range(r0, r1, P):
        # the sorted lookups' rows and bags: two coalesced loads, the only ones the gather waits for
        pos = s + lane
        m = pos < r1
        key = tl.load(keys_ptr + pos, mask=m, other=-1)
        seg = tl.load(segs_ptr + pos, mask=m, other=0)
        key_next = tl.load(keys_ptr + pos + 1, mask=pos + 1 < r1, other=-3)
        is_end = m & (key != key_next)  # the row's last lookup in this range
        ours = is_end & ((key != kfirst) | (head_p == 0)) & ((key != klast) | (tail_p == 0))
        local = (key - row_start).to(tl.int64)
        if EXACT:
            wmask = tl.broadcast_to(ours[:, None], (P, TW))
        else:
            wmask = ours[:, None] & cmask[None, :]
        b = (seg - t * B).to(tl.int64)
        gaddr = tl.multiple_of(b * sumD + col_off + c0, 4)
        g = tl.load(grad_ptr + gaddr[:, None] + col[None, :], mask=m[:, None] & cmask[None, :], other=0.0)
        # acc[i] = sum of g[j] over the chunk's lookups j of i's row: a 0/1 [P, P] matrix times g
        same = (key[:, None] == key[None, :]) & m[None, :]
        if g.dtype == tl.float16:
            acc = tl.dot(same.to(tl.float16), g, out_dtype=tl.float32)
        else:
            acc = tl.dot(same.to(tl.float32), g.to(tl.float32), input_precision="ieee")
        # the chunk's first row may have begun in an earlier chunk: its sum so far was left in the
        # range's slot_last (memory, not registers: a [TW] carry in registers costs ~80 of them)
        kprev = tl.load(keys_ptr + s - 1, mask=s > r0, other=-1)
        acc += tl.load(slot_last_ptr + sl[:, None] + col[None, :], mask=(key == kprev)[:, None] & cmask[None, :], other=0.0)
        if EXACT:
            waddr = tl.multiple_of(w_off + local * D + c0, VEC)[:, None] + col[None, :]
        else:
            waddr = tl.multiple_of(w_off + local * D + c0, 4)[:, None] + col[None, :]
        # the rows updated here are loaded only now: loaded before the gather (to overlap it) they
        # cost ~50 more registers and measured no faster
        w = tl.load(w_ptr + waddr, mask=wmask, other=0.0)
        if ADAGRAD:
            st = tl.load(state_ptr + key, mask=ours, other=0.0)
        else:
            st = tl.zeros((P,), dtype=tl.float32)
        _apply_rows(w_ptr, state_ptr, key, waddr, w, st, acc, wmask, ours, D, lr, eps, ADAGRAD)
        # rows that cross the range's ends: fp32 partial sums for the fix-up launch. slot_last also
        # holds the last row's sum so far for the next chunk; at the range's end, the sum of its tail
        # row, which the fix-up reads. Barriers: every thread has read the carry before it is
        # overwritten, and the new carry is written before the next chunk reads it.
        tl.debug_barrier()
        wr_first = is_end & (key == kfirst) & (head_p | (tail_p & single))
        tl.store(slot_first_ptr + sl[:, None] + col[None, :], acc, mask=wr_first[:, None] & cmask[None, :])
        tl.store(slot_last_ptr + sl[:, None] + col[None, :], acc, mask=(lane == tl.minimum(r1 - s, P) - 1)[:, None] & cmask[None, :])
        tl.debug_barrier()
    if cb == 0:
        # bit 0: a row crosses into the next range; bit 1: one row only; bit 2: a row comes from the
        # previous range; bit 3: a crossing row begins here (the fix-up launch starts from these ranges)
        tail_i = tail_p.to(tl.int32)
        head_i = head_p.to(tl.int32)
        single_i = single.to(tl.int32)
        begins = tail_i * (1 - head_i * single_i)
        tl.store(flags_ptr + pid, (tail_i + 2 * single_i + 4 * head_i + 8 * begins).to(tl.int8))


@triton.jit
def _bwd_kernel(keys_ptr, segs_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr,
                meta_ptr, prog_table_ptr, dyn_ptr, pid_base, T, B, sumD, lr, eps,
                CLASSES: tl.constexpr, LANES: tl.constexpr, PMAX: tl.constexpr, ADAGRAD: tl.constexpr, VEC: tl.constexpr):
    pid = tl.program_id(0) + pid_base
    cb = tl.program_id(1)
    t = tl.load(prog_table_ptr + pid)
    D = tl.load(meta_ptr + T + t)
    tw = tl.load(dyn_ptr + 5 * T + t)
    if cb * tw < D:  # the launch's grid has the most column blocks of any of its tables
        cls = tl.load(dyn_ptr + 6 * T + t)
        w_off = tl.multiple_of(tl.load(meta_ptr + 2 * T + t), 16)
        col_off = tl.load(meta_ptr + 3 * T + t)
        row_start = tl.load(meta_ptr + 4 * T + t)
        # dyn: [first range, lookup start, lookup end, slot base, range length, tile width, class] x T
        range_no = pid - tl.load(dyn_ptr + t)
        s0 = tl.load(dyn_ptr + T + t)
        send = tl.load(dyn_ptr + 2 * T + t)
        rlen = tl.load(dyn_ptr + 4 * T + t)
        r0 = s0 + range_no * rlen
        r1 = tl.minimum(r0 + rlen, send)
        slot = tl.load(dyn_ptr + 3 * T + t) + range_no * D
        for c in tl.static_range(14):  # one branch per tile class the launch may have (as in _fwd_kernel)
            if CLASSES & (1 << c):
                if cls == c:
                    TW: tl.constexpr = 16 << (c % 7)
                    P: tl.constexpr = min(max(LANES // TW, 16), PMAX)
                    _bwd_range(keys_ptr, segs_ptr, grad_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr,
                               pid, cb, t, r0, r1, s0, send, B, D, w_off, col_off, row_start, sumD, slot, lr, eps,
                               TW, c < 7, P, ADAGRAD, min(VEC, TW))


@triton.jit
def _fix_row(keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, p0, cb, nprog, s0, send, rlen,
             slot_base, pfirst, D, w_off, row_start, lr, eps, TW: tl.constexpr, EXACT: tl.constexpr,
             QLANES: tl.constexpr, ADAGRAD: tl.constexpr):
    """The row that begins (crossing) in range p0: it is the key of p0's last lookup; it continues
    through the ranges whose flags say 'one row, crossing' and ends in the first range that is not.
    Sum p0's tail partial and the head partials of the ranges after it, then update the row once."""
    Q: tl.constexpr = min(max(QLANES // TW, 16), 256)
    c0 = cb * TW
    col = tl.arange(0, TW)
    if EXACT:
        cmask = col < TW
    else:
        cmask = (c0 + col) < D
    last = tl.minimum(s0 + (p0 - pfirst + 1) * rlen, send) - 1
    key = tl.load(keys_ptr + last).to(tl.int64)
    acc = tl.load(slot_last_ptr + slot_base + (p0 - pfirst) * D + c0 + col, mask=cmask, other=0.0)
    acc2 = tl.zeros((Q, TW), dtype=tl.float32)
    q0 = p0 + 1
    more = p0 >= 0
    while more:
        q = q0 + tl.arange(0, Q)
        f = tl.load(flags_ptr + q, mask=q < nprog, other=0).to(tl.int32)
        through = (f & 3) == 3  # one row, crossing into the next range
        stop = tl.min(tl.where(through, nprog, q), axis=0)  # the range where the row ends
        qa = slot_base + (q - pfirst) * D + c0
        acc2 += tl.load(slot_first_ptr + qa[:, None] + col[None, :], mask=(q <= stop)[:, None] & cmask[None, :], other=0.0)
        more = stop >= q0 + Q
        q0 += Q
    g = (acc + tl.sum(acc2, axis=0))[None, :]
    waddr = (w_off + (key - row_start) * D + c0 + col)[None, :]
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
def _fix_kernel(keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, first, meta_ptr, prog_table_ptr,
                dyn_ptr, T, nprog, lr, eps, CLASSES: tl.constexpr, QLANES: tl.constexpr, ADAGRAD: tl.constexpr):
    """One program per (range, column block) of one backward launch: if a crossing row begins in the
    range, fix it up. The programs read the flags themselves, so the host never reads them back (no
    sync); most exit after one load."""
    p0 = first + tl.program_id(0)
    cb = tl.program_id(1)
    if (tl.load(flags_ptr + p0).to(tl.int32) & 8) != 0:
        t = tl.load(prog_table_ptr + p0)
        D = tl.load(meta_ptr + T + t)
        tw = tl.load(dyn_ptr + 5 * T + t)
        if cb * tw < D:
            cls = tl.load(dyn_ptr + 6 * T + t)
            w_off = tl.load(meta_ptr + 2 * T + t)
            row_start = tl.load(meta_ptr + 4 * T + t)
            pfirst = tl.load(dyn_ptr + t)
            s0 = tl.load(dyn_ptr + T + t)
            send = tl.load(dyn_ptr + 2 * T + t)
            slot_base = tl.load(dyn_ptr + 3 * T + t)
            rlen = tl.load(dyn_ptr + 4 * T + t)
            for c in tl.static_range(14):  # as in _bwd_kernel
                if CLASSES & (1 << c):
                    if cls == c:
                        _fix_row(keys_ptr, w_ptr, state_ptr, slot_first_ptr, slot_last_ptr, flags_ptr, p0, cb, nprog, s0, send,
                                 rlen, slot_base, pfirst, D, w_off, row_start, lr, eps, 16 << (c % 7), c < 7, QLANES, ADAGRAD)


# ------------------------------------------------------------------------------------------------
# the TBE
# ------------------------------------------------------------------------------------------------


class TritonTBE(TBE):
    kernel = "triton"

    def __init__(self, rows: Sequence[int], dims: Sequence[int], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cuda", seed: int = 0,
                 fwd_lanes: int = FWD_LANES, fwd_unroll: int = FWD_UNROLL, fwd_warps: int = FWD_WARPS,
                 bwd_lanes: int = BWD_LANES, bwd_pmax: int = BWD_PMAX, bwd_warps: int = BWD_WARPS,
                 bwd_max_tw: int = BWD_MAX_TW, bwd_programs: int = BWD_PROGRAMS, bwd_max_chunks: int = BWD_MAX_CHUNKS) -> None:
        super().__init__(rows, dims, precision, optimizer, lr, eps, device, seed)
        self.fwd_lanes, self.fwd_unroll, self.fwd_warps = int(fwd_lanes), int(fwd_unroll), int(fwd_warps)
        self.bwd_lanes, self.bwd_pmax, self.bwd_warps = int(bwd_lanes), int(bwd_pmax), int(bwd_warps)
        self.bwd_max_tw, self.bwd_programs, self.bwd_max_chunks = int(bwd_max_tw), int(bwd_programs), int(bwd_max_chunks)
        for name in ("fwd_lanes", "bwd_lanes", "bwd_pmax", "bwd_max_tw"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.bwd_pmax < 16 or self.bwd_max_tw < 16:
            raise ValueError("bwd_pmax and bwd_max_tw must be >= 16 (tl.dot's smallest tile)")
        if self.bwd_programs < 1 or self.bwd_max_chunks < 1:
            raise ValueError("bwd_programs and bwd_max_chunks must be >= 1")
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
        # the radix sort's passes follow the key's width: 16-bit keys (shards of < 32k rows, the hot
        # tables) sort in 2 passes instead of 4
        self._key_dtype = torch.int16 if total_rows < 2**15 - 1 else torch.int32 if total_rows < 2**31 - 1 else torch.int64
        self._state = torch.zeros(total_rows, dtype=torch.float32, device=self.device) if self.optimizer == "rowwise_adagrad" else None
        self._cls = [_dim_class(d) for d in self.dims]
        # Forward branches compiled in: every power-of-two class up to 256, plus the other-dim classes if
        # the shard has any other dim, plus the classes over 256 if it has any such dim (their tiles
        # need the most registers, and a kernel's registers are sized for its largest branch). Four
        # compiled variants per dtype serve every shard (a compile costs seconds).
        narrow = (1 << 7) - 1
        wide = (1 << 7) | (1 << 8)
        masked = any(c >= NUM_DP for c in self._cls)
        self._classes = narrow | (narrow << NUM_DP if masked else 0)
        if max(self.dims) > 256:
            self._classes |= wide | (wide << NUM_DP if masked else 0)
        meta = torch.tensor([self._cls, self.dims, self._w_off, self.col_offsets[:-1], self._row_start[:-1]], dtype=torch.int64)
        self._meta = meta.to(self.device).contiguous()
        self._row_start_dev = torch.tensor(self._row_start[:-1], dtype=torch.int64, device=self.device)
        self._vec = 16 // self._flat.element_size()  # elements per 16-byte vector
        self._fwd_grid_cache: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        # backward: each table's column-block width, tile class, blocks and chunk length; tables
        # grouped by tile class, one launch per class (each compiled for its own tile shape)
        whole_row = self.optimizer == "rowwise_adagrad"
        self._tw = [_bwd_tile_width(d, whole_row, self.bwd_max_tw) for d in self.dims]
        self._bcls = [_bwd_class(d, tw) for d, tw in zip(self.dims, self._tw)]
        self._nblk = [-(-d // tw) for d, tw in zip(self.dims, self._tw)]
        self._chunk = [_chunk(tw, self.bwd_lanes, self.bwd_pmax) for tw in self._tw]
        self._bwd_order = sorted(range(T), key=lambda t: (self._bcls[t], t))
        self._bwd_order_dev = torch.tensor(self._bwd_order, dtype=torch.int32, device=self.device)
        self._saved = None
        self._last = None  # (lookups, ranges, flags) of the last backward, for last_backward_stats
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
            CLASSES=self._classes, LANES=self.fwd_lanes, UNROLL=self.fwd_unroll, VEC=self._vec,
            num_warps=self.fwd_warps if max(self.dims) <= 256 else 8,
        )
        return out

    def _prefetch_bounds(self, offsets: torch.Tensor, batch: int) -> None:
        """Copy each table's lookup range (offsets[t * batch]) to the host on a side stream.

        The backward's grid (ranges per table) depends on these counts. Reading them back in the
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
        """Lookups, ranges and crossing (hot) rows of the last backward; reads the GPU, so only for tests."""
        if self._last is None:
            return {}
        n, nprog, flags = self._last
        return {"lookups": n, "ranges": nprog, "crossing_rows": int(((flags.to(torch.int32) & 8) != 0).sum()) if flags is not None else 0}

    # ---------------------------------------------------------------- backward
    def _range_lengths(self, lookups: list[int]) -> list[int]:
        """Lookups per range of each table: equal shares of the backward's work (gathered elements,
        padding included) over ``bwd_programs`` programs, whole chunks, at most ``bwd_max_chunks``."""
        work = sum(n * b * tw for n, b, tw in zip(lookups, self._nblk, self._tw))
        per_program = max(1, work // self.bwd_programs)
        lengths = []
        for tw, p in zip(self._tw, self._chunk):
            chunks = min(max(per_program // (p * tw), 1), self.bwd_max_chunks)
            lengths.append(chunks * p)
        return lengths

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
        # 2. group by row; the bags in sorted order (one coalesced pass, so the reduction's loads
        # of a chunk's rows and bags do not wait on each other)
        keys_sorted, perm = torch.sort(keys, stable=True)
        segs = segid[perm]
        # 3. ranges of the sorted lookups, per table
        if self._bounds_ready is not None:
            self._bounds_ready.synchronize()  # copied during the forward: long done, no GPU stall
        bounds = self._bounds_host.tolist()  # [T+1] lookup range of each table
        lookups = [bounds[t + 1] - bounds[t] for t in range(T)]
        rlen = self._range_lengths(lookups)
        counts = [-(-lookups[t] // rlen[t]) for t in range(T)]
        # ranges are numbered table by table, tables grouped by tile class: one launch per class
        pfirst, slot_base = [0] * T, [0] * T
        nprog = nslot = 0
        launches = []  # [class, first range, ranges, most column blocks]
        for t in self._bwd_order:
            if launches and launches[-1][0] == self._bcls[t]:
                launches[-1][2] += counts[t]
                launches[-1][3] = max(launches[-1][3], self._nblk[t])
            else:
                launches.append([self._bcls[t], nprog, counts[t], self._nblk[t]])
            pfirst[t], slot_base[t] = nprog, nslot
            nprog += counts[t]
            nslot += counts[t] * self.dims[t]
        dyn_host = torch.tensor([pfirst, bounds[:-1], bounds[1:], slot_base, rlen, self._tw, self._bcls,
                                 [counts[t] for t in self._bwd_order]], dtype=torch.int64)
        dyn = dyn_host.to(dev, non_blocking=True).contiguous()
        prog_table = torch.repeat_interleave(self._bwd_order_dev, dyn[7], output_size=nprog)
        slot_first = torch.empty(max(nslot, 1), dtype=torch.float32, device=dev)
        slot_last = torch.empty(max(nslot, 1), dtype=torch.float32, device=dev)
        flags = torch.empty(nprog, dtype=torch.int8, device=dev)
        adagrad = self.optimizer == "rowwise_adagrad"
        state = self._state if adagrad else self._flat  # unused pointer when SGD
        for cls, first, count, blocks in launches:
            if count == 0:
                continue
            tw = TW_CLASSES[cls % NUM_TW]
            _bwd_kernel[(count, blocks)](
                keys_sorted, segs, grad, self._flat, state, slot_first, slot_last, flags,
                self._meta, prog_table, dyn, first, T, batch, self.total_dim, self.lr, self.eps,
                CLASSES=1 << cls, LANES=self.bwd_lanes, PMAX=self.bwd_pmax, ADAGRAD=adagrad, VEC=self._vec,
                num_warps=self.bwd_warps if tw <= 256 else 8,
            )
        # 4. rows whose lookups cross ranges: one fix-up program per (range, column block), which checks
        # the range's flags itself (one launch per class, like the backward's; no host read-back)
        self._last = (n, nprog, flags)
        for cls, first, count, blocks in launches:
            if count == 0:
                continue
            tw = TW_CLASSES[cls % NUM_TW]
            _fix_kernel[(count, blocks)](
                keys_sorted, self._flat, state, slot_first, slot_last, flags, first, self._meta, prog_table, dyn,
                T, nprog, self.lr, self.eps, CLASSES=1 << cls, QLANES=FIX_QLANES, ADAGRAD=adagrad,
                num_warps=FIX_WARPS if tw < 128 else 4,
            )
