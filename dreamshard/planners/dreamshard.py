"""The `dreamshard` planner: a trained policy plays the cost net's MDP, and a search at plan time
spends more of the same policy where the cost net says it pays — milliseconds, no GPU.
A `LearnedPlanner`: `fit` trains a model (the loop of dreamshard/learned/dreamshard.py, as
`dreamshard train` does), `save`/`load` or the `model` option give its file; the shipped model
by default.

Table-wise: the policy plays the greedy episode and `best_of` − 1 sampled ones in one batch; the
greedy heuristics' plans compete with it by the same cost net (`heuristic_candidates`, on by
default; off, they are used only when every episode runs out of memory); the cheapest is kept.

The search (`split`, on by default; docs/dreamshard.md, "Splitting"). Candidates, all priced by
the cost net (`scoring.PieceScorer`), the cheapest returned with its source in
`predicted["candidate"]`:
- the table-wise plan above ("policy", or "heuristic NAME");
- the learned split action ("learned cuts"): a model with a cut net (`nets.CutNet`, trained in
  the estimated MDP: per table whole, column halves or quarters) plays `best_of` episodes of cuts
  and placements on the task's cut set in one batch (`_learned_cuts`), the cuts of the cheapest
  distinct episodes also placed by NeuroShard's greedy under swept dim caps ("learned cuts, greedy
  placement"); a model without a cut net has the policy place a ladder of hand-made cuts instead
  ("cut ladder");
- row splits (docs/rowwise.md; not an action of the MDP, whose legality cannot keep a table's
  blocks on distinct devices): the 1 and 2 costliest tables that may pay split by rows over every
  device, placed by NeuroShard's greedy on the cost net ("row ladder");
- a beam from those (" + beam", `_beam`): NeuroShard's beam search (`scoring.beam_search`:
  halvings and row splits, each candidate placed by the greedy under swept dim caps), started
  from the cheapest plan so far and the cut sets the cut net proposed instead of from whole
  tables, BEAM_DEPTH steps (on a task of several hosts up to BEAM_EXTEND more while each lowers
  the plan; up to BEAM_MAX_TABLES tables, BEAM_MAX_TABLES_HOSTS on several hosts);
- the split descent from the cheapest of those (" + descent", `split_descent`): the cost net
  repeatedly halves a piece on the device it predicts slowest and moves one half, or splits a
  whole table there by rows over k devices, while that lowers the prediction (at most
  `max_splits` moves); its pieces placed afresh by the greedy where that is cheaper;
- the oracle's annealing on the cost net (" + annealing on the cost net" after the source of the
  start it found its plan from; `_anneal`: moves, swaps, halvings and merges of column pieces,
  `anneal` placements priced) from the cheapest so far (without row pieces; with `anneal_rows`
  also with them, its other pieces annealed around them) — with
  `anneal_lookup` also from the lookup plans and a restart ("lookup", "lookup --split", "a
  restart") —, kept where the net prices it `anneal_margin` lower.
With `budget_ms`, rounds of sampled cuts (another seed each) and their descents, and of the
annealing from the cheapest so far (another seed each), go on until the time is spent: more
planning time buys more candidates. A table larger than a device is
placeable only split by rows: the search then starts from it split so
(`splits.forced_row_splits`), its pieces placed by NeuroShard's greedy on the cost net
(`scoring.greedy_batch`); with `split` off such a task is infeasible.

At the largest sizes the work is bounded (`episodes`, SAMPLED_DEVICE_STEPS; CUTS_MAX_TABLES) and
the plan's notes say what was left out: fewer sampled episodes, no learned cuts.
"""


from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from dreamshard import shipped
from dreamshard.packing import InfeasibleError, over_bounds
from dreamshard.plan import Plan, Shard
from dreamshard.planners import splits
from dreamshard.planners.base import LazyImports, LearnedPlanner, lazy_attr, register
from dreamshard.planners.heuristics import GREEDY_PLANNERS, greedy, task_infeasible
from dreamshard.planners.oracle import Annealer, Pricer
from dreamshard.tasks import Task
from dreamshard.topology import several_hosts
from dreamshard.validation import DIM_MULTIPLE

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend
    from dreamshard.learned.dreamshard import Config

# torch and the nets: bound when a planner is built (base.LazyImports), so listing the registry
# does not import torch
lazy = LazyImports(globals(), {
    "torch": None,
    "dreamshard.learned.dreamshard": "train",
    "dreamshard.learned.mdp": "CUT_MAX CutSet EpisodeBatch FastPlayer best_placement cut_set plan_cuts predict prepare",
    "dreamshard.learned.nets": "DreamShardModel plan_cost",
    "dreamshard.planners.scoring": "PieceScorer beam_search comm_params greedy_batch greedy_groups predicted_dict",
})
__getattr__ = lazy.getattr


