"""benchmarks/gpu_tiers.py's fits on data of known terms, and its parts 2 and 3 on a CPU (--quick)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dreamshard.costs.host import HostLink

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_tiers.py"


@pytest.fixture(scope="module")
def gpu_tiers():
    spec = importlib.util.spec_from_file_location("gpu_tiers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_tlb_finds_the_page_in_the_sparse_gathers(gpu_tiers):
    """Gathers made by a link of known reach, miss cost and page: the fit gives them back, the page
    from the sparse sorted gathers (the dense ones, made here with another page, touch every page
    whatever its size: on a GPU they cannot tell it)."""
    truth = HostLink(tlb_reach_bytes=0.8e9, tlb_miss_ns=25.0, tlb_page_bytes=256 * 1024)
    other = HostLink(tlb_reach_bytes=0.8e9, tlb_miss_ns=25.0, tlb_page_bytes=2 << 20)
    sizes, k = gpu_tiers.TABLE_SIZES, gpu_tiers.SPARSE_ROWS
    grid = {}
    for t in sizes:
        grid[t] = {}
        for b in (32, 128, 512):
            rows = (64 << 20) // b
            base_ns = b / 40.0  # 40 GB/s from a table within the TLB's reach
            random_ns = base_ns + truth.tlb_ms(rows, t, False) * 1e6 / rows
            sorted_ns = base_ns + other.tlb_ms(rows, t, True) * 1e6 / rows
            grid[t][b] = {"rows": rows, "read_GBps": b / random_ns, "sorted_read_GBps": b / sorted_ns}
    sparse = {t: 4.0 + truth.tlb_ms(k, t, True) * 1e6 / k for t in sizes}
    fit = gpu_tiers.fit_tlb(grid, sparse, k)
    assert fit["tlb_page_bytes"] == truth.tlb_page_bytes and gpu_tiers.fit_tlb(grid)["tlb_page_bytes"] == other.tlb_page_bytes
    assert fit["tlb_reach_bytes"] == pytest.approx(truth.tlb_reach_bytes, rel=0.03)
    assert fit["tlb_miss_ns"] == pytest.approx(truth.tlb_miss_ns, rel=0.05)


def test_parts_2_and_3_on_a_cpu_fit_a_host_entry_and_refit_it(tmp_path):
    """The quick run writes a host entry with the uvm and translation terms; --refit on its summary
    gives the same entry again."""
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--device", "cpu", "--out", str(out), "--skip", "1,4,5,6,7"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    first = json.loads((out / "host_link.json").read_text())
    for key in ("uvm_window_bytes", "uvm_repeat_share", "uvm_efficiency", "uvm_backward_scale", "tlb_page_bytes"):
        assert key in first
    HostLink.from_json(first)  # a calibration's host entry as it is
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["host_link"]["sparse_sorted_ns"]) >= 2 and len(summary["host_link"]["sparse_sorted_write_ns"]) >= 2 and summary["host_fit"]["uvm_points"]
    refit = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--refit"], capture_output=True, text=True, timeout=600)
    assert refit.returncode == 0, refit.stderr[-2000:]
    assert json.loads((out / "host_link.json").read_text()) == first
    assert "The uvm forward and backward" in (out / "report.md").read_text()
