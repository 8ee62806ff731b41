"""A fused TBE of our own in Triton, for CUDA machines without FBGEMM.

Layout: all tables live in one flat weight buffer (table t at element ``w_off[t]``, row-major
``[rows, dim]``, each table's start padded to 16 elements), with per-table metadata arrays
(dim class, dim, weight offset, output column offset, first global row). Tables in host memory
(``host_tables``, the uvm tier) have buffers of their own, at offsets from the flat buffer's start
(kernels/host_memory.py): the same launches serve them.

forward - ONE launch over every table of the shard. The grid is a flat list of programs, each a
(table, block of bags) pair; a program handles ``BAGS = FWD_LANES // DP`` bags of one table as a
``[BAGS, DP]`` tile (``DP`` = dim rounded up to a power of two, up to 1,024), walks the bags'
lookups in step (unrolled), gathers the rows with 16-byte vector loads and accumulates in fp32.
Mixed dims share the launch through a branch on the table's dim class, each branch compiled with
its own tile shape. Masked columns move no bytes, so a padded tile costs lanes, not bandwidth.

backward - no atomics on the weights, every row updated once, in a fixed summation order, no loops:
  1. one launch writes, per lookup, its global row (``row_start[t] + index``) and its bag
     (lookup-parallel, coalesced; the bag comes from a binary search over ``offsets``);
  2. ``torch.sort`` (stable radix sort; int16 keys for shards of < 32k rows) groups the lookups by
     global row; the bags are gathered in sorted order;
  3. level 0: each table's sorted lookups are cut into tiles of P lookups and its dim into column
     blocks of ``TW`` columns (chosen per dim so that dims like 192 or 320 are covered by 3 x 64
     and 5 x 64 columns, not padded to 256 or 512). One program per (tile, column block), no loop:
     it loads its keys and bags, gathers the gradient rows as a ``[P, TW]`` tile together with the
     current rows it will update, sums each row's lookups with a 0/1 "same row" ``[P, P]`` matrix
     times the tile (tensor cores for fp16: exact products, fp32 accumulation) and updates every
     row whose lookups all lie in the tile. The tile's first and last rows, if they continue into
     a neighbouring tile, leave fp32 partial sums as two *entries* (key, flags, value);
  4. level k >= 1: the same kernel over level k-1's entries (2 per tile), until each table has one
     tile; a row read millions of times is summed over a few levels of fully parallel launches.
Hot small tables (a few thousand rows read millions of times) skip the sort: their gradient is a
matrix product, ``G = C @ grad``, with ``C[row, bag]`` the number of times the bag looks the row up.
One launch counts those lookups into ``C`` (fp16 atomic adds, one per warp and address: integers
below 2,048 are exact, so the counts do not depend on the adds' order; a bag longer than 2,048
lookups keeps its table on the sorted path), one multiplies ``C`` by the table's gradient columns
(tensor cores, fp32 accumulation, the bags split into a fixed number of parts summed in order), one
updates every row. It moves ``C`` (rows x bags) instead of a gradient row per lookup, so it is
chosen per table and step, where a time model fitted on an H200 puts it at half the sorted path's
time or less (``bwd_dense``) and saves more than ``bwd_dense_min_us`` (what the path costs in a
fused shard beyond that model, paths.DENSE_TABLE_US). The chosen tables run in rounds whose count matrices fit one buffer
of ``bwd_dense_elems`` (a device of hot tables would otherwise need gigabytes of counts).
The backward never waits for the GPU: the tiles of every level follow from each table's lookup
count, which the forward already copied to the host on a side stream. So the host can enqueue a
training step ahead of the GPU, as with FBGEMM's TBE. Row-wise Adagrad needs a row's whole
gradient before any column is updated, so its tables use one column block of the dim rounded up
to a power of two.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import triton
import triton.language as tl

from dreamshard.costs.kernels.base import TBE, init_table_
from dreamshard.costs.kernels.host_memory import element_offset, host_mapped
from dreamshard.costs.paths import (BWD_DENSE, BWD_DENSE_ELEMS, BWD_DENSE_ROWS, DENSE_BK, DENSE_BR, DENSE_TABLE_US, count_elems, padded_bags,
                                    product_rounds, product_tables)

DP_CLASSES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
NUM_DP = len(DP_CLASSES)  # the kernels spell it as the literal 9 (the interpreter can't mix constexpr and int)
assert NUM_DP == 9
ALIGN = 16  # table starts in the flat buffer are multiples of this many elements

# Tunables (the defaults were chosen on an H200: docs/kernels.md).
FWD_LANES = 1024  # elements of one forward tile: BAGS = FWD_LANES // DP
FWD_UNROLL = 4  # lookups per bag issued together
FWD_WARPS = 4
BWD_LANES = 4096  # elements of one level-0 tile: P = min(max(BWD_LANES // TW, 16), BWD_PMAX) lookups (half for fp32)
BWD_UP_LANES = 2048  # elements (fp32 partial sums) of one tile of the levels above
BWD_PMAX = 64  # the [P, P] 'same row' matrix: 64 x 64 at most
BWD_MAX_TW = 256  # widest column block of an SGD backward (wider dims are cut into blocks)
BWD_WARPS = 4
# Column blocks of at most BWD_NARROW_TW columns: level-0 tiles of at most BWD_NARROW_PMAX lookups, one
# warp each. The tiles are bound by instruction issue, and a program repeats its scalar work (metadata,
# neighbours, entries) in every warp: 32 x 16 tiles in one warp issue half the instructions per lookup
# of 64 x 16 tiles in four (21 against 42 warp-instructions at dim 12) and fit 32 programs per SM
# (H200, dim 12: 2.06 -> 1.61 ms; benchmarks/results/kernels_state/)
BWD_NARROW_TW = 32
BWD_NARROW_PMAX = 32
BWD_NARROW_WARPS = 1
KEYS_BLOCK = 1024  # lookups per program of the key-building launch
# The warp's lanes holding equal count addresses (PTX match.any): the lowest of them gets their
# number, the others 0. Not in the Triton interpreter (CPU), which adds 1 per lookup instead.
_MATCH_ASM = tl.constexpr("""{
.reg .b32 m, n, lo, me, c;
.reg .pred p;
match.any.sync.b32 m, $1, -1;
neg.s32 n, m;
and.b32 lo, m, n;
mov.u32 me, %lanemask_eq;
popc.b32 c, m;
setp.eq.b32 p, lo, me;
selp.b32 $0, c, 0, p;
}""")
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Hot tables as a matrix product: which tables take it is costs/paths.py's model; besides,
# a table's longest bag must be at most DENSE_MAX_COUNT lookups (fp16 counts stay exact)
DENSE_MAX_COUNT = 2048
DENSE_PROGRAMS = 528  # product programs to aim for (4 per SM of an H200), by splitting the bags
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
    return min(max(lanes // tw, 16), max(pmax, 16))


def _aligned(values) -> int:
    """8 if every value is a multiple of 8 (a 16-byte fp16 vector), else 4 (every dim, hence every
    column offset, is a multiple of 4): what the tile kernel may assume of its dims (MV: a masked
    column block's mask is constant over MV columns) and of its gradient columns (GA)."""
    return 8 if all(v % 8 == 0 for v in values) else 4


def _dense_bd(dim: int) -> int:
    """Gradient columns of one product tile: the dim's power of two, 16..128."""
    return min(128, max(16, 1 << (int(dim) - 1).bit_length()))


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
def _maxlen_kernel(offsets_ptr, cand_ptr, out_ptr, B, BLOCK: tl.constexpr):
    """out[t] = max(out[t], the longest bag of candidate table t among BLOCK bags)."""
    t = tl.load(cand_ptr + tl.program_id(0)).to(tl.int64)
    b = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = b < B
    s = tl.load(offsets_ptr + t * B + b, mask=m, other=0)
    e = tl.load(offsets_ptr + t * B + b + 1, mask=m, other=0)
    tl.atomic_max(out_ptr + t, tl.max(e - s, axis=0))


@triton.jit
def _bags(offsets_ptr, i, m, lo0, hi0, BLOCK: tl.constexpr):
    """The bag (t * B + b) of each lookup i: a vectorised binary search over offsets inside the bags
    [lo0, hi0) (invariant: offsets[lo] <= i < offsets[hi])."""
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
    return lo


@triton.jit
def _keys_kernel(indices_ptr, offsets_ptr, row_start_ptr, bstart_ptr, keys_ptr, segid_ptr, tdyn_ptr, N, B, NBLK, NBAGS, T,
                 BLOCK: tl.constexpr, PACK: tl.constexpr):
    """For lookup i of bag (t, b): keys[i] = row_start[t] + indices[i] (its global row), segid[i] = t*B + b.

    One program per BLOCK consecutive lookups (coalesced reads and writes). The bag of each lookup is
    found inside the bags [bstart[pid] - 1, bstart[pid+1] - 1] (bstart[k] - 1 = the bag of lookup
    k * BLOCK, from a torch.searchsorted; the last block ends at the last bag). PACK: tdyn =
    [shift[t], count base[t]] x T; the lookups of tables with a count base >= 0 (the product path's)
    get no key, the others' are written shift[t] places earlier (the sorted path's lookups, packed)."""
    pid = tl.program_id(0)
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    lo0 = tl.load(bstart_ptr + pid) - 1
    hi0 = tl.load(bstart_ptr + pid + 1, mask=pid + 1 < NBLK, other=NBAGS)
    lo = _bags(offsets_ptr, i, m, lo0, hi0, BLOCK)
    t = lo // B
    idx = tl.load(indices_ptr + i, mask=m, other=0)
    rs = tl.load(row_start_ptr + t, mask=m, other=0)
    if PACK:
        j = i - tl.load(tdyn_ptr + t, mask=m, other=0)
        m = m & (tl.load(tdyn_ptr + T + t, mask=m, other=0) < 0)
    else:
        j = i
    tl.store(keys_ptr + j, (rs + idx).to(keys_ptr.dtype.element_ty), mask=m)
    tl.store(segid_ptr + j, lo.to(tl.int32), mask=m)


@triton.jit(do_not_specialize=["ND", "NBLK", "NBAGS", "B", "BP"])
def _count_kernel(indices_ptr, offsets_ptr, bstart_ptr, dmeta_ptr, counts_ptr, ND, NBLK, NBAGS, B, BP,
                  BLOCK: tl.constexpr, MATCH: tl.constexpr):
    """The product path's counts: lookup i of bag (t, b) of a dense table adds to its C[index, b]
    (at count base + index * BP + b). One program per block of the key launch's blocks (BLOCK
    lookups, bstart as there) that holds lookups of a dense table; the block's other lookups are
    masked out (dmeta: first program, first block, lookup range). Hot rows repeat within a bag, and
    atomic adds to one address wait on each other (19.7 M lookups of 500 rows took 5.1 ms, twice the
    sorted path): MATCH adds the equal addresses of a warp's lanes once, with their number
    (_MATCH_ASM). fp16 adds of integers below 2,048 are exact: the counts do not depend on the adds'
    order."""
    pid = tl.program_id(0)
    d = _dense_row(dmeta_ptr, pid, 0, ND, ND, 13)
    k = tl.load(dmeta_ptr + 14 * ND + d) + pid - tl.load(dmeta_ptr + 13 * ND + d)  # the key launch's block
    i = k * BLOCK + tl.arange(0, BLOCK)
    m = (i >= tl.load(dmeta_ptr + 15 * ND + d)) & (i < tl.load(dmeta_ptr + 16 * ND + d))
    lo0 = tl.load(bstart_ptr + k) - 1
    hi0 = tl.load(bstart_ptr + k + 1, mask=k + 1 < NBLK, other=NBAGS)
    lo = _bags(offsets_ptr, i, m, lo0, hi0, BLOCK)
    t = lo // B
    idx = tl.load(indices_ptr + i, mask=m, other=0)
    # int32: the count matrices hold fewer than 2^31 elements (bwd_dense_elems)
    addr = tl.where(m, tl.load(dmeta_ptr + 8 * ND + d) + idx * BP + (lo - t * B), -1).to(tl.int32)
    if MATCH:
        count = tl.inline_asm_elementwise(_MATCH_ASM, "=r,r", [addr], dtype=tl.int32, is_pure=True, pack=1)
    else:
        count = tl.full((BLOCK,), 1, tl.int32)
    tl.atomic_add(counts_ptr + addr, count.to(tl.float16), mask=m & (count > 0), sem="relaxed")


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
def _ix(x, I32: tl.constexpr):
    """x as the tile kernel's index type: int32 where every offset of the launch fits (half the
    address arithmetic of int64), else int64."""
    if I32:
        return x.to(tl.int32)
    else:
        return x.to(tl.int64)


# Triton compiles a variant of a kernel for every pattern of its integer arguments (equal to 1,
# divisible by 16, other). The tile kernel's integer arguments differ from launch to launch (program
# bases, segment ranges, table and segment counts, the batch and its width): specialised on them, a
# training run compiled 630 variants, ~3 minutes of a 10-minute H200 call
# (f3e71a6:benchmarks/results/gpu_shipped_model_kf/). Its PTX is the same either way: the alignments it
# needs are stated with tl.multiple_of.
@triton.jit(do_not_specialize=["pid_base", "seg_lo", "seg_hi", "T", "NSEG", "B", "sumD"])
def _tile_kernel(keys_ptr, segs_ptr, grad_ptr, vals_ptr, ekeys_ptr, eflags_ptr, w_ptr, state_ptr,
                 meta_ptr, segt_ptr, pid_base, seg_lo, seg_hi, T, NSEG, B, sumD, lr, eps,
                 CLS: tl.constexpr, LEVEL0: tl.constexpr, P: tl.constexpr, ADAGRAD: tl.constexpr, HOST: tl.constexpr, VEC: tl.constexpr,
                 I32: tl.constexpr, MV: tl.constexpr, GA: tl.constexpr):
    """One tile of P consecutive sorted elements of one (level, table) segment, columns
    [cb*TW, cb*TW + TW) of the table's dim. Level 0: the elements are the sorted lookups (value =
    the gradient row of the lookup's bag); level k >= 1: the entries written by level k-1 (value =
    an fp32 partial sum, key -1 = no row). No loop: one gather, one 0/1 'same row' matrix product,
    the updates of the rows whose elements all lie in the tile, and the partial sums of the tile's
    first and last rows when they continue into a neighbouring tile (the entries of level k+1)."""
    TW: tl.constexpr = 16 << (CLS % 7)
    EXACT: tl.constexpr = CLS < 7
    pid = tl.program_id(0) + pid_base
    cb = tl.program_id(1)
    # segment table: [table, first program, first element, end element, value base, out entry base,
    # out value base, dim, weight offset, output column offset, first global row, state offset less
    # the first global row (HOST: a shard with host tables)] x NSEG (all of a
    # program's metadata in one round trip); the program's segment: the last of the launch's segments [seg_lo, seg_hi)
    # that begins at or before it (a binary search: no program-to-segment array to build)
    sg = seg_lo
    hi = seg_hi
    while hi - sg > 1:
        mid = (sg + hi) // 2
        if tl.load(segt_ptr + NSEG + mid) <= pid:
            sg = mid
        else:
            hi = mid
    t = _ix(tl.load(segt_ptr + sg), I32)
    j = _ix(pid - tl.load(segt_ptr + NSEG + sg), I32)
    e0 = _ix(tl.load(segt_ptr + 2 * NSEG + sg), I32)
    e1 = _ix(tl.load(segt_ptr + 3 * NSEG + sg), I32)
    vbase = _ix(tl.load(segt_ptr + 4 * NSEG + sg), I32)
    oe = _ix(tl.load(segt_ptr + 5 * NSEG + sg), I32) + 2 * j
    ov = _ix(tl.load(segt_ptr + 6 * NSEG + sg), I32)
    D = _ix(tl.load(segt_ptr + 7 * NSEG + sg), I32)
    w_off = tl.multiple_of(_ix(tl.load(segt_ptr + 8 * NSEG + sg), I32), 16)
    col_off = _ix(tl.load(segt_ptr + 9 * NSEG + sg), I32)
    row_start = _ix(tl.load(segt_ptr + 10 * NSEG + sg), I32)
    if cb * TW < D:  # the launch's grid has the most column blocks of any of its tables
        s = e0 + j * P
        s_end = tl.minimum(s + P, e1)
        c0 = cb * TW
        col = tl.arange(0, TW)
        if EXACT:
            cmask = col < TW
        else:
            # the same as (c0 + col) < D (D is a multiple of MV), but constant over MV columns, so the
            # masked loads and stores stay vectors of MV elements instead of single elements
            cmask = (c0 + col) // MV < D // MV
        lane = tl.arange(0, P)
        pos = s + lane
        m = pos < s_end
        if LEVEL0:
            kp = keys_ptr
        else:
            kp = ekeys_ptr
        # keys (-1: no row) of the tile, of the element after each, and of the tile's neighbours
        # (in the keys' own dtype: int16 or int32 unless the shard has 2^31 rows; the [P, P] compare
        # of int64 keys costs registers)
        key = tl.load(kp + pos, mask=m, other=-1)
        key_next = tl.load(kp + pos + 1, mask=pos + 1 < e1, other=-1)
        kfirst = tl.load(kp + s)
        klast = tl.load(kp + s_end - 1)
        kprev = tl.load(kp + s - 1, mask=s > e0, other=-1)
        knext = tl.load(kp + s_end, mask=s_end < e1, other=-1)
        head_x = (kfirst >= 0) & (kprev == kfirst)  # the first row began in an earlier tile
        tail_x = (klast >= 0) & (knext == klast)  # the last row goes on in a later tile
        single = kfirst == klast
        # rows updated here: their last element is in the tile and none of them lies outside it
        ours = (key >= 0) & (key != key_next) & ((key != kfirst) | (head_x == 0)) & ((key != klast) | (tail_x == 0))
        # their current values, loaded beside the gather (both wait only on the keys)
        rowkey = _ix(key, I32)
        local = rowkey - row_start
        if HOST:  # the state is not laid out by global row (see TritonTBE.__init__)
            skey = rowkey + _ix(tl.load(segt_ptr + 11 * NSEG + sg), I32)
        else:
            skey = rowkey
        if EXACT:
            waddr = tl.multiple_of(w_off + local * D + c0, VEC)[:, None] + col[None, :]
            wmask = tl.broadcast_to(ours[:, None], (P, TW))
        else:
            waddr = tl.multiple_of(w_off + local * D + c0, MV)[:, None] + col[None, :]
            wmask = ours[:, None] & cmask[None, :]
        w = tl.load(w_ptr + waddr, mask=wmask, other=0.0)
        if ADAGRAD:
            st = tl.load(state_ptr + skey, mask=ours, other=0.0)
        else:
            st = tl.zeros((P,), dtype=tl.float32)
        if LEVEL0:
            seg = tl.load(segs_ptr + pos, mask=m, other=0)
            b = _ix(seg - t * B, I32)
            gaddr = tl.multiple_of(b * sumD + col_off + c0, GA)
            if EXACT:  # a mask constant along the row: vector loads
                gmask = tl.broadcast_to(m[:, None], (P, TW))
            else:
                gmask = m[:, None] & cmask[None, :]
            g = tl.load(grad_ptr + gaddr[:, None] + col[None, :], mask=gmask, other=0.0)
        else:
            fl = tl.load(eflags_ptr + pos, mask=m, other=0).to(tl.int32)
            vaddr = tl.multiple_of(vbase + (pos - e0) * D + c0, 4)
            if EXACT:
                vmask = tl.broadcast_to(((fl & 2) != 0)[:, None], (P, TW))
            else:
                vmask = ((fl & 2) != 0)[:, None] & cmask[None, :]
            g = tl.load(vals_ptr + vaddr[:, None] + col[None, :], mask=vmask, other=0.0)
        # acc[i] = sum of the tile's values of i's row (rows are contiguous: a 0/1 matrix product,
        # fp16 operands with fp32 accumulation for fp16 gradients, exact products; fp32 otherwise)
        same = key[:, None] == key[None, :]
        if g.dtype == tl.float16:
            acc = tl.dot(same.to(tl.float16), g, out_dtype=tl.float32)
        else:
            acc = tl.dot(same.to(tl.float32), g.to(tl.float32), input_precision="ieee")
        _apply_rows(w_ptr, state_ptr, skey, waddr, w, st, acc, wmask, ours, D, lr, eps, ADAGRAD)
        # the partial sums of rows that cross the tile's ends: entry 2j (the first row) and 2j+1 (the
        # last row) of the next level; a tile of one row that crosses keeps its sum in entry 2j
        head_o = head_x | (tail_x & single)
        tail_v = tail_x & (single == 0)
        ob = ov + 2 * j * D + c0
        oaddr = tl.multiple_of(ob + _ix(lane != 0, I32) * D, 4)
        omask = ((lane == 0) & head_o) | ((lane == s_end - 1 - s) & tail_v)
        if EXACT:
            tl.store(vals_ptr + oaddr[:, None] + col[None, :], acc, mask=tl.broadcast_to(omask[:, None], (P, TW)))
        else:
            tl.store(vals_ptr + oaddr[:, None] + col[None, :], acc, mask=omask[:, None] & cmask[None, :])
        if cb == 0:
            tl.store(ekeys_ptr + oe, tl.where(head_o, kfirst, -1))
            tl.store(eflags_ptr + oe, tl.where(head_o, 3, 0).to(tl.int8))
            tl.store(ekeys_ptr + oe + 1, tl.where(tail_x, klast, -1))
            tl.store(eflags_ptr + oe + 1, tl.where(tail_x, 1 + 2 * tail_v.to(tl.int32), 0).to(tl.int8))


@triton.jit
def _dense_row(dmeta_ptr, pid, d_lo, d_hi, ND, FIRST: tl.constexpr):
    """The dense table (row of dmeta) whose programs (first program in column FIRST) hold pid."""
    d = d_lo
    hi = d_hi
    while hi - d > 1:
        mid = (d + hi) // 2
        if tl.load(dmeta_ptr + FIRST * ND + mid) <= pid:
            d = mid
        else:
            hi = mid
    return d


# dmeta columns, one row per dense table: table, first product program, first update program, rows,
# dim, weight offset, output column offset, state offset, count base, partial-sum base, column
# tiles, bag parts, bags per part, first counting program, its first key block, first and end lookup
@triton.jit(do_not_specialize=["pid_base", "d_lo", "d_hi", "ND", "BP", "B", "sumD"])
def _dense_kernel(counts_ptr, grad_ptr, part_ptr, dmeta_ptr, pid_base, d_lo, d_hi, ND, BP, B, sumD,
                  BR: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr):
    """One [BR, BD] tile of one part of a dense table's gradient: sum over the part's bags k of
    C[r, k] * grad[k, c] (fp16 operands, exact products, fp32 accumulation; fp32 gradients as
    tf32x3: the counts exact, the gradients to about 2^-21), written to the part's fp32 partial sums."""
    pid = tl.program_id(0) + pid_base
    d = _dense_row(dmeta_ptr, pid, d_lo, d_hi, ND, 1)
    j = pid - tl.load(dmeta_ptr + ND + d)
    R = tl.load(dmeta_ptr + 3 * ND + d)
    # dims are multiples of 4: the column mask is constant over 4 columns, so the gradient's loads
    # can be 8-byte asynchronous copies (pipelined) instead of 2-byte loads
    D = tl.multiple_of(tl.load(dmeta_ptr + 4 * ND + d).to(tl.int32), 4)
    col_off = tl.load(dmeta_ptr + 6 * ND + d)
    cbase = tl.multiple_of(tl.load(dmeta_ptr + 8 * ND + d), 16)
    pbase = tl.load(dmeta_ptr + 9 * ND + d)
    # int32 loop bounds: Triton pipelines a loop only over an int32 induction variable
    nct = tl.load(dmeta_ptr + 10 * ND + d).to(tl.int32)
    S = tl.load(dmeta_ptr + 11 * ND + d).to(tl.int32)
    kchunk = tl.load(dmeta_ptr + 12 * ND + d).to(tl.int32)
    j = j.to(tl.int32)
    # the column tiles of one count tile are neighbours in launch order: they read it together (L2)
    ct = j % nct
    q = j // nct
    s = q % S
    r = (q // S) * BR + tl.arange(0, BR)
    c = ct * BD + tl.arange(0, BD)
    cmask = c < D
    kk = tl.arange(0, BK)
    k0 = s * kchunk
    k1 = tl.minimum(k0 + kchunk, B)
    # the count matrix has its rows padded to BR and its bags to BK (zeros): no masks on it
    arow = counts_ptr + cbase + tl.multiple_of(r.to(tl.int64) * BP, BK)[:, None]
    acc = tl.zeros((BR, BD), dtype=tl.float32)
    # acc += C[rows, k:k+BK] @ grad[k:k+BK, columns], the bags of the part in steps of BK. Written
    # twice because Triton 3.6 pipelines the fp16 loop (the next count tiles' loads in flight during
    # this product) only as a loop from 0 with its body inline, and fails to compile the fp32 one
    # that way (a 2-byte asynchronous copy)
    if grad_ptr.dtype.element_ty == tl.float16:
        for i in range(0, tl.cdiv(k1 - k0, BK)):
            k = k0 + i * BK
            kc = k + kk
            a = tl.load(arow + tl.multiple_of(k, BK) + kk[None, :])
            g = tl.load(grad_ptr + tl.multiple_of(kc.to(tl.int64) * sumD + col_off, 4)[:, None] + c[None, :],
                        mask=(kc < k1)[:, None] & cmask[None, :], other=0.0)
            acc = tl.dot(a, g, acc, out_dtype=tl.float32)
    else:
        for k in range(k0, k1, BK):
            kc = k + kk
            a = tl.load(arow + tl.multiple_of(k, BK) + kk[None, :])
            g = tl.load(grad_ptr + tl.multiple_of(kc.to(tl.int64) * sumD + col_off, 4)[:, None] + c[None, :],
                        mask=(kc < k1)[:, None] & cmask[None, :], other=0.0)
            acc = tl.dot(a.to(tl.float32), g, acc, input_precision="tf32x3")
    paddr = pbase + s.to(tl.int64) * R * D + r.to(tl.int64)[:, None] * D + c[None, :]
    tl.store(part_ptr + paddr, acc, mask=(r < R)[:, None] & cmask[None, :])


@triton.jit(do_not_specialize=["pid_base", "d_lo", "d_hi", "ND"])
def _dense_update(part_ptr, w_ptr, state_ptr, dmeta_ptr, pid_base, d_lo, d_hi, ND, lr, eps,
                  RB: tl.constexpr, W: tl.constexpr, ADAGRAD: tl.constexpr):
    """RB rows of a dense table: their gradient (the parts' partial sums, added in order), then the
    optimizer's update of every row (a row no bag looked up has a zero gradient: unchanged)."""
    pid = tl.program_id(0) + pid_base
    d = _dense_row(dmeta_ptr, pid, d_lo, d_hi, ND, 2)
    j = pid - tl.load(dmeta_ptr + 2 * ND + d)
    R = tl.load(dmeta_ptr + 3 * ND + d)
    D = tl.load(dmeta_ptr + 4 * ND + d)
    w_off = tl.load(dmeta_ptr + 5 * ND + d)
    s_off = tl.load(dmeta_ptr + 7 * ND + d)
    pbase = tl.load(dmeta_ptr + 9 * ND + d)
    S = tl.load(dmeta_ptr + 11 * ND + d)
    r = (j * RB + tl.arange(0, RB)).to(tl.int64)
    c = tl.arange(0, W)
    rmask = r < R
    mask = rmask[:, None] & (c < D)[None, :]
    addr = r[:, None] * D + c[None, :]
    g = tl.zeros((RB, W), dtype=tl.float32)
    for s in range(S):
        g += tl.load(part_ptr + pbase + s * R * D + addr, mask=mask, other=0.0)
    waddr = w_off + addr
    w = tl.load(w_ptr + waddr, mask=mask, other=0.0)
    if ADAGRAD:
        st = tl.load(state_ptr + s_off + r, mask=rmask, other=0.0)
    else:
        st = tl.zeros((RB,), dtype=tl.float32)
    _apply_rows(w_ptr, state_ptr, s_off + r, waddr, w, st, g, mask, rmask, D, lr, eps, ADAGRAD)


# ------------------------------------------------------------------------------------------------
# the TBE
# ------------------------------------------------------------------------------------------------


class TritonTBE(TBE):
    kernel = "triton"

    def __init__(self, rows: Sequence[int], dims: Sequence[int], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cuda", seed: int = 0,
                 fwd_lanes: int = FWD_LANES, fwd_unroll: int = FWD_UNROLL, fwd_warps: int = FWD_WARPS,
                 bwd_lanes: int = BWD_LANES, bwd_pmax: int = BWD_PMAX, bwd_warps: int = BWD_WARPS,
                 bwd_max_tw: int = BWD_MAX_TW, bwd_up_lanes: int = BWD_UP_LANES, bwd_dense: float = BWD_DENSE,
                 bwd_dense_rows: int = BWD_DENSE_ROWS, bwd_dense_elems: int = BWD_DENSE_ELEMS, bwd_dense_min_us: float = DENSE_TABLE_US,
                 bwd_i32: bool = True, bwd_narrow_pmax: int = BWD_NARROW_PMAX, bwd_narrow_warps: int = BWD_NARROW_WARPS,
                 host_tables: Sequence[int] = ()) -> None:
        """`host_tables`: tables whose weights and optimizer state live in host memory mapped into the
        GPU (kernels/host_memory.py; the uvm tier of kernels/tiered.py): the same launches reach them
        at their distance from the HBM buffer, every access crossing the host link."""
        super().__init__(rows, dims, precision, optimizer, lr, eps, device, seed)
        self.fwd_lanes, self.fwd_unroll, self.fwd_warps = int(fwd_lanes), int(fwd_unroll), int(fwd_warps)
        self.bwd_lanes, self.bwd_pmax, self.bwd_warps = int(bwd_lanes), int(bwd_pmax), int(bwd_warps)
        self.bwd_max_tw, self.bwd_up_lanes = int(bwd_max_tw), int(bwd_up_lanes)
        self.bwd_narrow_pmax, self.bwd_narrow_warps = int(bwd_narrow_pmax), int(bwd_narrow_warps)
        for name in ("fwd_lanes", "bwd_lanes", "bwd_pmax", "bwd_max_tw", "bwd_up_lanes", "bwd_narrow_pmax", "bwd_warps", "bwd_narrow_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.bwd_pmax < 16 or self.bwd_max_tw < 16:
            raise ValueError("bwd_pmax and bwd_max_tw must be >= 16 (tl.dot's smallest tile)")
        self.bwd_dense, self.bwd_dense_rows, self.bwd_dense_elems = float(bwd_dense), int(bwd_dense_rows), int(bwd_dense_elems)
        self.bwd_dense_min_us = float(bwd_dense_min_us)
        self.bwd_i32 = bool(bwd_i32)
        if not self.bwd_dense >= 0:
            raise ValueError(f"bwd_dense must be >= 0 (0: never the product path), got {bwd_dense}")
        if not 0 <= self.bwd_dense_elems < 2**31:
            raise ValueError(f"bwd_dense_elems must be in [0, 2^31) (int32 count addresses), got {bwd_dense_elems}")
        T = self.num_tables
        self.host_tables = self._host_tables(host_tables)
        self._w_off, self._s_off, self._row_start = [0] * T, [0] * T, [0]
        off = srows = 0
        for t, (r, d) in enumerate(zip(self.rows, self.dims)):
            if t not in self.host_tables:
                self._w_off[t], self._s_off[t] = off, srows
                off += -(-r * d // ALIGN) * ALIGN
                srows += r
            self._row_start.append(self._row_start[-1] + r)
        self._flat = torch.empty(max(off, 1), dtype=self.dtype, device=self.device)
        adagrad = self.optimizer == "rowwise_adagrad"
        self._state = torch.zeros(max(srows, 1), dtype=torch.float32, device=self.device) if adagrad else None
        # host tables: their own host buffers, addressed from the HBM buffers' starts (the state's
        # offsets then differ from the global rows: the tile kernel's HOST variant adds the difference)
        self._host_w: dict[int, torch.Tensor] = {}
        self._host_s: dict[int, torch.Tensor] = {}
        for t in self.host_tables:
            self._host_w[t] = host_mapped(self.rows[t] * self.dims[t], self.dtype, self.device).view(self.rows[t], self.dims[t])
            self._w_off[t] = element_offset(self._flat, self._host_w[t], ALIGN)
            if adagrad:
                self._host_s[t] = host_mapped(self.rows[t], torch.float32, self.device).zero_()
                self._s_off[t] = element_offset(self._state, self._host_s[t])
        for t in range(T):
            init_table_(self._table_view(t), self.seed, t)
        total_rows = self._row_start[-1]
        # the radix sort's passes follow the key's width: 16-bit keys (shards of < 32k rows, the hot
        # tables) sort in 2 passes instead of 4
        self._key_dtype = torch.int16 if total_rows < 2**15 - 1 else torch.int32 if total_rows < 2**31 - 1 else torch.int64
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
        # tile lengths per tile class: level 0 (gradient rows; fp32 ones cost twice the lanes) and the
        # levels above (fp32 partial sums); narrow column blocks in shorter tiles of fewer warps, at
        # every level (see BWD_NARROW_TW)
        lanes0 = self.bwd_lanes // (2 if self.dtype == torch.float32 else 1)
        widths = [16 << (c % NUM_TW) for c in range(2 * NUM_TW)]
        pmax = [min(self.bwd_pmax, self.bwd_narrow_pmax) if tw <= BWD_NARROW_TW else self.bwd_pmax for tw in widths]
        self._pcls0 = [_chunk(tw, lanes0, p) for tw, p in zip(widths, pmax)]
        self._pcls1 = [_chunk(tw, self.bwd_up_lanes, p) for tw, p in zip(widths, pmax)]
        self._wcls = [self.bwd_narrow_warps if tw <= BWD_NARROW_TW else self.bwd_warps if tw <= 256 else 8 for tw in widths]
        self._p0 = [self._pcls0[c] for c in self._bcls]
        self._p1 = [self._pcls1[c] for c in self._bcls]
        self._bwd_order = sorted(range(T), key=lambda t: (self._bcls[t], t))
        self._saved = None
        self._starts = None  # see _block_starts
        self._last = None  # (lookups, level-0 tiles, levels, level-1 entry keys, dense tables, their rounds) of the last backward
        # tables the product path may take (few rows); their longest bags are measured in the forward
        self._cand = [t for t in range(T) if self.bwd_dense > 0 and self.rows[t] <= self.bwd_dense_rows]
        self._cand_dev = torch.tensor(self._cand, dtype=torch.int32, device=self.device)
        self._maxlen_dev = torch.zeros(T, dtype=torch.int64, device=self.device)
        self._counts = torch.empty(0, dtype=torch.float16, device=self.device)
        # the per-table lookup counts and longest bags, read back to the host during the forward (see _prefetch_bounds)
        on_gpu = self.device.type == "cuda"
        self._bounds_host = torch.empty(2 * T + 1, dtype=torch.int64, pin_memory=on_gpu)
        self._bounds_ready = torch.cuda.Event() if on_gpu else None
        self._side = torch.cuda.Stream(self.device) if on_gpu else None

    # ---------------------------------------------------------------- weights
    def _table_view(self, t: int) -> torch.Tensor:
        if t in self._host_w:
            return self._host_w[t]
        o = self._w_off[t]
        return self._flat[o:o + self.rows[t] * self.dims[t]].view(self.rows[t], self.dims[t])

    def weights(self, t: int) -> torch.Tensor:
        self._check_table(t)
        return self._table_view(t)

    def set_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_weights(t, w)
        self._table_view(t).copy_(w)

    def optimizer_state(self, t: int) -> torch.Tensor | None:
        self._check_table(t)
        if self._state is None:
            return None
        return self._host_s[t] if t in self._host_s else self._state[self._s_off[t]:self._s_off[t] + self.rows[t]]

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
        """Copy each table's lookup range (offsets[t * batch]) and, for the tables the product path
        may take, their longest bag to the host on a side stream.

        The backward's grid (ranges per table, the path per table) depends on these. Reading them
        back in the backward would stall the host until the GPU drained its queue and leave the GPU
        idle while the host then launched the backward; read now, they are on the host long before
        the backward needs them, and the backward never waits for the GPU."""
        T = self.num_tables

        def read() -> None:
            self._bounds_host[:T + 1].copy_(offsets[::batch], non_blocking=True)
            if self._cand:
                self._maxlen_dev.zero_()
                _maxlen_kernel[(len(self._cand), triton.cdiv(batch, 1024))](offsets, self._cand_dev, self._maxlen_dev, batch, BLOCK=1024)
                self._bounds_host[T + 1:].copy_(self._maxlen_dev, non_blocking=True)

        if self._side is None:  # the Triton interpreter runs on CPU tensors
            read()
            return
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)  # the offsets are written on the main stream
        with torch.cuda.stream(self._side):
            read()
            self._bounds_ready.record(self._side)
        offsets.record_stream(self._side)

    @property
    def last_backward_stats(self) -> dict[str, int]:
        """Lookups, level-0 tiles, levels and rows that cross tiles (summed in the levels above) of the
        last backward; reads the GPU, so only for tests."""
        if self._last is None:
            return {}
        n, tiles, levels, ek, dense, rounds = self._last
        return {"lookups": n, "tiles": tiles, "levels": levels, "crossing_rows": int(torch.unique(ek[ek >= 0]).numel()),
                "dense_tables": dense, "dense_rounds": rounds}

    # ---------------------------------------------------------------- backward
    def _block_starts(self, nblk: int, dtype: torch.dtype) -> torch.Tensor:
        """[nblk] first lookup of each key-building block: a view of one arange kept on the device
        and grown when a batch needs more (one kernel fewer per backward)."""
        if self._starts is None or self._starts.numel() < nblk or self._starts.dtype != dtype:
            self._starts = torch.arange(0, 2 * nblk * KEYS_BLOCK, KEYS_BLOCK, device=self.device, dtype=dtype)
        return self._starts[:nblk]

    def _plan(self, bounds: list[int]) -> tuple[list[list[int]], list[tuple[int, int, int, int, int, int, int]], int, int, int]:
        """The backward's tiles, level by level. Level 0 cuts each table's sorted lookups into tiles of
        P0 lookups; level k >= 1 cuts the 2 entries per tile that level k-1 wrote (the partial sums
        of its first and last rows) into tiles of P1 entries, until a table has one tile. Returns the
        segment table (one row per (level, table): table, first program, first and end element, value
        base, out entry base, out value base, dim, weight offset, output column offset, first row, state offset less first row), the launches ((level, class, first program, programs,
        column blocks, first segment, end segment): one per level and tile class) and the entry and
        value counts. Host arithmetic only: the lookup counts came to the host during the forward."""
        segs: list[list[int]] = []
        launches: list[list[int]] = []
        nprog = ne = nv = 0
        active = [t for t in self._bwd_order if bounds[t + 1] > bounds[t]]
        inputs: dict[int, tuple[int, int, int]] = {}
        level = 0
        while active:
            nxt = []
            for t in active:
                if level == 0:
                    n, e0, vb, p = bounds[t + 1] - bounds[t], bounds[t], 0, self._p0[t]
                else:
                    (n, e0, vb), p = inputs[t], self._p1[t]
                tiles = -(-n // p)
                cls = self._bcls[t]
                if launches and launches[-1][0] == level and launches[-1][1] == cls:
                    launches[-1][3] += tiles
                    launches[-1][4] = max(launches[-1][4], self._nblk[t])
                    launches[-1][6] += 1
                else:
                    launches.append([level, cls, nprog, tiles, self._nblk[t], len(segs), len(segs) + 1])
                segs.append([t, nprog, e0, e0 + n, vb, ne, nv, self.dims[t], self._w_off[t], self.col_offsets[t], self._row_start[t],
                             self._s_off[t] - self._row_start[t]])
                nprog += tiles
                if tiles > 1:
                    inputs[t] = (2 * tiles, ne, nv)
                    nxt.append(t)
                ne += 2 * tiles
                nv += 2 * tiles * self.dims[t]
            active = nxt
            level += 1
        return segs, [tuple(x) for x in launches], nprog, ne, nv

    def _dense_rounds(self, bounds: list[int], maxlen: list[int], batch: int) -> list[list[int]]:
        """The tables whose gradient this step is a matrix product (see the module docstring), in
        rounds whose count matrices fit ``bwd_dense_elems`` (paths.product_rounds): of the tables
        with lookups and no bag over DENSE_MAX_COUNT, as paths.product_tables chooses
        (``bwd_dense`` = inf: every table it can)."""
        tables = [t for t in self._cand if bounds[t + 1] > bounds[t] and maxlen[t] <= DENSE_MAX_COUNT]
        if not tables:
            return []
        picked = product_tables([bounds[t + 1] - bounds[t] for t in tables], [self.rows[t] for t in tables],
                                [self.dims[t] for t in tables], batch, self._flat.element_size(), self.bwd_dense, self.bwd_dense_rows, self.bwd_dense_elems,
                                self.bwd_dense_min_us)
        dense = [t for t, p in zip(tables, picked) if p]
        rounds = product_rounds([int(count_elems(self.rows[t], batch)) for t in dense], self.bwd_dense_elems)
        return [[dense[i] for i in r] for r in rounds]

    def _dense_plan(self, dense: list[int], bounds: list[int], batch: int):
        """Per dense table (ordered by update width, so every launch's tables are contiguous rows):
        the dmeta row, and the launches of the product (per column-tile width) and of the update
        (per row width). Returns (dmeta rows, count elements, partial sums, counting programs,
        product launches, update launches)."""
        order = sorted(dense, key=lambda t: (_dp(self.dims[t]), t))
        rows, prod, upd = [], [], []
        nprod = nupd = nc = npart = ncount = 0
        for t in order:
            r, d = self.rows[t], self.dims[t]
            bd, w = _dense_bd(d), _dp(d)
            rb = max(1, 2048 // w)
            tiles = -(-r // DENSE_BR) * -(-d // bd)
            parts = max(1, min(-(-DENSE_PROGRAMS // tiles), -(-batch // (4 * DENSE_BK))))
            kchunk = -(-(-(-batch // parts)) // DENSE_BK) * DENSE_BK
            parts = -(-batch // kchunk)
            k = len(rows)
            for launches, key, first, count in ((prod, bd, nprod, tiles * parts), (upd, w, nupd, -(-r // rb))):
                if launches and launches[-1][0] == key:
                    launches[-1][2] += count
                    launches[-1][4] = k + 1
                else:
                    launches.append([key, first, count, k, k + 1])
            k0, k1 = bounds[t] // KEYS_BLOCK, (bounds[t + 1] - 1) // KEYS_BLOCK
            rows.append([t, nprod, nupd, r, d, self._w_off[t], self.col_offsets[t], self._s_off[t], nc, npart,
                         -(-d // bd), parts, kchunk, ncount, k0, bounds[t], bounds[t + 1]])
            ncount += k1 - k0 + 1
            nprod += tiles * parts
            nupd += -(-r // rb)
            nc += int(count_elems(r, batch))
            npart += parts * r * d
        return rows, nc, npart, ncount, prod, upd

    def _dense_round(self, tables: list[int], bounds: list[int], batch: int, indices, offsets, bstart, nblk: int, grad, state) -> None:
        """One round of the product path: its tables' lookups counted into the count buffer (shared by
        every round: stream order keeps a round's zeroing after the last one's product), the products
        C @ grad in parts, then every row of the tables updated."""
        drows, nc, npart, ncount, prod, upd = self._dense_plan(tables, bounds, batch)
        bp, dev = padded_bags(batch), self.device
        dmeta = torch.tensor([list(col) for col in zip(*drows)], dtype=torch.int64).to(dev, non_blocking=True).contiguous()
        if self._counts.numel() < nc:
            self._counts = torch.empty(nc, dtype=torch.float16, device=dev)
        counts = self._counts[:nc]
        counts.zero_()
        nd = len(drows)
        _count_kernel[(ncount,)](indices, offsets, bstart, dmeta, counts, nd, nblk, offsets.numel() - 1, batch, bp,
                                 BLOCK=KEYS_BLOCK, MATCH=not _INTERPRETED, num_warps=4)
        part = torch.empty(max(npart, 1), dtype=torch.float32, device=dev)
        for bd, first, count, d0, d1 in prod:
            _dense_kernel[(count,)](counts, grad, part, dmeta, first, d0, d1, nd, bp, batch, self.total_dim,
                                    BR=DENSE_BR, BD=bd, BK=DENSE_BK, num_warps=8 if bd > 64 else 4)
        for w, first, count, d0, d1 in upd:
            _dense_update[(count,)](part, self._flat, state, dmeta, first, d0, d1, nd, self.lr, self.eps,
                                    RB=max(1, 2048 // w), W=w, ADAGRAD=self.optimizer == "rowwise_adagrad", num_warps=4)

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
        if self._bounds_ready is not None:
            self._bounds_ready.synchronize()  # copied during the forward: long done, no GPU stall
        host = self._bounds_host.tolist()
        bounds, maxlen = host[:T + 1], host[T + 1:]  # [T+1] lookup range of each table, [T] longest bags
        adagrad = self.optimizer == "rowwise_adagrad"
        state = self._state if adagrad else self._flat  # unused pointer when SGD
        # the product path's tables: their lookups are counted, not sorted (the others' packed)
        rounds = self._dense_rounds(bounds, maxlen, batch)
        dense = {t for r in rounds for t in r}
        sparse_bounds = list(bounds)
        nblk = triton.cdiv(n, KEYS_BLOCK)
        bstart = torch.searchsorted(offsets, self._block_starts(nblk, offsets.dtype), right=True)  # 1 + bag of each block's first lookup
        if dense:
            tdyn = [0] * T + [-1] * T  # per table: lookups of dense tables before it, then whether it is dense (>= 0)
            removed = 0
            for t in range(T):
                tdyn[t] = removed
                sparse_bounds[t] = bounds[t] - removed
                if t in dense:
                    tdyn[T + t] = 0
                    removed += bounds[t + 1] - bounds[t]
            sparse_bounds[T] = bounds[T] - removed
            tdyn_dev = torch.tensor(tdyn, dtype=torch.int64).to(dev, non_blocking=True)
        else:
            tdyn_dev = self._row_start_dev  # unused pointer
        ns = sparse_bounds[T]
        # 1. global row and bag of every lookup of the sorted path
        keys = torch.empty(max(ns, 1), dtype=self._key_dtype, device=dev)
        segid = torch.empty(max(ns, 1), dtype=torch.int32, device=dev)
        _keys_kernel[(nblk,)](indices, offsets, self._row_start_dev, bstart, keys, segid, tdyn_dev,
                              n, batch, nblk, offsets.numel() - 1, T, BLOCK=KEYS_BLOCK, PACK=bool(dense), num_warps=4)
        for r in rounds:
            self._dense_round(r, bounds, batch, indices, offsets, bstart, nblk, grad, state)
        tiles0, levels, ek = 0, 0, keys[:0]
        if ns:
            # 2. group by row; the bags in sorted order (one coalesced pass, so a tile's loads of its rows
            # and bags do not wait on each other)
            keys_sorted, perm = torch.sort(keys[:ns], stable=True)
            segs = segid[perm]
            # 3. the tiles of every level (host arithmetic on the lookup counts read during the forward)
            plan, launches, nprog, ne, nv = self._plan(sparse_bounds)
            nseg = len(plan)
            segt = torch.tensor([list(col) for col in zip(*plan)], dtype=torch.int64).to(dev, non_blocking=True).contiguous()
            ekeys = torch.empty(max(ne, 1), dtype=self._key_dtype, device=dev)
            eflags = torch.empty(max(ne, 1), dtype=torch.int8, device=dev)
            vals = torch.empty(max(nv, 1), dtype=torch.float32, device=dev)
            # int32 offsets in the tiles where every one fits (the lookups, entries, partial sums, gradient
            # and weights each under 2^31 elements): ~10% fewer instructions than int64 addressing
            i32 = self.bwd_i32 and max(ns, ne, nv, grad.numel(), self._flat.numel()) < 2**31
            # 4. one launch per level and tile class; level k+1 reads what level k wrote (stream order)
            for level, cls, pfirst, count, blocks, sg0, sg1 in launches:
                tables = [plan[k][0] for k in range(sg0, sg1)]
                _tile_kernel[(count, blocks)](
                    keys_sorted, segs, grad, vals, ekeys, eflags, self._flat, state, self._meta, segt,
                    pfirst, sg0, sg1, T, nseg, batch, self.total_dim, self.lr, self.eps,
                    CLS=cls, LEVEL0=level == 0, P=(self._pcls0 if level == 0 else self._pcls1)[cls],
                    ADAGRAD=adagrad, HOST=bool(self.host_tables), VEC=self._vec,
                    MV=_aligned(self.dims[t] for t in tables),
                    I32=i32 and not any(t in self._host_w for t in tables),  # host tables lie at 64-bit distances from the HBM buffer
                    GA=_aligned([self.total_dim] + [self.col_offsets[t] for t in tables]), num_warps=self._wcls[cls],
                )
            tiles0 = sum(c for lv, _, _, c, _, _, _ in launches if lv == 0)
            levels = 1 + max(lv for lv, *_ in launches)
            ek = ekeys[:2 * tiles0]
        self._last = (n, tiles0, levels, ek, len(dense), len(rounds))
