"""The simulator: structure of its costs, batched = one-at-a-time, and a fit that recovers truth."""

import numpy as np
import pytest

from dreamshard.costs.calibrate import ShardRecord, fit, load_records, save_records, validation_report
from dreamshard.costs.sim import BWD_TERMS, FWD_TERMS, Calibration, SimBackend, overall, table_terms
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.tasks import Workload

POOL = synth_pool(PoolConfig(tables=120, seed=4))


def test_report_components_and_label():
    sim = SimBackend()
    shards = [POOL[:10], POOL[10:25], []]
    r = sim.evaluate(shards, Workload(65536))
    assert len(r.devices) == 3 and r.runner == "sim" and r.source.startswith("simulated (")
    assert r.overall_ms == max(d.total_ms for d in r.devices)
    assert r.devices[2].fwd_comp_ms == r.devices[2].bwd_comp_ms == 0  # nothing placed, nothing computed
    assert r.devices[2].fwd_comm_ms > 0  # but it still receives its samples' columns
    one = sim.evaluate([POOL[:10]], Workload(65536))
    assert one.devices[0].fwd_comm_ms == one.devices[0].bwd_comm_ms == 0  # one device: no all-to-all


def test_fusion_is_subadditive_and_costs_grow_with_work():
    sim = SimBackend()
    a, b = POOL[:8], POOL[8:16]
    fa, fb, fab = (sim.shard_compute([s], Workload(65536))[0] for s in (a, b, a + b))
    assert np.all(fab < fa + fb)  # one launch for the fused shard
    assert np.all(fab > np.maximum(fa, fb))
    small, big = sim.shard_compute([a], Workload(8192))[0], sim.shard_compute([a], Workload(65536))[0]
    assert np.all(big > small)


def test_batched_equals_one_at_a_time():
    sim = SimBackend()
    tables = POOL[:40]
    rng = np.random.default_rng(0)
    placements = rng.integers(0, 5, size=(16, 40))
    batch = sim.costs_batch(tables, placements, 5, Workload(65536))
    for p, c in zip(placements, batch):
        shards = [[t for t, d in zip(tables, p) if d == dev] for dev in range(5)]
        r = sim.evaluate(shards, Workload(65536))
        assert np.allclose(c, [[d.fwd_comp_ms, d.fwd_comm_ms, d.bwd_comm_ms, d.bwd_comp_ms] for d in r.devices])
    assert np.allclose(overall(batch), [max(row.sum(-1)) for row in batch])


def test_fit_recovers_a_known_calibration(tmp_path):
    rng = np.random.default_rng(1)
    truth = Calibration(
        hardware="test", kernel="test", batch_size=65536,
        fwd={t: float(v) for t, v in zip(FWD_TERMS, [0.01, 0.002, 1e-9, 3e-10, 1e-10, 5e-11, 2e-10])},
        bwd={t: float(v) for t, v in zip(BWD_TERMS, [0.002, 0.03, 0.001, 8e-9, 1e-10, 4e-10, 2e-10, 1e-10])},
        comm={"latency_ms": 0.02, "bandwidth_GBps": 100.0, "serial_fraction": 0.0, "source": "test"},
    )
    sim = SimBackend(truth)
    shards = [[POOL[i] for i in rng.choice(len(POOL), size=rng.integers(1, 30), replace=False)] for _ in range(80)]
    pred = sim.shard_compute(shards, Workload(65536))
    noise = rng.normal(1, 0.02, size=pred.shape)  # 2% measurement noise
    records = [ShardRecord(s, 65536, "fp16", "sgd", float(f), float(b)) for s, (f, b) in zip(shards, pred * noise)]
    save_records(records, tmp_path / "r.jsonl")
    records = load_records(tmp_path / "r.jsonl")
    cal = fit(records, "test", truth.comm)
    assert cal.fit["total_mape"] < 4
    held_out = [[POOL[i] for i in rng.choice(len(POOL), size=rng.integers(1, 30), replace=False)] for _ in range(40)]
    truth_pred = sim.shard_compute(held_out, Workload(65536))
    report = validation_report(cal, [ShardRecord(s, 65536, "fp16", "sgd", float(f), float(b)) for s, (f, b) in zip(held_out, truth_pred)])
    assert report["total"]["mape"] < 4 and report["total"]["spearman"] > 0.98
    assert sum(b["shards"] for b in report["by_size"]) == report["shards"] == 40
    assert all(b["mape"] < 6 for b in report["by_size"])


def test_terms_small_dims_move_a_whole_sector():
    from dreamshard.tables import TableSpec

    t4, t16 = TableSpec("a", 1000, 4, 10.0), TableSpec("b", 1000, 16, 10.0)
    T = table_terms([t4, t16], Workload(1024))
    from dreamshard.costs.sim import TERMS

    g = TERMS.index("grad_bytes")
    assert T[0, g] == T[1, g]  # 8-byte and 32-byte rows both cost one 32-byte sector


def test_bad_calibration_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("{}")
    with pytest.raises(ValueError, match="not a calibration file"):
        Calibration.load(p)
