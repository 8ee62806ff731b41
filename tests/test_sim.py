"""The simulator: structure of its costs, batched = one-at-a-time, and a fit that recovers truth."""

import json

import numpy as np
import pytest

from dreamshard.costs.calibrate import ShardRecord, fit, load_records, save_records, validation_report
from dreamshard.costs.sim import BWD_TERMS, FWD_TERMS, Calibration, SimBackend, overall, table_terms
from dreamshard.families import HELD_OUT_FAMILIES
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


# --- repeated gathers against the L2 (terms.cache_hits) -------------------------------------------


def _one_bin_table(rows: int, dim: int, pooling: float, bin_index: int):
    """A table whose touched rows all fall in one reuse bin (so each is looked up BIN_MEAN times)."""
    from dreamshard.bins import NUM_BINS
    from dreamshard.tables import TableSpec

    return TableSpec("t", rows, dim, pooling, bins=tuple(1.0 if i == bin_index else 0.0 for i in range(NUM_BINS)))


def test_cache_hits_is_ches_approximation():
    """Rows that all fit: every repeat hits. Rows looked up alike: the hit rate is what the cache holds
    of them (n·(1 - exp(-c·tau)) = capacity, so 1 - exp(-c·tau) = capacity / n). Rows looked up
    more often hit more often, and a bigger cache never hits less."""
    from dreamshard.costs.terms import cache_hits

    counts = np.array([[1.0, 2.0, 48.5]])
    assert np.all(cache_hits(np.array([[100.0, 50.0, 10.0]]), counts, 160.0) == 1.0)
    alike = cache_hits(np.array([[0.0, 0.0, 1000.0]]), counts, 250.0)
    assert alike[0, 2] == pytest.approx(0.25, rel=1e-6)
    mixed = cache_hits(np.array([[0.0, 5000.0, 500.0]]), counts, 1000.0)
    assert 0 < mixed[0, 1] < mixed[0, 2] < 1
    assert np.all(cache_hits(np.array([[0.0, 5000.0, 500.0]]), counts, 2000.0) >= mixed)
    assert mixed.shape == (1, 3) and np.isfinite(mixed).all()


