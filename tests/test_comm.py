"""The comm models: which shipped model prices a plan, the copies around the row-wise exchange,
the campaign's report and its script (dreamshard/costs/comm.py, benchmarks/gpu_comm.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dreamshard.costs.comm import (
    DATA_DIR,
    CommModel,
    bytes_ms,
    default_model_path,
    describe_choice,
    relayout_ms,
    shipped_models,
)
from dreamshard.costs.runners import DistributedRunner
from dreamshard.costs.sim import SimBackend
from dreamshard.tables import TableSpec
from dreamshard.tasks import Workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_comm"


def test_the_shipped_model_of_the_plans_device_count():
    """The GPU's model of the plan's device count; else the nearest count (the larger on a tie);
    else another GPU's; and the note says which."""
    models = shipped_models()
    assert {("h100", 2), ("h100", 4), ("h200", 2), ("h200", 4)} <= set(models)
    assert default_model_path("cuda", 2, "h100").name == "h100_nccl_2gpu.json"
    assert default_model_path("cuda", 4, "h100").name == "h100_nccl_4gpu.json"
    assert default_model_path("cuda", 3, "h100").name == "h100_nccl_4gpu.json"  # a tie: the larger
    assert default_model_path("cuda", 8, "h100").name == "h100_nccl_4gpu.json"
    assert describe_choice(default_model_path("cuda", 8, "h100"), 8, "h100") == "fitted on 4 devices, the nearest count shipped to 8"
    path = default_model_path("cuda", 2, "b200")  # no model of that GPU: the nearest count of another
    assert path.name == "h100_nccl_2gpu.json" and describe_choice(path, 2, "b200") == "fitted on H100, none shipped for B200"
    assert describe_choice(path, 2, "h100") == "" and describe_choice(Path("/tmp/mine.json"), 8, "h100") == ""
    assert default_model_path("cpu").name == "cpu_gloo.json"


def test_the_simulator_prices_comm_with_the_shipped_model_of_each_device_count():
    sim = SimBackend()  # an H200 calibration: the H200 models; 8 devices: the 4-device one, said so
    for devices in (2, 4, 8):
        path = default_model_path("cuda", devices, "h200")
        comm = sim.comm_for(devices)
        assert path.name.startswith("h200_") and {k: comm[k] for k in ("latency_ms", "bandwidth_GBps", "coupling")} == {k: getattr(CommModel.load(path), k) for k in ("latency_ms", "bandwidth_GBps", "coupling")}
        assert comm["source"] == path.name + (" (fitted on 4 devices, the nearest count shipped to 8)" if devices == 8 else "")
    t = [TableSpec(f"t{i}", 10_000, 64, 5.0, seed=i) for i in range(4)]
    two, four = sim.evaluate([t[:2], t[2:]]), sim.evaluate([[x] for x in t])
    assert two.devices[0].fwd_comm_ms != pytest.approx(four.devices[0].fwd_comm_ms)


def test_the_copies_fit_per_direction_and_kind_of_column():
    """fit_relayout recovers each direction's latency and its two rates from points made by them,
    and relayout_ms prices a device's copies so; a bad fit is refused in one line."""
    from dreamshard.costs.comm import copies_ms, fit_relayout, relayout_problem

    true = {"fwd": {"latency_ms": 0.007, "a2a_GBps": 1700.0, "row_GBps": 1000.0}, "bwd": {"latency_ms": 0.011, "a2a_GBps": 1600.0, "row_GBps": 750.0}}
    pts = [{"op": "relayout", "direction": d, "a2a_cols": a, "row_cols": r, "rows": 65536, "bytes": 2 * 65536 * (a + r) * 2,
            "ms": float(copies_ms(true, d, 2 * 65536 * a * 2, 2 * 65536 * r * 2))} for d in ("fwd", "bwd") for a, r in ((16, 4), (128, 16), (512, 64), (1024, 512))]
    fit = fit_relayout(pts)
    for d in ("fwd", "bwd"):
        assert {k: fit[d][k] for k in true[d]} == pytest.approx(true[d], rel=1e-6)
    assert fit["max_rel_error"] < 1e-9
    fwd, bwd = relayout_ms({"relayout": fit}, [100, 0], [20, 0], 1000, 2)
    assert bwd[0] == pytest.approx(0.011 + 2 * 1000 * 100 * 2 / 1.6e9 + 2 * 1000 * 20 * 2 / 0.75e9) and bwd[1] == 0.0
    assert list(fwd) == pytest.approx([fwd[0]] * 2) and fwd[0] > 0.007
    assert relayout_problem({**fit, "bwd": {**fit["bwd"], "row_GBps": 0.0}}) == "bwd.row_GBps must be a finite number > 0, got 0.0"
    assert relayout_problem(fit) is None


