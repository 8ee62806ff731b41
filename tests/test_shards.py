"""Plans of shards: column ranges tile each table, plan/2 round-trips (and plan/1 still loads),
memory and costs follow the shards, and a column shard is measured for real."""

import json
from dataclasses import replace

import pytest

from dreamshard.costs.sim import SimBackend
from dreamshard.plan import Plan, Shard, column_cuts, load_plans, save_plans
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task, Workload
from dreamshard.validation import PlanError

POOL = synth_pool(PoolConfig(tables=12, seed=4))


def wide_task(devices=2, cap=10**12, workload=Workload()) -> Task:
    tables = [TableSpec("w", 5000, 96, 20.0, distribution="zipf:1.1", seed=3), TableSpec("n", 3000, 16, 5.0, distribution="uniform", seed=4)]
    return Task(tables, devices, cap, workload)


@pytest.mark.parametrize("dim,parts", [(96, 2), (96, 3), (12, 3), (1024, 7), (4, 1), (20, 5)])
def test_column_cuts_tile_the_dim_in_multiples_of_4(dim, parts):
    cuts = column_cuts(dim, parts)
    assert len(cuts) == parts and cuts[0][0] == 0 and cuts[-1][1] == dim
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    widths = [b - a for a, b in cuts]
    assert all(w >= 4 and w % 4 == 0 for w in widths) and max(widths) - min(widths) <= 4


def test_column_cuts_refuse_too_many_parts():
    with pytest.raises(ValueError):
        column_cuts(12, 4)


def test_table_wise_plan_is_one_full_shard_per_table():
    task = wide_task()
    plan = Plan.table_wise(task, [1, 0], "manual")
    assert plan.is_table_wise and plan.placement == [1, 0] and plan.split_tables() == {}
    assert [[t.name for t in d] for d in plan.device_tables()] == [["n"], ["w"]]


def test_split_plan_costs_memory_and_streams_follow_the_shards(tmp_path):
    task = wide_task(workload=Workload(4096, "fp32", "rowwise_adagrad"))
    w = task.tables[0]
    plan = Plan(task, [Shard(0, 0, 0, 48), Shard(0, 1, 48, 96), Shard(1, 1, 0, 16)], "manual")
    plan.check()
    with pytest.raises(ValueError, match="splits tables"):
        plan.placement  # noqa: B018
    assert plan.split_tables() == {"w": 2}
    d0, d1 = plan.device_tables()
    assert [t.name for t in d0] == ["w[0:48]"] and [t.name for t in d1] == ["w[48:96]", "n"]
    half = d0[0]
    # a column shard reads the table's own stream: same rows, pooling, distribution and seed
    assert (half.rows, half.pooling_factor, half.distribution, half.seed, half.dim) == (w.rows, w.pooling_factor, w.distribution, w.seed, 48)
    # memory: its columns, plus (row-wise Adagrad) one fp32 of state per row for every shard
    assert plan.device_bytes()[0] == w.rows * 48 * 4 + 4 * w.rows
    # the all-to-all follows the dim sums: device 1 sends 48 + 16 columns of every sample
    report = SimBackend().evaluate_plan(plan)
    assert report.batch_size == 4096 and report.precision == "fp32" and report.optimizer == "rowwise_adagrad"
    assert report.devices[0].fwd_comm_ms > 0 and report.devices[1].fwd_comp_ms > 0
    path = tmp_path / "split.json"
    save_plans([plan], path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "dreamshard.plan/2" and doc["workload"] == {"batch_size": 4096, "precision": "fp32", "optimizer": "rowwise_adagrad"}
    assert doc["tables"][0]["shards"] == [{"device": 0, "columns": [0, 48], "bytes": w.rows * 48 * 4 + 4 * w.rows},
                                          {"device": 1, "columns": [48, 96], "bytes": w.rows * 48 * 4 + 4 * w.rows}]
    (back,) = load_plans(path)
    assert back.shards == plan.shards and back.workload == plan.workload
    assert back.device_tables() == plan.device_tables()
    # gzipped JSON lines: the same plans back; a damaged file is one line naming it
    save_plans([plan, plan], tmp_path / "many.jsonl.gz")
    assert [p.shards for p in load_plans(tmp_path / "many.jsonl.gz")] == [plan.shards] * 2
    (tmp_path / "bad.jsonl.gz").write_bytes((tmp_path / "many.jsonl.gz").read_bytes()[:40])
    with pytest.raises(PlanError, match="bad.jsonl.gz: cannot read") as e:
        load_plans(tmp_path / "bad.jsonl.gz")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shards,match", [
    ([Shard(0, 0, 0, 48), Shard(1, 1, 0, 16)], r"cover columns \[0, 48\) of its 96"),
    ([Shard(0, 0, 0, 48), Shard(0, 1, 40, 96), Shard(1, 1, 0, 16)], "do not continue its shards at column 48"),
    ([Shard(0, 0, 0, 50), Shard(0, 1, 50, 96), Shard(1, 1, 0, 16)], "50 wide; use a multiple of 4"),
    ([Shard(0, 0, 0, 96), Shard(0, 1, 96, 100), Shard(1, 1, 0, 16)], r"\[96, 100\) do not continue .* within dim 96"),
    ([Shard(0, 2, 0, 96), Shard(1, 1, 0, 16)], "on device 2, outside 0..1"),
])
def test_bad_shards_are_refused_with_the_table_named(shards, match):
    with pytest.raises(PlanError, match=match):
        Plan(wide_task(), shards, "manual").check()


