"""The shipped model with its product-path features following the kernel's choice, and the tasks
where that changes its plans (CPU, a minute).

The shipped model's product-path features (nets.KernelFeatures) marked every candidate of the
path's model (paths.takes_product), as the kernel took them when the model was trained, until
39c5542 shipped this variant; since
session 11 the kernel takes only those that save more than paths.DENSE_TABLE_US
(paths.product_tables), and the simulator prices them so. Writes OUT/dreamshard_h200_kernel.pt (the
same weights, `product_rule` "kernel") and OUT/changed.csv: the (family, setting, task) of the
planner campaigns' tasks (gpu_heldout_planners.py: pool seed 11, 16 tasks per setting) where the
two give different plans, which benchmarks/gpu_kernel_rule.sh measures (elsewhere the plans are
the same, so are their measurements).

    PYTHONPATH=. python benchmarks/kernel_rule_prepare.py --out benchmarks/results/gpu_kernel_rule
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_heldout_planners import SETTINGS, setting_name, shipped_before_kernel_rule, with_product_rule  # noqa: E402
from dreamshard.families import FAMILIES, synth_family  # noqa: E402
from dreamshard.learned.nets import DreamShardModel  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402
from dreamshard.tasks import Workload, sample_tasks  # noqa: E402
from dreamshard.validation import InputError  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", type=int, default=16)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shipped = DreamShardModel.load()  # the same weights before and since 39c5542, which shipped the variant
    variant = replace(with_product_rule(shipped, "kernel"),
                      meta={**shipped.meta, "product_rule": "the shipped model's weights; product-path features as the kernel chooses (benchmarks/kernel_rule_prepare.py)"})
    path = os.path.join(args.out, "dreamshard_h200_kernel.pt")
    variant.save(path)
    a, b = shipped_before_kernel_rule(), DreamShardPlanner(path)
    workload = Workload(65_536)
    with open(os.path.join(args.out, "changed.csv"), "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["family", "setting", "task"])
        for family in FAMILIES:
            pool = synth_family(family, 300, 11)
            for n, d, cap, seed in SETTINGS:
                try:
                    tasks = sample_tasks(pool, args.tasks, (n, n), d, cap, seed=seed, workload=workload)
                except InputError:  # a setting the family's pool cannot fill (onehot at 8 GB): not measured either
                    continue
                changed = [i for i, t in enumerate(tasks) if list(a.plan(t).placement) != list(b.plan(t).placement)]
                out.writerows([family, setting_name(n, d, cap), i] for i in changed)
                print(f"{family}, {setting_name(n, d, cap)}: {len(changed)} of {len(tasks)} plans change", flush=True)


if __name__ == "__main__":
    main()
