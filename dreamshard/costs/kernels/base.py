"""The one interface every fused table-batched embedding (TBE) kernel implements.

A TBE holds the embedding tables placed on one device (a *shard*) and runs, for a whole batch,
the sum-pooled lookups of every table (forward) and the gradient reduction per unique row with
the optimizer fused in (backward). Inputs use FBGEMM's layout:

- ``indices``: the row ids of all tables concatenated, table-major;
- ``offsets``: ``T*B + 1`` positions; bag ``(t, b)`` is ``indices[offsets[t*B+b] : offsets[t*B+b+1]]``.

The output is ``[B, sum(dims)]``, table ``t`` in the column slice ``col_offsets[t] : col_offsets[t+1]``.

Semantics shared by all kernels (and checked against a float64 reference in the tests):

- forward: sum pooling, empty bags give 0, accumulation in fp32, output in the weight dtype;
- ``sgd`` (exact SGD): ``w[r] -= lr * g[r]`` with ``g[r]`` the sum over all lookups of ``r`` of
  the output gradient of its bag;
- ``rowwise_adagrad`` (FBGEMM's EXACT_ROWWISE_ADAGRAD): ``state[r] += mean(g[r]**2)``;
  ``w[r] -= lr * g[r] / (sqrt(state[r]) + eps)``;
- fp32 arithmetic throughout; fp16 weights are rounded to nearest when stored.

Weights start uniform in (-0.01, 0.01), drawn per table from a generator seeded by
``(seed, table)`` on the target device, so every kernel built with the same seed on the same
device starts from the same weights.
"""

from __future__ import annotations

import abc
from typing import Sequence

import torch

from dreamshard.tables import OPTIMIZERS
from dreamshard.validation import DIM_MULTIPLE, MAX_DIM, MIN_DIM

PRECISIONS = {"fp16": torch.float16, "fp32": torch.float32}
INIT_RANGE = 0.01


class KernelUnavailable(RuntimeError):
    """The kernel cannot run here (missing package, wrong device, unsupported combination)."""


