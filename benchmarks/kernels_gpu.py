"""H200 benchmark of the fused Triton TBE against the per-table torch path (docs/kernels.md).

    PYTHONPATH=. python3 benchmarks/kernels_gpu.py --out $OUT [--sweep] [--quick]

1. hardware and versions; device copy bandwidth (large D2D copy, bytes read + written);
2. DLRM-like shards (B = 65,536, fp16): 10, 25 and 50 tables with dims from {4..128}, and
   shards whose dims are all >= 32; rows log-uniform 1e3..1e7, heavy-tailed pooling factors
   (mean ~15), zipf-like row popularity (dreamshard.synth's pool and streams when present);
3. correctness of triton against torch on each shard before timing (forward output and the
   weight update of one SGD step);
4. medians of triton.testing.do_bench (L2 flushed before every repetition): triton fwd/bwd,
   torch fwd/bwd; bytes-moved floor of the forward (rows gathered + indices/offsets read + output
   written) and the fraction of copy bandwidth reached; fwd+bwd speedup over torch.
Writes kernels_gpu.json and kernels_gpu.md under --out and prints the table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dreamshard.costs.kernels import make_tbe  # noqa: E402
from dreamshard.costs.kernels.base import init_table_  # noqa: E402

B = 65_536
DIMS = (4, 8, 16, 32, 64, 128)


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------------------------------------------
# shards
# ------------------------------------------------------------------------------------------------


def synth_tables(n: int, seed: int, min_dim: int, max_rows: int = 10_000_000):
    """[(rows, dim, pooling, alpha or spec)], from dreamshard.synth when it is there."""
    try:
        from dreamshard.synth import PoolConfig, synth_pool

        pool = synth_pool(PoolConfig(tables=max(4 * n, 200), seed=seed))
        pool = [t for t in pool if 1_000 <= t.rows <= max_rows and t.dim >= min_dim]
        if len(pool) >= n:
            return pool[:n], "dreamshard.synth"
    except Exception as e:  # noqa: BLE001
        log(f"dreamshard.synth unavailable ({type(e).__name__}: {e}); generating in the script")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(10 ** rng.uniform(3, math.log10(max_rows)))
        dim = int(rng.choice([d for d in DIMS if d >= min_dim]))
        pf = float(rng.lognormal(0, 1.2))
        out.append(dict(rows=rows, dim=dim, pooling_factor=pf, alpha=float(rng.uniform(0.6, 1.35)), seed=seed * 1000 + i))
    mean = np.mean([t["pooling_factor"] for t in out])
    for t in out:
        t["pooling_factor"] *= 15.0 / mean
    return out, "script"


def make_batch(tables, source: str, device):
    if source == "dreamshard.synth":
        from dreamshard.streams import shard_batch

        return shard_batch(tables, B, step=0, device=device)
    lengths, indices = [], []
    for t in tables:
        g = torch.Generator(device=device).manual_seed(t["seed"])
        ln = torch.poisson(torch.full((B,), t["pooling_factor"], device=device), generator=g).long()
        n = int(ln.sum())
        u = torch.rand(n, device=device, dtype=torch.float64, generator=g)
        e = 1 - t["alpha"]
        rank = torch.floor((u * ((t["rows"] + 1.0) ** e - 1) + 1) ** (1 / e)) - 1
        rank = rank.clamp_(0, t["rows"] - 1).long()
        indices.append((rank * (2_147_483_647 % t["rows"]) + t["seed"]) % t["rows"])
        lengths.append(ln)
    ln = torch.cat(lengths)
    offsets = torch.zeros(ln.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(ln, 0, out=offsets[1:])
    return torch.cat(indices), offsets


def spec(t, key):
    return t[key] if isinstance(t, dict) else getattr(t, key)


# ------------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------------


def bench(fn, rep_ms: float = 300, warmup_ms: float = 50) -> float:
    if not torch.cuda.is_available():  # CPU smoke test of this script (TRITON_INTERPRET=1)
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


_SLEEP_CYCLES_PER_MS = None


def bench_device(fn, reps: int = 50) -> float:
    """Median device time of fn (ms) with the host ahead of the GPU: a sleep kernel first holds the
    stream while the host enqueues every repetition (an L2 flush, then fn between two events), so
    the events see the GPU's work without the gaps in which it waits for the host to launch the
    next kernel. This is how the runners time a step (dreamshard.costs.runners.launch); in a
    training step the host also runs ahead. do_bench's time (``bench``) includes those gaps, which
    dominate backwards of a few hundred microseconds (about ten launches and torch ops each)."""
    global _SLEEP_CYCLES_PER_MS
    if not torch.cuda.is_available():
        return bench(fn)
    fn()
    torch.cuda.synchronize()
    if _SLEEP_CYCLES_PER_MS is None:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        _SLEEP_CYCLES_PER_MS = 10_000_000 / a.elapsed_time(b)
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    # the host's time to enqueue one repetition, measured with the GPU busy: sizes the sleep
    torch.cuda._sleep(int(_SLEEP_CYCLES_PER_MS * 50))
    t0 = time.perf_counter()
    for _ in range(3):
        cache.zero_()
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3 / 3
    torch.cuda.synchronize()
    torch.cuda._sleep(int(_SLEEP_CYCLES_PER_MS * (1.5 * reps * host_ms + 5)))
    for i in range(reps):
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return float(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)))


def copy_bandwidth(device) -> float:
    n = 1 << 31 if device.type == "cuda" else 1 << 24  # 2 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device=device)
    a.random_(0, 255)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a), rep_ms=200)
    del a, b
    return 2 * n / (ms * 1e-3)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = b.norm().item()
    return float("inf") if not torch.isfinite(a).all() else (a - b).norm().item() / max(den, 1e-30)


def check_shard(tri, ref, indices, offsets, grad) -> dict:
    """triton vs torch: forward, and one SGD step's weight update (both start from the same seeded init)."""
    tri.poison_outputs = True
    o_tri, o_ref = tri.forward(indices, offsets), ref.forward(indices, offsets)
    tri.poison_outputs = False
    fwd_err = rel(o_tri, o_ref)
    tri.backward(grad)
    ref.backward(grad)
    num = den = 0.0
    for t in range(tri.num_tables):
        # fp16 values and their differences are exact in fp32; in blocks of rows, so that a 10^8-row
        # table needs no fp32 copies of itself
        w0_all = init_table_(torch.empty_like(ref.weights(t)), ref.seed, t)
        step = max(1, (1 << 24) // tri.dims[t])
        for r0 in range(0, tri.rows[t], step):
            w0 = w0_all[r0:r0 + step].float()
            w_ref = ref.weights(t)[r0:r0 + step].float()
            num += (tri.weights(t)[r0:r0 + step].float() - w_ref).norm().item() ** 2
            den += (w_ref - w0).norm().item() ** 2
        del w0_all
    return {"fwd_rel_err": fwd_err, "update_rel_err": math.sqrt(num) / max(math.sqrt(den), 1e-30)}


def fwd_floor_bytes(dims, offsets, batch, elt=2) -> float:
    bounds = offsets[::batch].tolist()
    gathered = sum((bounds[t + 1] - bounds[t]) * d * elt for t, d in enumerate(dims))
    n = bounds[-1]
    return gathered + n * 8 + offsets.numel() * 8 + batch * sum(dims) * elt


def run_shard(name, tables, source, device, bw, args, results, tri_kwargs=None):
    rows = [int(spec(t, "rows")) for t in tables]
    dims = [int(spec(t, "dim")) for t in tables]
    indices, offsets = make_batch(tables, source, device)
    n = indices.numel()
    lr = 0.01
    tri = make_tbe("triton", rows, dims, precision="fp16", optimizer="sgd", lr=lr, device=device, seed=1)
    ref = make_tbe("torch", rows, dims, precision="fp16", optimizer="sgd", lr=lr, device=device, seed=1)
    grad = (torch.randn(B, sum(dims), device=device) * 0.1).half()
    t0 = time.time()
    chk = check_shard(tri, ref, indices, offsets, grad)
    log(f"[{name}] T={len(rows)} lookups={n / 1e6:.1f}M sum_dim={sum(dims)} weights={sum(r * d for r, d in zip(rows, dims)) * 2 / 1e9:.2f} GB "
        f"check fwd {chk['fwd_rel_err']:.1e} update {chk['update_rel_err']:.1e} ({time.time() - t0:.1f}s) crossing={tri.last_backward_stats}")
    ok = chk["fwd_rel_err"] < 2e-3 and chk["update_rel_err"] < 1e-2
    floor = fwd_floor_bytes(dims, offsets, B)
    r = {"shard": name, "tables": len(rows), "dims": dims, "rows": rows, "lookups": n, "sum_dim": sum(dims),
         "mean_pooling": n / (B * len(rows)), "check": chk, "check_ok": ok, "fwd_floor_bytes": floor}
    r["triton_fwd_ms"] = bench(lambda: tri.forward(indices, offsets))
    tri.forward(indices, offsets)
    r["triton_bwd_ms"] = bench(lambda: tri.backward(grad))
    r["triton_bwd_device_ms"] = bench_device(lambda: tri.backward(grad))
    r["torch_fwd_ms"] = bench(lambda: ref.forward(indices, offsets), rep_ms=300 if not args.quick else 100)
    ref.forward(indices, offsets)
    r["torch_bwd_ms"] = bench(lambda: ref.backward(grad), rep_ms=600 if not args.quick else 150, warmup_ms=1)
    if args.baseline and max(dims) <= 256:  # the kernel before the range-based backward, same inputs
        from baseline_triton_tbe_v4 import TritonTBE as V4

        old = V4(rows, dims, precision="fp16", optimizer="sgd", lr=lr, device=device, seed=1)
        r["v4_fwd_ms"] = bench(lambda: old.forward(indices, offsets))
        old.forward(indices, offsets)
        r["v4_bwd_ms"] = bench(lambda: old.backward(grad))
        r["v4_bwd_device_ms"] = bench_device(lambda: old.backward(grad))
        r["speedup_fwd_bwd_over_v4"] = (r["v4_fwd_ms"] + r["v4_bwd_ms"]) / (r["triton_fwd_ms"] + r["triton_bwd_ms"])
        # the same with both backwards by device time (the forwards, long enough to be GPU-bound, by do_bench)
        r["speedup_fwd_bwd_over_v4_device"] = (r["v4_fwd_ms"] + r["v4_bwd_device_ms"]) / (r["triton_fwd_ms"] + r["triton_bwd_device_ms"])
        log(f"[{name}] before (v4): fwd {r['v4_fwd_ms']:.3f} bwd {r['v4_bwd_ms']:.3f} ms (device {r['v4_bwd_device_ms']:.3f}); "
            f"fwd+bwd now {r['speedup_fwd_bwd_over_v4']:.2f}x faster ({r['speedup_fwd_bwd_over_v4_device']:.2f}x by device time)")
        del old
    keys = torch.randint(0, sum(rows), (n,), device=device, dtype=torch.int32)
    r["sort_ms"] = bench(lambda: torch.sort(keys, stable=True), rep_ms=100)
    r["floor_ms"] = floor / bw * 1e3
    r["fwd_frac_of_copy_bw"] = r["floor_ms"] / r["triton_fwd_ms"]
    r["speedup_fwd"] = r["torch_fwd_ms"] / r["triton_fwd_ms"]
    r["speedup_bwd"] = r["torch_bwd_ms"] / r["triton_bwd_ms"]
    r["speedup_fwd_bwd"] = (r["torch_fwd_ms"] + r["torch_bwd_ms"]) / (r["triton_fwd_ms"] + r["triton_bwd_ms"])
    log(f"[{name}] triton fwd {r['triton_fwd_ms']:.3f} ms ({100 * r['fwd_frac_of_copy_bw']:.0f}% of copy bw; floor {r['floor_ms']:.3f}) "
        f"bwd {r['triton_bwd_ms']:.3f} (device {r['triton_bwd_device_ms']:.3f}; sort alone {r['sort_ms']:.3f}) | torch fwd {r['torch_fwd_ms']:.3f} bwd {r['torch_bwd_ms']:.3f} | "
        f"speedup fwd+bwd {r['speedup_fwd_bwd']:.1f}x")
    if args.profile and name in args.profile.split(","):
        r["profile"] = profile_bwd(tri, indices, offsets, grad, args.out, name)
    if args.sweep and name in args.sweep_fwd.split(","):
        r["sweep_fwd"] = sweep(rows, dims, indices, offsets, grad, device, floor, bw, FWD_VARIANTS, backward=False)
    if args.sweep and name in args.sweep_bwd.split(","):
        r["sweep_bwd"] = sweep(rows, dims, indices, offsets, grad, device, floor, bw, BWD_VARIANTS, backward=True)
    results.append(r)
    del tri, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()


def profile_bwd(tri, indices, offsets, grad, out_dir, name) -> str:
    """Per-kernel device time of the triton forward + backward (torch.profiler), printed and saved."""
    from torch.profiler import ProfilerActivity, profile

    tri.forward(indices, offsets)
    tri.backward(grad)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            tri.forward(indices, offsets)
            tri.backward(grad)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    try:
        table = ka.table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=60)
    except Exception:  # noqa: BLE001  (older name of the column)
        table = ka.table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60)
    log(f"[{name}] profile of 3 x (triton fwd + bwd):\n{table}")
    with open(os.path.join(out_dir, "profile.txt"), "a") as f:
        f.write(f"== {name}\n{table}\n")
    return table


