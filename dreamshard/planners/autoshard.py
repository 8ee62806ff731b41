"""The `autoshard` planner: AutoShard's policy (Zha et al., KDD 2022) places the tables one at a
time, costliest first by its cost model, an LSTM over the placements so far — milliseconds, no GPU.
Trained against a cost backend by dreamshard/learned/autoshard.py (the paper's algorithm and our
departures from it); no model is shipped: it is a peer we compare with, trained here as its
authors train it (`dreamshard train --planner autoshard`, then `--model`)."""

from __future__ import annotations

from dreamshard.planners.base import lazy_attr, register
from dreamshard.planners.peers import PeerPlanner

LEARNED = "dreamshard.learned.autoshard"  # its nets and training (torch), imported on first use


@register
class AutoShardPlanner(PeerPlanner):
    name, description = "autoshard", "AutoShard (KDD 2022): LSTM policy over placements, trained by V-trace against a cost backend (--model)"
    CONFIGS, default_config = lazy_attr(LEARNED, "CONFIGS"), "paper"
    Model, who = lazy_attr(LEARNED, "AutoShardModel"), "autoshard policy"
    train = lazy_attr(LEARNED, "train")
    placement = lazy_attr(LEARNED, "plan_placement")