def table_generator(seed: int, table: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((int(seed) * 1_000_003 + int(table) * 7_919 + 17) % (2**63 - 1))
    return g


def init_table_(w: torch.Tensor, seed: int, table: int) -> torch.Tensor:
    """Fill ``w`` (one table, any dtype, on its device) with the seeded initial weights."""
    return w.uniform_(-INIT_RANGE, INIT_RANGE, generator=table_generator(seed, table, w.device))


class TBE(abc.ABC):
    """A fused table-batched embedding bag with a fused optimizer (see the module docstring)."""

    kernel: str = "?"
    #: Tests set this to True: outputs are then allocated filled with NaN (where the kernel
    #: allocates them itself), so an element the kernel forgets to write shows up.
    poison_outputs: bool = False

    def __init__(
        self,
        rows: Sequence[int],
        dims: Sequence[int],
        precision: str = "fp16",
        optimizer: str = "sgd",
        lr: float = 0.01,
        eps: float = 1e-8,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        rows = [int(r) for r in rows]
        dims = [int(d) for d in dims]
        if len(rows) != len(dims):
            raise ValueError(f"rows and dims must have one entry per table: got {len(rows)} rows and {len(dims)} dims")
        if not rows:
            raise ValueError("a TBE needs at least one table")
        for t, (r, d) in enumerate(zip(rows, dims)):
            if r < 1:
                raise ValueError(f"table {t}: rows must be >= 1, got {r}")
            if d < MIN_DIM or d > MAX_DIM or d % DIM_MULTIPLE:
                raise ValueError(f"table {t}: dim must be a multiple of {DIM_MULTIPLE} in [{MIN_DIM}, {MAX_DIM}], got {d}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
        self.rows = rows
        self.dims = dims
        self.precision = precision
        self.dtype = PRECISIONS[precision]
        self.optimizer = optimizer
        self.lr = float(lr)
        self.eps = float(eps)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.seed = int(seed)
        self.col_offsets = [0]
        for d in dims:
            self.col_offsets.append(self.col_offsets[-1] + d)

    # ---------------------------------------------------------------- properties
    @property
    def num_tables(self) -> int:
        return len(self.rows)

    @property
    def total_dim(self) -> int:
        return self.col_offsets[-1]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(tables={self.num_tables}, total_dim={self.total_dim}, precision={self.precision!r}, "
            f"optimizer={self.optimizer!r}, device={str(self.device)!r})"
        )

    # ---------------------------------------------------------------- helpers
    def _check_inputs(self, indices: torch.Tensor, offsets: torch.Tensor) -> int:
        """Validate shapes/dtypes/devices (no device sync) and return the batch size B."""
        if indices.dim() != 1 or offsets.dim() != 1:
            raise ValueError(f"indices and offsets must be 1-D, got shapes {tuple(indices.shape)} and {tuple(offsets.shape)}")
        if indices.dtype not in (torch.int64, torch.int32) or offsets.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"indices and offsets must be int64 (or int32), got {indices.dtype} and {offsets.dtype}")
        if indices.device != self.device or offsets.device != self.device:
            raise ValueError(f"indices/offsets are on {indices.device}/{offsets.device}, the TBE is on {self.device}")
        n = offsets.numel() - 1
        if n < 0 or n % self.num_tables:
            raise ValueError(f"offsets must hold T*B+1 = {self.num_tables}*B+1 entries, got {offsets.numel()}")
        return n // self.num_tables

    def _new_output(self, batch: int) -> torch.Tensor:
        if self.poison_outputs:
            return torch.full((batch, self.total_dim), float("nan"), dtype=self.dtype, device=self.device)
        return torch.empty((batch, self.total_dim), dtype=self.dtype, device=self.device)

    def _host_tables(self, host_tables: Sequence[int]) -> list[int]:
        """A kernel's `host_tables` argument checked: the distinct indices, sorted (ValueError if any
        is not a table's)."""
        out = sorted({int(t) for t in host_tables})
        if any(not 0 <= t < self.num_tables for t in out):
            raise ValueError(f"host_tables: indices of the {self.num_tables} tables, got {out}")
        return out

    def _check_table(self, t: int) -> None:
        if not 0 <= t < self.num_tables:
            raise IndexError(f"table {t} out of range (this TBE has {self.num_tables} tables)")

    def _check_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_table(t)
        if tuple(w.shape) != (self.rows[t], self.dims[t]):
            raise ValueError(f"table {t}: weights must have shape {(self.rows[t], self.dims[t])}, got {tuple(w.shape)}")

    # ---------------------------------------------------------------- the interface
    @abc.abstractmethod
    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Pooled lookups ``[B, sum(dims)]`` (weight dtype). Remembers what backward needs."""

    @abc.abstractmethod
    def backward(self, grad_output: torch.Tensor) -> None:
        """Reduce ``grad_output`` per unique row of the last forward and update those rows in place."""

    @abc.abstractmethod
    def weights(self, t: int) -> torch.Tensor:
        """Current weights ``[rows[t], dims[t]]`` of table ``t`` (a view or a copy)."""

    @abc.abstractmethod
    def set_weights(self, t: int, w: torch.Tensor) -> None:
        """Overwrite table ``t``'s weights (cast to the weight dtype); optimizer state is kept."""

    def optimizer_state(self, t: int) -> torch.Tensor | None:
        """Row-wise Adagrad's state of table ``t`` as a view ``[rows[t]]`` (None for SGD): what a
        row cache (kernels/tiered.py) moves with the rows. Kernels that keep it elsewhere raise."""
        raise NotImplementedError(f"the {self.kernel} kernel does not expose its optimizer state")

    def __call__(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.forward(indices, offsets)

    def _check_grad(self, grad_output: torch.Tensor, batch: int) -> None:
        if tuple(grad_output.shape) != (batch, self.total_dim):
            raise ValueError(f"grad_output must have shape {(batch, self.total_dim)}, got {tuple(grad_output.shape)}")
        if grad_output.device != self.device:
            raise ValueError(f"grad_output is on {grad_output.device}, the TBE is on {self.device}")