FWD_VARIANTS = [dict(fwd_lanes=l, fwd_unroll=u, fwd_warps=w) for l, u, w in
                [(512, 4, 4), (1024, 2, 4), (1024, 8, 4), (2048, 4, 4), (2048, 4, 8), (4096, 4, 8)]]
# backward tunables against the defaults ({}): warps per tile program, lookups per level-0 tile
# (bwd_lanes / column-block width), widest column block, entries per tile of the levels above
# the backward's paths: as shipped, the sorted path alone, the product path wherever a table may take it;
# the tiles with int64 offsets everywhere, and narrow tiles shaped as wide ones (64 lookups, 4 warps), as before the narrow tiles;
# narrow tiles of 16 lookups, of 2 warps, and of 64 lookups in 2 warps (the shapes today's default was chosen against)
# (the tile sweeps of docs/kernels.md used warps 2, bwd_lanes 2048/8192, bwd_max_tw 64/128, bwd_up_lanes 4096)
BWD_VARIANTS = [{}, dict(bwd_dense=0), dict(bwd_dense=float("inf")), dict(bwd_i32=False), dict(bwd_narrow_pmax=64, bwd_narrow_warps=4),
                dict(bwd_narrow_pmax=16), dict(bwd_narrow_warps=2), dict(bwd_narrow_pmax=64, bwd_narrow_warps=2)]


