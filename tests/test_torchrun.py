"""`dreamshard measure` under torchrun: two "nodes" of two gloo processes each on localhost measure
a plan of 4 devices as the one-command launch does, rank 0 alone writing the report, of the same
shape."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import invoke
from dreamshard.costs.runners.launch import torchrun_rank
from dreamshard.plan import Plan
from dreamshard.plan import save_plans
from dreamshard.tables import NUM_BINS, TableSpec
from dreamshard.tasks import Task, Workload

TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    bins = tuple([1.0 / NUM_BINS] * NUM_BINS)
    tables = [TableSpec(f"t{i}", 2_000 + 500 * i, 16, 2.0, bins, seed=i) for i in range(6)]
    plan = Plan.table_wise(Task(tables, 4, 10**9, Workload(64, "fp32")), [0, 1, 2, 3, 1, 0], "hand")
    path = tmp_path_factory.mktemp("torchrun") / "plan.json"
    save_plans([plan], path)
    return path


def test_not_under_torchrun_here(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert torchrun_rank() is None
    monkeypatch.setenv("RANK", "1"), monkeypatch.setenv("WORLD_SIZE", "4"), monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2"), monkeypatch.setenv("MASTER_ADDR", "127.0.0.1"), monkeypatch.setenv("MASTER_PORT", "1")
    assert torchrun_rank() == (1, 4, 1, 2)


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")
def test_measure_under_torchrun_two_nodes(plan_file, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "report.json"
    args = ["measure", str(plan_file), "--backend", "torch", "--device", "cpu", "--batch-size", "64", "--iters", "2", "--warmup", "1", "--json", "--out", str(out)]
    procs = [subprocess.Popen([TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "dreamshard.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
             for n in (0, 1)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert outs[1][0].strip() == ""  # rank 1 measured but writes nothing
    report = json.loads(outs[0][0])
    assert report["runner"] == "distributed" and report["details"]["launcher"] == "torchrun" and report["details"]["process_group"] == "gloo"
    assert len(report["devices"]) == 4 and report["details"]["local_world_size"] == 2 and all(d["fwd_comm_ms"] > 0 and d["bwd_comp_ms"] > 0 for d in report["devices"])
    assert json.loads(out.read_text())["overall_ms"] == report["overall_ms"]
    # the one-command launch of the same plan gives a report of the same shape
    r = invoke(*args[:-2], "--out", tmp_path / "local.json")
    assert r.exit_code == 0, r.stderr
    local = json.loads(r.stdout)
    assert set(local) == set(report) and set(local["devices"][0]) == set(report["devices"][0])
    assert set(local["details"]) | {"launcher", "local_world_size"} == set(report["details"])


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")
def test_torchrun_world_must_be_the_plans_devices(plan_file, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([TORCHRUN, "--nnodes", "1", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "dreamshard.cli",
                        "measure", str(plan_file), "--backend", "torch", "--device", "cpu", "--batch-size", "64", "--out", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=240)
    assert p.returncode != 0
    assert "error: the plan has 4 devices, but torchrun started 1 processes (--nnodes × --nproc-per-node must be 4)" in p.stderr
