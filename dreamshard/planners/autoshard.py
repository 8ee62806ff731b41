"""The `autoshard` planner: AutoShard's policy (Zha et al., KDD 2022) places the tables one at a
time, costliest first by its cost model, an LSTM over the placements so far — milliseconds, no GPU;
the plan is its greedy episode (the reference's) or, with `best_of` > 1, the best of that many
sampled episodes by its cost model (`learned.autoshard.plan_placement`).
Trained against a cost backend by dreamshard/learned/autoshard.py (the paper's algorithm and our
departures from it), as its authors train it (`dreamshard train --planner autoshard`, then
`--model`); without `--model`, the model shipped for this GPU where there is one
(`dreamshard.shipped`; trained by benchmarks/gpu_train_shipped.py)."""

from __future__ import annotations

from dreamshard.planners.base import lazy_attr, register
from dreamshard.planners.peers import DescribedModel, PeerPlanner
from dreamshard.validation import OptionError

LEARNED = "dreamshard.learned.autoshard"  # its nets and training (torch), imported on first use
# the greedy episode, as the reference plans: the best of 16 sampled ones plans worse on the
# simulator, and the shipped H100 model's measured slower than its greedy plans on 7 of 8 held-out
# tasks (docs/dreamshard.md, "The learned peers")
BEST_OF = 1


@register
class AutoShardPlanner(PeerPlanner):
    name, description = "autoshard", DescribedModel("AutoShard (KDD 2022): LSTM policy over placements, trained by V-trace against a cost backend")
    CONFIGS, default_config = lazy_attr(LEARNED, "CONFIGS"), "paper"
    Model, who = lazy_attr(LEARNED, "AutoShardModel"), "autoshard policy"
    train = lazy_attr(LEARNED, "train")
    placement = lazy_attr(LEARNED, "plan_placement")

    def __init__(self, model=None, best_of: int = BEST_OF, seed: int = 0):
        if isinstance(best_of, bool) or not isinstance(best_of, int) or best_of < 1:
            raise OptionError(f"autoshard: best_of must be an integer >= 1, got {best_of!r:.40}")
        super().__init__(model)
        self.best_of, self.seed = best_of, seed

    def place(self, task):
        return type(self).placement(self.model.net, task, self.best_of, self.seed)
