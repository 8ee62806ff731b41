"""Topologies (hosts × GPUs per host and their links): the noun and its files, tasks and plans that
carry it, the two-level pricing of the collectives (one host priced exactly as without a
topology), table-row-wise shards, the planners on several hosts, and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from cli_helpers import invoke, one_line_error
from dreamshard.costs.comm import CommModel, alltoall_ms, chunks_traffic, collective_ms, default_model_path
from dreamshard.costs.hardware import gpu_slug
from dreamshard.costs.hierarchy import alltoall_topo_ms, rowwise_topo_ms, topology_comm_ms
from dreamshard.costs.runners.sequential import modelled_comm
from dreamshard.costs.sim import SimBackend
from dreamshard.families import synth_family
from dreamshard.plan import Plan, Shard, load_plans, save_plans
from dreamshard.tables import NUM_BINS, TableSpec
from dreamshard.tasks import Task, Workload, load_tasks, save_tasks
from dreamshard.topology import PRESETS, Topology, from_torchrec, load_topology, one_host, parse_topology
from dreamshard.torchrec_io import row_wise_cuts, torchrec_shardings
from dreamshard.validation import InputError, OptionError, PlanError, TaskError

BINS = tuple([1.0 / NUM_BINS] * NUM_BINS)
H100 = PRESETS["h100-sxm"]


def table(name, rows=100_000, dim=64, pf=10.0):
    return TableSpec(name, rows, dim, pf, BINS)


@pytest.fixture(scope="module")
def tables():
    return synth_family("dlrm", 48, 3)


@pytest.fixture(scope="module")
def sim():
    return SimBackend()


# -- the noun -------------------------------------------------------------------------------


def test_presets_are_the_datasheets():
    for name in ("h100-sxm", "h200-sxm"):
        t = PRESETS[name].validate()
        assert (t.gpus_per_host, t.intra_host_GBps, t.inter_host_GBps) == (8, 450.0, 50.0)  # NVLink 4 per direction; 400 Gb/s per GPU
    assert PRESETS["h100-sxm"].hbm_bytes == 80 * 10**9 and PRESETS["h200-sxm"].hbm_bytes == 141 * 10**9
    t = parse_topology("h200-sxm:16")
    assert (t.hosts, t.devices, t.multi_host) == (16, 128, True)
    assert parse_topology("h100-sxm", hosts=4).devices == 32
    assert [t.host_of(d) for d in (0, 7, 8, 127)] == [0, 0, 1, 15] and list(t.host_devices(1)) == list(range(8, 16))
    assert one_host(8) == Topology(1, 8, name="one host") and not one_host(8).multi_host


@pytest.mark.parametrize("d, needle", [
    ({"gpus_per_host": 8}, "missing key 'hosts'"),
    ({"hosts": 0, "gpus_per_host": 8}, "key 'hosts': 0 must be >= 1"),
    ({"hosts": 2, "gpus_per_host": 8, "inter_host_GBps": 0}, "key 'inter_host_GBps': must be > 0"),
    ({"hosts": 2, "gpus_per_host": 8, "inter_host_GBps": "50"}, "is a string, not a number"),
    ({"hosts": 2, "gpus_per_host": 8, "inter_host_GBs": 50}, "unknown key 'inter_host_GBs'"),
    ({"hosts": 200, "gpus_per_host": 8}, "1,600 devices, over the limit of 1,024"),
    ([2, 8], "expected a topology (a JSON object)"),
])
def test_bad_topology_is_one_line(d, needle):
    with pytest.raises(TaskError) as e:
        Topology.from_json(d, "t.json")
    assert needle in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("t.json")


def test_topology_files(tmp_path):
    t = replace(H100, hosts=3, name="mine")
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(t.to_json()))
    assert load_topology(path) == t == parse_topology(str(path))
    assert parse_topology(str(path), hosts=5).hosts == 5
    (tmp_path / "bad.json").write_text('{"hosts": 2,')
    with pytest.raises(OptionError, match="invalid JSON"):
        load_topology(tmp_path / "bad.json")
    with pytest.raises(OptionError, match="neither a preset"):
        parse_topology("h900-sxm")
    y = tmp_path / "topo.yaml"
    y.write_text("hosts: 2\ngpus_per_host: 4\ninter_host_GBps: 25\n")
    try:
        import yaml  # noqa: F401
    except ImportError:
        with pytest.raises(OptionError, match="needs PyYAML"):
            load_topology(y)
    else:
        assert load_topology(y) == Topology(2, 4, inter_host_GBps=25.0)


def test_torchrec_topology_round_trip():
    pytest.importorskip("torchrec")
    t = replace(H100, hosts=4)
    tr = t.to_torchrec()
    assert (tr.world_size, tr.local_world_size, tr.devices[0].storage.hbm) == (32, 8, 80 * 10**9)
    back = from_torchrec(tr)
    assert (back.hosts, back.gpus_per_host, back.hbm_bytes) == (4, 8, 80 * 10**9)
    assert back.intra_host_GBps == pytest.approx(450.0) and back.inter_host_GBps == pytest.approx(50.0)
    with pytest.raises(InputError, match="not a TorchRec Topology"):
        from_torchrec(object())


# -- tasks and plans carry it ------------------------------------------------------------------


def test_tasks_carry_topology_and_old_files_load_as_one_host(tmp_path, tables):
    topo = replace(H100, hosts=2)
    tasks = [Task(tables[:10], 16, 10**10, topology=topo).validate(), Task(tables[:10], 4, 10**10)]
    path = tmp_path / "tasks.jsonl"
    save_tasks(tasks, path)
    back = load_tasks(path, tables)
    assert back[0].topology == topo and back[1].topology is None
    assert back[1].machine == one_host(4)
    line = json.loads(path.read_text().splitlines()[0])
    line["devices"] = 8
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(TaskError, match=r"line 1, key 'topology': 2 hosts × 8 GPUs is 16 devices, but the task has 8"):
        load_tasks(path, tables)


def test_plans_carry_topology(tmp_path, tables):
    topo = replace(H100, hosts=2)
    task = Task(tables[:16], 16, 10**10, topology=topo)
    plan = Plan.table_wise(task, list(range(16)), "hand")
    save_plans([plan], tmp_path / "p.json")
    assert load_plans(tmp_path / "p.json")[0].task.topology == topo
    plain = Plan.table_wise(replace(task, topology=None), list(range(16)), "hand")
    save_plans([plain], tmp_path / "q.json")
    d = json.loads((tmp_path / "q.json").read_text())
    assert "topology" not in d and load_plans(tmp_path / "q.json")[0].task.topology is None
    d["topology"] = {"hosts": 2, "gpus_per_host": 8, "intra_host_latency_us": -1}
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match="key 'topology', key 'intra_host_latency_us'"):
        load_plans(tmp_path / "r.json")


# -- pricing -----------------------------------------------------------------------------------


def test_one_host_topology_prices_exactly_as_without(sim, tables):
    rng = np.random.default_rng(0)
    for D in (2, 4, 8, 16):
        placements = rng.integers(0, D, size=(6, len(tables)))
        base = sim.costs_batch(tables, placements, D, Workload())
        assert np.array_equal(base, sim.costs_batch(tables, placements, D, Workload(), topology=one_host(D)))
        assert np.array_equal(base, sim.costs_batch(tables, placements, D, Workload(), topology=replace(H100, gpus_per_host=D)))


def test_one_host_topology_with_row_shards_prices_exactly_as_without(sim):
    task = Task([table("big", 400_000, 128, 40.0), table("a"), table("b", dim=32)], 4, 10**10)
    cuts = row_wise_cuts(400_000, 4)
    plan = Plan(task, [Shard(0, d, 0, 128, a, b) for d, (a, b) in enumerate(cuts)] + [Shard(1, 0, 0, 64), Shard(2, 3, 0, 32)], "hand")
    shards = plan.device_tables()
    a = sim.evaluate(shards, task.workload)
    b = sim.evaluate(shards, task.workload, topology=one_host(4))
    assert [x.total_ms for x in a.devices] == [x.total_ms for x in b.devices]
    model = CommModel.load(default_model_path("cuda", 4, "h100"))
    assert modelled_comm(model, shards, task.workload)[:2] == modelled_comm(model, shards, task.workload, one_host(4))[:2]


def test_two_hosts_of_one_gpu_by_hand():
    """Hosts of one GPU: nothing inside a host; the all-to-all is the port's latency and bytes."""
    topo = Topology(2, 1, inter_host_GBps=10.0, inter_host_latency_us=7.0)
    intra = CommModel.load(default_model_path("cuda", 2, "h100")).params()
    B, elt = 1024, 2
    fwd, bwd = alltoall_topo_ms(intra, np.array([[64.0, 32.0]]), B, elt, topo)
    # device 0 sends B/2 · 64 · 2 bytes to device 1 and receives B/2 · 32 · 2; coupled to the busier port
    k = intra.get("coupling", 0.0)
    loads = np.array([max(65536, 32768), max(32768, 65536)], dtype=float)
    coupled = (1 - k) * loads + k * loads.max()
    want = 7e-3 + coupled / 10e6
    assert np.allclose(fwd[0], want) and np.allclose(bwd[0], want)
    # a ring reduce-scatter over the 2 hosts of the 1/G = whole share: half of it through the port
    rs, ag = rowwise_topo_ms(intra, 16, B, elt, topo)
    assert rs == pytest.approx(7e-3 + B * 16 * 2 / 2 / 10e6) and ag == rs


