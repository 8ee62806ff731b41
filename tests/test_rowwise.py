"""Row-wise shards: row ranges tile a table, plan/3 round-trips, a row shard's stream is
exactly its table's indices in range, the shards' partial sums add up to the table's pooled
output, and a row-wise plan is measured for real (sequential, distributed with a real gloo
reduce-scatter and all-gather, the CLI) and priced by the simulator."""

import json

import numpy as np
import pytest
import torch

from dreamshard.costs.comm import CommModel, collective_ms, fit_collective, measure_comm, relayout_ms, ring_bytes
from dreamshard.costs.sim import SimBackend
from dreamshard.plan import Plan, Shard, load_plans, row_cuts, save_plans
from dreamshard.rowshard import RowShardSpec, exchange_dims, spec_from_dict
from dreamshard.streams import row_sample_batch, table_bags
from dreamshard.tables import TableSpec
from dreamshard.tasks import Task, Workload
from dreamshard.validation import PlanError

W = TableSpec("w", 5000, 96, 20.0, distribution="zipf:1.1", seed=3)
N = TableSpec("n", 3000, 16, 5.0, distribution="uniform", seed=4)


def task(devices=2, w=W, workload=Workload(), cap=10**12) -> Task:
    return Task([w, N], devices, cap, workload)


def row_plan(devices=2, w=W, workload=Workload(), cuts=((0, 2500), (2500, 5000))) -> Plan:
    """w row-wise over devices 0, 1, ...; n whole on the last device."""
    shards = [Shard(0, d, 0, w.dim, a, b) for d, (a, b) in enumerate(cuts)] + [Shard(1, devices - 1, 0, 16)]
    return Plan(task(devices, w, workload), shards, "manual")


