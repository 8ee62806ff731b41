"""Plain-PyTorch TBE: the reference and the baseline (one op per table, no fusion).

forward: ``torch.nn.functional.embedding_bag(mode="sum")`` per table;
backward: per table, the output gradient of each lookup's bag, ``index_add_`` into an fp32
gradient over the table's unique rows (a sparse reduce: a dense grad of a 10M-row table would
not fit), then the optimizer update of those rows.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from dreamshard.costs.kernels.base import TBE, init_table_
from dreamshard.costs.kernels.host_memory import host_mapped


class TorchTBE(TBE):
    kernel = "torch"

    def __init__(self, rows: Sequence[int], dims: Sequence[int], precision: str = "fp16", optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-8, device: str | torch.device = "cpu", seed: int = 0, host_tables: Sequence[int] = ()) -> None:
        """`host_tables`: tables whose weights and state live in host memory mapped into the GPU
        (kernels/host_memory.py; the uvm tier of kernels/tiered.py)."""
        super().__init__(rows, dims, precision, optimizer, lr, eps, device, seed)
        host = set(self._host_tables(host_tables))

        def new(t: int, n: int, dtype: torch.dtype) -> torch.Tensor:
            return host_mapped(n, dtype, self.device) if t in host else torch.empty(n, dtype=dtype, device=self.device)

        self._w = [init_table_(new(t, r * d, self.dtype).view(r, d), self.seed, t) for t, (r, d) in enumerate(zip(self.rows, self.dims))]
        self._state = None
        if self.optimizer == "rowwise_adagrad":
            self._state = [new(t, r, torch.float32).zero_() for t, r in enumerate(self.rows)]
        self._saved = None

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = self._check_inputs(indices, offsets)
        indices = indices.long()
        offsets = offsets.long()
        bounds = offsets[::batch].tolist() if batch else [0] * (self.num_tables + 1)
        out = self._new_output(batch)
        for t in range(self.num_tables):
            c0, c1 = self.col_offsets[t], self.col_offsets[t + 1]
            if batch == 0:
                continue
            idx = indices[bounds[t]:bounds[t + 1]]
            off = offsets[t * batch:(t + 1) * batch + 1] - bounds[t]
            out[:, c0:c1] = F.embedding_bag(idx, self._w[t], off, mode="sum", include_last_offset=True)
        self._saved = (indices, offsets, batch, bounds)
        return out

    def backward(self, grad_output: torch.Tensor) -> None:
        if self._saved is None:
            raise RuntimeError("backward() needs a forward() first")
        indices, offsets, batch, bounds = self._saved
        self._check_grad(grad_output, batch)
        for t in range(self.num_tables):
            n = bounds[t + 1] - bounds[t]
            if n == 0:
                continue
            c0, c1 = self.col_offsets[t], self.col_offsets[t + 1]
            idx = indices[bounds[t]:bounds[t + 1]]
            lengths = torch.diff(offsets[t * batch:(t + 1) * batch + 1])
            bag = torch.repeat_interleave(torch.arange(batch, device=self.device), lengths, output_size=n)
            g_lookup = grad_output[:, c0:c1].float()[bag]
            uniq, inverse = torch.unique(idx, return_inverse=True)
            g = torch.zeros(uniq.numel(), c1 - c0, dtype=torch.float32, device=self.device)
            g.index_add_(0, inverse, g_lookup)
            w = self._w[t]
            if self.optimizer == "sgd":
                new = w[uniq].float() - self.lr * g
            else:
                st = self._state[t][uniq] + (g * g).mean(dim=1)
                self._state[t][uniq] = st
                new = w[uniq].float() - self.lr * g / (st.sqrt() + self.eps).unsqueeze(1)
            w.index_copy_(0, uniq, new.to(self.dtype))

    def weights(self, t: int) -> torch.Tensor:
        self._check_table(t)
        return self._w[t]

    def set_weights(self, t: int, w: torch.Tensor) -> None:
        self._check_weights(t, w)
        self._w[t].copy_(w)

    def optimizer_state(self, t: int) -> torch.Tensor | None:
        self._check_table(t)
        return None if self._state is None else self._state[t]
