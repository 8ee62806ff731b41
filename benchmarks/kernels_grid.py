"""Single-table grid of the fused Triton TBE on a GPU (docs/kernels.md, "Backward on every table shape").

    PYTHONPATH=. python3 benchmarks/kernels_grid.py --out $OUT [--baseline] [--only 0,5,9] [--quick]

Each entry is one table (rows 10^2..10^8, dims 4..1,024 with odd multiples of 4, pooling 1..300,
uniform or zipf 1.0..1.3, so hits per touched row run from ~1 to > 10,000), B = 65,536, fp16
weights, exact SGD, index stream from dreamshard.streams (Poisson bag lengths). Per entry:
  - a correctness check before timing: triton against torch, forward output and the weights after
    one SGD step, from the same seeded init (relative errors);
  - medians of triton.testing.do_bench (L2 flushed before each repetition) of the triton forward
    and backward, the torch path's, and (--baseline) the kernel before the range-based backward;
    and the triton backward's device time (kernels_gpu.bench_device: the host enqueues ahead of the
    GPU, as in the runners and a training step, so host launch gaps are left out);
  - bytes: forward = lookups * (elt*dim + 8) + offsets + B*dim*elt (gather each row, read its
    index, write the output); backward = lookups * (elt*dim + 16) + 2 * distinct * dim * elt
    (gather each lookup's gradient row, read its index and write one sorted key, read and write
    each touched row); both against the copy bandwidth measured in the same run.
Prints the table and the kernel's targets; writes kernels_grid.json and kernels_grid.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernels_gpu import BWD_VARIANTS, bench, bench_device, check_shard, copy_bandwidth, log, profile_bwd  # noqa: E402

from dreamshard.costs.kernels import make_tbe  # noqa: E402
from dreamshard.streams import shard_batch  # noqa: E402
from dreamshard.tables import TableSpec  # noqa: E402

B = 65_536
ELT = 2  # fp16

# (rows, dim, pooling factor, distribution); the first seven are the reference tables of docs/kernels.md
GRID = [
    (1_302, 192, 69, "zipf:1.16"), (37_724, 192, 91.6, "zipf:1.28"), (6_193, 64, 188, "zipf:1.045"),
    (1_000, 256, 50, "uniform"), (100_000, 128, 30, "zipf:1.1"), (10_000_000, 128, 30, "zipf:1.1"),
    (1_000_000, 32, 100, "zipf:1.05"),
    # cold: huge tables, rows hit about once
    (100_000_000, 16, 1, "uniform"), (100_000_000, 64, 2, "zipf:1.0"), (50_000_000, 128, 1, "zipf:1.05"),
    (10_000_000, 4, 10, "uniform"), (10_000_000, 12, 5, "zipf:1.1"), (20_000_000, 24, 3, "uniform"),
    (10_000_000, 48, 20, "zipf:1.2"), (1_000_000, 96, 8, "uniform"), (1_000_000, 1024, 2, "uniform"),
    (1_000_000, 320, 4, "zipf:1.1"), (3_000_000, 384, 1, "zipf:1.0"),
    # warm: tens of hits per row
    (100_000, 8, 20, "zipf:1.0"), (100_000, 16, 50, "uniform"), (300_000, 64, 10, "zipf:1.2"),
    (100_000, 192, 15, "zipf:1.1"), (200_000, 512, 5, "zipf:1.05"), (100_000, 1000, 3, "uniform"),
    (50_000, 24, 100, "zipf:1.0"), (10_000, 320, 30, "uniform"), (10_000, 12, 300, "zipf:1.3"),
    (20_000, 48, 60, "zipf:1.15"),
    # hot: a few hundred or thousand rows read millions of times
    (100, 4, 1, "uniform"), (100, 64, 10, "uniform"), (100, 1024, 20, "zipf:1.0"), (500, 8, 300, "zipf:1.2"),
    (300, 96, 100, "uniform"), (1_000, 384, 50, "zipf:1.1"), (2_000, 128, 150, "zipf:1.3"), (200, 32, 250, "uniform"),
    (5_000, 16, 40, "zipf:1.05"), (3_000, 48, 200, "uniform"), (800, 256, 80, "zipf:1.2"), (150, 512, 30, "uniform"),
    (1_000, 1024, 10, "zipf:1.0"), (400, 24, 150, "zipf:1.25"), (2_500, 12, 80, "uniform"),
    # in between
    (1_000_000, 8, 40, "zipf:1.1"), (1_000_000, 4, 5, "zipf:1.3"), (30_000_000, 32, 10, "zipf:1.2"),
    (100_000_000, 4, 3, "zipf:1.3"), (10_000_000, 256, 8, "zipf:1.15"), (400_000, 768, 6, "zipf:1.2"),
]


def baseline_tbe(rows, dims, device):
    """The kernel before the range-based backward (benchmarks/baseline_triton_tbe_v4.py), dims <= 256."""
    if max(dims) > 256:
        return None
    from baseline_triton_tbe_v4 import TritonTBE as V4

    return V4(rows, dims, precision="fp16", optimizer="sgd", lr=0.01, device=device, seed=1)


def run_entry(i, entry, device, bw, args) -> dict:
    rows, dim, pf, dist = entry
    table = TableSpec(name=f"g{i}", rows=rows, dim=dim, pooling_factor=pf, distribution=dist, seed=1000 + i)
    indices, offsets = shard_batch([table], B, step=0, device=device)
    n = indices.numel()
    counts = torch.bincount(indices, minlength=1) if rows <= 50_000_000 else torch.unique(indices, return_counts=True)[1]
    distinct = int((counts > 0).sum())
    max_hits = int(counts.max()) if n else 0
    del counts
    tri = make_tbe("triton", [rows], [dim], precision="fp16", optimizer="sgd", lr=0.01, device=device, seed=1)
    ref = make_tbe("torch", [rows], [dim], precision="fp16", optimizer="sgd", lr=0.01, device=device, seed=1)
    grad = (torch.randn(B, dim, device=device) * 0.1).half()
    chk = check_shard(tri, ref, indices, offsets, grad)
    ok = chk["fwd_rel_err"] < 2e-3 and chk["update_rel_err"] < 1e-2
    r = {"rows": rows, "dim": dim, "pooling": pf, "distribution": dist, "lookups": n, "distinct": distinct,
         "hits_per_row": n / max(distinct, 1), "max_hits": max_hits, "check": chk, "check_ok": ok}
    r["fwd_bytes"] = n * (ELT * dim + 8) + offsets.numel() * 8 + B * dim * ELT
    r["bwd_bytes"] = n * (ELT * dim + 16) + 2 * distinct * dim * ELT
    rep = 100 if args.quick else 250
    r["triton_fwd_ms"] = bench(lambda: tri.forward(indices, offsets), rep_ms=rep)
    r["triton_fwd_device_ms"] = bench_device(lambda: tri.forward(indices, offsets))
    tri.forward(indices, offsets)
    r["triton_bwd_ms"] = bench(lambda: tri.backward(grad), rep_ms=rep)
    r["triton_bwd_device_ms"] = bench_device(lambda: tri.backward(grad))
    del tri
    if not args.no_torch:
        r["torch_fwd_ms"] = bench(lambda: ref.forward(indices, offsets), rep_ms=rep)
        r["torch_fwd_device_ms"] = bench_device(lambda: ref.forward(indices, offsets))
        ref.forward(indices, offsets)
        r["torch_bwd_ms"] = bench(lambda: ref.backward(grad), rep_ms=rep, warmup_ms=1)
        r["torch_bwd_device_ms"] = bench_device(lambda: ref.backward(grad), reps=10)
    del ref
    if args.baseline:
        old = baseline_tbe([rows], [dim], device)
        if old is not None:
            r["v4_fwd_ms"] = bench(lambda: old.forward(indices, offsets), rep_ms=rep)
            r["v4_fwd_device_ms"] = bench_device(lambda: old.forward(indices, offsets))
            old.forward(indices, offsets)
            r["v4_bwd_ms"] = bench(lambda: old.backward(grad), rep_ms=rep)
            r["v4_bwd_device_ms"] = bench_device(lambda: old.backward(grad))
            del old
    r["fwd_frac"] = r["fwd_bytes"] / (r["triton_fwd_ms"] * 1e-3) / bw
    r["bwd_frac"] = r["bwd_bytes"] / (r["triton_bwd_ms"] * 1e-3) / bw
    r["bwd_device_frac"] = r["bwd_bytes"] / (r["triton_bwd_device_ms"] * 1e-3) / bw
    r["bwd_over_fwd"] = r["triton_bwd_ms"] / r["triton_fwd_ms"]
    log(f"[{i:2d}] rows {rows:>11,} dim {dim:4d} pf {pf:5.1f} {dist:10s} lookups {n / 1e6:6.2f}M distinct {distinct:>10,} "
        f"hits/row {r['hits_per_row']:8.1f} max {max_hits:>9,} | fwd {r['triton_fwd_ms']:.3f} ms {100 * r['fwd_frac']:4.0f}% "
        f"bwd {r['triton_bwd_ms']:.3f} ms {100 * r['bwd_frac']:4.0f}% device {r['triton_bwd_device_ms']:.3f} ms {100 * r['bwd_device_frac']:4.0f}% | torch {r.get('torch_fwd_ms', float('nan')):.3f}/"
        f"{r.get('torch_bwd_ms', float('nan')):.3f} | v4 {r.get('v4_fwd_ms', float('nan')):.3f}/{r.get('v4_bwd_ms', float('nan')):.3f} | "
        f"check {chk['fwd_rel_err']:.0e}/{chk['update_rel_err']:.0e} {'ok' if ok else 'FAIL'}")
    del indices, offsets, grad
    torch.cuda.empty_cache()
    return r


def sweep_entry(i, entry, device) -> list[dict]:
    """Backward device time of the tuning variants (kernels_gpu.BWD_VARIANTS) on one entry (no torch, no checks)."""
    from dreamshard.costs.kernels.triton_tbe import TritonTBE

    rows, dim, pf, dist = entry
    table = TableSpec(name=f"g{i}", rows=rows, dim=dim, pooling_factor=pf, distribution=dist, seed=1000 + i)
    indices, offsets = shard_batch([table], B, step=0, device=device)
    grad = (torch.randn(B, dim, device=device) * 0.1).half()
    from dreamshard.costs.paths import dense_us, sparse_us

    out = []
    for kw in BWD_VARIANTS:
        tbe = TritonTBE([rows], [dim], precision="fp16", optimizer="sgd", device=device, seed=1, **kw)
        tbe.forward(indices, offsets)
        ms = bench_device(lambda: tbe.backward(grad))
        out.append({**kw, "bwd_ms": ms, "dense_tables": tbe.last_backward_stats["dense_tables"]})
        del tbe
    n = indices.numel()
    model = (float(dense_us(n, rows, dim, B, 2)), float(sparse_us(n, dim, 2)))  # the backward's model of the two paths (us)
    for r in out:
        r["model_product_sorted_us"] = model
    log(f"sweep [{i:2d}] rows {rows} dim {dim} lookups {n / 1e6:.2f}M model product / sorted {model[0]:.0f} / {model[1]:.0f} us: "
        + " ".join(f"{r['bwd_ms']:.3f}{'d' if r['dense_tables'] else ''}" for r in out))
    return out


def targets(results) -> list[str]:
    """The kernel's targets, each with the entries that miss it: by do_bench's time (host launch gaps
    included) and by device time (the host ahead, as the runners and a training step run)."""
    big = [r for r in results if r["dim"] >= 32 and r["bwd_bytes"] >= 100e6]
    small = [r for r in results if r["dim"] < 32]
    lines = []
    for key, what in (("bwd_frac", "do_bench"), ("bwd_device_frac", "device time")):
        fr = [r[key] for r in results if key in r]
        if not fr:
            continue
        lines += [
            f"[{what}] backward >= 30% of copy bw on dim >= 32 entries moving >= 100 MB: {sum(r[key] >= 0.30 for r in big)}/{len(big)}"
            f" (min {100 * min(r[key] for r in big):.0f}%)" if big else "no dim >= 32 entry moves 100 MB",
            f"[{what}] backward >= 15% on dims < 32: {sum(r[key] >= 0.15 for r in small)}/{len(small)}"
            f" (min {100 * min(r[key] for r in small):.0f}%)" if small else "no dim < 32 entry",
            f"[{what}] median backward over the grid: {100 * statistics.median(fr):.0f}% of copy bw (target >= 40%)",
        ]
    for tag, fwd, bwd in (("do_bench", "fwd_ms", "bwd_ms"), ("device time", "fwd_device_ms", "bwd_device_ms")):
        timed = [r for r in results if "torch_" + bwd in r]
        if timed:
            slower = [r["entry"] for r in timed if r["triton_" + fwd] > r["torch_" + fwd] or r["triton_" + bwd] > r["torch_" + bwd]]
            ratio = [r["torch_" + bwd] / r["triton_" + bwd] for r in timed]
            lines.append(f"[{tag}] entries where triton fwd or bwd is slower than torch: {slower or 'none'}; torch backward / triton "
                         f"backward: min {min(ratio):.1f}x, median {statistics.median(ratio):.1f}x, max {max(ratio):.1f}x")
        old = [r for r in results if "v4_" + bwd in r]
        if old:
            worst = max(r["triton_" + fwd] / r["v4_" + fwd] for r in old)
            lines.append(f"[{tag}] forward against the kernel before (v4), worst ratio: {worst:.3f} (target <= 1.03); "
                         f"backward speedup over v4: median {statistics.median(r['v4_' + bwd] / r['triton_' + bwd] for r in old):.1f}x")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/kernels_grid")
    ap.add_argument("--only", default="", help="comma-separated entry numbers")
    ap.add_argument("--baseline", action="store_true", help="also time the kernel before the range-based backward (dims <= 256)")
    ap.add_argument("--no-torch", action="store_true", help="skip timing the torch path (it is still the correctness reference)")
    ap.add_argument("--quick", action="store_true", help="shorter timing windows")
    ap.add_argument("--profile", default="", help="comma-separated entries whose triton backward is profiled per kernel first")
    ap.add_argument("--sweep", default="", help="comma-separated entries whose backward is timed for tuning variants first")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import triton

    device = torch.device("cuda")
    p = torch.cuda.get_device_properties(device)
    hw = {"gpu": torch.cuda.get_device_name(device), "sms": p.multi_processor_count, "torch": torch.__version__,
          "cuda": torch.version.cuda, "triton": triton.__version__, "python": platform.python_version()}
    bw = copy_bandwidth(device)
    hw["copy_bw_TBps"] = bw / 1e12
    log("hardware:", json.dumps(hw))
    for i in map(int, filter(None, args.profile.split(","))):
        rows, dim, pf, dist = GRID[i]
        table = TableSpec(name=f"g{i}", rows=rows, dim=dim, pooling_factor=pf, distribution=dist, seed=1000 + i)
        indices, offsets = shard_batch([table], B, step=0, device=device)
        tri = make_tbe("triton", [rows], [dim], precision="fp16", optimizer="sgd", device=device, seed=1)
        profile_bwd(tri, indices, offsets, (torch.randn(B, dim, device=device) * 0.1).half(), args.out, f"grid entry {i}")
        del tri, indices, offsets
    if args.sweep:
        log("sweep variants: " + " | ".join(str(kw) for kw in BWD_VARIANTS))
        sweeps = {i: sweep_entry(i, GRID[i], device) for i in map(int, args.sweep.split(","))}
        with open(os.path.join(args.out, "kernels_grid_sweep.json"), "w") as f:
            json.dump({"variants": BWD_VARIANTS, "bwd_device_ms": sweeps}, f, indent=1)
    picks = [int(x) for x in args.only.split(",")] if args.only else range(len(GRID))
    results = []
    t0 = time.time()
    for i in picks:
        results.append({"entry": i, **run_entry(i, GRID[i], device, bw, args)})
    log(f"grid: {len(results)} entries in {time.time() - t0:.0f} s")
    summary = {"hardware": hw, "batch": B, "precision": "fp16", "optimizer": "sgd", "results": results, "targets": targets(results),
               "command": "PYTHONPATH=. python3 benchmarks/kernels_grid.py " + " ".join(sys.argv[1:]).replace(args.out, "$OUT")}
    with open(os.path.join(args.out, "kernels_grid.json"), "w") as f:
        json.dump(summary, f, indent=1)
    lines = [f"{hw['gpu']}, torch {hw['torch']}, CUDA {hw['cuda']}, triton {hw['triton']}; copy bandwidth {bw / 1e12:.2f} TB/s; "
             f"B={B}, fp16, exact SGD; one table per entry", "",
             "| # | rows | dim | pooling | distribution | lookups | hits/row | max hits | fwd ms (device) | fwd % bw | bwd ms | bwd MB | bwd % bw | bwd device ms | device % bw | bwd/fwd | torch fwd / bwd ms (device) | v4 fwd / bwd ms (device) | check fwd / upd |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        tor = f"{r['torch_fwd_ms']:.3f} / {r['torch_bwd_ms']:.2f} ({r['torch_fwd_device_ms']:.3f} / {r['torch_bwd_device_ms']:.2f})" if "torch_bwd_ms" in r else "-"
        old = f"{r['v4_fwd_ms']:.3f} / {r['v4_bwd_ms']:.2f} ({r['v4_fwd_device_ms']:.3f} / {r['v4_bwd_device_ms']:.2f})" if "v4_bwd_ms" in r else "-"
        lines.append(f"| {r['entry']} | {r['rows']:,} | {r['dim']} | {r['pooling']:g} | {r['distribution']} | {r['lookups'] / 1e6:.2f}M | "
                     f"{r['hits_per_row']:,.1f} | {r['max_hits']:,} | {r['triton_fwd_ms']:.3f} ({r['triton_fwd_device_ms']:.3f}) | {100 * r['fwd_frac']:.0f}% | "
                     f"{r['triton_bwd_ms']:.3f} | {r['bwd_bytes'] / 1e6:,.0f} | {100 * r['bwd_frac']:.0f}% | "
                     f"{r['triton_bwd_device_ms']:.3f} | {100 * r['bwd_device_frac']:.0f}% | {r['bwd_over_fwd']:.1f} | {tor} | {old} | "
                     f"{r['check']['fwd_rel_err']:.0e} / {r['check']['update_rel_err']:.0e} {'ok' if r['check_ok'] else 'FAIL'} |")
    lines += [""] + [f"- {t}" for t in summary["targets"]]
    with open(os.path.join(args.out, "kernels_grid.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    log("")
    log("\n".join(lines))


if __name__ == "__main__":
    main()
