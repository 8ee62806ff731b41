"""The sequential runner: one device measures every shard's compute in turn; comm is modelled.

Compute is exact this way: a device's forward and backward compute depend only on the tables
placed on it. Each shard gets the distributed runner's protocol — its TBE built
and checked, ``input_sets`` distinct batches used in turn, ``warmup`` untimed steps, then
``iters`` timed forward and backward passes (CUDA events on GPU, timing the GPU's work and not the
host's launch overhead; ``perf_counter`` on CPU), medians.
A process's first shard on a GPU is measured once, untimed, before the measurement that counts (``_WARMED``).
The collectives are not run: their times come from a ``CommModel`` fitted to real ones
(``dreamshard calibrate comm``; by default the one shipped for this GPU and the plan's device
count), and the report says so (``comm_modelled=True``, the model file in ``details``):
`modelled_comm` — the all-to-all, and for row shards (their own stream, measured like any shard)
the reduce-scatter, all-gather and the copies around them. Each device's tables are measured in
the distributed runner's order (`rowshard.exchange_order`).

On CPU each shard runs with the threads one distributed-runner process would get (cores / D), so
the two runners measure the same compute.
"""

from __future__ import annotations

import time
from statistics import median
from typing import Sequence

from dreamshard.costs.base import CostBackend, CostReport, DeviceCost
from dreamshard.costs.comm import CommModel, describe_choice, load_comm_model, local_gpu, relayout_ms
from dreamshard.rowshard import exchange_dims, exchange_order, row_dims
from dreamshard.tables import TableSpec
from dreamshard.tasks import Workload
from dreamshard.topology import Topology, several_hosts
from dreamshard.validation import OptionError

# devices whose first measurement in this process is done: the first shard a process times on a GPU
# ran ~1.5x slow after its own warm-up steps (H200: a plan measured 2.125 ms, then 1.543 and 1.542
# ms; benchmarks/gpu_product_fixed_cost.py), so it is timed once more, untimed, before anything counts
_WARMED: set[str] = set()


