"""DreamShard's two networks, the replay buffer of measured placements, and the model file.

Shapes used throughout (docs/design.md §5):
  x          [E, T, F]  table features of E placements (episodes) of T tables each (zero-padded)
  placement  [E, T]     device of each table, -1 for padding / not placed
  z          [E, D, H]  shard vectors: the SUM of the per-table encodings of each device's tables
Sums over tables and a max over devices are what make both nets work for any number of tables
and devices, and make them invariant to the order of tables within a shard and of devices.

Costs inside the nets are in *units* of `CostNet.scale` milliseconds (set from the first real
measurements): the nets then see numbers near 1 whatever the hardware, from a 1 ms H200 step to a
1 s CPU one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dreamshard import shipped
from dreamshard.bins import BIN_MEAN
from dreamshard.costs.comm import alltoall_bytes_array, alltoall_ms, comm_params_problem
from dreamshard.costs.paths import product_us, sparse_us, table_arrays
from dreamshard.costs.terms import SHARD_TERMS, SHARED_WIDTH, TERMS, WIDE_DIM, shared_rows, shared_terms, table_terms
from dreamshard.files import load_torch_file
from dreamshard.learned.loop import atomic_save
from dreamshard.rowshard import RowShardSpec
from dreamshard.tables import NUM_FEATURES, TableSpec, features
from dreamshard.tasks import Task, Workload
from dreamshard.validation import ModelError, one_line

COST_COMPONENTS = ("fwd_comp_ms", "bwd_comp_ms", "comm_ms")  # the three per-shard heads, in order
MODEL_FORMAT = "dreamshard.model/1"


# which tables KernelFeatures' product-path columns mark: every candidate of the path's model
# (older model files, which carry no key), or those the kernel takes
PRODUCT_RULES = ("candidate", "kernel")
LINEAR_FEATURES = ("dim/128", "pooling/64", "dim*pooling/4096", "distinct/64", "dim*distinct/4096")
# The kernel terms (costs/terms.py) a table has by itself: all but the per-shard flags `launch` and
# `active` (0 for a table). `tables` (1 for every table) and `wide_programs` (a table's `programs`)
# add nothing a net could not make itself; they are kept because this is the set the offline
# evaluation measured (f3e71a6:benchmarks/costnet_prior.py, docs/costs.md). `wide_grad_bytes`
# and `branch_lookups` are not among them: they are the shard's, by its width and its dims' classes,
# which the net's sum over tables cannot express (and the shipped models were trained without them).
KERNEL_FEATURE_TERMS = tuple(t for t in TERMS if t not in ("launch", "active", "wide_grad_bytes", "branch_lookups"))
_KERNEL_COLUMNS = [TERMS.index(t) for t in KERNEL_FEATURE_TERMS]
# A term that no training table has (no masked dims among them, say) is scaled by the count it is
# a part of, so that an unseen table's value stays near 1 instead of dividing by zero.
_SCALE_LIKE = {"cold_bytes": "grad_bytes", "warm_bytes": "grad_bytes", "hot_bytes": "grad_bytes", "masked_gather_bytes": "grad_bytes",
               "masked_grad_bytes": "grad_bytes", "wide_programs": "programs"}


@dataclass(frozen=True)
class KernelFeatures:
    """Our change (Config.kernel_features, docs/costs.md): the work counts the simulator prices
    (costs/terms.py: lookups, gathered and gradient bytes by reuse, programs, tiles, masked
    bytes, launches ...) as features, each divided by its mean over the training tables (`scale`),
    and a dim > WIDE_DIM flag (the kernel's 8-warp wide path). A ReLU net given the log-scale
    features must learn the kernel's tile geometry from the few dims it was trained on; given the
    counts it only weighs them, and prices dims it has not seen (docs/costs.md).

    `scale` is fixed at training and stored with the model, so a table's features never depend
    on the tables planned beside it. The counts are taken at `batch_size`, the model's training
    batch (its costs are costs of that batch, whatever the task's), and the task's precision and
    optimizer.

    With `product_scale` (> 0; models trained since the kernel's product path, Config.
    kernel_product_path) two more: whether the table's backward is a product and that path's
    modelled time over `product_scale` (0 for the other tables): what the simulator prices such a
    table by in place of its backward terms, which the net could otherwise only infer from rows and
    pooling as an exception to every other table. Which tables, by `product_rule`: "kernel", those
    the kernel takes (paths.product_tables: a candidate that saves more than paths.DENSE_TABLE_US,
    as the simulator prices them; the shipped model); "candidate", every candidate
    (paths.takes_product), as the kernel took them before that rule (older files carry no key).

    `cache_bytes` (models trained against an L2-aware backend): the terms count a table's repeated gathers
    that miss this cache as cold bytes, as the backend trained against does (CostBackend.cache_bytes).

    With `shared` (Config.shared_terms) the columns of `terms.shared_rows` follow (`shared_width`):
    what a shard's six shared terms (launch, active, launches per tile class, the wide path, the
    forward's branches: sim.shard_terms) are functions of once summed over its tables, which the
    cost net applies to its shard vectors (CostNet `shared`)."""

    scale: tuple[float, ...]
    batch_size: int
    product_scale: float = 0.0  # 0: no product-path features (models trained before the path)
    cache_bytes: float = 0.0  # 0: every repeat counted as a possible cache hit (models trained before)
    product_rule: str = "candidate"  # which tables the product features mark (PRODUCT_RULES; the docstring)
    shared: bool = False  # + the shared terms' rows (models trained before them: none)

    @property
    def linear_width(self) -> int:
        """The kernel terms, the wide flag and the product-path pair: what the linear part weighs."""
        return len(KERNEL_FEATURE_TERMS) + 1 + (2 if self.product_scale else 0)

    @property
    def shared_width(self) -> int:
        return SHARED_WIDTH if self.shared else 0

    @property
    def width(self) -> int:
        return self.linear_width + self.shared_width

    @staticmethod
    def fit(tasks: Sequence[Task], batch_size: int, product_path: bool = True, cache_bytes: float = 0.0, shared: bool = False) -> "KernelFeatures":
        """The scales from the training tasks' tables (each task's table list, under its workload at `batch_size`)."""
        workloads = [t.workload.with_overrides(batch_size) for t in tasks]
        raw = np.concatenate([table_terms(t.tables, w, cache_bytes)[:, _KERNEL_COLUMNS] for t, w in zip(tasks, workloads)])
        mean = raw.mean(axis=0)
        like = mean[[KERNEL_FEATURE_TERMS.index(_SCALE_LIKE.get(t, t)) for t in KERNEL_FEATURE_TERMS]]
        scale = np.where(mean > 0, mean, np.where(like > 0, like, 1.0))
        product_scale = 0.0
        if product_path:
            us = np.concatenate([_product_us(t.tables, w, "kernel") for t, w in zip(tasks, workloads)])
            # the mean over the tables that take it; without any, a sorted-path table's mean time
            product_scale = float(us[us > 0].mean()) if (us > 0).any() else float(np.mean(np.concatenate(
                [sparse_us(table_arrays(t.tables, w.batch_size)[0], [x.dim for x in t.tables], w.elt_bytes) for t, w in zip(tasks, workloads)])) or 1.0)
        return KernelFeatures(tuple(float(v) for v in scale), int(batch_size), product_scale, float(cache_bytes), "kernel" if product_path else "candidate", shared)

    def __call__(self, tables: Sequence[TableSpec], workload: Workload) -> np.ndarray:
        workload = workload.with_overrides(self.batch_size)
        terms = table_terms(tables, workload, self.cache_bytes)
        columns = [terms[:, _KERNEL_COLUMNS] / np.array(self.scale), [[t.dim > WIDE_DIM] for t in tables]]
        if self.product_scale:
            us = _product_us(tables, workload, self.product_rule)
            columns += [(us > 0)[:, None], us[:, None] / self.product_scale]
        if self.shared:
            scale = {t: self.scale[KERNEL_FEATURE_TERMS.index(t)] for t in ("lookups", "programs", "grad_bytes")}
            columns.append(shared_rows(terms, [t.dim for t in tables], workload.optimizer, scale))
        return np.concatenate(columns, axis=1).astype(np.float32).reshape(len(tables), self.width)

    def to_json(self) -> dict:
        return {"scale": list(self.scale), "batch_size": self.batch_size, **({"product_scale": self.product_scale} if self.product_scale else {}),
                **({"cache_bytes": self.cache_bytes} if self.cache_bytes else {}),
                **({"product_rule": self.product_rule} if self.product_scale and self.product_rule != "candidate" else {}),
                **({"shared": True} if self.shared else {})}


def _product_us(tables: Sequence[TableSpec], workload: Workload, rule: str) -> np.ndarray:
    """[T] each table's product-path time where `rule` (PRODUCT_RULES) makes its backward a product,
    0 for the others (paths.product_us)."""
    return product_us(*table_arrays(tables, workload.batch_size), workload.batch_size, workload.elt_bytes, rule == "kernel")


def table_features(tables: Sequence[TableSpec], normalization: str, linear: bool = False, workload: Workload = Workload(),
                   kernel: KernelFeatures | None = None) -> np.ndarray:
    """The nets' input — every path (training, the MDP, the fast player, the split search's
    scorer) computes it here: the 21 DreamShard features, plus (`linear`, our change) five on a
    linear scale that say how much memory traffic a table makes per sample: its dim, its lookups
    (pooling factor), the values it gathers (dim × pooling), its distinct rows (pooling factor /
    mean access count of a touched row, from the reuse histogram) and their values (dim ×
    distinct). A fused kernel's time is close to a sum of such traffic over the shard's tables;
    from the log-scale or z-scored features a ReLU net has to build these products and ratios out
    of line segments, and it gets them wrong on tables it has not seen (docs/dreamshard.md).
    With `kernel` (our change, docs/costs.md) the kernel terms follow (`KernelFeatures`)."""
    x = features(tables, normalization, workload.precision)
    if linear:
        dim = np.array([t.dim for t in tables], np.float64)
        pf = np.array([t.pooling_factor for t in tables], np.float64)
        bins = np.array([t.bins for t in tables], np.float64).reshape(-1, len(BIN_MEAN))
        distinct = pf / np.maximum(bins @ BIN_MEAN, 1.0)
        extra = np.stack([dim / 128, pf / 64, dim * pf / 4096, distinct / 64, dim * distinct / 4096], axis=1).reshape(-1, len(LINEAR_FEATURES))
        x = np.concatenate([x, extra.astype(np.float32)], axis=1)
    if kernel is not None:
        x = np.concatenate([x, kernel(tables, workload)], axis=1)
    return x


def feature_count(linear: bool, kernel: KernelFeatures | None) -> int:
    return NUM_FEATURES + (len(LINEAR_FEATURES) if linear else 0) + (kernel.width if kernel is not None else 0)


@dataclass(frozen=True)
class CommFormula:
    """Our change (Config.comm "model", docs/costs.md): a device's all-to-all (forward + backward) from
    the comm model, in place of the cost net's comm head. A device's all-to-all depends on the
    device count and on what every other device sends it, which a head that sees one device's
    tables cannot know: on a dim mix it had not seen the head was 53% off (docs/costs.md).

    Why the parameters live in the model (taken at training from the backend it is trained
    against, `CostBackend.comm_params`) and not in a comm model file read at plan time: the cost
    net's other heads were fitted to that backend's numbers, so a plan's cost adds the all-to-all
    those targets had; and a model plans the same wherever it is loaded, whatever comm files are
    installed. The formula itself is costs/comm.py's (`alltoall_bytes_array`, `alltoall_ms`): the
    comm model's arithmetic, not a cost backend, written once for the simulator, the runners and
    this. Costs are those of `batch_size`, the model's training batch, as the other heads'."""

    latency_ms: float
    bandwidth_GBps: float
    serial_fraction: float
    batch_size: int
    source: str = ""

    @staticmethod
    def of(params: dict, batch_size: int) -> "CommFormula":
        return CommFormula(float(params["latency_ms"]), float(params["bandwidth_GBps"]), float(params.get("serial_fraction", 0.0)), int(batch_size),
                           str(params.get("source", "")))

    def params(self) -> dict:
        return {"latency_ms": self.latency_ms, "bandwidth_GBps": self.bandwidth_GBps, "serial_fraction": self.serial_fraction}

    def units(self, dim_sums, total, devices, elt, scale: float) -> np.ndarray:
        """Forward + backward all-to-all of devices holding `dim_sums` [...] columns of the
        all-to-all, in a plan of `devices` devices whose all-to-all is `total` columns wide (the
        task's: during an episode a device is priced as it will be once every table is placed,
        so its cost changes only when it gets a table), `elt` bytes per element; in units of
        `scale` ms. Arguments broadcast (NumPy)."""
        send, recv = alltoall_bytes_array(dim_sums, self.batch_size, elt, total, devices)
        # the backward all-to-all is the forward's reversed (send ↔ recv) and the formula is
        # symmetric in them, so it costs the forward's again: twice it (exactly fwd + bwd; the
        # episode player calls this every step, so one evaluation instead of two)
        return 2.0 * alltoall_ms(self.params(), send, recv) / scale

    def to_json(self) -> dict:
        return {**self.params(), "batch_size": self.batch_size, "source": self.source}


def a2a_dims(tables: Sequence[TableSpec]) -> np.ndarray:
    """[T] each table's columns in the all-to-all (a row shard's 0: it is exchanged by the
    row-wise collectives instead, costs/comm.py)."""
    return np.array([0.0 if isinstance(t, RowShardSpec) else float(t.dim) for t in tables], np.float64)


def replace_comm(costs, comm_units):
    """`costs` [..., 3] (NumPy or torch) with the comm column set to `comm_units` [...] (NumPy)."""
    if isinstance(costs, torch.Tensor):
        return torch.cat([costs[..., :2], torch.as_tensor(comm_units, dtype=costs.dtype).unsqueeze(-1)], dim=-1)
    out = np.array(costs, copy=True)
    out[..., 2] = comm_units
    return out


def mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


ONE_HOT_LIMIT = 2**26  # elements of shard_sum's one-hot (256 MB as float32) above which it sums by index


def shard_sum(enc: torch.Tensor, placement: torch.Tensor, devices: int) -> torch.Tensor:
    """[E, T, H] per-table encodings + [E, T] devices (-1 = none) → [E, D, H] per-device sums."""
    E, T = placement.shape
    if E * T * devices > ONE_HOT_LIMIT:
        # a one-hot [E, T, D] of a large task is gigabytes (6 plans of 100,000 tables on 1,024
        # devices: 2.5 GB, and twice that while built): sum by index instead; below the limit
        # the einsum, whose sums are deterministic on GPUs too (index_add's are not)
        enc = enc.expand(E, T, enc.shape[-1]) * (placement >= 0).unsqueeze(-1).to(enc.dtype)
        at = (torch.arange(E, device=placement.device).unsqueeze(1) * devices + placement.clamp(min=0)).reshape(-1)
        return enc.new_zeros(E * devices, enc.shape[-1]).index_add(0, at, enc.reshape(E * T, -1)).view(E, devices, -1)
    onehot = F.one_hot(placement.clamp(min=0), devices).to(enc.dtype) * (placement >= 0).unsqueeze(-1).to(enc.dtype)
    return torch.einsum("etd,eth->edh", onehot, enc)


class CostNet(nn.Module):
    """Predicts per-shard forward compute, backward compute and communication, and the overall
    step cost of a placement.

    The table encoder ends in a ReLU, so every shard vector is >= 0 and a device with no tables
    (vector 0) or a padding device never wins the element-wise max over devices.

    `linear` > 0 (our change, Config.cost_linear): the last `linear` features (the kernel terms,
    `KernelFeatures`, all >= 0) also enter each component through non-negative weights, summed
    over a device's tables: the simulator prices a fused kernel as a non-negative linear
    combination of these terms, so the net learns those weights and, in its ReLU layers, what is
    not linear (launches shared by a shard, the product path). A ReLU net alone fits the sums of
    the plans it is trained on and misprices a table of more work than it saw, by up to 2× on the
    hot family; the linear part prices it by its terms. The three linear outputs follow the latent
    vector in each shard vector (`encode`), so every path that sums shard vectors sums them too. `gate` (the column, among those `linear`, of the
    product-path flag): the terms enter twice, as they are and zeroed for the tables that take the
    product path, whose backward the simulator prices by the path's time instead of its terms —
    without the gated copy one weight per term has to price both kinds of table.

    `shared` > 0 (our change, Config.shared_terms; needs `linear`): the last `shared` features are
    `terms.shared_rows`, before them the `linear` ones. They pass into the shard vectors unchanged
    (after the linear outputs), and each component adds the six shard terms `terms.shared_terms`
    makes of their sums, through non-negative weights: the fixed costs a shard pays once (a launch,
    the backward's set-up, a launch per level and tile class, the wide path, the forward's
    branches), which no weights on sums of per-table terms can price — a device of one small table
    would be priced low and one of sixty high (benchmarks/shared_costs.py). With them the linear
    part can price a device exactly as the simulator does. The encoder does not see them.
    """

    def __init__(self, features: int = NUM_FEATURES, hidden: int = 128, latent: int = 32, head: int = 64, linear: int = 0, gate: int | None = None,
                 shared: int = 0):
        super().__init__()
        if shared and not linear:
            raise ModelError("a cost net's shared terms need its linear part")
        self.encoder = mlp([features - shared, hidden, latent], last_relu=True)
        self.heads = nn.ModuleList([mlp([latent, head, 1], last_relu=False) for _ in COST_COMPONENTS])
        self.overall_head = mlp([latent, head, 1], last_relu=False)
        self.register_buffer("scale", torch.tensor(1.0))  # ms per unit of the targets
        self.latent, self.linear, self.gate, self.shared = latent, linear, gate, shared
        if linear:
            # softplus(raw) >= 0: a term can only add work; training starts it at its least squares
            # on the first plans (learned.dreamshard.fit_linear), here near 0
            self.linear_raw = nn.Parameter(torch.full((linear * (1 if gate is None else 2), len(COST_COMPONENTS)), -10.0))
        if shared:
            self.shared_raw = nn.Parameter(torch.full((len(SHARD_TERMS), len(COST_COMPONENTS)), -10.0))

    def linear_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """[..., F] → what the linear part weighs: the `linear` features before the `shared` ones
        (and, with `gate`, them again zeroed where the gate column is 1)."""
        k = x[..., x.shape[-1] - self.shared - self.linear : x.shape[-1] - self.shared].clamp(min=0.0)
        return k if self.gate is None else torch.cat([k, k * (1.0 - k[..., self.gate : self.gate + 1])], dim=-1)

    def shared_inputs(self, x):
        """[..., F] (torch or NumPy) → the `shared` features, `terms.shared_rows` (none without them)."""
        return x[..., x.shape[-1] - self.shared :]

    def linear_weight(self) -> torch.Tensor:
        """[linear, 3] the non-negative weights of the linear part."""
        return F.softplus(self.linear_raw)

    def shared_weight(self) -> torch.Tensor:
        """[6, 3] the non-negative weights of the shard terms (`shared`)."""
        return F.softplus(self.shared_raw)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[..., F] → [..., latent (+ 3 with `linear`, + `shared`)] shard vectors of single tables."""
        z = self.encoder(x[..., : x.shape[-1] - self.shared])
        if not self.linear:
            return z
        return torch.cat([z, self.linear_inputs(x) @ self.linear_weight(), self.shared_inputs(x)], dim=-1)

    def shard_costs(self, z: torch.Tensor) -> torch.Tensor:
        """[..., H] shard vectors → [..., 3] (fwd_comp, bwd_comp, comm) in units."""
        out = torch.cat([h(z[..., : self.latent]) for h in self.heads], dim=-1)
        if not self.linear:
            return out
        out = out + z[..., self.latent : self.latent + len(COST_COMPONENTS)]
        if self.shared:
            out = out + torch.stack(shared_terms(z[..., -self.shared :]), dim=-1) @ self.shared_weight()
        return out

    def overall(self, z: torch.Tensor, device_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[E, D, H] shard vectors → [E] overall cost in units (max over the real devices)."""
        if device_mask is not None:
            z = z.masked_fill(~device_mask.unsqueeze(-1), 0.0)
        return self.overall_head(z[..., : self.latent].max(dim=1).values).squeeze(-1)

    def shards(self, x: torch.Tensor, placement: torch.Tensor, devices: int) -> torch.Tensor:
        return shard_sum(self.encode(x), placement, devices)

    def forward(self, x: torch.Tensor, placement: torch.Tensor, device_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-device costs [E, D, 3], overall [E]), in units."""
        z = self.shards(x, placement, device_mask.shape[1])
        return self.shard_costs(z), self.overall(z, device_mask)


class PolicyNet(nn.Module):
    """One logit per device from [Σ second table encoder over the device's tables, MLP of the cost
    net's predicted (fwd, bwd, comm) for the device's shard]; softmax over the legal devices.

    `sees_table=False` is the reference network: its single linear head cannot tell which table is
    being placed. `sees_table=True` (our change) adds what the placement would do — the cost net's
    predictions for the shard *with* the table — and the table's own encoding, through a hidden
    layer (a linear term in the table alone would shift every device's logit equally and change
    nothing).
    """

    def __init__(self, sees_table: bool, features: int = NUM_FEATURES, hidden: int = 128, latent: int = 32, cost_hidden: int = 64):
        super().__init__()
        self.sees_table = sees_table
        self.encoder = mlp([features, hidden, latent], last_relu=True)
        self.cost_encoder = mlp([6 if sees_table else 3, cost_hidden, latent], last_relu=True)
        if sees_table:
            self.head = mlp([3 * latent, cost_hidden, 1], last_relu=False)
        else:
            self.head = nn.Linear(2 * latent, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def logits(self, shard: torch.Tensor, costs: torch.Tensor, costs_after: torch.Tensor | None = None, table: torch.Tensor | None = None) -> torch.Tensor:
        """shard [E, D, H] policy-encoder sums, costs [E, D, 3] predicted (detached), and with
        `sees_table` costs_after [E, D, 3] and table [E, H] → logits [E, D]."""
        if self.sees_table:
            c = self.cost_encoder(torch.cat([costs, costs_after], dim=-1))
            t = table.unsqueeze(1).expand(-1, shard.shape[1], -1)
            return self.head(torch.cat([shard, c, t], dim=-1)).squeeze(-1)
        return self.head(torch.cat([shard, self.cost_encoder(costs)], dim=-1)).squeeze(-1)


SCORES = ("overall", "max_device")

# The cut net's options for a table: placed whole, or cut into column halves or quarters (each
# piece a table of its own width that reads the whole index stream: `plan.column_cuts`).
CUT_PARTS = (1, 2, 4)
CUT_CONTEXT = len(CUT_PARTS) + 1  # per option the log share of one piece, and log2 of the device count


class CutNet(nn.Module):
    """The split action of the estimated MDP: per table, logits over CUT_PARTS from the table's
    features and a context the cost net gives (`mdp.cut_context`): what one piece of each cut is
    predicted to cost alone, as a share of a device's mean load (the task's whole tables alone,
    summed, over the devices), and the device count. A cut pays only where a table would set the
    step; how much a piece saves is the cost net's (a column piece still does every lookup).

    The last layer's bias starts at CUT_PRIOR for "whole": an untrained net cuts a table with
    probability ~0.1, so the first measured plans look like the table-wise ones the cost net can
    price, and the cuts that pay are learned from there."""

    CUT_PRIOR = 3.0

    def __init__(self, features: int = NUM_FEATURES, hidden: int = 64):
        super().__init__()
        self.net = mlp([features + CUT_CONTEXT, hidden, hidden, len(CUT_PARTS)], last_relu=False)
        with torch.no_grad():
            self.net[-1].bias.zero_()
            self.net[-1].bias[0] = self.CUT_PRIOR

    def logits(self, x: torch.Tensor, context: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        """x [..., T, F] table features, context [..., T, CUT_CONTEXT], legal [..., T, len(CUT_PARTS)]
        bool → logits (−inf where the table's width does not allow the cut)."""
        return self.net(torch.cat([x, context], dim=-1)).masked_fill(~legal, float("-inf"))


def plan_cost(device_costs, overall, score: str):
    """The predicted cost of plans that RL minimises and best-of-K ranks by.

    `overall` (reference): the overall head, fed the element-wise max of the shard vectors.
    `max_device`: the paper's cost definition applied to the per-device heads,
    max_d (fwd_comp + bwd_comp + comm); those heads are fitted on D targets per measured plan
    instead of one, and a max over explicit device totals is harder for RL to exploit.
    Works on torch tensors and NumPy arrays: device_costs [..., D, 3], overall [...].
    """
    if score == "overall":
        return overall
    if score != "max_device":
        raise ValueError(f"score {score!r}: use one of {', '.join(SCORES)}")
    total = device_costs.sum(-1)
    return total.amax(-1) if isinstance(total, torch.Tensor) else total.max(-1)


# --------------------------------------------------------------------------------------------
# Replay buffer of measured placements
# --------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """One real measurement: the task's features (as the nets see them), where each table went,
    the per-device (fwd_comp, bwd_comp, comm) in ms, and the overall cost in ms."""

    x: np.ndarray  # [T, F] float32
    placement: np.ndarray  # [T] int64
    device_costs: np.ndarray  # [D, 3] float32
    overall: float


def collate(items: list[Measured]) -> dict[str, torch.Tensor]:
    """Pad a list of measurements to [B, Tmax, F], [B, Tmax], [B, Dmax, 3], [B, Dmax], [B]."""
    B = len(items)
    T = max(len(m.placement) for m in items)
    D = max(len(m.device_costs) for m in items)
    x = np.zeros((B, T, items[0].x.shape[1]), np.float32)
    placement = np.full((B, T), -1, np.int64)
    costs = np.zeros((B, D, 3), np.float32)
    dmask = np.zeros((B, D), bool)
    for i, m in enumerate(items):
        x[i, : len(m.x)] = m.x
        placement[i, : len(m.placement)] = m.placement
        costs[i, : len(m.device_costs)] = m.device_costs
        dmask[i, : len(m.device_costs)] = True
    overall = np.array([m.overall for m in items], np.float32)
    return {"x": torch.from_numpy(x), "placement": torch.from_numpy(placement), "device_costs": torch.from_numpy(costs), "device_mask": torch.from_numpy(dmask), "overall": torch.from_numpy(overall)}


class ReplayBuffer:
    """Every real measurement so far (the paper keeps them all: there are only ~100), or the
    simulator prior's plans. Items of one task share its feature array; the state stores each
    distinct array once (thousands of prior plans on tens of tasks stay a few MB)."""

    def __init__(self) -> None:
        self.items: list[Measured] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Measured) -> None:
        self.items.append(item)

    def draw(self, n: int, rng: np.random.Generator) -> list[Measured]:
        """`n` items drawn uniformly with replacement."""
        return [self.items[i] for i in rng.integers(len(self.items), size=n)]

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        return collate(self.draw(batch_size, rng))

    def state_dict(self) -> dict:
        arrays: dict[int, np.ndarray] = {}
        for m in self.items:
            arrays.setdefault(id(m.x), m.x)
        slot = {key: i for i, key in enumerate(arrays)}
        return {
            "x": [torch.from_numpy(a) for a in arrays.values()],
            "x_index": [slot[id(m.x)] for m in self.items],
            "placement": [torch.from_numpy(m.placement) for m in self.items],
            "device_costs": [torch.from_numpy(m.device_costs) for m in self.items],
            "overall": [float(m.overall) for m in self.items],
        }

    def load_state_dict(self, state: dict) -> None:
        xs = [x.numpy() for x in state["x"]]
        self.items = [
            Measured(xs[i], p.numpy(), c.numpy(), float(o))
            for i, p, c, o in zip(state["x_index"], state["placement"], state["device_costs"], state["overall"], strict=True)
        ]


# --------------------------------------------------------------------------------------------
# The model file: both nets + what is needed to use them
# --------------------------------------------------------------------------------------------


@dataclass
class DreamShardModel:
    """A trained DreamShard: cost net, policy, and the inference settings it was trained with."""

    cost_net: CostNet
    policy: PolicyNet
    normalization: str = "fixed"  # table features: "fixed" log scale or per-"task" z-scores
    best_of: int = 1  # plans per task at inference: greedy + (best_of - 1) sampled, best by cost net
    score: str = "overall"  # what a plan costs to the nets: see `plan_cost`
    linear_features: bool = False  # see `table_features`
    keep_room: bool = False  # MDP legality: see `mdp.keeps_room`
    meta: dict | None = None  # where it came from: backend, tasks, config, measurements, date
    kernel: KernelFeatures | None = None  # kernel-term features (Config.kernel_features), with their scale
    comm: CommFormula | None = None  # the comm model's all-to-all in place of the comm head (Config.comm "model")
    cut: CutNet | None = None  # the learned split action (Config.cuts); None: a table-wise policy

    @staticmethod
    def create(sees_table: bool, normalization: str, best_of: int = 1, score: str = "overall", linear_features: bool = False, keep_room: bool = False,
               kernel: KernelFeatures | None = None, comm: CommFormula | None = None, cuts: bool = False, cost_linear: bool = False) -> "DreamShardModel":
        """`cost_linear`: the cost net's linear part on the kernel features (CostNet `linear`; needs `kernel`)."""
        if cost_linear and kernel is None:
            raise ModelError("a cost net's linear part prices the kernel features: it needs kernel features")
        f = feature_count(linear_features, kernel)
        if kernel is not None and kernel.shared and not cost_linear:
            raise ModelError("the shared terms are priced by the cost net's linear part: they need it")
        # the product flag: KernelFeatures.__call__
        linear = dict(linear=kernel.linear_width, gate=kernel.linear_width - 2 if kernel.product_scale else None, shared=kernel.shared_width) if cost_linear else {}
        return DreamShardModel(CostNet(features=f, **linear), PolicyNet(sees_table, features=f), normalization, best_of, score, linear_features, keep_room, {}, kernel, comm,
                               CutNet(features=f) if cuts else None)

    def nets(self) -> list[nn.Module]:
        return [self.cost_net, self.policy] + ([self.cut] if self.cut is not None else [])

    def parameters(self) -> list[nn.Parameter]:
        return [p for net in self.nets() for p in net.parameters()]

    def features(self, tables: Sequence[TableSpec], workload: Workload) -> np.ndarray:
        """The nets' input for these tables (`table_features` with this model's settings)."""
        return table_features(tables, self.normalization, self.linear_features, workload, self.kernel)

    def state(self) -> dict:
        return {
            "format": MODEL_FORMAT,
            "cost_net": self.cost_net.state_dict(),
            "policy": self.policy.state_dict(),
            "sees_table": self.policy.sees_table,
            "normalization": self.normalization,
            "best_of": self.best_of,
            "score": self.score,
            "linear_features": self.linear_features,
            "keep_room": self.keep_room,
            "meta": self.meta or {},
            # only where set: a model without them is stored as before
            **({"kernel_features": self.kernel.to_json()} if self.kernel is not None else {}),
            **({"comm": self.comm.to_json()} if self.comm is not None else {}),
            **({"cut": self.cut.state_dict()} if self.cut is not None else {}),
        }

    def save(self, path: str | Path) -> None:
        """Atomic write (a kill mid-save never leaves a broken model file)."""
        atomic_save(self.state(), path)

    @staticmethod
    def from_state(state: dict, where: str = "model") -> "DreamShardModel":
        """A model from `state()`; ModelError naming `where` and the key for anything else."""
        from dreamshard.validation import require_keys

        if not isinstance(state, dict) or state.get("format") != MODEL_FORMAT:
            raise ModelError(f"{where}: not a {MODEL_FORMAT} file (train one with `dreamshard train`)")
        require_keys(state, ("cost_net", "policy", "sees_table", "normalization", "best_of"), where, ModelError)
        for key, kind in (("sees_table", bool), ("normalization", str), ("best_of", int), ("score", str), ("linear_features", bool), ("keep_room", bool)):
            if key in state and (not isinstance(state[key], kind) or (kind is int and isinstance(state[key], bool))):
                raise ModelError(f"{where}, key {key!r}: {state[key]!r:.40} is not a {kind.__name__}")
        if state["normalization"] not in ("fixed", "task"):
            raise ModelError(f"{where}, key 'normalization': {state['normalization']!r:.40} is not 'fixed' or 'task'")
        if not 1 <= state["best_of"] <= 10_000:
            raise ModelError(f"{where}, key 'best_of': {state['best_of']} must be in 1..10000")
        if state.get("score", "overall") not in SCORES:
            raise ModelError(f"{where}, key 'score': {state['score']!r:.40} is not one of {', '.join(SCORES)}")
        meta = state.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise ModelError(f"{where}, key 'meta': expected a dict")
        model = DreamShardModel.create(
            state["sees_table"],
            state["normalization"],
            state["best_of"],
            state.get("score", "overall"),
            state.get("linear_features", False),
            state.get("keep_room", False),
            _kernel_from_state(state.get("kernel_features"), where),
            _comm_from_state(state.get("comm"), where),
            "cut" in state,
            isinstance(state["cost_net"], dict) and "linear_raw" in state["cost_net"],
        )
        for key, net in (("cost_net", model.cost_net), ("policy", model.policy), ("cut", model.cut)):
            if net is None:
                continue
            if not isinstance(state[key], dict):
                raise ModelError(f"{where}, key {key!r}: expected a state dict of tensors")
            try:
                net.load_state_dict(state[key])
            except (RuntimeError, TypeError, KeyError, AttributeError) as e:  # missing/unexpected keys, shapes, non-tensors
                raise ModelError(f"{where}, key {key!r}: does not fit the network ({one_line(e)[:200]})") from None
        model.meta = dict(meta or {})
        for net in model.nets():
            net.eval()
        return model

    @staticmethod
    def load(path: str | Path | None = None) -> "DreamShardModel":
        """The model at `path`; None: the shipped model for this GPU (`dreamshard.shipped`: the
        rule every learned planner's shipped model follows)."""
        if path is None:
            path = shipped.model_path("dreamshard")
            if path is None:
                raise ModelError(f"no dreamshard model is shipped in {shipped.MODELS_DIR} (this install lacks it): pass a model file")
        path = Path(path)
        if not path.is_file():
            raise ModelError(f"{path}: no such model file")
        return DreamShardModel.from_state(load_torch_file(path, "model", ModelError), str(path))


def _finite(v, low: float = 0.0, strict: bool = False) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > low if strict else v >= low)


def _batch(d: dict, where: str, key: str) -> int:
    b = d.get("batch_size")
    if not (isinstance(b, int) and not isinstance(b, bool) and b >= 1):
        raise ModelError(f"{where}, key {key!r}: batch_size {b!r:.40} is not a positive integer")
    return b


def _kernel_from_state(d, where: str) -> KernelFeatures | None:
    if d is None:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("scale"), list) or len(d["scale"]) != len(KERNEL_FEATURE_TERMS) \
            or not all(_finite(v, strict=True) for v in d["scale"]):
        raise ModelError(f"{where}, key 'kernel_features': expected {{'scale': {len(KERNEL_FEATURE_TERMS)} numbers > 0, 'batch_size': int}}")
    product = d.get("product_scale", 0.0)
    cache = d.get("cache_bytes", 0.0)
    for name, v in (("product_scale", product), ("cache_bytes", cache)):
        if not _finite(v):
            raise ModelError(f"{where}, key 'kernel_features': {name} {v!r:.40} is not a number >= 0")
    rule = d.get("product_rule", "candidate")
    if rule not in PRODUCT_RULES:
        raise ModelError(f"{where}, key 'kernel_features': product_rule {rule!r:.40} is not one of {', '.join(PRODUCT_RULES)}")
    shared = d.get("shared", False)
    if not isinstance(shared, bool):
        raise ModelError(f"{where}, key 'kernel_features': shared {shared!r:.40} is not true or false")
    return KernelFeatures(tuple(float(v) for v in d["scale"]), _batch(d, where, "kernel_features"), float(product), float(cache), rule, shared)


def _comm_from_state(d, where: str) -> CommFormula | None:
    if d is None:
        return None
    problem = comm_params_problem(d, serial_required=True)  # a model's own params() always write it
    if problem:
        raise ModelError(f"{where}, key 'comm': {problem}")
    return CommFormula.of(d, _batch(d, where, "comm"))