def test_inside_a_host_is_the_fitted_model_of_its_gpus():
    """With free links between hosts, the all-to-all of H hosts is each host's own exchange priced
    by the fitted model of G devices."""
    topo = Topology(2, 4, inter_host_GBps=1e6, inter_host_latency_us=0.0)
    intra = CommModel.load(default_model_path("cuda", 4, "h100")).params()
    dims = np.array([[128.0, 64, 32, 256, 16, 16, 512, 8]])
    fwd, _ = alltoall_topo_ms(intra, dims, 65536, 2, topo)
    chunk = 65536 / 8 * dims * 2
    s, r = chunks_traffic(chunk.reshape(1, 2, 4))
    want = np.asarray(alltoall_ms(intra, s, r)).reshape(1, 8)
    assert np.allclose(fwd, want, rtol=1e-3)


def test_network_slows_the_step_and_bandwidth_matters(sim, tables):
    rng = np.random.default_rng(1)
    placements = rng.integers(0, 16, size=(4, len(tables)))
    one = sim.costs_batch(tables, placements, 16, Workload(), topology=replace(H100, gpus_per_host=16))
    two = sim.costs_batch(tables, placements, 16, Workload(), topology=replace(H100, hosts=2))
    slow = sim.costs_batch(tables, placements, 16, Workload(), topology=replace(H100, hosts=2, inter_host_GBps=12.5))
    comm = lambda c: c[..., 1:3].sum(-1).max(-1)  # noqa: E731
    assert (comm(two) > comm(one)).all() and (comm(slow) > comm(two)).all()
    assert np.array_equal(one[..., [0, 3]], two[..., [0, 3]])  # compute does not depend on the network


