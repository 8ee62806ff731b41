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
    `collective_ms` of it — reduce-scatter plus all-gather — is added to every device's comm.

Under the `max_device` score (max over devices of fwd + bwd + comm, the shipped model's) that is
exact to the simulator's rule. A model scored by its `overall` head cannot have the all-to-all
part of a row piece taken out of the overall head, so `row_moves` is False for it: the searches
offer no row splits, and a table larger than a device (which only a row split places) is priced
with the collective added to the overall head.

The comm model's parameters default to the shipped H200 NCCL fit (the shipped cost net's
hardware): `comm_params`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dreamshard.costs.comm import CommModel, load_comm_model, rowwise_ms
from dreamshard.learned.mdp import NumpyCostNet
from dreamshard.learned.nets import COST_COMPONENTS, DreamShardModel, plan_cost, table_features
from dreamshard.plan import Shard
from dreamshard.planners import splits
from dreamshard.tasks import Task

COMM = COST_COMPONENTS.index("comm_ms")


def comm_params(comm_model: str | Path | CommModel | None) -> dict:
    """The collectives' parameters the scorer prices row splits with: a comm model file (or
    model), or None for the shipped NCCL model of the GPU the shipped cost net was trained for."""
    return load_comm_model(comm_model, "cuda").params()


def predicted_dict(device_costs: np.ndarray, overall: float, model_label: str) -> dict:
    devices = [{**{c: float(v) for c, v in zip(COST_COMPONENTS, row)}, "total_ms": float(row.sum())} for row in device_costs]
    # overall_ms: the overall head; max_device_ms: max over devices of the per-device totals
    return {"source": f"dreamshard cost net ({model_label})", "overall_ms": float(overall), "max_device_ms": max(d["total_ms"] for d in devices), "devices": devices}


class PieceScorer:
    """The cost net's view of pieces: each piece's state row, cached per piece; the row-wise
    exchange from `comm` (a comm model's parameters, `comm_params`)."""

    def __init__(self, model: DreamShardModel, task: Task, comm: dict | None = None):
        self.model, self.task = model, task
        self.net = NumpyCostNet(model.cost_net)
        self.comm = comm if comm is not None else comm_params(None)
        self.row_moves = model.score == "max_device" and task.devices > 1
        nP = self.net.nP
        self._heads = nP // len(COST_COMPONENTS)
        self._rw = nP + self.net.Wo1.shape[0]  # the column of a piece's share of the row-wise dim
        self._rows: dict[Shard, int] = {}
        self._data: list[np.ndarray] = []

    def rows(self, pieces: list[list[Shard]]) -> np.ndarray:
        """[C, n, R] state rows of C candidate piece lists of n pieces each."""
        new = list({p for ps in pieces for p in ps if p not in self._rows})
        if new:
            x = table_features(splits.specs(self.task, new), self.model.normalization, self.model.linear_features, self.task.workload.precision)
            rows = self.net.rows(x.astype(np.float32))
            rows = np.concatenate([rows, np.zeros((len(new), 1), rows.dtype)], axis=1)
            for p, r in zip(new, rows):
                if p.is_row_shard:  # not in the all-to-all: its share of the reduce-scatter instead
                    t = self.task.tables[p.table]
                    a, b = p.row_range(t)
                    r[COMM * self._heads : (COMM + 1) * self._heads] = 0.0
                    r[self._rw] = t.dim * (b - a) / t.rows
                self._rows[p] = len(self._data)
                self._data.append(r)
        table = np.stack(self._data)
        return table[np.array([[self._rows[p] for p in ps] for ps in pieces])]

    def alone(self, rows: np.ndarray) -> np.ndarray:
        """[..., R] piece rows → [...] each piece's predicted compute (fwd + bwd) on a device of
        its own, units: what the search planners rank pieces by."""
        return self.net.costs(rows[..., : self.net.nP] + self.net.b1)[..., :2].sum(-1)

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """The state of empty devices, [*shape, R]."""
        state = self.net.empty(shape)
        return np.concatenate([state, np.zeros((*shape, 1), state.dtype)], axis=-1)

    def state(self, pieces: list[Shard], devices: np.ndarray) -> np.ndarray:
        """[D, R] the device states of one placement of `pieces`."""
        state = self.empty((self.task.devices,))
        np.add.at(state, np.asarray(devices), self.rows([pieces])[0])
        return state

    def collective(self, state: np.ndarray) -> np.ndarray:
        """[..., D, R] device states → [...] the row-wise exchange (reduce-scatter + all-gather)
        every device waits for, units (0 without row pieces)."""
        return self.collective_of(np.rint(state[..., self._rw].sum(-1)))

    def collective_of(self, rowwise_dim) -> np.ndarray:
        """The row-wise exchange of a buffer of `rowwise_dim` columns, units."""
        w = self.task.workload
        rs, ag = rowwise_ms(self.comm, rowwise_dim, w.batch_size, w.elt_bytes, self.task.devices)
        return (rs + ag) / self.net.scale

    def row_candidates(self, pieces: list[Shard], among: list[int], top: int) -> list[int]:
        """Of the pieces `among`, the `top` predicted costliest alone that a row split may pay
        for: whole tables (`splits.is_whole`) whose compute alone, above an empty device's,
        exceeds the exchange their rows would add (reduce-scatter + all-gather of their dim) — a
        split saves at most the first (each block still pays a device's fixed cost). This is
        decided before any row piece is measured. None where the score cannot price row pieces
        (`row_moves`)."""
        if not self.row_moves or not among:
            return []
        single = self.alone(self.rows([[pieces[i] for i in among]])[0]) - self.alone(np.zeros(self.net.nP))
        dims = np.array([self.task.tables[pieces[i].table].dim for i in among])
        keep = [(-c, i) for i, c, worth in zip(among, single, single > self.collective_of(dims)) if worth and splits.is_whole(self.task, pieces[i])]
        return [i for _, i in sorted(keep)[:top]]

    def bound_without(self, state: np.ndarray, device: int, piece: Shard) -> float:
        """A bound, before any row piece is measured, on what splitting `piece` (a whole table
        on `device`) by rows can reach: the plan's score with the table gone from its device and
        its dim in the row-wise exchange, its blocks nowhere (they only add to the devices that
        take them). A row split whose bound does not beat the plan is not worth measuring."""
        trial = state.copy()
        trial[device] -= self.rows([[piece]])[0, 0]
        trial[device, self._rw] += self.task.tables[piece.table].dim
        return float(self.score(trial))

    def predicted(self, pieces: list[Shard], devices: np.ndarray, label: str) -> dict:
        """The plan's `predicted` entry: per-device costs and the overall cost, ms."""
        state = self.state(pieces, devices)
        nP = self.net.nP
        costs = self.net.costs(state[:, :nP]) * self.net.scale
        extra = float(self.collective(state)) * self.net.scale
        costs[:, COMM] += extra
        out = predicted_dict(costs, (float(self.net.overall(state[:, nP : self._rw])) * self.net.scale) + extra, label)
        if extra:
            out["rowwise_comm_ms"] = extra
        return out

    def score(self, state: np.ndarray) -> np.ndarray:
        """[..., D, R] device states → [...] the model's plan cost, units."""
        nP = self.net.nP
        base = plan_cost(self.net.costs(state[..., :nP]), self.net.overall(state[..., nP : self._rw]), self.model.score)
        return base + self.collective(state)


