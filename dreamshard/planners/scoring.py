"""The cost net as the planners that search see it: pieces (column and row shards) as rows of
per-device state, plan costs read off the state, and the `predicted` entry of a plan.

Row shards. The cost net prices a device's compute from the features of what it holds; a row
piece's are its own (its rows, measured lookups and bins: `RowShardSpec`). Its exchange is not
the all-to-all the comm head learned: a row-wise table's partial outputs are summed by a
reduce-scatter over all D devices, and their gradients all-gathered (costs/comm.py). The scorer
prices it as the simulator does (costs/sim.py), with the same formula (`comm.rowwise_ms`, pure
arithmetic on a comm model's parameters — not a cost backend):

  - a row piece adds nothing to its device's comm head (its block of the heads' first layer is
    zero in its state row), so the comm head sees only the device's all-to-all tables;
  - a state row carries one more column, the piece's share of its table's dim (dim × its rows /
    the table's rows); summed over the devices it is the dim of the row-wise buffer, and
    `collective_ms` of it — reduce-scatter plus all-gather — is added to every device's comm;
  - and one more, a row piece's columns in its device's TBE output: with the all-to-all widths it
    prices the copies around the exchange (`comm.relayout_ms`), added to each device's comm.

Under the `max_device` score (max over devices of fwd + bwd + comm, the shipped model's) that is
exact to the simulator's rule.

A model whose all-to-all is the comm model's (`nets.CommFormula`, Config.comm "model") has no
comm head to read: a state row carries the piece's all-to-all columns (its width; a row piece's
0), and a device's all-to-all is the comm model's of the task's device count on its columns, in a
plan as wide as the sum of every device's (`device_costs`) — what the runners and the simulator
charge, not the formula stored in the model: that one was taken from the backend trained against,
one device count's parameters for tasks of 2 to 8, without the busiest peer's wait
(`coupling`) or the knee of the fits of 4 and more devices, and searches ranked plans by its
errors. A model scored by its `overall` head cannot have the all-to-all
part of a row piece taken out of the overall head, so `row_moves` is False for it: the searches
offer no row splits, and a table larger than a device (which only a row split places) is priced
with the collective added to the overall head.

The comm model's parameters default to the shipped NCCL fit for the shipped cost net's GPU at the
task's device count: `comm_params`.

A task on several hosts (its `topology`, topology.py): the comm head learned one host's all-to-all,
so the scorer prices the all-to-all by the two-level formula instead (costs/hierarchy.py, the
simulator's: inside a host the comm model of its GPU count, between hosts the topology's links),
on each device's all-to-all columns, the row-wise exchange of tables spread over hosts by
`hierarchy.rowwise_topo_ms`, and that of table-row-wise splits (`splits.twrw_blocks`: a table's G
blocks on the G GPUs of one host) as the simulator does: a state row carries a table-row-wise
piece's share of its table's dim in a column of its own, whose sum over a host's GPUs is that
host's reduce-scatter buffer (`hierarchy.twrw_ms`), its pooled output crossing hosts in the
all-to-all (`hierarchy.twrw_traffic`).

A task with memory tiers (the tier stage's, tier_stage.py): the cost net was trained on HBM
tables, so a host-tier piece carries in one more column what its tier adds to its device's step,
priced as the simulator prices it (`host.shard_ms`, pure arithmetic on the host link's measured
rates, HostLink's defaults: not a cost backend), added to the device's forward compute; without it
the searches would place host-tier tables as if they were in HBM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from dreamshard.costs.comm import CommModel, alltoall_bytes_array, alltoall_ms, load_comm_model, relayout_ms, rowwise_ms
from dreamshard.costs.hierarchy import alltoall_topo_ms, inter_host_ms, rowwise_topo_ms, twrw_ms, twrw_traffic
from dreamshard.costs.host import HostLink, shard_ms
from dreamshard.learned.mdp import NumpyCostNet
from dreamshard.learned.nets import COST_COMPONENTS, DreamShardModel, plan_cost
from dreamshard.plan import Shard
from dreamshard.planners import splits
from dreamshard.tasks import Task
from dreamshard.tier_stage import with_task_tier
from dreamshard.tiers import cache_rows
from dreamshard.topology import several_hosts

COMM = COST_COMPONENTS.index("comm_ms")
EXTRA_COLUMNS = 6  # a state row's columns after the net's: row-wise dim, all-to-all width, row columns, table-row-wise dim, host tiers, cut share
CUT_PENALTY_CAP = 5  # tables: `cut_penalty` grows with the tables a plan cuts into columns up to this many


def comm_params(comm_model: str | Path | CommModel | None, devices: int = 2) -> dict:
    """The collectives' parameters the scorer prices row splits with: a comm model file (or
    model), or None for the shipped NCCL model of the GPU planned for (the one visible here, else
    `comm.DEFAULT_GPU`: `shipped.target_gpu`, whose cost net the planner uses) at the task's
    device count (`comm.default_model_path`)."""
    return load_comm_model(comm_model, "cuda", devices).params()


def predicted_dict(device_costs: np.ndarray, overall: float, model_label: str) -> dict:
    devices = [{**{c: float(v) for c, v in zip(COST_COMPONENTS, row)}, "total_ms": float(row.sum())} for row in device_costs]
    # overall_ms: the overall head; max_device_ms: max over devices of the per-device totals
    return {"source": f"dreamshard cost net ({model_label})", "overall_ms": float(overall), "max_device_ms": max(d["total_ms"] for d in devices), "devices": devices}


class PieceScorer:
    """The cost net's view of pieces: each piece's state row, device bytes and all-to-all width,
    measured once per piece and kept in a cache the searches index by slot (`slots`); the row-wise
    exchange from `comm` (a comm model's parameters, `comm_params`). `cut_penalty`: a plan's score
    is raised by this fraction for each table it cuts into columns, up to CUT_PENALTY_CAP tables
    (0: the net's price as it is): a search keeps the plans its price underrates most, and on the
    development tasks the net underpriced the measured plans the more, the more tables they cut."""

    def __init__(self, model: DreamShardModel, task: Task, comm: dict | None = None, cut_penalty: float = 0.0):
        self.model, self.task, self.cut_penalty = model, task, float(cut_penalty)
        self.net = NumpyCostNet(model.cost_net)
        self.topology = several_hosts(task.topology)
        # several hosts: the collectives' inside-a-host part is the comm model of one host's GPUs
        self.comm = comm if comm is not None else comm_params(None, self.topology.gpus_per_host if self.topology else task.devices)
        self.row_moves = model.score == "max_device" and task.devices > 1
        nP = self.net.nP
        self._heads = self.net.W2blk.shape[1]  # a head's units in a state row
        self._rw = nP + self.net.Wo1.shape[0]  # the column of a piece's share of the row-wise dim
        self._a2a = self._rw + 1  # the column of a piece's all-to-all width
        self._rc = self._a2a + 1  # the column of a row piece's columns in its device's TBE output (the copies around the exchange)
        self._tw = self._rc + 1  # the column of a table-row-wise piece's share of its table's dim (several hosts)
        self._tier = self._tw + 1  # the column of what a host-tier piece's tier adds to its device's step (units)
        self._cut = self._tier + 1  # the column of a column piece's share of its table's dim (a cut table's pieces sum to 1)
        self._slot: dict[Shard, int] = {}
        # Indexed by slot, filled up to len(_slot); grown geometrically, so that the searches' many
        # lookups of a few new pieces each cost the new pieces, not a copy of the cache.
        self.table = np.zeros((0, self._cut + 1), np.float32)  # state rows
        self.bytes = np.zeros(0, np.int64)  # device bytes (`splits.sizes`)
        self.single = np.zeros(0, np.float32)  # predicted compute alone (`alone`): the greedy's order of pieces

    def slots(self, pieces: list[list[Shard]]) -> np.ndarray:
        """[C, n] the slots of C candidate piece lists of up to n pieces each, new pieces measured
        first; -1 after the end of a shorter list. Index `table` and `bytes` with it (after the
        call: they may grow)."""
        slot = self._slot
        # candidates share most of their piece objects: each distinct object is looked up once (a
        # Shard's hash is a tuple's, by far the dearest part of a search's many lookups)
        seen: dict[int, int] = {}
        for ps in pieces:
            for p in ps:
                if id(p) not in seen:
                    seen[id(p)] = slot.get(p, -1)
        n = max((len(ps) for ps in pieces), default=0)
        out = np.array([[seen[id(p)] for p in ps] + [-1] * (n - len(ps)) for ps in pieces], np.int64).reshape(len(pieces), -1)
        missing = [(c, k) for c, k in np.argwhere(out < 0).tolist() if k < len(pieces[c])]
        if missing:
            self.measure(pieces[c][k] for c, k in missing)
            for c, k in missing:
                out[c, k] = slot[pieces[c][k]]
        return out

    def measure(self, pieces: Iterable[Shard]) -> None:
        """Cache the pieces not cached yet, in one batch: a batch costs a fixed ~0.1 ms beyond its
        pieces (the nets' and features' calls), so a search measures a step's new pieces together."""
        new = [p for p in dict.fromkeys(pieces) if p not in self._slot]
        if not new:
            return
        x = self.model.features(splits.specs(self.task, new), self.task.workload)
        rows = np.concatenate([self.net.rows(x.astype(np.float32)), np.zeros((len(new), EXTRA_COLUMNS), np.float32)], axis=1)
        blocks = splits.twrw_blocks(self.task, new)
        for r, p, block in zip(rows, new, blocks):
            if p.is_row_shard:  # not in the all-to-all: its share of the reduce-scatter instead
                t = self.task.tables[p.table]
                a, b = p.row_range(t)
                r[COMM * self._heads : (COMM + 1) * self._heads] = 0.0
                r[self._tw if block >= 0 else self._rw] = t.dim * (b - a) / t.rows
                r[self._rc] = t.dim
            else:
                r[self._a2a] = p.width
                dim = self.task.tables[p.table].dim
                r[self._cut] = p.width / dim if p.width < dim else 0.0
        if self.task.tiers is not None:
            w, link = self.task.workload, HostLink()
            for r, p in zip(rows, new):
                p = with_task_tier(self.task, p)
                if p.tier != "hbm":
                    spec = p.spec(self.task.tables[p.table])
                    fwd, bwd, _, _ = shard_ms(link, spec, p.tier, cache_rows(spec.rows, p.cache_ratio), w.batch_size, w.elt_bytes, w.optimizer == "rowwise_adagrad")
                    r[self._tier] = (fwd + bwd) / self.net.scale
        n, k = len(self._slot), len(new)
        if n + k > len(self.table):
            size = max(2 * len(self.table), n + k)
            self.table = np.concatenate([self.table[:n], np.zeros((size - n, self.table.shape[1]), np.float32)])
            self.bytes = np.concatenate([self.bytes[:n], np.zeros(size - n, np.int64)])
            self.single = np.concatenate([self.single[:n], np.zeros(size - n, np.float32)])
        self.table[n : n + k] = rows
        self.bytes[n : n + k] = splits.sizes(self.task, new)
        self.single[n : n + k] = self.alone(rows)
        self._slot.update((p, n + j) for j, p in enumerate(new))

    def rows(self, pieces: list[list[Shard]]) -> np.ndarray:
        """[C, n, R] state rows of C candidate piece lists of n pieces each."""
        slots = self.slots(pieces)  # first: it may grow `table`
        return self.table[slots]

    def alone(self, rows: np.ndarray) -> np.ndarray:
        """[..., R] piece rows → [...] each piece's predicted compute (fwd + bwd) on a device of
        its own, units: what the search planners rank pieces by."""
        return self.net.compute(rows[..., : self.net.nP] + self.net.b1)

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """The state of empty devices, [*shape, R]."""
        state = self.net.empty(shape)
        return np.concatenate([state, np.zeros((*shape, EXTRA_COLUMNS), state.dtype)], axis=-1)

    def device_costs(self, state: np.ndarray) -> np.ndarray:
        """[..., D, R] device states of whole plans → [..., D, 3] (fwd, bwd, comm) units: the
        heads', or with the model's `CommFormula` the comm model's all-to-all in place of the comm
        head's (the row-wise exchange is added by `score` and `predicted`)."""
        costs = self.net.costs(state[..., : self.net.nP])
        costs[..., 0] += state[..., self._tier]  # host tiers (module docstring)
        comm = self.model.comm
        w = self.task.workload
        if self.topology is not None:  # the two-level all-to-all in place of the one-host head's (module docstring)
            topo = self.topology
            tw = state[..., self._tw]
            extra = {}
            if tw.any():  # table-row-wise pieces: each host's reduce-scatter, their outputs across hosts
                host_dims = np.rint(tw.reshape(*tw.shape[:-1], topo.hosts, topo.gpus_per_host).sum(-1))
                extra = dict(zip(("extra_send", "extra_recv"), twrw_traffic(host_dims, w.batch_size, w.elt_bytes, topo)))
                rs, ag = twrw_ms(self.comm, host_dims, w.batch_size, w.elt_bytes, topo)
            fwd, bwd = alltoall_topo_ms(self.comm, state[..., self._a2a], w.batch_size, w.elt_bytes, topo, **extra)
            costs[..., COMM] = (fwd + bwd) / self.net.scale
            if extra:
                costs[..., COMM] += (rs + ag) / self.net.scale
        elif comm is not None:  # the comm model of the task's device count, as the runners charge it (module docstring)
            cols = state[..., self._a2a]
            send, recv = alltoall_bytes_array(cols, comm.batch_size, w.elt_bytes, cols.sum(-1, keepdims=True), self.task.devices)
            costs[..., COMM] = 2.0 * alltoall_ms(self.comm, send, recv) / self.net.scale  # backward = forward reversed, the same cost
        if self.comm.get("relayout"):  # the copies of devices with row pieces, as the simulator prices them
            fwd, bwd = relayout_ms(self.comm, state[..., self._a2a], state[..., self._rc], w.batch_size, w.elt_bytes)
            costs[..., COMM] += (fwd + bwd) / self.net.scale
        return costs

    def state(self, pieces: list[Shard], devices: np.ndarray) -> np.ndarray:
        """[D, R] the device states of one placement of `pieces`."""
        state = self.empty((self.task.devices,))
        for d, row in zip(np.asarray(devices).tolist(), self.rows([pieces])[0]):
            state[d] += row  # as np.add.at would, in piece order: ~2x faster at a few hundred pieces
        return state

    def placed_states(self, rows: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """[..., D, R] the device states of many placements at once: `devices` [..., n] of pieces
        whose state rows are `rows` [..., n, R] (broadcast against the placements' leading
        dimensions), one-hot placements times the rows in one product."""
        onehot = np.zeros((*devices.shape[:-1], self.task.devices, devices.shape[-1]), rows.dtype)
        np.put_along_axis(onehot, devices[..., None, :], 1.0, axis=-2)
        return onehot @ rows + self.empty((self.task.devices,))

    def collective(self, state: np.ndarray) -> np.ndarray:
        """[..., D, R] device states → [...] the row-wise exchange (reduce-scatter + all-gather)
        every device waits for, units (0 without row pieces)."""
        return self.collective_of(np.rint(state[..., self._rw].sum(-1)))

    def collective_of(self, rowwise_dim) -> np.ndarray:
        """The row-wise exchange of a buffer of `rowwise_dim` columns, units."""
        w = self.task.workload
        if self.topology is not None:
            rs, ag = rowwise_topo_ms(self.comm, rowwise_dim, w.batch_size, w.elt_bytes, self.topology)
        else:
            rs, ag = rowwise_ms(self.comm, rowwise_dim, w.batch_size, w.elt_bytes, self.task.devices)
        return (rs + ag) / self.net.scale

    def split_exchange(self, dims) -> np.ndarray:
        """The exchange (forward + backward) a row split of tables of `dims` columns adds, units:
        on one host the row-wise collectives over every device (`collective_of`); on several, the
        table-row-wise one — the reduce-scatter and all-gather over one host's GPUs and the pooled
        output through each port (`hierarchy.twrw_ms`, `twrw_traffic`), as the simulator prices it."""
        if self.topology is None:
            return self.collective_of(dims)
        topo, w = self.topology, self.task.workload
        host = np.zeros((len(np.atleast_1d(dims)), topo.hosts))
        host[:, 0] = np.atleast_1d(dims)
        rs, ag = twrw_ms(self.comm, host, w.batch_size, w.elt_bytes, topo)
        send, recv = twrw_traffic(host, w.batch_size, w.elt_bytes, topo)
        k = float(self.comm.get("coupling", 0.0))
        port = inter_host_ms(topo, send, recv, k).max(-1) + inter_host_ms(topo, recv, send, k).max(-1)
        return (rs[:, 0] + ag[:, 0] + port) / self.net.scale

    def row_candidates(self, pieces: list[Shard], among: list[int], top: int) -> list[int]:
        """Of the pieces `among`, the `top` predicted costliest alone that a row split may pay
        for: whole tables (`splits.is_whole`) whose compute alone, above an empty device's,
        exceeds the exchange their rows would add (reduce-scatter + all-gather of their dim) — a
        split saves at most the first (each block still pays a device's fixed cost). This is
        decided before any row piece is measured (on several hosts the exchange is the
        table-row-wise one, `split_exchange`). None where the score cannot price row pieces
        (`row_moves`)."""
        if not self.row_moves or not among:
            return []
        single = self.alone(self.rows([[pieces[i] for i in among]])[0]) - self.alone(np.zeros(self.net.nP))
        dims = np.array([self.task.tables[pieces[i].table].dim for i in among])
        keep = [(-c, i) for i, c, worth in zip(among, single, single > self.split_exchange(dims)) if worth and splits.is_whole(self.task, pieces[i])]
        return [i for _, i in sorted(keep)[:top]]

    def bound_without(self, state: np.ndarray, device: int, piece: Shard) -> float:
        """A bound, before any row piece is measured, on what splitting `piece` (a whole table
        on `device`) by rows can reach: the plan's score with the table gone from its device and
        its dim in the row-wise exchange, its blocks nowhere (they only add to the devices that
        take them). A row split whose bound does not beat the plan is not worth measuring."""
        trial = state.copy()
        trial[device] -= self.rows([[piece]])[0, 0]
        # several hosts: split over the device's host (table-row-wise), whose exchange is that host's
        trial[device, self._tw if self.topology is not None else self._rw] += self.task.tables[piece.table].dim
        return float(self.score(trial))

    def predicted(self, pieces: list[Shard], devices: np.ndarray, label: str) -> dict:
        """The plan's `predicted` entry: per-device costs and the overall cost, ms."""
        state = self.state(pieces, devices)
        nP = self.net.nP
        costs = self.device_costs(state) * self.net.scale
        extra = float(self.collective(state)) * self.net.scale
        costs[:, COMM] += extra
        out = predicted_dict(costs, (float(self.net.overall(state[:, nP : self._rw])) * self.net.scale) + extra, label)
        if extra:
            out["rowwise_comm_ms"] = extra
        return out

    def score(self, state: np.ndarray) -> np.ndarray:
        """[..., D, R] device states → [...] the model's plan cost, units (with `cut_penalty`)."""
        nP = self.net.nP
        base = plan_cost(self.device_costs(state), self.net.overall(state[..., nP : self._rw]), self.model.score)
        cost = base + self.collective(state)
        return cost * self.cut_factor(self.cuts(state)) if self.cut_penalty else cost

    def cuts(self, rows: np.ndarray) -> np.ndarray:
        """[..., n, R] device states or piece rows → [...] the tables their pieces cut into columns."""
        return rows[..., self._cut].sum(-1)

    def cut_factor(self, cuts) -> np.ndarray:
        """What `cut_penalty` multiplies the price of a plan cutting `cuts` tables by (1 without it)."""
        return 1.0 + self.cut_penalty * np.minimum(cuts, CUT_PENALTY_CAP)

    def cut_shares(self, pieces: list[Shard]) -> np.ndarray:
        """[n] each piece's share of the tables cut (its width over its table's dim; 0 whole or a row piece)."""
        return self.rows([pieces])[0][:, self._cut]


def greedy_batch(scorer: PieceScorer, pieces: list[list[Shard]], caps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NeuroShard's inner greedy for C candidates × S dim caps at once (`caps` [S], or [C, S]:
    each candidate's own) → (best cost [C] units, inf where no cap placed every piece; devices
    [C, n] of the best placement; the cap [C] of that placement). Pieces go in
    order of predicted cost alone to the device of least predicted compute with memory for it and
    under the dim cap (cap × the candidate's all-to-all dim / D: row pieces are not in the
    all-to-all and do not count); a row piece goes to its block's device where its table is split
    over every device, else to a device holding no other piece of its table (`splits.row_groups`),
    and a table-row-wise block r to GPU r of its table's host (`splits.twrw_blocks`).
    Candidates may have different numbers of pieces: a shorter one's devices [c, len:] are padding
    (its list is padded with empty pieces placed after every real one, which change no cost), so
    that one batch — one loop of n steps — places them all."""
    task, net = scorer.task, scorer.net
    C, D = len(pieces), task.devices
    caps = np.broadcast_to(np.asarray(caps, float), (C, np.shape(caps)[-1]))
    S = caps.shape[1]
    slots = scorer.slots(pieces)  # [C, n]
    n, pad = slots.shape[1], slots < 0
    rows = scorer.table[slots]  # [C, n, R]
    rows[pad] = 0.0
    # the row pieces' constraints, of the candidates that have row pieces (a row piece's state row
    # has its columns in the TBE output, `_rc`; most candidates have none)
    pins, groups, blocks = np.full((C, n), -1, np.int64), np.full((C, n), -1, np.int64), np.full((C, n), -1, np.int64)
    for c in np.flatnonzero((rows[..., scorer._rc] > 0).any(1)).tolist():
        k = len(pieces[c])
        pins[c, :k], groups[c, :k] = splits.row_groups(task, pieces[c])
        blocks[c, :k] = splits.twrw_blocks(task, pieces[c])  # table-row-wise: block r on GPU r of one host
    order = np.argsort(np.where(pad, np.inf, -scorer.single[slots]), axis=1, kind="stable")  # [C, n], the padding last
    E = C * S  # episode e = candidate e // S at cap e % S
    cand = np.repeat(np.arange(C), S)
    dims = rows[..., scorer._a2a].astype(np.int64)  # the all-to-all widths (a row piece's 0: reduce-scatter instead)
    # never below the widest piece: with more devices than the dims fill (26 tables of dim 128 on
    # 64 GPUs: a cap of 78 columns) no device could take a whole table and every cap would fail
    dim_cap = np.maximum(caps.reshape(-1) * dims[cand].sum(1) / D, dims[cand].max(1))
    # What every episode places at each step, [n, E] (the S episodes of a candidate place the same
    # piece), worked out before the loop: each step is then a few operations on [E, D] arrays.
    piece = order[cand].T
    size, dim = np.where(pad, 0, scorer.bytes[slots])[cand, piece], dims[cand, piece]
    room, dim_room = task.max_memory_bytes - size, dim_cap - dim  # a device may take the piece up to these
    pin, group, block = pins[cand, piece], groups[cand, piece], blocks[cand, piece]
    # the steps that place a row piece of each kind: the others skip its check (a no-op there)
    pinned, grouped, hosted = (pin >= 0).any(1).tolist(), (group >= 0).any(1).tolist(), (block >= 0).any(1).tolist()
    G = splits.host_gpus(task) or D
    # The steps carry only what `compute` reads (`NumpyCostNet.compute_columns`: ~140 of ~430
    # columns with shared terms, whose presences are bits OR-ed per device): each step's gathers
    # and scatters move those; the full states, which `score` reads, are made once after the last
    # step from the placements.
    keep, bits = net.compute_columns(rows)
    step_rows = np.ascontiguousarray(rows[..., keep])  # C order: the steps' row gathers
    # Episode e's device d at e·D + d: a step's updates are 1-D gathers and scatters.
    state = np.repeat(scorer.empty((1,))[:, keep], E * D, axis=0)
    if bits is not None:
        piece_bits, fwd_words = bits[0].reshape(C * n, -1), bits[1]
        device_bits = np.zeros((E * D, piece_bits.shape[1]), np.uint64)
    comp = np.zeros(E * D)  # an empty device computes nothing (not the heads' bias)
    used, dim_sum = np.zeros((E, D), np.int64), np.zeros((E, D), np.int64)
    flat_used, flat_dim = used.reshape(-1), dim_sum.reshape(-1)
    held = np.zeros((E, max(1, int(group.max()) + 1), D), bool)  # devices holding a piece of each row group
    host_of = np.full((E, max(1, int(group.max()) + 1)), -1, np.int64)  # the host of each table-row-wise group, once its first block is placed
    chosen = np.zeros((n, E), np.int64)
    ok = np.zeros((n, E), bool)  # the device chosen was legal (else the episode failed)
    flat_rows, taken = step_rows.reshape(C * n, -1), cand * n + piece  # [n, E] the row each episode adds at each step
    es, ds, first = np.arange(E), np.arange(D), np.arange(E) * D
    for step in range(n):
        legal = ((used <= room[step, :, None]) & (dim_sum <= dim_room[step, :, None])).reshape(-1)
        if pinned[step]:
            p = pin[step, :, None]
            legal &= ((p < 0) | (ds == p)).reshape(-1)
        if grouped[step]:
            g = group[step]
            legal &= ~(held[es, np.maximum(g, 0)] & (g[:, None] >= 0)).reshape(-1)
        if hosted[step]:  # block r goes to GPU r of its group's host (any host for its first block)
            r, h = block[step][:, None], host_of[es, np.maximum(group[step], 0)][:, None]
            legal &= ((r < 0) | ((ds % G == r) & ((h < 0) | (ds // G == h)))).reshape(-1)
        a = np.where(legal, comp, np.inf).reshape(E, D).argmin(1)
        at = first + a
        ok[step] = legal[at]
        placed = state.take(at, 0) + flat_rows.take(taken[step], 0)
        state[at] = placed
        flat_used[at] += size[step]
        flat_dim[at] += dim[step]
        if grouped[step]:
            held[es, np.maximum(g, 0), a] |= g >= 0
        if hosted[step]:
            m = block[step] >= 0
            host_of[es[m], group[step][m]] = a[m] // G
        if bits is None:
            comp[at] = net.compute(placed)
        else:
            placed_bits = device_bits.take(at, 0) | piece_bits.take(taken[step], 0)
            device_bits[at] = placed_bits
            comp[at] = net.compute(placed, (placed_bits, fwd_words))
        chosen[step] = a
    devices = np.empty((E, n), np.int64)
    devices[es, piece] = chosen
    state = scorer.placed_states(rows[:, None], devices.reshape(C, S, n)).reshape(E, D, -1)  # every episode's full states at once
    cost = np.where(ok.all(0), scorer.score(state), np.inf).reshape(C, S)
    best, cs = cost.argmin(1), np.arange(C)
    return cost[cs, best], devices.reshape(C, S, n)[cs, best], caps[cs, best]


def greedy_groups(scorer: PieceScorer, candidates: list[list[Shard]], caps: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """`greedy_batch` of candidates of different piece counts, each one's devices without the padding."""
    costs, devs, chosen = greedy_batch(scorer, candidates, caps)
    return costs, [d[: len(c)] for c, d in zip(candidates, devs)], chosen


ROW_CANDIDATES = 2  # whole tables a beam step may split by rows, per plan in the beam (each tried at every k)


def split_moves(scorer: PieceScorer, pieces: list[Shard], top: int) -> list[tuple[int, list[Shard]]]:
    """(piece, what replaces it) of one beam step: the halvings of the pieces worth halving — the
    union of the `top` largest and the `top` costliest —, then the row splits of the
    ROW_CANDIDATES costliest whole tables among them that may pay (`PieceScorer.row_candidates`)."""
    task = scorer.task
    slots = scorer.slots([pieces])[0]  # first: it may grow `single`
    single = scorer.single[slots]
    sizes = np.array(splits.sizes(task, pieces))
    k = min(top, len(pieces))
    chosen = sorted(int(i) for i in set(np.argsort(-sizes, kind="stable")[:k]) | set(np.argsort(-single, kind="stable")[:k]))
    moves = [(i, splits.cut(pieces[i], 2)) for i in chosen if splits.can_halve(pieces[i])]
    for i in scorer.row_candidates(pieces, chosen, ROW_CANDIDATES):
        moves += [(i, rows) for parts in splits.task_row_parts(task) if (rows := splits.row_split(task, pieces[i].table, parts))]
    return moves


def caps_near(caps: np.ndarray, cap: float, k: int) -> np.ndarray:
    """The `k` consecutive caps of `caps` (ascending) centred on the one nearest `cap`."""
    at = int(np.abs(caps - cap).argmin())
    lo = min(max(0, at - k // 2), len(caps) - k)
    return caps[lo : lo + k]


def beam_search(scorer: PieceScorer, starts: list[list[Shard]], caps: np.ndarray, width: int, depth: int, top: int,
                best: tuple[float, list[Shard], np.ndarray] | None = None, progress=None, extend: int = 0,
                child_caps: int | None = None) -> tuple[float, list[Shard], np.ndarray]:
    """NeuroShard's outer search from the plans `starts` (the first beam): each step replaces one
    piece of a beam plan by a `split_moves` move, places every new candidate by the greedy under
    the dim caps `caps` (`greedy_groups`) and keeps the `width` cheapest — and the cheapest with
    more row pieces than the beams have, lest the first halving of a hot table rule its row split
    out. `depth` steps: a step that finds nothing cheaper may lead to one that does (a hot table
    halved several times). Past `depth`, up to `extend` more steps while each step lowers the
    cheapest plan: a task where many splits pay gets them, one where they stop paying stops.
    `child_caps`: a candidate of a plan the greedy placed is placed under only that many caps
    around its plan's best (`caps_near`; a split moves the best cap little), None: under all.
    → (cost, pieces, devices) of the cheapest plan seen, `best` (a plan already priced) included."""
    beams, beam_caps, gained = list(starts), [None] * len(starts), True
    for step in range(depth + extend):
        if step >= depth and not gained:
            break
        if progress is not None:
            progress(step, depth)
        seen, candidates, parents = set(), [], []
        for b, pieces in enumerate(beams):
            for i, new in split_moves(scorer, pieces, top):
                new = pieces[:i] + pieces[i + 1 :] + new
                key = frozenset(new)
                if key not in seen:
                    seen.add(key)
                    candidates.append(new)
                    parents.append(b)
        if not candidates:
            break
        near = child_caps is not None and child_caps < len(caps) and None not in beam_caps
        costs, devs, found = greedy_groups(scorer, candidates, np.stack([caps_near(caps, beam_caps[b], child_caps) for b in parents]) if near else caps)
        ranked = np.argsort(costs, kind="stable")
        gained = best is None or costs[ranked[0]] < best[0]
        if gained:
            best = (float(costs[ranked[0]]), candidates[ranked[0]], devs[ranked[0]])
        keep = list(ranked[:width])
        rows = max(sum(p.is_row_shard for p in b) for b in beams)
        more = next((k for k in ranked if sum(p.is_row_shard for p in candidates[k]) > rows), None)
        if more is not None and more not in keep:
            keep.append(more)
        keep = [k for k in keep if np.isfinite(costs[k])]
        beams, beam_caps = [candidates[k] for k in keep], [found[k] for k in keep]
        if not beams:
            break
    return best