def test_sequential_runner_comm_is_the_simulators_on_several_hosts(sim, tables):
    topo = replace(H100, hosts=2)
    task = Task(tables[:24], 16, 10**10, topology=topo)
    plan = Plan.table_wise(task, [i % 16 for i in range(24)], "hand")
    shards = plan.device_tables()
    report = sim.evaluate(shards, task.workload, topology=topo)
    model = CommModel.load(default_model_path("cuda", 8, gpu_slug(sim.calibration.hardware)))  # the runner on the calibration's GPU
    fwd, bwd, info = modelled_comm(model, shards, task.workload, topo)
    assert fwd == pytest.approx([d.fwd_comm_ms for d in report.devices]) and bwd == pytest.approx([d.bwd_comm_ms for d in report.devices])
    assert info["topology"]["hosts"] == 2 and "between hosts" in info["comm_model_note"]
    assert report.details["topology"]["hosts"] == 2 and "between hosts" in report.details["comm"]


# -- table-row-wise ----------------------------------------------------------------------------


def test_table_row_wise_keeps_the_exchange_in_the_host(sim):
    """A table's rows over the 8 GPUs of one host (TorchRec's table_row_wise) against the same
    table's rows over 8 GPUs of two hosts: the first sums on NVLink and sends only the pooled
    output over the network; exported with its host's ranks."""
    topo = replace(H100, hosts=2)
    big = table("big", 800_000, 128, 30.0)
    task = Task([big] + [table(f"t{i}", dim=64) for i in range(8)], 16, 10**10, topology=topo)
    cuts = row_wise_cuts(big.rows, 8)
    others = [Shard(1 + i, i, 0, 64) for i in range(8)]
    twrw = Plan(task, [Shard(0, 8 + r, 0, 128, a, b) for r, (a, b) in enumerate(cuts)] + others, "hand")
    spread = Plan(task, [Shard(0, 2 * r, 0, 128, a, b) for r, (a, b) in enumerate(cuts)] + others, "hand")
    twrw.check(), spread.check()
    comm = lambda p: max(d.fwd_comm_ms + d.bwd_comm_ms for d in sim.evaluate_plan(p).devices)  # noqa: E731
    assert comm(twrw) < comm(spread)
    exported = torchrec_shardings(twrw)["big"]
    assert exported["sharding_type"] == "table_row_wise" and exported["ranks"] == list(range(8, 16))
    assert exported["shards"][0]["placement"] == "rank:8/cuda:0"


