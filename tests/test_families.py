"""Table families (dreamshard/families.py): determinism, limits, each family's documented shape, the
`dlrm` family unchanged, tasks drawn from a family pool, the simulator pricing every family."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dreamshard.costs.sim import SimBackend
from dreamshard.families import (
    CRITEO_MULTI_HOT,
    CRITEO_ROWS,
    FAMILIES,
    HELD_OUT_FAMILIES,
    MAX_TABLE_BYTES,
    RMC_MODELS,
    TAOBAO_DIM,
    TAOBAO_SEQUENCE,
    TAOBAO_SEQUENCE_MAX,
    TAOBAO_TABLES,
    TRAINING_FAMILIES,
    family_of,
    hits_per_row,
    shard_bucket,
    span_tables,
    synth_family,
    table_buckets,
)
from dreamshard.synth import PoolConfig, pool_stats, published_stats, synth_pool, write_pool
from dreamshard.tables import TableSpec, load_tables, save_tables
from dreamshard.tasks import Workload, sample_tasks, split_pool
from dreamshard.validation import DIM_MULTIPLE, MAX_DIM, MAX_POOLING_FACTOR, MAX_ROWS, MAX_SEED, MIN_DIM, InputError

N = 200  # tables per family pool in these tests (the default counts are 788–856)
POOLS = {name: synth_family(name, N, seed=3) for name in FAMILIES}


def _arrays(tables):
    return (np.array([t.dim for t in tables]), np.array([t.rows for t in tables]), np.array([t.pooling_factor for t in tables]))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_is_deterministic_and_seeded(name):
    assert synth_family(name, N, seed=3) == POOLS[name]
    other = synth_family(name, N, seed=4)
    assert other != POOLS[name]
    # stream seeds are distinct within a pool, so no two tables replay one stream
    assert len({t.seed for t in POOLS[name]}) == N


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_within_limits_and_named(name):
    tables = POOLS[name]
    dims, rows, pf = _arrays(tables)
    assert len(tables) == N and len({t.name for t in tables}) == N
    assert ((dims >= MIN_DIM) & (dims <= MAX_DIM) & (dims % DIM_MULTIPLE == 0)).all()
    assert ((rows >= 1) & (rows <= MAX_ROWS)).all() and ((pf >= 0) & (pf <= MAX_POOLING_FACTOR)).all()
    assert all(0 <= t.seed <= MAX_SEED for t in tables)
    assert all(family_of(t.name) == name for t in tables)
    if name in ("wide", "hot", "heavy", "mixed", "rmc", "din"):  # the DLRM pools and onehot keep their published sizes (10 GB tables)
        assert max(t.bytes() for t in tables) <= MAX_TABLE_BYTES


def test_dlrm_family_is_the_old_pool(tmp_path):
    """The `dlrm` family is synth_pool's pool, and that pool does not drift: the shipped model, the
    calibration records and every test depend on these tables. Its drawn fields are checked byte
    for byte; its reuse bins (numpy's vectorised log/exp, whose last bits differ between CPUs'
    SIMD paths: an AVX-512 machine and an AVX2 one disagree in the 16th digit) by their per-bin
    sums over the pool, to 1e-8."""
    old = {(856, 0): ("a8d96d06e4b21f220079b29b80561518060f11930ae6f0a69e53c44410436a82",
                      [338.3354379, 63.38383976, 53.88668714, 49.84781926, 48.50677546, 41.46368511, 40.75058916, 39.28343319, 40.6713872,
                       33.9932219, 28.35713645, 26.25820133, 16.63270755, 11.19182256, 3.563587363, 2.356323993, 0.5173446552]),
           (100, 3): ("ad2063b7b0d1f0e2dff495eed96a5b4335645ab6c905d42f0d38cec532908259",
                      [37.24456979, 7.04601791, 5.699908398, 5.139925182, 5.061737296, 5.4943676, 4.060908384, 4.923104266, 5.009944015,
                       3.986197587, 3.59104415, 3.38756917, 4.86318845, 1.485648733, 0.6392531379, 0.2574956313, 0.109120297]),
           (37, 12345): ("6b7678b48606b5b8b722534fa732c69f3f90552a96b116dbc00a381f64f6f565",
                         [10.86272479, 3.313188941, 3.538600641, 4.078065159, 3.62969699, 1.729383652, 1.430984439, 1.706102621, 1.40397219,
                          1.075582151, 1.634843568, 1.924235384, 0.428559733, 0.162080808, 0.066812226, 0.01516670257, 0.0])}
    for (n, seed), (digest, bin_sums) in old.items():
        tables = synth_family("dlrm", n, seed)
        drawn = [(t.name, t.rows, t.dim, t.pooling_factor, t.distribution, t.seed) for t in tables]
        assert hashlib.sha256(repr(drawn).encode()).hexdigest() == digest
        np.testing.assert_allclose(np.array([t.bins for t in tables]).sum(axis=0), bin_sums, rtol=1e-8, atol=1e-9)
        assert tables == synth_pool(PoolConfig(tables=n, seed=seed))


def test_span_tables_cover_the_accepted_shapes_and_are_no_family():
    """The cost net's prior draws them (Config.prior_span): seeded, spread over the kernel's dims,
    rows and pooling the tool accepts, every table named outside the families."""
    tables = span_tables(300, 0)
    assert tables == span_tables(300, 0) and tables != span_tables(300, 1)
    dims, rows, pf = _arrays(tables)
    assert ((dims >= MIN_DIM) & (dims <= MAX_DIM) & (dims % DIM_MULTIPLE == 0)).all() and dims.min() <= 8 and dims.max() >= 512
    assert rows.min() < 1_000 and rows.max() > 10**7 and max(t.bytes() for t in tables) <= MAX_TABLE_BYTES
    assert pf.min() < 0.5 and pf.max() > 100
    assert all(family_of(t.name) is None for t in tables)


def test_wide_has_wide_and_odd_dims():
    dims, _, _ = _arrays(POOLS["wide"])
    assert (dims > 256).mean() > 0.2 and dims.max() == 1024
    odd = dims[(dims & (dims - 1)) != 0]
    assert len(odd) > 0.5 * N and {12, 24, 48, 96, 192, 320, 384, 768} & set(odd.tolist())


def test_hot_tables_are_tiny_and_reread():
    dims, rows, pf = _arrays(POOLS["hot"])
    hits = hits_per_row(POOLS["hot"])
    assert rows.max() <= 10**4 and rows.min() >= 100
    assert hits.min() > 100 and np.median(hits) > 1000  # every touched row is read ≫ 100 times a batch
    assert (pf * 65_536).min() >= 10**6  # millions of lookups a batch


def test_heavy_pooling_is_lognormal_with_a_tail():
    _, _, pf = _arrays(POOLS["heavy"])
    assert 20 <= np.median(pf) <= 45 and pf.max() <= 300 and np.quantile(pf, 0.95) > 100
    other = np.concatenate([_arrays(POOLS[n])[2] for n in ("dlrm", "wide")])
    assert np.median(pf) > 5 * np.median(other)


def test_onehot_is_the_mlperf_dcnv2_tables():
    tables = synth_family("onehot", 52, seed=0)
    dims, rows, pf = _arrays(tables)
    assert (dims == 128).all()
    assert rows[:26].tolist() == list(CRITEO_ROWS) and pf[:26].tolist() == list(map(float, CRITEO_MULTI_HOT))
    assert (pf[26:] == 1.0).all()  # the one-hot copies
    assert 3.5e7 <= rows.max() <= 4.5e7 and (np.abs(rows[26:] / rows[:26] - 1) <= 0.106).all()


def test_held_out_families_are_apart_from_the_training_ones():
    assert HELD_OUT_FAMILIES == ("mixed", "rmc", "din") and set(HELD_OUT_FAMILIES) <= set(FAMILIES)
    assert not set(TRAINING_FAMILIES) & set(HELD_OUT_FAMILIES) and set(TRAINING_FAMILIES) | set(HELD_OUT_FAMILIES) == set(FAMILIES)
    assert list(FAMILIES)[-len(HELD_OUT_FAMILIES):] == list(HELD_OUT_FAMILIES)  # appended: the training families' campaign seeds stay


def test_mixed_is_the_probe():
    dims, rows, pf = _arrays(POOLS["mixed"])
    assert {24, 48, 96, 192} <= set(dims.tolist()) and dims.max() <= 256
    assert rows.min() >= 10**2 and rows.max() <= 5 * 10**7
    assert (hits_per_row(POOLS["mixed"]) > 100).mean() > 0.05  # some tiny hot tables


def test_rmc_is_meta_rmc1_to_3_as_deeprecsys_configures_them():
    """The published numbers (DeepRecSys models/configs/dlrm_rm{1,2,3}.json) are in the pool: copy 0
    is the 50 tables exactly, every table's dim and lookups are its model's, rows within ±10%."""
    per = sum(m[1] for m in RMC_MODELS)
    assert per == 50
    tables = synth_family("rmc", 3 * per, seed=0)
    dims, rows, pf = _arrays(tables)
    published = [(rows_, dim, lookups) for _, count, rows_, dim, lookups in RMC_MODELS for _ in range(count)]
    assert list(zip(rows[:per].tolist(), dims[:per].tolist(), pf[:per].tolist())) == published
    assert {(8, 4_000_000, 32, 80.0), (32, 500_000, 64, 120.0), (10, 2_000_000, 32, 20.0)} == \
        {(int(((rows[:per] == r) & (dims[:per] == d) & (pf[:per] == p)).sum()), r, d, p) for r, d, p in published}
    base = np.array(published * 3)
    assert (dims == base[:, 1]).all() and (pf == base[:, 2]).all() and (np.abs(rows / base[:, 0] - 1) <= 0.106).all()
    assert (rows[per:] != base[per:, 0]).mean() > 0.9  # later copies are other tables
    # the default pool: 17 copies and the start of an 18th, every table within its model's numbers
    dims, rows, pf = _arrays(synth_family("rmc", seed=3))
    assert set(dims.tolist()) == {32, 64} and set(pf.tolist()) == {20.0, 80.0, 120.0}
    assert 0.9 * 500_000 <= rows.min() and rows.max() <= 1.106 * 4_000_000


def test_din_is_the_taobao_din_as_torcheasyrec_configures_it():
    """The published numbers (TorchEasyRec examples/multi_tower_din_taobao.config) are in the pool:
    copy 0 is the 19 tables exactly (16 one-hot id features, 3 behaviour sequences of 50 clicks),
    dim 16 throughout; later copies jitter the rows by ±10% and draw one sequence length each."""
    per = len(TAOBAO_TABLES)
    assert per == 19 and sum(t[2] is None for t in TAOBAO_TABLES) == 3
    tables = synth_family("din", 40 * per, seed=0)
    dims, rows, pf = _arrays(tables)
    assert (dims == TAOBAO_DIM).all() and TAOBAO_DIM == 16
    assert rows[:per].tolist() == [t[1] for t in TAOBAO_TABLES]
    assert {t[1] for t in TAOBAO_TABLES} >= {1_141_730, 846_812, 461_498, 423_438, 255_877, 12_961, 99, 20, 3}
    sequence = np.array([t[2] is None for t in TAOBAO_TABLES] * 40)
    assert (pf[:per][~sequence[:per]] == 1).all() and (pf[:per][sequence[:per]] == TAOBAO_SEQUENCE).all()
    assert (pf[~sequence] == 1).all()
    lengths = pf[sequence].reshape(40, 3)
    assert (lengths == lengths[:, :1]).all()  # a copy's three sequences are one user's clicks
    assert lengths.min() >= 10 and lengths.max() <= TAOBAO_SEQUENCE_MAX and len(set(lengths[:, 0].tolist())) == 40
    base = np.array([t[1] for t in TAOBAO_TABLES] * 40)
    assert (np.abs(rows / base - 1) <= 0.106 + 1 / base).all()  # ±10%, rounded to whole rows
    # a tiny table is read thousands of times per row in a batch; a sequence table 50 times per sample
    assert hits_per_row(tables[:per]).max() > 10**4


@pytest.mark.parametrize("name", ["rmc", "din"])
def test_new_held_out_families_draw_tasks_at_the_campaigns_settings(name):
    """40–120 tables on 4 and 8 devices at 16–24 GB per device, from the pools the campaigns draw
    from: the default pool's test half and a 300-table pool of seed 11."""
    for pool in (split_pool(synth_family(name, seed=11), 0)[1], synth_family(name, 300, 11)):
        for tables, devices, gigabytes in ((40, 4, 16), (80, 8, 24), (120, 8, 16), (120, 4, 24)):
            tasks = sample_tasks(pool, 3, (tables, tables), devices, gigabytes * 10**9, seed=5, workload=Workload())
            assert len(tasks) == 3 and all(len(t.tables) == tables for t in tasks)
            assert all(sum(x.bytes() for x in t.tables) <= devices * gigabytes * 10**9 for t in tasks)


