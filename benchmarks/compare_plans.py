"""Two planners on the tasks both were measured on (CPU, from campaigns' plans.csv files).

Per family and setting, over the tasks where A and B both have a measured plan: their mean step,
each heuristic's mean, how many tasks each is > 2% behind the best heuristic of the task (where all
four heuristics were measured), and the cost net's max-device error where a row has its
prediction. A planner measured in several of the files (a repeat in a later call) is also shown
file against file on its common tasks: how far two calls' machines agree.

    PYTHONPATH=. python benchmarks/compare_plans.py benchmarks/results/gpu_cache_model/merged/plans.csv \\
        --a "dreamshard (model_gpu.pt)" --b "dreamshard (shipped)"
    PYTHONPATH=. python benchmarks/compare_plans.py benchmarks/results/gpu_cache_model/hot_dlrm/hot/plans.csv \\
        benchmarks/results/gpu_cache_model/hot_shipped/hot/plans.csv --a "dreamshard (model_gpu.pt)" --b "dreamshard (dreamshard_h200.pt)"
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_heldout_planners import HEURISTICS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    args = ap.parse_args()
    ms: dict[tuple, dict[str, float]] = defaultdict(dict)  # (family, setting, task) -> planner -> ms (first file's)
    net: dict[tuple, float] = {}
    per_file: dict[str, dict[int, dict[tuple, float]]] = defaultdict(lambda: defaultdict(dict))
    for i, path in enumerate(args.plans):
        with open(path, newline="") as fh:
            for r in csv.DictReader(fh):
                key, p = (r.get("family", "mixed"), r["setting"], int(r["task"])), r["planner"]
                per_file[p][i][key] = float(r["measured_ms"])
                if p not in ms[key]:
                    ms[key][p] = float(r["measured_ms"])
                    if r.get("predicted_max_device_ms"):
                        net[key + (p,)] = abs(float(r["predicted_max_device_ms"]) / float(r["measured_max_device_ms"]) - 1)
    print(f"A = {args.a}, B = {args.b}")
    for fs in dict.fromkeys(k[:2] for k in ms):
        keys = [k for k in ms if k[:2] == fs and args.a in ms[k] and args.b in ms[k]]
        if not keys:
            continue
        mean = {p: np.mean([ms[k][p] for k in keys]) for p in (args.a, args.b, *HEURISTICS) if all(p in ms[k] for k in keys)}
        full = [k for k in keys if all(h in ms[k] for h in HEURISTICS)]
        behind = {p: sum(ms[k][p] > 1.02 * min(ms[k][h] for h in HEURISTICS) for k in full) for p in (args.a, args.b)}
        nets = {p: [net[k + (p,)] for k in keys if k + (p,) in net] for p in (args.a, args.b)}
        print(f"{fs[0]:9s} {fs[1]:32s} {len(keys):2d} tasks: A {mean[args.a]:.3f} B {mean[args.b]:.3f} ({100 * (mean[args.a] / mean[args.b] - 1):+.1f}%) | "
              + " ".join(f"{h} {mean[h]:.3f}" for h in HEURISTICS if h in mean)
              + f" | > 2% behind ({len(full)} tasks): A {behind[args.a]} B {behind[args.b]}"
              + "".join(f" | net {x} {100 * np.mean(nets[p]):.1f}%" for x, p in (("A", args.a), ("B", args.b)) if nets[p]))
    for p, files in per_file.items():
        if len(files) > 1:
            (i, a), (j, b) = list(files.items())[:2]
            common = [k for k in a if k in b]
            if common:
                print(f"{p}: file {j} / file {i} on {len(common)} common tasks: {100 * (np.mean([b[k] / a[k] for k in common]) - 1):+.2f}%")


if __name__ == "__main__":
    main()