# --------------------------------------------------------------------------------------------
# The noun
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,parts", [(5000, 2), (5000, 3), (7, 7), (10, 3), (1, 1), (10**12, 1024)])
def test_row_cuts_tile_the_rows(rows, parts):
    cuts = row_cuts(rows, parts)
    assert len(cuts) == parts and cuts[0][0] == 0 and cuts[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    sizes = [b - a for a, b in cuts]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_row_cuts_refuse_more_parts_than_rows():
    with pytest.raises(ValueError):
        row_cuts(3, 4)


@pytest.mark.parametrize("shards,match", [
    ([Shard(0, 0, 0, 96, 0, 2000), Shard(0, 1, 0, 96, 2500, 5000)], r"rows \[2500, 5000\) do not continue its shards at row 2000"),  # gap
    ([Shard(0, 0, 0, 96, 0, 3000), Shard(0, 1, 0, 96, 2500, 5000)], r"rows \[2500, 5000\) do not continue its shards at row 3000"),  # overlap
    ([Shard(0, 0, 0, 96, 0, 2500), Shard(0, 1, 0, 96, 2500, 4000)], r"cover rows \[0, 4000\) of its 5000"),  # short
    ([Shard(0, 0, 0, 96, 0, 2500), Shard(0, 1, 0, 96, 2500, 6000)], r"rows \[2500, 6000\) .* within its 5000 rows"),  # past the end
    ([Shard(0, 0, 0, 96, 0, 2500), Shard(0, 0, 0, 96, 2500, 5000)], "two of its row shards on device 0"),
    ([Shard(0, 0, 0, 48, 0, 2500), Shard(0, 1, 48, 96, 2500, 5000)], r"shards in columns \[0, 48\) cover rows \[0, 2500\) of its 5000"),  # a grid missing blocks
    ([Shard(0, 0, 0, 48, 0, 2500), Shard(0, 1, 0, 48, 2500, 5000), Shard(0, 0, 64, 96, 0, 5000)], r"columns \[64, 96\) do not continue its column ranges at column 48"),
    ([Shard(0, 0, 0, 48, 0, 2500), Shard(0, 1, 0, 48, 2500, 5000)], r"cover columns \[0, 48\) of its 96"),
    ([Shard(0, 0, 0, 48, 0, 2500), Shard(0, 0, 0, 48, 2500, 5000), Shard(0, 1, 48, 96)], r"two of its row shards in columns \[0, 48\) on device 0"),
    ([Shard(0, 0, 0, 42, 0, 2500), Shard(0, 1, 0, 42, 2500, 5000), Shard(0, 1, 42, 96)], r"columns \[0, 42\) are 42 wide"),
    ([Shard(0, 0, 0, 96, 0, 2500), Shard(0, 1, 0, 96)], r"rows \[0, 5000\) do not continue its shards at row 2500"),  # a whole shard beside a row shard
])
def test_bad_row_shards_are_refused_with_the_table_named(shards, match):
    with pytest.raises(PlanError, match=f"table w: .*{match}" if "device" not in match else match):
        Plan(task(), shards + [Shard(1, 1, 0, 16)], "manual").check()


def test_memory_counts_only_the_shards_rows():
    plan = row_plan(workload=Workload(precision="fp32", optimizer="rowwise_adagrad"))
    plan.check()
    assert plan.device_bytes() == [2500 * 96 * 4 + 4 * 2500, 2500 * 96 * 4 + 4 * 2500 + N.bytes("fp32", "rowwise_adagrad")]
    fits_only_split = 2500 * 96 * 2 + N.bytes()
    Plan(task(cap=fits_only_split), row_plan().shards, "manual").check()
    with pytest.raises(PlanError, match="device 1 holds"):
        Plan.table_wise(task(cap=fits_only_split), [1, 1], "manual").check()


def test_plan_json_round_trip_with_row_shards(tmp_path):
    plan = row_plan(workload=Workload(1024, "fp32"))
    path = tmp_path / "rows.json"
    save_plans([plan], path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "dreamshard.plan/3"  # a plan/2 reader refuses it by its format
    assert doc["tables"][0]["shards"] == [{"device": 0, "columns": [0, 96], "rows": [0, 2500], "bytes": 2500 * 96 * 4},
                                          {"device": 1, "columns": [0, 96], "rows": [2500, 5000], "bytes": 2500 * 96 * 4}]
    assert doc["tables"][1]["shards"] == [{"device": 1, "columns": [0, 16], "bytes": N.bytes("fp32")}]  # no "rows": every row
    (back,) = load_plans(path)
    assert back.shards == plan.shards and back.workload == plan.workload and back.device_tables() == plan.device_tables()
    # a table-wise plan is still written as plan/2, and a row range of every row is no row range
    whole = Plan(task(), [Shard(0, 0, 0, 96, 0, 5000), Shard(1, 1, 0, 16)], "manual")
    assert not whole.has_row_shards() and whole.is_table_wise and whole.to_json()["format"] == "dreamshard.plan/2"


@pytest.mark.parametrize("rows,match", [("0:10", "key 'rows': expected a list"), ([0], r"key 'rows': expected \[start, stop\]"),
                                        ([0, 6000], "key 'rows' stop"), ([0, 2.5], "key 'rows' stop")])
def test_bad_rows_in_a_plan_file_are_one_line_errors(rows, match):
    doc = row_plan().to_json()
    doc["tables"][0]["shards"][0]["rows"] = rows
    with pytest.raises(PlanError, match=match) as e:
        Plan.from_json(doc, "p.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("p.json, table 0, shard 0")


# --------------------------------------------------------------------------------------------
# Streams and what a row shard costs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("table", [W, N, TableSpec("z", 100_000, 8, 3.5, distribution="zipf:1.4", seed=11)])
def test_a_row_shard_stream_is_its_tables_indices_in_range(table):
    cuts = row_cuts(table.rows, 3)
    specs = [Shard(0, d, 0, table.dim, a, b).spec(table) for d, (a, b) in enumerate(cuts)]
    for batch, step in ((64, 0), (200, 5)):
        lengths, indices = table_bags(table, batch, step)
        bags = torch.split(indices, lengths.tolist())
        total = torch.zeros_like(lengths)
        for spec, (a, b) in zip(specs, cuts):
            sl, si = table_bags(spec, batch, step)
            want = [bag[(bag >= a) & (bag < b)] - a for bag in bags]  # bag by bag, order kept
            assert sl.tolist() == [len(x) for x in want]
            assert torch.equal(si, torch.cat(want))
            assert si.numel() == 0 or (si.min() >= 0 and si.max() < b - a)
            total += sl
        assert torch.equal(total, lengths)  # together the shards see every lookup once


def test_a_row_shard_is_priced_on_its_measured_lookups():
    """Zipf's hot rows fall in some ranges: a shard's pooling factor is its measured share of the
    table's lookups (counted here independently on the same sample of its stream), not pooling / shards."""
    cuts = row_cuts(W.rows, 4)
    specs = [Shard(0, d, 0, 96, a, b).spec(W) for d, (a, b) in enumerate(cuts)]
    _, ix = table_bags(W, row_sample_batch(W), 0)
    shares = [float(((ix >= a) & (ix < b)).sum()) / ix.numel() for a, b in cuts]
    for spec, share, (a, b) in zip(specs, shares, cuts):
        assert isinstance(spec, RowShardSpec) and (spec.rows, spec.dim, spec.row_start, spec.row_stop) == (b - a, 96, a, b)
        assert spec.pooling_factor == pytest.approx(W.pooling_factor * share, rel=1e-12)
        assert sum(spec.bins) == pytest.approx(1.0)
    assert sum(s.pooling_factor for s in specs) == pytest.approx(W.pooling_factor, rel=1e-12)
    assert max(shares) - min(shares) > 0.05  # uneven: an even split would be 0.25 each
    # the spec survives the runner's JSON job, and cannot be read back as a whole table
    again = spec_from_dict(json.loads(json.dumps(specs[1].to_dict())))
    assert again == specs[1] and torch.equal(table_bags(again, 32, 1)[1], table_bags(specs[1], 32, 1)[1])
    with pytest.raises(ValueError, match="distribution"):
        TableSpec.from_dict({k: v for k, v in specs[1].to_dict().items() if k != "row_shard"})


def test_row_shards_pooled_outputs_sum_to_the_tables():
    """Torch kernel on CPU: each row shard holds its rows of one fp32 table; the float64 sum of
    their pooled outputs is the table's pooled output (float64 reference, every bag)."""
    from dreamshard.costs.kernels import make_tbe

    table, batch = TableSpec("t", 1000, 16, 6.0, distribution="zipf:1.2", seed=7), 128
    weights = torch.randn(table.rows, table.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lengths, indices = table_bags(table, batch, 2)
    reference = torch.stack([weights[bag].sum(0) for bag in torch.split(indices, lengths.tolist())])
    total = torch.zeros(batch, table.dim, dtype=torch.float64)
    for a, b in row_cuts(table.rows, 3):
        spec = Shard(0, 0, 0, 16, a, b).spec(table)
        tbe = make_tbe("torch", [spec.rows], [spec.dim], precision="fp32", device="cpu")
        tbe.set_weights(0, weights[a:b].float())
        sl, si = table_bags(spec, batch, 2)
        offsets = torch.cat([sl.new_zeros(1), torch.cumsum(sl, 0)])
        total += tbe.forward(si, offsets).double()
    assert torch.allclose(total, reference, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(total, torch.zeros_like(total))


# --------------------------------------------------------------------------------------------
# Comm model, simulator, runners, CLI
# --------------------------------------------------------------------------------------------


def test_collective_model_rule_fit_and_file(tmp_path):
    params = {"latency_ms": 0.07, "bandwidth_GBps": 400.0, "serial_fraction": 0.3}
    n = 64 << 20
    # unfitted: priced as a balanced all-to-all moving the ring's bytes each way
    assert collective_ms(params, "reduce_scatter", n, 4) == pytest.approx(0.07 + 1.3 * n * 3 / 4 / 400e6)
    assert collective_ms(params, "all_gather", n, 1) == 0.0 and collective_ms(params, "all_gather", 0, 8) == 0.0
    # a fit recovers exact parameters, and a model carrying it uses it and keeps it in its file
    pts = [{"buffer_bytes": b, "devices": 2, "ms": 0.02 + float(ring_bytes(b, 2)) / 100e6} for b in (1 << 12, 1 << 20, 1 << 26)]
    fit = fit_collective(pts)
    assert fit["latency_ms"] == pytest.approx(0.02) and fit["bandwidth_GBps"] == pytest.approx(100.0)
    model = CommModel(0.07, 400.0, 0.3, reduce_scatter={"latency_ms": 0.02, "bandwidth_GBps": 100.0})
    assert model.rowwise_ms(64, 1024, 2, 2) == (pytest.approx(0.02 + 1024 * 64 * 2 / 2 / 100e6), collective_ms(params, "all_gather", 1024 * 64 * 2, 2))
    model.save(tmp_path / "m.json")
    assert CommModel.load(tmp_path / "m.json").reduce_scatter == model.reduce_scatter
    assert "reduce_scatter" not in CommModel(0.07, 400.0).to_json()  # models without one are written as before
    with pytest.raises(ValueError, match="bandwidth_GBps"):
        CommModel(0.07, 400.0, reduce_scatter={"latency_ms": 0.0, "bandwidth_GBps": -1})


def test_simulator_prices_row_shards_and_their_comm_grows_with_dim():
    sim = SimBackend()
    costs = {}
    for dim in (32, 128):
        w = TableSpec("w", 200_000, dim, 20.0, distribution="zipf:1.1", seed=3)
        plan = row_plan(w=w, cuts=((0, 100_000), (100_000, 200_000)))
        costs[dim] = sim.evaluate_plan(plan).devices
        specs = plan.device_tables()
        assert exchange_dims(specs) == ([0, 16], dim)  # the row shards leave the all-to-all
        comm = sim.comm_for(2)  # the shipped model of the calibration's GPU at 2 devices
        rs, ag = (collective_ms(comm, k, 65536 * dim * 2, 2) for k in ("reduce_scatter", "all_gather"))
        copy_f, copy_b = relayout_ms(comm, [0, 16], [dim, dim], 65536, 2)  # both devices hold a row shard
        a2a = sim.evaluate([[], [N]]).devices  # the same all-to-all without the row-wise table
        for d in range(2):
            assert costs[dim][d].fwd_comm_ms == pytest.approx(a2a[d].fwd_comm_ms + rs + copy_f[d])
            assert costs[dim][d].bwd_comm_ms == pytest.approx(a2a[d].bwd_comm_ms + ag + copy_b[d])
        # each shard's compute is that of a table of its rows and measured lookups
        alone = sim.shard_compute([[specs[0][0]]])[0]
        assert costs[dim][0].fwd_comp_ms == pytest.approx(alone[0]) and costs[dim][0].bwd_comp_ms == pytest.approx(alone[1])
    assert all(costs[128][d].fwd_comm_ms > costs[32][d].fwd_comm_ms and costs[128][d].bwd_comm_ms > costs[32][d].bwd_comm_ms for d in range(2))
    assert costs[128][0].fwd_comp_ms > costs[32][0].fwd_comp_ms


def test_sequential_runner_measures_a_row_wise_plan():
    from dreamshard.costs.runners import SequentialRunner

    plan = row_plan(workload=Workload(512, "fp32"))
    r = SequentialRunner("torch", device="cpu", warmup=1, iters=3).evaluate_plan(plan)
    assert r.details["tables_per_device"] == [1, 2] and r.details["dim_sums"] == [0, 16] and r.details["rowwise_dim"] == 96
    rs, ag = r.details["rowwise_comm_ms"]
    m = CommModel.load(r.details["comm_model"])
    assert (rs, ag) == m.rowwise_ms(96, 512, 4, 2) and rs > 0
    fwd_a2a, bwd_a2a = m.placement_ms([0, 16], 512, 4)
    assert [c.fwd_comm_ms for c in r.devices] == pytest.approx([f + rs for f in fwd_a2a])
    assert [c.bwd_comm_ms for c in r.devices] == pytest.approx([b + ag for b in bwd_a2a])
    assert all(c.fwd_comp_ms > 0 and c.bwd_comp_ms > 0 for c in r.devices)


def test_distributed_runner_reduce_scatters_row_shards_for_real():
    """Two gloo processes: the reduce-scatter's input on each rank is its shard's real pooled
    output in the table's columns (rebuilt here with the same kernel, seed and stream), its output
    is the float64 sum over ranks of the rank's samples, and the all-gather returns every rank's
    gradient slice in order."""
    from dreamshard.costs.kernels import make_tbe
    from dreamshard.costs.runners import DistributedRunner
    from dreamshard.rowshard import exchange_order
    from dreamshard.streams import shard_batch

    B = 16
    plan = row_plan(workload=Workload(B, "fp32"))
    r = DistributedRunner("torch", "cpu", 1, 3, timeout_s=120, check_outputs=True).evaluate_plan(plan)
    assert r.runner == "distributed" and not r.comm_modelled and r.details["rowwise_dim"] == 96 and r.details["dim_sums"] == [0, 16]
    assert all(c.fwd_comm_ms > 0 and c.bwd_comm_ms > 0 and c.fwd_comp_ms > 0 for c in r.devices)
    check = r.details["rowwise_check"]
    rs_in = [np.array(c["reduce_scatter_in"]) for c in check]
    for rank, tables in enumerate(exchange_order(plan.device_tables())):
        tbe = make_tbe("torch", [t.rows for t in tables], [t.dim for t in tables], precision="fp32", device="cpu", seed=0)
        out = tbe.forward(*shard_batch(tables, B, step=0)).double().numpy()
        assert np.array_equal(rs_in[rank], out[:, -96:])  # the row shard is last; its columns are the whole buffer
    summed = rs_in[0] + rs_in[1]
    assert np.abs(summed).max() > 0
    for rank in range(2):
        assert np.allclose(check[rank]["reduce_scatter_out"], summed[rank * B // 2:(rank + 1) * B // 2], rtol=1e-6, atol=1e-7)
        assert np.array_equal(check[rank]["all_gather_out"], np.concatenate([check[0]["all_gather_in"], check[1]["all_gather_in"]]))


def test_cli_measures_a_hand_written_row_wise_plan(tmp_path):
    from click.testing import CliRunner

    from dreamshard.cli import cli

    doc = {"format": "dreamshard.plan/3", "devices": 2, "max_memory_bytes": 10**9, "planner": "hand",
           "workload": {"batch_size": 65536, "precision": "fp32", "optimizer": "sgd"},
           "tables": [{"name": "w", "spec": W.to_dict(), "shards": [{"device": 0, "columns": [0, 96], "rows": [0, 1000]},
                                                                   {"device": 1, "columns": [0, 96], "rows": [1000, 5000]}]},
                      {"name": "n", "spec": N.to_dict(), "shards": [{"device": 0, "columns": [0, 16]}]}]}
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "report.json"
    res = CliRunner().invoke(cli, ["measure", str(path), "--backend", "torch", "--runner", "distributed", "--batch-size", "1024",
                                   "--iters", "2", "--warmup", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["runner"] == "distributed" and report["batch_size"] == 1024
    assert report["details"]["rowwise_dim"] == 96 and report["details"]["dim_sums"] == [16, 0]
    assert all(d["fwd_comm_ms"] > 0 and d["bwd_comp_ms"] > 0 for d in report["devices"])
    # an overlap is refused up front: exit 2, one line naming the file and table, nothing written
    doc["tables"][0]["shards"][1]["rows"] = [900, 5000]
    path.write_text(json.dumps(doc))
    out.unlink()
    res = CliRunner().invoke(cli, ["measure", str(path), "--backend", "torch", "--runner", "distributed", "--batch-size", "1024", "--out", str(out)])
    assert res.exit_code == 2 and "table w: shard rows [900, 5000) do not continue" in res.output and not out.exists()


def test_collectives_measured_on_gloo():
    """The calibration's measurement, tiny, on 2 CPU processes: every collective the runner issues,
    each reduce-scatter and all-gather checked for its result in the worker; a point per rank,
    pattern or size, direction and set, the held-out set apart."""
    points, info = measure_comm(2, "cpu", iters=2, warmup=1, timeout_s=120, chunk_bytes=[1 << 10], buffer_bytes=[1 << 10, 1 << 16])
    assert info["process_group"] == "gloo"
    fit = [p for p in points if p["set"] == "fit"]
    assert sorted((p["op"], p["buffer_bytes"], p["rank"]) for p in fit if p["op"] in ("reduce_scatter", "all_gather")) == sorted(
        (op, b, r) for op in ("reduce_scatter", "all_gather") for b in (1 << 10, 1 << 16) for r in (0, 1))
    assert {p["pattern"] for p in fit if p["op"] == "all_to_all"} == {"balanced", "heavy", "idle", "random"}
    assert {p["set"] for p in points} == {"fit", "held_out"} and all(p["ms"] > 0 for p in points)


# --------------------------------------------------------------------------------------------
# Grids: column ranges, each split by rows (TorchRec's grid sharding)
# --------------------------------------------------------------------------------------------


def grid_plan(workload=Workload()) -> Plan:
    """w in two column blocks, each split by rows over devices 0 and 1 (in the other order for the
    second block); n whole on device 1."""
    shards = [Shard(0, 0, 0, 48, 0, 2500), Shard(0, 1, 0, 48, 2500, 5000), Shard(0, 1, 48, 96, 0, 2500), Shard(0, 0, 48, 96, 2500, 5000), Shard(1, 1, 0, 16)]
    return Plan(task(2, workload=workload), shards, "manual")


def test_a_grid_is_a_plan_of_row_shards_of_column_blocks(tmp_path):
    plan = grid_plan()
    plan.check()
    specs = plan.device_tables()
    assert [[t.name for t in d] for d in specs] == [["w[0:48][rows 0:2500]", "w[48:96][rows 2500:5000]"], ["w[0:48][rows 2500:5000]", "w[48:96][rows 0:2500]", "n"]]
    piece = specs[0][1]
    assert isinstance(piece, RowShardSpec) and piece.dim == 48 and piece.parent.name == "w[48:96]" and piece.parent.dim == 48
    assert exchange_dims(specs) == ([0, 16], 96)  # both blocks go through the reduce-scatter: 96 columns
    assert plan.device_bytes() == [2 * 2500 * 48 * 2, 2 * 2500 * 48 * 2 + N.bytes()]
    save_plans([plan], tmp_path / "g.json")
    again = load_plans(tmp_path / "g.json")[0]
    assert again.shards == plan.shards and again.to_json() == plan.to_json()


def test_a_grids_pooled_outputs_are_the_tables():
    """Torch kernel on CPU, float64 reference: the sum over each column block's row shards of their
    pooled outputs is the table's pooled output in that block's columns."""
    from dreamshard.costs.kernels import make_tbe

    table, batch = TableSpec("t", 1000, 32, 6.0, distribution="zipf:1.2", seed=7), 128
    weights = torch.randn(table.rows, table.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lengths, indices = table_bags(table, batch, 2)
    reference = torch.stack([weights[bag].sum(0) for bag in torch.split(indices, lengths.tolist())])
    total = torch.full((batch, table.dim), float("nan"), dtype=torch.float64)  # poisoned: every column must be written
    for c0, c1 in ((0, 16), (16, 32)):
        block = torch.zeros(batch, c1 - c0, dtype=torch.float64)
        for a, b in row_cuts(table.rows, 3):
            spec = Shard(0, 0, c0, c1, a, b).spec(table)
            tbe = make_tbe("torch", [spec.rows], [spec.dim], precision="fp32", device="cpu")
            tbe.set_weights(0, weights[a:b, c0:c1].float())
            sl, si = table_bags(spec, batch, 2)
            block += tbe.forward(si, torch.cat([sl.new_zeros(1), torch.cumsum(sl, 0)])).double()
        total[:, c0:c1] = block
    assert torch.allclose(total, reference, rtol=1e-5, atol=1e-5)


def test_the_runners_and_the_simulator_measure_a_grid():
    """The simulator and both runners take a grid; the distributed runner's reduce-scatter input on
    each rank is its pieces' real pooled outputs, each in its block's columns of the buffer."""
    from dreamshard.costs.kernels import make_tbe
    from dreamshard.costs.runners import DistributedRunner, SequentialRunner
    from dreamshard.rowshard import exchange_order, rowwise_tables
    from dreamshard.streams import shard_batch

    B = 16
    plan = grid_plan(Workload(B, "fp32"))
    for r in (SimBackend().evaluate_plan(plan), SequentialRunner("torch", device="cpu", warmup=1, iters=2).evaluate_plan(plan)):
        assert all(d.fwd_comm_ms > 0 and d.bwd_comp_ms > 0 for d in r.devices)
    r = DistributedRunner("torch", "cpu", 1, 3, timeout_s=120, check_outputs=True).evaluate_plan(plan)
    assert r.details["rowwise_dim"] == 96 and r.details["dim_sums"] == [0, 16]
    check = r.details["rowwise_check"]
    tables = exchange_order(plan.device_tables())
    layout = [t.name for t in rowwise_tables([t for d in tables for t in d])]
    assert layout == ["w[0:48]", "w[48:96]"]
    rs_in = [np.array(c["reduce_scatter_in"]) for c in check]
    for rank, ts in enumerate(tables):
        tbe = make_tbe("torch", [t.rows for t in ts], [t.dim for t in ts], precision="fp32", device="cpu", seed=0)
        out = tbe.forward(*shard_batch(ts, B, step=0)).double().numpy()
        col = 0
        for t in ts:
            if isinstance(t, RowShardSpec):
                k = layout.index(t.parent.name)
                assert np.array_equal(rs_in[rank][:, 48 * k:48 * (k + 1)], out[:, col:col + t.dim])
            col += t.dim
    summed = rs_in[0] + rs_in[1]
    for rank in range(2):
        assert np.allclose(check[rank]["reduce_scatter_out"], summed[rank * B // 2:(rank + 1) * B // 2], rtol=1e-6, atol=1e-7)
