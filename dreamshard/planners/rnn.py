"""The `rnn` planner: DreamShard's RNN baseline, the sequence-to-sequence device placer of
Mirhoseini et al. (ICML 2017), trained with REINFORCE on measured costs by
dreamshard/learned/rnn.py (the model, the training, our departures); no model is shipped: it is a
baseline we compare with (`dreamshard train --planner rnn`, then `--model`)."""

from __future__ import annotations

from dreamshard.learned import rnn
from dreamshard.planners.base import register
from dreamshard.planners.peers import PeerPlanner


@register
class RNNPlanner(PeerPlanner):
    name, description = "rnn", "seq2seq LSTM device placer (Mirhoseini et al. 2017), REINFORCE on measured costs (--model)"
    CONFIGS, default_config = rnn.CONFIGS, "paper"
    Model, who = rnn.RNNModel, "rnn placer"
    train = staticmethod(rnn.train)
    placement = staticmethod(rnn.plan_placement)
