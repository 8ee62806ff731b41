"""All-to-all on 2 GPUs: fit the NCCL comm model, run the distributed runner end to end (issue 3, item 5).

    PYTHONPATH=. python3 benchmarks/gpu_comm.py --out $OUT            # on a 2-GPU machine, ~3-5 min
    PYTHONPATH=. python3 benchmarks/gpu_comm.py --out /tmp/x --cpu    # dry run here: gloo, CPU kernels

1. hardware, versions, visible GPUs;
2. real NCCL all-to-alls (``dreamshard.costs.comm.calibrate``: one process per GPU,
   ``all_to_all_single`` with uneven splits, balanced and skewed exchanges, 1 KB–256 MB per
   destination, forward and backward direction, medians of 20) → fitted comm model, written to
   ``$OUT/comm_<gpu>_nccl.json`` (ship it as ``dreamshard/data/comm/<gpu>_nccl.json``);
3. a few 2-GPU plans of DLRM-like tables (``dreamshard.synth`` pool, heuristic planners), each
   measured with the distributed runner (real NCCL all-to-alls, CUDA events, fused Triton TBE,
   B = 65,536, fp16) and with the sequential runner (one GPU, comm from the model just fitted):
   per-device components side by side, and the comm model's error on the runner's own all-to-alls
   (which the fit never saw);
4. ``$OUT/gpu_comm.json`` (everything) and ``$OUT/gpu_comm.md`` (tables for docs/), the summary
   table printed last.

With one GPU visible it says so and measures what one GPU can: each plan's per-shard compute.
A global time budget (``--budget-s``) skips the remaining plans rather than overrun.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from statistics import median

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # mandatory on our H200 machines (workers get it too)
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dreamshard.costs.base import CostReport  # noqa: E402
from dreamshard.costs.comm import CommModel, alltoall_bytes, calibrate  # noqa: E402
from dreamshard.costs.hardware import describe_hardware, software_versions  # noqa: E402
from dreamshard.costs.kernels import available_kernels  # noqa: E402
from dreamshard.costs.runners import DistributedRunner, SequentialRunner  # noqa: E402
from dreamshard.plan import Plan  # noqa: E402
from dreamshard.tables import PRECISION_BYTES, TableSpec  # noqa: E402
from dreamshard.packing import format_bytes, parse_memory  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402  # noqa: E402

T0 = time.monotonic()


def log(*a) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def elapsed() -> float:
    return time.monotonic() - T0


# --------------------------------------------------------------------------------------------
# tables and plans
# --------------------------------------------------------------------------------------------


def pool_tables(n: int, seed: int, max_rows: int) -> tuple[list[TableSpec], str]:
    """DLRM-like tables from dreamshard.synth; generated here if that cannot run (no scipy, say)."""
    try:
        from dreamshard.synth import PoolConfig, synth_pool

        pool = [t for t in synth_pool(PoolConfig(tables=n, seed=seed)) if t.rows <= max_rows]
        return pool, "dreamshard.synth"
    except Exception as e:  # noqa: BLE001
        log(f"dreamshard.synth unavailable ({type(e).__name__}: {e}); generating DLRM-like tables in the script")
    import numpy as np

    rng = np.random.default_rng(seed)
    pf = rng.lognormal(0.0, 1.2, n)
    pf *= 15.8 / pf.mean()
    out = []
    for i in range(n):
        rows = int(min(10 ** rng.uniform(2.5, 7.3), max_rows))
        out.append(TableSpec(f"t{i}", rows=rows, dim=int(rng.choice([4, 8, 16, 32, 64, 128])), pooling_factor=float(pf[i]),
                             distribution=f"zipf:{rng.uniform(0.6, 1.35):.4f}", seed=seed * 100_003 + i))
    return out, "script"


def make_plans(spec: str, devices: int, max_memory: int, seed: int, max_rows: int) -> tuple[list[Plan], str]:
    from dreamshard.planners import get_planner
    from dreamshard.tasks import sample_tasks

    pool, source = pool_tables(400, seed, max_rows)
    plans = []
    for i, item in enumerate(spec.split(",")):
        n, _, planner = item.partition(":")
        task = sample_tasks(pool, 1, (int(n), int(n)), devices, max_memory, seed=seed + i)[0]
        kwargs = {"seed": seed} if planner == "random" else {}
        plans.append(get_planner(planner or "lookup", **kwargs).plan(task))
    return plans, source


# --------------------------------------------------------------------------------------------
# printing
# --------------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    out = ([f"**{title}**", ""] if title else []) + [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(r) for r in cells[1:]])


def f3(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def comm_error(rep: CostReport, model: CommModel, precision: str) -> dict:
    """The model's prediction of the distributed runner's own (measured) all-to-alls."""
    dims = rep.details["dim_sums"]
    send, recv = alltoall_bytes(dims, rep.batch_size, PRECISION_BYTES[precision])
    pred_f, pred_b = model.predict(send, recv), model.predict(recv, send)
    errs = []
    for d, dev in enumerate(rep.devices):
        errs += [abs(pred_f[d] - dev.fwd_comm_ms) / dev.fwd_comm_ms, abs(pred_b[d] - dev.bwd_comm_ms) / dev.bwd_comm_ms]
    return {"pred_fwd_ms": pred_f, "pred_bwd_ms": pred_b, "median_rel_error": median(errs), "max_rel_error": max(errs)}


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU: gloo processes, CPU kernel, small tables")
    ap.add_argument("--kernel", default="auto", help="auto: triton on CUDA (torch if triton cannot run), fbgemm/torch on CPU")
    ap.add_argument("--batch-size", type=int, help="default 65536 on GPUs, 1024 with --cpu")
    ap.add_argument("--plans", default="20:lookup,40:size_lookup,40:random", help="TABLES:PLANNER,... (2-device plans)")
    ap.add_argument("--max-memory", default="30GB", help="per-device memory cap of the plans")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sizes", help="comm calibration: bytes per destination, comma-separated (default: 1KB..256MB on GPUs)")
    ap.add_argument("--budget-s", type=float, default=270.0, help="skip a plan that would end past this many seconds")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    device_type = "cpu" if args.cpu else "cuda"
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_type == "cuda" and n_gpu == 0:
        log("no CUDA device visible: nothing to measure on GPUs (use --cpu for a dry run on CPU)")
        return 1
    world = 2 if (device_type == "cpu" or n_gpu >= 2) else 1
    if args.kernel == "auto":
        have = available_kernels(device_type)
        kernel = ("triton" if "triton" in have else "torch") if device_type == "cuda" else ("fbgemm" if "fbgemm" in have else "torch")
    else:
        kernel = args.kernel
    B = args.batch_size or (65_536 if device_type == "cuda" else 1024)
    max_rows = 10**8 if device_type == "cuda" else 200_000
    versions = software_versions()
    log(f"hardware: {describe_hardware(device_type, max(world, 1))}; visible GPUs: {n_gpu}; versions: {versions}")
    log(f"kernel {kernel}, B={B}, fp16, sgd; plans {args.plans}; budget {args.budget_s:.0f} s")
    if device_type == "cuda" and n_gpu == 1:
        log("ONLY 1 GPU VISIBLE: no NCCL all-to-all and no distributed runner; measuring each plan's per-shard compute on the one GPU")
    results: dict = {"hardware": describe_hardware(device_type, world), "versions": versions, "visible_gpus": n_gpu, "kernel": kernel,
                     "batch_size": B, "device_type": device_type, "plans": []}

    # ---- 1. comm calibration --------------------------------------------------------------
    model = None
    if world >= 2:
        from dreamshard.costs.comm import parse_sizes

        sizes = parse_sizes(args.sizes) if args.sizes else None
        log(f"calibrating the all-to-all ({'NCCL' if device_type == 'cuda' else 'gloo'}, 2 ranks)")
        try:
            model = calibrate(2, sizes, device_type, iters=20, warmup=3, timeout_s=180)
        except Exception as e:  # noqa: BLE001 - report and go on with what can still run
            log(f"calibration FAILED: {type(e).__name__}: {e}")
            results["calibration_error"] = f"{type(e).__name__}: {e}"
        if model is not None:
            slug = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(0).lower()).strip("_") if device_type == "cuda" else "cpu"
            slug = slug.replace("nvidia_", "")
            name = f"comm_{slug}_{model.process_group}.json"
            model.save(out / name)
            results["comm_model"] = {"file": name, **model.to_json()}
            groups: dict = {}
            for p in model.measurements:
                groups.setdefault((max(p["send_bytes"], p["recv_bytes"]), p["pattern"]), []).append(p)
            rows = []
            for (hi, pattern), pts in sorted(groups.items()):
                meas = median(p["ms"] for p in pts)
                pred = median(model.predict(p["send_bytes"], p["recv_bytes"]) for p in pts)
                gbps = hi / meas / 1e6
                rows.append([pattern, format_bytes(hi), f"{meas:.4f}", f"{pred:.4f}", f"{(pred - meas) / meas:+.1%}", f"{gbps:.1f}"])
            results["comm_table"] = table(["exchange", "max(send, recv)", "measured ms", "model ms", "model err", "GB/s (max dir.)"], rows,
                                          f"all-to-all, 2 ranks, {model.process_group}: measured (median of ranks, directions) vs model")
            print(results["comm_table"], flush=True)
            fd = model.fit_details
            log(f"comm model: {model.describe()}; fit error median {fd['median_rel_error']:.1%}, max {fd['max_rel_error']:.1%} over {fd['points']} points")
            log(f"wrote {out / name}")

    # ---- 2. plans -------------------------------------------------------------------------
    plans, source = make_plans(args.plans, 2, parse_memory(args.max_memory), args.seed, max_rows)
    log(f"{len(plans)} plans of DLRM-like tables from {source}")
    summary = []
    last_plan_s = 0.0
    for i, plan in enumerate(plans):
        label = f"P{i + 1} {plan.planner} T={len(plan.task.tables)}"
        shards = plan.device_tables()
        entry: dict = {"label": label, "plan": plan.to_json()}
        results["plans"].append(entry)
        log(f"{label}: dim sums {[sum(t.dim for t in s) for s in shards]}, memory {[format_bytes(b) for b in plan.device_bytes()]}")
        if elapsed() + last_plan_s > args.budget_s:  # the previous plan's time estimates this one's
            log(f"{label}: skipped (would overrun the time budget of {args.budget_s:.0f} s)")
            entry["skipped"] = "time budget"
            summary.append([label, "skipped", "", "", "", "", ""])
            continue
        dist = seq = None
        plan_start = elapsed()
        try:
            if world >= 2:
                dist = DistributedRunner(kernel, device_type, args.warmup, args.iters, timeout_s=180).evaluate(shards, Workload(B))
                entry["distributed"] = dist.to_json()
                log(f"{label}: distributed overall {dist.overall_ms:.3f} ms, e2e {dist.e2e_ms:.3f} ms (wall {dist.details['wall_s']} s)")
            if model is not None:
                seq = SequentialRunner(kernel, model, device_type, args.warmup, args.iters).evaluate(shards, Workload(B))
            else:  # one GPU: compute per shard (a 1-device evaluate needs no comm model)
                per = [SequentialRunner(kernel, None, device_type, args.warmup, args.iters).evaluate([s], Workload(B)) for s in shards]
                seq = CostReport(devices=[r.devices[0] for r in per], backend=kernel, runner="sequential", hardware=per[0].hardware, batch_size=B,
                                 comm_modelled=True, details={"note": "compute only: comm not modelled (no 2-GPU calibration)"})
            entry["sequential"] = seq.to_json()
            log(f"{label}: sequential overall {seq.overall_ms:.3f} ms")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            entry["error"] = f"{type(e).__name__}: {e}"
            log(f"{label}: FAILED {entry['error']}")
        last_plan_s = elapsed() - plan_start
        rows = []
        for d in range(2):
            dd = dist.devices[d] if dist else None
            sd = seq.devices[d] if seq else None
            rows.append([d, len(shards[d]), sum(t.dim for t in shards[d]),
                         f3(dd and dd.fwd_comp_ms), f3(sd and sd.fwd_comp_ms), f3(dd and dd.fwd_comm_ms), f3(sd and model and sd.fwd_comm_ms),
                         f3(dd and dd.bwd_comm_ms), f3(sd and model and sd.bwd_comm_ms), f3(dd and dd.bwd_comp_ms), f3(sd and sd.bwd_comp_ms),
                         f3(dd and dd.total_ms), f3(sd and sd.total_ms)])
        entry["table"] = table(["dev", "tables", "dim sum", "fwd comp D", "fwd comp S", "fwd comm D", "fwd comm S(model)", "bwd comm D",
                                "bwd comm S(model)", "bwd comp D", "bwd comp S", "total D", "total S"], rows,
                               f"{label}, B={B}, fp16, {kernel}: D = distributed runner, S = sequential runner")
        print(entry["table"], flush=True)
        err = comm_error(dist, model, "fp16") if (dist and model) else None
        if err:
            entry["comm_model_on_runner"] = err
        if dist or seq:
            summary.append([label, f3(dist and dist.overall_ms), f3(dist and dist.e2e_ms), f3(seq and seq.overall_ms),
                            f"{seq.overall_ms / dist.overall_ms:.3f}" if (dist and seq) else "n/a",
                            f"{err['median_rel_error']:.1%} / {err['max_rel_error']:.1%}" if err else "n/a",
                            f"{dist.details['wall_s']}" if dist else "n/a"])
        else:
            summary.append([label, "failed", "", "", "", "", ""])

    # ---- 3. summary -----------------------------------------------------------------------
    results["summary"] = table(["plan", "distributed overall ms", "distributed e2e ms", "sequential overall ms", "seq / dist",
                                "comm model err on runner (median / max)", "dist wall s"], summary,
                               f"summary: {results['hardware']}, {kernel}, B={B}, fp16 (overall = max over devices of fwd comp + fwd comm + bwd comm + bwd comp)")
    results["elapsed_s"] = round(elapsed(), 1)
    (out / "gpu_comm.json").write_text(json.dumps(results, indent=1))
    md = [f"# All-to-all and the distributed runner on {results['hardware']}", "",
          f"Command: `PYTHONPATH=. python3 benchmarks/gpu_comm.py --out $OUT{' --cpu' if args.cpu else ''}`  ",
          f"Versions: {versions}  ", f"Visible GPUs: {n_gpu}; kernel: {kernel}; B = {B}; fp16; exact SGD; {args.iters} timed iterations, medians.", ""]
    if model is not None:
        md += [results["comm_table"], "", f"Fitted model: {model.describe()}", ""]
    for e in results["plans"]:
        if "table" in e:
            md += [e["table"], ""]
    md += [results["summary"], ""]
    (out / "gpu_comm.md").write_text("\n".join(md))
    log(f"wrote {out / 'gpu_comm.json'} and {out / 'gpu_comm.md'} ({results['elapsed_s']} s)")
    print()
    print(results["summary"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
