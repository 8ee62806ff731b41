"""How far below the best table-wise step any plan of a setting could go, from the measurements of
benchmarks/gpu_rowwise.py (CPU, no measuring; issue 13's ≥ 30% target, docs/rowwise.md).

    PYTHONPATH=. python benchmarks/rowwise_bounds.py [benchmarks/results/gpu_rowwise/summary.json]

Per setting, from the measured per-device compute and comm of its plans:
- *even spread*: the table-wise plan's compute summed over its devices, spread evenly over D, plus
  its cheapest device's comm: the step if that work were shared perfectly, with no added exchange.
- *even spread of the column plan*: the same for the measured column-split plan: a column split
  moves the same all-to-all, but each piece still does every lookup of its table, so its compute
  sums to more than the table-wise plan's.
- *even spread with the row exchange*: the smaller of the table-wise and the row plan's summed
  compute, spread evenly, plus the row plan's cheapest device's comm (its all-to-all and the
  reduce-scatter + all-gather of its row-split tables). A plan that splits those tables by rows
  pays that exchange on every device; the compute of a split is measured to stay within a few
  percent of the unsplit table's (each block adds launches and does its share of the lookups).
  An estimate of the best such a plan reaches, not a proof: another choice of tables changes it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.rowwise_sim import device_work  # noqa: E402  (the simulator's even spread, the same formula)

SUMMARY = Path(__file__).resolve().parent / "results" / "gpu_rowwise" / "summary.json"


def pct(x: float, base: float) -> str:
    return f"{100 * (x / base - 1):+.1f}%"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary", nargs="?", default=str(SUMMARY), help="gpu_rowwise.py's summary.json")
    args = ap.parse_args(argv)
    path = Path(args.summary)
    if not path.is_file():
        raise SystemExit(f"error: {path} is not a file: give the summary.json that benchmarks/gpu_rowwise.py wrote")
    summary = json.loads(path.read_text())
    by_setting: dict[str, dict[str, dict]] = {}
    for rec in summary["measured"]:
        by_setting.setdefault(rec["setting"], {})[rec["kind"]] = rec
    print(f"{summary.get('hardware', '?')}, {summary.get('runner', '?')} runner; ms per step (measured compute; comm as gpu_rowwise.py priced it)\n")
    print("| setting | best table-wise | best measured | even spread | even spread of the column plan | even spread with the row exchange | best measured vs table-wise | 30% below table-wise |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for setting, plans in by_setting.items():
        tw = plans.get("table_wise")
        if tw is None:
            continue
        d = tw["devices"]
        tw_compute, tw_comm = device_work(tw["devices_ms"])
        spread = tw_compute / d + tw_comm
        best = min(p["measured_ms"] for p in plans.values())
        cells = []
        for kind in ("columns", "rows"):
            if kind not in plans:
                cells.append("—")
                continue
            compute, comm = device_work(plans[kind]["devices_ms"])
            if kind == "rows":
                compute = min(tw_compute, compute)
            cells.append(f"{compute / d + comm:.3f} ({pct(compute / d + comm, tw['measured_ms'])})")
        target = 0.7 * tw["measured_ms"]
        print(f"| {setting} | {tw['measured_ms']:.3f} | {best:.3f} | {spread:.3f} ({pct(spread, tw['measured_ms'])}) | {' | '.join(cells)} | "
              f"{pct(best, tw['measured_ms'])} | {target:.3f} |")


if __name__ == "__main__":
    main()
