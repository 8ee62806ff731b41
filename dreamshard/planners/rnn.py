"""The `rnn` planner: DreamShard's RNN baseline, the sequence-to-sequence device placer of
Mirhoseini et al. (ICML 2017), trained with REINFORCE on measured costs by
dreamshard/learned/rnn.py (the model, the training, our departures); no model is shipped: it is a
baseline we compare with (`dreamshard train --planner rnn`, then `--model`)."""

from __future__ import annotations

from dreamshard.planners.base import lazy_attr, register
from dreamshard.planners.peers import PeerPlanner

LEARNED = "dreamshard.learned.rnn"  # its nets and training (torch), imported on first use


@register
class RNNPlanner(PeerPlanner):
    name, description = "rnn", "seq2seq LSTM device placer (Mirhoseini et al. 2017), REINFORCE on measured costs (--model)"
    CONFIGS, default_config = lazy_attr(LEARNED, "CONFIGS"), "paper"
    Model, who = lazy_attr(LEARNED, "RNNModel"), "rnn placer"
    train = lazy_attr(LEARNED, "train")
    placement = lazy_attr(LEARNED, "plan_placement")
