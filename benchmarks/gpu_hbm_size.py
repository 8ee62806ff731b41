"""Does a table's size in HBM change its kernel time? The Triton TBE's forward and backward of the
same lookups into tables of 0.25 to 16 GB (one table, and shards of 8 tables), measured by the
sequential runner beside the simulator's price — the compute calibration was fitted on tables far
smaller than the full pool's 24 GB shards (docs/tiers.md).

    PYTHONPATH=. python3 benchmarks/gpu_hbm_size.py --out $OUT                  # one GPU, ~3 min
    .venv/bin/python benchmarks/gpu_hbm_size.py --out /tmp/h --device cpu --quick   # logic check on a CPU

Writes OUT/summary.json (one row per case, as it goes) and OUT/report.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.bins import reuse_bins  # noqa: E402
from dreamshard.costs.runners import SequentialRunner  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.plan import Plan, Shard  # noqa: E402
from dreamshard.tables import TableSpec  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402

GB = 1 << 30


def cases(quick: bool) -> list[tuple[str, int, int, str, int]]:
    """(case, tables in the shard, dim, distribution, rows per table): the same lookups at every size."""
    if quick:
        return [("one", 1, 16, "uniform", r) for r in (1000, 20_000)] + [("eight", 8, 16, "uniform", r) for r in (1000, 4000)]
    out = []
    for dim, dist in ((64, "uniform"), (64, "zipf:1.0"), (16, "uniform"), (256, "uniform")):
        row_bytes = dim * 2
        out += [("one", 1, dim, dist, int(gb * GB / row_bytes)) for gb in (0.25, 1, 4, 8, 16)]
    out += [("eight", 8, 64, "uniform", int(gb * GB / 8 / 128)) for gb in (0.25, 2, 8, 16)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=400.0)
    args = ap.parse_args()
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernel = "triton" if args.device.startswith("cuda") else "torch"
    runner = SequentialRunner(kernel, device=args.device, warmup=3 if args.quick else 10, iters=3 if args.quick else 20, input_sets=3)
    sim = SimBackend()
    batch = 512 if args.quick else 65_536
    device = device_name(args.device)
    rows_out = []
    for case, n, dim, dist, rows in cases(args.quick):
        if time.monotonic() - t0 > args.budget_s:
            rows_out.append({"case": case, "skipped": "budget"})
            continue
        tables = [TableSpec(f"t{i}", rows, dim, 4.0, tuple(reuse_bins(rows, 4.0, dist)), distribution=dist, seed=i + 1) for i in range(n)]
        task = Task(tables, 1, 10**15, Workload(batch_size=batch))
        plan = Plan(task, [Shard(i, 0, 0, dim) for i in range(n)], "gpu_hbm_size")
        row = {"case": case, "tables": n, "dim": dim, "distribution": dist, "rows": rows, "shard_gb": round(sum(t.bytes() for t in tables) / GB, 3)}
        try:
            m = runner.evaluate_plan(plan)
            s = sim.evaluate_plan(plan)
            row |= {"fwd_ms": m.devices[0].fwd_comp_ms, "bwd_ms": m.devices[0].bwd_comp_ms, "sim_fwd_ms": s.devices[0].fwd_comp_ms, "sim_bwd_ms": s.devices[0].bwd_comp_ms}
        except Exception as e:  # noqa: BLE001 - one case's failure is reported, the others run
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows_out.append(row)
        atomic_write(out / "summary.json", json.dumps({"device": device, "kernel": kernel, "batch": batch, "rows": rows_out}, indent=1))
        print(f"[{time.monotonic() - t0:6.1f} s] {json.dumps(row)}", flush=True)
    atomic_write(out / "report.md", report(device, rows_out))
    print((out / "report.md").read_text())


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def report(device: str, rows: list[dict]) -> str:
    lines = [f"# A table's size in HBM and its kernel time ({device}; benchmarks/gpu_hbm_size.py)", "",
             "Same lookups (pooling 4, B as the summary says) at every size; measured ms (sequential runner, Triton TBE) and measured / simulated.", "",
             "| case | dim | distribution | shard GB | fwd ms | bwd ms | fwd / sim | bwd / sim |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "fwd_ms" in r:
            lines.append(f"| {r['case']} | {r['dim']} | {r['distribution']} | {r['shard_gb']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | "
                         f"{r['fwd_ms'] / r['sim_fwd_ms']:.3f} | {r['bwd_ms'] / r['sim_bwd_ms']:.3f} |")
        elif "error" in r:
            lines.append(f"| {r['case']} | {r.get('dim', '')} | {r.get('distribution', '')} | {r.get('shard_gb', '')} | error: {r['error'][:80]} | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
