"""AutoShard (Zha et al., KDD 2022): its network, its episodes and its training loop, CleanRL style
— every hyperparameter in `Config`, one loop in `train`. The `autoshard` planner
(dreamshard/planners/autoshard.py) trains through it.

What AutoShard is, as its paper and its authors' public code describe it:
- tables are placed one at a time, in descending order of their single-table cost predicted by
  the cost model;
- the state at step t is the table's 21 features through an MLP (21 → 128 → 32) beside the
  fraction of tables placed so far (1 → 32), fed to a 2-layer LSTM over the steps (64 wide);
- device d's action representation is the sum of the latents of the tables it holds (the same
  table MLP) beside the cost model's prediction for its shard and the shard's size (2 → 32);
- a logit per device from an MLP (192 → 128 → 128 → 64 → 1) over [state, action, state ⊙ action];
  a value head on the state (64 → 64 → 1);
- the cost model is a head on the summed table latents (32 → 64 → 1): a shard's compute, forward
  plus backward, no communication, fitted (MSE) on a replay buffer of measured shards;
- the reward comes at the end of an episode: min over devices / max over devices of the measured
  shard latencies (1 is perfect balance), or, if a device overflows its memory, the overflow as a
  negative fraction of the cap (and nothing is measured);
- an actor–learner update with V-trace targets (IMPALA), entropy bonus, baseline loss, gradient
  clipping, learning rate decayed linearly to zero.

Departures, each for a reason:
- **Synchronous actor.** The reference runs one actor process per GPU feeding a learner thread;
  here one loop plays a batch of episodes with the current weights, measures them, then learns.
  V-trace is still computed (`vtrace`), but with the behaviour policy equal to the learner's the
  importance ratios are 1 and its targets are the Monte-Carlo returns with the learned baseline —
  the on-policy case of the same update. It makes training reproducible for a seed and
  resumable from a checkpoint, which a process pool is not.
- **A budget of measured plans.** The reference trains for a number of environment steps; here the
  budget counts measured plans (episodes that fit memory), as DreamShard's does, so the two are
  compared at equal real measurements. Each measured plan measures its D shards; the log reports
  both counts.
- **Features on a fixed log scale** (`tables.features`, "fixed") instead of z-scores over the
  training tables, so a model needs no stored training statistics to place unseen tables; the
  shard size is given as a fraction of the device's memory cap (the reference gives raw bytes,
  which do not transfer between caps).
- **Memory at planning time**, and optionally in training (`Config.mask_memory`): the planner takes
  the most likely device with room at each step, and packs for memory if the policy strands a
  table (said in the plan's notes). Training follows the reference by default (an overflowing
  episode gets the negative reward, unmeasured); with `mask_memory` each step sees only the devices
  with room, as planning does. At 5 GB a device a quarter of the reference's sampled episodes
  overflow throughout 4,000 measured plans and its policy stays near uniform; masked, the balance
  reward climbs more than twice as fast (docs/dreamshard.md, "The learned peers").
- **A uniform start.** The last layer of the policy's logits MLP starts at zero (the reference
  initializes it at random, as every layer). At random it gives the devices logits that move with
  what each device holds, the same way for every table, and on the simulator the greedy plan of a
  model trained on 400 measured plans put 78% of a task's tables on one device; from zero (its
  gradient reaches it at the first update) the greedy plan follows only what training taught
  (benchmarks/results/learned_peers/memory_dev.md).

Logged numbers (one JSON line per iteration):
  iteration, lr, measurements (plans), shard_measurements  — progress
  collect/reward, collect/overflow, collect/measured_ms    — the sampled episodes: mean reward, fraction
                                                              overflowing memory, mean measured step cost
  cost/mape                                                — cost model on this iteration's fresh shards
  cost/loss, rl/loss, rl/pg_loss, rl/baseline_loss, rl/entropy
  eval/mean_ms                                             — with eval tasks: measured mean cost of the planner
  seconds
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

from dreamshard.learned.loop import BudgetConfig, Checkpoint, Measurer, NetFile, Progress, RunLog, check_training_tasks, complete, decay_lr, finished_run, mape, numpy_rng_restorer, run_meta
from dreamshard.learned import sequence
from dreamshard.learned.nets import mlp
from dreamshard.learned.sequence import Episodes, Prepared, fullest, placements, prepare, with_room
from dreamshard.tables import NUM_FEATURES
from dreamshard.tasks import Task
from dreamshard.validation import OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend

MODEL_FORMAT = "dreamshard.autoshard/1"
CHECKPOINT_FORMAT = "dreamshard.autoshard-checkpoint/1"


@dataclass
class Config(BudgetConfig):
    """Every hyperparameter; the defaults are the reference code's where it has one."""

    measures_every_iteration = True  # every played episode that fits memory is measured for its reward

    iterations: int = 50
    measurements_per_iteration: int = 8  # episodes played per iteration (the reference learner's batch B = 8)
    lr: float = 1e-3
    entropy_cost: float = 1e-3
    baseline_cost: float = 0.5
    discounting: float = 1.0
    grad_norm_clipping: float = 40.0
    rho_bar: float = 1.0  # V-trace importance-weight clips
    c_bar: float = 1.0
    cost_updates: int = 20  # cost-model steps per iteration
    cost_batch: int = 512  # shards per cost-model step
    buffer_size: int = 5000  # measured shards kept (a ring)
    # training episodes see only the devices with room, as planning does (`act`'s `room`); False
    # (the reference): the policy may overflow, and such an episode gets a negative reward (module docstring)
    mask_memory: bool = False

    def validate(self) -> "Config":
        super().validate()
        for f in ("cost_batch", "buffer_size"):
            if getattr(self, f) < 1:
                raise OptionError(f"{f} must be >= 1, got {getattr(self, f)}")
        return self