def test_repeats_that_miss_the_cache_are_cold_bytes():
    """A table of 440,630 rows × 256 fp16 (225 MB), each row read ~48 times: with a 60 MiB cache only
    the share the cache holds of its rows can hit; the rest of its repeats are cold bytes, and the
    total gathered bytes stay what they were. A table whose rows fit is priced as without a cache."""
    from dreamshard.costs.sim import TERMS

    wl = Workload(65_536)
    big = _one_bin_table(440_630, 256, 440_630 * 48.5 / 65_536, 6)
    small = _one_bin_table(20_000, 256, 20_000 * 48.5 / 65_536, 6)
    cols = [TERMS.index(t) for t in ("cold_bytes", "warm_bytes", "hot_bytes")]
    without, with_cache = table_terms([big, small], wl)[:, cols], table_terms([big, small], wl, 60 * 2**20)[:, cols]
    np.testing.assert_allclose(with_cache.sum(axis=1), without.sum(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(with_cache[1], without[1])
    unique, repeats = without[0, 0] / 512, without[0, 2] / 512
    held = 60 * 2**20 / 512 / unique
    assert with_cache[0, 2] == pytest.approx(repeats * held * 512, rel=1e-6)
    assert with_cache[0, 0] == pytest.approx((unique + repeats * (1 - held)) * 512, rel=1e-6)


def test_the_default_calibration_prices_the_heavy_table_that_misses_l2():
    """`heavy`'s 440,630 × 256 table of pooling 288 (seed 11 pool), alone on a device of an H200:
    forward 1.880 ms measured three times (benchmarks/results/gpu_families_shipped/loss_shards);
    the calibration before the cache priced it at 0.73 ms."""
    from dreamshard.families import synth_family

    (table,) = [t for t in synth_family("heavy", 300, 11) if t.rows == 440_630]
    measured = json.loads((FAMILY_RESULTS.parent / "gpu_families_shipped/loss_shards/loss_shards.json").read_text())
    fwd = [r["measured_fwd"] for r in measured if r["min_rows"] == 440_630 and r["tables"] == 1]
    assert len(fwd) == 3 and max(fwd) - min(fwd) < 0.01
    wl = Workload(65_536)
    assert SimBackend().shard_compute([[table]], wl)[0, 0] == pytest.approx(fwd[0], rel=0.10)
    assert SimBackend(FAMILY_CAL.parent / "h200_triton_product_path.json").shard_compute([[table]], wl)[0, 0] < 0.5 * fwd[0]


def test_bad_calibration_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("{}")
    with pytest.raises(ValueError, match="not a calibration file"):
        Calibration.load(p)


# --- the Triton kernel's terms (tiled backward) ------------------------------------------------

TRITON_SRC = __import__("pathlib").Path(__file__).parents[1] / "dreamshard/costs/kernels/triton_tbe.py"
FAMILY_RESULTS = __import__("pathlib").Path(__file__).parents[1] / "benchmarks/results/gpu_families"


def _triton_source_namespace() -> dict:
    """The kernel module's geometry constants and helpers, read from its source (it needs triton to import)."""
    import ast

    tree = ast.parse(TRITON_SRC.read_text())
    ns: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                ns[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
        elif isinstance(node, ast.FunctionDef) and node.name in ("_bwd_tile_width", "_chunk", "_dp", "_dim_class"):
            exec(compile(ast.Module([node], []), str(TRITON_SRC), "exec"), ns)
    ns["NUM_DP"] = len(ns["DP_CLASSES"])  # `len(...)` there: not a literal
    return ns


def test_triton_geometry_mirrors_the_kernel():
    from dreamshard.costs import terms as sim  # the geometry the simulator prices (and the cost net's kernel features count)

    k = _triton_source_namespace()
    for name in ("FWD_LANES", "BWD_LANES", "BWD_UP_LANES", "BWD_PMAX", "BWD_MAX_TW", "TW_CLASSES", "DP_CLASSES"):
        assert getattr(sim, name) == k[name], name
    every = np.arange(1, 1025)
    assert list(sim.fwd_class(every)) == [k["_dim_class"](int(d)) for d in every]
    dims = np.arange(4, 1025, 4)
    for whole in (False, True):
        assert [sim._block_width(int(d), whole) for d in dims] == [k["_bwd_tile_width"](int(d), whole, k["BWD_MAX_TW"]) for d in dims]
    assert list(sim._pow2(dims)) == [k["_dp"](int(d)) for d in dims]
    tw = np.array(k["TW_CLASSES"])
    assert list(sim._chunk(tw, k["BWD_LANES"])) == [k["_chunk"](int(t), k["BWD_LANES"], k["BWD_PMAX"]) for t in tw]


def _terms(tables, workload=Workload(65536)):
    from dreamshard.costs.sim import TERMS, shard_term_matrix

    return dict(zip(TERMS, shard_term_matrix([tables], workload)[0]))


def test_triton_terms_follow_the_tiles_not_a_padded_power_of_two():
    from dreamshard.tables import TableSpec

    t = {d: _terms([TableSpec("a", 10**6, d, 10.0)]) for d in (16, 64, 128, 192, 256, 1024)}
    n = 65536 * 10
    assert t[64]["tiles"] == np.ceil(n / 64)  # 64 lookups x 64 columns per tile
    assert t[16]["tiles"] == t[64]["tiles"]  # a narrow dim still costs a whole 64-lookup tile program
    assert t[128]["tiles"] == np.ceil(n / 32) and t[256]["tiles"] == np.ceil(n / 16)
    assert t[192]["tiles"] == 3 * t[64]["tiles"] < t[256]["tiles"]  # 3 blocks of 64 columns, not padded to 256
    assert t[1024]["tiles"] == 4 * t[256]["tiles"]
    assert t[192]["masked_grad_bytes"] == 0 and t[192]["masked_gather_bytes"] > 0  # exact blocks backward, masked forward tile
    odd = _terms([TableSpec("a", 10**6, 180, 10.0)])
    assert odd["masked_grad_bytes"] == odd["grad_bytes"] > 0
    # forward programs: one per 1024 // DP bags
    assert t[16]["programs"] == 65536 / 64 and t[1024]["programs"] == 65536
    assert t[256]["wide_programs"] == 0 and t[1024]["wide_programs"] == 65536


def test_triton_terms_monotone_in_lookups_and_dim():
    from dreamshard.tables import TableSpec

    cal = Calibration.load(FAMILY_CAL)
    sim = SimBackend(cal)
    for dim in (4, 16, 64, 128, 256, 1024):
        costs = [sim.shard_compute([[TableSpec("a", 10**5, dim, pf)]], Workload(65536))[0] for pf in (0.5, 2.0, 8.0, 32.0, 128.0)]
        terms = [_terms([TableSpec("a", 10**5, dim, pf)]) for pf in (0.5, 2.0, 8.0, 32.0, 128.0)]
        assert all(np.all(b >= a) for a, b in zip(costs, costs[1:])) and costs[-1].sum() > 2 * costs[0].sum()
        for name in ("lookups", "tiles", "launches", "grad_bytes"):
            assert all(b[name] >= a[name] for a, b in zip(terms, terms[1:])), name
    # wider exact (power-of-two) dims cost more; dims 4 and 8 run masked in a 16-column block, so they
    # cost no less than dim 16 (the kernel's 16-column floor), not less in proportion to their bytes
    cost = {d: sim.shard_compute([[TableSpec("a", 10**5, d, 10.0)]], Workload(65536))[0].sum() for d in (4, 8, 16, 32, 64, 128, 256, 512, 1024)}
    exact = [cost[d] for d in (16, 32, 64, 128, 256, 512, 1024)]
    assert all(b > a for a, b in zip(exact, exact[1:])) and exact[-1] > 4 * exact[0]
    assert cost[4] >= cost[16] and cost[8] >= cost[16]


def test_triton_terms_additive_except_the_shared_ones():
    from dreamshard.costs.terms import SHARD_TERMS, TERMS
    from dreamshard.tables import TableSpec

    a, b, c, w = TableSpec("a", 10**6, 64, 10.0), TableSpec("b", 10**5, 64, 30.0), TableSpec("c", 10**5, 96, 5.0), TableSpec("w", 10**5, 320, 5.0)
    ta, tb, tc, tw, tab, tac, taw = _terms([a]), _terms([b]), _terms([c]), _terms([w]), _terms([a, b]), _terms([a, c]), _terms([a, w])
    for name in TERMS:
        if name not in SHARD_TERMS:
            assert tab[name] == pytest.approx(ta[name] + tb[name]), name
    assert tab["launches"] == max(ta["launches"], tb["launches"]) < ta["launches"] + tb["launches"]  # one tile class: launches shared
    assert tac["launches"] == ta["launches"] + tc["launches"]  # 64 and 96 (masked 128-column blocks): two classes, two chains
    assert taw["launches"] == max(ta["launches"], tw["launches"])  # 320 = 5 exact 64-column blocks: the class of 64
    assert tab["wide_programs"] == 0 and taw["wide_programs"] == ta["programs"] + tw["programs"]  # dim 320 widens the whole launch
    # the gradient read out of a wide matrix: none up to 512 columns, then by log2 of the width over 512
    assert tab["wide_grad_bytes"] == 0 and taw["wide_grad_bytes"] == 0  # 128 and 384 columns
    # the forward's branches: a, b (64) one; c (96: masked 128) another; w (320: masked 512) a third
    assert tab["branch_lookups"] == 0 and tac["branch_lookups"] == pytest.approx(ta["lookups"] + tc["lookups"])
    assert _terms([a, c, w])["branch_lookups"] == pytest.approx(2 * (ta["lookups"] + tc["lookups"] + tw["lookups"]))
    wide = _terms([a, b, c, w, TableSpec("x", 10**5, 1024, 2.0)])  # 1,568 columns
    assert wide["wide_grad_bytes"] == pytest.approx(wide["grad_bytes"] * np.log2(1568 / 512))
    assert tab["launch"] == tab["active"] == 1
    # the batched pricing and the fit's term matrix agree on shared terms
    sim = SimBackend(Calibration.load(FAMILY_CAL))
    pool = [a, b, c, w, TableSpec("d", 500, 16, 50.0), TableSpec("e", 10**7, 12, 1.0)]
    placements = np.random.default_rng(3).integers(0, 3, size=(8, len(pool)))
    batch = sim.costs_batch(pool, placements, 3, Workload(65536))
    for p, cost in zip(placements, batch):
        shards = [[t for t, d in zip(pool, p) if d == dev] for dev in range(3)]
        assert np.allclose(cost[:, [0, 3]], sim.shard_compute(shards, Workload(65536)))


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_shared_terms_of_summed_rows_are_the_simulators(optimizer):
    """What the cost net makes of sums of per-table rows (terms.shared_rows, shared_terms) is each
    shard's SHARD_TERMS exactly as sim.shard_terms sets them: every family, empty devices too."""
    from dreamshard.costs.sim import shard_terms
    from dreamshard.costs.terms import SHARD_TERMS, TERMS, shared_rows, shared_terms, table_terms
    from dreamshard.families import FAMILIES, synth_family

    wl = Workload(65536, optimizer=optimizer)
    rng = np.random.default_rng(0)
    for family in FAMILIES:
        tables = synth_family(family, 60, 2)
        P, dims = table_terms(tables, wl), np.array([t.dim for t in tables])
        flat = rng.integers(0, 12, len(tables))  # 12 devices, some likely of one table, some empty
        want = shard_terms(P, flat, 12, dims, wl)[:, [TERMS.index(t) for t in SHARD_TERMS]]
        sums = np.zeros((12, len(shared_rows(P[:1], dims[:1], optimizer)[0])))
        np.add.at(sums, flat, shared_rows(P, dims, optimizer))
        np.testing.assert_allclose(np.stack(shared_terms(sums), axis=-1), want, rtol=1e-12, err_msg=family)
        assert want[:, SHARD_TERMS.index("launches")].max() > 0


def test_presence_bits_count_the_presences_of_sums():
    """The OR of rows' `presence_bits` counts, by popcount, the forward classes and the tile-class
    levels their sum has (what `shared_terms` takes min(1, ·) of), also past one 64-bit word."""
    from dreamshard.costs.terms import _FWD_AT, _LEVELS_AT, SHARED_SCALARS, SHARED_WIDTH, presence_bits, shard_terms_of, shared_terms

    rng = np.random.default_rng(0)
    rows = np.zeros((300, SHARED_WIDTH))
    rows[:, :SHARED_SCALARS] = rng.random((300, SHARED_SCALARS)) * 4
    rows[:, _FWD_AT:] = rng.random((300, SHARED_WIDTH - _FWD_AT)) < 0.02  # ~100 of the ~180 presence columns seen: two words of levels
    words, f = presence_bits(rows)
    assert words.dtype == np.uint64 and words.shape[1] - f >= 2
    groups = [rng.choice(300, size=k, replace=False) for k in (1, 5, 40, 300)]
    for g in groups:
        sums = rows[g].sum(0)
        counts = np.bitwise_count(np.bitwise_or.reduce(words[g], axis=0))
        got = shard_terms_of(sums, counts[:f].sum(), counts[f:].sum())
        np.testing.assert_allclose(got, shared_terms(sums), rtol=1e-12)
        assert counts[f:].sum() == (sums[_LEVELS_AT:] > 0).sum()


FAMILY_CAL = __import__("pathlib").Path(__file__).parents[1] / "dreamshard/data/calibrations/h200_triton_families.json"


def test_fit_recovers_known_triton_coefficients():
    from dreamshard.costs.sim import TRITON_BWD_TERMS, TRITON_FWD_TERMS
    from dreamshard.families import synth_family

    rng = np.random.default_rng(5)
    truth = Calibration.load(FAMILY_CAL)
    truth.product_path = False  # the fit models the terms alone (records measured before the product path)
    truth.fwd = {t: float(v) for t, v in zip(TRITON_FWD_TERMS, [0.004, 0.001, 6e-9, 3e-10, 2e-10, 5e-11, 1e-10, 1.5e-6, 1.2e-6, 2.5e-10])}
    truth.bwd = {t: float(v) for t, v in zip(TRITON_BWD_TERMS, [0.05, 5e-8, 3e-6, 4e-10, 1e-9, 2.5e-10, 0.007])}
    sim = SimBackend(truth)
    pool = [t for f in ("dlrm", "wide", "hot", "heavy") for t in synth_family(f, 60, 2)]
    shards = [[pool[i] for i in rng.choice(len(pool), size=rng.integers(1, 13), replace=False)] for _ in range(150)]
    pred = sim.shard_compute(shards, Workload(65536))
    records = [ShardRecord(s, 65536, "fp16", "sgd", float(f), float(b)) for s, (f, b) in zip(shards, pred)]
    cal = fit(records, "triton", truth.comm)
    assert cal.fit["terms"] == {"fwd": list(TRITON_FWD_TERMS), "bwd": list(TRITON_BWD_TERMS)} and cal.fit["total_mape"] < 0.1
    for comp, want in (("fwd", truth.fwd), ("bwd", truth.bwd)):
        got = getattr(cal, comp)
        for name, v in want.items():
            assert got[name] == pytest.approx(v, rel=0.02), (comp, name)


@pytest.mark.parametrize("held_out", ["mixed", "rmc", "din"])
def test_fit_refuses_the_held_out_families(held_out):
    from dreamshard.families import synth_family
    from dreamshard.validation import DataError

    assert held_out in HELD_OUT_FAMILIES
    tables = synth_family("dlrm", 10, 0)
    records = [ShardRecord(tables[:3], 65536, "fp16", "sgd", 0.1, 0.5, family="dlrm"), ShardRecord(tables[3:5], 65536, "fp16", "sgd", 0.1, 0.5, family=held_out)]
    with pytest.raises(DataError, match="held-out family"):
        fit(records, "triton", {"latency_ms": 0.02, "bandwidth_GBps": 100.0, "serial_fraction": 0.0, "source": "test"})


def test_family_calibration_on_the_committed_h200_records():
    """The shipped family calibration against the committed H200 validation records (gpu_families):
    the targets per family (total compute within 10%), held-out family included, and no shape bucket over 15%."""
    val = load_records(FAMILY_RESULTS / "val_records.jsonl")
    report = validation_report(Calibration.load(FAMILY_CAL), val)
    assert {b["key"] for b in report["by_family"] if b["held_out"]} == {"mixed"}
    assert all(b["mape"] <= 10 for b in report["by_family"]), report["by_family"]
    assert all(p["mape"] <= 5 for p in report["placements_by_family"]) and len(report["placements_by_family"]) == 7
    assert all(b["mape"] <= 15 for rows in report["by_bucket"].values() for b in rows)
    # and the calibration was fitted on the training families only
    assert "mixed" not in Calibration.load(FAMILY_CAL).fit["families"]


DEFAULT_CAL = FAMILY_CAL.parent / "h200_triton_tiles2.json"
CACHE_CAL = FAMILY_CAL.parent / "h200_triton_cache.json"
PRODUCT_PATH_RESULTS = FAMILY_RESULTS.parent / "gpu_families_pp"


def test_the_cache_calibration_on_the_committed_h200_records_of_the_product_path_kernel():
    """The L2-aware calibration h200_triton_cache.json (fitted to the kernel with the backward's product path, its
    forward against the H200's L2) against the committed H200 validation records of that kernel
    (gpu_families_pp): every family's total compute within 10%, the held-out one included, and no
    shape bucket over 15% (docs/costs.md)."""
    cal = Calibration.load(CACHE_CAL)
    assert cal.product_path and "mixed" not in cal.fit["families"]
    assert cal.cache_bytes == 60 * 2**20
    val = load_records(PRODUCT_PATH_RESULTS / "val_records.jsonl")
    report = validation_report(cal, val)
    assert {b["key"] for b in report["by_family"] if b["held_out"]} == {"mixed"} and len(report["placements_by_family"]) == 7
    assert all(b["mape"] <= 10 for b in report["by_family"]), report["by_family"]
    assert all(b["mape"] <= 15 for rows in report["by_bucket"].values() for b in rows)


TILES2_RESULTS = FAMILY_RESULTS.parent / "gpu_families_s16"


def test_the_default_calibration_on_the_committed_h200_records_of_todays_kernel():
    """The default, h200_triton_tiles2.json, fitted to today's kernel (its faster sorted-path backward),
    against that kernel's committed H200 validation records (gpu_families_s16, pool seed 11): every
    family's total compute within 10%, the held-out one included, fitted on the training families
    only; and the previous default (fitted to the kernel before) is the worse on the same records
    (docs/simulator.md)."""
    cal = Calibration.load(DEFAULT_CAL)
    assert SimBackend().calibration == cal
    assert cal.product_path and cal.cache_bytes == 60 * 2**20 and "mixed" not in cal.fit["families"]
    val = load_records(TILES2_RESULTS / "val_records.jsonl")
    report = validation_report(cal, val)
    assert {b["key"] for b in report["by_family"] if b["held_out"]} == {"mixed"} and len(report["by_family"]) == 7
    assert all(b["mape"] <= 10 for b in report["by_family"]), report["by_family"]
    assert report["total"]["mape"] < validation_report(Calibration.load(CACHE_CAL), val)["total"]["mape"]


H100_RESULTS = FAMILY_RESULTS.parent / "gpu_families_h100"


def test_the_h100_calibration_on_the_committed_h100_records_and_the_choice_by_gpu(monkeypatch):
    """h100_triton.json, fitted on 1 × H100 to the training families only, against the H100's
    held-out shards (pool seed 11, gpu_families_h100): total compute within 7% over all, every family
    within 11% (the three held-out ones included), better than the H200's calibration on the same
    records; by name anywhere; on a CPU the simulator takes the H200's of the docs' figures."""
    import torch  # noqa: F401 - with torch loaded the choice asks it (comm.local_gpu, patched below) for the GPU

    from dreamshard.costs import comm, sim

    cal = Calibration.load("h100_triton.json")
    assert "H100" in cal.hardware and cal.product_path and cal.cache_bytes == 50 * 2**20
    assert not set(cal.fit["families"]) & set(HELD_OUT_FAMILIES)
    val = load_records(H100_RESULTS / "val_records.jsonl")
    report = validation_report(cal, val)
    assert {b["key"] for b in report["by_family"] if b["held_out"]} == set(HELD_OUT_FAMILIES)
    assert report["total"]["mape"] <= 7 and all(b["mape"] <= 11 for b in report["by_family"]), report["by_family"]
    assert report["total"]["mape"] < validation_report(Calibration.load(DEFAULT_CAL), val)["total"]["mape"]
    monkeypatch.setattr(comm, "local_gpu", lambda: None)
    assert sim.default_calibration() == sim.DEFAULT_CALIBRATION == "h200_triton_tiles2.json"


LARGE_CASES = {  # GPU: (its calibration of large shards, the one before, its small held-out shards, the large ones' results)
    "h100": ("h100_triton_large_shards.json", "h100_triton.json", H100_RESULTS, FAMILY_RESULTS.parent / "gpu_large_shards"),
    "h200": ("h200_triton_large_shards.json", "h200_triton_tiles2.json", FAMILY_RESULTS.parent / "gpu_families_s16", FAMILY_RESULTS.parent / "gpu_large_shards_h200"),
}


@pytest.mark.parametrize("gpu", sorted(LARGE_CASES))
def test_the_calibrations_of_large_shards_on_held_out_shards_of_many_tables(gpu, monkeypatch):
    """Each GPU's default, fitted to its calibration's shards of 1–12 tables and 36 of 16–128 tables
    of the training families (gpu_large_shards' fit_records_all.jsonl), with the backward's
    `wide_grad_bytes` and the forward's `branch_lookups`: on held-out shards of 16–128 tables of
    every family (pool seed 11) and on the full 856-table pool's 8 device shards it prices compute
    closer than the calibration fitted without them, and no worse on the small held-out shards; the
    simulator takes it where that GPU is visible."""
    import torch  # noqa: F401 - with torch loaded the choice asks it (comm.local_gpu, patched below) for the GPU

    from dreamshard.costs import comm

    name, before, small_dir, large_dir = LARGE_CASES[gpu]
    new, old = Calibration.load(name), Calibration.load(before)
    assert gpu.upper() in new.hardware and new.bwd["wide_grad_bytes"] > 0 and new.fwd["branch_lookups"] > 0 and "wide_grad_bytes" not in old.bwd
    assert not set(new.fit["families"]) & set(HELD_OUT_FAMILIES)
    fitted = load_records(large_dir / "fit_records_all.jsonl")
    assert new.fit["shards"] == len(fitted) and max(len(r.tables) for r in fitted) > 100
    val = load_records(large_dir / "val_records.jsonl")
    pool = [r for r in val if r.family == "dlrm full pool"]
    many = [r for r in val if r.family != "dlrm full pool"]
    assert len(pool) == 8 and min(len(r.tables) for r in many) >= 16
    for records, bound in ((many, 5.5), (pool, 8.0)):
        ours, earlier = (validation_report(c, records)["total"]["mape"] for c in (new, old))
        assert ours <= bound and ours < earlier - 2.0, (ours, earlier)
    small = load_records(small_dir / "val_records.jsonl")
    assert validation_report(new, small)["total"]["mape"] <= validation_report(old, small)["total"]["mape"]
    if gpu == "h100":  # the H200's default is fitted to its searches' devices too (below)
        monkeypatch.setattr(comm, "local_gpu", lambda: gpu)
        assert SimBackend().calibration == new


def test_the_h200_calibration_fitted_to_the_searches_devices_prices_them_closer(monkeypatch):
    """The H200's default, fitted to the records of its large-shards calibration and to the devices
    of the searches' plans (dreamshard, neuroshard, oracle) on tasks of the training families'
    calibration pools (gpu_search_shards.py): on every device of every planner's plans of the
    development tasks (other pools, never fitted) it prices compute closer than the calibration
    without them, and no worse on the held-out families' shards; the simulator takes it on an H200."""
    import torch  # noqa: F401 - with torch loaded the choice asks it (comm.local_gpu, patched below) for the GPU

    from dreamshard.costs import comm

    results = FAMILY_RESULTS.parent
    new, old = Calibration.load("h200_triton_search_shards.json"), Calibration.load("h200_triton_large_shards.json")
    fitted = load_records(results / "gpu_large_shards_h200/fit_records_all.jsonl") + load_records(results / "gpu_search_shards_h200/calib_records.jsonl.gz")
    assert new.fit["shards"] == len(fitted) and not set(new.fit["families"]) & set(HELD_OUT_FAMILIES)
    dev = load_records(results / "gpu_search_shards_h200/val_records.jsonl.gz")
    assert len(dev) > 800 and not {r.family for r in dev} & set(HELD_OUT_FAMILIES)
    ours, earlier = (validation_report(c, dev)["total"]["mape"] for c in (new, old))
    assert ours <= 5.5 and ours < earlier - 1.5, (ours, earlier)
    for path in ("gpu_large_shards_h200/val_records.jsonl", "gpu_families_s16/val_records.jsonl"):
        held = [r for r in load_records(results / path) if r.family in HELD_OUT_FAMILIES]
        ours, earlier = (validation_report(c, held)["total"]["mape"] for c in (new, old))
        assert held and ours <= earlier, (path, ours, earlier)
    monkeypatch.setattr(comm, "local_gpu", lambda: "h200")
    assert SimBackend().calibration == new


def test_calibrate_validate_prints_families_and_buckets():
    from click.testing import CliRunner

    from dreamshard.cli import cli

    r = CliRunner().invoke(cli, ["calibrate", "--validate", str(FAMILY_CAL), "--from-records", str(FAMILY_RESULTS / "val_records.jsonl")], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "total compute by table family" in r.output and "mixed*" in r.output and "held-out family" in r.output
    for axis in ("dim", "hits", "pooling", "tables"):
        assert f"total compute by shape bucket: {axis}" in r.output



def test_a_triton_calibration_prices_hot_small_tables_by_the_kernels_product_path():
    """The Triton kernel's backward takes a count-matrix product for hot small tables (paths.py):
    under the shipped calibration (marked `product_path`) such a table's backward is that path's time plus its shard's own
    terms; a big table keeps the calibration's terms; another kernel's calibration is untouched."""
    from dreamshard.costs.paths import dense_us
    from dreamshard.costs.sim import _SHARD_ONLY, product_candidates, shard_terms
    from dreamshard.tables import TableSpec

    wl = Workload(65_536)
    hot = TableSpec(name="hot", rows=1_000, dim=256, pooling_factor=50.0, distribution="uniform")
    big = TableSpec(name="big", rows=10_000_000, dim=128, pooling_factor=30.0, distribution="zipf:1.1")
    sim = SimBackend()
    P = sim.table_terms([hot, big], wl)
    dims = np.array([256.0, 128.0])
    alone = shard_terms(P, np.array([0, 1]), 2, dims, wl)  # each table on a device of its own
    assert sim.product_path and sim.calibration.kernel == "triton"
    cand, *_, change = product_candidates([hot, big], P, sim._bwd, wl)
    assert list(cand) == [0] and change[0] < 0
    bwd = sim.shard_compute([[hot], [big]], wl)[:, 1]
    product = float(dense_us(50.0 * 65_536, 1_000, 256, 65_536, 2)) / 1000
    assert bwd[0] == pytest.approx(float(alone[0, _SHARD_ONLY] @ sim._bwd[_SHARD_ONLY]) + product, rel=1e-9)
    assert bwd[1] == pytest.approx(float(alone[1] @ sim._bwd), rel=1e-9)
    other = SimBackend("dreamshard/data/calibrations/cpu_fbgemm.json")
    assert other.shard_compute([[hot]], wl)[0, 1] == pytest.approx(float(alone[0] @ other._bwd), rel=1e-9)


def test_the_product_path_takes_the_candidates_that_save_enough_as_the_kernel_chooses():
    """paths.product_tables (the kernel's choice, and the simulator's): every candidate whose count
    matrix fits the buffer and that saves more than DENSE_TABLE_US by the path model."""
    from dreamshard.costs.paths import DENSE_TABLE_US, count_elems, dense_us, product_tables, sparse_us, takes_product

    B = 65_536
    hot = (50.0 * B, 1_000, 256)  # saves ~1 ms
    small = (0.0, 0, 0)
    # a candidate (product at most half the sorted path's time) that saves less than DENSE_TABLE_US
    for pooling in (0.3, 0.5, 1.0, 2.0, 4.0):
        n, rows, dim = pooling * B, 64, 128
        if takes_product(n, rows, dim, B, 2) and sparse_us(n, dim, 2) - dense_us(n, rows, dim, B, 2) < DENSE_TABLE_US:
            small = (n, rows, dim)
            break
    assert small[0] > 0
    lookups, rows, dims = zip(hot, small, (30.0 * B, 10**7, 128))
    # the hot table takes it, the small candidate and the big table do not
    assert product_tables(np.array(lookups), np.array(rows), np.array(dims), B, 2).tolist() == [True, False, False]
    # the count buffer holds one of the two hot tables: both take the path (in two rounds); a table
    # whose own count matrix is over the buffer does not; a threshold of inf takes every candidate that fits
    cap = int(count_elems(1_000, B))
    assert product_tables([hot[0], hot[0] * 2], [1_000, 1_000], [256, 256], B, 2, max_elems=cap).tolist() == [True, True]
    assert product_tables([hot[0], hot[0]], [1_000, 1_100], [256, 256], B, 2, max_elems=cap).tolist() == [True, False]
    assert product_tables([small[0]], [small[1]], [small[2]], B, 2, threshold=np.inf).tolist() == [True]


def test_the_product_paths_tables_run_in_rounds_that_fit_the_count_buffer():
    """paths.product_rounds: every table in exactly one round, no round over the buffer, first fit
    largest first."""
    from dreamshard.costs.paths import product_rounds

    rng = np.random.default_rng(0)
    for _ in range(200):
        cap = int(rng.integers(10, 1000))
        elems = [int(e) for e in rng.integers(1, cap + 1, size=int(rng.integers(0, 30)))]
        rounds = product_rounds(elems, cap)
        assert sorted(i for r in rounds for i in r) == list(range(len(elems)))
        used = [sum(elems[i] for i in r) for r in rounds]
        assert all(u <= cap for u in used)
        # first fit: a later round's first table did not fit any earlier one, so no two rounds together fit
        assert all(used[i] + used[j] > cap for j in range(len(rounds)) for i in range(j))
    assert product_rounds([5, 3, 4, 2], 7) == [[0, 3], [2, 1]]


def test_a_fit_of_product_path_records_recovers_the_calibration_that_made_them(tmp_path):
    """Records measured with the product path (ShardRecord.product_path): the fit prices the tables
    the path takes by its model and fits the terms to the rest, so records priced by a product-path
    calibration are fitted back exactly (and the result is marked product_path); a mix is refused."""
    from dreamshard.costs import calibrate as cal
    from dreamshard.families import synth_family
    from dreamshard.validation import DataError

    wl = Workload(65_536)
    truth = SimBackend()
    pool = synth_family("hot", 120, 10)
    rng = np.random.default_rng(0)
    shards = [[pool[i] for i in rng.choice(len(pool), size=int(rng.integers(1, 8)), replace=False)] for _ in range(80)]
    cost = truth.shard_compute(shards, wl)
    records = [cal.ShardRecord(s, wl.batch_size, wl.precision, wl.optimizer, float(f), float(b), family="hot", product_path=True) for s, (f, b) in zip(shards, cost)]
    fitted = cal.fit(records, "triton", truth.calibration.comm)
    assert fitted.product_path and fitted.fit["bwd_mape"] < 0.5 and fitted.fit["fwd_mape"] < 0.5
    assert cal.validation_report(fitted, records)["total"]["mape"] < 0.5
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    assert all(r.product_path for r in cal.load_records(path))
    records[0].product_path = False
    with pytest.raises(DataError, match="mix"):
        cal.fit(records, "triton", truth.calibration.comm)


def test_calibrate_cache_size_from_records(tmp_path):
    """`calibrate --cache-size` stores the L2 the forward is priced against; without it a fit from
    records has none (every repeat may hit); a bad size is a one-line usage error."""
    from click.testing import CliRunner

    from dreamshard.cli import cli

    records = str(PRODUCT_PATH_RESULTS / "calib_records.jsonl")
    base = ["calibrate", "--backend", "triton", "--from-records", records, "--comm-model", "dreamshard/data/comm/h200_nccl.json"]
    r = CliRunner().invoke(cli, [*base, "--cache-size", "60MiB", "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    assert Calibration.load(tmp_path / "c.json").cache_bytes == 60 * 2**20
    r = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "n.json")])
    assert r.exit_code == 0 and Calibration.load(tmp_path / "n.json").cache_bytes == 0
    r = CliRunner().invoke(cli, [*base, "--cache-size", "lots", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--cache-size" in r.output and not (tmp_path / "x.json").exists()


def test_a_calibration_file_with_bad_numbers_is_refused_in_one_line(tmp_path):
    """Coefficients, batch size, cache and the all-to-all model are checked where the file is read:
    a one-line error naming the key, never a traceback from the arithmetic later."""
    from click.testing import CliRunner

    from dreamshard.cli import cli
    from dreamshard.validation import DataError

    good = json.loads(DEFAULT_CAL.read_text())
    for key, change, msg in (("cache_bytes", "lots", "cache_bytes"), ("cache_bytes", -1, "cache_bytes"), ("fwd", {**good["fwd"], "launch": "x"}, "fwd.launch"),
                             ("bwd", [1.0], "bwd coefficients"), ("batch_size", 0, "batch_size"),
                             ("comm", {**good["comm"], "bandwidth_GBps": 0}, "bandwidth"), ("comm", {}, "latency_ms"), ("product_path", "yes", "product_path")):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**good, key: change}))
        with pytest.raises(DataError, match=msg) as e:
            Calibration.load(path)
        assert "\n" not in str(e.value)
    r = CliRunner().invoke(cli, ["calibrate", "--validate", str(tmp_path / "cache_bytes.json"), "--from-records", str(PRODUCT_PATH_RESULTS / "val_records.jsonl")])
    assert r.exit_code == 2 and "cache_bytes" in r.output and "Traceback" not in r.output
    assert Calibration.load(DEFAULT_CAL).fwd == good["fwd"]  # a good file loads as written


def test_calibrate_embeds_a_host_link_file_and_refuses_a_bad_one(tmp_path):
    """`dreamshard calibrate --host-link FILE` writes FILE's host-memory terms into the fitted
    calibration as the simulator reads them; a file that is not such an object is one line."""
    from click.testing import CliRunner

    from dreamshard.cli import cli

    link = LARGE_CASES["h200"][3].parent / "gpu_tiers_h200" / "host_link.json"
    out = tmp_path / "cal.json"
    args = ["calibrate", "--backend", "triton", "--device", "cuda", "--from-records", str(FAMILY_RESULTS / "calib_records.jsonl"), "--out", str(out)]
    r = CliRunner().invoke(cli, args + ["--host-link", str(link)])
    assert r.exit_code == 0, r.output
    cal = Calibration.load(out)
    assert cal.host == json.loads(link.read_text()) and SimBackend(cal).host_link.tlb_miss_ns == pytest.approx(cal.host["tlb_miss_ns"])
    bad = tmp_path / "bad.json"
    bad.write_text('{"prefetch_fixed_ms": "soon"}')
    r = CliRunner().invoke(cli, args + ["--host-link", str(bad)])
    assert r.exit_code != 0 and r.output.count("\n") == 1 and "host.prefetch_fixed_ms" in r.output, r.output


def test_the_h200_default_is_refit_from_its_committed_records(tmp_path):
    """The recipe of benchmarks/README.md: `calibrate` with two record files (--from-records
    repeated, fitted as one) makes the shipped H200 calibration again, coefficient for coefficient."""
    from click.testing import CliRunner

    from dreamshard.cli import cli

    results = FAMILY_RESULTS.parent
    out = tmp_path / "cal.json"
    r = CliRunner().invoke(cli, ["calibrate", "--backend", "triton", "--device", "cuda", "--from-records", str(results / "gpu_large_shards_h200/fit_records_all.jsonl"),
                                 "--from-records", str(results / "gpu_search_shards_h200/calib_records.jsonl.gz"), "--comm-model", "dreamshard/data/comm/h200_nccl.json",
                                 "--cache-size", "62914560", "--host-link", str(results / "gpu_tiers_h200/host_fit/host_link.json"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    made, shipped = Calibration.load(out), Calibration.load("h200_triton_search_shards.json")
    for part in ("fwd", "bwd"):
        assert getattr(made, part) == pytest.approx(getattr(shipped, part), rel=1e-9)
    assert made.host == shipped.host and made.fit["shards"] == shipped.fit["shards"] == 604
