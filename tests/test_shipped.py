"""Which shipped model a learned planner uses (dreamshard/shipped.py): the file of the GPU planned
for, else another GPU's, said so; the peers plan without --model where one is shipped, and then
`compare` and the demo include them. The models here are trained on the simulator in the test, in
a folder of the test's: nothing here is shipped."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_helpers import invoke, small_pool

from dreamshard import shipped
from dreamshard.cli import model_defaults
from dreamshard.costs import comm
from dreamshard.costs.sim import SimBackend
from dreamshard.learned.nets import DreamShardModel
from dreamshard.planners import PLANNERS, get_planner
from dreamshard.report import missing_arguments
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tasks import Task, sample_tasks, save_tasks
from dreamshard.validation import ModelError, OptionError


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Six tasks of 8–12 tables on 2 devices, of a pool written to disk (a task file names it)."""
    folder = small_pool(tmp_path_factory, 60, 3)
    return sample_tasks(synth_pool(PoolConfig(tables=60, seed=3)), 6, (8, 12), 2, 5 * 10**9, seed=4, pool=str(folder))


@pytest.fixture(scope="module")
def trained(tasks, tmp_path_factory):
    """Small models of the three learned planners trained on the simulator (2 devices wide)."""
    out = tmp_path_factory.mktemp("trained")
    torch.set_num_threads(1)
    small = {"autoshard": {"iterations": 1, "measurements_per_iteration": 2}, "rnn": {"iterations": 1, "measurements_per_iteration": 2},
             "dreamshard": {"iterations": 1, "measurements_per_iteration": 2, "cost_steps": 4, "cost_batch": 4, "rl_batches": 1, "rl_tasks_per_batch": 2,
                            "rl_episodes_per_task": 2, "best_of": 2}}
    for name, options in small.items():
        cls = PLANNERS[name]
        cls.fit(tasks[:4], SimBackend(), out / f"{name}.pt", cls.config(batch_size=1024, **options), progress=False)
    return out


def ship(trained, folder, files: dict[str, str]):
    """A models folder holding `files` (shipped name → the trained planner's file)."""
    folder.mkdir()
    for name, planner in files.items():
        shutil.copy(trained / f"{planner}.pt", folder / name)
    return folder


@pytest.fixture(autouse=True)
def default_h200(monkeypatch):
    """The rule's tests as if the default GPU were H200, the package's shipping H100's: a default
    GPU with a file and without one are both exercised."""
    monkeypatch.setattr(shipped, "DEFAULT_GPU", "h200")


@pytest.fixture
def cpu(monkeypatch):
    """Planning on a machine without a GPU: for the default GPU."""
    monkeypatch.setattr(comm, "local_gpu", lambda: None)


def test_the_gpus_own_file_else_the_default_gpus_else_another_and_the_label_says_which(trained, tmp_path, monkeypatch, cpu):
    folder = ship(trained, tmp_path / "models", {"autoshard_h100.pt": "autoshard", "autoshard_h200.pt": "autoshard", "rnn_h100.pt": "rnn",
                                                 "rnn_h200.pt.ckpt": "rnn", "notes.txt": "rnn"})
    monkeypatch.setattr(shipped, "MODELS_DIR", folder)
    assert shipped.shipped("autoshard") == {"h100": folder / "autoshard_h100.pt", "h200": folder / "autoshard_h200.pt"}
    assert shipped.shipped("rnn") == {"h100": folder / "rnn_h100.pt"}  # a checkpoint or another file is no model
    for gpu in ("h100", "h200"):
        choice = shipped.choose("autoshard", gpu)
        assert choice.path == folder / f"autoshard_{gpu}.pt" and choice.label == f"shipped {gpu.upper()} model" and choice.note == ""
    b200 = shipped.choose("autoshard", "b200")  # none shipped for it: comm.DEFAULT_GPU's first
    assert b200.path.name == f"autoshard_{shipped.DEFAULT_GPU}.pt" and b200.label == "shipped H200 model, trained on H200; planning for B200"
    assert shipped.choose("rnn").path.name == "rnn_h100.pt"  # here (no GPU) for DEFAULT_GPU; only H100's shipped
    assert shipped.label("rnn") == shipped.choose("rnn").note == "shipped H100 model, trained on H100; planning for H200"
    monkeypatch.setattr(comm, "local_gpu", lambda: "h100")  # on an H100: its own
    assert shipped.label("rnn") == "shipped H100 model" and shipped.model_path("autoshard") == folder / "autoshard_h100.pt"
    assert shipped.choose("dreamshard") is None and shipped.label("dreamshard") == "" and not shipped.available("dreamshard")
    assert shipped.describe_default("autoshard") == "the shipped model of this GPU (H100 or H200; else H200's)"
    assert shipped.describe_default("rnn") == "the shipped H100 model" and shipped.describe_default("dreamshard") == ""


SHIPPED = {"dreamshard": ("h100", "h200"), "autoshard": ("h100", "h200"), "rnn": ("h100", "h200")}  # what the package ships, per planner


def test_the_package_ships_every_learned_planners_models_by_this_rule(monkeypatch):
    monkeypatch.setattr(shipped, "DEFAULT_GPU", comm.DEFAULT_GPU)
    for planner, gpus in SHIPPED.items():
        assert shipped.shipped(planner) == {g: shipped.MODELS_DIR / f"{planner}_{g}.pt" for g in gpus}
        assert shipped.choose(planner, "h100").label == "shipped H100 model"
        assert shipped.choose(planner, "h200").label == ("shipped H200 model" if "h200" in gpus else "shipped H100 model, trained on H100; planning for H200")