def row_trials(scorer: PieceScorer, pieces: list[Shard], slots: np.ndarray, mine: list[int], state: np.ndarray, used: np.ndarray, slow: int, order: np.ndarray,
               candidates: int, cost: float) -> list[tuple[int, list[Shard], list[int]]]:
    """The descent's row moves: (piece, its row pieces, their devices) of each row split of one
    of the `candidates` costliest whole tables among the pieces `mine` on `slow` that may pay
    (`PieceScorer.row_candidates`, and whose `bound_without` beats `cost`: only those are
    measured), over each `splits.row_parts` k that fits memory: over all D, block r on device r;
    else on `slow` and the k − 1 first of `order` (fastest first), blocks in device order. The
    row pieces are not measured here (the caller measures a step's new pieces together)."""
    task = scorer.task
    G = splits.host_gpus(task)
    out = []
    for i in scorer.row_candidates(pieces, mine, candidates):
        if not scorer.bound_without(state, slow, pieces[i]) < cost * (1 - 1e-3):
            continue
        for parts in splits.task_row_parts(task):
            rows = splits.row_split(task, pieces[i].table, parts)
            if rows is None:
                continue
            if parts == task.devices:
                to = list(range(task.devices))
            elif parts == G:  # table-row-wise: block r on GPU r of the slow device's host (splits.twrw_blocks)
                to = list(range(slow // G * G, (slow // G + 1) * G))
            else:
                to = sorted([slow] + [int(d) for d in order if d != slow][: parts - 1])
            free = used.copy()
            free[slow] -= scorer.bytes[slots[i]]
            free[to] += splits.sizes(task, rows)  # a table's blocks go to distinct devices
            if free.max() <= task.max_memory_bytes:
                out.append((i, rows, to))
    return out


def split_descent(scorer: PieceScorer, pieces: list[Shard], devices: list[int], state: np.ndarray, max_splits: int, candidates: int = 4,
                  targets: int = 8) -> tuple[list[Shard], list[int], float]:
    """Greedy descent in split space on the cost net from `pieces` on `devices` (their device
    states `state`, `PieceScorer.state`): halve one of the `candidates` costliest pieces on the
    device predicted slowest and move one half to one of the `targets` devices predicted fastest
    (with memory for it), or split one of its `candidates` costliest whole tables by rows
    (`row_trials`) — the move that lowers the predicted plan cost most; stop when none lowers it
    or after `max_splits` moves. → (pieces, devices, cost units)."""
    task, cap = scorer.task, scorer.task.max_memory_bytes
    pieces, devices = list(pieces), list(devices)
    slots = scorer.slots([pieces])[0]  # the pieces' cache slots, kept in step with them
    used = np.zeros(task.devices, np.int64)
    np.add.at(used, devices, scorer.bytes[slots])
    cost = float(scorer.score(state))
    for _ in range(max_splits):
        totals = scorer.device_costs(state).sum(-1)
        slow = int(totals.argmax())
        mine = np.flatnonzero(np.array(devices) == slow)
        single = scorer.single[slots[mine]]
        cut = [int(mine[j]) for j in np.argsort(-single, kind="stable") if splits.can_halve(pieces[mine[j]])][:candidates]
        order = np.argsort(totals, kind="stable")
        to = np.array([d for d in order if d != slow][:targets], np.int64)
        if not len(to):
            break
        halves = [splits.cut(pieces[i], 2) for i in cut]
        by_rows = row_trials(scorer, pieces, slots, mine.tolist(), state, used, slow, order, candidates, cost)
        scorer.measure([p for h in halves for p in h] + [p for _, blocks, _ in by_rows for p in blocks])  # in one batch
        score = np.full((0, 0), np.inf)
        if cut:
            hslots = scorer.slots(halves)  # [C, 2]
            hrows = scorer.table[hslots]
            C, K = len(cut), len(to)
            trial = np.repeat(np.repeat(state[None, None], C, 0), K, 1)  # [C, K, D, R]
            trial[:, :, slow] += (hrows[:, 0] - scorer.table[slots[cut]])[:, None]
            trial[np.arange(C)[:, None], np.arange(K)[None, :], to[None, :]] += hrows[:, 1][:, None]
            moved = scorer.bytes[hslots[:, 1]]
            fits = used[to][None, :] + moved[:, None] <= cap
            score = np.where(fits, scorer.score(trial), np.inf)
        row_states = np.repeat(state[None], len(by_rows), 0)
        for trial_state, (i, blocks, on) in zip(row_states, by_rows):
            trial_state[slow] -= scorer.table[slots[i]]
            trial_state[on] += scorer.rows([blocks])[0]  # a table's blocks go to distinct devices
        row_score = scorer.score(row_states) if by_rows else np.full(0, np.inf)
        if len(row_score) and (not score.size or row_score.min() < score.min()):
            j = int(row_score.argmin())
            if not row_score[j] < cost * (1 - 1e-3):  # a split must pay by more than rounding
                break
            i, blocks, on = by_rows[j]
            bslots = scorer.slots([blocks])[0]
            used[slow] -= scorer.bytes[slots[i]]
            used[on] += scorer.bytes[bslots]
            slots = np.concatenate([np.delete(slots, i), bslots])
            pieces = pieces[:i] + pieces[i + 1 :] + blocks
            devices = devices[:i] + devices[i + 1 :] + on
            state, cost = row_states[j], float(row_score[j])
            continue
        if not score.size:
            break
        c, k = np.unravel_index(int(score.argmin()), score.shape)
        if not score[c, k] < cost * (1 - 1e-3):  # a cut must pay by more than rounding
            break
        i, (keep, move) = cut[c], halves[c]
        used[slow] -= scorer.bytes[slots[i]] - scorer.bytes[hslots[c, 0]]
        used[to[k]] += moved[c]
        slots = np.append(slots, hslots[c, 1])
        slots[i] = hslots[c, 0]
        pieces[i] = keep
        pieces.append(move)
        devices.append(int(to[k]))
        state, cost = trial[c, k], float(score[c, k])
    return pieces, devices, cost


# the beam from the learned search's plans (`_beam`): NeuroShard's width and move set, 4 steps of its
# 10: on the development tasks (benchmarks/dev_tasks.py) depth 4, 6 and 10 made plans within 0.02
# points of each other, and 200 tables on 8 devices plan in under a second at 4 (1.8 s at 10)
BEAM_DEPTH, BEAM_WIDTH, BEAM_TOP = 4, 3, 10
# after its first step the beam places a candidate under the 3 dim caps around its parent's best
# (`beam_search`'s child_caps), not all 11: a split moves the best cap little (on the 30 tasks of
# `heldout.py --dev` and 200 tables on 8 devices, 3 plans of 31 changed, by at most 0.05% of the
# net's price), and the beam's greedy does a third of the work
BEAM_CHILD_CAPS = 3
# on a task of several hosts, more beam steps while each lowers the plan (`beam_search`'s extend):
# there row splits inside a host keep paying (4 hosts of 8: plans 4.5-5.5% lower on development
# pools); on one host the later steps gained under 0.1% for up to twice the time
BEAM_EXTEND = 6
BEAM_MAX_TABLES = 1_000  # each step places ~60 candidates by the greedy: seconds a step above this
# on several hosts table-row-wise splits keep paying where one host's would not: 1,024 tables on
# 16 hosts of 8 (a development pool) 15% lower with the beam, in 28 s instead of 3 s on one core
BEAM_MAX_TABLES_HOSTS = 2_000
# the last stage (`_anneal`): the oracle's annealing (planners/oracle.py) on the cost net, from the
# search's plan (without row pieces); with anneal_lookup also from the oracle's own starts (the
# lookup plans, a restart). The policy and the cut net
# propose from the families they were trained on; on one they have not seen their proposals can be
# far from what the cost net itself prefers (a model trained without the `hot` family, on `hot`
# development tasks: the search's plans 6% above the net's price of the oracle's). Up to
# ANNEAL_MAX_CELLS tables × devices: an evaluation sums every piece into every device's state.
# Its plan replaces the search's wherever the net prices it lower (ANNEAL_MARGIN 0): with the H200
# model's net (1–3% off measured steps) 8,000 placements without a margin planned the development
# tasks 0.35 points lower on 4 × H200 than 2,000 with a 2% margin, the margin chosen for a net
# several percent off (docs/dreamshard.md, "The last stage").
ANNEAL_EVALS, ANNEAL_RESTARTS, ANNEAL_MAX_CELLS, ANNEAL_MARGIN = 8_000, 1, 4_000, 0.0
# From the search's plan alone (ANNEAL_LOOKUP False), its plan is always the learned search's and
# plans take ~25% less time; chosen by a rule fixed before measuring (at most 0.2 points above the
# stage with the lookup starts on the 30 development tasks, 4 x H200, one call): -17.47% against
# -17.40% of the best table-wise heuristic (another call, seeds 0 and 1: 0.19 points behind on
# average). On the 36 held-out tasks of the first call (reported): -6.81% against -6.93%, 6 tasks
# more than 2% behind the best against 2 (docs/dreamshard.md).
ANNEAL_LOOKUP = False
ANNEALED = " + annealing on the cost net"  # in a candidate's source
ANNEAL_FULL_CELLS = 1_000  # tables × devices up to which the stage prices `anneal` placements; above, fewer in proportion


# `--verify`'s second variant: the search on a price raised by this much per table cut into
# columns (`cut_penalty`). Its plans cut almost no table and differ from the default's on 29 of the
# 30 development tasks: the fastest of the first 4 variants with it measured 0.24 points lower than
# with the schedule of starts and seeds alone (1 x H200, one call; a rule fixed before measuring,
# benchmarks/heldout.py). As the default's price it did not help (-17.49% against -17.48%).
VERIFY_CUT_PENALTY = 0.0075


def verify_variant(k: int, seed: int = 0, anneal_lookup: bool = False, cut_penalty: float = 0.0) -> dict:
    """`verify`'s k-th variant of a planner of `seed`, `anneal_lookup` and `cut_penalty`: the
    planner itself; the other price (VERIFY_CUT_PENALTY, or none where the planner has one); then
    the last stage's other start and the next seeds, each seed with both starts in turn."""
    if k == 1:
        return {"seed": seed, "anneal_lookup": anneal_lookup, "cut_penalty": 0.0 if cut_penalty else VERIFY_CUT_PENALTY}
    j = max(k - 1, 0)
    return {"seed": seed + j // 2, "anneal_lookup": bool(j % 2) != anneal_lookup, "cut_penalty": cut_penalty}


@register
class DreamShardPlanner(LearnedPlanner):
    """`model`: a model file, a `DreamShardModel`, or None for the shipped model."""

    name, description = "dreamshard", "DreamShard: RL policy and learned cuts on a learned cost model, with a search at plan time (--model, default: the shipped model)"
    CONFIGS, default_config = lazy_attr("dreamshard.learned.dreamshard", "CONFIGS"), "default"
    budget_option = ("max_splits", "split moves of a descent")
    budget_with_split_only = True  # without split there is no search: the policy plays one batch of episodes

    def __init__(self, model: str | Path | DreamShardModel | None = None, best_of: int | None = None, seed: int = 0, split: bool = True, max_splits: int = 8,
                 budget_ms: float | None = None, comm_model: str | Path | None = None, heuristic_candidates: bool = True, beam_depth: int = BEAM_DEPTH,
                 anneal: int = ANNEAL_EVALS, anneal_margin: float = ANNEAL_MARGIN, anneal_lookup: bool = ANNEAL_LOOKUP, verify: int = 0,
                 backend: "CostBackend | None" = None, cut_penalty: float = 0.0, anneal_rows: bool = False):
        """`split`: the search that cuts tables (False: the policy's table-wise plan). `budget_ms`:
        with `split`, the search goes on with further rounds of sampled cuts and of its last stage
        until this much time has passed since `plan` began (None: one round, whatever the
        machine's speed).
        `comm_model`: the comm model (file) whose collectives price row splits; None: the
        NCCL model shipped for the GPU planned for (`scoring.comm_params`). `heuristic_candidates`: the
        greedy heuristics' plans compete with the policy's by the cost net (False: the paper's
        policy alone; the heuristics only when every episode runs out of memory). `anneal`: the
        placements the search's last stage, the oracle's annealing on the cost net, may price (0: no
        such stage); its plan is kept where the net prices it `anneal_margin` (a fraction) lower.
        `anneal_lookup`: the stage also anneals from the lookup plans and a restart (False, the
        default: from the search's plan alone, every placement on that one run). `verify`: make
        this many variants of the plan (`_verified`) and keep the one `backend` measures fastest
        (0: one plan, no backend). `cut_penalty`: the search prices a plan this fraction higher
        for each table it cuts into columns (`PieceScorer`; 0: the cost net's price).
        `anneal_rows`: the last stage also anneals a plan with row pieces, those staying where
        they are (False: such a plan is kept as the search left it)."""
        lazy.load()
        self.model = model if isinstance(model, DreamShardModel) else DreamShardModel.load(model)
        self.comm = comm_params(comm_model) if split and comm_model is not None else None  # None: the shipped model of each task's device count
        self.label = shipped.label("dreamshard") if model is None else "trained model" if isinstance(model, DreamShardModel) else str(model)
        self.best_of = int(best_of) if best_of is not None else self.model.best_of
        if self.best_of < 1:
            raise ValueError(f"best_of must be >= 1, got {best_of}")
        self.seed, self.split, self.max_splits = seed, bool(split), int(max_splits)
        if budget_ms is not None and not budget_ms > 0:
            raise ValueError(f"budget_ms must be > 0, got {budget_ms}")
        self.budget_ms = budget_ms
        self.heuristic_candidates = bool(heuristic_candidates)
        if beam_depth < 0:
            raise ValueError(f"beam_depth must be >= 0, got {beam_depth}")
        self.beam_depth = int(beam_depth)
        if isinstance(anneal, bool) or not isinstance(anneal, (int, np.integer)) or anneal < 0:
            raise ValueError(f"anneal must be a whole number >= 0, got {anneal!r:.40}")
        self.anneal = int(anneal)
        if not 0 <= anneal_margin < 1:
            raise ValueError(f"anneal_margin must be in [0, 1), got {anneal_margin!r:.40}")
        self.anneal_margin = float(anneal_margin)
        self.anneal_lookup = bool(anneal_lookup)
        self.anneal_rows = bool(anneal_rows)
        if isinstance(verify, bool) or not isinstance(verify, (int, np.integer)) or verify < 0:
            raise ValueError(f"verify must be a whole number >= 0, got {verify!r:.40}")
        if verify and backend is None:
            raise ValueError("verify needs a backend that measures the plans (e.g. the triton kernel on a GPU)")
        self.verify, self.backend = int(verify), backend
        if isinstance(cut_penalty, bool) or not isinstance(cut_penalty, (int, float, np.integer, np.floating)) or not 0 <= cut_penalty < 1:
            raise ValueError(f"cut_penalty must be in [0, 1), got {cut_penalty!r:.40}")
        self.cut_penalty = float(cut_penalty)
        self.player = FastPlayer(self.model.cost_net, self.model.policy, self.model.keep_room, self.model.comm)

    @classmethod
    def fit(cls, tasks: Sequence[Task], backend: CostBackend, out: str | Path, config: Config | None = None, *, log: str | Path | None = None,
            resume: bool = False, eval_tasks: Sequence[Task] | None = None, progress: bool = True, stop_after: int | None = None,
            prior: CostBackend | None = None, **options) -> "DreamShardPlanner":
        """DreamShard's training (`learned.dreamshard.train`, config `default` unless given) on
        `tasks` against `backend` (and `prior` pricing a simulator prior's plans, with the config's
        prior_plans, and the plans around this planner's search with `options`, `SearchRegion`, of
        its search_plans); the model goes to `out`, its checkpoint to `out`.ckpt."""
        lazy.load()
        model = train(config or cls.config(), tasks, backend, out, log=log, resume=resume, eval_tasks=eval_tasks, progress=progress, stop_after=stop_after,
                      prior=prior, search=SearchRegion(options))
        planner = cls(model=model, **options)
        planner.label = str(out)
        return planner

    def save(self, path: str | Path) -> None:
        self.model.save(path)

    def episodes(self, tables: int, devices: int, least: int = 1) -> int:
        """How many episodes a play of `tables` tables (or pieces) on `devices` devices takes:
        `best_of` (at least `least`), but no more sampled ones (all but the greedy one) than
        SAMPLED_DEVICE_STEPS allows. Each step of a sampled episode draws noise for, and scores,
        every device: at 100,000 tables on 1,024 devices the 15 sampled episodes of the shipped
        model were most of a plan's minutes; the greedy episode and the heuristics' plans stay."""
        wanted = max(least, self.best_of)
        return max(least, min(wanted, 1 + SAMPLED_DEVICE_STEPS // max(1, tables * devices)))

    def plan(self, task: Task) -> Plan:
        if self.verify:
            return self._verified(task)
        deadline = time.perf_counter() + self.budget_ms / 1e3 if self.budget_ms is not None else None
        if over_bounds(task.sizes(), task.max_memory_bytes, task.devices):
            if self.split and self.max_splits > 0:
                return self._split_rows_first(task)  # a table larger than a device: split by rows, or InfeasibleError
            raise task_infeasible(task)  # at once: no episode can succeed
        p = prepare(task, self.model.normalization, self.model.linear_features, self.model.kernel)
        episodes = self.episodes(len(task.tables), task.devices)
        placement, device_costs, overall = best_placement(self.model, p, episodes, self.seed, self.player)
        if placement is not None and not self.heuristic_candidates:
            plan, source = Plan.table_wise(task, [int(d) for d in placement], self.name), "policy"
        else:
            plan, device_costs, overall, source = self._cheapest(task, p, placement)
        plan.predicted = predicted_dict(device_costs, overall, self.label)
        bounded = [] if episodes == self.best_of else [  # what this size left out, said in the plan
            f"{len(task.tables):,} tables on {task.devices:,} devices: the policy played {episodes} of its {self.best_of} episodes "
            f"(the greedy one and {episodes - 1} sampled; sampled episodes are bounded at this size)"]
        if self.split and self.max_splits > 0:
            return self._split(task, plan, source, deadline, bounded)
        plan.notes += bounded
        return plan

    def _verified(self, task: Task) -> Plan:
        """`verify` variants of the plan (`verify_variant`: the plan, the search on the other price
        of the cut penalty, the last stage's other start, the next seeds) each distinct one
        measured by `backend`: the fastest, the measurements in its
        `predicted["verified"]`. Plans within the cost net's error of each other are ordered by it
        little better than by chance, and a measurement repeats within a fraction of a percent: a
        few measured plans pick what the net cannot (docs/dreamshard.md, "Verified plans")."""
        plans: dict[tuple, tuple[dict, Plan]] = {}
        for k in range(self.verify):
            variant = verify_variant(k, self.seed, self.anneal_lookup, self.cut_penalty)
            one = copy.copy(self)
            one.seed, one.anneal_lookup, one.cut_penalty, one.verify = variant["seed"], variant["anneal_lookup"], variant["cut_penalty"], 0
            plan = one.plan(task)
            plans.setdefault(tuple(plan.layout()), (variant, plan))
        measured = [(self.backend.evaluate_plan(plan).overall_ms, variant, plan) for variant, plan in plans.values()]
        ms, variant, best = min(measured, key=lambda m: m[0])
        best.predicted = {**(best.predicted or {}), "verified": {"backend": self.backend.name, **variant,
                                                                 "plans": [{**v, "measured_ms": m} for m, v, _ in measured]}}
        best.notes.append(f"verified: the fastest of {len(measured)} distinct plans of {self.verify} variants measured by {self.backend.name} "
                          f"(seed {variant['seed']}, anneal_lookup {variant['anneal_lookup']}, cut_penalty {variant['cut_penalty']}): {ms:.3f} ms")
        return best

    def _cheapest(self, task: Task, p, placement: np.ndarray | None) -> tuple[Plan, np.ndarray, float, str]:
        """The policy's placement (None: every episode ran out of memory) and the greedy
        heuristics' plans (each its greedy, or its proxy balanced by a memory packing), priced in
        one batch by the cost net: the cheapest, and where it came from. The heuristics cost
        milliseconds, and where the policy misplaces a family it never trained on (hot tables at
        tight memory) one of them is often what the cost net itself prefers. Above
        PACKED_CANDIDATES_MAX tables, where the policy placed the task, a heuristic competes only
        with its greedy placement: its memory packing takes seconds there (10,000 tables on 1,024
        devices: ~9 s a heuristic). Raises InfeasibleError if nothing fits."""
        # (planner, placement) of each candidate; a plan is built for the chosen one only
        plans = [("dreamshard policy", [int(d) for d in placement])] if placement is not None else []
        try:
            for cls in GREEDY_PLANNERS:
                if placement is not None and len(task.tables) > PACKED_CANDIDATES_MAX:
                    proxy = [cls().proxy(t, task) for t in task.tables]
                    greedy_only = greedy(task, proxy)  # its memory packing would cost seconds here
                    if greedy_only is not None:
                        plans.append((cls.name, greedy_only))
                    continue
                plans.append((cls.name, cls().plan(task).placement))
        except InfeasibleError:
            # a heuristic fails only when its memory packing does, and the packing depends on the
            # sizes and memory alone: the next ones would search as long and fail the same way
            if not plans:
                raise
        costs, ov = predict(self.model.cost_net, EpisodeBatch.of([p] * len(plans)), torch.tensor([q for _, q in plans]), self.model.comm)
        scale = float(self.model.cost_net.scale)
        k = int(plan_cost(costs, ov, self.model.score).argmin())
        chosen, chosen_placement = plans[k]
        if placement is None:
            notes = [f"dreamshard policy ran out of memory; used the {chosen} plan, the cheapest of the greedy heuristics' by the cost net"]
        elif k > 0:
            notes = [f"used the {chosen} plan: the cost net predicts it cheaper than the policy's"]
        else:
            notes = []
        source = "policy" if placement is not None and k == 0 else f"heuristic {chosen}"
        return Plan.table_wise(task, chosen_placement, self.name, notes=notes), costs[k].numpy() * scale, float(ov[k]) * scale, source

    def _split_rows_first(self, task: Task) -> Plan:
        """A task with a table larger than a device: the tables too large split by rows
        (`splits.forced_row_splits`), every piece placed by the greedy on the cost net under the
        dim caps 1.0–1.5, then the split descent from there."""
        pieces = splits.forced_row_splits(task)
        scorer = PieceScorer(self.model, task, self.comm, self.cut_penalty)
        cost, devices, _ = greedy_batch(scorer, [pieces], np.array([*np.linspace(1.0, 1.5, 6), splits.NO_DIM_CAP]))
        if not np.isfinite(cost[0]):
            raise splits.infeasible(task)
        devices = [int(d) for d in devices[0]]
        pieces, devices, _ = split_descent(scorer, pieces, devices, scorer.state(pieces, np.array(devices)), self.max_splits)
        return splits.placed(task, pieces, devices, self.name, predicted=scorer.predicted(pieces, np.array(devices), self.label),
                             notes=["a table larger than a device: split by rows first"])

    def _row_ladder(self, scorer: PieceScorer, whole: list[Shard], placement: list[int], state: np.ndarray, cost: float) -> tuple[float, list[Shard], list[int]] | None:
        """The cheapest placement by NeuroShard's greedy on the cost net (`scoring.greedy_batch`,
        dim caps 1.0–1.5) of the `row_ladder` cuts, or None (the policy's MDP cannot keep a
        table's blocks on distinct devices, so the greedy places these)."""
        # several hosts: a table-row-wise split keeps its exchange in a host, and a task of few tables
        # on many GPUs may want most of them split so (MLPerf's 26 on 128 GPUs): a longer ladder
        ladder = row_ladder(scorer, whole, placement, state, cost, ROW_LADDER_HOSTS if splits.host_gpus(scorer.task) else 2)
        best = None
        for pieces in ladder:
            cost, devices, _ = greedy_batch(scorer, [pieces], np.linspace(1.0, 1.5, 6))
            if np.isfinite(cost[0]) and (best is None or cost[0] < best[0]):
                best = (float(cost[0]), pieces, [int(d) for d in devices[0]])
        if splits.host_gpus(scorer.task) and len(whole) <= ROW_LADDER_HOSTS:
            for blocks in (1, 2):  # every table table-row-wise; then as a grid of two column blocks on two hosts
                hosted = table_row_wise_by_host(scorer, whole, blocks)
                if hosted is not None and (best is None or hosted[0] < best[0]):
                    best = hosted
        return best

    def _split(self, task: Task, table_wise: Plan, source: str, deadline: float | None, bounded: list[str]) -> Plan:
        """The search at plan time (docs/dreamshard.md, "Splitting"): candidates from the learned
        policy — its table-wise plan (or the heuristic's that the cost net preferred, `source`),
        its cut net's cuts placed by the policy (`_learned_cuts`; a model without a cut net: the
        policy's placements of a ladder of cuts), the row ladder — then the split descent from the
        cheapest; with `deadline` (`budget_ms`) further rounds of sampled cuts and their descents
        while time is left. Every candidate is priced by the cost net (`PieceScorer`); the
        cheapest is returned, its source in `predicted["candidate"]`. Above CUTS_MAX_TABLES tables
        the learned cuts are left out; `bounded` (notes of what the size left out) and a note of
        that go in the plan's notes."""
        scorer = PieceScorer(self.model, task, self.comm, self.cut_penalty)
        whole = splits.whole(task)
        state = scorer.state(whole, np.array(table_wise.placement))
        best = Candidate(float(scorer.score(state)), whole, table_wise.placement, source)
        bounded = list(bounded)
        learned = len(task.tables) <= CUTS_MAX_TABLES
        if not learned:
            found, proposed = None, []
            bounded.append(f"{len(task.tables):,} tables: the search placed no learned cuts (a play of the cut net over every table, "
                           f"done up to {CUTS_MAX_TABLES:,} tables); the row ladder and the split descent ran, and the greedy placement "
                           f"under {len(CAPS[::2])} of its {len(CAPS)} dim caps")
        elif self.model.cut is not None:
            s = cut_set(task, self.model, top_tables(scorer.single[scorer.slots([whole])[0]], CUT_MAX))
            found, proposed = self._learned_cuts(scorer, s, 0)
        else:
            found, proposed = self._cut_ladder(scorer, task, whole), []
        best = min(best, found, key=lambda c: c.cost) if found is not None else best
        placed = self._row_ladder(scorer, whole, table_wise.placement, state, best.cost)
        if placed is not None and placed[0] < best.cost:
            best = Candidate(*placed, "row ladder")
        beam_max = BEAM_MAX_TABLES_HOSTS if several_hosts(task.topology) else BEAM_MAX_TABLES
        if self.beam_depth and len(task.tables) <= beam_max:
            best = self._beam(scorer, best, proposed)
        elif self.beam_depth:
            bounded.append(f"{len(task.tables):,} tables: the search ran no beam (done up to {beam_max:,} tables)")
        best = self._descend(scorer, best)
        anneals = bool(self.anneal) and len(task.tables) * task.devices <= ANNEAL_MAX_CELLS
        if self.anneal and not anneals:
            bounded.append(f"{len(task.tables):,} tables on {task.devices:,} devices: the search ran no annealing on the cost net "
                           f"(done up to {ANNEAL_MAX_CELLS:,} tables × devices)")
        if anneals:
            best = self._anneal(scorer, best)
        # `budget_ms`: while time is left, rounds of sampled cuts (their descents where promising)
        # and of the annealing from the cheapest so far, another seed each
        sampled = learned and self.model.cut is not None
        rnd = 1
        while deadline is not None and time.perf_counter() < deadline and (sampled or (anneals and self._annealable(best))):
            if sampled:
                found, _ = self._learned_cuts(scorer, s, rnd)
                if found is not None and found.cost < best.cost * (1 + DESCENT_MARGIN):  # worth a descent
                    best = min(best, self._descend(scorer, found), key=lambda c: c.cost)
            if anneals:
                best = self._anneal(scorer, best, rnd)
            rnd += 1
        if len(best.pieces) == len(whole):
            plan = Plan.table_wise(task, best.devices, self.name, notes=table_wise.notes + bounded)
            plan.predicted = {**scorer.predicted(whole, np.array(best.devices), self.label), "candidate": best.source}
            return plan
        return splits.placed(task, best.pieces, best.devices, self.name, notes=[n for n in table_wise.notes if "heuristic" in best.source] + bounded,
                             predicted={**scorer.predicted(best.pieces, np.array(best.devices), self.label), "candidate": best.source})

    def _beam(self, scorer: PieceScorer, best: "Candidate", proposed: list[list[Shard]]) -> "Candidate":
        """NeuroShard's beam search (`scoring.beam_search`: halvings and row splits, each candidate
        placed by the greedy under the dim caps) started from the learned search's plans — the
        cheapest so far and the cut sets the cut net proposed — rather than from whole tables:
        `beam_depth` steps (several hosts: up to BEAM_EXTEND more while each lowers the plan), whatever
        `budget_ms` (the budget buys rounds after it); `best` where it finds nothing cheaper."""
        starts = [best.pieces] + [c for c in proposed if set(c) != set(best.pieces)]
        cost, pieces, devices = beam_search(scorer, starts, CAPS, BEAM_WIDTH, self.beam_depth, BEAM_TOP, (best.cost, best.pieces, best.devices),
                                            extend=BEAM_EXTEND if several_hosts(scorer.task.topology) else 0, child_caps=BEAM_CHILD_CAPS)
        return Candidate(cost, pieces, [int(d) for d in devices], best.source + " + beam") if cost < best.cost else best

    def _anneal(self, scorer: PieceScorer, best: "Candidate", rnd: int = 0) -> "Candidate":
        """The oracle's annealing (`oracle.Annealer`: moves, swaps, halvings, merges) on the cost
        net (`NetPricer`), `anneal` placements priced, from `best` where it has no row pieces (the
        annealing moves column pieces only; with `anneal_rows`, its other pieces around them) —
        with `anneal_lookup` also from the oracle's starts (the lookup plans) and a restart —;
        `best` where it finds nothing the net scores `anneal_margin` lower. Round `rnd` > 0
        (`budget_ms`): from `best` alone, seed + rnd."""
        task = scorer.task
        if not self.anneal or task.devices < 2 or not self._annealable(best):
            return best
        rows = [i for i, p in enumerate(best.pieces) if p.is_row_shard]
        moving = [i for i, p in enumerate(best.pieces) if not p.is_row_shard]
        # with row pieces (`anneal_rows`): they stay, and the other pieces anneal around them
        fixed = ([best.pieces[i] for i in rows], [best.devices[i] for i in rows])
        lookup = self.anneal_lookup and rnd == 0 and not rows
        annealer = Annealer(ANNEAL_RESTARTS if lookup else 0, self.seed + rnd, split=True)
        try:
            starts = annealer.starts(task) if lookup else []
        except InfeasibleError:
            starts = []
        # where the annealed plan came from, in its source: the search's plan or a greedy heuristic's
        names = ["lookup --split" if any(stop - start < task.tables[t].dim for t, start, stop in pieces) else "lookup" for pieces, _ in starts]
        starts.insert(0, ([(best.pieces[i].table, best.pieces[i].start, best.pieces[i].stop) for i in moving],
                          np.array([best.devices[i] for i in moving], np.int64)))
        names.insert(0, best.source.removesuffix(ANNEALED))  # a later round's plan: annealed once in its source
        budget = min(self.anneal, max(2, self.anneal * ANNEAL_FULL_CELLS // (len(task.tables) * task.devices)))
        found, _, _, origin = annealer.run(task, NetPricer(scorer, budget, fixed), starts)
        if found is None:
            return best
        order = sorted(range(len(found[1])), key=lambda i: found[1][i])  # whole tables in table order (`_split`'s table-wise plan)
        pieces = [Shard(found[1][i][0], -1, found[1][i][1], found[1][i][2]) for i in order] + fixed[0]
        devices = [int(found[2][i]) for i in order] + fixed[1]
        cost = float(scorer.score(scorer.state(pieces, np.array(devices))))
        source = f"{names[origin] if origin < len(names) else 'a restart'}{ANNEALED}"
        return Candidate(cost, pieces, devices, source) if cost < best.cost * (1 - max(self.anneal_margin, 1e-6)) else best

    def _annealable(self, c: "Candidate") -> bool:
        """The last stage has pieces of `c` to move: some that are not row pieces, and no row
        piece unless `anneal_rows` (which keeps them where they are)."""
        rows = sum(p.is_row_shard for p in c.pieces)
        return rows < len(c.pieces) and (self.anneal_rows or not rows)

    def _descend(self, scorer: PieceScorer, start: "Candidate") -> "Candidate":
        """The split descent from `start` (`split_descent`), then its pieces placed afresh by the
        greedy (swept dim caps); `start` where neither lowers the prediction."""
        pieces, devices, cost = split_descent(scorer, start.pieces, start.devices, scorer.state(start.pieces, np.array(start.devices)), self.max_splits)
        best = Candidate(cost, pieces, [int(d) for d in devices], start.source + " + descent") if cost < start.cost else start
        again, devs, _ = greedy_batch(scorer, [best.pieces], CAPS if len(scorer.task.tables) <= CUTS_MAX_TABLES else CAPS[::2])
        if again[0] < best.cost * (1 - 1e-3):
            best = Candidate(float(again[0]), best.pieces, [int(d) for d in devs[0]], best.source + " + greedy placement")
        return best

    def _learned_cuts(self, scorer: PieceScorer, s: CutSet, rnd: int) -> "tuple[Candidate | None, list[list[Shard]]]":
        """Round `rnd` of the learned split action: `best_of` episodes of the cut net and the
        policy on the cut set `s` in one batch (round 0: the greedy cuts placed greedily, then
        the greedy cuts and sampled cuts, each placed by sampled episodes; later rounds: sampled
        only, from another seed), the cheapest by the cost net, or None if every one ran out of
        memory; and the cut sets of the GREEDY_CUTS cheapest distinct episodes."""
        K = self.episodes(len(s.pieces), scorer.task.devices, least=2)
        rng = np.random.default_rng([self.seed, rnd])
        greedy_cuts = np.zeros(K, bool)
        greedy_place = np.zeros(K, bool)
        if rnd == 0:
            greedy_cuts[: K // 2] = True
            greedy_place[0] = True
        active = s.active(plan_cuts(self.model, s, greedy_cuts, rng))
        placement, stuck, costs, overall = self.player.play(s.prepared, greedy_place, rng, active)
        score = np.where(stuck, np.inf, plan_cost(costs, overall, self.model.score)) * scorer.cut_factor(active @ scorer.cut_shares(s.pieces))
        e = int(score.argmin())
        if not np.isfinite(score[e]):
            return None, []
        idx = np.flatnonzero(active[e])
        pieces, devices = [s.pieces[i] for i in idx], [int(d) for d in placement[e, idx]]
        best = Candidate(float(scorer.score(scorer.state(pieces, np.array(devices)))), pieces, devices, "learned cuts")
        # the same cuts of the GREEDY_CUTS cheapest distinct episodes placed afresh by NeuroShard's
        # greedy under swept dim caps: the policy proposes the cuts, the greedy is a second placer
        distinct: dict[bytes, int] = {}
        for k in np.argsort(score, kind="stable"):
            if np.isfinite(score[k]) and len(distinct) < GREEDY_CUTS:
                distinct.setdefault(active[k].tobytes(), int(k))
        cuts = [[s.pieces[i] for i in np.flatnonzero(active[k])] for k in distinct.values()]
        costs, devs, _ = greedy_groups(scorer, cuts, CAPS)
        j = int(costs.argmin())
        if costs[j] < best.cost:
            best = Candidate(float(costs[j]), cuts[j], [int(d) for d in devs[j]], "learned cuts, greedy placement")
        return best, cuts

    def _cut_ladder(self, scorer: PieceScorer, task: Task, whole: list[Shard]) -> "Candidate | None":
        """A model without a cut net: the policy's placements of a ladder of cuts (`cut_ladder`),
        all played in one batch, the cheapest by the cost net."""
        cuts = cut_ladder(whole, scorer.single[scorer.slots([whole])[0]], self.max_splits)
        if not cuts:
            return None
        superset = list(dict.fromkeys(p for c in cuts for p in c))
        index = {p: i for i, p in enumerate(superset)}
        active = np.zeros((len(cuts), len(superset)), bool)
        for j, c in enumerate(cuts):
            active[j, [index[p] for p in c]] = True
        K = max(1, self.episodes(len(superset), task.devices) // len(cuts))  # about the table-wise play's episodes in all
        greedy = np.tile(np.arange(K) == 0, len(cuts))  # per cut: the greedy episode, then sampled ones
        prepared = prepare(splits.as_task(task, superset), self.model.normalization, self.model.linear_features, self.model.kernel)
        placement, stuck, costs, overall = self.player.play(prepared, greedy, np.random.default_rng(self.seed), np.repeat(active, K, axis=0))
        cuts_of = np.repeat(active, K, axis=0) @ scorer.cut_shares(superset)
        score = np.where(stuck, np.inf, plan_cost(costs, overall, self.model.score)) * scorer.cut_factor(cuts_of)
        e = int(score.argmin())
        if not np.isfinite(score[e]):
            return None
        chosen = cuts[e // K]
        devices = [int(placement[e, index[p]]) for p in chosen]
        return Candidate(float(scorer.score(scorer.state(chosen, np.array(devices)))), chosen, devices, "cut ladder")


PACKED_CANDIDATES_MAX = 2_000  # tables; see `_cheapest`
# Above this many tables the search leaves out its learned cuts (a play over every table: ~15 s at
# 100,000 tables on a 2-core CPU) and its greedy placement sweeps every other dim cap (each step
# costs ~0.13 ms with the 11 caps, ~0.1 ms with 6)
CUTS_MAX_TABLES = 20_000
# tables × devices × sampled episodes of one play (`episodes`): the shipped model's 15 sampled
# episodes up to 10,000 tables on 1,024 devices (every task of the benchmarks and the docs' tables
# plays as before), one at 100,000 tables on 1,024 devices
SAMPLED_DEVICE_STEPS = 170_000_000
GREEDY_CUTS = 4  # the learned cut sets also placed by the greedy (`_learned_cuts`)
CAPS = np.linspace(1.0, 1.5, 11)  # the greedy's dim caps, NeuroShard's sweep
DESCENT_MARGIN = 0.05  # a later round's candidate within this of the best gets a descent of its own


class SearchRegion:
    """The plans the cost net is refined on after training (`Config.search_plans`,
    `learned.dreamshard.refine`): on a training task, this planner's plan with the model being
    trained (and the options it will plan with) and the `lookup` and `size_lookup` plans with
    splits — those without row shards: a plan is priced as its pieces placed table-wise, which
    has no row-wise exchange — each once as it is, the others perturbed (`perturbed`), n in all,
    as (the plan's pieces as a task, their devices). `near`: this planner's plan alone as the
    base, perturbed by at most NEAR_CHANGES (`Config.search_measured`: the neighbours a search
    weighs against its plan)."""

    def __init__(self, options: dict):
        self.options = options
        self._planner: DreamShardPlanner | None = None

    def __call__(self, model: DreamShardModel, task: Task, n: int, rng: np.random.Generator, near: bool = False) -> list[tuple[Task, np.ndarray]]:
        if self._planner is None or self._planner.model is not model:
            self._planner = DreamShardPlanner(model=model, **self.options)
        others = () if near else tuple(cls(split=True) for cls in GREEDY_PLANNERS if cls.name in ("lookup", "size_lookup"))
        bases = []
        for planner in (self._planner, *others):
            try:
                bases.append(planner.plan(task))
            except InfeasibleError:
                continue
        bases = [b for b in bases if not b.has_row_shards()]
        out = []
        for k in range(n if bases else 0):
            base = bases[k % len(bases)]
            pieces, devices = splits.unplaced(base)
            if k >= len(bases):
                pieces, devices = perturbed(task, pieces, devices, int(rng.integers(1, (NEAR_CHANGES if near else MAX_CHANGES) + 1)), rng)
            out.append((splits.as_task(task, pieces), np.array(devices, np.int64)))
        return out


MAX_CHANGES = 8  # a perturbed plan's random changes: 1..MAX_CHANGES
NEAR_CHANGES = 2  # and a neighbour's (`SearchRegion` near): 1..NEAR_CHANGES
P_MOVE, P_SWAP = 0.45, 0.40  # a change moves a piece, swaps two, or (the rest) halves one across devices


def perturbed(task: Task, pieces: list[Shard], devices: list[int], changes: int, rng: np.random.Generator) -> tuple[list[Shard], list[int]]:
    """`pieces` on `devices` after `changes` random tries, each kept only within memory: move a
    column piece to another device, swap it with a piece of another device, or halve it and put a
    half on another device. Row pieces stay (a table's blocks keep distinct devices)."""
    pieces, devices = list(pieces), list(devices)
    cap = task.max_memory_bytes
    size = list(splits.sizes(task, pieces))
    used = np.zeros(task.devices, np.int64)
    np.add.at(used, devices, size)
    for _ in range(changes):
        i, d, u = int(rng.integers(len(pieces))), int(rng.integers(task.devices)), rng.random()
        if pieces[i].is_row_shard or d == devices[i]:
            continue
        if u < P_MOVE:
            if used[d] + size[i] <= cap:
                used[devices[i]] -= size[i]
                used[d] += size[i]
                devices[i] = d
        elif u < P_MOVE + P_SWAP:
            there = [j for j, e in enumerate(devices) if e == d and not pieces[j].is_row_shard]
            j = there[int(rng.integers(len(there)))] if there else -1
            if j >= 0 and used[devices[i]] - size[i] + size[j] <= cap and used[d] - size[j] + size[i] <= cap:
                used[devices[i]] += size[j] - size[i]
                used[d] += size[i] - size[j]
                devices[i], devices[j] = d, devices[i]
        elif splits.can_halve(pieces[i]):
            keep, move = splits.cut(pieces[i], 2)
            a, b = splits.sizes(task, [keep, move])
            if used[d] + b <= cap:
                used[devices[i]] += a - size[i]
                used[d] += b
                pieces[i], size[i] = keep, a
                pieces.append(move)
                size.append(b)
                devices.append(d)
    return pieces, devices


class NetPricer(Pricer):
    """The oracle's pricer (`oracle.Pricer`, which counts the budget) pricing on the cost net: N
    placements of the same pieces as per-device totals (ms, the net's three components; column
    pieces only, which have no row-wise exchange). Their device states: a base placement's (one
    product, `PieceScorer.placed_states`) plus the rows of the pieces each placement moved from it
    (the annealing's neighbours move one or two pieces each), the base made anew from a batch's
    first placement once some placement is more than DELTA_PIECES moves away."""

    DELTA_PIECES = 8

    def __init__(self, scorer: PieceScorer, budget: int, fixed: tuple[list[Shard], list[int]] = ([], [])):
        """`fixed`: pieces that stay on their devices (row pieces) and those devices: their state
        joins every placement's, their bytes each device's (`Pricer.reserved`)."""
        super().__init__(None, scorer.task, budget)
        self.scorer, self.batched = scorer, True
        D = scorer.task.devices
        self._fixed = scorer.state(*fixed) - scorer.empty((D,)) if fixed[0] else None
        self.reserved = np.bincount(fixed[1], weights=splits.sizes(scorer.task, fixed[0]), minlength=D).astype(np.int64) if fixed[0] else None
        self._rows: tuple[list, np.ndarray] | None = None  # the last pieces list priced and its rows
        self._base: tuple[np.ndarray, np.ndarray] | None = None  # a placement of those pieces and its [D, R] states
        self._slot: dict[tuple[int, int, int], int] = {}  # a piece's slot in the scorer's cache

    def price(self, pieces: list[tuple[int, int, int]], placements: np.ndarray) -> np.ndarray:
        # the annealing's moves and swaps price one list of pieces step after step (the same
        # object, never changed in place): its rows are looked up once
        if self._rows is None or self._rows[0] is not pieces:
            new = [p for p in dict.fromkeys(pieces) if p not in self._slot]
            if new:
                self._slot.update(zip(new, self.scorer.slots([[Shard(t, -1, a, b) for t, a, b in new]])[0].tolist()))
            self._rows, self._base = (pieces, self.scorer.table[[self._slot[p] for p in pieces]]), None
        rows = self._rows[1]
        moved = placements != self._base[0] if self._base is not None else None
        if moved is None or moved.sum(1).max() > self.DELTA_PIECES:
            self._base = (placements[0].copy(), self.scorer.placed_states(rows, placements[:1])[0])
            moved = placements != self._base[0]
        # each moved piece's row leaves its base device and joins its new one: a [N·D, K] ±1 matrix times the K rows
        n, i = np.nonzero(moved)
        N, D, K = len(placements), self.scorer.task.devices, len(n)
        change = np.zeros((N * D, K), rows.dtype)
        change[n * D + placements[n, i], np.arange(K)] = 1.0
        change[n * D + self._base[0][i], np.arange(K)] = -1.0
        states = (change @ rows[i]).reshape(N, D, -1) + self._base[1]
        if self._fixed is not None:
            states = states + self._fixed
        factor = self.scorer.cut_factor(self.scorer.cuts(rows))  # the same pieces in every placement (a row piece cuts nothing)
        return self.scorer.device_costs(states).sum(-1) * (self.scorer.net.scale * factor)


@dataclass
class Candidate:
    """A plan of the search: its predicted cost (units), pieces, their devices, where it came from."""

    cost: float
    pieces: list[Shard]
    devices: list[int]
    source: str


def top_tables(single: np.ndarray, top: int) -> np.ndarray | None:
    """[T] bool: the `top` tables costliest alone (None where every table is among them)."""
    if len(single) <= top:
        return None
    offered = np.zeros(len(single), bool)
    offered[np.argsort(-single, kind="stable")[:top]] = True
    return offered


ROW_LADDER_HOSTS = 32  # the row ladder's most tables on a task of several hosts (one host: 2)
HOST_ROUNDS = 64  # moves or swaps of `improve_hosts` at most


def row_ladder(scorer: PieceScorer, whole: list[Shard], placement: list[int], state: np.ndarray, cost: float, tables: int = 2) -> list[list[Shard]]:
    """Row cuts to place afresh: the 1, 2, 4, ... and all of the `tables` costliest tables that may pay (`PieceScorer.row_candidates`, and whose `bound_without` in the table-wise
    `placement`, of device states `state`, beats `cost`) split by rows over every device (on several hosts: over one host's GPUs,
    table-row-wise, `splits.twrw_blocks`)."""
    task = scorer.task
    ladder: list[list[Shard]] = []
    parts = splits.host_gpus(task) or task.devices  # several hosts: table-row-wise, over one host's GPUs
    if parts > splits.MAX_ROW_PARTS or parts < 2:
        return ladder
    chosen: list[int] = []
    for i in scorer.row_candidates(whole, list(range(len(whole))), tables):
        if not scorer.bound_without(state, placement[i], whole[i]) < cost * (1 - 1e-3):
            continue
        rows = splits.row_split(task, i, parts)
        if rows is None:
            continue
        chosen.append(i)
    # the 1, 2, 4, ... costliest (and all of them): each rung one greedy placement
    for k in sorted({2**j for j in range(len(chosen).bit_length()) if 2**j <= len(chosen)} | ({len(chosen)} if chosen else set())):
        ladder.append([p for p in whole if p.table not in chosen[:k]] + [q for j in chosen[:k] for q in splits.row_split(task, j, parts)])
    return ladder


def table_row_wise_by_host(scorer: PieceScorer, whole: list[Shard], blocks: int = 1) -> tuple[float, list[Shard], list[int]] | None:
    """Every table split table-row-wise (its block r on GPU r of one host), the tables in order of
    predicted compute each to the host where the cost net scores the plan so far lowest, those
    hosts then improved (`improve_hosts`): TorchRec's
    layout for few tables on many hosts, where one table kept whole puts every GPU in an
    all-to-all across hosts that no table alone pays for (`row_ladder` offers a row split only to
    a table whose compute beats its own exchange). `blocks` > 1: a grid (TorchRec's grid_shard) —
    each table whose dim allows it cut into that many column blocks of one width, each block
    table-row-wise on a host of its own, placed as a table is: a large table then spreads over
    hosts with each block's partial sums on NVLink. → (score units, pieces, devices), or None
    where a table cannot be split so or a host's memory would not hold it."""
    task = scorer.task
    G, H = splits.host_gpus(task), task.topology.hosts
    if blocks > H:
        return None
    units, group = [], []  # per unit (a table, or a column block of one): its row pieces; its table
    for i in range(len(whole)):
        pieces = splits.row_split(task, i, G)
        if pieces is None:
            return None
        dim = task.tables[i].dim
        k = blocks if dim % (DIM_MULTIPLE * blocks) == 0 else 1
        for b in range(k):
            units.append([replace(p, start=b * dim // k, stop=(b + 1) * dim // k) for p in pieces] if k > 1 else pieces)
            group.append(i)
    group = np.array(group)
    state, used = scorer.empty((task.devices,)), np.zeros(task.devices)
    rows, size = [], []  # per unit: its blocks' state rows [k, R] and bytes [k]
    for pieces in units:
        slots = scorer.slots([pieces])[0]
        rows.append(scorer.table[slots])
        size.append(scorer.bytes[slots])
    host = np.full(len(units), -1)
    order = np.argsort(-scorer.single[scorer.slots([whole])[0]], kind="stable")
    for u in [u for i in order for u in np.flatnonzero(group == i)]:
        trial = np.repeat(state[None], H, axis=0)  # [H, D, R]: the plan with the unit on each host
        at = np.arange(H)[:, None] * G + np.arange(len(rows[u]))[None, :]  # [H, k] GPU r of host h
        trial[np.arange(H)[:, None], at] += rows[u][None]
        fits = (used[at] + size[u][None] <= task.max_memory_bytes).all(1)
        taken = host[group == group[u]]
        fits[taken[taken >= 0]] = False  # a grid's blocks on hosts of their own
        if not fits.any():
            return None
        h = int(np.where(fits, scorer.score(trial), np.inf).argmin())
        state, used[at[h]], host[u] = trial[h], used[at[h]] + size[u], h
    host, cost = improve_hosts(scorer, rows, size, host, state, used, G, group)
    devices = [h * G + r for u, h in enumerate(host) for r in range(len(rows[u]))]
    return cost, [p for pieces in units for p in pieces], devices


def improve_hosts(scorer: PieceScorer, rows: list[np.ndarray], size: list[np.ndarray], host: np.ndarray, state: np.ndarray, used: np.ndarray, G: int,
                  group: np.ndarray | None = None, rounds: int = HOST_ROUNDS) -> tuple[np.ndarray, float]:
    """The greedy's hosts of table-row-wise tables (`table_row_wise_by_host`) improved on the cost
    net: each round prices, in one batch, every table moved to every other host and every two
    tables of different hosts swapped, within memory, and takes the cheapest while it lowers the
    plan (the greedy places each table for the tables before it only: on MLPerf's 26 tables on 8
    hosts the cost net scored TorchRec's hosts below it). `group`: per unit its table, where a
    grid's column blocks are units of one table; no change puts two of them on one host.
    → (hosts, score units)."""
    task = scorer.task
    H, T, cap = task.topology.hosts, len(rows), task.max_memory_bytes
    host, used = host.copy(), used.copy()
    group = np.arange(T) if group is None else group
    cost = float(scorer.score(state))
    at = lambda i, h: h * G + np.arange(len(rows[i]))  # noqa: E731  (table i's GPUs on host h)
    # whether unit i may go to host h with unit j away from it: no other block of its table there
    free = lambda i, h, j=-1: not any(host[k] == h for k in np.flatnonzero(group == group[i]) if k not in (i, j))  # noqa: E731
    for _ in range(rounds):
        changes = []
        for i in range(T):
            for h in range(H):
                if h != host[i] and (used[at(i, h)] + size[i] <= cap).all() and free(i, h):
                    changes.append(((i, h),))
            for j in range(i + 1, T):
                if host[j] == host[i] or not (free(i, host[j], j) and free(j, host[i], i)):
                    continue
                u = used.copy()
                u[at(i, host[i])] -= size[i]
                u[at(j, host[j])] -= size[j]
                u[at(i, host[j])] += size[i]
                u[at(j, host[i])] += size[j]
                if u.max() <= cap:
                    changes.append(((i, host[j]), (j, host[i])))
        if not changes:
            break
        trials = np.repeat(state[None], len(changes), axis=0)
        for n, change in enumerate(changes):
            for i, h in change:
                trials[n, at(i, host[i])] -= rows[i]
            for i, h in change:
                trials[n, at(i, h)] += rows[i]
        scores = scorer.score(trials)
        n = int(scores.argmin())
        if not scores[n] < cost * (1 - 1e-4):
            break
        for i, h in changes[n]:
            used[at(i, host[i])] -= size[i]
        for i, h in changes[n]:
            used[at(i, h)] += size[i]
            host[i] = h
        state, cost = trials[n], float(scores[n])
    return host, cost


def cut_ladder(whole: list[Shard], single: np.ndarray, max_cut: int) -> list[list[Shard]]:
    """Cuts of a task to let the policy place: the j costliest tables (by the cost net, alone)
    halved, for j = 1, 2, 4, ... up to `max_cut`, and the 1 and 2 costliest in quarters — where
    their widths allow. Every cut is a list of pieces covering every table."""
    order = [i for i in np.argsort(-single, kind="stable") if splits.can_halve(whole[i])]
    ladder, seen = [], set()
    steps = [(j, 2) for j in (1, 2, 4, 8, 16) if j <= max_cut] + [(1, 4), (2, 4)]
    for j, parts in steps:
        chosen = {int(i): min(parts, whole[i].width // 4) for i in order[:j]}
        key = tuple(sorted(chosen.items()))
        if not chosen or key in seen:
            continue
        seen.add(key)
        ladder.append([q for i, p in enumerate(whole) for q in (splits.cut(p, chosen[i]) if i in chosen else [p])])
    return ladder
