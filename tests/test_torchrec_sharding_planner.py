"""`ShardingPlanner`, the drop-in for TorchRec's EmbeddingShardingPlanner: TorchRec's Topology
(world and local sizes, HBM or DDR), its per-rank batch size, its ParameterConstraints honoured
(sharding types, compute kernels, min_partition, pooling factors, num_poolings, batch sizes,
feature names) or refused in one line naming the constraint, TorchRec's `stats` reporters beside
our own `table_stats`, and the ShardingPlan TorchRec's planner returns for the plan."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrec", reason="TorchRec 1.8 is not importable here (the drop-in needs it)")

import torch  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation  # noqa: E402
from torchrec.distributed.planner.types import Stats  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402

from dreamshard import torchrec_io as tio  # noqa: E402
from dreamshard.sharding_planner import ShardingPlanner  # noqa: E402
from dreamshard.packing import InfeasibleError  # noqa: E402
from dreamshard.planners import get_planner  # noqa: E402
from dreamshard.validation import InputError, OptionError  # noqa: E402

# (rows, dim, lookups per sample): t0 dominates lookups × dim, so a splitting planner cuts it
SHAPES = [(100_000, 64, 20.0), (50_000, 32, 4.0), (20_000, 16, 2.0), (1_000, 16, 1.0)]
ALL = ("table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise")


def ebc():
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=r, embedding_dim=d, feature_names=[f"f{i}"]) for i, (r, d, _) in enumerate(SHAPES)])


def topology(world=4, local=None, device="cuda", cap=2**30):
    with tio.quiet():  # TorchRec warns about every Topology built directly
        return Topology(world_size=world, local_world_size=local, compute_device=device, hbm_cap=cap, ddr_cap=cap)


def constraints(**fields):
    """Every table's lookups per sample, and `fields` on every table."""
    return {f"t{i}": ParameterConstraints(pooling_factors=[pf], **fields) for i, (_, _, pf) in enumerate(SHAPES)}


def layout(sp) -> dict:
    """Per table: its sharding type and [(row offset, column offset, rows, columns, rank)]."""
    return {name: (ps.sharding_type, [(*m.shard_offsets, *m.shard_sizes, m.placement.rank()) for m in ps.sharding_spec.shards])
            for module in sp.plan.values() for name, ps in module.items()}


def plan(cons=None, topo=None, batch_size=64, **kwargs):
    kwargs.setdefault("planner", get_planner("size_lookup", split=True))
    kwargs.setdefault("distribution", "zipf:1.05")
    planner = ShardingPlanner(topo or topology(), batch_size, constraints=cons if cons is not None else constraints(), **kwargs)
    return planner, planner.plan(ebc(), [EmbeddingBagCollectionSharder()])


def test_table_wise_on_every_table_keeps_every_table_whole():
    """The issue's case: unconstrained, size_lookup --split cuts t0 into column shards; with
    sharding_types=["table_wise"] on every table, every table is whole, through TorchRec's planner."""
    free, sp = plan()
    assert free.last_plan.split_tables(), "premise: the splitting planner cuts a table when free to"
    assert layout(sp)["t0"][0] == "column_wise"
    for name in ("size_lookup", "dreamshard"):
        planner, sp = plan(constraints(sharding_types=["table_wise"]), planner=get_planner(name, split=True))
        assert planner.last_plan.is_table_wise
        assert {kind for kind, _ in layout(sp).values()} == {"table_wise"}
        assert all(len(shards) == 1 for _, shards in layout(sp).values())


