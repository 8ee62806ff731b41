"""Check that the sequential runner's GPU timings are the GPU's work, not the host's (docs/simulator.md).

    PYTHONPATH=. python3 benchmarks/timing_check.py --out $OUT

For designed shards of 1 to 64 tables: the host time to enqueue one forward and one backward
(perf_counter, GPU busy), which must stay under the runner's slack (runners.launch.HOST_SLACK_MS),
and the runner's medians with the default slack and with 4x the slack, which must agree. Writes
timing_check.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.calibrate import design_shards  # noqa: E402
from dreamshard.costs.runners import launch  # noqa: E402
from dreamshard.costs.runners.distributed import build_checked_tbe  # noqa: E402
from dreamshard.costs.runners.sequential import SequentialRunner  # noqa: E402
from dreamshard.streams import shard_batch  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402


def host_enqueue_ms(tables, batch: int) -> tuple[float, float]:
    """Host time to enqueue a forward and a backward while the GPU is kept busy (max of 5)."""
    dev = torch.device("cuda", 0)
    tbe = build_checked_tbe("triton", tables, "fp16", "sgd", dev)
    ix, off = shard_batch(tables, batch, step=0, device=dev)
    grad = torch.zeros(batch, tbe.total_dim, dtype=tbe.dtype, device=dev)
    fwd, bwd = [], []
    for _ in range(6):
        for phase, times in ((lambda: tbe.forward(ix, off), fwd), (lambda: tbe.backward(grad), bwd)):
            torch.cuda.synchronize()
            torch.cuda._sleep(20_000_000)  # ~10 ms: the GPU stays busy through the enqueue
            t0 = time.perf_counter()
            phase()
            times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return max(fwd[1:]), max(bwd[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/timing_check")
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--batch", type=int, default=65_536)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shards = design_shards(args.shards, seed=3, max_bytes=16 * 10**9)
    shards = sorted(shards, key=len)
    slack = launch.HOST_SLACK_MS
    rows = []
    for tables in shards:
        hf, hb = host_enqueue_ms(tables, args.batch)
        times = {}
        for mult in (1, 4):
            launch.HOST_SLACK_MS = slack * mult
            d = SequentialRunner("triton", device="cuda").evaluate([tables], Workload(args.batch)).devices[0]
            times[mult] = (d.fwd_comp_ms, d.bwd_comp_ms)
        launch.HOST_SLACK_MS = slack
        row = {"tables": len(tables), "host_fwd_ms": round(hf, 3), "host_bwd_ms": round(hb, 3),
               "fwd_ms": round(times[1][0], 4), "bwd_ms": round(times[1][1], 4),
               "fwd_ms_4x_slack": round(times[4][0], 4), "bwd_ms_4x_slack": round(times[4][1], 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    worst_host = max(max(r["host_fwd_ms"], r["host_bwd_ms"]) for r in rows)
    worst_diff = max(max(abs(r["fwd_ms"] / r["fwd_ms_4x_slack"] - 1), abs(r["bwd_ms"] / r["bwd_ms_4x_slack"] - 1)) for r in rows)
    summary = {"slack_ms": slack, "worst_host_enqueue_ms": worst_host, "worst_change_with_4x_slack": round(worst_diff * 100, 2), "shards": rows}
    print(f"worst host enqueue {worst_host:.3f} ms (slack {slack} ms); worst change with 4x slack {worst_diff * 100:.1f}%")
    with open(os.path.join(args.out, "timing_check.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