def greedy_batch(scorer: PieceScorer, pieces: list[list[Shard]], caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NeuroShard's inner greedy for C candidates × S dim caps at once → (best cost [C] units,
    inf where no cap placed every piece; devices [C, n] of the best placement). Pieces go in
    order of predicted cost alone to the device of least predicted compute with memory for it and
    under the dim cap (cap × the candidate's all-to-all dim / D: row pieces are not in the
    all-to-all and do not count); a row piece goes to its block's device where its table is split
    over every device, else to a device holding no other piece of its table (`splits.row_groups`).
    Every candidate has the same number of pieces n."""
    task, net = scorer.task, scorer.net
    C, n, D, S = len(pieces), len(pieces[0]), task.devices, len(caps)
    rows = scorer.rows(pieces)  # [C, n, R]
    nP = net.nP
    single = scorer.alone(rows)  # [C, n]
    sizes = np.array([splits.sizes(task, ps) for ps in pieces], np.int64)
    dims = np.array([[0 if p.is_row_shard else p.width for p in ps] for ps in pieces], np.int64)
    constraints = [splits.row_groups(task, ps) for ps in pieces]
    pin = np.array([c[0] for c in constraints], np.int64)  # [C, n]
    group = np.array([c[1] for c in constraints], np.int64)
    order = np.argsort(-single, axis=1, kind="stable")  # [C, n]
    E = C * S  # episode e = candidate e // S at cap e % S
    cand = np.repeat(np.arange(C), S)
    dim_cap = np.tile(caps, C) * dims[cand].sum(1) / D
    state = scorer.empty((E, D))
    comp = np.zeros((E, D))  # an empty device computes nothing (not the heads' bias)
    used = np.zeros((E, D), np.int64)
    dim_sum = np.zeros((E, D), np.int64)
    held = np.zeros((E, max(1, int(group.max()) + 1), D), bool)  # devices holding a piece of each row group
    devices = np.full((E, n), -1, np.int64)
    failed = np.zeros(E, bool)
    es = np.arange(E)
    for step in range(n):
        i = order[cand, step]  # [E] piece placed now
        size, dim = sizes[cand, i], dims[cand, i]
        legal = (used + size[:, None] <= task.max_memory_bytes) & (dim_sum + dim[:, None] <= dim_cap[:, None])
        p, g = pin[cand, i], group[cand, i]
        legal &= (p[:, None] < 0) | (np.arange(D)[None, :] == p[:, None])
        legal &= ~(held[es, np.maximum(g, 0)] & (g[:, None] >= 0))
        failed |= ~legal.any(1)
        a = np.where(legal, comp, np.inf).argmin(1)
        state[es, a] += rows[cand, i]
        used[es, a] += size
        dim_sum[es, a] += dim
        held[es, np.maximum(g, 0), a] |= g >= 0
        comp[es, a] = net.costs(state[es, a, :nP])[:, :2].sum(-1)
        devices[es, i] = a
    cost = np.where(failed, np.inf, scorer.score(state)).reshape(C, S)
    best = cost.argmin(1)
    return cost[np.arange(C), best], devices.reshape(C, S, n)[np.arange(C), best]