@pytest.mark.parametrize("kind", ALL)
def test_each_sharding_type_is_honoured(kind):
    """Every table limited to one sharding type gets it, in TorchRec's layout, on 4 ranks of 2 hosts."""
    topo = topology(world=4, local=2)
    planner, sp = plan(constraints(sharding_types=[kind]), topo)
    got = layout(sp)
    assert {k for k, _ in got.values()} == {kind}
    for i, (rows, dim, _) in enumerate(SHAPES):
        shards = got[f"t{i}"][1]
        ranks = [s[4] for s in shards]
        if kind == "table_wise":
            assert shards == [(0, 0, rows, dim, ranks[0])]
        elif kind in tio.COLUMN_TYPES:  # full-row shards tiling the columns in order
            assert [s[0] for s in shards] == [0] * len(shards) and [s[2] for s in shards] == [rows] * len(shards)
            assert [s[1] for s in shards] == [sum(x[3] for x in shards[:k]) for k in range(len(shards))] and sum(s[3] for s in shards) == dim
        else:  # TorchRec's row layout: ceil(rows / ranks) a block, rank r of the group holds block r
            group = list(range(4)) if kind == "row_wise" else list(range(ranks[0] // 2 * 2, ranks[0] // 2 * 2 + 2))
            assert ranks == group and [(s[0], s[2]) for s in shards] == [(a, b - a) for a, b in tio.row_wise_cuts(rows, len(group))]
        if kind.startswith("table_") and kind != "table_wise":
            assert len({r // 2 for r in ranks}) == 1  # one host
    # TorchRec's plan is the dreamshard plan
    assert tio.plan_from_torchrec(sp, planner.last_plan.task).shards == planner.last_plan.shards


def test_mixed_constraints_and_min_partition():
    """Per-table types side by side; min_partition keeps column shards at least that wide."""
    cons = constraints()
    cons["t0"] = ParameterConstraints(pooling_factors=[20.0], sharding_types=["column_wise"], min_partition=32)
    cons["t1"] = ParameterConstraints(pooling_factors=[4.0], sharding_types=["row_wise"])
    cons["t2"] = ParameterConstraints(pooling_factors=[2.0], sharding_types=["table_wise", "column_wise"])
    free, _ = plan()
    assert min(s.width for s in free.last_plan.shards if s.table == 0) < 32, "premise: without min_partition t0's shards are narrower"
    planner, sp = plan(cons)
    got = layout(sp)
    assert got["t0"][0] == "column_wise" and min(s[3] for s in got["t0"][1]) >= 32
    assert got["t1"][0] == "row_wise" and [s[4] for s in got["t1"][1]] == [0, 1, 2, 3]
    assert got["t2"][0] in ("table_wise", "column_wise") and got["t3"][0] in ("table_wise", "column_wise", "row_wise", "table_row_wise")


def test_tables_placed_around_row_layouts_go_to_the_ranks_they_load_least():
    """The table-wise placement after a row layout is pinned sees empty ranks: its busiest devices
    become the ranks the row blocks leave free (here the other host's)."""
    cons = constraints(sharding_types=["table_wise"])
    cons["t0"] = ParameterConstraints(pooling_factors=[20.0], sharding_types=["table_row_wise"])
    planner, sp = plan(cons, topology(world=8, local=4))
    got = layout(sp)
    host = {s[4] // 4 for s in got["t0"][1]}
    assert got["t0"][0] == "table_row_wise" and len(host) == 1
    assert all(shards[0][4] // 4 not in host for name, (_, shards) in got.items() if name != "t0")


def test_a_table_too_large_for_a_rank_is_split_as_allowed():
    """t0 does not fit a rank whole: allowed row_wise it is split by rows, allowed only
    column_wise into the fewest column shards that fit; allowed only table_wise it is an error."""
    size = 100_000 * 64 * 4  # fp32, sgd: the weights
    cap = int(size * 0.7 / 0.85)  # after TorchRec's 15% reservation, 70% of t0 a rank
    for kind, expect in (("row_wise", "row_wise"), ("column_wise", "column_wise")):
        cons = constraints()
        cons["t0"] = ParameterConstraints(pooling_factors=[20.0], sharding_types=[kind])
        planner, sp = plan(cons, topology(cap=cap), planner=get_planner("size_lookup"))
        assert layout(sp)["t0"][0] == expect and len(layout(sp)["t0"][1]) > 1
    cons["t0"] = ParameterConstraints(pooling_factors=[20.0], sharding_types=["table_wise"])
    with pytest.raises(tio.ConstraintError) as e:
        plan(cons, topology(cap=cap), planner=get_planner("size_lookup"))
    msg = str(e.value)
    assert msg.startswith("table 't0': ParameterConstraints(sharding_types=['table_wise']): the table needs 25,600,000 bytes, more than the ") and \
        msg.endswith("a rank has left after TorchRec's storage reservation, and no split allowed fits; allow row_wise or column_wise")
    assert "\n" not in msg and "enumerat" not in msg


@pytest.mark.parametrize("fields, message", [
    ({"sharding_types": ["data_parallel"]}, r"^table 't0': ParameterConstraints\(sharding_types=\['data_parallel'\]\) allows none of the sharding types dreamshard plans \(table_wise, "),
    ({"sharding_types": ["diagonal"]}, r"^table 't0': ParameterConstraints\(sharding_types=\['diagonal'\]\): 'diagonal' is not a TorchRec sharding type"),
    ({"compute_kernels": ["dense"]}, r"^table 't0': ParameterConstraints\(compute_kernels=\['dense'\]\) leaves out 'fused', the kernel of the plan \(dreamshard plans tables in HBM"),
    ({"compute_kernels": ["fused_uvm_caching"]}, r"^table 't0': ParameterConstraints\(compute_kernels=\['fused_uvm_caching'\]\) leaves out 'fused'"),
    ({"num_poolings": [1.0, 1.0]}, r"^table 't0': ParameterConstraints\(pooling_factors=\[20.0\], num_poolings=\[1.0, 1.0\]\) differ in length; TorchRec takes one entry per feature$"),
    ({"feature_names": ["g0"]}, r"^table 't0': ParameterConstraints\(feature_names=\['g0'\]\): 'g0' is not a feature of the table \(its features: f0\)$"),
    ({"device_group": "cpu"}, r"^table 't0': ParameterConstraints\(device_group='cpu'\): dreamshard plans every table on the topology's cuda ranks$"),
])
def test_constraints_it_cannot_honour_are_one_line_errors_naming_them(fields, message):
    cons = constraints()
    cons["t0"] = ParameterConstraints(pooling_factors=[20.0], **fields)
    with pytest.raises(tio.ConstraintError, match=message) as e:
        plan(cons)
    assert "\n" not in str(e.value) and isinstance(e.value, InputError)  # the CLI's one line, exit status 2


def test_types_the_sharders_do_not_offer_on_the_device():
    """TorchRec's CPU sharder has no row-wise types: a cpu topology leaves them out of every
    table's choices, and a constraint allowing only them is refused naming it."""
    # dreamshard without its beam, whose search splits t0 by rows here (the beam prefers columns)
    _, sp = plan(topo=topology(world=4, device="cuda"), planner=get_planner("dreamshard", beam_depth=0))
    assert layout(sp)["t0"][0] == "row_wise", "premise: on cuda the dreamshard planner splits t0 by rows"
    _, sp = plan(topo=topology(world=4, device="cpu"), planner=get_planner("dreamshard", beam_depth=0))
    assert {kind for kind, _ in layout(sp).values()} <= {"table_wise", "column_wise"}
    cons = constraints()
    cons["t0"] = ParameterConstraints(pooling_factors=[20.0], sharding_types=["row_wise", "table_row_wise"])
    with pytest.raises(tio.ConstraintError, match=r"^table 't0': ParameterConstraints\(sharding_types=\['row_wise', 'table_row_wise'\]\): TorchRec's sharders offer none "
                                                   r"of these with the fused kernel on cpu \(they offer table_wise, column_wise, table_column_wise\)$"):
        plan(cons, topology(world=4, device="cpu"))


def test_fused_among_kernels_and_unknown_tables():
    cons = constraints(compute_kernels=["fused", "fused_uvm_caching"])
    _, sp = plan(cons)
    assert {ps.compute_kernel for m in sp.plan.values() for ps in m.values()} == {"fused"}
    cons = constraints()
    cons["nope"] = ParameterConstraints(sharding_types=["table_wise"])
    with pytest.raises(tio.ConstraintError, match=r"^constraints: 'nope' is not a table of the model \(its tables: t0, t1, t2, t3\)$"):
        plan(cons)


def test_pooling_factors_num_poolings_and_batch_sizes_are_lookups_per_sample():
    """TorchRec counts a table's inputs as the sum over its features of pooling factor × num
    poolings × that feature's batch size: per sample of the per-rank batch, that is the table's
    pooling factor here."""
    two = EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name="a", num_embeddings=1000, embedding_dim=16, feature_names=["x", "y"]),
        EmbeddingBagConfig(name="b", num_embeddings=1000, embedding_dim=16, feature_names=["z"])])
    cons = {"a": ParameterConstraints(pooling_factors=[2.0, 3.0], num_poolings=[1.0, 2.0], batch_sizes=[64, 32], feature_names=["x", "y"]),
            "b": ParameterConstraints(pooling_factors=[5.0])}
    planner = ShardingPlanner(topology(world=2), 32, constraints=cons, planner="size_lookup", distribution="uniform")
    planner.plan(two)
    assert [t.pooling_factor for t in planner.last_plan.task.tables] == [2.0 * 1 * 2 + 3.0 * 2 * 1, 5.0]
    # measured statistics come first: table_stats over the constraints' pooling factors
    planner = ShardingPlanner(topology(world=2), 32, constraints=cons, planner="size_lookup", distribution="uniform",
                                  table_stats={"a": {"pooling_factor": 7.0, "distribution": "uniform"}})
    planner.plan(two)
    assert [t.pooling_factor for t in planner.last_plan.task.tables] == [7.0, 5.0]


def test_topology_world_local_sizes_and_memory():
    """World size → ranks; each rank's memory is its HBM left by TorchRec's reservation (DDR on
    a cpu topology); placements name the rank's device within its host of local_world_size."""
    cap = 200 * 2**20
    topo = topology(world=4, local=2, cap=cap)
    planner, sp = plan(topo=topo)
    task = planner.last_plan.task
    with tio.quiet():
        left = HeuristicalStorageReservation(0.15).reserve(topology=topo, batch_size=64, module=ebc(), sharders=[EmbeddingBagCollectionSharder()],
                                                             constraints=constraints())  # its input buffers follow the pooling factors
    assert task.devices == 4 and task.max_memory_bytes == min(d.storage.hbm for d in left.devices) < cap
    placements = {str(m.placement) for module in sp.plan.values() for ps in module.values() for m in ps.sharding_spec.shards}
    assert placements and all(p == f"rank:{p.split('/')[0][5:]}/cuda:{int(p.split('/')[0][5:]) % 2}" for p in placements)
    assert planner.last_planner._topology is topo  # its bandwidths price TorchRec's own estimates and stats
    assert (task.topology.hosts, task.topology.gpus_per_host) == (2, 2)  # several hosts: dreamshard plans on them too (docs/topology.md)
    cpu = topology(world=2, device="cpu", cap=100 * 2**20)
    planner, sp = plan(topo=cpu)
    assert planner.last_plan.task.max_memory_bytes < 100 * 2**20 and all("/cpu" in str(m.placement) for m in sp.plan[""]["t0"].sharding_spec.shards)


def test_batch_size_is_per_rank():
    """TorchRec's batch_size is each rank's; dreamshard plans the global batch, world × that."""
    planner, _ = plan(topo=topology(world=4), batch_size=16)
    assert planner.last_plan.task.workload.batch_size == 64 and planner.last_planner._batch_size == 16
    planner, _ = plan(topo=topology(world=2), batch_size=None)  # TorchRec's default: 512 a rank
    assert planner.last_plan.task.workload.batch_size == 1024
    with pytest.raises(OptionError, match=r"^ShardingPlanner: batch_size 0 must be a positive integer \(TorchRec's per-rank batch\)$"):
        ShardingPlanner(topology(), 0)


def test_stats_are_torchrecs_reporters_and_table_stats_ours():
    calls = []

    class Recorder(Stats):
        def log(self, sharding_plan, topology, batch_size, storage_reservation, num_proposals, num_plans, run_time, best_plan, *args, **kwargs):
            calls.append((batch_size, sorted(so.name for so in best_plan)))

    plan(stats=Recorder())
    plan(stats=[Recorder(), Recorder()])
    assert calls == [(64, ["t0", "t1", "t2", "t3"])] * 3
    ours = {f"t{i}": {"pooling_factor": pf, "distribution": "zipf:1.1"} for i, (_, _, pf) in enumerate(SHAPES)}
    for wrong in (ours, "tables.csv"):
        with pytest.raises(OptionError, match=r"^ShardingPlanner: stats takes TorchRec Stats reporters, as EmbeddingShardingPlanner does, not a (dict|str); per-table statistics go in table_stats=$"):
            ShardingPlanner(topology(), 64, stats=wrong)
    planner = ShardingPlanner(topology(), 64, planner="size_lookup", table_stats=ours)
    planner.plan(ebc())
    assert [t.distribution for t in planner.last_plan.task.tables] == ["zipf:1.1"] * 4


def test_arguments_of_torchrecs_search_and_misplaced_planners_are_refused():
    for name in ("enumerator", "proposer", "partitioner", "plan_loader"):
        with pytest.raises(OptionError, match=rf"^ShardingPlanner: {name} is part of TorchRec's search, which the dreamshard planner replaces"):
            ShardingPlanner(topology(), 64, **{name: object()})
    for first in ("size_lookup", get_planner("size_lookup")):
        with pytest.raises(OptionError, match=r"^ShardingPlanner: topology must be a TorchRec Topology, not \w+; the dreamshard planner goes in planner=$"):
            ShardingPlanner(first)
    with pytest.raises(OptionError, match=r"^ShardingPlanner: planner must be a dreamshard planner name or object"):
        ShardingPlanner(topology(), planner=3)
    with pytest.raises(OptionError, match=r"^unknown planner 'nope'"):
        ShardingPlanner(topology(), planner="nope")
    with pytest.raises(OptionError, match=r"^ShardingPlanner: no topology given and no process group to take one from"):
        ShardingPlanner()


def test_refusals_by_memory_name_the_constraints():
    """Too little memory for every table whole: the planner's error, with the constraints that kept them whole."""
    with pytest.raises(InfeasibleError) as e:  # one rank: t0 fits it, all four tables (33.3 MB) do not
        plan(constraints(sharding_types=["table_wise"]), topology(world=1, cap=int(30e6 / 0.85)), planner=get_planner("size_lookup"))
    assert "within the constraints' sharding_types ('t0': ['table_wise']" in str(e.value) and "\n" not in str(e.value)
