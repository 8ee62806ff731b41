"""Which price should pick among `dreamshard --verify`'s variants when no GPU is at hand?

`--verify K` makes K variants of the plan and keeps the one the backend measures fastest; the
campaigns replayed here had the variants of its schedule before the cut penalty (the last stage
from the search's plan alone and also from the lookup plans, seeds in turn). With a GPU
that is a measurement; without one the choice is a price's. The cost net chose every variant
within its own search, so it is biased towards what it underprices (a search keeps what its price
underrates); the simulator chose none of them. This replays the choice offline on a measured
campaign: each task's variants priced by the cost net (their `predicted` step) and by the
simulator, the one each price picks looked up among the measured plans, and the mean of per-task
ratios to the best table-wise heuristic measured in the same call.

    .venv/bin/python benchmarks/heldout.py plan --dev --gpu h200 --out D --again "dreamshard,dreamshard (seed 1),dreamshard (annealing also from the lookup plans),dreamshard (annealing also from the lookup plans seed 1),lookup,size_lookup"
    .venv/bin/python benchmarks/verify_price.py --plans D/plans.jsonl.gz --measured benchmarks/results/gpu_anneal_start_h200/dev_seeds/measured.csv

Rule, committed before the development tasks were replayed: if the simulator's pick (the H200's
shipped calibration, `h200_triton_search_shards.json`) is at least 0.2 points below the default's
plan on the 30 development tasks, `--verify K --backend sim` becomes the documented way to plan
without a GPU; the held-out tasks are replayed and reported either way.

`--plans` holds the variants' plans (re-made here: the planners are deterministic, and a plan is
looked up by the hash of its shards, so one re-made otherwise is reported as unmeasured);
`--measured` a `heldout.py measure` CSV of them. `--verified`: the variants' measurements are
those `dreamshard (verify 4)` made at plan time (its plans in `--plans` beside the re-made
variants; each distinct variant measured once, `predicted["verified"]`), the heuristics' from
`--measured`:

    .venv/bin/python benchmarks/heldout.py plan --gpu h200 --tasks 6 --out D --again "dreamshard (seed 1),dreamshard (annealing also from the lookup plans),dreamshard (annealing also from the lookup plans seed 1)"   # D: the campaign's plans
    .venv/bin/python benchmarks/verify_price.py --plans D/plans.jsonl.gz --measured benchmarks/results/gpu_verify_h200/heldout/measured.csv --verified

`--labels`: other variants. Rule, fixed before the development tasks were replayed so: if the cost
net's pick between `dreamshard` and `dreamshard (cut penalty 0.75%)` (each plan's own prediction,
without the penalty) is at least 0.2 points below the default's plan on the 30 development tasks
(`gpu_cut_penalty_h200/dev_variants`), and 200 tables on 8 devices still plan in at most 1 s, the
default plans both and keeps the one the net prices lower; the held-out tasks are replayed and
reported either way. It was not (-17.34% against -17.30%; held out -6.69% against -6.81%):

    .venv/bin/python benchmarks/verify_price.py --plans D/plans.jsonl.gz --measured benchmarks/results/gpu_cut_penalty_h200/dev_variants/measured.csv --labels "dreamshard,dreamshard (cut penalty 0.75%)"

`--schedules`: which variants `--verify` should make — the fastest measured of the first K of
each schedule (`SCHEDULES`; the rule that chose between them beside the cut penalty's labels in
heldout.py), over the tasks where every plan of both was measured in one call:

    .venv/bin/python benchmarks/heldout.py plan --dev --gpu h200 --out D --again "dreamshard,dreamshard (cut penalty 0.75%),dreamshard (annealing also from the lookup plans),dreamshard (seed 1),dreamshard (annealing also from the lookup plans seed 1),lookup,size_lookup"
    PYTHONPATH=. python3 benchmarks/heldout.py measure --out OUT --plans D/plans.jsonl.gz   # one H200: 7 min
    .venv/bin/python benchmarks/verify_price.py --plans D/plans.jsonl.gz --measured OUT/measured.csv --schedules
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import PLANNERS, TABLE_WISE_BEST, note, notes_with, planners_of, plan_id, row_id  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.plan import load_plans  # noqa: E402
# the variants of the campaigns replayed here, as heldout.py's labels: the last stage's starts,
# then seeds (--verify's schedule before the cut penalty became its second variant)
VARIANT_LABELS = ("dreamshard", "dreamshard (annealing also from the lookup plans)", "dreamshard (seed 1)",
                  "dreamshard (annealing also from the lookup plans seed 1)")
# --verify K's variants in order (planners.dreamshard.verify_variant), the cut penalty its second
PENALTY_LABELS = ("dreamshard", "dreamshard (cut penalty 0.75%)", "dreamshard (annealing also from the lookup plans)", "dreamshard (seed 1)")
RIVALS = ("dreamshard", "oracle (simulator)", "neuroshard")  # beside the schedules per setting, where measured in the call
SCHEDULES = {"the last stage's starts, then seeds": VARIANT_LABELS, "the default, the cut penalty 0.75%, then those": PENALTY_LABELS}


def variant_key(options: dict) -> tuple:
    """A variant's options (`verify_variant`'s, or a heldout.py label's) as a key."""
    return bool(options.get("anneal_lookup", False)), int(options.get("seed", 0)), float(options.get("cut_penalty", 0.0))


