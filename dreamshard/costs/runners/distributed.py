"""The distributed runner: one process per device, real collectives (docs/comm.md).

``measure_distributed(plan, kernel, batch_size)`` starts one worker process per device, joined in a
``torch.distributed`` process group (gloo on CPU, NCCL on CUDA; ``launch.py`` starts, joins and
watches them), and runs ``measure_worker`` on every rank; ``DistributedRunner.evaluate_many``
measures many placements of one device count in one start of the processes.

One step, as TorchRec runs it:

  forward compute (the shard's fused TBE over the whole global batch B) → forward comm: **one**
  all-to-all of the pooled outputs of every whole table and column shard (rank d keeps B/D samples
  of every table), then **one** reduce-scatter of all row-wise tables together → backward comm:
  the reverse all-to-all of their gradients, then **one** all-gather of the row-wise tables'
  gradients → backward compute (the TBE backward, optimizer fused).

Row shards (plan.py) are in the same fused TBE, after the device's other tables; their partial
pooled outputs are summed by the reduce-scatter of one [B, Σ dim of the row-wise tables] buffer
over all ranks (a rank writes its shards' columns, zeros elsewhere: one indexed copy, whatever the
number of tables), and the all-gather spreads their gradients back (one indexed copy out). Those
copies are part of the comm phases (costs/comm.py: the collectives, natively on gloo in torch 2.13
and on NCCL).

Three kinds of timed steps alternate:

- *phased*: a barrier before each phase, so every component is timed on its own. Each phase starts
  behind ``_Clock.start``'s sleep kernel: the interval is the GPU's work, not the host's launch of
  it (CUDA events on GPU; ``perf_counter`` on CPU, where ops are synchronous); the comm phases
  start on all ranks at once (``_Clock.start_together``). These give the four components
  (``CostReport.devices``);
- *end-to-end* (``e2e_ms``): one barrier, then the four phases back to back from one aligned
  start; the step is the max over ranks of each rank's start-to-end time. It can exceed the phased
  overall (max over devices of the four components' sum): a rank whose compute is short waits
  inside the collectives for the slowest one (docs/comm.md: the gaps measured);
- *end-to-end with launch* (``details["e2e_launch_ms"]``): the same, started without the sleep
  kernel, so the host's launch of every op is paid where the GPU waits for it (small steps).

Warm-ups first, then ``iters`` timed steps of each kind; reported numbers are medians. Inputs are
``input_sets`` (≥ 2) distinct batches, ``shard_batch(..., step=i)``, used in turn so the caches do
not see one batch over and over. A worker that raises ends the run with its one-line error
(MeasurementError; a worker killed outright is named before the peers that lost it); one that hangs is killed with all the others when ``timeout_s`` runs out.
"""

from __future__ import annotations

import os
from statistics import median
from typing import Sequence

from dreamshard.costs.base import CostBackend, CostReport, DeviceCost
from dreamshard.costs.comm import all_gather_fn, reduce_scatter_fn, relayout_backward, relayout_forward
# FAULT_ENV, failure_message: tests import them from here, as runners/sequential.py does _Clock
from dreamshard.costs.runners.launch import DEFAULT_TIMEOUT_S, FAULT_ENV, _Clock, failure_message, launch  # noqa: F401
from dreamshard.rowshard import RowShardSpec, exchange_dims, exchange_order, rowwise_tables, spec_from_dict
from dreamshard.tables import TableSpec
from dreamshard.tasks import Workload
from dreamshard.validation import MeasurementError, OptionError


def measure_worker(job: dict, rank: int, world: int, device, clock: _Clock, barrier) -> dict:
    """One rank of a measurement (the launcher's worker, see ``launch``): every placement of
    ``job["placements"]`` in turn, so that many placements pay one start of the processes."""
    out = []
    for shards in job["placements"]:
        out.append(measure_placement(job, [[spec_from_dict(t) for t in shard] for shard in shards], rank, world, device, clock, barrier))
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()  # the next placement's tables, not this one's, fill the device
    return {"placements": out}