def test_peers_plan_with_their_shipped_model_without_model(trained, tasks, tmp_path, monkeypatch, cpu):
    folder = ship(trained, tmp_path / "models", {"autoshard_h200.pt": "autoshard", "rnn_h100.pt": "rnn"})
    monkeypatch.setattr(shipped, "MODELS_DIR", folder)
    for name in ("autoshard", "rnn"):
        assert PLANNERS[name].requires == () and not missing_arguments(name)
        assert PLANNERS[name].description.endswith(f"(--model, default: {shipped.describe_default(name)})")
        planner = get_planner(name)
        by_file = get_planner(name, model=str(folder / shipped.choose(name).path.name))
        for task in tasks[4:]:
            plan = planner.plan(task)
            plan.check()
            assert plan.shards == by_file.plan(task).shards
            assert plan.notes == ([] if name == "autoshard" else ["shipped H100 model, trained on H100; planning for H200"])
    assert get_planner("autoshard").label == "shipped H200 model"
    # none shipped: the one-line error of before
    monkeypatch.setattr(shipped, "MODELS_DIR", tmp_path / "empty")
    for name in ("autoshard", "rnn"):
        assert PLANNERS[name].requires == ("model",) and PLANNERS[name].description.endswith("(--model)")
        with pytest.raises(OptionError, match=f"planner {name} needs a trained model: --model MODEL.pt"):
            get_planner(name)


def test_dreamshard_and_neuroshard_load_dreamshards_shipped_model_by_the_rule(trained, tasks, tmp_path, monkeypatch, cpu):
    folder = ship(trained, tmp_path / "models", {"dreamshard_h100.pt": "dreamshard"})
    monkeypatch.setattr(shipped, "MODELS_DIR", folder)
    model = DreamShardModel.load()
    assert model.meta == torch.load(trained / "dreamshard.pt", weights_only=True)["meta"] and model.meta["backend"] == SimBackend().name
    neuro = get_planner("neuroshard", depth=1)
    assert neuro.label == "shipped H100 model, trained on H100; planning for H200"
    assert neuro.plan(tasks[4]).predicted["source"] == "dreamshard cost net (shipped H100 model, trained on H100; planning for H200)"
    get_planner("dreamshard").plan(tasks[4]).check()
    monkeypatch.setattr(shipped, "MODELS_DIR", tmp_path / "empty")
    with pytest.raises(ModelError, match="no dreamshard model is shipped"):
        DreamShardModel.load()


def test_the_cli_help_says_where_each_planners_model_comes_from(trained, tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "MODELS_DIR", ship(trained, tmp_path / "one", {"dreamshard_h200.pt": "dreamshard"}))
    assert model_defaults() == "dreamshard, neuroshard: the shipped H200 model by default; autoshard, rnn: required"
    folder = ship(trained, tmp_path / "models", {"autoshard_h100.pt": "autoshard", "rnn_h100.pt": "rnn", "dreamshard_h100.pt": "dreamshard",
                                                 "dreamshard_h200.pt": "dreamshard"})
    monkeypatch.setattr(shipped, "MODELS_DIR", folder)
    assert model_defaults() == ("dreamshard, neuroshard: the shipped model of this GPU (H100 or H200; else H200's) by default; "
                                "autoshard, rnn: the shipped H100 model by default")


def test_plan_compare_and_demo_include_the_peers_with_a_shipped_model(trained, tasks, tmp_path, monkeypatch, cpu):
    folder = ship(trained, tmp_path / "models", {"autoshard_h200.pt": "autoshard", "rnn_h200.pt": "rnn"})
    shutil.copy(shipped.MODELS_DIR / "dreamshard_h100.pt", folder)  # the package's own
    monkeypatch.setattr(shipped, "MODELS_DIR", folder)
    task_file = tmp_path / "tasks.jsonl"
    wide = Task(tasks[5].tables, 4, tasks[5].max_memory_bytes, tasks[5].workload, tasks[5].pool)  # wider than the rnn model (2 devices)
    save_tasks([*tasks[4:], wide], task_file)
    r = invoke("plan", "--tasks", task_file, "--planner", "autoshard", "--out", tmp_path / "as.jsonl", "--quiet")
    assert r.exit_code == 0 and len((tmp_path / "as.jsonl").read_text().splitlines()) == 3, r.output
    r = invoke("compare", "--tasks", task_file, "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    results = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert {"autoshard", "rnn", "dreamshard", "neuroshard"} <= set(results["planners"])
    rnn_rows = [row for row in results["rows"] if row["planner"] == "rnn"]
    assert [row["error"] is None for row in rnn_rows] == [True, True, False] and "up to 2 devices" in rnn_rows[2]["error"]
    r = invoke("demo", "--workdir", tmp_path / "demo", "--devices", 2, "--tables", 10)
    assert r.exit_code == 0, r.output
    table = r.output[r.output.index("embedding step cost"):]
    assert "\nautoshard " in table and "\nrnn " in table and "skipped planner autoshard" not in r.output


def test_row_splits_are_priced_for_the_gpu_planned_for(monkeypatch):
    """The search's collectives come from the NCCL model of the GPU planned for, as its cost net
    does: the visible GPU's, else the default GPU's (a CPU plans for it)."""
    from dreamshard.planners.scoring import comm_params

    for visible, expect in ((None, comm.DEFAULT_GPU), ("h200", "h200")):
        monkeypatch.setattr(comm, "local_gpu", lambda v=visible: v)
        assert comm_params(None, 4) == comm.CommModel.load(comm.DATA_DIR / f"{expect}_nccl_4gpu.json").params()
    assert comm_params(None, 4) != comm.CommModel.load(comm.DATA_DIR / f"{comm.DEFAULT_GPU}_nccl_4gpu.json").params()  # the two GPUs' models differ