def verified_ms(verify_plan, variants: list, labels: tuple) -> list[float] | None:
    """Each variant's (`labels`' plans) measurement made at plan time by `--verify` (a variant that
    coincides with an earlier one was measured once, as that one); None where a variant is not
    among them (the plan re-made here otherwise)."""
    if verify_plan is None:
        return None
    note_ = notes_with(verify_plan, "verified").get("dreamshard (verify 4)")
    # a file made before that note has them only in a plan `dreamshard (verify 4)` made first
    verified = json.loads(note_) if note_ else (verify_plan.predicted or {}).get("verified")
    if verified is None:
        return None
    by_variant = {variant_key(v): v["measured_ms"] for v in verified["plans"]}
    out, layouts = [], []
    for k, (plan, label) in enumerate(zip(variants, labels)):
        layouts.append(plan.layout())
        first = next(j for j in range(k + 1) if layouts[j] == layouts[k])
        ms = by_variant.get(variant_key(PLANNERS[label][1])) if first == k else out[first]
        if ms is None:
            return None
        out.append(ms)
    return out


def ratios(picks: dict[str, list[float]], base: list[float]) -> dict[str, float]:
    return {name: float(np.mean([m / b - 1 for m, b in zip(ms, base)])) for name, ms in picks.items()}


def schedules(tasks: dict, measured: dict) -> None:
    """`--schedules`: the fastest measured of each schedule's first K variants (K = 1..4), over the
    tasks where every plan of both schedules and both heuristics was measured (one call)."""
    labels = sorted({lb for sch in SCHEDULES.values() for lb in sch} | set(TABLE_WISE_BEST))
    ms = {t: {lb: measured.get(plan_id(plans[lb])) for lb in labels if lb in plans} for t, plans in tasks.items()}
    kept = [t for t in sorted(ms) if len(ms[t]) == len(labels) and None not in ms[t].values()]
    print(f"{len(kept)} tasks with every plan of both schedules and both heuristics measured ({len(ms) - len(kept)} left out)\n")
    print("| schedule | " + " | ".join(f"fastest of {k}" for k in range(1, 5)) + " | tasks whose first 4 are 1 / 2 / 3 / 4 distinct plans |")
    print("|---|" + "---:|" * 5)
    for name, sch in SCHEDULES.items():
        cells = []
        for k in range(1, 5):
            r = [min(ms[t][lb] for lb in sch[:k]) / min(ms[t][h] for h in TABLE_WISE_BEST) - 1 for t in kept]
            cells.append(f"{np.mean(r) * 100:+.2f}%")
        distinct = [len({plan_id(tasks[t][lb]) for lb in sch}) for t in kept]
        print(f"| {name} | " + " | ".join(cells) + " | " + " / ".join(str(distinct.count(n)) for n in range(1, 5)) + " |")
    # per setting, each schedule's fastest of 4 beside the peers measured in the same call
    peers = [lb for lb in RIVALS if all(lb in tasks[t] and measured.get(plan_id(tasks[t][lb])) is not None for t in kept)]
    if not peers:
        return
    picks = {f"`--verify 4`, {name}": sch for name, sch in SCHEDULES.items()}
    print("\nPer setting, each schedule's fastest of 4 beside the peers (mean of per-task ratios to the best table-wise heuristic; "
          "the last row: tasks more than 2% behind the best of the row's columns)\n")
    print("| family, setting | " + " | ".join([*picks, *peers]) + " |")
    print("|---|" + "---:|" * (len(picks) + len(peers)))
    step = {t: {**{p: min(ms[t][lb] for lb in sch) for p, sch in picks.items()}, **{lb: measured[plan_id(tasks[t][lb])] for lb in peers}} for t in kept}
    for setting in sorted({t[:2] for t in kept}):
        ts = [t for t in kept if t[:2] == setting]
        cells = [np.mean([step[t][c] / min(ms[t][h] for h in TABLE_WISE_BEST) - 1 for t in ts]) * 100 for c in [*picks, *peers]]
        print(f"| {setting[0]}, {setting[1]} | " + " | ".join(f"{c:+.2f}%" for c in cells) + " |")
    behind = [sum(step[t][c] > min(step[t].values()) * 1.02 for t in kept) for c in [*picks, *peers]]
    print("| tasks more than 2% behind | " + " | ".join(str(b) for b in behind) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plans", required=True, help="the variants' and the heuristics' plans (heldout.py plan)")
    p.add_argument("--measured", required=True, help="their measurements (heldout.py measure's measured.csv)")
    p.add_argument("--calibration", action="append", default=[], help="a simulator calibration to price with (repeatable)  [the H200's shipped ones]")
    p.add_argument("--variants", type=int, default=4, help="the first K variants  [4]")
    p.add_argument("--labels", help="these heldout.py labels (comma-separated) as the variants instead, the first the default")
    p.add_argument("--verified", action="store_true", help="the variants' measurements from the plans of `dreamshard (verify 4)` in --plans")
    p.add_argument("--schedules", action="store_true", help="instead: the fastest measured of each schedule's first K variants (SCHEDULES)")
    args = p.parse_args()
    with open(args.measured) as fh:
        measured = {row_id(r): float(r["measured_ms"]) for r in csv.DictReader(fh)}
    labels = tuple(args.labels.split(",")) if args.labels else VARIANT_LABELS[:args.variants]
    assert all(lb in PLANNERS for lb in labels)
    tasks: dict[tuple, dict[str, object]] = defaultdict(dict)
    for plan in load_plans(args.plans):
        for label in planners_of(plan):
            tasks[(note(plan, "family"), note(plan, "setting"), note(plan, "task"))][label] = plan
    if args.schedules:
        return schedules(tasks, measured)
    calibrations = args.calibration or ["h200_triton_search_shards.json", "h200_triton_large_shards.json"]
    sims = {c: SimBackend(c) for c in calibrations}
    picks: dict[str, list[float]] = defaultdict(list)
    base, kept, unmeasured = [], [], 0
    for t, plans in sorted(tasks.items()):
        variants = [plans.get(lb) for lb in labels]
        heuristics = [plans.get(h) for h in TABLE_WISE_BEST]
        if None in variants or None in heuristics or not all(plan_id(h) in measured for h in heuristics):
            unmeasured += 1
            continue
        if args.verified:
            ms = verified_ms(plans.get("dreamshard (verify 4)"), variants, labels)
        else:
            ms = [measured[plan_id(v)] for v in variants] if all(plan_id(v) in measured for v in variants) else None
        if ms is None:
            unmeasured += 1
            continue
        kept.append(t)
        base.append(min(measured[plan_id(h)] for h in heuristics))
        picks["the default (variant 0)"].append(ms[0])
        picks["the fastest measured (--verify on the GPU)"].append(min(ms))
        net = [float(notes_with(v, "predicted_ms")[lb]) for v, lb in zip(variants, labels)]  # each label's own prediction of a shared plan
        picks["the cost net's cheapest"].append(ms[int(np.argmin(net))])
        for c, sim in sims.items():
            priced = [sim.evaluate_plan(v).overall_ms for v in variants]
            picks[f"the simulator's cheapest ({c})"].append(ms[int(np.argmin(priced))])
    print(f"{len(kept)} tasks with every variant and heuristic measured ({unmeasured} left out: a plan not measured, or re-made otherwise)\n")
    print("| pick among the variants | tasks | vs best table-wise heuristic (mean of per-task ratios) |")
    print("|---|---:|---:|")
    for name, r in sorted(ratios(picks, base).items(), key=lambda kv: kv[1]):
        print(f"| {name} | {len(kept)} | {r * 100:+.2f}% |")


if __name__ == "__main__":
    main()
