"""The cost nouns every backend returns, and the backend role.

One training step's embedding work on device d (docs/design.md §1): forward compute, forward
all-to-all, backward all-to-all, backward compute. The paper's proxy cost of a placement is
max_d of their sum; measured backends also report the synchronized end-to-end step.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from dreamshard.files import atomic_write
from dreamshard.tables import TableSpec
from dreamshard.tasks import Workload
from dreamshard.topology import several_hosts

COMPONENTS = ("fwd_comp_ms", "fwd_comm_ms", "bwd_comm_ms", "bwd_comp_ms")


@dataclass
class DeviceCost:
    fwd_comp_ms: float
    fwd_comm_ms: float
    bwd_comm_ms: float
    bwd_comp_ms: float

    @property
    def total_ms(self) -> float:
        return self.fwd_comp_ms + self.fwd_comm_ms + self.bwd_comm_ms + self.bwd_comp_ms


@dataclass
class CostReport:
    """Cost of one placement, and everything needed to know where the numbers came from."""

    devices: list[DeviceCost]
    backend: str  # e.g. "sim (H200 calibration)", "triton", "fbgemm", "torch"
    runner: str  # "distributed", "sequential", "sim"
    hardware: str  # e.g. "NVIDIA H200", "CPU: 2 cores (x86_64)"
    batch_size: int
    precision: str = "fp16"
    optimizer: str = "sgd"
    e2e_ms: float | None = None  # synchronized end-to-end step, where measured
    comm_modelled: bool = False  # comm came from a fitted model, not a real all-to-all
    details: dict = field(default_factory=dict)  # backend-specific extras (iterations, spreads...)

    @property
    def overall_ms(self) -> float:
        """The paper's cost: max over devices of the four components' sum."""
        return max(d.total_ms for d in self.devices)

    @property
    def source(self) -> str:
        """One phrase saying which backend produced the numbers, for every printed cost."""
        if self.runner == "sim":
            return self.backend
        comm = ", comm modelled" if self.comm_modelled else ""
        return f"measured: {self.backend} kernel, {self.runner} runner on {self.hardware}{comm}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["overall_ms"] = self.overall_ms
        d["source"] = self.source
        d["devices"] = [{**asdict(x), "total_ms": x.total_ms} for x in self.devices]
        return d

    @staticmethod
    def from_json(d: dict) -> "CostReport":
        devices = [DeviceCost(**{k: x[k] for k in COMPONENTS}) for x in d["devices"]]
        keep = {k: d[k] for k in ("backend", "runner", "hardware", "batch_size", "precision", "optimizer", "e2e_ms", "comm_modelled", "details") if k in d}
        return CostReport(devices=devices, **keep)

    def save(self, path: str | Path) -> None:
        """Atomic write: a failure never leaves a half-written report."""
        atomic_write(path, json.dumps(self.to_json(), indent=1))


class CostBackend(ABC):
    """Gives the cost of placements. Planners never import one; the training loop is handed one."""

    name: str = "?"
    # prices a plan in about a millisecond without running anything (the simulator): a training
    # run's estimate of its time includes its measurements only then
    instant: bool = False

    @abstractmethod
    def evaluate(self, shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload()) -> CostReport:
        """Cost of one placement given as what each device holds (list index = device; a column
        shard is a table of its own width, `Plan.device_tables()`)."""

    def comm_params(self) -> dict | None:
        """The parameters of the all-to-all model this backend prices a plan's all-to-all with
        (costs/comm.py, `alltoall_ms`), or None where it runs real all-to-alls. A cost net that
        adds the comm model's all-to-all (DreamShard's Config.comm "model") takes them from the
        backend it is trained against, so that it adds what its targets had."""
        return None

    def cache_bytes(self) -> float:
        """The device cache a table's repeated row gathers compete for, as this backend's costs
        have it (costs/terms.py `cache_hits`): a cost net trained against the backend counts its
        kernel features with the same cache. 0: not modelled (every repeat may hit)."""
        return 0.0

    def evaluate_many(self, placements: Sequence[Sequence[Sequence[TableSpec]]], workload: Workload = Workload()) -> list[CostReport]:
        return [self.evaluate(s, workload) for s in placements]

    # prices shards outside HBM (tiers.py) in `evaluate_plan`: the simulator and the sequential runner
    prices_tiers: bool = False
    # takes `evaluate(..., topology=)`: prices a plan of several hosts in two levels (costs/hierarchy.py)
    supports_topology: bool = False

    def evaluate_plan(self, plan, batch_size: int | None = None, precision: str | None = None) -> CostReport:
        """Cost of a plan under its own workload (or at another batch size or precision), on its
        task's topology (`evaluate_on`). A plan with shards outside HBM needs a backend that prices
        their tiers (`prices_tiers`)."""
        if plan.has_tiers() and not self.prices_tiers:
            from dreamshard.validation import OptionError

            raise OptionError(f"the plan has shards in host memory (tiers), which the {self.name} backend does not measure; "
                              "use the simulator or the sequential runner")
        return evaluate_on(self, plan.device_tables(), plan.workload.with_overrides(batch_size, precision), plan.task.topology)


def evaluate_on(backend: CostBackend, shards: Sequence[Sequence[TableSpec]], workload: Workload, topology=None) -> CostReport:
    """`backend.evaluate` of a placement on `topology`: a backend that prices topologies
    (`supports_topology`) is given one of several hosts; one that does not (a runner whose
    collectives are real) measures what it runs on, and its report says the plan's topology was
    not what it measured (details "topology_note")."""
    if several_hosts(topology) is None:
        return backend.evaluate(shards, workload)
    if backend.supports_topology:
        return backend.evaluate(shards, workload, topology=topology)
    if getattr(backend, "measures_topology", False):  # its processes run on the hosts themselves (torchrun)
        return backend.evaluate(shards, workload)
    report = backend.evaluate(shards, workload)
    report.details["topology_note"] = f"the plan is for {topology.describe()}; this backend measured its own processes, not that machine's network"
    return report
