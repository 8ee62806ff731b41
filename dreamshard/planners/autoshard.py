"""The `autoshard` planner: AutoShard's policy (Zha et al., KDD 2022) places the tables one at a
time, costliest first by its cost model, an LSTM over the placements so far — milliseconds, no GPU.
Trained against a cost backend by dreamshard/learned/autoshard.py (the paper's algorithm and our
departures from it), as its authors train it (`dreamshard train --planner autoshard`, then
`--model`); without `--model`, the model shipped for this GPU where there is one
(`dreamshard.shipped`; trained by benchmarks/gpu_train_shipped.py)."""

from __future__ import annotations

from dreamshard.planners.base import lazy_attr, register
from dreamshard.planners.peers import DescribedModel, PeerPlanner

LEARNED = "dreamshard.learned.autoshard"  # its nets and training (torch), imported on first use


@register
class AutoShardPlanner(PeerPlanner):
    name, description = "autoshard", DescribedModel("AutoShard (KDD 2022): LSTM policy over placements, trained by V-trace against a cost backend")
    CONFIGS, default_config = lazy_attr(LEARNED, "CONFIGS"), "paper"
    Model, who = lazy_attr(LEARNED, "AutoShardModel"), "autoshard policy"
    train = lazy_attr(LEARNED, "train")
    placement = lazy_attr(LEARNED, "plan_placement")
