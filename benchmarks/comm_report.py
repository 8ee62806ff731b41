"""The tables of docs/comm.md from the multi-GPU comm campaign (benchmarks/gpu_comm.py), on the CPU.

    .venv/bin/python benchmarks/comm_report.py DIR [DIR ...] [--sequential DIR] [--out FILE]

Each DIR holds one call's files (campaign_<gpu>.json and its <gpu>_nccl_<D>gpu.json models). For
every GPU and device count: the comm model (refitted to the call's measurements by `fit_comm`, as
`dreamshard calibrate comm --refit` does) and its error on the held-out patterns; then every plan
of the campaign re-priced as the sequential runner prices it (its measured compute, comm from that
model: `runners.sequential.modelled_comm`) beside the distributed runner's measurement, by plan
kind; and the end-to-end step beside the phased overall. ``--sequential DIR``: a call of
`gpu_comm.py --sequential-only` whose compute replaces the campaign's for the plans it measured.
``--calibration FILE``: also price every plan with the simulator of that calibration (fitted on
the campaign's GPU; comm from the shipped models) beside the distributed runner, by table family.
``--comm-model FILE``: price the sequential runner of that file's device count with it (a shipped
model, fitted on another call) instead of the call's own fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard.costs.base import CostReport  # noqa: E402
from dreamshard.costs.comm import CommModel, fit_comm  # noqa: E402
from dreamshard.costs.runners.sequential import modelled_comm  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.families import HELD_OUT_FAMILIES  # noqa: E402
from dreamshard.plan import load_plans  # noqa: E402

PLANS = Path(__file__).resolve().parent / "results" / "gpu_comm"


def overall(devices) -> float:
    return max(d.total_ms for d in devices)


def repriced(seq: CostReport, plan, model: CommModel) -> float:
    """The sequential runner's overall step for `plan` with comm from `model`: its measured compute
    and `modelled_comm`, exactly as `SequentialRunner.evaluate` adds them."""
    fwd, bwd, _ = modelled_comm(model, plan.device_tables(), plan.workload)
    return max(d.fwd_comp_ms + f + b + d.bwd_comp_ms for d, f, b in zip(seq.devices, fwd, bwd))


def rate(fit: dict, what: str) -> str:
    """A fitted collective as a formula."""
    head = f"{fit['latency_ms'] * 1e3:.1f} µs + {what} / "
    if fit.get("knee_bytes"):
        return head + f"{fit['knee_bandwidth_GBps']:.1f} GB/s up to {fit['knee_bytes'] / 1e6:.3g} MB, {fit['bandwidth_GBps']:.1f} GB/s beyond"
    return head + f"{fit['bandwidth_GBps']:.1f} GB/s"


def copies(fit: dict) -> str:
    """The column copies' fit (comm.copies_ms) as a formula per direction."""
    return "; ".join(f"{d}: {fit[d]['latency_ms'] * 1e3:.1f} µs + all-to-all bytes / {fit[d]['a2a_GBps']:.0f} GB/s + row bytes / {fit[d]['row_GBps']:.0f} GB/s"
                     for d in ("fwd", "bwd"))


def pct(x: float) -> str:
    return f"{x:+.1%}"


