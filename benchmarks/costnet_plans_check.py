"""DreamShard models' cost nets against plans measured on an H200 (CPU, from campaigns' plans.csv):
the tasks re-drawn and re-planned (every planner is deterministic), each plan priced by each
model's cost net under both rules for its product-path features (nets.PRODUCT_RULES: every
candidate of the path's model, as the model was trained, or the tables the kernel takes today),
max-device error against the measured step, per family, setting and the planner that made the plan.

    PYTHONPATH=. python benchmarks/costnet_plans_check.py benchmarks/results/gpu_cache_model/train/mixed/plans.csv ... \\
        --model benchmarks/results/gpu_cache_model/train/model_gpu.pt
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_heldout_planners import HEURISTICS, measured_plans, shipped_before_kernel_rule, with_product_rule  # noqa: E402
from dreamshard.learned.mdp import EpisodeBatch, predict, prepare  # noqa: E402
from dreamshard.learned.nets import PRODUCT_RULES, DreamShardModel  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.dreamshard import DreamShardPlanner  # noqa: E402

SHIPPED = "dreamshard_h200.pt"


def net_max_device_ms(model: DreamShardModel, plan) -> float:
    """The cost net's step of a plan: the max over devices of its three heads, in ms."""
    p = prepare(plan.task, model.normalization, model.linear_features, model.kernel)
    out, _ = predict(model.cost_net, EpisodeBatch.of([p]), torch.tensor([plan.placement]), model.comm)
    return float(out[0].sum(-1).max()) * float(model.cost_net.scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans_csv", nargs="+")
    ap.add_argument("--model", action="append", default=[], help="a model file measured beside the shipped one (as the campaign's --model)")
    ap.add_argument("--pool-tables", type=int, default=300)
    args = ap.parse_args()
    files = {SHIPPED: None, **{os.path.basename(m): m for m in args.model}}
    # the labels campaigns gave the shipped model's plans (by name since session 12); it planned with
    # the candidate rule in every campaign read here (before 2026-11-25's product-rule commit)
    before = shipped_before_kernel_rule()
    planners = {"dreamshard (shipped)": before, f"dreamshard ({SHIPPED})": before,
                **{f"dreamshard ({name})": DreamShardPlanner(path) for name, path in files.items() if path}, **{h: get_planner(h) for h in HEURISTICS}}
    nets = {}
    for name, path in files.items():
        model = DreamShardModel.load(path)
        for rule in PRODUCT_RULES:
            nets[f"{name} ({rule})"] = with_product_rule(model, rule)
    err: dict[tuple, list[np.ndarray]] = {}
    for path in args.plans_csv:
        for family, setting, row, plan in measured_plans(path, planners, pool_tables=args.pool_tables):
            m = float(row["measured_max_device_ms"])
            by = row["planner"].replace(f"({SHIPPED})", "(shipped)")
            err.setdefault((family, setting, "heuristics" if by in HEURISTICS else by), []).append(
                np.array([(net_max_device_ms(model, plan) - m) / m for model in nets.values()]))
    print("Cost nets' max-device error on measured plans, MAPE (mean signed); a row per family, setting and plan maker\n")
    print("| family | setting | plans by | plans | " + " | ".join(nets) + " |\n|---|---|---|---:|" + "---:|" * len(nets))
    for (family, setting, by), e in sorted(err.items()):
        e = np.array(e)
        cells = " | ".join(f"{100 * np.mean(np.abs(e[:, k])):.2f}% ({100 * np.mean(e[:, k]):+.1f}%)" for k in range(len(nets)))
        print(f"| {family} | {setting} | {by} | {len(e)} | {cells} |")


if __name__ == "__main__":
    main()
