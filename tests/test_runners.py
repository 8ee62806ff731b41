"""Cost measurement runners and the all-to-all model, for real on CPU (gloo, 2 processes)."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dreamshard.costs.base import CostReport
from dreamshard.costs.comm import KNEES, CommModel, alltoall_bytes, design_patterns, parse_sizes
from dreamshard.costs.kernels import available_kernels
from dreamshard.costs.runners import measure_distributed, measure_sequential
from dreamshard.costs.runners.launch import FAULT_ENV
from dreamshard.plan import Plan, save_plans
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "fbgemm" if "fbgemm" in available_kernels("cpu") else "torch"
B = 256

TABLES = [
    TableSpec(f"t{i}", rows=r, dim=d, pooling_factor=pf, distribution=f"zipf:{a}", seed=i)
    for i, (r, d, pf, a) in enumerate([(5000, 16, 4.0, 1.1), (20000, 32, 8.0, 0.9), (1000, 8, 0.0, 1.0), (30000, 64, 2.0, 1.2), (800, 4, 12.0, 0.7)])
]


def small_plan(devices=2, placement=(0, 1, 1, 0, 1)) -> Plan:
    return Plan.table_wise(Task(list(TABLES), devices, 10**9), list(placement), "manual")


def check_report(r: CostReport, devices: int) -> None:
    assert len(r.devices) == devices
    assert r.overall_ms == max(d.total_ms for d in r.devices)
    for d in r.devices:
        for v in (d.fwd_comp_ms, d.fwd_comm_ms, d.bwd_comm_ms, d.bwd_comp_ms):
            assert math.isfinite(v) and v > 0


# --------------------------------------------------------------------------------------------
# Real measurements
# --------------------------------------------------------------------------------------------


def test_distributed_cpu_real_kernels():
    r = measure_distributed(small_plan(), KERNEL, B, warmup=2, iters=10, timeout_s=120)
    check_report(r, 2)
    assert r.runner == "distributed" and r.backend == KERNEL and not r.comm_modelled
    assert r.e2e_ms is not None and math.isfinite(r.e2e_ms) and r.e2e_ms > 0
    assert r.hardware.startswith("CPU") and r.details["process_group"] == "gloo"
    assert r.details["dim_sums"] == [80, 44] and r.details["iters"] == 10
    assert "distributed runner" in r.source
    # the JSON round trip keeps every number
    again = CostReport.from_json(json.loads(json.dumps(r.to_json())))
    assert again.overall_ms == r.overall_ms and again.e2e_ms == r.e2e_ms


def test_distributed_empty_shard_and_batch_check():
    plan = small_plan(3, (0, 0, 0, 2, 2))  # device 1 holds no table: zero-width outputs
    with pytest.raises(ValueError, match="multiple of the 3 devices"):
        measure_distributed(plan, KERNEL, 256)
    r = measure_distributed(plan, KERNEL, 255, warmup=1, iters=10, timeout_s=120)
    assert r.details["dim_sums"] == [56, 0, 68]
    empty = r.devices[1]
    assert empty.fwd_comp_ms < 0.5 and empty.bwd_comp_ms < 0.5  # nothing to compute
    assert empty.fwd_comm_ms > 0 and empty.bwd_comm_ms > 0  # but it takes part in the all-to-alls
    assert r.overall_ms == max(d.total_ms for d in r.devices)


def test_sequential_with_comm_model(tmp_path):
    model = CommModel(latency_ms=0.05, bandwidth_GBps=2.0, hardware="test", date="today", process_group="gloo")
    model.save(tmp_path / "comm.json")
    r = measure_sequential(small_plan(), KERNEL, B, comm_model=str(tmp_path / "comm.json"), warmup=1, iters=10)
    check_report(r, 2)
    assert r.comm_modelled and r.runner == "sequential" and r.e2e_ms is None
    assert r.details["comm_model"] == str(tmp_path / "comm.json")
    assert "comm modelled" in r.source
    send, recv = alltoall_bytes([80, 44], B, 2)
    assert [d.fwd_comm_ms for d in r.devices] == pytest.approx(model.predict(send, recv))
    assert [d.bwd_comm_ms for d in r.devices] == pytest.approx(model.predict(recv, send))
    # one device: no all-to-all at all, and no comm model needed
    one = measure_sequential(small_plan(1, (0,) * 5), "torch", B, warmup=1, iters=10)
    assert one.devices[0].fwd_comm_ms == 0 and one.devices[0].bwd_comm_ms == 0 and one.devices[0].fwd_comp_ms > 0


def test_sequential_uses_shipped_cpu_model():
    r = measure_sequential(small_plan(), "torch", 64, warmup=1, iters=10)
    assert r.details["comm_model"].endswith("cpu_gloo.json")
    shipped = CommModel.load(r.details["comm_model"])
    assert shipped.hardware and shipped.date and shipped.process_group == "gloo" and shipped.measurements


def test_sequential_measures_a_processes_first_gpu_shard_once_untimed(monkeypatch):
    """The first shard a process times on a GPU ran ~1.5x slow after its own warm-up steps (H200):
    it is measured once more before anything counts, once per process and device, never on CPU."""
    from dreamshard.costs.runners import sequential
    from dreamshard.tasks import Workload

    calls = []
    monkeypatch.setattr(sequential, "_WARMED", set())
    monkeypatch.setattr(sequential.SequentialRunner, "_measure_shard", lambda self, shard, *a: calls.append([t.name for t in shard]) or ([1.0], [2.0]))
    shards = [[], [TABLES[0], TABLES[1]], [TABLES[3]]]
    gpu = sequential.SequentialRunner("torch", device="cuda", comm_model=CommModel.load(ROOT / "dreamshard/data/comm/cpu_gloo.json"))
    report = gpu.evaluate(shards, Workload(B))
    assert calls == [["t0", "t1"], ["t0", "t1"], ["t3"]]  # the first non-empty shard twice
    assert [d.fwd_comp_ms for d in report.devices] == [0.0, 1.0, 1.0]
    calls.clear()
    gpu.evaluate(shards, Workload(B))
    assert calls == [["t0", "t1"], ["t3"]]  # once per process
    calls.clear()
    sequential.SequentialRunner("torch", device="cpu").evaluate([[TABLES[0]]], Workload(B))
    assert calls == [["t0"]]


# --------------------------------------------------------------------------------------------
# Failures: a clear error, quickly, never a hang
# --------------------------------------------------------------------------------------------


def test_worker_that_raises(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "raise:1")
    # no clock here: had the launcher missed the error, the workers would time out after 120 s
    # with another message, which the match refuses (a busy machine cannot trip this)
    with pytest.raises(RuntimeError, match="worker 1 of 2 raised RuntimeError: injected fault in worker 1"):
        measure_distributed(small_plan(), KERNEL, B, warmup=1, iters=10, timeout_s=120)


def test_worker_that_dies(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "exit:0")
    with pytest.raises(RuntimeError, match="worker 0 of 2 died with exit code 3"):
        measure_distributed(small_plan(), KERNEL, B, warmup=1, iters=10, timeout_s=120)


def test_worker_that_hangs(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "hang:1")
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"measurement timed out after 8 s"):
        measure_distributed(small_plan(), KERNEL, B, warmup=1, iters=10, timeout_s=8)
    assert 8 <= time.monotonic() - t < 300  # killed at its timeout: the upper bound only catches a hang, not a busy machine


# --------------------------------------------------------------------------------------------
# The all-to-all model
# --------------------------------------------------------------------------------------------


def test_alltoall_bytes():
    send, recv = alltoall_bytes([100, 0, 60, 40], 1024, 2)
    assert send[0] == 1024 * 100 * 2 * 3 / 4 and recv[0] == 256 * (0 + 60 + 40) * 2
    assert send[1] == 0 and recv[1] == 256 * 200 * 2
    assert sum(send) == pytest.approx(sum(recv))  # every byte sent is received once
    assert alltoall_bytes([64], 1024, 2) == ([0.0], [0.0])


@pytest.mark.parametrize("serial", [0.0, 0.5, 1.0])
def test_comm_fit_recovers_known_model(serial):
    truth = CommModel(latency_ms=0.03, bandwidth_GBps=150.0, serial_fraction=serial)
    rng = np.random.default_rng(0)
    pts = []
    for _, chunks in design_patterns(4, [2**k for k in range(10, 28, 2)]):
        for d in range(4):
            s = chunks[d] * 3 * 2  # to each of the 3 others, 2-byte elements
            r = (sum(chunks) - chunks[d]) * 2
            pts.append((s, r, truth.predict(s, r)))
    exact = CommModel.fit(pts)
    assert exact.latency_ms == pytest.approx(0.03, rel=1e-6)
    assert exact.bandwidth_GBps == pytest.approx(150.0, rel=1e-6)
    assert exact.serial_fraction == serial
    noisy = CommModel.fit([(s, r, t * rng.lognormal(0, 0.03)) for s, r, t in pts])
    assert noisy.latency_ms == pytest.approx(0.03, rel=0.1)
    assert noisy.bandwidth_GBps == pytest.approx(150.0, rel=0.1)
    assert noisy.fit_details["median_rel_error"] < 0.05


def test_comm_fit_recovers_coupling_and_knee():
    """Points with their patterns (as `measure_comm` records them): a model whose devices wait for
    the busiest one, with a slower rate below a knee, is fitted back from its own predictions."""
    truth = CommModel(latency_ms=0.01, bandwidth_GBps=350.0, serial_fraction=0.25, coupling=0.9, knee_bytes=float(KNEES[12]), knee_bandwidth_GBps=200.0)
    pts = []
    for shape, chunks in design_patterns(4, [2**k for k in range(14, 29, 2)]):
        for direction in ("fwd", "bwd"):
            for rank in range(4):
                p = {"op": "all_to_all", "pattern": shape, "chunks_bytes": [c * 2 for c in chunks], "direction": direction, "rank": rank}
                pts.append({**p, "ms": truth.point_ms(p)})
    fit = CommModel.fit(pts)
    assert (fit.serial_fraction, fit.coupling) == (0.25, 0.9) and fit.knee_bytes == truth.knee_bytes
    assert fit.latency_ms == pytest.approx(0.01, rel=1e-6) and fit.bandwidth_GBps == pytest.approx(350.0, rel=1e-6)
    assert fit.knee_bandwidth_GBps == pytest.approx(200.0, rel=1e-6) and fit.fit_details["max_rel_error"] < 1e-9
    # the busiest device sets everyone's time: in a heavy pattern the light ranks take as long
    heavy = [p for p in pts if p["pattern"] == "heavy" and p["direction"] == "fwd" and max(p["chunks_bytes"]) == 2**28]
    assert max(p["ms"] for p in heavy) / min(p["ms"] for p in heavy) < 1.1


def test_comm_model_files(tmp_path):
    m = CommModel.fit([(1e3, 1e3, 0.1), (1e6, 1e6, 0.2), (1e7, 1e7, 1.1)], hardware="h", date="d", process_group="gloo")
    m.save(tmp_path / "m.json")
    again = CommModel.load(tmp_path / "m.json")
    assert again.predict(5e5, 2e5) == pytest.approx(m.predict(5e5, 2e5))
    assert again.path == str(tmp_path / "m.json") and not list(tmp_path.glob("*.tmp"))
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a dreamshard.comm/1 file"):
        CommModel.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="at least 2"):
        CommModel.fit([(1, 1, 1.0)])
    assert parse_sizes("256,4KB,1MB") == [256, 4096, 1 << 20]
    with pytest.raises(ValueError):
        parse_sizes("12XB")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def cli(*args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "dreamshard.cli", *map(str, args)], capture_output=True, text=True, env=env, timeout=240)


def test_measure_json_cli(tmp_path):
    save_plans([small_plan()], tmp_path / "p.json")
    out = tmp_path / "report.json"
    r = cli("measure", tmp_path / "p.json", "--backend", KERNEL, "--runner", "distributed", "--batch-size", B, "--iters", 10, "--warmup", 1, "--json", "--out", out)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # nothing but the JSON on stdout
    saved = json.loads(out.read_text())  # the file is complete JSON
    assert report["overall_ms"] == saved["overall_ms"] == max(d["total_ms"] for d in report["devices"])
    assert report["runner"] == "distributed" and report["backend"] == KERNEL and report["e2e_ms"] > 0
    assert report["batch_size"] == B and report["precision"] == "fp16" and report["hardware"].startswith("CPU")
    assert not list(tmp_path.glob("*.tmp"))


def invoke(*args):
    from click.testing import CliRunner

    from dreamshard.cli import cli as dreamshard_cli

    return CliRunner().invoke(dreamshard_cli, [str(a) for a in args], catch_exceptions=False)


def test_measure_cli_table_and_errors(tmp_path, monkeypatch):
    save_plans([small_plan()], tmp_path / "p.json")
    r = invoke("measure", tmp_path / "p.json", "--backend", "torch", "--runner", "sequential", "--batch-size", 128, "--iters", 10, "--warmup", 1)
    assert r.exit_code == 0, r.output
    assert "overall" in r.stdout and "comm modelled" in r.stdout and "fwd" in r.stdout
    assert json.loads((tmp_path / "p.cost-torch-sequential.json").read_text())["comm_modelled"] is True
    r = invoke("measure", tmp_path / "p.json", "--backend", "torch", "--batch-size", 127)
    assert r.exit_code == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    monkeypatch.setenv(FAULT_ENV, "raise:0")
    r = invoke("measure", tmp_path / "p.json", "--backend", "torch", "--batch-size", 128, "--iters", 10, "--timeout", 60)
    assert r.exit_code == 1 and "injected fault" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.cost-torch-distributed.json").exists() and not list(tmp_path.glob("*.tmp"))


def test_calibrate_comm_cli(tmp_path):
    r = invoke("calibrate", "comm", "--out", tmp_path / "c.json", "--sizes", "256,64KB,1MB", "--iters", 5, "--warmup", 1)
    assert r.exit_code == 0, r.output
    m = CommModel.load(tmp_path / "c.json")
    assert m.bandwidth_GBps > 0 and m.latency_ms >= 0 and m.process_group == "gloo" and m.devices == 2
    a2a = [p for p in m.measurements if p["op"] == "all_to_all" and p["set"] == "fit"]
    assert len(a2a) == 3 * 4 * 2 * 2  # sizes × (balanced, heavy, idle, random: 2 ranks) × (fwd, bwd) × ranks
    assert {p["op"] for p in m.measurements} == {"all_to_all", "reduce_scatter", "all_gather", "relayout"}
    assert set(m.fit_details["held_out"]) == {"all_to_all", "reduce_scatter", "all_gather", "relayout"}
    assert m.reduce_scatter and m.all_gather and m.relayout
    assert "held-out all-to-all" in r.output


@pytest.mark.parametrize("error", ["oom", "other"])
def test_shard_that_cannot_run_says_why(monkeypatch, error):
    """A shard too large for the device is reported as such, not as the precision's fault (whose
    advice, fp32, would need twice the memory); another failure of fp16 keeps that advice."""
    import torch

    from dreamshard.costs import kernels
    from dreamshard.costs.runners.distributed import build_checked_tbe
    from dreamshard.validation import MeasurementError

    def failing(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.63 GiB") if error == "oom" else RuntimeError("no fp16 here")

    monkeypatch.setattr(kernels, "make_tbe", failing)
    expected = "do not fit in the memory of cpu" if error == "oom" else "does not run fp16 on cpu .* rerun with --precision fp32"
    with pytest.raises(MeasurementError, match=expected):
        build_checked_tbe(KERNEL, TABLES[:2], "fp16", "sgd", "cpu")


def test_shard_larger_than_the_hosts_memory_fails_at_once(monkeypatch):
    """Host tiers beyond the machine's RAM: one line before anything is built."""
    from dreamshard.costs.runners import distributed
    from dreamshard.tiers import HBM, Tier
    from dreamshard.validation import MeasurementError

    def no_build(*args, **kwargs):
        raise AssertionError("built a TBE for a shard that cannot fit")

    monkeypatch.setattr("dreamshard.costs.kernels.make_tbe", no_build)
    monkeypatch.setattr(distributed.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1000}[name])  # a 4 MB machine
    big = TableSpec("big", rows=10_000_000, dim=64, pooling_factor=2.0)
    with pytest.raises(MeasurementError, match=r"need 1\.3 GB of pinned host memory; this machine has 0\.0 GB"):
        distributed.build_checked_tbe(KERNEL, [TABLES[0], big], "fp16", "sgd", "cpu", tiers=[HBM, Tier("uvm")])