def test_table_row_wise_price_by_hand():
    """topology_comm_ms of one table's rows inside host 1 of 2: host 1's GPUs pay the fitted
    reduce-scatter over 8 GPUs; the reduced output crosses hosts in the all-to-all."""
    from dreamshard.streams import row_shard_spec

    topo = replace(H100, hosts=2)
    t = table("big", 80_000, 128, 5.0)
    specs = [row_shard_spec(t, a, b) for a, b in row_wise_cuts(t.rows, 8)]
    intra = CommModel.load(default_model_path("cuda", 8, "h100")).params()
    B, elt = 65536, 2
    placement = np.arange(8, 16)[None, :]
    fwd, bwd = topology_comm_ms(intra, specs, placement, np.zeros((1, 16)), np.zeros((1, 16)), Workload(B), topo)
    rs = collective_ms(intra, "reduce_scatter", B * 128 * elt, 8)
    per = B / 16 * 128 * elt  # a GPU of host 1 sends its B/16 samples of 128 columns to its rail's GPU of host 0
    port = 5e-3 + per / 50e6  # every port carries `per` one way (host 1's send, host 0's receive): the coupling changes nothing
    assert fwd[0, 8:] == pytest.approx(rs + port) and fwd[0, :8] == pytest.approx(port)
    assert bwd[0, 8:] == pytest.approx(collective_ms(intra, "all_gather", B * 128 * elt, 8) + port)


# -- planners ----------------------------------------------------------------------------------


def test_scorer_prices_the_hierarchy(tables):
    from dreamshard.planners import get_planner, splits
    from dreamshard.planners.scoring import COMM, PieceScorer

    model = get_planner("neuroshard").model  # the shipped cost net
    topo = replace(H100, hosts=2)
    task = Task(tables[:32], 16, 10**10, topology=topo)
    scorer = PieceScorer(model, task)
    pieces = splits.whole(task)
    state = scorer.state(pieces, np.arange(32) % 16)
    costs = scorer.device_costs(state)
    fwd, bwd = alltoall_topo_ms(scorer.comm, state[:, scorer._a2a], 65536, 2, topo)
    assert np.allclose(costs[:, COMM] * scorer.net.scale, fwd + bwd, rtol=1e-5)
    flat = PieceScorer(model, replace(task, topology=None))
    assert float(scorer.score(state)) > float(flat.score(flat.state(pieces, np.arange(32) % 16)))


@pytest.mark.parametrize("name, options", [("neuroshard", {"beam": 1, "depth": 2}), ("dreamshard", {"max_splits": 2}), ("size_lookup", {"split": True})])
def test_planners_plan_for_several_hosts(tables, sim, name, options):
    from dreamshard.planners import get_planner

    topo = replace(H100, hosts=2, gpus_per_host=4)
    task = Task(tables[:40], 8, 10**10, topology=topo).validate()
    plan = get_planner(name, **options).plan(task)
    plan.check()
    assert plan.task.topology == topo
    report = sim.evaluate_plan(plan)
    assert report.details["topology"]["hosts"] == 2


def test_row_splits_on_several_hosts_are_table_row_wise():
    """On several hosts a table split by rows into G blocks lies on the G GPUs of one host, block r
    on GPU r (TorchRec's table_row_wise): the planners' row splits export with that host's ranks."""
    from dreamshard.planners import get_planner, splits

    topo = replace(H100, hosts=2, gpus_per_host=4)
    hot = table("hot", 2_000_000, 128, 60.0)
    task = Task([hot] + [table(f"t{i}", 50_000, 32, 2.0) for i in range(12)], 8, 10**10, topology=topo)
    assert splits.task_row_parts(task) == [2, 4, 8]
    assert splits.twrw_blocks(task, splits.row_split(task, 0, 4)) == [0, 1, 2, 3]
    assert splits.twrw_blocks(task, splits.row_split(task, 0, 8)) == [-1] * 8
    assert splits.twrw_blocks(replace(task, topology=None), splits.row_split(task, 0, 4)) == [-1] * 4
    seen = 0
    # dreamshard without its annealing, which here finds a plan of column pieces 9% cheaper (by the
    # net and the simulator) than the row split this test is about
    for name, options in (("neuroshard", {"beam": 2, "depth": 3}), ("dreamshard", {"beam_depth": 0, "anneal": 0})):
        plan = get_planner(name, **options).plan(task)
        plan.check()
        rows = sorted((s for s in plan.shards if s.is_row_shard), key=lambda s: s.row_start)
        if len(rows) == 4:
            host = rows[0].device // 4
            assert [s.device for s in rows] == [host * 4 + r for r in range(4)]
            exported = torchrec_shardings(plan)["hot"]
            assert exported["sharding_type"] == "table_row_wise" and exported["ranks"] == [host * 4 + r for r in range(4)]
            seen += 1
    assert seen, "no planner split the hot table over one host"