def sweep(rows, dims, indices, offsets, grad, device, floor, bw, variants, backward: bool):
    from dreamshard.costs.kernels.triton_tbe import TritonTBE

    out = []
    for kw in variants:
        t0 = time.time()
        tri = TritonTBE(rows, dims, precision="fp16", optimizer="sgd", device=device, seed=1, **kw)
        f = bench(lambda: tri.forward(indices, offsets), rep_ms=150)
        tri.forward(indices, offsets)
        b = bench_device(lambda: tri.backward(grad)) if backward else None  # device time: the GPU work
        dense = tri.last_backward_stats.get("dense_tables") if backward else None
        out.append({**kw, "fwd_ms": f, "bwd_ms": b, "fwd_frac": floor / bw * 1e3 / f, "dense_tables": dense})
        log(f"   sweep {kw}: fwd {f:.3f} ms ({100 * floor / bw * 1e3 / f:.0f}%)" + (f" bwd {b:.3f} ms, {dense} tables by product" if b else "")
            + f" [{time.time() - t0:.1f}s]")
        del tri
    return out


def main() -> None:
    global B
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/kernels_gpu")
    ap.add_argument("--sweep", action="store_true", help="also time tile/unroll/warp variants of the triton kernel")
    ap.add_argument("--sweep-fwd", default="", help="shards whose forward variants --sweep times")
    ap.add_argument("--sweep-bwd", default="25t-mixed,25t-dim>=32", help="shards whose backward variants --sweep times")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions of the slow torch path")
    ap.add_argument("--baseline", action="store_true", help="also time the kernel before the range-based backward")
    ap.add_argument("--profile", default="", help="shards (comma-separated names) whose triton fwd+bwd is profiled per kernel")
    ap.add_argument("--shards", default="10,25,50,d32-10,d32-25,d32u-25")
    ap.add_argument("--batch", type=int, default=65_536)
    ap.add_argument("--max-rows", type=int, default=10_000_000, help="rows are log-uniform in [1e3, this]")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke test of this script under TRITON_INTERPRET=1")
    args = ap.parse_args()
    B = args.batch
    os.makedirs(args.out, exist_ok=True)
    import triton

    device = torch.device(args.device)
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        hw = {"gpu": torch.cuda.get_device_name(device), "sms": p.multi_processor_count, "mem_gb": p.total_memory / 2**30}
    else:
        hw = {"gpu": "none (cpu smoke test)"}
    hw |= {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__, "python": platform.python_version()}
    log("hardware:", json.dumps(hw))
    bw = copy_bandwidth(device)
    hw["copy_bw_TBps"] = bw / 1e12
    log(f"device copy bandwidth: {bw / 1e12:.2f} TB/s (read + write)")
    results = []
    for s in args.shards.split(","):
        # "25": dims from {4..128}; "d32-25": dims >= 32; "d32u-25": dims >= 32 and uniform row popularity
        # (no reuse: every gathered row comes from DRAM, the honest test of the forward's bytes floor)
        kind = s.split("-")[0] if "-" in s else ""
        min_dim = 32 if kind.startswith("d32") else 4
        uniform = kind.endswith("u")
        n = int(s.split("-")[-1])
        t0 = time.time()
        tables, source = synth_tables(n, seed=n + min_dim, min_dim=min_dim, max_rows=args.max_rows)
        if uniform:
            tables = [dataclasses.replace(t, distribution="uniform") if not isinstance(t, dict) else {**t, "alpha": 1e-9} for t in tables]
        log(f"shard {s}: {n} tables from {source} ({time.time() - t0:.1f}s)")
        name = f"{n}t" + ("-dim>=32" if min_dim == 32 else "-mixed") + ("-uniform" if uniform else "")
        run_shard(name, tables, source, device, bw, args, results)
    summary = {"hardware": hw, "batch": B, "precision": "fp16", "optimizer": "sgd", "source": source, "results": results,
               "command": "PYTHONPATH=. python3 benchmarks/kernels_gpu.py " + " ".join(sys.argv[1:]).replace(args.out, "$OUT")}
    with open(os.path.join(args.out, "kernels_gpu.json"), "w") as f:
        json.dump(summary, f, indent=1)
    lines = [
        f"{hw['gpu']}, torch {hw['torch']}, CUDA {hw['cuda']}, triton {hw['triton']}; copy bandwidth {bw / 1e12:.2f} TB/s; B={B}, fp16, exact SGD",
        "",
        "| shard | tables | lookups | sum dim | fwd floor ms | triton fwd ms | % copy bw | triton bwd ms | torch fwd ms | torch bwd ms | fwd+bwd speedup | check fwd / update |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['shard']} | {r['tables']} | {r['lookups'] / 1e6:.1f}M | {r['sum_dim']} | {r['floor_ms']:.3f} | {r['triton_fwd_ms']:.3f} | "
            f"{100 * r['fwd_frac_of_copy_bw']:.0f}% | {r['triton_bwd_ms']:.3f} | {r['torch_fwd_ms']:.3f} | {r['torch_bwd_ms']:.2f} | "
            f"{r['speedup_fwd_bwd']:.1f}x | {r['check']['fwd_rel_err']:.1e} / {r['check']['update_rel_err']:.1e} {'ok' if r['check_ok'] else 'FAIL'} |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "kernels_gpu.md"), "w") as f:
        f.write(table + "\n")
    log("")
    log(table)


if __name__ == "__main__":
    main()