def test_shards_are_held_to_memory():
    task = wide_task(cap=5000 * 48 * 2 + 3000 * 16 * 2)
    Plan(task, [Shard(0, 0, 0, 48), Shard(0, 1, 48, 96), Shard(1, 0, 0, 16)], "manual").check()  # fits only split
    with pytest.raises(PlanError, match="device 0 holds"):
        Plan.table_wise(task, [0, 0], "manual").check()


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_a_shards_bytes_are_its_extent_as_a_table(precision, optimizer):
    """Shard.bytes prices the shard's rows × columns by TableSpec.bytes without building a spec."""
    table = TableSpec("w", 5000, 96, 20.0)
    for shard in [Shard(0, 0, 0, 96), Shard(0, 0, 32, 96), Shard(0, 0, 0, 96, 0, 5000), Shard(0, 0, 0, 96, 1250, 2500), Shard(0, 0, 0, 96, 4999)]:
        a, b = shard.row_range(table)
        assert shard.bytes(table, precision, optimizer) == replace(table, rows=b - a, dim=shard.width).bytes(precision, optimizer)


def test_plan_1_files_still_load(tmp_path):
    task = Task(POOL[:3], 2, 10**12, Workload(precision="fp32"))
    doc = {"format": "dreamshard.plan/1", "devices": 2, "max_memory_bytes": 10**12, "planner": "size", "precision": "fp32", "optimizer": "sgd",
           "tables": [{"name": t.name, "device": d, "spec": t.to_dict()} for t, d in zip(task.tables, [0, 1, 1])]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    (plan,) = load_plans(path)
    assert plan.placement == [0, 1, 1] and plan.workload == Workload(65_536, "fp32", "sgd")


def test_a_column_shard_is_measured_for_real():
    """Sequential runner, torch kernel, CPU: the two halves of a wide table each do every lookup
    at half the width, so together they cost about what the whole table costs (not half)."""
    from dreamshard.costs.runners import SequentialRunner

    task = wide_task(devices=2, workload=Workload(512))
    whole = Plan.table_wise(task, [0, 1], "manual")
    split = Plan(task, [Shard(0, 0, 0, 48), Shard(0, 1, 48, 96), Shard(1, 1, 0, 16)], "manual")
    runner = SequentialRunner("torch", device="cpu", warmup=1, iters=3)
    r_whole, r_split = runner.evaluate_plan(whole), runner.evaluate_plan(split)
    assert r_split.details["tables_per_device"] == [1, 2] and r_split.details["dim_sums"] == [48, 64]
    assert r_whole.details["dim_sums"] == [96, 16]
    assert all(c.fwd_comp_ms > 0 and c.bwd_comp_ms > 0 for c in r_split.devices)


def test_a_split_plan_runs_on_the_distributed_runner():
    """Two gloo processes, real all-to-alls sized by the shards' dim sums."""
    from dreamshard.costs.runners import DistributedRunner

    task = wide_task(devices=2, workload=Workload(256))
    split = Plan(task, [Shard(0, 0, 0, 48), Shard(0, 1, 48, 96), Shard(1, 1, 0, 16)], "manual")
    r = DistributedRunner("torch", "cpu", 1, 3, timeout_s=120).evaluate_plan(split)
    assert r.runner == "distributed" and not r.comm_modelled and r.details["dim_sums"] == [48, 64]
    assert all(c.fwd_comm_ms > 0 and c.bwd_comp_ms > 0 for c in r.devices)
