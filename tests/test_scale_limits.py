"""Planning at the limits (issue 34): what a plan of 100,000 tables on 1,024 devices costs in
memory and time, piece by piece — the cost net's per-device sums, a spec's dict, the plan file."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import torch

from dreamshard.learned import nets
from dreamshard.plan import Plan, load_plans, save_plans
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task


def test_shard_sum_by_index_equals_the_one_hot_sum(monkeypatch):
    g = torch.Generator().manual_seed(0)
    for E, T, D, H in ((3, 50, 8, 5), (1, 7, 3, 1), (4, 30, 16, 2)):
        enc, placement = torch.randn(E, T, H, generator=g), torch.randint(-1, D, (E, T), generator=g)
        small = nets.shard_sum(enc, placement, D)
        monkeypatch.setattr(nets, "ONE_HOT_LIMIT", 0)
        large = nets.shard_sum(enc, placement, D)
        monkeypatch.undo()
        assert large.shape == (E, D, H) and torch.allclose(small, large, atol=1e-5)


def test_shard_sum_of_six_plans_at_the_limits_stays_small():
    # the dreamshard planner prices its policy's and the heuristics' plans of a task together:
    # at 100,000 tables × 1,024 devices a one-hot of them was 2.5 GB (5 GB while built)
    code = ("import resource, torch; from dreamshard.learned.nets import shard_sum; "
            "p = torch.randint(0, 1024, (6, 100_000)); z = shard_sum(torch.ones(6, 100_000, 33), p, 1024); "
            "assert torch.allclose(z.sum((1, 2)), torch.full((6,), 3.3e6)); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # KB: the process peaks at ~1 GB (torch's own ~0.4 GB, the inputs, the sums); the one-hot path at 2.5-5 GB
    assert int(r.stdout) < 2_000_000, f"peak {int(r.stdout) / 1e6:.1f} GB"


def test_spec_dict_has_every_field():
    t = TableSpec("a", 10, 16, 1.5, distribution="zipf:1.2", seed=3)
    d = dataclasses.asdict(t)
    d["bins"] = list(t.bins)
    assert t.to_dict() == d and list(t.to_dict()) == list(d)


def test_a_plan_file_is_a_line_per_key_and_per_table(tmp_path):
    tables = [TableSpec(f"t{i}", 100 + i, 16, 1.0) for i in range(5)]
    plan = Plan.table_wise(Task(tables, 2, 10**9), [0, 1, 0, 1, 1], "lookup")
    save_plans([plan], tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    assert json.loads(text) == plan.to_json()
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and ' "devices": 2,' in lines
    assert sum(line.startswith('  {"name": "t') for line in lines) == 5
    assert load_plans(tmp_path / "p.json")[0].placement == plan.placement


def test_the_search_is_bounded_at_the_largest_sizes():
    from dreamshard.planners import get_planner
    from dreamshard.planners import dreamshard as planner_module

    planner = get_planner("dreamshard")
    best = planner.best_of
    assert best > 2  # the shipped model samples: otherwise there is nothing to bound
    # every task of the benchmarks and the docs' tables plays all its episodes
    assert [planner.episodes(t, d) for t, d in ((200, 8), (2_000, 1_024), (10_000, 1_024), (20_000, 256), (100_000, 64))] == [best] * 5
    # the sampled ones bounded above: the greedy episode and one sampled at the limits
    assert planner.episodes(50_000, 1_024) < best and planner.episodes(100_000, 1_024) == 2
    assert planner.episodes(10**9, 1_024) == 1 and planner.episodes(10**9, 1_024, least=2) == 2
    assert get_planner("dreamshard", best_of=1).episodes(100_000, 1_024) == 1
    assert planner_module.CUTS_MAX_TABLES < 100_000


def test_a_bounded_search_says_so_and_still_places_every_table(monkeypatch):
    """The bounds of `test_the_search_is_bounded_at_the_largest_sizes`, lowered to a small task
    (a plan at 100,000 tables takes a minute: benchmarks/large_tasks.py and docs/usage.md)."""
    from dreamshard.planners import dreamshard as planner_module
    from dreamshard.planners import get_planner
    from dreamshard.synth import PoolConfig, synth_pool

    tables = synth_pool(PoolConfig(tables=60, seed=2))
    sizes = [t.bytes() for t in tables]
    task = Task(tables, 8, max(int(sum(sizes) / 8 * 1.3), max(sizes)))
    unbounded = get_planner("dreamshard").plan(task)
    assert not any("bounded" in n or "learned cuts" in n for n in unbounded.notes)
    monkeypatch.setattr(planner_module, "SAMPLED_DEVICE_STEPS", 60 * 8 * 3)  # 3 sampled episodes
    monkeypatch.setattr(planner_module, "CUTS_MAX_TABLES", 50)
    for split in (False, True):
        plan = get_planner("dreamshard", split=split).plan(task)
        plan.check()
        assert any("the policy played 4 of its 16 episodes (the greedy one and 3 sampled" in n for n in plan.notes), plan.notes
        assert any("the search placed no learned cuts" in n and "under 6 of its 11 dim caps" in n for n in plan.notes) == split, plan.notes
        if split:
            assert "learned cuts" not in plan.predicted["candidate"]