def test_every_table_table_row_wise_by_host():
    """A table of fewer rows than a host's GPUs splits table-row-wise into as many blocks as rows
    (TorchRec leaves the host's last ranks empty), never row-wise over all GPUs so; the candidate
    of every table table-row-wise puts each table's block r on GPU r of one host, fits memory,
    and exports as table_row_wise."""
    from dreamshard.planners import get_planner, splits
    from dreamshard.planners.dreamshard import table_row_wise_by_host
    from dreamshard.planners.scoring import PieceScorer

    topo = replace(H100, hosts=3, gpus_per_host=4)
    tables = [table("hot", 2_000_000, 64, 40.0), table("tiny", 3, 64, 1.0)] + [table(f"t{i}", 50_000, 32, 2.0) for i in range(4)]
    task = Task(tables, 12, 10**10, topology=topo)
    assert [(s.row_start, s.row_stop) for s in splits.row_split(task, 1, 4)] == [(0, 1), (1, 2), (2, 3)]
    assert splits.row_split(task, 1, 12) is None and splits.row_split(replace(task, topology=None), 1, 4) is None
    planner = get_planner("dreamshard")
    scorer = PieceScorer(planner.model, task)
    cost, pieces, devices = table_row_wise_by_host(scorer, splits.whole(task))
    plan = splits.placed(task, pieces, devices, "test")
    plan.check()
    assert cost == pytest.approx(float(scorer.score(scorer.state(pieces, np.array(devices)))))
    exported = torchrec_shardings(plan, local_world_size=4)
    for i, t in enumerate(tables):
        mine = sorted((s for s in plan.shards if s.table == i), key=lambda s: s.row_start)
        host = mine[0].device // 4
        assert [s.device for s in mine] == [host * 4 + r for r in range(len(mine))]
        assert exported[t.name]["sharding_type"] == "table_row_wise" and exported[t.name]["ranks"][: len(mine)] == [s.device for s in mine]