# the planner's `config(name, **overrides)` reads them; "masked": devices without room masked in training too
CONFIGS = {"paper": Config(), "masked": Config(name="masked", mask_memory=True)}


# --------------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------------


class AutoShardNet(nn.Module):
    """Policy, value and cost model on one shared table MLP (see the module docstring)."""

    def __init__(self, features: int = NUM_FEATURES, latent: int = 32):
        super().__init__()
        self.table = mlp([features, 128, latent], last_relu=True)
        self.progress = mlp([1, 32], last_relu=True)
        self.core = nn.LSTM(latent + 32, latent + 32, num_layers=2, batch_first=True)
        self.action_other = mlp([2, 32], last_relu=True)
        width = latent + 32
        self.policy = mlp([3 * width, 128, 128, 64, 1], last_relu=False)
        # the policy starts uniform over the devices (a departure: see the module docstring)
        nn.init.zeros_(self.policy[-1].weight)
        nn.init.zeros_(self.policy[-1].bias)
        self.baseline = mlp([width, 64, 1], last_relu=False)
        self.cost = mlp([latent, 64, 1], last_relu=False)
        self.register_buffer("scale", torch.tensor(1.0))  # ms per unit of the cost model's output

    def shard_cost(self, z: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Summed latents [..., L] of shards with `count` tables → predicted compute in units; 0 for
        an empty shard (as the reference's environment reports it)."""
        return self.cost(z).squeeze(-1) * (count > 0)

    def states(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x [E, T, F] in placing order → LSTM outputs [E, T, H] (steps past a length are padding)."""
        T = x.shape[1]
        frac = torch.arange(T, dtype=x.dtype)[None, :] / lengths[:, None].to(x.dtype)
        return self.core(torch.cat([self.table(x), self.progress(frac.unsqueeze(-1))], -1))[0]

    def logits(self, h: torch.Tensor, z: torch.Tensor, used: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """h [..., H], per device z [..., D, L], used (fraction of the cap) and count [..., D] → [..., D]."""
        predicted = self.shard_cost(z, count).detach()  # an observation of the environment, as in the reference
        action = torch.cat([z, self.action_other(torch.stack([predicted, used], -1))], -1)
        state = h.unsqueeze(-2).expand_as(action)
        return self.policy(torch.cat([state, action, state * action], -1)).squeeze(-1)


# --------------------------------------------------------------------------------------------
# Episodes: a batch of tasks, their tables in placing order
# --------------------------------------------------------------------------------------------


def episodes(net: AutoShardNet, prepared: Sequence[Prepared]) -> Episodes:
    """Each task's tables sorted by the cost model's single-table prediction, costliest first."""
    with torch.no_grad():
        single = [net.cost(net.table(torch.from_numpy(p.x))).squeeze(-1).numpy() for p in prepared]
    return sequence.episodes(prepared, [np.argsort(-s, kind="stable") for s in single])


def act(net: AutoShardNet, ep: Episodes, greedy: bool, generator: torch.Generator | None = None, room: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Play the episodes step by step. → (actions [E, T], behaviour log-probs [E, T], stuck [E]).
    `room`: only devices with memory left for the table are legal (planning; training with mask_memory); a task whose table
    finds none is `stuck` (its later steps still run, their placement is discarded)."""
    E, T = ep.x.shape[:2]
    D = int(ep.devices.max())
    ok, valid = ep.device_ok, ep.valid
    actions = torch.full((E, T), -1, dtype=torch.long)
    logp = torch.zeros(E, T)
    stuck = torch.zeros(E, dtype=torch.bool)
    with torch.no_grad():
        enc = net.table(ep.x)
        h = net.states(ep.x, ep.lengths)
        z = torch.zeros(E, D, enc.shape[-1])
        used, count = torch.zeros(E, D), torch.zeros(E, D)
        held = torch.zeros(E, D, dtype=torch.int64)  # exact bytes, for legality
        for t in range(T):
            legal = ok
            if room:
                legal, none = with_room(ok, held, ep.nbytes[:, t], ep.cap)
                stuck |= valid[:, t] & none
            lg = net.logits(h[:, t], z, used, count).masked_fill(~legal, -math.inf)
            a = lg.argmax(-1) if greedy else torch.multinomial(F.softmax(lg, -1), 1, generator=generator).squeeze(-1)
            logp[:, t] = F.log_softmax(lg, -1).gather(-1, a[:, None]).squeeze(-1)
            step = F.one_hot(a, D).float() * valid[:, t, None]
            z += step.unsqueeze(-1) * enc[:, t, None, :]
            used += step * ep.size[:, t, None]
            held += step.long() * ep.nbytes[:, t, None]
            count += step
            actions[:, t] = torch.where(valid[:, t], a, -1)
    return actions, logp, stuck


def replay(net: AutoShardNet, ep: Episodes, actions: torch.Tensor, room: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's pass over played episodes, all steps at once: the state of every device
    before step t is a cumulative sum of the steps before it; `room`: the legal devices of `act`
    with `room`. → (logits [E, T, D], values [E, T])."""
    D = int(ep.devices.max())
    enc = net.table(ep.x)
    step = F.one_hot(actions.clamp(min=0), D).float() * ep.valid.unsqueeze(-1)  # [E, T, D]
    contrib = step.unsqueeze(-1) * enc.unsqueeze(2)  # [E, T, D, L]
    z = contrib.cumsum(1) - contrib
    sized = step * ep.size.unsqueeze(-1)
    used, count = sized.cumsum(1) - sized, step.cumsum(1) - step
    h = net.states(ep.x, ep.lengths)
    legal = ep.device_ok.unsqueeze(1).expand(-1, ep.x.shape[1], -1)
    if room:
        placed = step.long() * ep.nbytes.unsqueeze(-1)
        room_ok, _ = with_room(legal, placed.cumsum(1) - placed, ep.nbytes, ep.cap[:, None].expand_as(ep.nbytes))
        # padding steps keep every device: their action (device 0) is read back and must stay finite
        legal = torch.where(ep.valid.unsqueeze(-1), room_ok, legal)
    logits = net.logits(h, z, used, count).masked_fill(~legal, -math.inf)
    return logits, net.baseline(h).squeeze(-1)


def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor, discounts: torch.Tensor,
           rho_bar: float = 1.0, c_bar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace (Espeholt et al. 2018) over [E, T] steps; `discounts[e, t]` is 0 where the episode
    ends at step t. → (value targets vs, policy-gradient advantages), both without gradient."""
    with torch.no_grad():
        rho = torch.exp(target_logp - behaviour_logp)
        rhos, cs = rho.clamp(max=rho_bar), rho.clamp(max=c_bar)
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], 1)
        deltas = rhos * (rewards + discounts * next_values - values)
        acc = torch.zeros_like(values[:, 0])
        diffs = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            acc = deltas[:, t] + discounts[:, t] * cs[:, t] * acc
            diffs[:, t] = acc
        vs = values + diffs
        next_vs = torch.cat([vs[:, 1:], torch.zeros_like(vs[:, :1])], 1)
        return vs, rhos * (rewards + discounts * next_vs - values)


def reward(p: Prepared, placement: np.ndarray, latencies: np.ndarray | None) -> float:
    """min/max of the measured shard latencies, or the worst overflow as a negative fraction of the cap."""
    most = fullest(p, placement)
    if most > p.cap:
        return 1.0 - most / p.cap
    return float(latencies.min() / latencies.max()) if latencies.max() > 0 else 1.0


# --------------------------------------------------------------------------------------------
# The cost model's replay buffer: measured shards
# --------------------------------------------------------------------------------------------


class ShardBuffer:
    """A ring of the last `capacity` measured shards: their tables' features and their compute (ms)."""

    def __init__(self, capacity: int):
        self.capacity, self.x, self.cost, self.next = capacity, [], [], 0

    def __len__(self) -> int:
        return len(self.x)

    def add(self, x: np.ndarray, cost: float) -> None:
        if len(self.x) < self.capacity:
            self.x.append(x)
            self.cost.append(cost)
        else:
            self.x[self.next], self.cost[self.next] = x, cost
        self.next = (self.next + 1) % self.capacity

    def sample(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features [n, Tmax, F], mask [n, Tmax], cost [n])."""
        idx = rng.integers(len(self.x), size=n)
        T = max(len(self.x[i]) for i in idx)
        x = np.zeros((n, T, self.x[0].shape[1]), np.float32)
        mask = np.zeros((n, T), np.float32)
        for k, i in enumerate(idx):
            x[k, : len(self.x[i])], mask[k, : len(self.x[i])] = self.x[i], 1.0
        return torch.from_numpy(x), torch.from_numpy(mask), torch.tensor([self.cost[i] for i in idx], dtype=torch.float32)

    def state_dict(self) -> dict:
        return {"x": [torch.from_numpy(x) for x in self.x], "cost": list(self.cost), "next": self.next, "capacity": self.capacity}

    def load_state_dict(self, state: dict) -> None:
        self.x, self.cost = [x.numpy() for x in state["x"]], [float(c) for c in state["cost"]]
        self.next, self.capacity = int(state["next"]), int(state["capacity"])


def shard_costs(net: AutoShardNet, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Predicted compute (units) of shards given as padded table features [n, T, F] and mask [n, T]."""
    z = (net.table(x) * mask.unsqueeze(-1)).sum(1)
    return net.cost(z).squeeze(-1)


# --------------------------------------------------------------------------------------------
# The model file
# --------------------------------------------------------------------------------------------


class AutoShardModel(NetFile):
    FORMAT, PLANNER = MODEL_FORMAT, "autoshard"

    @classmethod
    def build(cls, shape: dict) -> AutoShardNet:
        return AutoShardNet()


def plan_placement(net: AutoShardNet, task: Task, best_of: int = 1, seed: int = 0) -> np.ndarray | None:
    """`best_of` 1: the greedy placement among devices with room (the reference's). More: that
    many episodes sampled from the policy (seeded) among devices with room, and the one whose
    slowest shard the cost model predicts lowest. None if every episode strands a table.

    Why sampled: a policy trained on a few hundred measured plans is still near uniform, and its
    argmax follows whatever small preference the untrained network has for a device's summed
    latents — one that grows as the device fills, so the greedy episode piles most tables onto one
    device (at 400 measured plans, 81% of a task's tables at the median); its samples spread them.
    The greedy episode is not among the candidates: the same cost model, fitted on so few shards,
    prices some such piles as balanced (benchmarks/autoshard_memory.py)."""
    p = prepare(task)
    if best_of == 1:
        ep = episodes(net, [p])
        actions, _, stuck = act(net, ep, greedy=True, room=True)
        return None if bool(stuck[0]) else placements(ep, actions)[0]
    ep = episodes(net, [p] * best_of)
    actions, _, stuck = act(net, ep, greedy=False, generator=torch.Generator().manual_seed(seed), room=True)
    with torch.no_grad():
        enc = net.table(torch.from_numpy(p.x))
        best, lowest = None, math.inf
        for e, placement in enumerate(placements(ep, actions)):
            if bool(stuck[e]):
                continue
            idx = torch.from_numpy(placement)
            z = torch.zeros(task.devices, enc.shape[-1]).index_add_(0, idx, enc)
            count = torch.zeros(task.devices).index_add_(0, idx, torch.ones(len(idx)))
            slowest = float(net.shard_cost(z, count).max())
            if slowest < lowest:
                best, lowest = placement, slowest
    return best


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------

CHECKPOINT_STATE = {"model": dict, "optimizer": dict, "buffer": dict, "numpy_rng": dict, "torch_rng": torch.Tensor}


def train(cfg: Config, tasks: Sequence[Task], backend: CostBackend, out: str | Path, log: str | Path | None = None, resume: bool = False,
          eval_tasks: Sequence[Task] | None = None, progress: bool = True, stop_after: int | None = None) -> AutoShardModel:
    """Train AutoShard on `tasks` against `backend`; the model goes to `out`, the full state of
    the run to `out`.ckpt after every iteration (`resume` continues it exactly)."""
    cfg.validate()
    check_training_tasks(tasks, eval_tasks)
    prepared = [prepare(t) for t in tasks]
    checkpoint = Checkpoint(out, CHECKPOINT_FORMAT, CHECKPOINT_STATE, cfg, tasks, backend)
    ck = checkpoint.start(resume)  # before any work: nothing of another run is lost
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        net = AutoShardNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    buffer = ShardBuffer(cfg.buffer_size)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    measurer = Measurer(backend, cfg.batch_size, cfg.total_budget())
    start, shards_measured = 0, 0
    if resume:
        finished = finished_run(checkpoint, ck, cfg.iterations, out, AutoShardModel.from_state)
        if finished is not None:
            return finished
        net = AutoShardModel.from_state(ck["model"], f"{checkpoint.path}, key 'model'").net
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
        checkpoint.restore(ck, {"optimizer": optimizer.load_state_dict, "buffer": buffer.load_state_dict, "torch_rng": gen.set_state, "numpy_rng": numpy_rng_restorer(rng)})
        start, measurer.used = ck["iteration"], ck["measurements"]
        shards_measured = int(ck["model"]["meta"].get("shard_measurements", 0))
    net.train()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    run_log = RunLog(log, resume, start)
    bar = Progress(progress, cfg.iterations, start, {"collect/measured_ms": "measured", "eval/mean_ms": "eval"})
    model = AutoShardModel(net)
    done_here = 0
    for it in range(start, cfg.iterations):
        t0 = time.time()
        lr = decay_lr(optimizer, cfg.lr, it, cfg.iterations)
        row: dict = {"iteration": it, "lr": lr}

        # --- act: play episodes with the current policy, measure those that fit memory --------
        bar.phase(it, "playing and measuring")
        idx = rng.integers(len(tasks), size=max(1, cfg.measurements_at(it)))
        ep = episodes(net, [prepared[i] for i in idx])
        actions, behaviour, _ = act(net, ep, greedy=False, generator=gen, room=cfg.mask_memory)
        played = placements(ep, actions)
        fits = [k for k, i in enumerate(idx) if fullest(prepared[i], played[k]) <= prepared[i].cap]
        overflow = 1.0 - len(fits) / len(idx)
        fits = fits[: measurer.left()]
        reports = dict(zip(fits, measurer.sample([tasks[idx[k]] for k in fits], [played[k] for k in fits]))) if fits else {}
        rewards = np.zeros(len(idx), np.float32)
        fresh_x, fresh_cost = [], []
        for k, i in enumerate(idx):
            lat = None
            if k in reports:
                lat = np.array([d.fwd_comp_ms + d.bwd_comp_ms for d in reports[k].devices])
                for d in range(tasks[i].devices):
                    held = np.flatnonzero(played[k] == d)
                    if len(held):  # an empty device measures nothing
                        fresh_x.append(prepared[i].x[held])
                        fresh_cost.append(float(lat[d]))
            rewards[k] = reward(prepared[i], played[k], lat)
        if fresh_cost and len(buffer) == 0:
            net.scale.fill_(float(np.mean(fresh_cost)))  # cost units: the first shards' mean, numbers near 1 on any hardware
        if fresh_cost:
            with torch.no_grad():
                pred = [float(shard_costs(net, torch.from_numpy(x)[None], torch.ones(1, len(x)))[0]) * float(net.scale) for x in fresh_x]
            row["cost/mape"] = mape(np.array(pred), np.array(fresh_cost))
            row["collect/measured_ms"] = float(np.mean([reports[k].overall_ms for k in reports]))
        for x, c in zip(fresh_x, fresh_cost):
            buffer.add(x, c)
        shards_measured += len(fresh_cost)
        row.update({"measurements": measurer.used, "shard_measurements": shards_measured, "collect/reward": float(rewards.mean()), "collect/overflow": overflow})

        # --- learn: V-trace actor-critic on the played episodes --------------------------------
        bar.phase(it, "learning")
        logits, values = replay(net, ep, actions, room=cfg.mask_memory)
        valid = ep.valid.float()
        logp_all = F.log_softmax(logits, -1)
        target = logp_all.gather(-1, actions.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
        last = (ep.lengths - 1)[:, None] == torch.arange(ep.x.shape[1])[None, :]
        r = torch.from_numpy(rewards)[:, None] * last
        discounts = cfg.discounting * valid * ~last
        vs, adv = vtrace(behaviour * valid, target, r, values.detach() * valid, discounts, cfg.rho_bar, cfg.c_bar)
        pg_loss = -(target * adv * valid).sum()
        baseline_loss = cfg.baseline_cost * 0.5 * (((vs - values) * valid) ** 2).sum()
        # illegal devices have probability 0: their log-probs (-inf) are zeroed so no NaN reaches a gradient
        entropy_loss = cfg.entropy_cost * ((logp_all.exp() * logp_all.masked_fill(logits == -math.inf, 0.0)).sum(-1) * valid).sum()
        loss = pg_loss + baseline_loss + entropy_loss
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_norm_clipping)
        optimizer.step()
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all.masked_fill(logits == -math.inf, 0.0)).sum(-1)
        row.update({"rl/loss": loss.item(), "rl/pg_loss": pg_loss.item(), "rl/baseline_loss": baseline_loss.item(), "rl/entropy": float((entropy * valid).sum() / valid.sum())})

        # --- fit the cost model on the replay buffer of measured shards ------------------------
        losses = []
        for _ in range(cfg.cost_updates if len(buffer) else 0):
            x, mask, cost = buffer.sample(cfg.cost_batch, rng)
            cost_loss = ((shard_costs(net, x, mask) - cost / net.scale) ** 2).mean()
            optimizer.zero_grad()
            cost_loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_norm_clipping)
            optimizer.step()
            losses.append(cost_loss.item())
        row["cost/loss"] = float(np.mean(losses)) if losses else math.nan

        if eval_tasks:
            bar.phase(it, "evaluating")
            net.eval()
            chosen = [complete(t, p, p is None) for t, p in ((t, plan_placement(net, t)) for t in eval_tasks)]
            row["eval/mean_ms"] = measurer.mean_cost(eval_tasks, chosen)
            net.train()

        row["seconds"] = time.time() - t0
        run_log.write(row)
        model.meta = {**run_meta(cfg, backend.name, tasks, measurer.used, it + 1), "shard_measurements": shards_measured}
        checkpoint.save(it + 1, measurer.used, model=model.state(), optimizer=optimizer.state_dict(),
                        buffer=buffer.state_dict(), numpy_rng=rng.bit_generator.state, torch_rng=gen.get_state())
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

