"""DreamShard's RNN baseline: the sequence-to-sequence device placer of Mirhoseini et al.,
"Device Placement Optimization with Reinforcement Learning" (ICML 2017), trained with REINFORCE on
measured costs under the same budget as DreamShard. The `rnn` planner trains through it.

The 2017 placer reads a TensorFlow graph's ops in topological order and writes one device per op;
here the ops are tables:
- tables are read largest first (bytes; tables have no topological order, so a canonical one);
- encoder: each table's 21 features (fixed log scale) through a linear layer and a ReLU into an
  LSTM; decoder: an LSTM whose input at step t is the embedding of the device chosen at step t−1
  beside the encoder's output for table t; content-based (dot-product) attention over every
  encoder output; the logits over the model's devices from [decoder output, attention context];
- reward R = −sqrt(measured step cost / scale), where scale is the first measured plans' mean cost
  (the 2017 paper rewards −sqrt(run time)); baseline an exponential moving average of R; REINFORCE
  with an entropy bonus, Adam, gradient clipping.

Departures: a plan is a sample of the policy (seeded), not its most likely device at each step
(`plan_placement` says why); devices without memory for the table are masked out (the 2017 placer met a memory
limit only as a failed run with a large penalty time; masking keeps every measured plan valid, so
no measurement is wasted), and when a table fits nowhere the episode is not measured and gets the
batch's worst reward. The output layer has one logit per device of the widest training task: a
model places tasks of up to that many devices and has no plan for wider ones (NoPlanError: a
file of tasks, `compare` and the demo go on with the others).

Logged numbers (one JSON line per iteration): iteration, lr, measurements, collect/measured_ms,
collect/stuck, rl/loss, rl/entropy, rl/baseline, eval/mean_ms (with eval tasks), seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dreamshard.learned import sequence
from dreamshard.learned.loop import BudgetConfig, Checkpoint, Measurer, NetFile, Progress, RunLog, check_training_tasks, complete, decay_lr, finished_run, numpy_rng_restorer, run_meta
from dreamshard.learned.nets import mlp
from dreamshard.learned.sequence import Episodes, Prepared, placements, prepare, with_room
from dreamshard.tables import NUM_FEATURES
from dreamshard.tasks import Task
from dreamshard.validation import NoPlanError, OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend

MODEL_FORMAT = "dreamshard.rnn/1"
CHECKPOINT_FORMAT = "dreamshard.rnn-checkpoint/1"


@dataclass
class Config(BudgetConfig):
    """Every hyperparameter."""

    measures_every_iteration = True  # REINFORCE on the episodes measured in the iteration

    iterations: int = 40  # × 10 measured plans: DreamShard's budget of 400
    hidden: int = 64
    lr: float = 1e-3
    entropy_weight: float = 1e-2
    baseline_decay: float = 0.9  # the moving-average baseline's weight on its past
    grad_norm_clipping: float = 1.0

    def validate(self) -> "Config":
        super().validate()
        if self.hidden < 1:
            raise OptionError(f"hidden must be >= 1, got {self.hidden}")
        if not 0 <= self.baseline_decay < 1:
            raise OptionError(f"baseline_decay must be in [0, 1), got {self.baseline_decay}")
        return self


CONFIGS = {"paper": Config()}  # the planner's `config(name, **overrides)` reads them


class Seq2SeqPlacer(nn.Module):
    def __init__(self, devices: int, features: int = NUM_FEATURES, hidden: int = 64):
        super().__init__()
        self.devices = devices
        self.embed = mlp([features, hidden], last_relu=True)
        self.encoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.device_embed = nn.Embedding(devices + 1, hidden)  # index `devices`: the start token
        self.decoder = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.out = mlp([2 * hidden, hidden, devices], last_relu=False)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(x))[0]

    def logits(self, dec: torch.Tensor, enc: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Decoder outputs [E, S, H] attending over encoder outputs [E, T, H] (valid [E, T]) → [E, S, devices]."""
        scores = (dec @ enc.transpose(1, 2)).masked_fill(~valid[:, None, :], -math.inf)
        context = F.softmax(scores, -1) @ enc
        return self.out(torch.cat([dec, context], -1))

    def inputs(self, enc: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """The decoder's input: the embedding of the previous device (or the start token) beside the table's encoding."""
        return torch.cat([self.device_embed(previous), enc], -1)


def order(p: Prepared) -> np.ndarray:
    return np.argsort(-p.size, kind="stable")


def start(net: Seq2SeqPlacer, ep: Episodes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(encoder outputs, the task's devices among the model's [E, devices], valid steps)."""
    if int(ep.devices.max()) > net.devices:
        raise NoPlanError(f"this rnn model places tasks of up to {net.devices} devices; the task has {int(ep.devices.max())} (train a model on tasks as wide)")
    ok = torch.arange(net.devices)[None, :] < ep.devices[:, None]
    return net.encode(ep.x), ok, ep.valid


def act(net: Seq2SeqPlacer, ep: Episodes, greedy: bool, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode step by step among the devices with room. → (actions [E, T], stuck [E])."""
    E, T = ep.x.shape[:2]
    actions = torch.full((E, T), -1, dtype=torch.long)
    stuck = torch.zeros(E, dtype=torch.bool)
    with torch.no_grad():
        enc, ok, valid = start(net, ep)
        used = torch.zeros(E, net.devices, dtype=torch.int64)
        previous = torch.full((E,), net.devices, dtype=torch.long)
        state = None
        for t in range(T):
            dec, state = net.decoder(net.inputs(enc[:, t : t + 1], previous[:, None]), state)
            legal, none = with_room(ok, used, ep.nbytes[:, t], ep.cap)
            stuck |= valid[:, t] & none
            lg = net.logits(dec, enc, valid)[:, 0].masked_fill(~legal, -math.inf)
            a = lg.argmax(-1) if greedy else torch.multinomial(F.softmax(lg, -1), 1, generator=generator).squeeze(-1)
            used += F.one_hot(a, net.devices) * ep.nbytes[:, t, None] * valid[:, t, None]
            actions[:, t] = torch.where(valid[:, t], a, -1)
            previous = a
    return actions, stuck


def replay(net: Seq2SeqPlacer, ep: Episodes, actions: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits of played episodes, all steps at once, masked as `act` masked them. → [E, T, devices]."""
    enc, ok, valid = start(net, ep)
    a = actions.clamp(min=0)
    previous = torch.cat([torch.full_like(a[:, :1], net.devices), a[:, :-1]], 1)
    dec = net.decoder(net.inputs(enc, previous))[0]
    step = F.one_hot(a, net.devices) * valid.unsqueeze(-1) * ep.nbytes.unsqueeze(-1)  # int64 bytes
    legal, _ = with_room(ok.unsqueeze(1), step.cumsum(1) - step, ep.nbytes, ep.cap[:, None])
    return net.logits(dec, enc, valid).masked_fill(~legal, -math.inf)


class RNNModel(NetFile):
    FORMAT, PLANNER, SHAPE = MODEL_FORMAT, "rnn", ("devices", "hidden")

    @classmethod
    def build(cls, shape: dict) -> Seq2SeqPlacer:
        return Seq2SeqPlacer(shape["devices"], hidden=shape["hidden"])

    def shape(self) -> dict:
        return {"devices": self.net.devices, "hidden": self.net.embed[0].out_features}


PLAN_SEED = 0


def plan_placement(net: Seq2SeqPlacer, task: Task) -> np.ndarray | None:
    """A placement sampled from the policy among devices with room (seeded: the same plan every
    time), or None if a table fits nowhere. Not each step's most likely device: a policy learned
    from a few hundred measured plans is near uniform with small biases, and the decoder, fed its
    previous device, then takes the same one at every step (its argmax put 20 of 20 and 75 of 80
    tables on one device of the paper's settings, on the simulator)."""
    p = prepare(task)
    ep = sequence.episodes([p], [order(p)])
    actions, stuck = act(net, ep, greedy=False, generator=torch.Generator().manual_seed(PLAN_SEED))
    return None if bool(stuck[0]) else placements(ep, actions)[0]


CHECKPOINT_STATE = {"model": dict, "optimizer": dict, "baseline": float, "scale": float, "numpy_rng": dict, "torch_rng": torch.Tensor}


def train(cfg: Config, tasks: Sequence[Task], backend: CostBackend, out: str | Path, log: str | Path | None = None, resume: bool = False,
          eval_tasks: Sequence[Task] | None = None, progress: bool = True, stop_after: int | None = None) -> RNNModel:
    """Train the RNN placer on `tasks` against `backend`; the model goes to `out`, the full state
    of the run to `out`.ckpt after every iteration (`resume` continues it exactly)."""
    cfg.validate()
    check_training_tasks(tasks, eval_tasks)
    prepared = [prepare(t) for t in tasks]
    checkpoint = Checkpoint(out, CHECKPOINT_FORMAT, CHECKPOINT_STATE, cfg, tasks, backend)
    ck = checkpoint.start(resume)  # before any work: nothing of another run is lost
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        net = Seq2SeqPlacer(max(t.devices for t in tasks), hidden=cfg.hidden)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    measurer = Measurer(backend, cfg.batch_size, cfg.total_budget())
    start_it, baseline, scale = 0, math.nan, math.nan
    if resume:
        finished = finished_run(checkpoint, ck, cfg.iterations, out, RNNModel.from_state)
        if finished is not None:
            return finished
        net = RNNModel.from_state(ck["model"], f"{checkpoint.path}, key 'model'").net
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
        checkpoint.restore(ck, {"optimizer": optimizer.load_state_dict, "torch_rng": gen.set_state, "numpy_rng": numpy_rng_restorer(rng)})
        start_it, measurer.used, baseline, scale = ck["iteration"], ck["measurements"], ck["baseline"], ck["scale"]
    net.train()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    run_log = RunLog(log, resume, start_it)
    bar = Progress(progress, cfg.iterations, start_it, {"collect/measured_ms": "measured", "eval/mean_ms": "eval"})
    model = RNNModel(net)
    done_here = 0
    for it in range(start_it, cfg.iterations):
        t0 = time.time()
        lr = decay_lr(optimizer, cfg.lr, it, cfg.iterations)
        row: dict = {"iteration": it, "lr": lr}
        n = min(cfg.measurements_at(it), measurer.left())
        if n > 0:
            bar.phase(it, "sampling and measuring")
            idx = rng.integers(len(tasks), size=n)
            chosen = [prepared[i] for i in idx]
            ep = sequence.episodes(chosen, [order(p) for p in chosen])
            actions, stuck = act(net, ep, greedy=False, generator=gen)
            played = placements(ep, actions)
            ok = [k for k in range(n) if not stuck[k]]
            costs = np.full(n, math.nan)
            if ok:
                for k, r in zip(ok, measurer.sample([tasks[idx[k]] for k in ok], [played[k] for k in ok])):
                    costs[k] = r.overall_ms
                if math.isnan(scale):
                    scale = float(np.nanmean(costs))  # rewards in units of the first plans' cost: near 1 on any hardware
            rewards = -np.sqrt(costs / scale) if ok else np.zeros(n)
            rewards = np.where(np.isnan(rewards), np.nanmin(rewards) if ok else 0.0, rewards)  # stuck: the batch's worst
            for r in rewards:  # the 2017 paper's moving-average baseline, one sample at a time
                baseline = r if math.isnan(baseline) else cfg.baseline_decay * baseline + (1 - cfg.baseline_decay) * r
            logits = replay(net, ep, actions)
            logp_all = F.log_softmax(logits, -1)
            valid = ep.valid.float()
            logp = (logp_all.gather(-1, actions.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid).sum(1)
            entropy = (-(logp_all.exp() * logp_all.masked_fill(logits == -math.inf, 0.0)).sum(-1) * valid).sum(1) / valid.sum(1)
            advantage = torch.from_numpy(rewards - baseline).float()
            loss = -(advantage * logp).mean() - cfg.entropy_weight * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_norm_clipping)
            optimizer.step()
            row.update({"collect/measured_ms": float(np.nanmean(costs)) if ok else math.nan, "collect/stuck": float(stuck.float().mean()),
                        "rl/loss": loss.item(), "rl/entropy": entropy.mean().item(), "rl/baseline": float(baseline)})
        row["measurements"] = measurer.used
        if eval_tasks:
            bar.phase(it, "evaluating")
            net.eval()
            chosen_plans = [complete(t, p, p is None) for t, p in ((t, plan_placement(net, t)) for t in eval_tasks)]
            row["eval/mean_ms"] = measurer.mean_cost(eval_tasks, chosen_plans)
            net.train()
        row["seconds"] = time.time() - t0
        run_log.write(row)
        model.meta = run_meta(cfg, backend.name, tasks, measurer.used, it + 1)
        checkpoint.save(it + 1, measurer.used, model=model.state(), optimizer=optimizer.state_dict(),
                        baseline=float(baseline), scale=float(scale), numpy_rng=rng.bit_generator.state, torch_rng=gen.get_state())
        bar.done(it, row)
        done_here += 1
        if stop_after is not None and done_here >= stop_after and it + 1 < cfg.iterations:
            bar.close()
            return model
    bar.close()
    net.eval()
    checkpoint.check_unchanged()
    model.save(out)
    return model
