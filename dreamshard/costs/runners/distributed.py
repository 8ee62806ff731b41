"""The distributed runner: one process per device, real all-to-alls (DESIGN.md §1, §4).

``measure_distributed(plan, kernel, batch_size)`` starts one worker process per device
(``python -c ...`` subprocesses, so a dead or hung worker can always be killed), joins them in a
``torch.distributed`` process group (gloo on CPU, NCCL on CUDA) through a TCP store that this
process holds (the OS picks a free port; nothing to collide with), and runs on every rank:

  per step: forward compute (the shard's TBE over the whole global batch B) → forward all-to-all
  of the pooled outputs (rank d keeps B/D samples of every table) → backward all-to-all of their
  gradients → backward compute (the TBE backward, optimizer fused).

Two kinds of timed steps alternate:

- *phased*: a barrier before each phase, so every component is timed on its own (CUDA events on
  GPU, ``perf_counter`` on CPU, where ops are synchronous). These give the four components; the
  compute phases time the GPU's work, not the host's launch overhead (``_Clock.start``);
- *end-to-end*: one barrier, then the four phases back to back; the step latency is the max over
  ranks of each rank's start-to-end time (ranks wait for each other inside the all-to-alls).

Warm-ups first, then ``iters`` timed steps of each kind; reported numbers are medians. Inputs are
``input_sets`` (≥ 2) distinct batches, ``shard_batch(..., step=i)``, used in turn so the caches do
not see one batch over and over. A worker that raises ends the run with its one-line error
(MeasurementError; a worker killed outright is named before the peers that lost it); one that hangs is killed with all the others when ``timeout_s`` runs out.

Tests inject faults with the environment variable ``DREAMSHARD_TEST_WORKER_FAULT=kind:rank``
(kind = raise | exit | kill | hang), honoured by the workers after they joined the process group.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from statistics import median
from typing import Sequence

from dreamshard.costs.base import CostBackend, CostReport, DeviceCost
from dreamshard.files import atomic_write
from dreamshard.tables import TableSpec
from dreamshard.tasks import Workload
from dreamshard.validation import MeasurementError, OptionError

FAULT_ENV = "DREAMSHARD_TEST_WORKER_FAULT"
DEFAULT_TIMEOUT_S = 300.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding `dreamshard/`


# --------------------------------------------------------------------------------------------
# Launching workers (also used by the all-to-all calibration in costs/comm.py)
# --------------------------------------------------------------------------------------------


def _worker_env(device_type: str, world: int) -> dict:
    env = os.environ.copy()
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Mandatory on our H200 machines: NVLink SHARP / multicast objects are not available there.
    env["NCCL_NVLS_ENABLE"] = "0"
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if device_type == "cpu":
        from dreamshard.costs.hardware import cpu_cores

        env["OMP_NUM_THREADS"] = str(max(1, cpu_cores() // world))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    """SIGKILL every worker still alive, with anything it started (each has its own session)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def _failure(rank: int, rc: int, workdir: Path, seen: float) -> tuple[int, float, str]:
    """(0 if it died without reporting an error of its own else 1, time of failure, one-line
    reason) of a worker that exited with ``rc`` != 0; ``seen``: when the launcher saw it gone.

    A worker that was killed (or died) without a word is put first: its peers' errors ("connection
    closed by peer") come from losing it, and may even be stamped before the launcher noticed."""
    err = workdir / f"rank{rank}.err"
    if err.is_file():
        try:
            d = json.loads(err.read_text())
            return 1, float(d["time"]), str(d["error"])
        except (ValueError, KeyError, TypeError):
            pass
    reason = f"died with exit code {rc}"
    if rc < 0:
        try:
            reason = f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            pass
    log = workdir / f"rank{rank}.log"
    tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    if tail:
        reason += f" (last output: {tail[-1][:200]})"
    return 0, seen, reason


def failure_message(failed: Sequence[tuple[int, int]], world: int, workdir: Path, seen_dead: dict[int, float]) -> str:
    """One line naming the worker whose failure ended the run (see `_failure`), given the
    (rank, exit code) of every worker that failed."""
    reasons = sorted(_failure(r, c, workdir, seen_dead.get(r, time.time())) + (r,) for r, c in failed)
    _, _, reason, rank = reasons[0]
    others = f"; {len(reasons) - 1} other worker{'s' if len(reasons) > 2 else ''} failed after it" if len(reasons) > 1 else ""
    what = reason if reason.startswith(("died", "was killed")) else "raised " + reason
    return f"measurement failed: worker {rank} of {world} {what}{others} (logs: {workdir})"