class SequentialRunner(CostBackend):
    """Real compute on one device, modelled all-to-all. See the module docstring."""

    def __init__(self, kernel: str, comm_model: CommModel | str | None = None, device: str = "cpu", warmup: int = 3, iters: int = 10,
                 input_sets: int = 3, seed: int = 0) -> None:
        import torch

        if iters < 1 or warmup < 0:
            raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters} warmup={warmup}")
        if input_sets < 2:
            raise ValueError(f"need at least 2 input sets to rotate, got {input_sets}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", 0)
        self.kernel = kernel
        # a model is needed only for D >= 2, but a bad file should fail before any measuring
        self._comm = load_comm_model(comm_model, self.device.type) if comm_model is not None else None
        self.warmup, self.iters, self.input_sets, self.seed = warmup, iters, input_sets, seed
        self.name = f"{kernel}/sequential"
        self._tiers: dict[int, object] | None = None  # id(shard spec) → its tier, while a plan with tiers is measured
        self._cache_stats: list[dict] = []

    prices_tiers = True

    def evaluate_plan(self, plan, batch_size: int | None = None, precision: str | None = None) -> CostReport:
        """Measure a plan; its host-tier shards run in their tiers (kernels/tiered.py: weights in
        host memory mapped into the GPU, or behind an HBM row cache), each cached table's measured
        hit rate in the report's details."""
        if not plan.has_tiers():
            return super().evaluate_plan(plan, batch_size, precision)
        specs = plan.shard_specs()
        shards: list[list[TableSpec]] = [[] for _ in range(plan.devices)]
        self._tiers, self._cache_stats = {}, []
        for s, spec in zip(plan.shards, specs):
            shards[s.device].append(spec)
            self._tiers[id(spec)] = s.tier_spec
        try:
            report = self.evaluate(shards, plan.workload.with_overrides(batch_size, precision), topology=plan.task.topology)
        finally:
            self._tiers = None
        report.details["tiers"] = {"cached_tables": self._cache_stats,
                                   "note": "hit rates over the timed steps, after the warm-up steps; the tables start in host memory, the caches empty"}
        return report

    def comm_model(self, devices: int = 2) -> CommModel:
        """The model given, or the one shipped for `devices` devices of this runner's kind
        (`comm.default_model_path`: this GPU, the nearest device count fitted)."""
        return self._comm if self._comm is not None else load_comm_model(None, self.device.type, devices)

    def comm_params(self) -> dict:
        return self.comm_model().params()

    def cache_bytes(self) -> float:
        from dreamshard.costs.hardware import cache_bytes

        return cache_bytes(self.device)

    def _measure_shard(self, tables: Sequence[TableSpec], batch_size: int, precision: str, optimizer: str) -> tuple[list[float], list[float]]:
        import torch

        from dreamshard.costs.runners.distributed import build_checked_tbe

        tiers = [self._tiers.get(id(t)) for t in tables] if self._tiers else None
        if tiers is not None:
            from dreamshard.tiers import HBM

            tiers = [HBM if t is None else t for t in tiers]
        tbe = build_checked_tbe(self.kernel, tables, precision, optimizer, self.device, self.seed, tiers, batch_size)
        # a row cache fed the same few batches in turn would soon hold them all: a shard with a cache
        # gets a distinct batch every step, so that its hits are those of a stream
        sets = max(self.input_sets, self.warmup + self.iters) if hasattr(tbe, "caches") and tbe.caches else self.input_sets
        times = time_steps(tbe, tables, batch_size, self.device, sets, self.warmup, self.iters)
        if hasattr(tbe, "cache_stats"):
            self._cache_stats += [{"table": tables[t].name, **stats} for t, stats in tbe.cache_stats().items()]
        del tbe
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            from dreamshard.costs.kernels.host_memory import release_cached_host_memory

            release_cached_host_memory()  # a shard's host tiers
        return times

    supports_topology = True

    def evaluate(self, shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload(), topology: Topology | None = None) -> CostReport:
        """Each shard's compute measured here; the collectives from the comm model — on a topology
        of several hosts, that of one host's GPU count inside each host and the topology's links
        between hosts (`modelled_comm`)."""
        import torch

        from dreamshard.costs.hardware import cpu_cores, describe_hardware, software_versions

        D = len(shards)
        if D < 1:
            raise ValueError("a placement needs at least one device")
        workload.validate("workload", OptionError)
        batch_size, precision, optimizer = workload.batch_size, workload.precision, workload.optimizer
        multi = several_hosts(topology) is not None
        if multi and topology.devices != D:
            raise OptionError(f"a topology of {topology.devices} devices for a placement on {D}")
        if D > 1:
            model = self.comm_model(topology.gpus_per_host if multi else D)  # no model for this device kind: fail before measuring
        start = time.monotonic()
        threads_before = torch.get_num_threads()
        threads = max(1, cpu_cores() // D) if self.device.type == "cpu" else None
        comp: list[tuple[float, float]] = []
        try:
            if threads:
                torch.set_num_threads(threads)
            first = next((shard for shard in shards if shard), None)
            if self.device.type == "cuda" and first and str(self.device) not in _WARMED:
                self._measure_shard(first, batch_size, precision, optimizer)
                _WARMED.add(str(self.device))
            for shard in exchange_order(shards):  # the distributed runner's TBE, table for table
                if not shard:
                    comp.append((0.0, 0.0))
                    continue
                fwd, bwd = self._measure_shard(shard, batch_size, precision, optimizer)
                comp.append((median(fwd), median(bwd)))
        finally:
            torch.set_num_threads(threads_before)
        if D > 1:
            fwd_comm, bwd_comm, comm_info = modelled_comm(model, shards, workload, topology)
        else:
            fwd_comm = bwd_comm = [0.0]
            comm_info = {"comm_model": "none: one device, no all-to-all"}
        dim_sums = exchange_dims(shards)[0]
        devices = [DeviceCost(f, fc, bc, b) for (f, b), fc, bc in zip(comp, fwd_comm, bwd_comm)]
        details = {"iters": self.iters, "warmup": self.warmup, "input_sets": self.input_sets,
                   "timing": "CUDA events; each op enqueued behind a sleep kernel, so host launch time is excluded unless the op syncs" if self.device.type == "cuda" else "perf_counter", "device": str(self.device),
                   "threads": threads, "wall_s": round(time.monotonic() - start, 2), "dim_sums": dim_sums,
                   "tables_per_device": [len(s) for s in shards], "statistic": "median over timed iterations",
                   **comm_info, "versions": software_versions()}
        return CostReport(devices=devices, backend=self.kernel, runner="sequential", hardware=describe_hardware(self.device.type, 1),
                          batch_size=batch_size, precision=precision, optimizer=optimizer, e2e_ms=None, comm_modelled=True, details=details)


def modelled_comm(model: CommModel, shards: Sequence[Sequence[TableSpec]], workload: Workload, topology: Topology | None = None) -> tuple[list[float], list[float], dict]:
    """(forward comm ms[D], backward comm ms[D], what priced them) of a placement from a comm model:
    the all-to-all of the whole tables and column shards (`CommModel.placement_ms`), then the
    reduce-scatter / all-gather of the row-wise tables (`CommModel.rowwise_ms`) on every device
    and the copies of each device with row shards (`comm.relayout_ms`). The sequential runner's
    comm, and what a campaign re-prices measured compute with. On a `topology` of several hosts,
    the same collectives in two levels (costs/hierarchy.py), `model` being that of one host's GPUs."""
    D = len(shards)
    if several_hosts(topology) is not None:
        return _topology_comm(model, shards, workload, topology)
    dim_sums, rw_dim = exchange_dims(shards)
    B, elt = workload.batch_size, workload.elt_bytes
    fwd, bwd = model.placement_ms(dim_sums, B, elt)
    info = {"comm_model": model.path or "(in memory)", "comm_model_fit": model.describe()}
    note = describe_choice(model.path, D, local_gpu() if model.process_group == "nccl" else None) if model.path else ""
    if note:
        info["comm_model_note"] = note
    if rw_dim:
        rs, ag = model.rowwise_ms(rw_dim, B, elt, D)
        copy_f, copy_b = relayout_ms(model.params(), dim_sums, row_dims(shards), B, elt)
        fwd, bwd = [t + rs + c for t, c in zip(fwd, copy_f)], [t + ag + c for t, c in zip(bwd, copy_b)]
        info |= {"rowwise_dim": rw_dim, "rowwise_comm_ms": [rs, ag],
                 "rowwise_comm_model": {k: getattr(model, k) or "not fitted" for k in ("reduce_scatter", "all_gather", "relayout")}}
    return fwd, bwd, info


def _topology_comm(model: CommModel, shards: Sequence[Sequence[TableSpec]], workload: Workload, topology: Topology) -> tuple[list[float], list[float], dict]:
    """`modelled_comm` on several hosts: `hierarchy.topology_comm_ms` of the one placement."""
    import numpy as np

    from dreamshard.costs.hierarchy import topology_comm_ms

    tables = [t for s in shards for t in s]
    placement = np.repeat(np.arange(len(shards)), [len(s) for s in shards])[None, :]
    dim_sums, _ = exchange_dims(shards)
    fwd, bwd = topology_comm_ms(model.params(), tables, placement, np.array([dim_sums], dtype=np.float64), np.array([row_dims(shards)], dtype=np.float64),
                                workload, topology)
    info = {"comm_model": model.path or "(in memory)", "comm_model_fit": model.describe(), "topology": topology.to_json(),
            "comm_model_note": f"inside each host of {topology.gpus_per_host} GPUs; between hosts {topology.inter_host_GBps:g} GB/s per GPU and {topology.inter_host_latency_us:g} µs (costs/hierarchy.py)"}
    return fwd[0].tolist(), bwd[0].tolist(), info


def time_steps(tbe, tables: Sequence[TableSpec], batch_size: int, device, input_sets: int, warmup: int, iters: int) -> tuple[list[float], list[float]]:
    """The runner's protocol on a built TBE of `tables`: `input_sets` distinct batches in turn, `warmup`
    untimed steps, then the forward and backward times (ms) of `iters` steps."""
    import torch

    from dreamshard.costs.runners.distributed import _Clock
    from dreamshard.streams import shard_batch

    clock = _Clock(device)
    inputs = [shard_batch(tables, batch_size, step=i, device=device) for i in range(input_sets)]
    if hasattr(tbe, "caches"):  # a tiered TBE is given each table's lookup range, as a TorchRec input carries it (no host sync in its forward)
        inputs = [(ix, off, off[::batch_size].tolist()) for ix, off in inputs]
    g = torch.Generator(device=device)
    g.manual_seed(1234)
    grad = (torch.rand(batch_size, tbe.total_dim, generator=g, device=device) * 2e-3 - 1e-3).to(tbe.dtype)
    fwd, bwd = [], []
    for i in range(warmup + iters):
        clock.sync()
        a = clock.start()
        tbe.forward(*inputs[i % len(inputs)])
        b = clock.mark()
        clock.sync()
        c = clock.start()
        tbe.backward(grad)
        d = clock.mark()
        clock.sync()
        if i >= warmup:
            fwd.append(clock.ms(a, b))
            bwd.append(clock.ms(c, d))
        if i + 1 == warmup and hasattr(tbe, "reset_cache_stats"):  # a tiered TBE's hit rates count the timed steps only
            tbe.reset_cache_stats()
    return fwd, bwd


def measure_sequential(plan, kernel: str, batch_size: int | None = None, comm_model: CommModel | str | None = None, device: str | None = None,
                       warmup: int = 3, iters: int = 10, precision: str | None = None, input_sets: int = 3) -> CostReport:
    """Measure ``plan``'s compute shard by shard on ``device``; comm from ``comm_model``
    (a CommModel, a file, or None for the model shipped for this kind of device). ``device`` None:
    the kernel decides (``runners.default_device``)."""
    if device is None:
        from dreamshard.costs.runners import default_device

        device = default_device(kernel)
    runner = SequentialRunner(kernel, comm_model, device, warmup, iters, input_sets)
    return runner.evaluate_plan(plan, batch_size, precision)