@pytest.mark.parametrize("name", HELD_OUT_FAMILIES)
def test_calibrate_refuses_every_held_out_family(name, tmp_path):
    """Records of a held-out family, said in the record or read off its tables' names, are refused
    with one line naming the family; the same records of a training family fit."""
    from click.testing import CliRunner

    from dreamshard.cli import cli
    from dreamshard.costs.calibrate import ShardRecord, fit
    from dreamshard.validation import DataError

    train = synth_family("dlrm", 60, 0)
    held = synth_family(name, 6, 0)
    shards = [train[i:i + 1 + i % 4] for i in range(0, 60, 3)]
    priced = SimBackend().shard_compute(shards, Workload(65536))
    ok = [ShardRecord(s, 65536, "fp16", "sgd", float(f), float(b), family="dlrm") for s, (f, b) in zip(shards, priced)]
    comm = {"latency_ms": 0.02, "bandwidth_GBps": 100.0, "serial_fraction": 0.0, "source": "test"}
    assert fit(ok, "triton", comm).fit["families"] == ["dlrm"]
    for said in (name, None):
        bad = ok + [ShardRecord(held[:2], 65536, "fp16", "sgd", 0.1, 0.5, family=said)]
        with pytest.raises(DataError, match=f"held-out family \\({name}\\)") as e:
            fit(bad, "triton", comm)
        assert "\n" not in str(e.value)
    # and through the command line: the one-line error, no traceback
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in bad))
    r = CliRunner().invoke(cli, ["calibrate", "--backend", "triton", "--from-records", str(path), "--out", str(tmp_path / "cal.json")])
    assert r.exit_code != 0 and "held-out family" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "cal.json").exists()