def table(headers, rows) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def report(dirs: list[Path], sequential: Path | None = None, calibration: Path | None = None, comm_model: Path | None = None) -> str:
    lines = []
    sim = SimBackend(calibration) if calibration else None
    again = {}
    if sequential:
        redo = json.loads(next(sequential.glob("campaign_*.json")).read_text())
        again = {(p["devices"], p["index"]): p["sequential"] for p in redo["plans"]}
        lines += [f"Sequential compute of {len(again)} plans re-measured on {redo['hardware']} (`{redo['command']}`).", ""]
    for d in dirs:
        campaign = json.loads(next(d.glob("campaign_*.json")).read_text())
        gpu = campaign["gpu"]
        lines += [f"## {campaign['hardware']} ({gpu.upper()})", "", f"Versions: {campaign['versions']}; kernel: {campaign['kernel']}; "
                  f"command: `{campaign['command']}`", ""]
        models = {}
        rows = []
        given = CommModel.load(comm_model) if comm_model else None
        for D, entry in sorted(campaign["models"].items(), key=lambda kv: int(kv[0])):
            raw = CommModel.load(d / entry["file"])
            m = fit_comm(raw.measurements, hardware=raw.hardware, date=raw.date, versions=raw.versions, process_group=raw.process_group, devices=raw.devices)
            models[int(D)] = m
            if given is not None and given.devices == int(D) and given.measurements != raw.measurements:
                models[int(D)] = given
                lines += [f"The sequential runner's comm on {D} devices: `{Path(comm_model).name}` ({given.hardware}, {given.date}), not this call's own fit.", ""]
            held = m.fit_details.get("held_out", {})
            for op in ("all_to_all", "reduce_scatter", "all_gather", "relayout"):
                e = held.get(op)
                formula = (m.describe().rsplit(" (", 1)[0] if op == "all_to_all" else copies(m.relayout) if op == "relayout" and "fwd" in m.relayout
                           else rate(getattr(m, op), "ring bytes" if op != "relayout" else "bytes read and written"))
                rows.append([D, op.replace("_", "-"), formula, f"{e['median_rel_error']:.1%} / {e['max_rel_error']:.1%} ({e['points']})" if e else "n/a"])
        lines += ["**Comm models** (fitted on the calibration set; error on the held-out patterns: median / max (points))", ""]
        lines += table(["devices", "collective", "model", "held-out error"], rows) + [""]
        by_kind: dict = {}
        by_family: dict = {}  # (devices, family) → the simulator's overall vs the distributed runner's
        plans = {D: load_plans(PLANS / f"plans_{D}.jsonl") for D in models}
        detail = []
        for p in campaign["plans"]:
            D = p["devices"]
            plan = plans[D][p["index"]]
            dist, seq = CostReport.from_json(p["distributed"]), CostReport.from_json(again.get((D, p["index"]), p["sequential"]))
            od, oe = overall(dist.devices), dist.e2e_ms
            os_ = repriced(seq, plan, models[D])
            kind = p["notes"][-1].removeprefix("kind ")
            family = p["notes"][-2].removeprefix("family ")
            comm_d = max(x.fwd_comm_ms + x.bwd_comm_ms for x in dist.devices)
            fwd, bwd, _ = modelled_comm(models[D], plan.device_tables(), plan.workload)
            comm_s = max(f + b for f, b in zip(fwd, bwd))
            by_kind.setdefault((D, kind), []).append((os_ / od - 1, comm_s / comm_d - 1, oe / od - 1, dist.details.get("e2e_launch_ms", oe) / od - 1))
            detail.append([D, family + ("*" if family in HELD_OUT_FAMILIES else ""), p["planner"], kind, f"{od:.3f}", f"{oe:.3f}", f"{os_:.3f}", pct(os_ / od - 1), pct(comm_s / comm_d - 1)])
            if sim:
                by_family.setdefault((D, family), []).append(sim.evaluate_plan(plan).overall_ms / od - 1)
        rows = []
        for (D, kind), vals in sorted(by_kind.items()):
            err = [abs(v[0]) for v in vals]
            rows.append([D, kind, len(vals), f"{median(err):.1%} / {max(err):.1%}", f"{median(v[1] for v in vals):+.1%}", f"{median(v[2] for v in vals):+.1%}",
                         f"{median(v[3] for v in vals):+.1%}"])
        allerr = [abs(v[0]) for vals in by_kind.values() for v in vals]
        lines += [f"**Sequential runner (this model) vs distributed runner**, overall step, {len(allerr)} plans: |error| median {median(allerr):.1%}, "
                  f"max {max(allerr):.1%}; within 5%: {sum(e <= 0.05 for e in allerr)} of {len(allerr)}", ""]
        lines += table(["devices", "plan kind", "plans", "sequential vs distributed: median / max abs error", "comm (max device): model vs measured, median",
                        "e2e vs phased overall, median", "e2e with launch vs phased overall, median"], rows) + [""]
        if sim:
            allsim = [v for vals in by_family.values() for v in vals]
            lines += [f"**Simulator ({calibration.name}) vs distributed runner**, overall step, {len(allsim)} plans: |error| median "
                      f"{median(map(abs, allsim)):.1%}, max {max(map(abs, allsim)):.1%}; within 8%: {sum(abs(v) <= 0.08 for v in allsim)} of {len(allsim)} "
                      "(* the held-out family)", ""]
            rows = [[D, f + ("*" if f in HELD_OUT_FAMILIES else ""), len(v), f"{median(map(abs, v)):.1%} / {max(map(abs, v)):.1%}", f"{median(v):+.1%}",
                     f"{sum(abs(x) <= 0.08 for x in v)} of {len(v)}"] for (D, f), v in sorted(by_family.items())]
            lines += table(["devices", "family", "plans", "simulator vs distributed: median / max abs error", "median signed", "within 8%"], rows) + [""]
        lines += ["<details><summary>every plan (ms; * the held-out family)</summary>", ""]
        lines += table(["devices", "family", "planner", "kind", "distributed overall", "distributed e2e", "sequential overall", "seq vs dist", "comm model vs measured"], detail)
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sequential", type=Path, help="a --sequential-only call whose compute replaces the campaign's where it measured")
    ap.add_argument("--calibration", type=Path, help="also price every plan with the simulator of this calibration")
    ap.add_argument("--comm-model", type=Path, help="the sequential runner's comm model for its device count, in place of the call's own fit")
    args = ap.parse_args()
    text = report(args.dirs, args.sequential, args.calibration, args.comm_model)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
