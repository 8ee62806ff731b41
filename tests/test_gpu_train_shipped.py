"""benchmarks/gpu_train_shipped.py on a CPU (its --quick mode: the simulator measures): the three
shipped models trained in one call, each planner's deadline and --resume after a cut."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from dreamshard.planners import PLANNERS

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_train_shipped.py"


def run(monkeypatch, *args) -> dict:
    """The script's main() in this process (its imports once), → its summary.json."""
    spec = importlib.util.spec_from_file_location("gpu_train_shipped", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["gpu_train_shipped.py", "--device", "cpu", "--quick", *map(str, args)])
    torch.set_num_threads(1)
    module.main()
    out = Path(args[args.index("--out") + 1])
    return json.loads((out / "summary.json").read_text())


def test_quick_trains_the_three_shipped_models_in_one_call(tmp_path, monkeypatch):
    summary = run(monkeypatch, "--out", tmp_path)
    assert summary["gpu"] == "cpu" and summary["resume"] is None and summary["calls"] == 1 and summary["peer_budget"] == 4
    measured = [json.loads(line) for line in (tmp_path / "measured.jsonl").read_text().splitlines()]
    for name in ("dreamshard", "autoshard", "rnn"):
        entry = summary["models"][name]
        assert entry["done"] and entry["file"] == f"{name}_cpu.pt" and entry["plans"] == 4 and entry["budget"] == 4
        mine = [m for m in measured if m["planner"] == name]
        assert len(mine) == 4 and entry["shards"] == sum(m["shards"] for m in mine) >= 4
        assert (tmp_path / f"train_{name}.jsonl").is_file()
        model = PLANNERS[name](model=str(tmp_path / entry["file"])).model
        assert model.meta["measurements"] == 4 and model.meta["backend"] == summary["backend"]
    # the default config of each planner, DreamShard's with the shipped model's cost-net options and prior
    assert summary["models"]["dreamshard"]["config"] == PLANNERS["dreamshard"].default_config
    ds = torch.load(tmp_path / "dreamshard_cpu.pt", weights_only=True)["meta"]["config"]
    assert ds["kernel_features"] and ds["comm"] == "model" and ds["prior_plans"] == 32 and ds["shared_terms"]
    assert summary["families"] == ["dlrm", "hot"]


def test_a_family_left_out_of_training(tmp_path, monkeypatch):
    summary = run(monkeypatch, "--out", tmp_path, "--planners", "rnn", "--budget", 4, "--leave-out", "hot")
    assert summary["families"] == ["dlrm"] and summary["training_tasks"] == 1


def test_a_call_cut_by_its_deadline_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch):
    """The RNN placer alone, 2 iterations of 10 plans: the deadline comes after 15 plans of the
    call, so the checkpoint holds the first iteration's 10; --resume trains the rest, and the
    model equals an uninterrupted run's."""
    common = ["--planners", "rnn", "--budget", 20]
    whole = run(monkeypatch, *common, "--out", tmp_path / "whole")["models"]["rnn"]
    cut = run(monkeypatch, *common, "--out", tmp_path / "cut", "--cut-after", 15)
    entry = cut["models"]["rnn"]
    assert not entry["done"] and entry["plans"] == 10 and entry["measured_this_call"] == 15 and "--resume" in cut["resume"]
    assert not (tmp_path / "cut" / "rnn_cpu.pt").exists() and (tmp_path / "cut" / "rnn_cpu.pt.ckpt").exists()
    with pytest.raises(SystemExit):  # OUT holds a run's checkpoint: --resume, or another folder
        run(monkeypatch, *common, "--out", tmp_path / "cut")
    resumed = run(monkeypatch, *common, "--out", tmp_path / "cut", "--resume")
    entry = resumed["models"]["rnn"]
    assert entry["done"] and resumed["calls"] == 2 and resumed["resume"] is None
    assert entry["plans"] == whole["plans"] == 20 and entry["shards"] == whole["shards"]
    a, b = (torch.load(tmp_path / d / "rnn_cpu.pt", weights_only=True)["net"] for d in ("whole", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_peers_budget_is_the_largest_the_time_left_allows(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_train_shipped", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.peer_budget(0.7, 283) == 140 and module.peer_budget(0.05, 10_000) == 400 and module.peer_budget(1.5, 100) == 0
    budget = module.peer_budget(0.9, 300)
    assert budget % 10 == 0 and sum(module.peer_estimate_s(p, budget, 0.9) for p in module.PEERS) <= 300
    assert sum(module.peer_estimate_s(p, budget + 10, 0.9) for p in module.PEERS) > 300


def test_dreamshard_config_refines_its_cost_net_with_a_prior_only():
    """The recipe refines the cost net on its search's plans (`search_plans`), which the prior
    prices: `--search-plans N` replaces the recipe's number, and without a prior there are none."""
    spec = importlib.util.spec_from_file_location("gpu_train_shipped", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.config("dreamshard", 60, 65_536, 4000).search_plans == module.DREAMSHARD_OPTIONS["search_plans"] > 0
    assert module.config("dreamshard", 60, 65_536, 4000).search_rank == module.DREAMSHARD_OPTIONS["search_rank"] > 0
    assert module.config("dreamshard", 60, 65_536, 4000, overrides={"search_plans": 0}).search_plans == 0 == module.config("dreamshard", 60, 65_536, 4000, overrides={"search_plans": 0}).search_rank
    assert module.config("dreamshard", 60, 65_536, 0).search_plans == 0 == module.config("dreamshard", 60, 65_536, 0, overrides={"search_plans": 500}).search_plans
    # --prior-span N likewise: the recipe's count replaced, none without a prior
    assert module.config("dreamshard", 60, 65_536, 4000).prior_span == module.DREAMSHARD_OPTIONS["prior_span"] > 0
    assert module.config("dreamshard", 60, 65_536, 4000, overrides={"prior_span": 96}).prior_span == 96
    assert module.config("dreamshard", 60, 65_536, 0, overrides={"prior_span": 96}).prior_span == 0
    # the shared terms: the recipe's, with or without a prior (they need none); --shared-terms off
    assert module.config("dreamshard", 60, 65_536, 4000).shared_terms and module.config("dreamshard", 60, 65_536, 0).shared_terms
    assert not module.config("dreamshard", 60, 65_536, 4000, overrides={"shared_terms": False}).shared_terms
    assert module.config("dreamshard", 60, 65_536, 4000, overrides={"seed": 1}).seed == 1  # --seed: another training run