def test_the_copies_cost_every_device_the_slowest_forward_and_its_own_backward():
    fit = {"latency_ms": 0.01, "bandwidth_GBps": 1000.0}
    comm = {"relayout": fit}
    fwd, bwd = relayout_ms(comm, [100, 400, 0], [20, 20, 0], 1000, 2)
    own = [bytes_ms(fit, 2 * 1000 * (a + r) * 2) for a, r in ((100, 20), (400, 20))]
    assert list(bwd) == pytest.approx([*own, 0.0])  # a device without row shards copies nothing
    assert list(fwd) == pytest.approx([own[1]] * 3)  # the collectives after the copies wait for the slowest
    assert [list(x) for x in relayout_ms({}, [1], [1], 10, 2)] == [[0.0], [0.0]]  # no fit: not priced
    knee = {"latency_ms": 0.0, "bandwidth_GBps": 2.0, "knee_bytes": 1e6, "knee_bandwidth_GBps": 1.0}
    assert bytes_ms(knee, 3e6) == pytest.approx(1e6 / 1e6 + 2e6 / 2e6)


def test_many_placements_in_one_start_of_the_processes():
    """`evaluate_many`: one launch measures every placement; each report its own."""
    t = [TableSpec(f"t{i}", 500, 8, 2.0, seed=i) for i in range(4)]
    runner = DistributedRunner("torch", "cpu", warmup=0, iters=1, input_sets=2)
    reports = runner.evaluate_many([[t[:1], t[1:]], [t[:3], t[3:]]], Workload(64, "fp32"))
    assert [r.details["dim_sums"] for r in reports] == [[8, 24], [24, 8]]
    assert all(r.e2e_ms > 0 and r.details["e2e_launch_ms"] > 0 for r in reports)
    with pytest.raises(ValueError, match="one device count"):
        runner.evaluate_many([[t[:1], t[1:]], [t]], Workload(64, "fp32"))


def test_the_campaign_report_reprints_the_committed_tables():
    """benchmarks/comm_report.py on the committed campaign files: the committed report, number for
    number (the shipped models are these files' fits)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import comm_report
    finally:
        sys.path.pop(0)
    text = comm_report.report([RESULTS / "h100_x4", RESULTS / "h100_x2"], RESULTS / "h100_x1_rows", ROOT / "dreamshard/data/calibrations/h100_triton_large_shards.json")
    assert text == (RESULTS / "report.md").read_text()
    text = comm_report.report([RESULTS / "h200_x4", RESULTS / "h200_x2"], None, ROOT / "dreamshard/data/calibrations/h200_triton_large_shards.json",
                              DATA_DIR / "h200_nccl_2gpu.json")
    assert text == (RESULTS / "report_h200.md").read_text()
    for gpu, D, call, coupling in (("h100", 2, "h100_x2", 0.2), ("h100", 4, "h100_x4", 0.9), ("h200", 2, "h200_x4", 0.0), ("h200", 4, "h200_x4", 0.9)):
        shipped = CommModel.load(DATA_DIR / f"{gpu}_nccl_{D}gpu.json")
        raw = CommModel.load(RESULTS / call / f"{gpu}_nccl_{D}gpu.json")
        assert shipped.measurements == raw.measurements and shipped.fit_details["held_out"]["all_to_all"]["median_rel_error"] < 0.07
        assert np.isclose(shipped.coupling, coupling)


@pytest.mark.long
def test_campaign_script_on_cpu(tmp_path):
    """benchmarks/gpu_comm.py --cpu --quick: calibrates 2 gloo ranks and measures one plan of each
    kind, shrunk, with both runners."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_comm.py"), "--out", str(tmp_path), "--cpu", "--quick", "--devices", "2"],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)  # a hang guard only
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    result = json.loads((tmp_path / "campaign_cpu.json").read_text())
    kinds = {p["notes"][-1] for p in result["plans"]}
    assert {"kind table-wise", "kind columns", "kind rows"} <= kinds
    assert all(p["distributed"]["e2e_ms"] > 0 and p["sequential"]["comm_modelled"] for p in result["plans"])
    assert CommModel.load(tmp_path / "cpu_gloo_2gpu.json").relayout
