"""TorchRec integration (dreamshard/torchrec_io.py): tables from a TorchRec model, plans to
ShardingPlans and back, the partitioner and planner plug-ins, `export torchrec`, and a small DLRM
trained end to end with DistributedModelParallel on CPU (gloo, 2 processes) from a dreamshard
plan with a column-split table, against the same model unsharded."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec", reason="TorchRec 1.8 is not importable here (the integration needs it)")

import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.planner.types import PlannerError  # noqa: E402
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise  # noqa: E402
from torchrec.distributed.types import ShardingPlan  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402
from torchrec.types import DataType  # noqa: E402

from dreamshard import torchrec_io as tio  # noqa: E402
from dreamshard.sharding_planner import ShardingPlanner  # noqa: E402
from dreamshard.bins import NUM_BINS, count_bins  # noqa: E402
from dreamshard.packing import InfeasibleError  # noqa: E402
from dreamshard.plan import Plan, Shard, load_plans, save_plans  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.planners.torchrec import TorchRecPlanner  # noqa: E402
from dreamshard.tables import TableSpec, save_tables  # noqa: E402
from dreamshard.tasks import Task, Workload  # noqa: E402
from dreamshard.validation import DataError, InputError, OptionError, PlanError, TableError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# (rows, dim, mean bag length): table 0 dominates lookups × dim, so the split heuristics cut it
SHAPES = [(1000, 64, 8), (500, 16, 2), (200, 16, 1), (100, 8, 1)]
FEATURES = [f"f{i}" for i in range(len(SHAPES))]
DENSE = 4  # dense features of the DLRM


def configs(dtype=DataType.FP32):
    return [EmbeddingBagConfig(num_embeddings=r, embedding_dim=d, name=f"t{i}", feature_names=[FEATURES[i]], data_type=dtype) for i, (r, d, _) in enumerate(SHAPES)]


def meta_ebc():
    return EmbeddingBagCollection(tables=configs(), device=torch.device("meta"))


def batch(step: int, lo: int = 0, hi: int = 64, total: int = 64):
    """Samples [lo, hi) of global batch `step` (of `total` samples), the same on every process:
    (KeyedJaggedTensor, dense [n, DENSE], labels [n])."""
    g = torch.Generator().manual_seed(1000 + step)
    lengths = [torch.poisson(torch.full((total,), float(pf)), generator=g).long() for _, _, pf in SHAPES]
    values = [torch.randint(0, r, (int(ln.sum()),), generator=g) for (r, _, _), ln in zip(SHAPES, lengths)]
    dense = torch.randn(total, DENSE, generator=g)
    labels = torch.randint(0, 2, (total,), generator=g).float()
    keep_v, keep_l = [], []
    for ln, v in zip(lengths, values):
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), ln.cumsum(0)])
        keep_v.append(v[int(offsets[lo]) : int(offsets[hi])])
        keep_l.append(ln[lo:hi])
    kjt = KeyedJaggedTensor(keys=FEATURES, values=torch.cat(keep_v), lengths=torch.cat(keep_l))
    return kjt, dense[lo:hi], labels[lo:hi]


def task(devices=2, memory=10**7, **kw):
    return tio.task_from_torchrec(meta_ebc(), devices, memory, batch_size=64, batches=[batch(s)[0] for s in range(4)], **kw)


# --------------------------------------------------------------------------------------------
# Tables from TorchRec
# --------------------------------------------------------------------------------------------


def test_tables_measured_from_batches_match_counts():
    """Pooling = lookups per sample over every feature of the table; bins = the reuse histogram of
    the indices (bins.count_bins on their access counts), over at most max_samples samples."""
    kjts = [batch(s)[0] for s in range(3)]
    tables = tio.tables_from_torchrec(meta_ebc(), batches=kjts)
    assert [(t.name, t.rows, t.dim) for t in tables] == [(f"t{i}", r, d) for i, (r, d, _) in enumerate(SHAPES)]
    for i, t in enumerate(tables):
        jts = [k.to_dict()[FEATURES[i]] for k in kjts]
        assert t.pooling_factor == pytest.approx(sum(int(j.lengths().sum()) for j in jts) / (3 * 64))
        _, counts = torch.unique(torch.cat([j.values() for j in jts]), return_counts=True)
        rows_in, _ = count_bins(counts.numpy())
        assert t.bins == pytest.approx(tuple(rows_in / len(counts)))
        assert sum(t.bins) == pytest.approx(1.0)
    # a table read 3 times at row 7 and once at row 2: half its rows in (0,1], half in (2,4]
    one = [EmbeddingBagConfig(num_embeddings=10, embedding_dim=8, name="x", feature_names=["a"])]
    kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([7, 7, 2, 7]), lengths=torch.tensor([2, 0, 2]))
    (x,) = tio.tables_from_torchrec(one, batches=[kjt])
    assert x.pooling_factor == pytest.approx(4 / 3) and x.bins[:3] == pytest.approx((0.5, 0.0, 0.5)) and sum(x.bins[3:]) == 0
    # max_samples: only the first sample (two lookups of row 7) counts
    (y,) = tio.tables_from_torchrec(one, batches=[kjt], max_samples=1)
    assert y.pooling_factor == 2.0 and y.bins[:2] == pytest.approx((0.0, 1.0))


def test_tables_from_stats_and_constraints(tmp_path):
    ebc = meta_ebc()
    stats = {f"t{i}": {"pooling_factor": 3.0, "distribution": "zipf:1.1"} for i in range(4)}
    stats["t2"] = {"pooling_factor": 1.0, "bins": [1.0] + [0.0] * (NUM_BINS - 1)}
    tables = tio.tables_from_torchrec(ebc, table_stats=stats)
    assert tables[0].distribution == "zipf:1.1" and tables[0].bins[0] < 1 and tables[2].bins[0] == 1.0
    # a table file of ours: rows and dims must be the model's
    path = tmp_path / "stats.json"  # JSON keeps the bins exact (CSV rounds to 6 digits)
    save_tables(tables, path)
    assert tio.tables_from_torchrec(ebc, table_stats=str(path)) == tables
    save_tables([TableSpec("t0", 999, 64, 1.0, distribution="uniform", bins=tables[0].bins)] + tables[1:], path)
    with pytest.raises(TableError, match=r"table 't0' has 999 rows × dim 64, the model's has 1000 × 64$"):
        tio.tables_from_torchrec(ebc, table_stats=path)
    # TorchRec's constraints: pooling = the sum of the table's pooling factors, reuse from a distribution
    cons = {f"t{i}": ParameterConstraints(pooling_factors=[2.0, 0.5]) for i in range(4)}
    got = tio.tables_from_torchrec(ebc, constraints=cons, distribution="uniform")
    assert all(t.pooling_factor == 2.5 and t.distribution == "uniform" for t in got)
    # num_poolings multiply, per-feature batch sizes count relative to the per-rank batch (TorchRec's count of a table's inputs)
    cons = {f"t{i}": ParameterConstraints(pooling_factors=[2.0], num_poolings=[3.0], batch_sizes=[16]) for i in range(4)}
    got = tio.tables_from_torchrec(ebc, constraints=cons, distribution="uniform", rank_batch_size=32)
    assert all(t.pooling_factor == 2.0 * 3.0 * 16 / 32 for t in got)
    with pytest.raises(tio.ConstraintError, match=r"^table 't0': ParameterConstraints\(batch_sizes=\[16\]\): per-feature batch sizes need the per-rank batch size"):
        tio.tables_from_torchrec(ebc, constraints=cons, distribution="uniform")
    # stats override measurement, table by table
    mixed = tio.tables_from_torchrec(ebc, table_stats={"t1": stats["t1"]}, batches=[batch(0)[0]])
    assert mixed[1].pooling_factor == 3.0 and mixed[0].distribution is None


@pytest.mark.parametrize("kwargs, error, message", [
    ({}, TableError, r"^table 't0': no pooling factor or reuse statistics; give table_stats, batches"),
    ({"constraints": {"t0": ParameterConstraints()}}, TableError, r"^table 't0': constraints give its pooling factor but not its reuse"),
    ({"table_stats": {"nope": {"pooling_factor": 1.0, "distribution": "uniform"}}}, TableError, r"^table_stats: table 'nope' is not a table of the model"),
    ({"table_stats": {"t0": {"pooling_factor": -1, "distribution": "uniform"}}}, TableError, r"^table_stats, table 't0', key 'pooling_factor'"),
    ({"batches": []}, DataError, r"^batches: no samples"),
    ({"batches": [KeyedJaggedTensor(keys=["f0"], values=torch.tensor([1]), lengths=torch.tensor([1]))]}, DataError, r"^batches: batch 0 has no feature 'f1' \(of table 't1'\)"),
    ({"batches": [KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1000, 0, 0, 0]), lengths=torch.tensor([1, 1, 1, 1]))]}, DataError,
     r"^batches: batch 0, feature 'f0': index 1000 is outside table 't0''s 1000 rows$"),
    ({"batches": [[1, 2]]}, DataError, r"^batches: batch 0 is a list, not a KeyedJaggedTensor$"),
])
def test_bad_statistics_are_one_line_errors(kwargs, error, message):
    with pytest.raises(error, match=message) as e:
        tio.tables_from_torchrec(meta_ebc(), **kwargs)
    assert "\n" not in str(e.value) and isinstance(e.value, InputError)  # the CLI's one line, exit status 2


def test_task_precision_and_bad_sources():
    assert task().workload == Workload(64, "fp32", "sgd")
    fp16 = EmbeddingBagCollection(tables=configs(DataType.FP16), device=torch.device("meta"))
    assert tio.task_from_torchrec(fp16, 2, 10**7, table_stats={f"t{i}": {"pooling_factor": 1, "distribution": "uniform"} for i in range(4)}).workload.precision == "fp16"
    int8 = EmbeddingBagCollection(tables=configs(DataType.INT8), device=torch.device("meta"))
    with pytest.raises(TableError, match=r"^table 't0': data_type INT8 is not one of FP32, FP16"):
        tio.task_from_torchrec(int8, 2, 10**7, batches=[batch(0)[0]])
    with pytest.raises(TableError, match=r"expected an EmbeddingBagCollection, a model holding one, or a list of EmbeddingBagConfig, got int$"):
        tio.tables_from_torchrec(3, batches=[])
    twice = configs()[:1] * 2
    with pytest.raises(TableError, match=r"two tables are named 't0'"):
        tio.tables_from_torchrec(twice, batches=[])
    # a model holding an EBC deeper down: its path is the plan's module key
    model = torch.nn.Module()
    model.sparse = torch.nn.Module()
    model.sparse.ebc = meta_ebc()
    assert [p for p, _ in tio.embedding_configs(model)] == ["sparse.ebc"] * 4


# --------------------------------------------------------------------------------------------
# Plans to TorchRec and back
# --------------------------------------------------------------------------------------------


def split_plan(t: Task) -> Plan:
    """t0 cut unevenly into 3 column shards (two on rank 1, not adjacent), the rest whole."""
    return Plan(t, [Shard(0, 1, 0, 24), Shard(0, 0, 24, 44), Shard(0, 1, 44, 64), Shard(1, 0, 0, 16), Shard(2, 1, 0, 16), Shard(3, 0, 0, 8)], "manual")


def test_sharding_plan_of_a_split_plan():
    t = task()
    plan = split_plan(t)
    sp = tio.to_sharding_plan(plan, module=meta_ebc(), device_type="cuda")
    assert isinstance(sp, ShardingPlan) and list(sp.plan) == [""]
    ps = sp.plan[""]
    assert ps["t1"].sharding_type == "table_wise" and ps["t1"].ranks == [0] and ps["t1"].compute_kernel == "fused"
    assert ps["t0"].sharding_type == "column_wise" and ps["t0"].ranks == [1, 0, 1]
    meta = ps["t0"].sharding_spec.shards
    assert [(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in meta] == [
        ([0, 0], [1000, 24], "rank:1/cuda:1"), ([0, 24], [1000, 20], "rank:0/cuda:0"), ([0, 44], [1000, 20], "rank:1/cuda:1")]
    back = tio.plan_from_torchrec(sp, t, "manual")
    assert back.shards == plan.shards
    # cpu placements, dense kernel, and a model path
    cpu = tio.to_sharding_plan(plan, module_path="model.ebc", device_type="cpu", compute_kernel="dense").plan["model.ebc"]
    assert str(cpu["t2"].sharding_spec.shards[0].placement) == "rank:1/cpu" and cpu["t2"].compute_kernel == "dense"


def test_placements_over_hosts_and_table_column_wise():
    t = Task(task().tables, 4, 10**7, Workload(64, "fp32"))
    plan = Plan(t, [Shard(0, 2, 0, 32), Shard(0, 3, 32, 64), Shard(1, 1, 0, 16), Shard(2, 0, 0, 16), Shard(3, 3, 0, 8)], "manual")
    s = tio.torchrec_shardings(plan, "cuda", column_type="table_column_wise", local_world_size=2)
    assert s["t0"]["sharding_type"] == "table_column_wise" and [x["placement"] for x in s["t0"]["shards"]] == ["rank:2/cuda:0", "rank:3/cuda:1"]
    across = Plan(t, [Shard(0, 1, 0, 32), Shard(0, 2, 32, 64)] + plan.shards[2:], "manual")
    with pytest.raises(tio.NotExpressibleError, match=r"^table t0: table_column_wise shards must share one host of 2 ranks"):
        tio.torchrec_shardings(across, column_type="table_column_wise", local_world_size=2)
    assert tio.torchrec_shardings(across, column_type="column_wise", local_world_size=2)["t0"]["ranks"] == [1, 2]
    with pytest.raises(OptionError, match=r"^local_world_size 3 must be a positive divisor of the plan's 4 devices$"):
        tio.torchrec_shardings(plan, local_world_size=3)
    with pytest.raises(OptionError, match=r"^device_type 'tpu' is not one of cuda, cpu$"):
        tio.torchrec_shardings(plan, device_type="tpu")


def test_row_shards_export_only_in_torchrecs_row_wise_layout():
    t = task()
    # 1000 rows on 2 ranks: TorchRec's blocks are [0, 500) on rank 0 and [500, 1000) on rank 1
    rows = Plan(t, [Shard(0, 0, 0, 64, 0, 500), Shard(0, 1, 0, 64, 500, 1000), Shard(1, 0, 0, 16), Shard(2, 1, 0, 16), Shard(3, 0, 0, 8)], "manual")
    s = tio.torchrec_shardings(rows)["t0"]
    assert s["sharding_type"] == "row_wise" and s["ranks"] == [0, 1]
    assert [(x["offsets"], x["sizes"]) for x in s["shards"]] == [([0, 0], [500, 64]), ([500, 0], [500, 64])]
    # another cut, or the blocks on other ranks, has no TorchRec form: the error names the layout
    for shards in ([Shard(0, 0, 0, 64, 0, 600), Shard(0, 1, 0, 64, 600, 1000)], [Shard(0, 1, 0, 64, 0, 500), Shard(0, 0, 0, 64, 500, 1000)]):
        other = Plan(t, shards + [Shard(1, 0, 0, 16), Shard(2, 1, 0, 16), Shard(3, 0, 0, 8)], "manual")
        with pytest.raises(tio.NotExpressibleError, match=r"^table t0: row shards \[0, \d+\) on \d, .* are not TorchRec's row-wise layout: rank r of all 2 holds rows \[r·500, \(r\+1\)·500\)"):
            tio.torchrec_shardings(other)
    # the partitioner compares row ranges too: TorchRec's table-wise t0 is not these two row shards
    with tio.quiet():
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), batch_size=32, partitioner=tio.dreamshard_partitioner(rows), debug=False,
                                           constraints={"t0": ParameterConstraints(sharding_types=["table_wise"])})
    with pytest.raises(PlannerError, match="shards are not the dreamshard plan.s"), tio.quiet():
        planner.plan(meta_ebc(), [tio.import_torchrec().EmbeddingBagCollectionSharder()])
    # pinned to the plan's own types, TorchRec's planner returns the row-wise plan, and it converts back
    with tio.quiet():
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cuda"), batch_size=32, partitioner=tio.dreamshard_partitioner(rows), debug=False,
                                           constraints=tio.constraints_for(rows))
        back = tio.plan_from_torchrec(planner.plan(meta_ebc(), [tio.import_torchrec().EmbeddingBagCollectionSharder()]), t)
    assert back.shards == rows.shards


def test_model_must_match_the_plan():
    t = task()
    plan = split_plan(t)
    other = EmbeddingBagCollection(tables=configs()[:3], device=torch.device("meta"))
    with pytest.raises(PlanError, match=r"^plan: table 't3' is not a table of the model$"):
        tio.to_sharding_plan(plan, module=other)
    bigger = [EmbeddingBagConfig(num_embeddings=2000, embedding_dim=64, name="t0", feature_names=["f0"])] + configs()[1:]
    with pytest.raises(PlanError, match=r"^plan: table 't0' is 1000 rows × dim 64, the model's is 2000 × 64$"):
        tio.to_sharding_plan(plan, module=EmbeddingBagCollection(tables=bigger, device=torch.device("meta")))


def test_torchrec_plans_back_to_ours(tmp_path):
    t = task()
    ebc = meta_ebc()
    tw = construct_module_sharding_plan(ebc, {"t0": table_wise(rank=1), "t1": table_wise(rank=0), "t2": table_wise(rank=0), "t3": table_wise(rank=1)},
                                        local_size=2, world_size=2, device_type="cpu")
    plan = tio.plan_from_torchrec(ShardingPlan({"": tw}), t)
    assert plan.is_table_wise and plan.placement == [1, 0, 0, 1]
    save_plans([plan], tmp_path / "p.json")
    assert load_plans(tmp_path / "p.json")[0].shards == plan.shards
    rw = construct_module_sharding_plan(ebc, {"t0": row_wise(), "t1": table_wise(rank=0), "t2": table_wise(rank=0), "t3": table_wise(rank=1)},
                                        local_size=2, world_size=2, device_type="cpu")
    back = tio.plan_from_torchrec(ShardingPlan({"": rw}), t)  # TorchRec's row_wise: its blocks of ceil(1000 / 2) rows, block r on rank r
    assert [(s.table, s.device, s.row_range(t.tables[0])) for s in back.shards if s.table == 0] == [(0, 0, (0, 500)), (0, 1, (500, 1000))]
    assert tio.torchrec_shardings(back)["t0"]["sharding_type"] == "row_wise"
    del tw["t3"]
    with pytest.raises(PlanError, match=r"^TorchRec plan: table 't3' of the task is not in it$"):
        tio.plan_from_torchrec(tw, t)
    far = construct_module_sharding_plan(ebc, {"t0": table_wise(rank=5), "t1": table_wise(rank=0), "t2": table_wise(rank=0), "t3": table_wise(rank=1)},
                                         local_size=8, world_size=8, device_type="cpu")
    with pytest.raises(PlanError, match=r"^TorchRec plan: table t0 on device 5, outside 0..1$"):
        tio.plan_from_torchrec(far, t)


def test_torchrec_grid_shard_and_ours():
    """TorchRec's own grid_shard of a table of dim 256 on 2 hosts of 2 ranks (column blocks of 128,
    block k table-row-wise on host k) reads back as our grid, exports to the same shards, and its
    ShardingPlan through `to_sharding_plan` (pinned by the constraints) is TorchRec's."""
    from dataclasses import replace

    from torchrec.distributed.sharding_plan import grid_shard

    from dreamshard.topology import PRESETS

    big = TableSpec("g", 1000, 256, 3.0, distribution="zipf:1.1", seed=1)
    t = Task([big], 4, 10**9, Workload(64, "fp32"), topology=replace(PRESETS["h100-sxm"], hosts=2, gpus_per_host=2))
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(num_embeddings=1000, embedding_dim=256, name="g", feature_names=["fg"])], device=torch.device("meta"))
    theirs = construct_module_sharding_plan(ebc, {"g": grid_shard(host_indexes=[0, 1])}, local_size=2, world_size=4, device_type="cuda")
    plan = tio.plan_from_torchrec(ShardingPlan({"": theirs}), t)
    assert {(s.device, s.start, s.stop, *s.row_range(big)) for s in plan.shards} == {(0, 0, 128, 0, 500), (1, 0, 128, 500, 1000), (2, 128, 256, 0, 500), (3, 128, 256, 500, 1000)}
    exported = tio.torchrec_shardings(plan, local_world_size=2)["g"]
    assert exported["sharding_type"] == "grid_shard"
    key = lambda m: (m.placement.rank(), m.shard_offsets, m.shard_sizes)  # noqa: E731
    assert sorted((x["rank"], x["offsets"], x["sizes"]) for x in exported["shards"]) == sorted(key(m) for m in theirs["g"].sharding_spec.shards)
    ours = tio.to_sharding_plan(plan, module=ebc, device_type="cuda", local_world_size=2)
    assert sorted(key(m) for m in ours.plan[""]["g"].sharding_spec.shards) == sorted(key(m) for m in theirs["g"].sharding_spec.shards)


