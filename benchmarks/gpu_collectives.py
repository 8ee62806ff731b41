"""Reduce-scatter and all-gather on GPUs, beside the all-to-all: the row-wise exchange's comm model (issue 13).

    PYTHONPATH=. python3 benchmarks/gpu_collectives.py --out $OUT          # 2 GPUs (NCCL), ~1-2 min, under 5
    PYTHONPATH=. python3 benchmarks/gpu_collectives.py --out /tmp/x --cpu  # tiny dry run here: gloo, 2 processes

No torchrun: like the distributed runner, it starts one worker process per GPU itself
(``dreamshard.costs.comm.measure_collectives`` through ``runners/launch.py``), each in a NCCL process
group, and for every full-buffer size N (fp16; 4 KB … 256 MB by factors of 4) times a balanced
``all_to_all_single``, a ``reduce_scatter_single``/``reduce_scatter_tensor`` (N in, N/D out, sum) and an
``all_gather_single``/``all_gather_into_tensor`` (N/D in, N out): barrier, CUDA events around the
op, median of ``--iters`` after ``--warmup``; each op's result is checked once.

Writes
  - ``$OUT/gpu_collectives.json``: hardware, versions, every point (op, bytes, rank, ms), the fit of
    t = latency + N·(D−1)/D / bandwidth per op (relative least squares, ``comm.fit_collective``) on
    the per-size time of the slowest rank, and per size the measured time beside the prediction of
    the fit and of the rule the simulator uses until then (derived from the shipped all-to-all model,
    ``comm.collective_ms``);
  - ``$OUT/collectives_fit.json``: ``{"reduce_scatter": {...}, "all_gather": {...}}`` — add these two
    keys to ``dreamshard/data/comm/<gpu>_nccl.json`` and to the calibration's ``comm`` entry to use them;
  - the comparison table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # mandatory on our H200 machines (workers get it too)
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard.costs.comm import COLLECTIVES, collective_ms, default_model_path, fit_collective, load_comm_model, measure_collectives  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402

OPS = ("all_to_all", *COLLECTIVES)
GPU_SIZES = [4 << 10 << (2 * k) for k in range(9)]  # 4 KB … 256 MB
CPU_SIZES = [1 << 10, 16 << 10, 256 << 10]


def slowest(points: list[dict]) -> dict[tuple[str, int], float]:
    """(op, buffer bytes) → the slowest rank's median ms: the collective ends when its last rank does."""
    out: dict[tuple[str, int], float] = {}
    for p in points:
        key = (p["op"], p["buffer_bytes"])
        out[key] = max(out.get(key, 0.0), p["ms"])
    return out


def analyse(points: list[dict], devices: int, device_type: str) -> dict:
    times = slowest(points)
    fits = {}
    for op in OPS:
        pts = [{"buffer_bytes": b, "devices": devices, "ms": t} for (o, b), t in sorted(times.items()) if o == op]
        try:
            fits[op] = fit_collective(pts)
        except ValueError as e:  # too few or too flat points (tiny CPU runs): say so, keep the rest
            fits[op] = {"error": str(e)}
    shipped = load_comm_model(None, device_type)
    rows = []
    for (op, b), t in sorted(times.items()):
        row = {"op": op, "buffer_bytes": b, "measured_ms": t}
        if op in COLLECTIVES:
            row["derived_rule_ms"] = collective_ms(shipped.params() | {op: None}, op, b, devices)
        if "latency_ms" in fits[op]:
            row["fit_ms"] = fits[op]["latency_ms"] + (b * (devices - 1) / devices) / (fits[op]["bandwidth_GBps"] * 1e6)
        rows.append(row)
    return {"fits": fits, "comparison": rows, "derived_from": {"path": str(default_model_path(device_type)), "fit": shipped.describe()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true", help="dry run: gloo on CPU processes, tiny sizes")
    ap.add_argument("--devices", type=int, default=None, help="GPUs to use [default: every visible one; 2 with --cpu]")
    ap.add_argument("--iters", type=int, default=None, help="timed runs per op and size [default 20; 3 with --cpu]")
    ap.add_argument("--warmup", type=int, default=None, help="untimed runs first [default 5; 1 with --cpu]")
    ap.add_argument("--timeout-s", type=float, default=270.0, help="kill the workers after this long (the whole run stays under 5 min)")
    args = ap.parse_args(argv)
    import torch

    from dreamshard.costs.hardware import describe_hardware, software_versions

    device_type = "cpu" if args.cpu else "cuda"
    devices = args.devices or (2 if args.cpu else torch.cuda.device_count())
    if devices < 2:
        print(f"needs 2 or more {'processes' if args.cpu else 'GPUs'}, found {devices}", file=sys.stderr)
        return 2
    iters = args.iters or (3 if args.cpu else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 5)
    sizes = CPU_SIZES if args.cpu else GPU_SIZES
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    points, info = measure_collectives(devices, sizes, device_type, iters, warmup, OPS, args.timeout_s)
    result = {"hardware": describe_hardware(device_type, devices), "versions": software_versions(), "devices": devices,
              "process_group": info["process_group"], "dtype": "fp16", "iters": iters, "warmup": warmup, "sizes": sizes,
              "statistic": "median over iters per rank; per size the slowest rank", "points": points,
              **analyse(points, devices, device_type), "wall_s": round(time.monotonic() - start, 1)}
    atomic_write(out / "gpu_collectives.json", json.dumps(result, indent=1))
    atomic_write(out / "collectives_fit.json", json.dumps({k: result["fits"][k] for k in COLLECTIVES}, indent=1))
    print(f"{result['hardware']}, {info['process_group']}, {devices} devices, {result['wall_s']} s")
    print(f"{'op':<15}{'buffer':>12}{'measured ms':>14}{'fit ms':>10}{'rule ms':>10}")
    for r in result["comparison"]:
        fit = f"{r['fit_ms']:.4f}" if "fit_ms" in r else "-"
        rule = f"{r['derived_rule_ms']:.4f}" if "derived_rule_ms" in r else "-"
        print(f"{r['op']:<15}{r['buffer_bytes']:>12,}{r['measured_ms']:>14.4f}{fit:>10}{rule:>10}")
    for op, f in result["fits"].items():
        print(f"{op}: " + (f"{f['latency_ms'] * 1e3:.1f} µs + ring bytes / {f['bandwidth_GBps']:.1f} GB/s (median rel. error {f['median_rel_error']:.1%})" if "latency_ms" in f else f["error"]))
    print(f"wrote {out / 'gpu_collectives.json'} and {out / 'collectives_fit.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
