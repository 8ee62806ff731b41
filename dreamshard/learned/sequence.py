"""What the placers that place tables one at a time (AutoShard, the RNN placer) share: a task as
they see it, a batch of episodes with each task's tables in its placing order, and the placement
back in the task's table order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dreamshard.tables import features
from dreamshard.tasks import Task


@dataclass
class Prepared:
    """A task as the nets see it: features [T, F] (fixed log scale, so no training statistics are
    needed for unseen tables), and each table's exact bytes beside the memory cap (legality is
    decided in integer bytes: a fraction of the cap in floating point overfills a device by a
    few bytes on large tasks)."""

    x: np.ndarray
    nbytes: np.ndarray  # [T] int64
    cap: int
    devices: int

    @property
    def size(self) -> np.ndarray:
        """Each table's bytes as a fraction of the cap (what the nets see)."""
        return self.nbytes / self.cap


def prepare(task: Task) -> Prepared:
    return Prepared(features(task.tables, "fixed", task.workload.precision), np.array(task.sizes(), np.int64), task.max_memory_bytes, task.devices)


@dataclass
class Episodes:
    x: torch.Tensor  # [E, T, F] in placing order, zero-padded
    size: torch.Tensor  # [E, T] fraction of the cap
    nbytes: torch.Tensor  # [E, T] int64 bytes
    cap: torch.Tensor  # [E] int64 bytes
    lengths: torch.Tensor  # [E]
    devices: torch.Tensor  # [E]
    order: np.ndarray  # [E, T] the task's table index of each step, -1 for padding

    @property
    def valid(self) -> torch.Tensor:
        """[E, T]: the steps that place a table."""
        return torch.arange(self.x.shape[1])[None, :] < self.lengths[:, None]

    @property
    def device_ok(self) -> torch.Tensor:
        """[E, D]: the task's own devices among the batch's widest."""
        return torch.arange(int(self.devices.max()))[None, :] < self.devices[:, None]


def episodes(prepared: Sequence[Prepared], orders: Sequence[np.ndarray]) -> Episodes:
    """A batch of tasks, each with its tables in `orders[e]` (a permutation of its tables)."""
    E, T = len(prepared), max(len(p.x) for p in prepared)
    x = np.zeros((E, T, prepared[0].x.shape[1]), np.float32)
    nbytes = np.zeros((E, T), np.int64)
    order = np.full((E, T), -1, np.int64)
    for e, (p, o) in enumerate(zip(prepared, orders)):
        order[e, : len(o)], x[e, : len(o)], nbytes[e, : len(o)] = o, p.x[o], p.nbytes[o]
    cap = torch.tensor([p.cap for p in prepared], dtype=torch.int64)
    nbytes_t = torch.from_numpy(nbytes)
    size = (nbytes_t.double() / cap[:, None].double()).float()
    return Episodes(torch.from_numpy(x), size, nbytes_t, cap, torch.tensor([len(p.x) for p in prepared]), torch.tensor([p.devices for p in prepared]), order)


def with_room(ok: torch.Tensor, used: torch.Tensor, nbytes: torch.Tensor, cap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The legal devices for a table of `nbytes` given the devices' `used` bytes and the `cap`
    (int64; `used` [..., D], `nbytes` and `cap` [...]): those with room, or — where none has room, the task
    is stuck — all of the task's devices (the episode goes on; its placement is discarded).
    → (legal, stuck)."""
    fits = ok & (used + nbytes.unsqueeze(-1) <= cap.unsqueeze(-1))
    any_fits = fits.any(-1, keepdim=True)
    return torch.where(any_fits, fits, ok), ~any_fits.squeeze(-1)


def placements(ep: Episodes, actions: torch.Tensor) -> list[np.ndarray]:
    """Each episode's device per table, in the task's table order."""
    out = []
    for e in range(len(ep.order)):
        n = int(ep.lengths[e])
        p = np.empty(n, np.int64)
        p[ep.order[e, :n]] = actions[e, :n].numpy()
        out.append(p)
    return out


def fullest(p: Prepared, placement: np.ndarray) -> int:
    """The bytes on the fullest device (more than `p.cap`: the placement does not fit)."""
    used = np.zeros(p.devices, np.int64)
    np.add.at(used, placement, p.nbytes)
    return int(used.max())