def test_torchrec_planner_and_conversion_agree():
    """The torchrec planner's shards (from TorchRec's sharding options) are what plan_from_torchrec
    reads from the ShardingPlan TorchRec returns for the same task."""
    t = Task(task().tables, 2, 10**9, Workload(64, "fp32"))
    planner = TorchRecPlanner(sharding_types="table_wise,column_wise")
    ours = planner.plan(t)
    with tio.quiet():
        sp = planner.planner(t).plan(planner.module(t), [planner.tr["Sharder"]()])
    assert tio.plan_from_torchrec(sp, t).shards == ours.shards


# --------------------------------------------------------------------------------------------
# Planning inside TorchRec
# --------------------------------------------------------------------------------------------


def shard_layout(sp) -> dict:
    return {name: (ps.sharding_type, ps.compute_kernel, [(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in ps.sharding_spec.shards])
            for module in sp.plan.values() for name, ps in module.items()}


def test_sharding_planner_returns_the_dreamshard_plan_through_torchrec():
    with tio.quiet():
        topology = Topology(world_size=2, compute_device="cpu", ddr_cap=10**8)
    for name, split in (("size_lookup", False), ("size_lookup", True)):
        sp_planner = ShardingPlanner(topology=topology, batch_size=32, planner=get_planner(name, split=split), batches=[batch(0)[0]])
        sp = sp_planner.plan(meta_ebc())
        ours = sp_planner.last_plan
        assert ours.split_tables() == ({"t0": 2} if split else {})
        assert shard_layout(sp) == shard_layout(tio.to_sharding_plan(ours, device_type="cpu"))
        # TorchRec's planner ran: its storage estimate of every shard, on our ranks
        best = sp_planner.last_planner._best_plan
        assert sorted((so.name, s.rank) for so in best for s in so.shards) == sorted((ours.task.tables[s.table].name, s.device) for s in ours.shards)
        assert all(s.storage.ddr > 0 for so in best for s in so.shards)
        assert ours.task.workload.batch_size == 64 and ours.task.max_memory_bytes < 10**8  # global batch; memory after TorchRec's reservation


def test_sharding_planner_refusals_are_one_line():
    with tio.quiet():
        tiny = Topology(world_size=2, compute_device="cpu", ddr_cap=200_000)
    with pytest.raises(InfeasibleError) as e:
        ShardingPlanner(tiny, 32, planner="size_lookup", batches=[batch(0)[0]]).plan(meta_ebc())
    assert "\n" not in str(e.value)
    # TorchRec's storage check refuses what our byte count lets through (its estimate adds I/O buffers)
    with tio.quiet():
        snug = Topology(world_size=2, compute_device="cpu", ddr_cap=600_000)
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    with pytest.raises(InfeasibleError, match=r"^TorchRec refused the size_lookup plan: .* \(rank \d: table t\d's shard needs 0 bytes of HBM and [\d,]+ of DDR by TorchRec's estimate; 0 and [\d,]+ are left\)$"):
        ShardingPlanner(snug, 4096, storage_reservation=FixedPercentageStorageReservation(0.0), planner="size_lookup", batches=[batch(0)[0]]).plan(meta_ebc())


def test_uneven_column_shards_go_through_torchrecs_planner():
    """TorchRec's enumerator makes only equal column shards; dreamshard_enumerator gives its
    column-wise option the plan's (24, 20, 20, two on one rank), estimated by TorchRec again."""
    uneven = split_plan(task())
    with tio.quiet():
        topology = Topology(world_size=2, compute_device="cpu", ddr_cap=10**8)
        pinned = tio.constraints_for(uneven)
        assert pinned["t0"].min_partition is None and pinned["t0"].sharding_types == ["column_wise"]
        plain = EmbeddingShardingPlanner(topology=topology, batch_size=32, partitioner=tio.dreamshard_partitioner(uneven), constraints=pinned, debug=False)
        with pytest.raises(PlannerError):  # TorchRec's own equal blocks are not the plan's
            plain.plan(meta_ebc(), [tio.import_torchrec().EmbeddingBagCollectionSharder()])
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=32, enumerator=tio.dreamshard_enumerator(uneven, topology, 32, pinned),
                                           partitioner=tio.dreamshard_partitioner(uneven), constraints=pinned, debug=False)
        sp = planner.plan(meta_ebc(), [tio.import_torchrec().EmbeddingBagCollectionSharder()])
    assert shard_layout(sp) == shard_layout(tio.to_sharding_plan(uneven, device_type="cpu"))
    t0 = next(so for so in planner._best_plan if so.name == "t0")
    assert [s.size[1] for s in t0.shards] == [24, 20, 20] and all(s.storage.ddr > 0 and s.perf.total > 0 for s in t0.shards)


