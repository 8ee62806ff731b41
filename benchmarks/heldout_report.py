"""The tables of the held-out planner campaign, from its files.

    .venv/bin/python benchmarks/heldout_report.py benchmarks/results/gpu_heldout     # prints; --write: report.md

Reads DIR/plans.jsonl (benchmarks/heldout_plans.py), DIR/measured.csv (benchmarks/gpu_heldout.py)
and DIR/summary.json, prices every plan with the simulator here, and writes per held-out family and
setting, over the tasks whose every plan was measured: each planner's mean measured step, the mean
of its per-task ratios to the best table-wise heuristic (lookup, size_lookup), its tasks more than
2% behind the best planner, its mean simulated step beside; the cost net's per-plan error on the
measured plans of `dreamshard` and `neuroshard` by plan kind; which candidate of DreamShard's search
won; and the planning times on the machine that made the plans.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dreamshard.costs.sim import SimBackend  # noqa: E402
from gpu_heldout import plan_hash  # noqa: E402
from dreamshard.plan import load_plans  # noqa: E402

BEHIND = 0.02
TABLE_WISE_BEST = ("lookup", "size_lookup")


def notes_with(plan, key: str) -> dict[str, str]:
    """label → value of the notes `key LABEL VALUE` (per planner of a shared plan)."""
    out = {}
    for n in plan.notes:
        if n.startswith(key + " "):
            rest = n[len(key) + 1 :]
            label = next(lbl for lbl in planners_of(plan) if rest.startswith(lbl + " "))
            out[label] = rest[len(label) + 1 :]
    return out


def planners_of(plan) -> list[str]:
    # longest first, so that "dreamshard --no-split 1.2" is not read as "dreamshard" + "--no-split 1.2"
    return sorted((n[len("planner ") :] for n in plan.notes if n.startswith("planner ")), key=len, reverse=True)


def note(plan, key: str) -> str:
    return next(n[len(key) + 1 :] for n in plan.notes if n.startswith(key + " "))


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def report(folder: Path) -> str:
    plans = load_plans(folder / "plans.jsonl")
    with open(folder / "measured.csv") as fh:
        measured = {(r["family"], r["setting"], r["task"], r["planners"], r["plan"]): r for r in csv.DictReader(fh)}
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
    sim = SimBackend()
    # (family, setting, task) → label → (measured ms, max-device ms, simulated ms, plan)
    tasks: dict[tuple, dict] = defaultdict(dict)
    complete: dict[tuple, bool] = defaultdict(lambda: True)
    for plan in plans:
        t = (note(plan, "family"), note(plan, "setting"), note(plan, "task"))
        labels = sorted(planners_of(plan), key=lambda lbl: plan.notes.index(f"planner {lbl}"))
        row = measured.get((*t, ";".join(labels), plan_hash(plan)))
        if row is None:
            complete[t] = False
            continue
        simulated = sim.evaluate_plan(plan).overall_ms
        for label in labels:
            tasks[t][label] = (float(row["measured_ms"]), float(row["max_device_ms"]), simulated, plan)
    done = {t: v for t, v in tasks.items() if complete[t]}
    lines = [f"Measured on {summary.get('device', '?')} ({summary.get('runner', '?')}; `{summary.get('command', '?')}`); "
             f"versions {summary.get('versions', '?')}. Simulator: {sim.calibration.label}.", ""]
    groups = sorted({t[:2] for t in done})
    labels_all = list(dict.fromkeys(lbl for t in done.values() for lbl in t))
    for family, setting in groups:
        ts = [t for t in done if t[:2] == (family, setting)]
        lines += [f"## {family} (held out), {setting}: {len(ts)} tasks", "",
                  "| planner | measured mean ms | vs best table-wise heuristic (mean of per-task ratios) | tasks > 2% behind the best | worst vs the best | simulated mean ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        rows = []
        for label in labels_all:
            have = [t for t in ts if label in done[t]]
            if len(have) < len(ts):
                rows.append((np.inf, f"| {label} | no plan on {len(ts) - len(have)} of {len(ts)} tasks | | | | |"))
                continue
            ms = [done[t][label][0] for t in ts]
            base = [min(done[t][h][0] for h in TABLE_WISE_BEST) for t in ts]
            best = [min(v[0] for v in done[t].values()) for t in ts]
            ratio = float(np.mean([m / b - 1 for m, b in zip(ms, base)]))
            behind = sum(m > b * (1 + BEHIND) for m, b in zip(ms, best))
            worst = max(m / b - 1 for m, b in zip(ms, best))
            simm = float(np.mean([done[t][label][2] for t in ts]))
            rows.append((float(np.mean(ms)), f"| {label} | {np.mean(ms):.3f} | {pct(ratio)} | {behind} | {pct(worst)} | {simm:.3f} |"))
        lines += [r for _, r in sorted(rows, key=lambda r: r[0])] + [""]
    # the cost net on measured held-out plans, by plan kind
    lines += ["## The cost net's per-plan error on the measured plans (predicted vs measured max-device step)", "",
              "| planner | plan kind | plans | median abs error | max abs error | mean signed |", "|---|---|---:|---:|---:|---:|"]
    for label in ("dreamshard", "dreamshard --no-split", "neuroshard"):
        errs: dict[str, list[float]] = defaultdict(list)
        for t in done.values():
            if label not in t:
                continue
            _, maxdev, _, plan = t[label]
            pred = notes_with(plan, "predicted_ms").get(label)
            if pred is not None:
                errs[note(plan, "kind")].append(float(pred) / maxdev - 1)
        for kind, e in sorted(errs.items()):
            a = np.abs(e)
            lines.append(f"| {label} | {kind} | {len(e)} | {np.median(a) * 100:.1f}% | {a.max() * 100:.1f}% | {pct(float(np.mean(e)))} |")
    # where DreamShard's plan came from
    won = Counter(notes_with(t["dreamshard"][3], "candidate").get("dreamshard", "?") for t in done.values() if "dreamshard" in t)
    lines += ["", "## DreamShard's search: the candidate chosen, over the measured tasks", "", "| candidate | tasks |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in won.most_common()]
    # planning time on the machine that made the plans
    times: dict[str, list[float]] = defaultdict(list)
    for plan in plans:
        for label, v in notes_with(plan, "planning_ms").items():
            times[label].append(float(v))
    lines += ["", "## Planning time per task (ms, on the CPU that made the plans: `benchmarks/heldout_plans.py`)", "", "| planner | mean | max |", "|---|---:|---:|"]
    lines += [f"| {k} | {np.mean(v):.0f} | {max(v):.0f} |" for k, v in sorted(times.items(), key=lambda kv: np.mean(kv[1]))]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--write", action="store_true", help="write FOLDER/report.md")
    args = ap.parse_args()
    text = report(Path(args.folder))
    if args.write:
        Path(args.folder, "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
