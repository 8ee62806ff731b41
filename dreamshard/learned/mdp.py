"""The estimated MDP (docs/design.md §5), batched over many episodes at once.

An episode places the tables of one task one at a time, in descending order of the cost net's
predicted single-table cost (fwd + bwd + comm of a shard holding only that table). The state is
the shards so far; an action is a device that still has memory for the table; the only reward is
at the end: minus the cost net's predicted overall cost. No cost backend is touched.

All E episodes of a batch advance together: step k places the k-th table of every episode with a
handful of tensor operations, so the Python loop runs T times (tables), never E × T. Episodes of
different tasks are padded to the largest table and device counts: padding tables come last in
the order and are skipped; padding devices are never legal.

For planning, `FastPlayer` plays a trained policy in NumPy and `best_placement` keeps the
cheapest of its greedy and sampled episodes by the cost net.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from dreamshard.costs.terms import SHARED_SCALARS, presence_bits, shard_terms_of, shared_terms
from dreamshard.learned.nets import CUT_CONTEXT, CUT_PARTS, CommFormula, CostNet, CutNet, DreamShardModel, KernelFeatures, PolicyNet, a2a_dims, plan_cost, replace_comm, shard_sum, table_features
from dreamshard.plan import Shard, column_cuts
from dreamshard.tasks import Task
from dreamshard.validation import DIM_MULTIPLE


@dataclass
class Prepared:
    """What the MDP needs of one task, computed once: features, bytes, devices, memory cap; and
    for a model that prices the all-to-all by the comm model (`CommFormula`), each table's
    all-to-all columns and the bytes per element."""

    x: np.ndarray  # [T, F] float32
    sizes: np.ndarray  # [T] int64 bytes on a device
    devices: int
    cap: int
    dims: np.ndarray | None = None  # [T] float64 columns in the all-to-all (`nets.a2a_dims`)
    elt: int = 2  # bytes per element of the exchanged outputs

    def a2a(self) -> np.ndarray:
        return self.dims if self.dims is not None else np.zeros(len(self.sizes))


def prepare(task: Task, normalization: str, linear_features: bool = False, kernel: KernelFeatures | None = None) -> Prepared:
    """The task as the MDP sees it, features by `table_features` (a model's: its normalization,
    linear_features and kernel)."""
    sizes = np.array(task.sizes(), np.int64)
    return Prepared(table_features(task.tables, normalization, linear_features, task.workload, kernel), sizes, task.devices, task.max_memory_bytes,
                    a2a_dims(task.tables), task.workload.elt_bytes)


@dataclass
class EpisodeBatch:
    x: torch.Tensor  # [E, T, F]
    sizes: torch.Tensor  # [E, T] int64
    table_mask: torch.Tensor  # [E, T] bool: a real table
    device_mask: torch.Tensor  # [E, D] bool: a real device
    cap: torch.Tensor  # [E] int64
    dims: np.ndarray | None = None  # [E, T] float64 all-to-all columns (0 on padding)
    elt: np.ndarray | None = None  # [E, 1] bytes per element

    @staticmethod
    def of(items: list[Prepared], active: np.ndarray | None = None) -> "EpisodeBatch":
        """Episodes of `items` (padded); `active` [E, T] bool (optional): episode e places only the
        tables it marks, the others are padding (the pieces of a cut set an episode's cuts chose)."""
        E, T, D = len(items), max(len(p.sizes) for p in items), max(p.devices for p in items)
        x = np.zeros((E, T, items[0].x.shape[1]), np.float32)
        sizes = np.zeros((E, T), np.int64)
        tmask = np.zeros((E, T), bool)
        dmask = np.zeros((E, D), bool)
        dims = np.zeros((E, T))
        for i, p in enumerate(items):
            n = len(p.sizes)
            x[i, :n], sizes[i, :n], tmask[i, :n], dmask[i, : p.devices], dims[i, :n] = p.x, p.sizes, True, True, p.a2a()
        if active is not None:
            tmask[:, : active.shape[1]] &= active
            sizes[~tmask], dims[~tmask] = 0, 0.0
        cap = torch.tensor([p.cap for p in items], dtype=torch.int64)
        elt = np.array([[p.elt] for p in items], np.float64)
        return EpisodeBatch(torch.from_numpy(x), torch.from_numpy(sizes), torch.from_numpy(tmask), torch.from_numpy(dmask), cap, dims, elt)

    def comm_units(self, comm: CommFormula, dim_sums: torch.Tensor, scale: float) -> np.ndarray:
        """[E, N] the comm model's all-to-all (units) of devices holding `dim_sums` [E, N] columns,
        each episode's task being the plan (`CommFormula.units`)."""
        total = self.dims.sum(1, keepdims=True)
        devices = self.device_mask.sum(1, keepdim=True).numpy()
        return comm.units(dim_sums.numpy() if isinstance(dim_sums, torch.Tensor) else dim_sums, total, devices, self.elt, scale)


@dataclass
class Rollout:
    placement: torch.Tensor  # [E, T] device per table (task order); -1 for padding / unplaced
    log_prob: torch.Tensor  # [E, T] log π(action) per step (placement order); 0 where no decision
    entropy: torch.Tensor  # [E, T] entropy of π per step
    decided: torch.Tensor  # [E, T] bool: this step placed a real table
    stuck: torch.Tensor  # [E] bool: a table found no device with room (episode incomplete)
    device_costs: torch.Tensor  # [E, D, 3] predicted (fwd_comp, bwd_comp, comm), units
    overall: torch.Tensor  # [E] predicted overall cost, units (reward = -overall)


def alone_costs(cost_net: CostNet, comm: CommFormula | None, batch: EpisodeBatch, cenc: torch.Tensor) -> torch.Tensor:
    """[E, T] each table's predicted cost alone on a device (fwd + bwd + comm, units; with `comm`,
    the comm model's all-to-all of the table alone in place of the comm head's), padding −inf."""
    single = cost_net.shard_costs(cenc)
    if comm is not None:
        dims = torch.from_numpy(batch.dims if batch.dims is not None else np.zeros(batch.sizes.shape))
        single = replace_comm(single, batch.comm_units(comm, dims, float(cost_net.scale)))
    return single.sum(-1).masked_fill(~batch.table_mask, float("-inf"))


def table_order(cost_net: CostNet, comm: CommFormula | None, batch: EpisodeBatch, cenc: torch.Tensor) -> torch.Tensor:
    """[E, T] table indices, most expensive first by predicted single-table cost (`alone_costs`);
    padding last."""
    return torch.argsort(alone_costs(cost_net, comm, batch, cenc), dim=1, descending=True, stable=True)


def remaining_max(sizes_o: torch.Tensor) -> torch.Tensor:
    """[E, T] → [E, T]: the largest table still to come after each step (0 after the last)."""
    after = torch.cat([sizes_o[:, 1:], torch.zeros_like(sizes_o[:, :1])], dim=1)
    return after.flip(1).cummax(1).values.flip(1)


def keeps_room(free: torch.Tensor, size: torch.Tensor, fits: torch.Tensor, largest_next: torch.Tensor) -> torch.Tensor:
    """Of the devices that fit the table, those after which the largest table still to come
    fits somewhere. Where none qualifies, every fitting device stays legal.

    free [E, D] (-1 on padding devices), size / largest_next [E], fits [E, D] → [E, D] bool.
    """
    top = free.topk(min(2, free.shape[1]), dim=1)
    first = top.values[:, 0:1]
    second = top.values[:, 1:2] if free.shape[1] > 1 else torch.full_like(first, -1)
    # the most free memory on the *other* devices: the runner-up for the device that has the most
    others = torch.where(torch.arange(free.shape[1]).unsqueeze(0) == top.indices[:, 0:1], second, first)
    ok = fits & (torch.maximum(others, free - size.unsqueeze(1)) >= largest_next.unsqueeze(1))
    return torch.where(ok.any(1, keepdim=True), ok, fits)


def rollout(
    cost_net: CostNet,
    policy: PolicyNet,
    batch: EpisodeBatch,
    greedy: bool | torch.Tensor = False,
    generator: torch.Generator | None = None,
    keep_room: bool = False,
    comm: CommFormula | None = None,
) -> Rollout:
    """Play every episode of `batch` to the end with `policy` on the cost net's MDP.

    `greedy` (bool or [E] bool): argmax instead of sampling. Gradients flow into the policy only
    (log-probs, entropy); everything the cost net computes is detached, as in the reference.
    `keep_room` (our change): a device is legal only if, after the table, the largest table
    still to come fits somewhere (`keeps_room`) — the reference's memory check alone lets a
    policy fill every device and strand a big table, and the episode has no valid end.
    `comm` (a model's `CommFormula`): the comm model's all-to-all in place of the comm head,
    everywhere the cost net's per-device costs are read (table order, the policy's input, the
    final costs).
    """
    E, T = batch.sizes.shape
    D = batch.device_mask.shape[1]
    greedy = torch.as_tensor(greedy, dtype=torch.bool).expand(E)
    scale = float(cost_net.scale)

    def device_costs(z: torch.Tensor, dim_sums: torch.Tensor) -> torch.Tensor:
        costs = cost_net.shard_costs(z)
        return costs if comm is None else replace_comm(costs, batch.comm_units(comm, dim_sums, scale))

    dims = torch.from_numpy(batch.dims if batch.dims is not None else np.zeros((E, T)))
    with torch.no_grad():
        cenc = cost_net.encode(batch.x)  # [E, T, H]
        order = table_order(cost_net, comm, batch, cenc)
    penc = policy.encode(batch.x)

    def in_order(t: torch.Tensor) -> torch.Tensor:
        idx = order if t.dim() == 2 else order.unsqueeze(-1).expand(-1, -1, t.shape[-1])
        return t.gather(1, idx)

    cenc_o, penc_o, sizes_o, valid_o, dims_o = in_order(cenc), in_order(penc), in_order(batch.sizes), in_order(batch.table_mask), in_order(dims)
    largest_next = remaining_max(sizes_o)
    used = torch.zeros(E, D, dtype=torch.int64)  # bytes on each device
    csum = torch.zeros(E, D, cenc.shape[-1])  # cost-net shard vectors (no grad)
    dsum = torch.zeros(E, D, dtype=dims.dtype)  # all-to-all columns on each device
    psum = torch.zeros(E, D, penc.shape[-1])  # policy shard vectors (grad)
    stuck = torch.zeros(E, dtype=torch.bool)
    actions, log_probs, entropies, decided = [], [], [], []
    first_device = F.one_hot(torch.zeros(E, dtype=torch.long), D).bool()
    steps = int(batch.table_mask.sum(1).max()) if E else 0  # padding comes last in the order: nothing after
    for k in range(steps):
        legal = batch.device_mask & (used + sizes_o[:, k : k + 1] <= batch.cap.unsqueeze(1))
        if keep_room:
            free = torch.where(batch.device_mask, batch.cap.unsqueeze(1) - used, torch.full_like(used, -1))
            legal = keeps_room(free, sizes_o[:, k], legal, largest_next[:, k])
        stuck = stuck | (valid_o[:, k] & ~legal.any(1))
        active = valid_o[:, k] & ~stuck
        # Rows with nothing to decide get a dummy legal device so the softmax stays finite.
        legal = torch.where(active.unsqueeze(1), legal, first_device)
        with torch.no_grad():
            costs = device_costs(csum, dsum)
            after = device_costs(csum + cenc_o[:, k].unsqueeze(1), dsum + dims_o[:, k : k + 1]) if policy.sees_table else None
        logits = policy.logits(psum, costs, after, penc_o[:, k] if policy.sees_table else None)
        logits = logits.masked_fill(~legal, float("-inf"))
        logp = torch.log_softmax(logits, dim=1)
        # Gumbel-max: one draw from softmax(logits) per row, reproducible through `generator`.
        u = torch.rand(E, D, generator=generator).clamp_(1e-10, 1.0)
        noisy = torch.where(greedy.unsqueeze(1), logits, logits.detach() - torch.log(-torch.log(u)))
        a = noisy.argmax(1)
        p = logp.exp()
        entropies.append(-(p * logp.masked_fill(~legal, 0.0)).sum(1) * active)
        log_probs.append(logp.gather(1, a.unsqueeze(1)).squeeze(1) * active)
        decided.append(active)
        actions.append(torch.where(active, a, torch.full_like(a, -1)))
        onehot = F.one_hot(a, D) * active.unsqueeze(1)
        used = used + onehot * sizes_o[:, k : k + 1]
        csum = csum + onehot.unsqueeze(-1) * cenc_o[:, k].unsqueeze(1)
        dsum = dsum + onehot * dims_o[:, k : k + 1]
        psum = psum + onehot.unsqueeze(-1) * penc_o[:, k].unsqueeze(1)
    if steps:
        placed_o = torch.cat([torch.stack(actions, 1), torch.full((E, T - steps), -1, dtype=torch.long)], 1)
        log_prob, entropy, dec = torch.stack(log_probs, 1), torch.stack(entropies, 1), torch.stack(decided, 1)
    else:
        placed_o = torch.full((E, T), -1, dtype=torch.long)
        log_prob = entropy = torch.zeros(E, 0)
        dec = torch.zeros(E, 0, dtype=torch.bool)
    placement = torch.full((E, T), -1, dtype=torch.long).scatter(1, order, placed_o)
    with torch.no_grad():
        final = device_costs(csum, dsum) * batch.device_mask.unsqueeze(-1)
        overall = cost_net.overall(csum, batch.device_mask)
    return Rollout(placement, log_prob, entropy, dec, stuck, final, overall)


def predict(cost_net: CostNet, batch: EpisodeBatch, placement: torch.Tensor, comm: CommFormula | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The cost net's (per-device costs [E, D, 3], overall [E]) for given placements, in units;
    with `comm`, the comm model's all-to-all in place of the comm head (as `rollout`)."""
    with torch.no_grad():
        costs, overall = cost_net(batch.x, placement, batch.device_mask)
        if comm is not None:
            dims = torch.from_numpy(batch.dims).unsqueeze(-1)
            costs = replace_comm(costs, batch.comm_units(comm, shard_sum(dims, placement, batch.device_mask.shape[1])[..., 0], float(cost_net.scale)))
    return costs * batch.device_mask.unsqueeze(-1), overall


# --------------------------------------------------------------------------------------------
# The split action: a cut per table, chosen before the placement episode
# --------------------------------------------------------------------------------------------
#
# An episode of a model with a cut net (`CutNet`) first chooses, for every table at once, whether
# to place it whole or cut into column halves or quarters (CUT_PARTS); then the policy places the
# pieces it chose, one at a time, as tables of their own (a column piece is a table of its own
# width reading the whole index stream). Every option's pieces are in one list, the task's cut
# set; an episode's cuts mark the pieces it places (`EpisodeBatch.of(active=)`), so episodes of
# different cuts of one task play in one batch. The reward is the one of the placement: minus the
# cost net's predicted cost of the plan of pieces. Row splits are not an action: a table's blocks
# would need distinct devices, which this MDP's legality does not know (the planner's search
# offers them).

CUT_MAX = 256  # the planner offers cuts to the CUT_MAX tables costliest alone (a task of thousands of tables)


@dataclass
class CutSet:
    """A task and every cut its episodes may choose, as one list of pieces (`prepared`: the pieces
    as tables): per table its whole piece, and for the tables offered cuts their halves and
    quarters where the width allows (`legal`)."""

    task: Task
    prepared: Prepared
    pieces: list[Shard]
    owner: np.ndarray  # [P] the table of each piece
    option: np.ndarray  # [P] its option: index into CUT_PARTS
    first: np.ndarray  # [P] bool: the first piece of its (table, option)
    whole: np.ndarray  # [T] each table's whole piece
    legal: np.ndarray  # [T, len(CUT_PARTS)] bool

    def active(self, options: np.ndarray) -> np.ndarray:
        """[K, T] options → [K, P] bool: the pieces each episode places."""
        return options[:, self.owner] == self.option[None]

    def pieces_task(self, active: np.ndarray) -> tuple[Task, Prepared, list[Shard]]:
        """An episode's pieces ([P] bool) as a task of tables, as the MDP sees it, and as pieces."""
        idx = np.flatnonzero(active)
        pieces = [self.pieces[i] for i in idx]
        p = self.prepared
        prepared = Prepared(p.x[idx], p.sizes[idx], p.devices, p.cap, None if p.dims is None else p.dims[idx], p.elt)
        task = Task([q.spec(self.task.tables[q.table]) for q in pieces], self.task.devices, self.task.max_memory_bytes, self.task.workload, self.task.pool, topology=self.task.topology,
                    row_layouts=self.task.row_layouts)
        return task, prepared, pieces


def cut_set(task: Task, model: DreamShardModel, offered: np.ndarray | None = None) -> CutSet:
    """The cut set of `task` for `model`'s features; `offered` [T] bool: the tables offered cuts
    (None: every table whose width allows one)."""
    pieces, owner, option = [], [], []
    legal = np.zeros((len(task.tables), len(CUT_PARTS)), bool)
    for i, t in enumerate(task.tables):
        for o, parts in enumerate(CUT_PARTS):
            if parts == 1 or ((offered is None or offered[i]) and parts <= t.dim // DIM_MULTIPLE):
                legal[i, o] = True
                pieces += [Shard(i, -1, a, b) for a, b in column_cuts(t.dim, parts)]
                owner += [i] * parts
                option += [o] * parts
    owner_a, option_a = np.array(owner, np.int64), np.array(option, np.int64)
    first = np.ones(len(pieces), bool)
    first[1:] = (owner_a[1:] != owner_a[:-1]) | (option_a[1:] != option_a[:-1])
    whole = np.flatnonzero(first & (option_a == 0))
    ptask = Task([q.spec(task.tables[q.table]) for q in pieces], task.devices, task.max_memory_bytes, task.workload, task.pool, topology=task.topology,
                 row_layouts=task.row_layouts)
    prepared = prepare(ptask, model.normalization, model.linear_features, model.kernel)
    return CutSet(task, prepared, pieces, owner_a, option_a, first, whole, legal)


@dataclass
class CutChoice:
    options: np.ndarray  # [E, T] chosen option per table (-1 on padding)
    active: np.ndarray  # [E, P] bool: the pieces each episode places
    log_prob: torch.Tensor  # [E] Σ over the tables with a choice of log π(option)
    entropy: torch.Tensor  # [E] Σ of their entropies
    decisions: torch.Tensor  # [E] how many tables had a choice


def cut_logits(model: DreamShardModel, sets: list[CutSet]) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The cut net's logits [E, T, len(CUT_PARTS)] for the tables of `sets` (one per episode,
    padded; −inf where a cut is illegal, padding's only legal option "whole"), `legal` and
    `real` [E, T]. A table's context (`CutNet`): per option, log of one piece's predicted cost
    alone over the task's mean device load (0 where illegal); log2 of the device count."""
    E = len(sets)
    T = max(len(s.whole) for s in sets)
    x = np.zeros((E, T, sets[0].prepared.x.shape[1]), np.float32)
    context = np.zeros((E, T, CUT_CONTEXT), np.float32)
    legal = np.zeros((E, T, len(CUT_PARTS)), bool)
    legal[..., 0] = True
    real = np.zeros((E, T), bool)
    with torch.no_grad():
        batch = EpisodeBatch.of([s.prepared for s in sets])
        alone = alone_costs(model.cost_net, model.comm, batch, model.cost_net.encode(batch.x)).numpy()
    for e, s in enumerate(sets):
        n = len(s.whole)
        x[e, :n] = s.prepared.x[s.whole]
        legal[e, :n], real[e, :n] = s.legal, True
        share = alone[e, : len(s.pieces)] / max(float(alone[e, s.whole].sum()) / s.prepared.devices, 1e-9)
        f = np.flatnonzero(s.first)
        context[e, s.owner[f], s.option[f]] = np.log(np.maximum(share[f], 1e-6))
        context[e, :n, -1] = np.log2(s.prepared.devices)
    return model.cut.logits(torch.from_numpy(x), torch.from_numpy(context), torch.from_numpy(legal)), legal, real


def choose_cuts(model: DreamShardModel, sets: list[CutSet], greedy: bool | np.ndarray = False, generator: torch.Generator | None = None) -> CutChoice:
    """The cut net's options for episodes of `sets` (one per episode): argmax where `greedy`, else
    sampled (Gumbel-max through `generator`). Gradients flow into the cut net (log-probs,
    entropy); the cost net's context is detached."""
    logits, legal, real = cut_logits(model, sets)
    E, P = len(sets), max(len(s.pieces) for s in sets)
    logp = torch.log_softmax(logits, dim=-1)
    u = torch.rand(logits.shape, generator=generator).clamp_(1e-10, 1.0)
    greedy_t = torch.as_tensor(greedy, dtype=torch.bool).expand(E)[:, None, None]
    options = torch.where(greedy_t, logits, logits.detach() - torch.log(-torch.log(u))).argmax(-1)
    choice = torch.from_numpy(real & (legal.sum(-1) > 1))
    log_prob = (logp.gather(-1, options.unsqueeze(-1)).squeeze(-1) * choice).sum(1)
    entropy = (-(logp.exp() * logp.masked_fill(~torch.from_numpy(legal), 0.0)).sum(-1) * choice).sum(1)
    opts = np.where(real, options.numpy(), -1)
    active = np.zeros((E, P), bool)
    for e, s in enumerate(sets):
        active[e, : len(s.pieces)] = s.active(opts[e : e + 1, : len(s.whole)])[0]
    return CutChoice(opts, active, log_prob, entropy, choice.sum(1))


def plan_cuts(model: DreamShardModel, s: CutSet, greedy: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The planner's cuts: [K, T] options of K episodes of one task, argmax where `greedy`, else
    sampled from the cut net (its logits computed once)."""
    with torch.inference_mode():
        logits = cut_logits(model, [s])[0][0].numpy()  # [T, O]
    noise = -np.log(-np.log(np.clip(rng.random((len(greedy), *logits.shape)), 1e-10, 1.0)))
    noise[np.asarray(greedy, bool)] = 0.0
    return (logits[None] + noise).argmax(-1)


def rollout_cuts(model: DreamShardModel, sets: list[CutSet], greedy: bool | np.ndarray = False, generator: torch.Generator | None = None,
                 keep_room: bool = False) -> tuple[CutChoice, Rollout]:
    """One episode per set: the cut net's cuts, then the policy places the chosen pieces."""
    cuts = choose_cuts(model, sets, greedy, generator)
    batch = EpisodeBatch.of([s.prepared for s in sets], cuts.active)
    return cuts, rollout(model.cost_net, model.policy, batch, greedy, generator, keep_room, model.comm)


# --------------------------------------------------------------------------------------------
# Inference: the same MDP in NumPy, incrementally
# --------------------------------------------------------------------------------------------
#
# Planning must take milliseconds (200 tables on 8 devices ≤ 50 ms on one core), and at one
# episode torch's per-operation overhead dominates: the loop above spends ~0.7 ms per step. The
# nets' first layers are linear in the shard sums, so their pre-activations can be *accumulated*
# per device as tables arrive (one row added per step) instead of recomputed, and only the
# device that just received a table needs its costs recomputed. `tests/test_dreamshard.py`
# checks this path against `rollout` (same greedy placements and predicted costs).


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)




class _GumbelNoise:
    """Gumbel-max noise [T, K, D] for the sampled episodes, drawn in blocks of steps so memory
    stays bounded at 10,000 tables × 1,024 devices; the draws are the same numbers, in the same
    order, as one rng.random((T, sampled, D)) call (a generator fills arrays sequentially)."""

    BLOCK = 256

    def __init__(self, rng: np.random.Generator | None, sample: np.ndarray, D: int, T: int):
        self.rng, self.sample, self.D, self.T = rng, sample, D, T
        self.n = int(sample.sum())
        self.start, self.block = 0, np.zeros((0, self.n, D), np.float32)  # the sampled episodes' noise only

    def step(self, k: int) -> np.ndarray:
        """[K, D] noise of step k (steps are asked for in order); zero for greedy episodes."""
        out = np.zeros((len(self.sample), self.D), np.float32)
        if not self.n:
            return out
        if k - self.start >= len(self.block):
            self.start = k
            # -log(-log(u)) in place: the same float32 numbers without temporaries of the
            # block's size (at 1,024 devices the noise was a fifth of a plan's time)
            u = self.rng.random((min(self.BLOCK, self.T - k), self.n, self.D), dtype=np.float32)
            np.clip(u, 1e-10, 1.0, out=u)
            np.log(u, out=u)
            np.negative(u, out=u)
            np.log(u, out=u)
            np.negative(u, out=u)
            self.block = u
        out[self.sample] = self.block[k - self.start]
        return out


class NumpyCostNet:
    """A frozen cost net on accumulated per-device state, in NumPy.

    A device's *state* is the sum of its tables' rows (`rows`): the cost heads' first-layer
    pre-activations (linear in the shard sum) followed by the shard vector itself. Adding a table
    to a device is one row addition; `costs` and `overall` read predictions off the state. The
    fast player and the search planners (which place column shards as tables of their own) share
    it."""

    def __init__(self, cost_net: CostNet):
        self.cost_net = cost_net
        heads = cost_net.heads
        # three heads fused: first layers side by side [H, 3·64], second layers one einsum
        W1 = [_np(h[0].weight).T for h in heads]
        b1 = [_np(h[0].bias) for h in heads]
        W2 = [_np(h[2].weight)[0] for h in heads]
        ov = cost_net.overall_head
        Wo1 = _np(ov[0].weight).T
        if cost_net.linear:
            # the linear part (CostNet `linear`): shard vectors carry its 3 outputs after the latent
            # ones, each >= 0; as one more first-layer unit per head that passes its output through
            # (a ReLU of a value >= 0 is the value) with second-layer weight 1, `costs` adds it
            # unchanged, and the overall head reads only the latent part
            n = len(heads)
            for k in range(n):
                W1[k] = np.concatenate([np.concatenate([W1[k], np.zeros((n, W1[k].shape[1]), np.float32)]), np.eye(cost_net.latent + n, dtype=np.float32)[:, [cost_net.latent + k]]], axis=1)
                b1[k] = np.append(b1[k], np.float32(0.0))
                W2[k] = np.append(W2[k], np.float32(1.0))
            Wo1 = np.concatenate([Wo1, np.zeros((n, Wo1.shape[1]), np.float32)])
        self.shared = cost_net.shared
        if self.shared:
            # the shared terms' rows (CostNet `shared`) pass through too, after the heads' units,
            # so a device's pre-activations carry their sums; `costs` makes the six terms of them
            # (the overall head does not read them: a state keeps the shard vector without them, `rows`)
            H = Wo1.shape[0]
            W1 = [np.concatenate([w, np.zeros((self.shared, w.shape[1]), np.float32)]) for w in W1]
            W1.append(np.eye(H + self.shared, dtype=np.float32)[:, H:])
            b1.append(np.zeros(self.shared, np.float32))
            self._shared_w = _np(cost_net.shared_weight())  # [6, 3]
            self._shared_compute = self._shared_w[:, :2].sum(1)
        # [H, 3·64 (+ shared)], [3·64 (+ shared)], [3, 64] (+1 unit a head with the linear part)
        self.W1, self.b1, self.W2blk = np.concatenate(W1, axis=1), np.concatenate(b1), np.stack(W2)
        self.b2 = np.array([float(h[2].bias.detach()) for h in heads], np.float32)
        self.Wo1, self.bo1, self.wo2, self.bo2 = Wo1, _np(ov[0].bias), _np(ov[2].weight)[0], float(ov[2].bias.detach())
        self.nP = self.W1.shape[1]
        self.scale = float(cost_net.scale)
        self._w2_compute, self._b2_compute = self.W2blk[:2].reshape(-1), float(self.b2[:2].sum())  # `compute`: the fwd and bwd heads' second layers

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the shard-vector encodings the overall head reads [T, H], head pre-activations [T, nP])
        of table features [T, F] (the shared terms' rows are in the pre-activations only)."""
        with torch.inference_mode():
            cenc = self.cost_net.encode(x)
            return cenc[:, : self.Wo1.shape[0]], cenc @ torch.from_numpy(self.W1)

    def rows(self, x: np.ndarray) -> np.ndarray:
        """[T, nP + H]: what each table adds to its device's state."""
        cenc, P = self.encode(torch.from_numpy(x))
        return torch.cat([P, cenc], dim=1).numpy()

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """The state of empty devices, [*shape, nP + H] (first-layer bias included)."""
        state = np.zeros((*shape, self.nP + self.Wo1.shape[0]), np.float32)  # Wo1: [H, hidden]
        state[..., : self.nP] = self.b1
        return state

    def costs(self, pre: np.ndarray) -> np.ndarray:
        """Heads on pre-activations that already include the first-layer bias → [..., 3] units
        (block-diagonal second layer as one einsum: a [.., 192] @ [192, 3] matmul is 2-3x slower
        at these sizes)."""
        k = self.W2blk.shape[1]
        h = np.maximum(pre[..., : 3 * k], 0.0)
        out = np.einsum("...hj,hj->...h", h.reshape(*h.shape[:-1], 3, k), self.W2blk) + self.b2
        if self.shared:
            out += self._shared_units(pre, self._shared_w)
        return out

    def compute(self, pre: np.ndarray, presences: tuple[np.ndarray, int] | None = None) -> np.ndarray:
        """[...] forward + backward compute of `costs` (its first two heads) in one product: what
        the searches' greedy places by, step after step. With `presences` ((words, f) of
        `terms.presence_bits` of the same sums): `pre` holds only `compute_columns`."""
        k = self.W2blk.shape[1]
        out = np.maximum(pre[..., : 2 * k], 0.0) @ self._w2_compute + self._b2_compute
        if self.shared and presences is None:
            out += self._shared_units(pre, self._shared_compute)
        elif self.shared:
            words, f = presences
            counts = np.bitwise_count(words)
            out += np.stack(shard_terms_of(pre[..., 2 * k :], counts[..., :f].sum(-1), counts[..., f:].sum(-1)), axis=-1) @ self._shared_compute
        return out

    def compute_columns(self, rows: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, int] | None]:
        """What `compute` of sums of state rows [..., R] needs, for a greedy to carry step by step:
        the columns (the forward and backward heads' units; with shared terms their scalar sums)
        and with shared terms the rows' presences as bits (`terms.presence_bits`: OR-ed, not
        summed). ~140 of ~430 columns with shared terms."""
        k = self.W2blk.shape[1]
        if not self.shared:
            return np.arange(2 * k), None
        at = 3 * k
        return np.concatenate([np.arange(2 * k), at + np.arange(SHARED_SCALARS)]), presence_bits(rows[..., at : at + self.shared])

    def _shared_units(self, pre: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The shared terms (CostNet `shared`) of the sums that pre-activations carry after the
        heads' units, weighed by `weights` ([6, ...])."""
        return np.stack(shared_terms(pre[..., 3 * self.W2blk.shape[1] :]), axis=-1) @ weights

    def overall(self, csum: np.ndarray) -> np.ndarray:
        """[..., D, H] shard vectors → [...] the overall head's cost, units."""
        z = csum.max(axis=-2)
        return np.maximum(z @ self.Wo1 + self.bo1, 0.0) @ self.wo2 + self.bo2


class FastPlayer:
    """Plays K episodes of one task at once with a frozen cost net and policy, in NumPy; with
    `comm` (a model's `CommFormula`) the comm model's all-to-all in place of the comm head, as
    `rollout`."""

    def __init__(self, cost_net: CostNet, policy: PolicyNet, keep_room: bool = False, comm: CommFormula | None = None):
        self.cost_net, self.policy, self.keep_room, self.comm = cost_net, policy, keep_room, comm
        self.net = NumpyCostNet(cost_net)
        self.W1, self.b1 = self.net.W1, self.net.b1
        self.ce = [(_np(m.weight).T, _np(m.bias)) for m in policy.cost_encoder if isinstance(m, torch.nn.Linear)]
        latent = policy.encoder[-2].out_features
        if policy.sees_table:
            W = _np(policy.head[0].weight).T  # [3·latent, hidden]: rows for shard, cost latent, table
            self.Wa, self.Wb, self.Wc = W[:latent], W[latent : 2 * latent], W[2 * latent :]
            self.bh = _np(policy.head[0].bias)
            self.wh2, self.bh2 = _np(policy.head[2].weight)[0], float(policy.head[2].bias.detach())
        else:
            w = _np(policy.head.weight)[0]
            self.Wa, self.Wb = w[:latent, None], w[latent:, None]
            self.bh = float(policy.head.bias.detach())
        self._costs = self.net.costs

    def _shard_logits(self, cw: np.ndarray, hq: np.ndarray) -> np.ndarray:
        """The reference policy's logit of each device from its cost-encoder pre-activations
        `cw` [..., hidden] and shard term `hq` [..., 1] (sees_table=False only)."""
        (_, _), (w2, b2) = self.ce
        c = np.maximum(np.maximum(cw, 0.0) @ w2 + b2, 0.0)
        return (hq + c @ self.Wb)[..., 0]

    def play(self, p: Prepared, greedy: np.ndarray, rng: np.random.Generator | None = None, active: np.ndarray | None = None):
        """(placement [K, T], stuck [K], device costs [K, D, 3] units, overall [K] units).

        `active` [K, T] (optional): episode k places only the tables it marks, so one batch can
        play different subsets of one table list (the split search plays several cuts of a
        task at once: every cut's pieces are tables of the list)."""
        K, T, D = len(greedy), len(p.sizes), p.devices
        # Per-table work in torch (one matmul per layer over all T tables); NumPy's BLAS wakes
        # its thread pool for matrices this size, which costs more than the maths on a busy CPU.
        x = torch.from_numpy(p.x)
        cenc, P = self.net.encode(x)  # [T, 3·64] the cost heads' pre-activations
        with torch.inference_mode():
            penc = self.policy.encode(x)
            Q = penc @ torch.from_numpy(self.Wa)  # [T, hidden] (or [T, 1]): the policy head's shard term
            rows = torch.cat([P, cenc, Q], dim=1).numpy()  # what a table adds to its device's state
            R = (penc @ torch.from_numpy(self.Wc)).numpy() if self.policy.sees_table else None
        nP, nC, nQ = P.shape[1], cenc.shape[1], Q.shape[1]
        dims = p.a2a().astype(np.float32)
        rows = np.concatenate([rows, dims[:, None]], axis=1)  # + the table's all-to-all columns
        # each episode's all-to-all width: its task's, or its cut's (the same columns, cut otherwise)
        totals = np.full((K, 1), dims.sum()) if active is None else (active @ dims.astype(np.float64))[:, None]
        scale = self.net.scale

        def device_costs(pre: np.ndarray, dim_sums: np.ndarray, total) -> np.ndarray:
            costs = self._costs(pre)
            if self.comm is not None:
                costs[..., 2] = self.comm.units(dim_sums, total, D, p.elt, scale)
            return costs

        # one table order for every episode: they play one task, or cuts of it of one width
        order = np.argsort(-device_costs(rows[:, :nP] + self.b1, dims, totals.max()).sum(-1), kind="stable")
        # Per-device state, one array so a placement is one row addition: cost-head
        # pre-activations (with bias), cost-net shard vector, policy-head shard term (with bias),
        # all-to-all columns.
        state = np.zeros((K, D, rows.shape[1]), np.float32)
        state[..., :nP] = self.b1
        state[..., nP + nC : nP + nC + nQ] = self.bh
        S, csum, hq, dsum = state[..., :nP], state[..., nP : nP + nC], state[..., nP + nC : nP + nC + nQ], state[..., -1]
        costs = device_costs(S, dsum, totals)  # [K, D, 3]: only the device that gets a table changes
        (w1, b1), (w2, b2) = self.ce
        w1c, w1a = w1[:3], w1[3:]  # the cost encoder's first layer: current costs | costs after
        cw = costs @ w1c + b1
        used = np.zeros((K, D), np.int64)
        placement = np.full((K, T), -1, np.int64)
        stuck = np.zeros(K, bool)
        ks, devices = np.arange(K), np.arange(D)
        sample = ~np.asarray(greedy, bool)
        noise = _GumbelNoise(rng, sample, D, T)
        sizes = p.sizes[order]
        largest_next = np.maximum.accumulate(np.append(sizes[1:], 0)[::-1])[::-1]
        # The reference policy (no table input) scores a device from that device's state alone,
        # so its logits change only where a table just went: kept per device and updated there
        # (O(K) net work per step instead of O(K·D), which is what 1,024 devices need).
        shard_logits = None if self.policy.sees_table else self._shard_logits(cw, hq)
        for step, t in enumerate(order):
            if active is not None and not active[:, t].any():
                continue  # a piece of a cut no episode chose
            legal = used + sizes[step] <= p.cap
            if self.keep_room and D > 1:  # as `keeps_room`
                free = p.cap - used
                # Where two devices have room for the largest table to come, whichever device
                # takes this one another keeps that room: every legal device keeps room. The
                # common case, and the checks below cost most of a step at 1,024 devices.
                if not ((free >= largest_next[step]).sum(1) >= 2).all():
                    # the most free memory on the other devices: the runner-up on the device with the most
                    top = np.argmax(free, axis=1)
                    first = free[ks, top]
                    free[ks, top] = -1  # free >= 0 elsewhere: masks the top device
                    second = free.max(axis=1)
                    free[ks, top] = first
                    others = np.where(devices == top[:, None], second[:, None], first[:, None])
                    ok = legal & (np.maximum(others, free - sizes[step]) >= largest_next[step])
                    legal = np.where(ok.any(1, keepdims=True), ok, legal)
            blocked = ~legal.any(1)
            go = ~stuck if active is None else ~stuck & active[:, t]
            stuck |= blocked & go
            go &= ~blocked
            if self.policy.sees_table:
                after = device_costs(S + rows[t, :nP], dsum + dims[t], totals)
                c = np.maximum(np.maximum(cw + after @ w1a, 0.0) @ w2 + b2, 0.0)
                logits = np.maximum(hq + c @ self.Wb + R[t], 0.0) @ self.wh2
            else:
                logits = shard_logits
            a = np.where(legal, logits + noise.step(step), -np.inf).argmax(1)
            k = ks if go.all() else ks[go]
            a = a[k]
            placement[k, t] = a
            used[k, a] += sizes[step]
            state[k, a] += rows[t]
            costs[k, a] = device_costs(S[k, a], dsum[k, a], totals[k, 0])
            cw[k, a] = costs[k, a] @ w1c + b1
            if shard_logits is not None:
                shard_logits[k, a] = self._shard_logits(cw[k, a], hq[k, a])
        return placement, stuck, costs, self.net.overall(csum)


def best_placement(model: DreamShardModel, p: Prepared, best_of: int, seed: int = 0, player: FastPlayer | None = None) -> tuple[np.ndarray | None, np.ndarray | None, float | None]:
    """The `dreamshard` planner's play: the greedy episode and `best_of` − 1 sampled ones in one
    batch, the cheapest by the cost net → (placement [T], predicted per-device costs [D, 3] ms,
    predicted overall ms), or Nones if every episode got stuck."""
    player = player or FastPlayer(model.cost_net, model.policy, model.keep_room, model.comm)
    greedy = np.zeros(best_of, bool)
    greedy[0] = True  # episode 0 is the greedy one: best_of=1 is the reference's argmax policy
    placement, stuck, costs, overall = player.play(p, greedy, np.random.default_rng(seed))
    if stuck.all():
        return None, None, None
    k = int(np.where(stuck, np.inf, plan_cost(costs, overall, model.score)).argmin())
    scale = float(model.cost_net.scale)
    return placement[k], costs[k] * scale, float(overall[k]) * scale