def test_a_grid_of_every_table_by_host():
    """The grid candidate (`blocks=2`): every table whose dim allows it in two column blocks, each
    table-row-wise on a host of its own (the host moves keep them apart), within memory, priced as
    scored, and exported as TorchRec's grid_shard."""
    from dreamshard.planners import get_planner, splits
    from dreamshard.planners.dreamshard import table_row_wise_by_host
    from dreamshard.planners.scoring import PieceScorer

    topo = replace(H100, hosts=3, gpus_per_host=4)
    tables = [table("hot", 2_000_000, 64, 40.0), table("tiny", 3, 64, 1.0), table("odd", 50_000, 36, 2.0)] + [table(f"t{i}", 50_000, 32, 2.0) for i in range(4)]
    task = Task(tables, 12, 10**10, topology=topo)
    scorer = PieceScorer(get_planner("dreamshard").model, task)
    cost, pieces, devices = table_row_wise_by_host(scorer, splits.whole(task), blocks=2)
    plan = splits.placed(task, pieces, devices, "test")
    plan.check()
    assert cost == pytest.approx(float(scorer.score(scorer.state(pieces, np.array(devices)))))
    exported = torchrec_shardings(plan, local_world_size=4)
    for i, t in enumerate(tables):
        mine = [s for s in plan.shards if s.table == i]
        blocks = sorted({(s.start, s.stop) for s in mine})
        assert blocks == ([(0, t.dim)] if t.name == "odd" else [(0, t.dim // 2), (t.dim // 2, t.dim)])  # 36 = 2 blocks of 18: not a multiple of 4
        hosts = [{s.device // 4 for s in mine if (s.start, s.stop) == b} for b in blocks]
        assert all(len(h) == 1 for h in hosts) and len(set.union(*hosts)) == len(blocks)
        assert exported[t.name]["sharding_type"] == ("table_row_wise" if t.name == "odd" else "grid_shard")
    assert table_row_wise_by_host(scorer, splits.whole(task), blocks=4) is None  # more blocks than hosts


def test_improving_the_hosts_never_raises_the_score_and_keeps_memory():
    """`improve_hosts` from a bad start (every table-row-wise table on host 0, as memory allows):
    the score only falls, each table's blocks stay on GPUs 0..k-1 of one host, every GPU within
    memory, and the hosts it returns give the score it returns; from its own result it finds
    nothing more."""
    from dreamshard.planners import get_planner, splits
    from dreamshard.planners.dreamshard import improve_hosts
    from dreamshard.planners.scoring import PieceScorer

    topo = replace(H100, hosts=3, gpus_per_host=4)
    tables = [table(f"t{i}", 200_000 * (i + 1), 64, 5.0 + 3 * i) for i in range(6)]
    task = Task(tables, 12, 10**10, topology=topo)
    scorer = PieceScorer(get_planner("dreamshard").model, task)
    blocks = [splits.row_split(task, i, 4) for i in range(len(tables))]
    slots = [scorer.slots([b])[0] for b in blocks]
    rows, size = [scorer.table[s] for s in slots], [scorer.bytes[s] for s in slots]

    def placed(host):
        pieces = [b for bs in blocks for b in bs]
        devices = np.array([h * 4 + r for i, h in enumerate(host) for r in range(len(blocks[i]))])
        used = np.zeros(12)
        np.add.at(used, devices, splits.sizes(task, pieces))
        return scorer.state(pieces, devices), used

    start = np.zeros(len(tables), int)
    state, used = placed(start)
    host, cost = improve_hosts(scorer, rows, size, start, state, used, 4)
    assert cost < float(scorer.score(state)) and len(set(host.tolist())) > 1
    state, used = placed(host)
    assert cost == pytest.approx(float(scorer.score(state))) and used.max() <= task.max_memory_bytes
    again, same = improve_hosts(scorer, rows, size, host, state, used, 4)
    assert (again == host).all() and same == pytest.approx(cost)


def test_oracle_searches_on_the_topology(tables, sim):
    from dreamshard.planners import get_planner

    topo = replace(H100, hosts=2, gpus_per_host=2, inter_host_GBps=5.0)
    task = Task(tables[:12], 4, 10**10, topology=topo)
    plan = get_planner("oracle", backend=sim, budget=300, restarts=1).plan(task)
    assert plan.predicted["overall_ms"] == pytest.approx(sim.evaluate_plan(plan).overall_ms)


def test_torchrec_planner_gets_the_hosts(tables):
    pytest.importorskip("torchrec")
    from dreamshard.planners import get_planner

    topo = replace(H100, hosts=2, gpus_per_host=4)
    task = Task(tables[:12], 8, 20 * 10**9, topology=topo)
    planner = get_planner("torchrec")
    tr = planner.planner(task)._topology
    assert (tr.world_size, tr.local_world_size) == (8, 4)
    assert tr.inter_host_bw == pytest.approx(50.0 * 1e6) and tr.intra_host_bw == pytest.approx(450.0 * 1e6)
    plan = planner.plan(task)
    plan.check()
    assert plan.task.topology == topo


# -- the command line --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def table_file(tmp_path_factory, tables):
    from dreamshard.tables import save_tables

    out = tmp_path_factory.mktemp("topo") / "tables.csv"
    save_tables(tables, out)
    return out


def test_cli_plan_and_measure_on_hosts(tmp_path, table_file):
    out = tmp_path / "p.json"
    r = invoke("plan", table_file, "--hosts", 4, "--gpus-per-host", 8, "--max-memory", "80GB", "--out", out, "-q")
    assert r.exit_code == 0, r.output
    plan = load_plans(out)[0]
    assert plan.devices == 32 and (plan.task.topology.hosts, plan.task.topology.gpus_per_host) == (4, 8)
    r = invoke("measure", out, "--backend", "sim", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["details"]["topology"]["hosts"] == 4
    # the same plan on one host of 32: cheaper comm
    r1 = invoke("measure", out, "--backend", "sim", "--json", "--hosts", 1, "--gpus-per-host", 32, "--out", tmp_path / "one.json")
    assert r1.exit_code == 0, r1.stderr
    assert json.loads(r1.stdout)["overall_ms"] < rep["overall_ms"]
    # a preset: the devices and the memory from it
    r = invoke("plan", table_file, "--topology", "h200-sxm:2", "--out", tmp_path / "h.json", "-q")
    assert r.exit_code == 0, r.output
    p = load_plans(tmp_path / "h.json")[0]
    assert p.devices == 16 and p.task.max_memory_bytes == 141 * 10**9


@pytest.mark.parametrize("args, needle", [
    (("--hosts", 3, "--devices", 16, "--max-memory", "8GB"), "--hosts 3: give --gpus-per-host, or --devices a multiple of it"),
    (("--hosts", 2, "--gpus-per-host", 8, "--devices", 8, "--max-memory", "8GB"), "--devices 8, but the topology is 2 hosts × 8 GPUs = 16 devices"),
    (("--topology", "nope", "--max-memory", "8GB"), "neither a preset"),
    (("--topology", "h100-sxm:0", "--max-memory", "8GB"), "host count: '0' must be >= 1"),
    (("--hosts", 2, "--gpus-per-host", 8), "TABLES_FILE needs --devices"),
])
def test_cli_bad_topology_is_one_line(tmp_path, table_file, args, needle):
    r = invoke("plan", table_file, *args, "--out", tmp_path / "p.json")
    assert needle in one_line_error(r)


def test_cli_compare_on_hosts(tmp_path, tables):
    tasks = [Task(tables[:20], 16, 10**10), Task(tables[20:40], 16, 10**10)]
    save_tasks(tasks, tmp_path / "t.jsonl")
    from dreamshard.tables import save_tables

    save_tables(tables, tmp_path / "tables.csv")
    lines = [json.dumps({**t.to_json(), "pool": str(tmp_path)}) for t in tasks]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    r = invoke("compare", "--tasks", tmp_path / "t.jsonl", "--planners", "lookup,size", "--topology", "h100-sxm:2", "--json")
    assert r.exit_code == 0, r.stderr
    r = invoke("compare", "--tasks", tmp_path / "t.jsonl", "--planners", "lookup", "--topology", "h100-sxm:3")
    assert "task 1 has 16 devices, but the topology is 3 hosts × 8 GPUs = 24" in one_line_error(r)


def test_a_backend_without_topologies_says_what_it_measured(sim, tables):
    """A backend that cannot price a topology (real collectives on this machine) measures its own
    processes, and its report says the plan's topology was not what it measured."""
    from dreamshard.costs.base import CostBackend, evaluate_on

    class Here(CostBackend):
        def evaluate(self, shards, workload=Workload()):
            return sim.evaluate(shards, workload)

    topo = replace(H100, hosts=2)
    plan = Plan.table_wise(Task(tables[:16], 16, 10**10, topology=topo), list(range(16)), "hand")
    report = Here().evaluate_plan(plan)
    assert "2 hosts × 8 GPUs" in report.details["topology_note"] and "topology" not in report.details
    assert "topology_note" not in evaluate_on(Here(), plan.device_tables(), plan.workload, None).details
    assert evaluate_on(sim, plan.device_tables(), plan.workload, topo).details["topology"]["hosts"] == 2


def test_torchrec_row_layouts_keep_every_row_split_expressible(tmp_path):
    """A task of TorchRec's row layouts (`Task.row_layouts`): the searching planners split by rows
    only over every device (row_wise) or a host's GPUs (table_row_wise), so every plan exports to
    TorchRec; left free, the same task's plans split rows over other sets of devices, which do not.
    The key survives a task file, and `plan --row-layouts torchrec` sets it."""
    from dreamshard.planners import get_planner
    from dreamshard.torchrec_io import NotExpressibleError

    topo = replace(H100, hosts=4)
    task = Task(synth_family("onehot", 26, 0), topo.devices, topo.hbm_bytes, Workload(65_536), topology=topo)
    for name in ("dreamshard", "neuroshard"):
        free = get_planner(name).plan(task)
        with pytest.raises(NotExpressibleError):
            torchrec_shardings(free)
        ours = get_planner(name).plan(replace(task, row_layouts="torchrec"))
        ours.check()
        kinds = {s["sharding_type"] for s in torchrec_shardings(ours).values()}
        assert any(p.is_row_shard for p in ours.shards) and kinds & {"row_wise", "table_row_wise"}, kinds
    save_tasks([replace(task, row_layouts="torchrec")], tmp_path / "t.jsonl")
    assert load_tasks(tmp_path / "t.jsonl", task.tables)[0].row_layouts == "torchrec"
    (tmp_path / "bad.jsonl").write_text(json.dumps({**task.to_json(), "row_layouts": "grid"}) + "\n")
    with pytest.raises(TaskError, match="row_layouts"):
        load_tasks(tmp_path / "bad.jsonl", task.tables)
    from dreamshard.tables import save_tables

    save_tables(task.tables, tmp_path / "tables.csv")
    out = tmp_path / "p.json"
    r = invoke("plan", tmp_path / "tables.csv", "--hosts", 4, "--gpus-per-host", 8, "--max-memory", "80GB", "--planner", "dreamshard",
               "--row-layouts", "torchrec", "--out", out, "-q")
    assert r.exit_code == 0, r.output
    assert torchrec_shardings(load_plans(out)[0])
    r = invoke("export", "torchrec", out, "--out", tmp_path / "tr.json")
    assert r.exit_code == 0, r.output


def test_the_command_line_offers_the_tasks_row_layouts():
    from dreamshard.cli import plan_cmd
    from dreamshard.tasks import ROW_LAYOUTS

    option = next(p for p in plan_cmd.params if p.name == "row_layouts")
    assert tuple(option.type.choices) == ROW_LAYOUTS


def test_a_grid_keeps_each_blocks_exchange_in_its_host(sim):
    """A table in two column blocks, each table-row-wise inside its own host (TorchRec's
    grid_shard), against its rows spread over both hosts' GPUs: the grid sums each block on
    NVLink; exported as grid_shard in TorchRec's layout and read back as the same shards."""
    from dreamshard.torchrec_io import shards_from_torchrec

    topo = replace(H100, hosts=2)
    big = table("big", 800_000, 128, 30.0)
    task = Task([big] + [table(f"t{i}", dim=64) for i in range(16)], 16, 10**10, topology=topo)
    cuts = row_wise_cuts(big.rows, 8)
    others = [Shard(1 + i, i, 0, 64) for i in range(16)]
    grid = Plan(task, [Shard(0, 8 * h + r, 64 * h, 64 * (h + 1), a, b) for h in range(2) for r, (a, b) in enumerate(cuts)] + others, "hand")
    spread = Plan(task, [Shard(0, r, 0, 128, a, b) for r, (a, b) in enumerate(row_wise_cuts(big.rows, 16))] + others, "hand")
    grid.check(), spread.check()
    comm = lambda p: max(d.fwd_comm_ms + d.bwd_comm_ms for d in sim.evaluate_plan(p).devices)  # noqa: E731
    assert comm(grid) < comm(spread)
    exported = torchrec_shardings(grid)["big"]
    assert exported["sharding_type"] == "grid_shard" and exported["ranks"] == list(range(16))
    assert [(s["offsets"], s["sizes"]) for s in exported["shards"][7:9]] == [([cuts[7][0], 0], [cuts[7][1] - cuts[7][0], 64]), ([0, 64], [cuts[0][1], 64])]
    back = shards_from_torchrec("grid_shard", "big", 0, [(s["rank"], s["offsets"][0], s["sizes"][0], s["offsets"][1], s["sizes"][1]) for s in exported["shards"]], "test")
    assert sorted(back, key=lambda s: (s.start, s.row_start)) == sorted((s for s in grid.shards if s.table == 0), key=lambda s: (s.start, s.row_start))


@pytest.mark.parametrize("blocks,needle", [
    ([(0, 64, 0), (64, 128, 0)], "two of its column blocks are on host 0"),
    ([(0, 32, 0), (32, 128, 1)], "not grid_shard's column blocks of one width"),
])
def test_a_grid_torchrec_cannot_hold_says_why(blocks, needle):
    from dreamshard.torchrec_io import NotExpressibleError

    topo = replace(H100, hosts=2)
    big = table("big", 8_000, 128, 3.0)
    task = Task([big], 16, 10**10, topology=topo)
    cuts = row_wise_cuts(big.rows, 8)
    plan = Plan(task, [Shard(0, 8 * h + r, c0, c1, a, b) for c0, c1, h in blocks for r, (a, b) in enumerate(cuts)], "hand")
    plan.check()
    with pytest.raises(NotExpressibleError, match=needle):
        torchrec_shardings(plan)
