"""The process launcher of the runners: one worker process per device, joined in a process group.

``launch(worker, job, world, device_type)`` starts ``world`` worker processes (``python -c ...``
subprocesses, so a dead or hung worker can always be killed), joins them in a
``torch.distributed`` process group (gloo on CPU, NCCL on CUDA) through a TCP store that this
process holds (the OS picks a free port; nothing to collide with), and calls on every rank

    worker(job, rank, world, device, clock, barrier) -> dict   (JSON-able: that rank's result)

``worker`` names the function, ``"package.module:function"``, and each job names its own: the
distributed runner's measurement (``runners/distributed.py``), the all-to-all calibration
(``costs/comm.py``). The launcher imports neither, so they need not import each other or it
anything of theirs but this module.

A worker that raises ends the run with its one-line error (MeasurementError; a worker killed
outright is named before the peers that lost it); one that hangs is killed with all the others
when ``timeout_s`` runs out.

Under torchrun (`torchrun --nnodes N --nproc-per-node G -m dreamshard.cli measure PLAN ...`: the
environment has RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT)
nothing is started: this process is one rank (`torchrun_rank`), it joins torchrun's process group
(``env://``: gloo on CPU, NCCL on its LOCAL_RANK's GPU), runs the worker itself and gathers every
rank's result (`launch_here`), so the same measurement spans hosts; torchrun ends the others when
one fails.

Tests inject faults with the environment variable ``DREAMSHARD_TEST_WORKER_FAULT=kind:rank``
(kind = raise | exit | kill | hang), honoured by the workers after they joined the process group.
"""

from __future__ import annotations

import datetime as _dt
import importlib
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
from typing import Callable, Sequence

from dreamshard.files import atomic_write
from dreamshard.validation import MeasurementError

FAULT_ENV = "DREAMSHARD_TEST_WORKER_FAULT"
DEFAULT_TIMEOUT_S = 300.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding `dreamshard/`


def resolve_worker(worker: str) -> Callable:
    """The function that ``"package.module:function"`` names."""
    module, sep, name = worker.partition(":")
    if not (module and sep and name):
        raise ValueError(f"a worker is named 'package.module:function', got {worker!r}")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"worker {worker!r}: {module} has no function {name!r}")
    return fn


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


def torchrun_rank() -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) where torchrun started this process (its
    environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR), else None."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        return None
    try:
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise MeasurementError("torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers") from None
    return rank, world, local, local_world


def launch_here(worker: str, job: dict, world: int, device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[list[dict], dict]:
    """``launch`` under torchrun: this process is its rank of torchrun's ``world`` (which must be
    the plan's device count); joins the process group from the environment, runs ``worker`` and
    returns every rank's result (all-gathered) and info, on every rank."""
    import torch
    import torch.distributed as dist

    rank, size, local, local_world = torchrun_rank()
    if size != world:
        raise MeasurementError(f"the plan has {world} devices, but torchrun started {size} processes (--nnodes × --nproc-per-node must be {world})")
    if device_type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
            raise MeasurementError(f"rank {rank}: LOCAL_RANK {local} has no CUDA device here ({torch.cuda.device_count() if torch.cuda.is_available() else 0} visible)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        from dreamshard.costs.hardware import cpu_cores

        device = torch.device("cpu")
        torch.set_num_threads(max(1, cpu_cores() // max(1, local_world)))  # a host's cores shared by its ranks, as the one-host launch shares them
    start = time.monotonic()
    timeout = _dt.timedelta(seconds=float(timeout_s) + 30)
    kwargs = {"device_id": device} if device_type == "cuda" else {}
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout, **kwargs)
    try:
        job = {**job, "worker": worker, "world": world, "device_type": device_type, "timeout_s": float(timeout_s)}
        out = _run_worker(job, rank, device, local)
        out["host"] = os.uname().nodename
        results: list = [None] * world
        dist.all_gather_object(results, out)
    finally:
        dist.destroy_process_group()
    info = {"process_group": "nccl" if device_type == "cuda" else "gloo", "wall_s": round(time.monotonic() - start, 2),
            "threads_per_rank": results[0].get("threads"), "launcher": "torchrun", "rank": rank, "local_world_size": local_world}
    return results, info


def launch(worker: str, job: dict, world: int, device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[list[dict], dict]:
    """Run ``worker`` (``"package.module:function"``, see the module docstring) with ``job`` on
    ``world`` worker processes; return (each rank's result, info). Under torchrun this process is
    one of them (`launch_here`).

    Raises MeasurementError naming the failing worker, with its one-line error, or after ``timeout_s``.
    """
    import torch
    from torch.distributed import TCPStore

    if torchrun_rank() is not None:
        resolve_worker(worker)
        return launch_here(worker, job, world, device_type, timeout_s)

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
    resolve_worker(worker)  # a misnamed worker fails here, not once in every process
    workdir = Path(tempfile.mkdtemp(prefix="dreamshard-run-"))
    store = TCPStore("127.0.0.1", 0, None, True, timeout=_dt.timedelta(seconds=timeout_s + 30), wait_for_workers=False)
    job = {**job, "worker": worker, "world": world, "device_type": device_type, "store_port": store.port, "timeout_s": timeout_s}
    (workdir / "job.json").write_text(json.dumps(job))
    env = _worker_env(device_type, world)
    code = "from dreamshard.costs.runners.launch import _worker_main; _worker_main()"
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

    def __init__(self, device, distributed: bool = False) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self._sleep_cycles = 0
        # a one-element tensor that `start_together` all-reduces; None: one process, nothing to align
        self._token = torch.zeros(1, device=device) if distributed else None

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

    def start_together(self):
        """The mark that starts a timed collective: `start`'s sleep kernel, then a one-element
        all-reduce, which every rank's GPU leaves at about the same moment. Each rank's sleep is a
        count of its own GPU's clock cycles, and those clocks differ (boost): after the sleep alone
        the ranks start up to ~0.3 ms apart (measured on 4 × H100), and the first to start times
        the others' lateness as its collective."""
        self.start()
        if self._token is not None:
            import torch.distributed as dist

            dist.all_reduce(self._token)
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
    return _run_worker(job, rank, device, rank, before=lambda: _inject_fault(rank))


def _run_worker(job: dict, rank: int, device, gpu: int, before=None) -> dict:
    """The job's worker run as `rank` of the process group joined (launched or under torchrun):
    between two barriers of all ranks (each between syncs of the ranks' clocks; on CUDA on this
    rank's GPU index `gpu`), `before` run after the first; its result with the CPU threads and
    the device it ran on."""
    import torch
    import torch.distributed as dist

    clock = _Clock(device, distributed=True)

    def barrier() -> None:
        clock.sync()
        if job["device_type"] == "cuda":
            dist.barrier(device_ids=[gpu])
        else:
            dist.barrier()
        clock.sync()

    barrier()
    if before is not None:
        before()
    out = resolve_worker(job["worker"])(job, rank, job["world"], device, clock, barrier)
    barrier()
    out["threads"] = torch.get_num_threads() if job["device_type"] == "cpu" else None
    out["device"] = str(device)
    return out
