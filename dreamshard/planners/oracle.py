"""`oracle`: a long search on the *true* cost of a cost backend — the quality ceiling the other
planners are measured against (docs/dreamshard.md, "The oracle: how far from the best plan").

Simulated annealing with restarts over plans of column shards, every candidate priced by the
backend it is given (never a model of it):
- **State**: a list of pieces (column ranges of tables, multiples of 4 wide) and a device each,
  every device within memory — a move that would overfill a device is never proposed.
- **Starts**: the `lookup` greedy plan, the `lookup --split` plan (with `split`), then `restarts`
  restarts, each placed by the lookup greedy run on the *true* cost (pieces with the most binding
  share of memory or proxy load first, each to the one of the 4 least costly devices with room
  that the backend prices best, in one batch), over pieces that alternate (with `split`) between
  the hand rule's cuts at a threshold halved each time and the best plan's pieces, in an order
  jittered at random (±30% on the proxy); if memory runs out, the best plan with a random quarter
  of its pieces moved at random. The evaluation budget is shared evenly among the runs.
- **Moves**: move a piece to another device; swap two pieces of different devices; (with `split`)
  halve a piece (`splits.cut`, one half staying, the other to another device; at most one piece
  per device and per 4 columns of a table) and merge two adjacent pieces of one table onto one
  device. Moves favour the pieces of the slowest device and the fastest devices as targets.
- **Batches**: each step proposes a batch of neighbours that share one list of pieces (moves and
  swaps; or one cut with every target device; or one merge on every device with room), priced in
  one call of the backend's `costs_batch` where it has one (the simulator: [N, D, 4] costs of N
  placements of the same tables), else one `evaluate` each (a batch of one, then: plain annealing).
- **Acceptance**: the batch's best neighbour by a smooth maximum of the device costs (log-sum-exp
  at 1% of the start cost: fewer devices near the top is better, not only a lower top) replaces
  the current plan if better, or else with probability exp(-relative worsening / temperature),
  the temperature falling geometrically from 1% to 0.01% over each run's share of the budget.
The best plan seen by the true cost (max over devices of the four components' sum) is returned,
so it is never worse than its starts. `budget` counts every placement priced, the returned plan's
final pricing (`plan.predicted`, source: the backend's name) included. Deterministic for a seed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dreamshard.packing import InfeasibleError
from dreamshard.plan import Plan, Shard
from dreamshard.planners import splits
from dreamshard.planners.base import Planner, register
from dreamshard.planners.heuristics import LookupGreedyPlanner
from dreamshard.tasks import Task
from dreamshard.topology import several_hosts
from dreamshard.validation import DIM_MULTIPLE, OptionError

if TYPE_CHECKING:
    from dreamshard.costs.base import CostBackend, CostReport

Piece = tuple[int, int, int]  # (table, start, stop)

BATCH = 16  # neighbours per step on a batched backend
TAU = 0.01  # smooth-max temperature, relative to the start cost
T_START, T_END = 1e-2, 1e-4  # annealing temperature on relative cost, start and end of each run
FOCUS = 0.7  # chance that a move takes a piece of the slowest device
P_SPLIT, P_MERGE = 0.12, 0.06  # chance that a step cuts a piece / merges two (with split)


class Pricer:
    """Prices placements of pieces with the backend and counts every placement priced."""

    def __init__(self, backend: "CostBackend", task: Task, budget: int, progress=None):
        self.backend, self.task, self.budget, self.progress = backend, task, budget, progress
        self.used = 0
        self.reserved: np.ndarray | None = None  # [D] bytes each device holds beyond the pieces priced (a subclass's pieces that stay)
        self.batched = callable(getattr(backend, "costs_batch", None))
        self._specs: dict[Piece, object] = {}
        self._bytes: dict[Piece, int] = {}

    @property
    def left(self) -> int:
        return self.budget - self.used

    def spec(self, p: Piece):
        if p not in self._specs:
            self._specs[p] = Shard(p[0], -1, p[1], p[2]).spec(self.task.tables[p[0]])
        return self._specs[p]

    def size(self, p: Piece) -> int:
        if p not in self._bytes:
            self._bytes[p] = self.task.table_bytes(self.spec(p))
        return self._bytes[p]

    def totals(self, pieces: list[Piece], placements: np.ndarray) -> np.ndarray:
        """[N, D] per-device cost (ms, the four components' sum) of N placements of `pieces`,
        counted against the budget."""
        placements = np.asarray(placements, np.int64).reshape(-1, len(pieces))
        if len(placements) > self.left:
            raise AssertionError("oracle: pricing past its budget")  # a bug: callers cap N
        self.used += len(placements)
        if self.progress is not None:
            self.progress(self.used, self.budget)
        return self.price(pieces, placements)

    def price(self, pieces: list[Piece], placements: np.ndarray) -> np.ndarray:
        """`totals` without the count: the backend's prices of [N, P] placements."""
        N, D = len(placements), self.task.devices
        specs = [self.spec(p) for p in pieces]
        # a task on several hosts, priced on them where the backend can (costs/hierarchy.py)
        topo = several_hosts(self.task.topology) if getattr(self.backend, "supports_topology", False) else None
        on = {"topology": topo} if topo is not None else {}
        if self.batched:
            return np.asarray(self.backend.costs_batch(specs, placements, D, workload=self.task.workload, **on)).sum(axis=-1)
        out = np.empty((N, D))
        for n, row in enumerate(placements):
            held: list[list] = [[] for _ in range(D)]
            for spec, d in zip(specs, row):
                held[d].append(spec)
            out[n] = [c.total_ms for c in self.backend.evaluate(held, self.task.workload, **on).devices]
        return out

    def report(self, plan: Plan) -> "CostReport":
        self.used += 1
        if self.progress is not None:
            self.progress(self.used, self.budget)
        return self.backend.evaluate_plan(plan)


def smooth_max(totals: np.ndarray, tau: float) -> np.ndarray:
    """log-sum-exp of each row at temperature `tau` ms: the max, plus a little per device near it."""
    top = totals.max(axis=-1)
    return top + tau * np.log(np.exp((totals - top[..., None]) / tau).sum(axis=-1))


class State:
    """Pieces, their devices and bytes, each device's bytes and cost."""

    def __init__(self, pieces: list[Piece], dev: np.ndarray, pricer: Pricer, totals: np.ndarray):
        self.pieces = list(pieces)
        self.dev = np.asarray(dev, np.int64).copy()
        self.size = np.array([pricer.size(p) for p in self.pieces], np.int64)
        self.used = np.bincount(self.dev, weights=self.size, minlength=pricer.task.devices).astype(np.int64)
        if pricer.reserved is not None:
            self.used += pricer.reserved
        self.totals = np.asarray(totals, float)

    @property
    def cost(self) -> float:
        return float(self.totals.max())


class Annealer:
    """The oracle's search (the module's doc), on whatever `Pricer` prices placements: the
    `oracle` planner's on its backend, `dreamshard`'s last stage on its cost net."""

    def __init__(self, restarts: int = 4, seed: int = 0, split: bool = True):
        self.restarts, self.seed, self.split = int(restarts), seed, bool(split)

    def run(self, task: Task, pricer: Pricer, starts: list[tuple[list[Piece], np.ndarray]]):
        """Anneal from each of `starts` and then `restarts` restarts, the pricer's budget (less one
        evaluation, kept for a report) shared evenly among the runs. → (the best seen as (cost,
        pieces, devices), or None if nothing was priced; the first start's cost; runs done; the run
        that found the best: r < len(starts) the one from starts[r], else a restart; None if none)."""
        rng = np.random.default_rng(self.seed)
        best: tuple[float, list[Piece], np.ndarray] | None = None
        start_cost = tau = None  # both set by the first start (the restarts come after the starts)
        runs, done, origin = len(starts) + self.restarts, 0, None
        for r in range(runs):
            if pricer.left <= 1:  # one evaluation is kept for the returned plan's report
                break
            if r < len(starts):
                pieces, dev = starts[r]
            else:
                pieces, dev = self._restart(task, pricer, best, r - len(starts), rng, tau)
            share = (pricer.left - 1) // (runs - r)
            if share < 1:
                break
            state = State(pieces, dev, pricer, pricer.totals(pieces, dev[None])[0])
            if start_cost is None:
                start_cost = state.cost
                # a cost model's price may be ~0 or below (a net barely trained): a scale that stays > 0
                tau = TAU * max(abs(start_cost), 1e-9)
            before = best
            if best is None or state.cost < best[0]:
                best = (state.cost, list(state.pieces), state.dev.copy())
            best = self._anneal(task, pricer, state, pricer.used + share - 1, best, rng, tau)
            origin = r if best is not before else origin
            done += 1
        return best, start_cost, done, origin

    def starts(self, task: Task) -> list[tuple[list[Piece], np.ndarray]]:
        """The lookup greedy plans (table-wise; and with its hand split rule): raises the typed
        InfeasibleError only when neither places the task."""
        out, error = [], None
        for split in ((False, True) if self.split else (False,)):
            try:
                plan = LookupGreedyPlanner(split=split).plan(task)
            except InfeasibleError as e:
                error = error or e
                continue
            pieces = [(s.table, s.start, s.stop) for s in plan.shards]
            if not any(p == pieces for p, _ in out):
                out.append((pieces, np.array([s.device for s in plan.shards], np.int64)))
        if not out:
            raise error
        return out

    def _restart(self, task: Task, pricer: Pricer, best, r: int, rng: np.random.Generator, tau: float):
        """Restart r's start: the measured greedy (`_greedy`) over fresh pieces — with `split`,
        even restarts re-cut the tables by the hand rule at a threshold halved each time (the
        per-device average of the lookup proxy / 2, / 4, ...), odd ones keep the best plan's
        pieces — in lookup-proxy order jittered at random; memory too tight for it: the best
        plan with a random quarter of its pieces moved at random."""
        if self.split and r % 2 == 0:
            pieces = self._recut(task, 2.0 ** -(r // 2 + 1))
        else:
            pieces = list(best[1])
        proxy = np.array([(p[2] - p[1]) * task.tables[p[0]].pooling_factor for p in pieces]) * rng.uniform(0.7, 1.3, len(pieces)) if r else None
        dev = self._greedy(task, pricer, pieces, proxy, tau)
        if dev is not None:
            return pieces, dev
        pieces, dev, D, cap = list(best[1]), best[2].copy(), task.devices, task.max_memory_bytes
        size = np.array([pricer.size(p) for p in pieces], np.int64)
        used = np.bincount(dev, weights=size, minlength=D).astype(np.int64)
        for i in rng.choice(len(pieces), max(1, len(pieces) // 4), replace=False):
            legal = np.flatnonzero(used + size[i] <= cap)
            legal = legal[legal != dev[i]]
            if len(legal):
                d = legal[rng.integers(len(legal))]
                used[dev[i]] -= size[i]
                used[d] += size[i]
                dev[i] = d
        return pieces, dev

    @staticmethod
    def _recut(task: Task, fraction: float) -> list[Piece]:
        """The hand rule of `lookup --split` at `fraction` of its threshold: a table whose proxy
        exceeds fraction × the per-device average is cut into ceil(proxy / that) pieces, at most one
        per device and per 4 columns."""
        proxy = [t.dim * t.pooling_factor for t in task.tables]
        limit = fraction * sum(proxy) / task.devices
        out = []
        for piece, cost in zip(splits.whole(task), proxy):
            parts = min(math.ceil(cost / limit), task.devices, piece.width // DIM_MULTIPLE) if limit > 0 else 1
            out += [(s.table, s.start, s.stop) for s in (splits.cut(piece, parts) if parts > 1 else [piece])]
        return out

    def _greedy(self, task: Task, pricer: Pricer, pieces: list[Piece], proxy: np.ndarray | None, tau: float, width: int = 4) -> np.ndarray | None:
        """The lookup greedy on the true cost: pieces in descending order of the larger of their
        share of a device's memory and of a device's proxy load (dim × pooling),
        each to the one of the `width` devices of least measured cost (with room, another piece of
        its table avoided when it can be) that gives the lowest smooth max, all `width` candidates
        priced in one batch. Once the budget runs low the rest go to the least costly device with
        room unpriced. None if memory runs out."""
        D, cap = task.devices, task.max_memory_bytes
        if proxy is None:
            proxy = np.array([(p[2] - p[1]) * task.tables[p[0]].pooling_factor for p in pieces])
        size = np.array([pricer.size(p) for p in pieces], np.int64)
        # the more binding of its share of a device's memory and of a device's proxy load first
        # (hot pieces spread early would leave no device room for the large cold ones)
        proxy = np.asarray(proxy, float)
        order = np.argsort(-np.maximum(size / cap, proxy * D / max(proxy.sum(), 1e-30)), kind="stable")
        used, totals = np.zeros(D, np.int64), np.zeros(D)
        held: dict[int, set[int]] = {}
        dev = np.full(len(pieces), -1, np.int64)
        placed: list[int] = []
        for k, i in enumerate(order):
            legal = used + size[i] <= cap
            if not legal.any():
                return None
            own = list(held.get(pieces[i][0], ()))
            if own and legal.sum() > len(set(own) & set(np.flatnonzero(legal))):
                legal[own] = False
            ok = np.flatnonzero(legal)
            ok = ok[np.argsort(totals[ok], kind="stable")[:width]]
            if len(ok) > 1 and pricer.left - 1 > len(ok) + 1000:  # keep some budget for the search
                prefix = [pieces[j] for j in placed] + [pieces[i]]
                rows = np.repeat(np.append(dev[placed], 0)[None], len(ok), axis=0)
                rows[:, -1] = ok
                cand = pricer.totals(prefix, rows)
                c = int(smooth_max(cand, tau).argmin())
                d, totals = int(ok[c]), cand[c]
            else:
                d = int(ok[0])
            dev[i] = d
            used[d] += size[i]
            placed.append(int(i))
            held.setdefault(pieces[i][0], set()).add(d)
        return dev

    # ---- the annealing -------------------------------------------------------------------

    def _anneal(self, task: Task, pricer: Pricer, state: State, stop: int, best, rng: np.random.Generator, tau: float):
        """Anneal from `state` until `stop` placements have been priced in all; → the best seen."""
        D = task.devices
        if D < 2:
            return best
        first, span = pricer.used, max(1, stop - pricer.used)
        score = float(smooth_max(state.totals, tau))
        batch = BATCH if pricer.batched else 1
        idle = 0
        while pricer.used < stop and idle < 50:
            n = min(batch, stop - pricer.used)
            step = self._neighbours(task, pricer, state, n, rng)
            if step is None:
                idle += 1
                continue
            idle = 0
            pieces, placements = step
            totals = pricer.totals(pieces, placements)
            true = totals.max(axis=1)
            k = int(true.argmin())
            if true[k] < best[0]:
                best = (float(true[k]), list(pieces), placements[k].copy())
            scores = smooth_max(totals, tau)
            k = int(scores.argmin())
            temp = T_START * (T_END / T_START) ** ((pricer.used - first) / span)
            worse = (scores[k] - score) / max(abs(score), 1e-9)
            if worse <= 0 or rng.random() < math.exp(-worse / temp):
                state = State(pieces, placements[k], pricer, totals[k]) if pieces is not state.pieces else self._moved(state, placements[k], totals[k])
                score = float(scores[k])
        return best

    @staticmethod
    def _moved(state: State, dev: np.ndarray, totals: np.ndarray) -> State:
        changed = np.flatnonzero(dev != state.dev)
        np.subtract.at(state.used, state.dev[changed], state.size[changed])
        np.add.at(state.used, dev[changed], state.size[changed])
        state.dev = dev.copy()
        state.totals = totals
        return state

    def _neighbours(self, task: Task, pricer: Pricer, state: State, n: int, rng: np.random.Generator):
        """(pieces, [N, P] placements) of up to n neighbours sharing one list of pieces, or None."""
        if self.split:
            u = rng.random()
            if u < P_SPLIT:
                return self._cuts(task, pricer, state, n, rng)
            if u < P_SPLIT + P_MERGE:
                return self._merges(task, pricer, state, n, rng)
        return self._moves(task, state, n, rng)

    def _piece(self, state: State, rng: np.random.Generator, among: np.ndarray | None = None) -> int:
        """A piece: with chance FOCUS one on the slowest device (if it holds any), else any."""
        pool = np.arange(len(state.pieces)) if among is None else among
        if rng.random() < FOCUS:
            hot = pool[state.dev[pool] == int(state.totals.argmax())]
            if len(hot):
                return int(hot[rng.integers(len(hot))])
        return int(pool[rng.integers(len(pool))]) if len(pool) else -1

    def _moves(self, task: Task, state: State, n: int, rng: np.random.Generator):
        cap = task.max_memory_bytes
        seen, rows = set(), []
        # what every draw reads of the state, which stays as it is while its neighbours are drawn:
        # each draw is then a few scalar operations (the piece drawn as `_piece` draws it)
        P = len(state.pieces)
        hot = np.flatnonzero(state.dev == int(state.totals.argmax()))
        by_speed = np.argsort(state.totals, kind="stable")
        room = state.used[state.dev] - state.size  # each piece's device without it
        for _ in range(4 * n):
            if len(rows) == n:
                break
            i = int(hot[rng.integers(len(hot))]) if rng.random() < FOCUS and len(hot) else int(rng.integers(P))
            a = state.dev[i]
            if rng.random() < 0.5:  # move piece i: to a device with room, half the time one of the three fastest
                legal = state.used + state.size[i] <= cap
                legal[a] = False
                if not legal.any():
                    continue
                ok = by_speed[legal[by_speed]][:3] if rng.random() < 0.5 else np.flatnonzero(legal)
                d = int(ok[rng.integers(len(ok))])
                if ("m", i, d) in seen:
                    continue
                seen.add(("m", i, d))
                row = state.dev.copy()
                row[i] = d
            else:  # swap piece i with a piece j of another device
                fits = np.flatnonzero((state.dev != a) & (state.used[a] - state.size[i] + state.size <= cap) & (room + state.size[i] <= cap))
                if not len(fits):
                    continue
                j = int(fits[rng.integers(len(fits))])
                b = state.dev[j]
                if (min(i, j), max(i, j)) in seen:
                    continue
                seen.add((min(i, j), max(i, j)))
                row = state.dev.copy()
                row[i], row[j] = b, a
            rows.append(row)
        return (state.pieces, np.array(rows)) if rows else None

    def _cuts(self, task: Task, pricer: Pricer, state: State, n: int, rng: np.random.Generator):
        """Halve one piece: the first half stays, the second goes to each of up to n other devices;
        to a device without room for it, in exchange for one of its pieces that fits where the
        cut piece was (a cut and a swap in one move: on tight memory a cut alone rarely fits)."""
        D, cap = task.devices, task.max_memory_bytes
        counts = np.bincount([p[0] for p in state.pieces], minlength=len(task.tables))
        ok = np.array([p[2] - p[1] >= 2 * DIM_MULTIPLE and counts[p[0]] < min(D, task.tables[p[0]].dim // DIM_MULTIPLE) for p in state.pieces])
        i = self._piece(state, rng, np.flatnonzero(ok))
        if i < 0:
            return None
        t, start, stop = state.pieces[i]
        h1, h2 = [(t, s.start, s.stop) for s in splits.cut(Shard(t, -1, start, stop), 2)]
        a = state.dev[i]
        s2 = pricer.size(h2)
        room_a = cap - (state.used[a] - state.size[i] + pricer.size(h1))  # on a once the piece is cut
        others = np.flatnonzero(np.arange(D) != a)
        if len(others) > n:
            fast = others[np.argsort(state.totals[others], kind="stable")[: n // 2]]
            others = np.concatenate([fast, rng.choice(np.setdiff1d(others, fast), n - len(fast), replace=False)])
        pieces = state.pieces[:i] + [h1] + state.pieces[i + 1 :] + [h2]
        base = np.append(state.dev, a)
        rows = []
        for d in others:
            row = base.copy()
            row[-1] = d
            if state.used[d] + s2 > cap:  # swap out a piece of d that makes room and fits on a
                fits = np.flatnonzero((state.dev == d) & (state.used[d] + s2 - state.size <= cap) & (state.size <= room_a))
                if not len(fits):
                    continue
                row[fits[rng.integers(len(fits))]] = a
            rows.append(row)
        return (pieces, np.array(rows)) if rows else None

    def _merges(self, task: Task, pricer: Pricer, state: State, n: int, rng: np.random.Generator):
        """Merge two adjacent pieces of one table into one piece, on each of up to n devices."""
        cap = task.max_memory_bytes
        by_start = {(p[0], p[1]): i for i, p in enumerate(state.pieces)}
        pairs = [(i, by_start[(p[0], p[2])]) for i, p in enumerate(state.pieces) if (p[0], p[2]) in by_start]
        if not pairs:
            return None
        hot = int(state.totals.argmax())
        near = [q for q in pairs if hot in (state.dev[q[0]], state.dev[q[1]])]
        among = near if near and rng.random() < FOCUS else pairs
        i, j = among[rng.integers(len(among))]
        merged = (state.pieces[i][0], state.pieces[i][1], state.pieces[j][2])
        room = state.used.copy()
        room[state.dev[i]] -= state.size[i]
        room[state.dev[j]] -= state.size[j]
        targets = np.flatnonzero(room + pricer.size(merged) <= cap)
        if not len(targets):
            return None
        if len(targets) > n:
            keep = list(dict.fromkeys(d for d in (state.dev[i], state.dev[j]) if d in targets))[:n]
            rest = np.setdiff1d(targets, keep)
            targets = np.concatenate([keep, rng.choice(rest, n - len(keep), replace=False)]).astype(np.int64)
        keep_idx = [k for k in range(len(state.pieces)) if k not in (i, j)]
        pieces = [state.pieces[k] for k in keep_idx] + [merged]
        rows = np.repeat(np.append(state.dev[keep_idx], 0)[None], len(targets), axis=0)
        rows[:, -1] = targets
        return pieces, rows


@register
class OraclePlanner(Annealer, Planner):
    name, description = "oracle", "simulated annealing on a cost backend's true cost: moves, swaps, column splits (needs backend=)"
    kind = "search"
    requires = ("backend",)
    budget_option = ("budget", "evaluations")

    def __init__(self, backend: "CostBackend | None" = None, budget: int = 20_000, restarts: int = 4, seed: int = 0, split: bool = True):
        if backend is None or not callable(getattr(backend, "evaluate", None)):
            raise OptionError("planner oracle needs a cost backend: `dreamshard plan --planner oracle --backend sim`, or backend=SimBackend() in Python")
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
            raise OptionError(f"planner oracle: budget {budget!r:.40} must be a positive number of evaluations")
        if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 0:
            raise OptionError(f"planner oracle: restarts {restarts!r:.40} must be a whole number >= 0")
        super().__init__(restarts, seed, split)
        self.backend, self.budget = backend, int(budget)

    def plan(self, task: Task) -> Plan:
        pricer = Pricer(self.backend, task, self.budget, self.progress)
        starts = self.starts(task)
        best, start_cost, done, _ = self.run(task, pricer, starts)
        if best is None:  # budget 1: the lookup plan, priced once
            pieces, dev = starts[0]
            best = (math.nan, pieces, dev)
        plan = Plan(task, [Shard(p[0], int(d), p[1], p[2]) for p, d in zip(best[1], best[2])], self.name)
        report = pricer.report(plan)
        devices = [{"fwd_comp_ms": c.fwd_comp_ms, "fwd_comm_ms": c.fwd_comm_ms, "bwd_comm_ms": c.bwd_comm_ms, "bwd_comp_ms": c.bwd_comp_ms,
                    "comm_ms": c.fwd_comm_ms + c.bwd_comm_ms, "total_ms": c.total_ms} for c in report.devices]
        plan.predicted = {"source": self.backend.name, "overall_ms": report.overall_ms, "max_device_ms": report.overall_ms,
                          "devices": devices, "evaluations": pricer.used}
        start = f"{start_cost:.3f} ms" if start_cost is not None else "not priced"
        plan.notes = [f"oracle: {pricer.used:,} of {self.budget:,} evaluations on the {self.backend.name}, {done} runs; "
                      f"lookup start {start} → {report.overall_ms:.3f} ms"]
        return plan
