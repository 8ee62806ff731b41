"""The `rnn` planner: DreamShard's RNN baseline, the sequence-to-sequence device placer of
Mirhoseini et al. (ICML 2017), trained with REINFORCE on measured costs by
dreamshard/learned/rnn.py (the model, the training, our departures): a baseline we compare with
(`dreamshard train --planner rnn`, then `--model`); without `--model`, the model shipped for this
GPU where there is one (`dreamshard.shipped`; trained by benchmarks/gpu_train_shipped.py)."""

from __future__ import annotations

from dreamshard.planners.base import lazy_attr, register
from dreamshard.planners.peers import DescribedModel, PeerPlanner

LEARNED = "dreamshard.learned.rnn"  # its nets and training (torch), imported on first use


@register
class RNNPlanner(PeerPlanner):
    name, description = "rnn", DescribedModel("seq2seq LSTM device placer (Mirhoseini et al. 2017), REINFORCE on measured costs")
    CONFIGS, default_config = lazy_attr(LEARNED, "CONFIGS"), "paper"
    Model, who = lazy_attr(LEARNED, "RNNModel"), "rnn placer"
    train = lazy_attr(LEARNED, "train")
    placement = lazy_attr(LEARNED, "plan_placement")
