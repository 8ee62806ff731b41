"""The cost net as the planners that search see it: pieces (column shards) as rows of per-device
state, plan costs read off the state, and the `predicted` entry of a plan."""

from __future__ import annotations

import numpy as np

from dreamshard.learned.mdp import NumpyCostNet
from dreamshard.learned.nets import COST_COMPONENTS, DreamShardModel, plan_cost, table_features
from dreamshard.plan import Shard
from dreamshard.planners import splits
from dreamshard.tasks import Task


def predicted_dict(device_costs: np.ndarray, overall: float, model_label: str) -> dict:
    devices = [{**{c: float(v) for c, v in zip(COST_COMPONENTS, row)}, "total_ms": float(row.sum())} for row in device_costs]
    # overall_ms: the overall head; max_device_ms: max over devices of the per-device totals
    return {"source": f"dreamshard cost net ({model_label})", "overall_ms": float(overall), "max_device_ms": max(d["total_ms"] for d in devices), "devices": devices}


class PieceScorer:
    """The cost net's view of pieces: each piece's state row, cached per piece."""

    def __init__(self, model: DreamShardModel, task: Task):
        self.model, self.task = model, task
        self.net = NumpyCostNet(model.cost_net)
        self._rows: dict[Shard, int] = {}
        self._data: list[np.ndarray] = []

    def rows(self, pieces: list[list[Shard]]) -> np.ndarray:
        """[C, n, R] state rows of C candidate piece lists of n pieces each."""
        new = list({p for ps in pieces for p in ps if p not in self._rows})
        if new:
            x = table_features(splits.specs(self.task, new), self.model.normalization, self.model.linear_features, self.task.workload.precision)
            for p, r in zip(new, self.net.rows(x.astype(np.float32))):
                self._rows[p] = len(self._data)
                self._data.append(r)
        table = np.stack(self._data)
        return table[np.array([[self._rows[p] for p in ps] for ps in pieces])]

    def alone(self, rows: np.ndarray) -> np.ndarray:
        """[..., R] piece rows → [...] each piece's predicted compute (fwd + bwd) on a device of
        its own, units: what the search planners rank pieces by."""
        return self.net.costs(rows[..., : self.net.nP] + self.net.b1)[..., :2].sum(-1)

    def state(self, pieces: list[Shard], devices: np.ndarray) -> np.ndarray:
        """[D, R] the device states of one placement of `pieces`."""
        state = self.net.empty((self.task.devices,))
        np.add.at(state, np.asarray(devices), self.rows([pieces])[0])
        return state

    def predicted(self, pieces: list[Shard], devices: np.ndarray, label: str) -> dict:
        """The plan's `predicted` entry: per-device costs and the overall cost, ms."""
        state = self.state(pieces, devices)
        costs = self.net.costs(state[:, : self.net.nP]) * self.net.scale
        return predicted_dict(costs, float(self.net.overall(state[:, self.net.nP :])) * self.net.scale, label)

    def score(self, state: np.ndarray) -> np.ndarray:
        """[..., D, R] device states → [...] the model's plan cost, units."""
        nP = self.net.nP
        return plan_cost(self.net.costs(state[..., :nP]), self.net.overall(state[..., nP:]), self.model.score)