def test_partitioner_refuses_proposals_that_are_not_the_plan():
    """Unconstrained, TorchRec proposes every sharding type; the partitioner keeps only the plan's."""
    t = task()
    ours = get_planner("size_lookup").plan(t)
    with tio.quiet():
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), batch_size=32, partitioner=tio.dreamshard_partitioner(ours), debug=False)
        sp = planner.plan(meta_ebc(), [tio.import_torchrec().EmbeddingBagCollectionSharder()])
    assert tio.plan_from_torchrec(sp, t).shards == ours.shards
    assert planner._num_proposals > planner._num_plans  # others were proposed and refused


# --------------------------------------------------------------------------------------------
# export torchrec
# --------------------------------------------------------------------------------------------


def test_export_group_prints_and_writes(tmp_path):
    plan = split_plan(task())
    save_plans([plan], tmp_path / "p.json")
    r = CliRunner().invoke(tio.export, ["torchrec", str(tmp_path / "p.json"), "--device-type", "cpu"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc == tio.export_json(plan, device_type="cpu") and doc["format"] == tio.FORMAT and doc["world_size"] == 2
    assert doc["tables"]["t0"]["sharding_type"] == "column_wise" and [x["offsets"] for x in doc["tables"]["t0"]["shards"]] == [[0, 0], [0, 24], [0, 44]]
    r = CliRunner().invoke(tio.export, ["torchrec", str(tmp_path / "p.json"), "--out", str(tmp_path / "tr.json")])
    assert r.exit_code == 0 and json.loads((tmp_path / "tr.json").read_text())["tables"]["t1"]["shards"][0]["placement"] == "rank:0/cuda:0"
    r = CliRunner().invoke(tio.export, ["torchrec", str(tmp_path / "missing.json")])
    assert isinstance(r.exception, PlanError) and str(r.exception).endswith("missing.json: no such file")


def test_export_through_the_cli(tmp_path):
    """Through `dreamshard` itself (cli.py registers the group): output, and bad input as one line, exit 2."""
    plan = split_plan(task())
    save_plans([plan], tmp_path / "p.json")
    dreamshard = [sys.executable, "-m", "dreamshard.cli", "export", "torchrec"]
    r = subprocess.run(dreamshard + [str(tmp_path / "p.json"), "--column-type", "table_column_wise"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == tio.export_json(plan, column_type="table_column_wise")
    (tmp_path / "bad.json").write_text('{"format": "dreamshard.plan/2", "devices": 2}')
    r = subprocess.run(dreamshard + [str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "missing key 'max_memory_bytes'" in r.stderr
    r = subprocess.run(dreamshard + [str(tmp_path / "p.json"), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is a folder" in r.stderr


def test_import_does_not_import_torchrec():
    code = "import sys, dreamshard.torchrec_io, dreamshard.planners; print('torchrec' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


# --------------------------------------------------------------------------------------------
# End to end: DistributedModelParallel on CPU, gloo, 2 processes
# --------------------------------------------------------------------------------------------

WORLD, GLOBAL_B, STEPS, LR = 2, 64, 4, 0.3


class DLRM(torch.nn.Module):
    """Embedding bags pooled per feature, beside a dense projection, into a small MLP: one logit."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=configs(), device=device)
        self.dense = torch.nn.Linear(DENSE, 8)
        self.top = torch.nn.Sequential(torch.nn.Linear(8 + sum(d for _, d, _ in SHAPES), 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, kjt, dense):
        pooled = self.ebc(kjt).to_dict()  # by feature: a sharded collection may order its output by sharding type
        return self.top(torch.cat([self.dense(dense)] + [pooled[f] for f in FEATURES], dim=1)).squeeze(1)


def reference(init: dict) -> tuple[list[float], dict]:
    """The unsharded model from the same weights on the global batches: losses and final weights."""
    model = DLRM(torch.device("cpu"))
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        kjt, dense, labels = batch(step, 0, GLOBAL_B, GLOBAL_B)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(kjt, dense), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _worker(rank: int, port: int, plan_file: str, init_file: str, out_dir: str, sharding_types: dict | None = None) -> None:
    """One rank: shards the DLRM with DMP — from the plan file's ShardingPlan, or with
    `sharding_types` (table → its ParameterConstraints sharding_types) from the drop-in
    ShardingPlanner's collective plan — and trains it, writing what it held and its losses."""
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    plan = load_plans(plan_file)[0]
    model = DLRM(torch.device("meta"))  # the tables are materialised by DMP, shard by shard
    # The fused kernel applies the optimizer inside FBGEMM's backward, with the same lr as the
    # reference: TorchRec's backward all-to-all divides the gradients it gathers from the ranks by
    # the world size (comm_ops' gradient division, on by default), as DDP averages the dense ones,
    # so both are gradients of the global mean loss. (With lr / WORLD every table moves half as
    # far: the trained-weights check below fails, the losses alone barely show it.)
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": LR})
    sharding_plan = tio.to_sharding_plan(plan, module=model, device_type="cpu")
    with tio.quiet():
        # the drop-in's way to the same plan: planned on rank 0 inside TorchRec's planner, broadcast
        constraints = {name: ParameterConstraints(sharding_types=kinds) for name, kinds in (sharding_types or {}).items()}
        planner = ShardingPlanner(topology=Topology(world_size=WORLD, compute_device="cpu"), batch_size=GLOBAL_B // WORLD, constraints=constraints,
                                      planner=get_planner("size_lookup", split=True), batches=[batch(s)[0] for s in range(4)])
        collective = planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.group.WORLD)
        if sharding_types:
            sharding_plan = collective
        dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
                                       plan=sharding_plan, sharders=[EmbeddingBagCollectionSharder()])
    init = torch.load(init_file)
    held = {}
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            name = key.removeprefix("module.")
            if hasattr(value, "local_shards"):  # a table: write the reference's slice into each local shard
                held[name] = []
                for shard in value.local_shards():
                    (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(init[name][r0 : r0 + nr, c0 : c0 + nc])
                    held[name].append(((r0, c0), (nr, nc), tuple(shard.tensor.shape)))
        dense = {k.removeprefix("module."): v for k, v in dmp.named_parameters() if "ebc" not in k}
        for name, p in dense.items():
            p.copy_(init[name])
    opt = torch.optim.SGD(dense.values(), lr=LR)
    b = GLOBAL_B // WORLD
    losses = []
    for step in range(STEPS):
        kjt, x, labels = batch(step, rank * b, (rank + 1) * b, GLOBAL_B)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(kjt, x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / WORLD)
    final = {}
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            final[key.removeprefix("module.")] = [(tuple(s.metadata.shard_offsets), s.tensor.detach().clone()) for s in value.local_shards()]
    torch.save({"held": held, "losses": losses, "final": final, "collective": shard_layout(collective), "given": shard_layout(sharding_plan)}, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dmp(tmp_path: Path, plan: Plan, sharding_types: dict | None = None) -> list[dict]:
    """Each rank's record (`_worker`) of DMP training the DLRM from the same initial weights."""
    import torch.multiprocessing as mp

    save_plans([plan], tmp_path / "plan.json")
    torch.manual_seed(0)
    init = DLRM(torch.device("cpu")).state_dict()
    torch.save(init, tmp_path / "init.pt")
    mp.start_processes(_worker, args=(free_port(), str(tmp_path / "plan.json"), str(tmp_path / "init.pt"), str(tmp_path), sharding_types), nprocs=WORLD,
                       start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def trains_like_the_unsharded_model(results: list[dict], init: dict) -> None:
    """The same losses as the unsharded model, step by step, and the same trained tables."""
    ref_losses, ref_final = reference(init)
    for res in results:
        assert res["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert all(math.isfinite(x) for x in ref_losses)
    assert all(not torch.equal(ref_final[k], init[k]) for k in init)  # every table and layer was trained: matching is not trivial
    for res in results:
        for name, shards in res["final"].items():
            for (r0, c0), tensor in shards:
                want = ref_final[name][r0 : r0 + tensor.shape[0], c0 : c0 + tensor.shape[1]]
                torch.testing.assert_close(tensor, want, rtol=1e-5, atol=1e-6)


def held_by_rank(layout: dict, rank: int) -> dict:
    """What a rank holds of a ShardingPlan's layout (`shard_layout`): per table weight, its shards' (offsets, sizes, shape)."""
    out: dict = {}
    for name, (_, _, shards) in layout.items():
        for offsets, sizes, where in shards:
            if where.startswith(f"rank:{rank}/") and sizes[0] > 0:
                out.setdefault(f"ebc.embedding_bags.{name}.weight", []).append((tuple(offsets), tuple(sizes), tuple(sizes)))
    return {k: sorted(v) for k, v in out.items()}


def initial_weights() -> dict:
    torch.manual_seed(0)
    return DLRM(torch.device("cpu")).state_dict()


def test_dmp_trains_a_dreamshard_plan_like_the_unsharded_model(tmp_path):
    t = tio.task_from_torchrec(meta_ebc(), WORLD, 10**7, batch_size=GLOBAL_B, batches=[batch(s)[0] for s in range(4)])
    plan = get_planner("size_lookup", split=True).plan(t)
    assert plan.split_tables() == {"t0": 2}, plan.shards  # the premise: a column-split table
    results = run_dmp(tmp_path, plan)
    # each rank got the plan from ShardingPlanner.collective_plan too, and holds exactly its shards, at their offsets and sizes
    for rank, res in enumerate(results):
        assert res["collective"] == res["given"] and res["given"]["t0"][0] == "column_wise"
        expected = {}
        for s in plan.shards:
            if s.device == rank:
                tb = plan.task.tables[s.table]
                expected.setdefault(f"ebc.embedding_bags.{tb.name}.weight", []).append(((0, s.start), (tb.rows, s.width), (tb.rows, s.width)))
        got = {k: sorted((tuple(o), tuple(z), sh) for o, z, sh in v) for k, v in res["held"].items() if v}
        assert got == {k: sorted(v) for k, v in expected.items()}
    trains_like_the_unsharded_model(results, initial_weights())


def test_dmp_trains_the_drop_in_plan_under_constraints(tmp_path):
    """ShardingPlanner.collective_plan with a sharding type constrained per table — column_wise,
    table_column_wise, table_wise, and column_wise on a table the planner keeps whole (one
    shard) — is the plan DMP shards by, and it trains as the unsharded model does. (TorchRec's
    CPU sharder has no row-wise types: those are checked on a cuda topology, without DMP.)"""
    kinds = {"t0": ["column_wise"], "t1": ["table_column_wise"], "t2": ["table_wise"], "t3": ["column_wise"]}
    t = tio.task_from_torchrec(meta_ebc(), WORLD, 10**7, batch_size=GLOBAL_B, batches=[batch(s)[0] for s in range(4)])
    results = run_dmp(tmp_path, get_planner("size_lookup").plan(t), kinds)
    layout = results[0]["collective"]
    assert {name: kind for name, (kind, _, _) in layout.items()} == {"t0": "column_wise", "t1": "table_column_wise", "t2": "table_wise", "t3": "column_wise"}
    assert len(layout["t0"][2]) == 2 and len(layout["t3"][2]) == 1  # t0 cut by the planner, t3 one column shard
    for rank, res in enumerate(results):
        assert res["collective"] == layout  # broadcast from rank 0
        got = {k: sorted((tuple(o), tuple(z), sh) for o, z, sh in v) for k, v in res["held"].items() if v}
        assert got == held_by_rank(layout, rank)
    trains_like_the_unsharded_model(results, initial_weights())


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_example_runs():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "torchrec_dlrm.py")], capture_output=True, text=True, timeout=1800, cwd=ROOT)  # a hang guard only: a busy machine may take minutes
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "column_wise" in out and "table_wise" in out  # the plan in TorchRec's terms, a split table among them
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) >= 3 and all(math.isfinite(x) for x in losses)