def measure_placement(job: dict, shards: list[list[TableSpec]], rank: int, world: int, device, clock: _Clock, barrier) -> dict:
    """One rank's measurement of one placement (``shards``: every device's, in `exchange_order`)."""
    import torch
    import torch.distributed as dist

    from dreamshard.streams import shard_batch

    B = job["batch_size"]
    tables = shards[rank]  # its whole tables and column shards, then its row shards (`exchange_order`)
    dim_sums, rw_dim = exchange_dims(shards)  # all-to-all dims per rank; the row-wise buffer's dim
    mine = dim_sums[rank]
    rows_mine = [t for t in tables if isinstance(t, RowShardSpec)]
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[job["precision"]]
    tbe = build_checked_tbe(job["kernel"], tables, job["precision"], job["optimizer"], device, job.get("seed", 0)) if tables else None
    inputs = [shard_batch(tables, B, step=i, device=device) for i in range(job["input_sets"])] if tables else []
    if hasattr(tbe, "caches"):  # a tiered TBE is given each table's lookup range, as a TorchRec input carries it (no host sync in its forward)
        inputs = [(ix, off, off[::B].tolist()) for ix, off in inputs]
    chunk = B // world
    fwd_in = [chunk * mine] * world  # rank d sends its [B/D, dimsum_d] row block to every rank
    fwd_out = [chunk * s for s in dim_sums]  # and gets every rank's block for its own samples
    comm = sum(dim_sums) > 0 and world > 1
    g = torch.Generator(device=device)
    g.manual_seed(1234 + rank)
    grad_recv = (torch.rand(sum(fwd_out), generator=g, device=device, dtype=torch.float32) * 2e-3 - 1e-3).to(dtype)
    recv = torch.empty(sum(fwd_out), dtype=dtype, device=device)
    grad_back = torch.empty(B * mine, dtype=dtype, device=device)
    empty_out = torch.empty(B, 0, dtype=dtype, device=device)  # a device with no tables
    step = [0]
    rw_comm = rw_dim > 0 and world > 1
    if rw_comm:
        slot, at = {}, 0  # each row-wise table's first column in the buffer
        for t in rowwise_tables([t for s in shards for t in s]):
            slot[t.name], at = at, at + t.dim
        # the buffer's column of each column of this rank's row shards (they follow its all-to-all
        # columns in the TBE output): the copies in and out of the buffer are one indexed op each,
        # whatever the number of row-wise tables (costs/comm.py `relayout_forward`)
        cols = torch.tensor([slot[r.parent.name] + j for r in rows_mine for j in range(r.dim)], dtype=torch.long, device=device)
        rs_in = torch.zeros(B, rw_dim, dtype=dtype, device=device)  # columns of tables with no shard here stay 0
        rs_out = torch.empty(B // world, rw_dim, dtype=dtype, device=device)
        ag_in = (torch.rand(B // world, rw_dim, generator=g, device=device, dtype=torch.float32) * 2e-3 - 1e-3).to(dtype)
        ag_out = torch.empty(B, rw_dim, dtype=dtype, device=device)
    if rows_mine:  # the TBE's output gradient: the all-to-all's columns, then the all-gather's
        grad_full = (torch.rand(B, mine + sum(r.dim for r in rows_mine), generator=g, device=device, dtype=torch.float32) * 2e-3 - 1e-3).to(dtype)

    def fwd_comp() -> torch.Tensor:
        if tbe is None:
            return empty_out
        return tbe.forward(*inputs[step[0] % len(inputs)])

    def fwd_comm(out: torch.Tensor) -> None:
        send = relayout_forward(out, mine, cols, rs_in) if rows_mine and rw_comm else out.view(-1)
        if comm:
            dist.all_to_all_single(recv, send, fwd_out, fwd_in)
        if rw_comm:
            reduce_scatter_fn(rs_out, rs_in)

    def bwd_comm() -> None:
        if comm:
            dist.all_to_all_single(grad_back, grad_recv, fwd_in, fwd_out)
        if rw_comm:
            all_gather_fn(ag_out, ag_in)
            if rows_mine:
                relayout_backward(grad_full, grad_back.view(B, mine), ag_out, cols)

    def bwd_comp() -> None:
        if tbe is not None:
            tbe.backward(grad_full if rows_mine else grad_back.view(B, mine))

    def phased() -> list[float]:
        # every phase starts behind the clock's sleep kernel: the interval is the GPU's work (and,
        # in the collectives, the wait for the other ranks), not the host's launch of it, as in a
        # training step where the host runs ahead of the GPU; the comm phases start on every rank
        # at once (`start_together`), so none times another's late start
        barrier()
        a = clock.start()
        out = fwd_comp()
        b = clock.mark()
        barrier()
        c = clock.start_together()
        fwd_comm(out)
        d = clock.mark()
        barrier()
        e = clock.start_together()
        bwd_comm()
        f = clock.mark()
        barrier()
        h = clock.start()
        bwd_comp()
        k = clock.mark()
        clock.sync()
        step[0] += 1
        return [clock.ms(a, b), clock.ms(c, d), clock.ms(e, f), clock.ms(h, k)]

    def end_to_end(hide_launch: bool) -> float:
        barrier()
        a = clock.start_together() if hide_launch else clock.mark()
        out = fwd_comp()
        fwd_comm(out)
        bwd_comm()
        bwd_comp()
        b = clock.mark()
        clock.sync()
        step[0] += 1
        return clock.ms(a, b)

    check = None
    if job.get("check_outputs") and rw_comm:  # tests: the exchange's inputs and results, before any update
        fwd_comm(fwd_comp())
        bwd_comm()
        check = {"reduce_scatter_in": rs_in.double().tolist(), "reduce_scatter_out": rs_out.double().tolist(),
                 "all_gather_in": ag_in.double().tolist(), "all_gather_out": ag_out.double().tolist()}
    for _ in range(job["warmup"]):
        phased()
        end_to_end(True)
        end_to_end(False)
    phases, e2e, e2e_launch = [], [], []
    for _ in range(job["iters"]):
        phases.append(phased())
        e2e.append(end_to_end(True))
        e2e_launch.append(end_to_end(False))
    series = list(zip(*phases))
    result = {"fwd_comp": list(series[0]), "fwd_comm": list(series[1]), "bwd_comm": list(series[2]), "bwd_comp": list(series[3]), "e2e": e2e,
              "e2e_launch": e2e_launch, "tables": len(tables), "dim_sum": mine}
    if check is not None:
        result["rowwise_check"] = check
    del tbe, inputs
    return result


def build_checked_tbe(kernel: str, tables: Sequence[TableSpec], precision: str, optimizer: str, device, seed: int = 0, tiers=None,
                      batch_size: int | None = None):
    """The shard's TBE, checked with one tiny forward/backward so that an unsupported combination
    (fp16 in a CPU kernel, say) fails here, with a message that says what to do. `tiers` (one
    tiers.Tier per table): a shard with tables outside HBM runs as kernels/tiered.py's TieredTBE,
    a cache smaller than a batch of `batch_size` needs (tiers.min_cache_rows) given the shortfall
    as staging rows, so that its overflow is served from host memory as FBGEMM serves it."""
    import torch

    from dreamshard.costs.kernels import make_tbe
    from dreamshard.streams import shard_batch
    from dreamshard.tiers import host_bytes as tier_host_bytes

    host_bytes = sum(tier_host_bytes(t.rows, t.dim, tr.kind, precision, optimizer) for t, tr in zip(tables, tiers or []))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if host_bytes > ram:  # at once, not after minutes of building: pinned host memory cannot exceed the machine's RAM
        raise MeasurementError(f"the shard's host tiers need {host_bytes / 1e9:,.1f} GB of pinned host memory; this machine has {ram / 1e9:,.1f} GB")
    try:
        if tiers is not None and any(t.kind != "hbm" for t in tiers):
            from dreamshard.costs.kernels.tiered import TieredTBE
            from dreamshard.tiers import cache_rows, min_cache_rows

            overflow = [max(0, min_cache_rows(t, batch_size) - cache_rows(t.rows, tr.cache_ratio)) if batch_size and tr.kind == "uvm_caching" else 0
                        for t, tr in zip(tables, tiers)]
            tbe = TieredTBE(kernel, [t.rows for t in tables], [t.dim for t in tables], tiers, precision=precision, optimizer=optimizer, device=device, seed=seed,
                            overflow=overflow)
        else:
            tbe = make_tbe(kernel, [t.rows for t in tables], [t.dim for t in tables], precision=precision, optimizer=optimizer, device=device, seed=seed)
        ix, off = shard_batch(tables, 4, step=10**6, device=device)
        out = tbe.forward(ix, off)
        tbe.backward(out.new_zeros(out.shape))  # zero gradient: a no-op update for SGD and Adagrad
    except ValueError:  # the kernel's own argument checks: the tables were validated, so a bug
        raise
    except Exception as e:  # noqa: BLE001 - the kernel cannot run this shard here (KernelUnavailable, a CUDA error...)
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e):  # not the precision's fault: fp32 would need more
            where = f"{device}" + (f" and {host_bytes / 1e9:,.1f} GB of pinned host memory" if host_bytes else "")
            raise MeasurementError(f"the shard's tables and batch do not fit in the memory of {where} ({msg})") from e
        if precision == "fp16":
            raise MeasurementError(f"the {kernel} kernel does not run fp16 on {torch_device_type(device)} ({msg}); rerun with --precision fp32") from e
        raise MeasurementError(f"the {kernel} kernel failed on {torch_device_type(device)}: {msg}") from e
    return tbe


def torch_device_type(device) -> str:
    return getattr(device, "type", str(device))


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


def summarize(rank_results: list[dict]) -> tuple[list[DeviceCost], float, dict]:
    """Medians per device, the end-to-end steps (median over iterations of the max over ranks)."""
    devices = [DeviceCost(median(r["fwd_comp"]), median(r["fwd_comm"]), median(r["bwd_comm"]), median(r["bwd_comp"])) for r in rank_results]
    steps = [max(vals) for vals in zip(*(r["e2e"] for r in rank_results))]
    launch_steps = [max(vals) for vals in zip(*(r["e2e_launch"] for r in rank_results))]
    e2e = median(steps)
    qs = sorted(steps)
    spread = {"e2e_min_ms": qs[0], "e2e_max_ms": qs[-1], "e2e_launch_ms": median(launch_steps),
              "per_device_total_min_max_ms": [[min(map(sum, zip(r["fwd_comp"], r["fwd_comm"], r["bwd_comm"], r["bwd_comp"]))),
                                               max(map(sum, zip(r["fwd_comp"], r["fwd_comm"], r["bwd_comm"], r["bwd_comp"])))] for r in rank_results]}
    return devices, e2e, spread


class DistributedRunner(CostBackend):
    """Real measurement: one process per device, real all-to-alls. See the module docstring."""

    def __init__(self, kernel: str, device_type: str = "cpu", warmup: int = 3, iters: int = 10, input_sets: int = 3,
                 timeout_s: float = DEFAULT_TIMEOUT_S, seed: int = 0, check_outputs: bool = False) -> None:
        """``check_outputs``: every rank also returns, in ``details["rowwise_check"]``, the
        inputs and results of one row-wise exchange run before the warm-ups (for tests: small B)."""
        if iters < 1 or warmup < 0:
            raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters} warmup={warmup}")
        if input_sets < 2:
            raise ValueError(f"need at least 2 input sets to rotate, got {input_sets}")
        self.kernel, self.device_type = kernel, device_type
        self.warmup, self.iters, self.input_sets, self.timeout_s, self.seed = warmup, iters, input_sets, timeout_s, seed
        self.check_outputs = check_outputs
        self.name = f"{kernel}/distributed"

    @property
    def measures_topology(self) -> bool:
        """Launched by torchrun (`launch.torchrun_rank`): its ranks are the hosts' own GPUs, so a
        plan of several hosts is measured on its network, not priced."""
        from dreamshard.costs.runners.launch import torchrun_rank

        return torchrun_rank() is not None

    def cache_bytes(self) -> float:
        from dreamshard.costs.hardware import cache_bytes

        return cache_bytes(self.device_type)  # the workers' devices are alike: device 0's

    def evaluate(self, shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload()) -> CostReport:
        return self.evaluate_many([shards], workload)[0]

    def evaluate_many(self, placements: Sequence[Sequence[Sequence[TableSpec]]], workload: Workload = Workload()) -> list[CostReport]:
        """Every placement measured in turn by one set of worker processes (one start, not one per
        placement); placements of one device count."""
        from dreamshard.costs.hardware import describe_hardware, software_versions

        if not placements:
            return []
        D = len(placements[0])
        if D < 1:
            raise ValueError("a placement needs at least one device")
        if any(len(p) != D for p in placements):
            raise ValueError(f"one launch measures placements of one device count, got {sorted({len(p) for p in placements})}")
        workload.validate("workload", OptionError)
        batch_size, precision, optimizer = workload.batch_size, workload.precision, workload.optimizer
        if batch_size % D:
            raise OptionError(f"batch size {batch_size} must be a positive multiple of the {D} devices (each gets B/D samples)")
        job = {"placements": [[[t.to_dict() for t in s] for s in exchange_order(p)] for p in placements], "kernel": self.kernel,
               "batch_size": batch_size, "precision": precision, "optimizer": optimizer, "warmup": self.warmup, "iters": self.iters,
               "input_sets": self.input_sets, "seed": self.seed, "check_outputs": self.check_outputs}
        results, info = launch(f"{__name__}:measure_worker", job, D, self.device_type, self.timeout_s * len(placements))
        timing = ("CUDA events; each op enqueued behind a sleep kernel, so host launch time is excluded unless the op syncs"
                  if self.device_type == "cuda" else "perf_counter")
        reports = []
        for i, shards in enumerate(placements):
            ranks = [r["placements"][i] for r in results]
            devices, e2e, spread = summarize(ranks)
            details = {"iters": self.iters, "warmup": self.warmup, "input_sets": self.input_sets, "timing": timing,
                       "process_group": info["process_group"], "threads_per_rank": info["threads_per_rank"], "wall_s": round(info["wall_s"] / len(placements), 2),
                       **({"launcher": "torchrun", "local_world_size": info["local_world_size"]} if info.get("launcher") == "torchrun" else {}),
                       "dim_sums": [r["dim_sum"] for r in ranks], "tables_per_device": [r["tables"] for r in ranks],
                       "statistic": "median over timed iterations; e2e = median over iterations of the max over ranks",
                       "versions": software_versions(), **spread}
            rw_dim = exchange_dims(shards)[1]
            if rw_dim:
                details["rowwise_dim"] = rw_dim
                details["rowwise_exchange"] = "one reduce-scatter forward, one all-gather backward, over all devices, after the all-to-all in the same phase"
            if self.check_outputs:
                details["rowwise_check"] = [r.get("rowwise_check") for r in ranks]
            reports.append(CostReport(devices=devices, backend=self.kernel, runner="distributed", hardware=describe_hardware(self.device_type, D),
                                      batch_size=batch_size, precision=precision, optimizer=optimizer, e2e_ms=e2e, comm_modelled=False, details=details))
        return reports


def measure_distributed(plan, kernel: str, batch_size: int | None = None, warmup: int = 3, iters: int = 10, timeout_s: float = DEFAULT_TIMEOUT_S,
                        device_type: str | None = None, precision: str | None = None, input_sets: int = 3) -> CostReport:
    """Measure ``plan`` (a ``dreamshard.plan.Plan``) with one process per device; see the module docstring.
    ``device_type`` None: the kernel decides (``runners.default_device``)."""
    if device_type is None:
        from dreamshard.costs.runners import default_device

        device_type = default_device(kernel)
    runner = DistributedRunner(kernel, device_type, warmup, iters, input_sets, timeout_s)
    return runner.evaluate_plan(plan, batch_size, precision)  # a plan with host tiers is refused there (one line)