def launch(job: dict, world: int, device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[list[dict], dict]:
    """Run ``job`` on ``world`` worker processes; return (each rank's result, info).

    Raises MeasurementError naming the failing worker, with its one-line error, or after ``timeout_s``.
    """
    import torch
    from torch.distributed import TCPStore

    if world < 1:
        raise ValueError(f"need at least one device, got {world}")
    if device_type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible < world:
            raise ValueError(f"the distributed runner needs {world} CUDA devices, {visible} visible; use --runner sequential")
    elif device_type != "cpu":
        raise ValueError(f"device type must be cpu or cuda, got {device_type!r}")
    timeout_s = float(timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"timeout must be positive, got {timeout_s}")
    workdir = Path(tempfile.mkdtemp(prefix="dreamshard-run-"))
    store = TCPStore("127.0.0.1", 0, None, True, timeout=_dt.timedelta(seconds=timeout_s + 30), wait_for_workers=False)
    job = {**job, "world": world, "device_type": device_type, "store_port": store.port, "timeout_s": timeout_s}
    (workdir / "job.json").write_text(json.dumps(job))
    env = _worker_env(device_type, world)
    code = "from dreamshard.costs.runners.distributed import _worker_main; _worker_main()"
    procs: list[subprocess.Popen] = []
    ok = False
    start = time.monotonic()
    seen_dead: dict[int, float] = {}  # rank → wall time the launcher first saw it exit non-zero
    try:
        for rank in range(world):
            with open(workdir / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-c", code, str(workdir), str(rank)], stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=str(workdir)))
        deadline = start + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                for r, _ in failed:
                    seen_dead.setdefault(r, time.time())
                time.sleep(0.2)  # let a peer that failed at the same moment write its error too
                codes = [p.poll() for p in procs]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                for r, _ in failed:
                    seen_dead.setdefault(r, time.time())
                _kill(procs)
                raise MeasurementError(failure_message(failed, world, workdir, seen_dead))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                alive = [r for r, c in enumerate(codes) if c is None]
                _kill(procs)
                raise MeasurementError(f"measurement timed out after {timeout_s:g} s (worker{'s' if len(alive) > 1 else ''} "
                                   f"{', '.join(map(str, alive))} still running, all killed; logs: {workdir})")
            time.sleep(0.02)
        results = []
        for rank in range(world):
            path = workdir / f"rank{rank}.json"
            if not path.is_file():
                raise MeasurementError(f"measurement failed: worker {rank} exited without a result (logs: {workdir})")
            results.append(json.loads(path.read_text()))
        ok = True
        info = {"process_group": "nccl" if device_type == "cuda" else "gloo", "wall_s": round(time.monotonic() - start, 2),
                "threads_per_rank": results[0].get("threads")}
        return results, info
    finally:
        _kill(procs)
        del store
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)


HOST_SLACK_MS = 4.0  # how long the GPU is kept busy before a timed op, while the host enqueues it


class _Clock:
    """Marks on the device timeline: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self._sleep_cycles = 0

    def start(self):
        """The mark that starts a timed op. On GPU a sleep kernel first keeps the stream busy while
        the host enqueues the op, so the interval is the GPU's work alone: in a training step the
        host runs ahead of the GPU and its launch overhead is hidden (and it differs from host to
        host, which made small shards' times drift between machines). An op that makes the host
        wait for the GPU still pays the host time after the wait."""
        if self.cuda:
            if not self._sleep_cycles:  # cycles per ms of this GPU's clock, measured once
                a = self.mark()
                self.torch.cuda._sleep(1_000_000)
                b = self.mark()
                self.sync()
                self._sleep_cycles = int(1_000_000 * HOST_SLACK_MS / max(self.ms(a, b), 1e-3))
            self.torch.cuda._sleep(self._sleep_cycles)
        return self.mark()

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms(self, a, b) -> float:
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1e3


def _inject_fault(rank: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    kind, _, who = spec.partition(":")
    if who and int(who) != rank:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault in worker {rank}")
    if kind == "exit":
        os._exit(3)
    if kind == "kill":  # as the OOM killer or a user's kill -9 would
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)


def _worker_main() -> None:
    """Entry point of one worker: ``python -c ... WORKDIR RANK``."""
    workdir, rank = Path(sys.argv[1]), int(sys.argv[2])
    try:
        job = json.loads((workdir / "job.json").read_text())
        result = _run_rank(job, rank)
        atomic_write(workdir / f"rank{rank}.json", json.dumps(result))
    except BaseException as e:  # noqa: BLE001 - every failure becomes one line for the parent
        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        line = f"{type(e).__name__}: {first}" if first else type(e).__name__
        (workdir / f"rank{rank}.err").write_text(json.dumps({"time": time.time(), "error": line}))
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (NCCL/gloo threads); results are on disk


def _run_rank(job: dict, rank: int) -> dict:
    import torch
    import torch.distributed as dist

    world, device_type = job["world"], job["device_type"]
    timeout = _dt.timedelta(seconds=job["timeout_s"] + 30)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    store = dist.TCPStore("127.0.0.1", job["store_port"], None, False, timeout=timeout)
    kwargs = {"device_id": device} if device_type == "cuda" else {}
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", store=store, rank=rank, world_size=world, timeout=timeout, **kwargs)
    clock = _Clock(device)

    def barrier() -> None:
        clock.sync()
        if device_type == "cuda":
            dist.barrier(device_ids=[rank])
        else:
            dist.barrier()
        clock.sync()

    barrier()
    _inject_fault(rank)
    if job["kind"] == "measure":
        out = _measure_rank(job, rank, world, device, clock, barrier)
    elif job["kind"] == "alltoall":
        from dreamshard.costs.comm import alltoall_worker

        out = alltoall_worker(job, rank, world, device, clock, barrier)
    else:
        raise ValueError(f"unknown job kind {job['kind']!r}")
    barrier()
    out["threads"] = torch.get_num_threads() if device_type == "cpu" else None
    out["device"] = str(device)
    return out


def _measure_rank(job: dict, rank: int, world: int, device, clock: _Clock, barrier) -> dict:
    import torch
    import torch.distributed as dist

    from dreamshard.streams import shard_batch

    B = job["batch_size"]
    shards = [[TableSpec.from_dict(t) for t in shard] for shard in job["shards"]]
    tables = shards[rank]
    dim_sums = [sum(t.dim for t in s) for s in shards]
    mine = dim_sums[rank]
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[job["precision"]]
    tbe = build_checked_tbe(job["kernel"], tables, job["precision"], job["optimizer"], device, job.get("seed", 0)) if tables else None
    inputs = [shard_batch(tables, B, step=i, device=device) for i in range(job["input_sets"])] if tables else []
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

    def fwd_comp() -> torch.Tensor:
        if tbe is None:
            return empty_out
        ix, off = inputs[step[0] % len(inputs)]
        return tbe.forward(ix, off)

    def fwd_comm(out: torch.Tensor) -> None:
        if comm:
            dist.all_to_all_single(recv, out.contiguous().view(-1), fwd_out, fwd_in)

    def bwd_comm() -> None:
        if comm:
            dist.all_to_all_single(grad_back, grad_recv, fwd_in, fwd_out)

    def bwd_comp() -> None:
        if tbe is not None:
            tbe.backward(grad_back.view(B, mine))

    def phased() -> list[float]:
        barrier()
        a = clock.start()
        out = fwd_comp()
        b = clock.mark()
        barrier()
        c = clock.mark()
        fwd_comm(out)
        d = clock.mark()
        barrier()
        e = clock.mark()
        bwd_comm()
        f = clock.mark()
        barrier()
        h = clock.start()
        bwd_comp()
        k = clock.mark()
        clock.sync()
        step[0] += 1
        return [clock.ms(a, b), clock.ms(c, d), clock.ms(e, f), clock.ms(h, k)]

    def end_to_end() -> float:
        barrier()
        a = clock.mark()
        out = fwd_comp()
        fwd_comm(out)
        bwd_comm()
        bwd_comp()
        b = clock.mark()
        clock.sync()
        step[0] += 1
        return clock.ms(a, b)

    for _ in range(job["warmup"]):
        phased()
        end_to_end()
    phases, e2e = [], []
    for _ in range(job["iters"]):
        phases.append(phased())
        e2e.append(end_to_end())
    cols = list(zip(*phases))
    return {"fwd_comp": list(cols[0]), "fwd_comm": list(cols[1]), "bwd_comm": list(cols[2]), "bwd_comp": list(cols[3]), "e2e": e2e,
            "tables": len(tables), "dim_sum": mine}


def build_checked_tbe(kernel: str, tables: Sequence[TableSpec], precision: str, optimizer: str, device, seed: int = 0):
    """The shard's TBE, checked with one tiny forward/backward so that an unsupported combination
    (fp16 in a CPU kernel, say) fails here, with a message that says what to do."""
    from dreamshard.costs.kernels import make_tbe
    from dreamshard.streams import shard_batch

    try:
        tbe = make_tbe(kernel, [t.rows for t in tables], [t.dim for t in tables], precision=precision, optimizer=optimizer, device=device, seed=seed)
        ix, off = shard_batch(tables, 4, step=10**6, device=device)
        out = tbe.forward(ix, off)
        tbe.backward(out.new_zeros(out.shape))  # zero gradient: a no-op update for SGD and Adagrad
    except ValueError:  # the kernel's own argument checks: the tables were validated, so a bug
        raise
    except Exception as e:  # noqa: BLE001 - the kernel cannot run this shard here (KernelUnavailable, a CUDA error...)
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
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
    """Medians per device, the end-to-end step (median over iterations of the max over ranks)."""
    devices = [DeviceCost(median(r["fwd_comp"]), median(r["fwd_comm"]), median(r["bwd_comm"]), median(r["bwd_comp"])) for r in rank_results]
    steps = [max(vals) for vals in zip(*(r["e2e"] for r in rank_results))]
    e2e = median(steps)
    qs = sorted(steps)
    spread = {"e2e_min_ms": qs[0], "e2e_max_ms": qs[-1],
              "per_device_total_min_max_ms": [[min(map(sum, zip(r["fwd_comp"], r["fwd_comm"], r["bwd_comm"], r["bwd_comp"]))),
                                               max(map(sum, zip(r["fwd_comp"], r["fwd_comm"], r["bwd_comm"], r["bwd_comp"])))] for r in rank_results]}
    return devices, e2e, spread


class DistributedRunner(CostBackend):
    """Real measurement: one process per device, real all-to-alls. See the module docstring."""

    def __init__(self, kernel: str, device_type: str = "cpu", warmup: int = 3, iters: int = 10, input_sets: int = 3,
                 timeout_s: float = DEFAULT_TIMEOUT_S, seed: int = 0) -> None:
        if iters < 1 or warmup < 0:
            raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters} warmup={warmup}")
        if input_sets < 2:
            raise ValueError(f"need at least 2 input sets to rotate, got {input_sets}")
        self.kernel, self.device_type = kernel, device_type
        self.warmup, self.iters, self.input_sets, self.timeout_s, self.seed = warmup, iters, input_sets, timeout_s, seed
        self.name = f"{kernel}/distributed"

    def evaluate(self, shards: Sequence[Sequence[TableSpec]], workload: Workload = Workload()) -> CostReport:
        from dreamshard.costs.hardware import describe_hardware, software_versions

        D = len(shards)
        if D < 1:
            raise ValueError("a placement needs at least one device")
        workload.validate("workload", OptionError)
        batch_size, precision, optimizer = workload.batch_size, workload.precision, workload.optimizer
        if batch_size % D:
            raise OptionError(f"batch size {batch_size} must be a positive multiple of the {D} devices (each gets B/D samples)")
        job = {"kind": "measure", "shards": [[t.to_dict() for t in s] for s in shards], "kernel": self.kernel, "batch_size": batch_size,
               "precision": precision, "optimizer": optimizer, "warmup": self.warmup, "iters": self.iters, "input_sets": self.input_sets,
               "seed": self.seed}
        results, info = launch(job, D, self.device_type, self.timeout_s)
        devices, e2e, spread = summarize(results)
        details = {"iters": self.iters, "warmup": self.warmup, "input_sets": self.input_sets, "timing": "CUDA events; each op enqueued behind a sleep kernel, so host launch time is excluded unless the op syncs" if self.device_type == "cuda" else "perf_counter",
                   "process_group": info["process_group"], "threads_per_rank": info["threads_per_rank"], "wall_s": info["wall_s"],
                   "dim_sums": [r["dim_sum"] for r in results], "tables_per_device": [r["tables"] for r in results],
                   "statistic": "median over timed iterations; e2e = median over iterations of the max over ranks",
                   "versions": software_versions(), **spread}
        return CostReport(devices=devices, backend=self.kernel, runner="distributed", hardware=describe_hardware(self.device_type, D),
                          batch_size=batch_size, precision=precision, optimizer=optimizer, e2e_ms=e2e, comm_modelled=False, details=details)


def measure_distributed(plan, kernel: str, batch_size: int | None = None, warmup: int = 3, iters: int = 10, timeout_s: float = DEFAULT_TIMEOUT_S,
                        device_type: str | None = None, precision: str | None = None, input_sets: int = 3) -> CostReport:
    """Measure ``plan`` (a ``dreamshard.plan.Plan``) with one process per device; see the module docstring.
    ``device_type`` None: the kernel decides (``runners.default_device``)."""
    if device_type is None:
        from dreamshard.costs.runners import default_device

        device_type = default_device(kernel)
    runner = DistributedRunner(kernel, device_type, warmup, iters, input_sets, timeout_s)
    return runner.evaluate(plan.device_tables(), plan.workload.with_overrides(batch_size, precision))