def test_dlrm2022_is_fitted_to_the_2022_stats():
    ref = published_stats("2022")
    tables = synth_family("dlrm2022", seed=0)
    mine = pool_stats(tables, ref.batch_size)  # bins are defined at 65,536; the stats at the file's batch
    assert len(tables) == ref.tables == 788
    assert abs(mine.lookups_per_table_sample / ref.lookups_per_table_sample - 1) < 0.01
    assert np.abs(np.array(mine.lookup_hist) - ref.lookup_hist).sum() < 0.15
    # and it is not the 2021 pool renamed
    assert [t.rows for t in tables[:50]] != [t.rows for t in synth_pool(PoolConfig(tables=50, seed=0))]


def test_bad_family_arguments_are_one_line_input_errors():
    for kwargs in ({"name": "nope"}, {"name": "wide", "tables": 0}, {"name": "wide", "tables": 2.5}, {"name": "hot", "seed": -1}):
        with pytest.raises(InputError) as e:
            synth_family(**kwargs)
        assert "\n" not in str(e.value)


def test_family_pool_round_trips_and_draws_tasks(tmp_path):
    pool = tmp_path / "wide"
    write_pool(POOLS["wide"], pool, PoolConfig(tables=N, seed=3), family="wide")
    back = load_tables(pool / "tables.csv")
    # a table file keeps bins to 6 significant digits; everything else reads back exactly
    assert [(t.name, t.rows, t.dim, t.pooling_factor, t.distribution, t.seed) for t in back] == \
        [(t.name, t.rows, t.dim, t.pooling_factor, t.distribution, t.seed) for t in POOLS["wide"]]
    assert np.allclose([t.bins for t in back], [t.bins for t in POOLS["wide"]], rtol=1e-5, atol=1e-9)
    assert json.loads((pool / "pool.json").read_text())["family"] == "wide"
    # `data tasks` works unchanged on a family pool
    out = tmp_path / "tasks"
    r = subprocess.run([sys.executable, "-m", "dreamshard.cli", "data", "tasks", "--pool", str(pool), "--tables", "20", "--devices", "4",
                        "--max-memory", "16GB", "--num-train", "3", "--num-test", "3", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = (out / "test.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(len(json.loads(x)["tables"]) == 20 for x in lines)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_simulator_prices_every_family(name):
    tables = POOLS[name]
    sim = SimBackend()
    comp = sim.shard_compute([[t] for t in tables])
    assert np.isfinite(comp).all() and (comp >= 0).all()
    assert (comp[np.array([t.pooling_factor > 0 for t in tables])].sum(axis=1) > 0).all()
    placeable = [t for t in tables if t.bytes() <= 10 * 10**9]
    _, test_half = split_pool(placeable, 0)
    task = sample_tasks(test_half, 1, (10, 10), 4, 40 * 10**9, seed=1, workload=Workload())[0]
    report = sim.evaluate([task.tables[i::4] for i in range(4)])
    assert np.isfinite(report.overall_ms) and report.overall_ms > 0


def test_shape_buckets_cover_the_axes():
    all_tables = [t for name in FAMILIES for t in POOLS[name]]
    buckets = table_buckets(all_tables)
    assert {b["dim"] for b in buckets} == {"dim 0–32", "dim 32–128", "dim 128–256", "dim >256"}
    assert {b["hits"] for b in buckets} == {"hits/row 0–2", "hits/row 2–16", "hits/row 16–256", "hits/row >256"}
    assert len({b["pooling"] for b in buckets}) == 4
    hot = POOLS["hot"][0]
    assert table_buckets([hot])[0]["hits"] == "hits/row >256" or hits_per_row([hot])[0] <= 256
    # a shard takes the bucket of the table that moves the most bytes, and says it is fused
    wide = max(POOLS["wide"], key=lambda t: t.dim * t.pooling_factor)
    small = TableSpec("x", 1000, 4, 0.5, distribution="uniform")
    b = shard_bucket([small, wide])
    assert b["dim"] == table_buckets([wide])[0]["dim"] and b["tables"] == "2–12"


GPU_SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_families.py"


@pytest.mark.long  # training or a campaign dry run, 10-25 s alone: make test-long
def test_gpu_campaign_logic_on_cpu(tmp_path):
    """benchmarks/gpu_families.py --device cpu --quick: every family measured and priced, the
    held-out families never in the calibration records, records that `calibrate` reads, and a
    time box that still leaves a summary."""
    from dreamshard.costs.calibrate import fit, load_records, validation_report
    from dreamshard.validation import DataError

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(GPU_SCRIPT), "--out", str(out), "--device", "cpu", "--quick"], capture_output=True, text=True, timeout=1800)  # a hang guard only: a busy machine may take minutes
    assert r.returncode == 0, r.stderr[-2000:]
    import csv

    shards = list(csv.DictReader((out / "shards.csv").open()))
    assert {row["family"] for row in shards} == set(FAMILIES)
    assert all(float(row["measured_fwd_ms"]) > 0 and float(row["sim_bwd_ms"]) > 0 for row in shards)
    calib, val = load_records(out / "calib_records.jsonl"), load_records(out / "val_records.jsonl")
    assert {x.family for x in calib} == set(TRAINING_FAMILIES) and set(HELD_OUT_FAMILIES) <= {x.family for x in val}
    plans = list(csv.DictReader((out / "placements.csv").open()))
    # --quick caps a device at 64 MiB and takes tables of at most half of it: none of rmc's (58–282 MB)
    unplaceable = {f for f in FAMILIES if not any(t.bytes() <= 32 * 2**20 for t in synth_family(f, 60, 11))}
    assert unplaceable == {"rmc"}
    assert {row["family"] for row in plans} == set(FAMILIES) - unplaceable and all(float(row["measured_ms"]) > 0 for row in plans)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["phase"] == "done" and summary["held_out_families"] == list(HELD_OUT_FAMILIES)
    assert len(summary["errors"]) == 1 and summary["errors"][0].startswith("rmc: no placeable task")
    report = validation_report(SimBackend().calibration, val)
    assert {b["key"] for b in report["by_family"]} == set(FAMILIES)
    assert {b["key"] for b in report["by_family"] if b["held_out"]} == set(HELD_OUT_FAMILIES)
    assert {p["key"] for p in report["placements_by_family"] if p["held_out"]} == set(HELD_OUT_FAMILIES) - unplaceable
    assert {row["family"] for row in shards if row["held_out"] == "True"} == set(HELD_OUT_FAMILIES)
    assert sum(b["shards"] for b in report["by_bucket"]["dim"]) == report["shards"]
    assert {p["key"] for p in report["placements_by_family"]} == set(FAMILIES) - unplaceable
    with pytest.raises(DataError, match="held-out family"):  # nothing is calibrated on it
        fit(val, "torch", {"latency_ms": 0.1, "bandwidth_GBps": 1.0})
    # a spent budget: no shard, no plan, still a summary saying so
    r = subprocess.run([sys.executable, str(GPU_SCRIPT), "--out", str(tmp_path / "cut"), "--device", "cpu", "--quick", "--budget-s", "0.001"],
                       capture_output=True, text=True, timeout=1800)  # a hang guard only
    assert r.returncode == 0, r.stderr[-2000:]
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert cut["phase"] == "done" and cut["plans"] == [] and all(v == {"calib": 0, "val": 0} for v in cut["shards"].values())


def test_cli_family_choices_are_the_registry():
    from dreamshard.cli import FAMILY_NAMES, HELD_OUT_NAMES

    assert FAMILY_NAMES == list(FAMILIES) and HELD_OUT_NAMES == list(HELD_OUT_FAMILIES)


def test_cli_synth_writes_a_family_pool(tmp_path):
    from click.testing import CliRunner

    from dreamshard.cli import cli
    from dreamshard.tables import load_tables

    r = CliRunner().invoke(cli, ["data", "synth", "--family", "hot", "--tables", "12", "--seed", "3", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert [t.name for t in load_tables(tmp_path / "tables.csv")] == [t.name for t in synth_family("hot", 12, 3)]


def test_pools_do_not_depend_on_how_the_cpu_sorts_ties(monkeypatch):
    """numpy's default sort breaks ties by the CPU's SIMD path (an AVX-512 machine drew another
    dlrm pool of seed 11 than this one: archetypes of equal weight tie in the apportionment). With
    the default sort made to break ties the other way, every family's pool is unchanged."""
    import dreamshard.synth as synth

    real = np.argsort

    def reversed_ties(a, *args, kind=None, **kw):
        if kind == "stable" or np.ndim(a) != 1:
            return real(a, *args, kind=kind, **kw)
        return np.lexsort((-np.arange(len(a)), np.asarray(a)))  # equal values: the last first

    for name in FAMILIES:
        before = synth_family(name, 300, 11)
        with monkeypatch.context() as m:
            m.setattr(synth.np, "argsort", reversed_ties)
            assert synth_family(name, 300, 11) == before, name


def test_held_out_campaign_plans_every_held_out_family():
    """benchmarks/heldout.py plans tasks of every held-out family, and only of them."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "heldout.py"
    spec = importlib.util.spec_from_file_location("heldout", script)
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    assert h.HELD_OUT_FAMILIES == HELD_OUT_FAMILIES
    for family in HELD_OUT_FAMILIES:
        for setting, (tables, devices, _) in h.SETTINGS.items():
            tasks = h.tasks_of(family, setting, 1)
            assert len(tasks[0].tables) == tables and tasks[0].devices == devices
            assert {family_of(t.name) for t in tasks[0].tables} == {family}




@pytest.mark.long  # a campaign dry run, ~30 s: make test-long
def test_search_shards_campaign_logic_on_cpu(tmp_path):
    """benchmarks/gpu_search_shards.py --device cpu --quick: the devices of the calibration tasks'
    plans (heldout.py plan --calib) and the training families' pairs are fit records, the pairs of
    every family and the devices of other plans validation; `calibrate` reads them."""
    from dreamshard.costs.calibrate import load_records

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    plans = tmp_path / "fit"
    subprocess.run([sys.executable, str(bench / "heldout.py"), "plan", "--quick", "--calib", "--out", str(plans), "--again", "lookup --split"],
                   capture_output=True, text=True, check=True)
    out = tmp_path / "run"
    path = str(plans / "plans.jsonl.gz")
    r = subprocess.run([sys.executable, str(bench / "gpu_search_shards.py"), "--out", str(out), "--device", "cpu", "--quick", "--fit-plans", path, "--plans", path,
                        "--min-cuts", "0"], capture_output=True, text=True, timeout=1800)  # a hang guard only
    assert r.returncode == 0, r.stderr[-2000:]
    fit, val = load_records(out / "calib_records.jsonl"), load_records(out / "val_records.jsonl")
    # --quick caps a shard at 100 MB: rmc's tables (58–282 MB) make none
    assert {x.family for x in fit} == set(TRAINING_FAMILIES) and set(HELD_OUT_FAMILIES) - {"rmc"} <= {x.family for x in val}
    assert sum(x.family == "dlrm" for x in fit) == 4 + 2  # the plan's devices (4 at most in --quick), one pair
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert all(row["fwd_ms"] > 0 and row["sim_bwd_ms"] > 0 for row in rows)
