"""The Triton TBE's two backward paths as times, for the kernel's choice between them, for the
simulator and for DreamShard's kernel features (pure arithmetic, like terms.py: no Triton, no backend).

The sorted path sorts a table's lookups by row and sums each row's run in tiles; the product path
(hot small tables) counts each row's lookups per bag into a matrix ``C`` and multiplies it by the
gradient (costs/kernels/triton_tbe.py, docs/kernels.md "Hot tables as a matrix product"). The times
are fitted to the single-table grid on an H200 (fp16): the sorted path ~100 ps a lookup + 1.55 ps a
lookup and column; the product path ~43 ps a counted lookup, the count matrix zeroed and read at
copy bandwidth (0.235 ps a byte), the product at ~400 TFLOP/s.

A table is a candidate where its rows are at most BWD_DENSE_ROWS and the product's time is at most
BWD_DENSE times the sorted path's (`takes_product`). The kernel takes (`product_tables`) every
candidate whose count matrix fits BWD_DENSE_ELEMS and that saves more than DENSE_TABLE_US (what the
path costs in a fused shard beyond the single-table model), in rounds that reuse one count buffer of
that size (`product_rounds`). BWD_DENSE is 0.5, not 1: the model is fitted to
single tables, and in a fused shard the sorted path's sort and launches are shared, so a table's
marginal cost there is lower (at 1, two mixed shards of docs/kernels.md took one table each by
product and ran 4.5% and 13% slower).
"""

from __future__ import annotations

import numpy as np

BWD_DENSE = 0.5
BWD_DENSE_ROWS = 8192
BWD_DENSE_ELEMS = 1 << 29  # one round's count matrices hold at most this many fp16 elements (1 GiB)
DENSE_BR, DENSE_BK = 64, 64  # rows and bags of one product tile (the count rows padded to DENSE_BK)
SPARSE_PS_LOOKUP, SPARSE_PS_COLUMN = 100.0, 1.55
DENSE_PS_COUNT, DENSE_PS_BYTE, DENSE_PS_FLOP = 43.0, 0.235, 0.0025
# In a fused shard a table's product path costs ~50-280 us (median 176) more, against the sorted path,
# than the single-table model says (40 shards of the training families measured both ways on an H200,
# f3e71a6:benchmarks/gpu_product_fixed_cost.py): the kernel takes a table only where the model saves more.
# (It replaces a per-shard 30 us for the path's launches, which a table saving this much always pays.)
DENSE_TABLE_US = 200.0


def table_arrays(tables, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the paths are decided and priced by, per table (anything with pooling_factor, rows and
    dim): lookups per step of `batch` bags, rows, dim."""
    return (np.array([t.pooling_factor for t in tables], dtype=np.float64) * batch,
            np.array([t.rows for t in tables], dtype=np.float64), np.array([t.dim for t in tables], dtype=np.float64))


def padded_bags(batch: int) -> int:
    """A count matrix's row length: the bags padded to a whole product tile."""
    return -(-batch // DENSE_BK) * DENSE_BK


def count_elems(rows, batch: int):
    """A table's count matrix (fp16 elements): its rows padded to a product tile, times padded_bags."""
    return -(-np.asarray(rows) // DENSE_BR) * DENSE_BR * padded_bags(batch)


def dense_us(lookups, rows, dim, batch: int, elt: int):
    """The product path's time for one table (arrays work too): its lookups counted, the count
    matrix zeroed and read (once: the programs of one count tile run together and share it in L2),
    the gradient columns read, the product."""
    c = count_elems(rows, batch) * 2
    return 1e-6 * (lookups * DENSE_PS_COUNT + (2 * c + batch * np.asarray(dim) * elt) * DENSE_PS_BYTE
                   + 2.0 * np.asarray(rows) * batch * np.asarray(dim) * DENSE_PS_FLOP)


def sparse_us(lookups, dim, elt: int):
    """The sorted path's time for one table's lookups (keys, sort, tiles)."""
    return 1e-6 * lookups * (SPARSE_PS_LOOKUP + SPARSE_PS_COLUMN * np.asarray(dim) * elt / 2)


def takes_product(lookups, rows, dim, batch: int, elt: int, threshold: float = BWD_DENSE, max_rows: int = BWD_DENSE_ROWS):
    """Whether a table (or each of arrays of them) takes the product path, by the model alone (the
    kernel also needs its longest bag under 2,048 lookups and its count matrix in its memory cap)."""
    lookups = np.asarray(lookups, dtype=np.float64)
    return (np.asarray(rows) <= max_rows) & (lookups > 0) & (dense_us(lookups, rows, dim, batch, elt) <= threshold * sparse_us(lookups, dim, elt))


def product_us(lookups, rows, dim, batch: int, elt: int, kernel_rule: bool = True) -> np.ndarray:
    """Each table's product-path time where its backward is a product, 0 elsewhere: a cost-net
    feature. `kernel_rule`: where the kernel takes the path (`product_tables`); false: wherever the
    model makes it a candidate (`takes_product`), as the kernel took it before the 200 us rule."""
    lookups, rows, dim = (np.asarray(a, dtype=np.float64) for a in (lookups, rows, dim))
    takes = product_tables(lookups, rows, dim, batch, elt) if kernel_rule else takes_product(lookups, rows, dim, batch, elt)
    return np.where(takes, dense_us(lookups, rows, dim, batch, elt), 0.0)


def product_tables(lookups, rows, dim, batch: int, elt: int, threshold: float = BWD_DENSE, max_rows: int = BWD_DENSE_ROWS,
                   max_elems: int = BWD_DENSE_ELEMS, min_saving_us: float = DENSE_TABLE_US) -> np.ndarray:
    """[T] which tables' backward is a product, as the kernel chooses: its candidates (`takes_product`)
    whose count matrix fits `max_elems` (the kernel runs them in rounds of at most that many count
    elements: product_rounds) and that save more than `min_saving_us` each (threshold inf: every
    candidate that fits). A table's choice does not depend on the other tables of its shard."""
    lookups, rows, dim = (np.asarray(a, dtype=np.float64) for a in (lookups, rows, dim))
    cand = takes_product(lookups, rows, dim, batch, elt, threshold, max_rows) & (count_elems(rows, batch) <= max_elems)
    if threshold == np.inf:
        return cand
    return cand & (sparse_us(lookups, dim, elt) - dense_us(lookups, rows, dim, batch, elt) > min_saving_us)


def product_rounds(elems, max_elems: int = BWD_DENSE_ELEMS) -> list[list[int]]:
    """The product path's tables (their count elements, each at most `max_elems`) in rounds whose
    count matrices together fit `max_elems`: first fit, largest first (few rounds; each costs a few
    launches). Returns lists of indices into `elems`."""
    rounds: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(elems)), key=lambda i: (-elems[i], i)):
        r = next((k for k, left in enumerate(room) if elems[i] <= left), len(rounds))
        if r == len(rounds):
            rounds.append([])
            room.append(max_elems)
        rounds[r].append(i)
        room[r] -= elems[i]
    return rounds
