"""Which measured DreamShard plans the heuristic candidates change (CPU): for every task of a
campaign's plans.csv measured under a model's label, the model's plan with the greedy heuristics
competing (today's default) against the policy's plan alone. Lists the tasks where the two differ
and which heuristic won: those are the tasks a campaign measured before the candidates existed
must re-measure (benchmarks/results/gpu_families_planners_pp2/: hot tasks 0-3, in hot_first/).
With --seed-offset, a campaign of fresh tasks.

    PYTHONPATH=. python benchmarks/candidates_check.py benchmarks/results/gpu_families_planners_pp2/call1/plans.csv \\
        "dreamshard (pp2.pt)" benchmarks/results/gpu_shipped_model_pp2/model_gpu.pt
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_heldout_planners import measured_plans  # noqa: E402

from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans_csv")
    ap.add_argument("label", help="the model's label in plans.csv, e.g. 'dreamshard (pp2.pt)'")
    ap.add_argument("model", help="the model file measured under that label")
    ap.add_argument("--seed-offset", type=int, default=0, help="the campaign's --seed-offset")
    args = ap.parse_args()
    with_candidates = DreamShardPlanner(model=args.model)
    changed, per_family = [], collections.Counter()
    for family, setting, row, policy_plan in measured_plans(args.plans_csv, {args.label: DreamShardPlanner(model=args.model, heuristic_candidates=False)},
                                                          seed_offset=args.seed_offset):
        plan = with_candidates.plan(policy_plan.task)
        per_family[family] += 1
        if plan.placement != policy_plan.placement:
            changed.append((family, setting, row["task"], plan.notes[0]))
    print(f"{sum(per_family.values())} tasks ({', '.join(f'{f} {n}' for f, n in per_family.items())}); the candidates change {len(changed)}:")
    for family, setting, task, note in changed:
        print(f"  {family}: {setting} task {task}: {note}")


if __name__ == "__main__":
    main()
