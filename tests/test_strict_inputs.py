"""Records, plans, tables and options as strict as table files were made (issue 34): calibration
records validated line by line and key by key, JSON numbers that are strings refused, duplicate
CSV columns refused, every family's documented seed range honoured, and the messages that say
what a file is (a pretty-printed plan given as tasks, a raw pickle given as a model)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from dreamshard.cli import cli
from dreamshard.costs.calibrate import load_records, save_records
from dreamshard.synth import PoolConfig, synth_pool
from dreamshard.validation import MAX_SEED, DataError
from cli_helpers import invoke, one_line_error, small_pool

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "cpu_fbgemm_calib_records.jsonl"  # 60 CPU shards measured with fbgemm


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    return small_pool(tmp_path_factory, 6, 3)


@pytest.fixture(scope="module")
def plan(pool, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan") / "p.json"
    assert invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", out).exit_code == 0
    return json.loads(out.read_text())


# --------------------------------------------------------------------------------------------
# calibration records
# --------------------------------------------------------------------------------------------


def _edited(records: list[dict], line: int, **changes) -> list[dict]:
    out = [dict(r) for r in records]
    out[line - 1].update(changes)
    return out


@pytest.mark.parametrize("case, needle", [
    ("nan", "line 4, key 'fwd_ms': nan is not finite"),
    ("negative", "line 2, key 'bwd_ms': -1 must be >= 0"),
    ("zero", "line 3, key 'fwd_ms': 0 ms; a measured shard takes a positive time"),
    ("no tables", "line 5, key 'tables': the list is empty"),
    ("string batch", "line 6, key 'batch_size': '2048' is a string, not a number"),
    ("one record", "1 measured shard; fitting the 8 terms of fbgemm's cost model needs at least 8"),
    ("bad table", "line 1, key 'tables' entry 0, key 'dim': 6 is not a positive multiple of 4"),
    ("not json", "line 2: invalid JSON"),
])
def test_calibration_records_are_refused_naming_the_line_and_key(case, needle, tmp_path):
    records = [json.loads(line) for line in RECORDS.read_text().splitlines()]
    edited = {
        "nan": _edited(records, 4, fwd_ms=float("nan")),
        "negative": _edited(records, 2, bwd_ms=-1),
        "zero": _edited(records, 3, fwd_ms=0.0),
        "no tables": _edited(records, 5, tables=[]),
        "string batch": _edited(records, 6, batch_size="2048"),
        "one record": records[:1],
        "bad table": _edited(records, 1, tables=[{**records[0]["tables"][0], "dim": 6}]),
        "not json": records,
    }[case]
    src, out = tmp_path / "records.jsonl", tmp_path / "cal.json"
    lines = [json.dumps(r) for r in edited]
    if case == "not json":
        lines[1] = lines[1][:-5]
    src.write_text("\n".join(lines) + "\n")
    line = one_line_error(invoke("calibrate", "--backend", "fbgemm", "--from-records", src, "--out", out))
    assert str(src) in line and needle in line, line
    assert not out.exists()


def test_valid_records_still_fit_and_an_empty_device_of_a_placement_is_kept(tmp_path):
    out = tmp_path / "cal.json"
    r = invoke("calibrate", "--backend", "fbgemm", "--from-records", RECORDS, "--out", out)
    assert r.exit_code == 0, r.stderr
    assert json.loads(out.read_text())["fit"]["shards"] == 60
    empty = {**json.loads(RECORDS.read_text().splitlines()[0]), "tables": [], "fwd_ms": 0.0, "bwd_ms": 0.0, "placement": 0, "device": 1}
    (tmp_path / "r.jsonl").write_text(RECORDS.read_text() + json.dumps(empty) + "\n")
    records = load_records(tmp_path / "r.jsonl")
    assert len(records) == 61 and records[-1].tables == [] and records[-1].placement == 0
    (tmp_path / "empty.jsonl").write_text(json.dumps(empty) + "\n")
    with pytest.raises(DataError, match="no records of measured shards"):
        load_records(tmp_path / "empty.jsonl")


def test_records_gzipped_fit_as_the_plain_file_and_a_broken_gzip_is_one_line(tmp_path):
    """A records file whose name ends in .gz is read gunzipped (save_records writes it so): the same
    records and the same fit as the plain file; a .gz that is not gzip is refused in one line."""
    plain = load_records(RECORDS)
    save_records(plain, tmp_path / "r.jsonl.gz")
    assert (tmp_path / "r.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic
    assert load_records(tmp_path / "r.jsonl.gz") == plain
    fits = []
    for src in (RECORDS, tmp_path / "r.jsonl.gz"):
        out = tmp_path / f"cal{len(fits)}.json"
        r = invoke("calibrate", "--backend", "fbgemm", "--from-records", src, "--out", out)
        assert r.exit_code == 0, r.stderr
        doc = json.loads(out.read_text())
        fits.append((doc["fwd"], doc["bwd"], doc["fit"]))
    assert fits[0] == fits[1]
    (tmp_path / "bad.jsonl.gz").write_bytes(RECORDS.read_bytes()[:100])
    line = one_line_error(invoke("calibrate", "--backend", "fbgemm", "--from-records", tmp_path / "bad.jsonl.gz", "--out", tmp_path / "x.json"))
    assert "bad.jsonl.gz: cannot read" in line and "gzipped" in line, line


# --------------------------------------------------------------------------------------------
# JSON numbers, CSV headers
# --------------------------------------------------------------------------------------------


def test_plan_files_refuse_strings_where_integers_belong(plan, tmp_path):
    def edit(f):
        doc = json.loads(json.dumps(plan))
        f(doc)
        return doc

    shard = lambda doc: doc["tables"][0]["shards"][0]  # noqa: E731
    cases = [
        (edit(lambda d: shard(d).update(device="1")), "table 0, shard 0, key 'device': '1' is a string, not a number"),
        (edit(lambda d: shard(d).update(rows=["0", str(d["tables"][0]["spec"]["rows"])])), "key 'rows' start: '0' is a string, not a number"),
        (edit(lambda d: shard(d).update(columns=[0, str(d["tables"][0]["spec"]["dim"])])), "key 'columns' stop"),
        (edit(lambda d: d.update(devices="2")), "key 'devices': '2' is a string, not a number"),
        (edit(lambda d: d["workload"].update(batch_size="1024")), "key 'batch_size': '1024' is a string"),
        (edit(lambda d: d["tables"][1]["spec"].update(rows="100")), "table 1, spec, key 'rows': '100' is a string"),
    ]
    for doc, needle in cases:
        src = tmp_path / "p.json"
        src.write_text(json.dumps(doc))
        line = one_line_error(invoke("measure", src, "--backend", "sim", "--out", tmp_path / "r.json"))
        assert needle in line, line
    assert not (tmp_path / "r.json").exists()


def test_task_and_json_table_files_refuse_strings_where_numbers_belong(pool, tmp_path):
    names = [line.split(",")[0] for line in (pool / "tables.csv").read_text().splitlines()[1:]]
    task = {"tables": names[:2], "devices": 2, "max_memory_bytes": 10**12, "pool": str(pool)}
    for key, value in (("devices", "2"), ("max_memory_bytes", "1000000000000"), ("batch_size", "65536")):
        (tmp_path / "t.jsonl").write_text(json.dumps({**task, key: value}) + "\n")
        line = one_line_error(invoke("plan", "--tasks", tmp_path / "t.jsonl", "--out", tmp_path / "p.jsonl"))
        assert f"line 1, key {key!r}: {value!r} is a string, not a number" in line, line
    (tmp_path / "t.json").write_text(json.dumps({"tables": [{"name": "a", "rows": 100, "dim": 16, "pooling_factor": "1.5", "distribution": "uniform"}]}))
    line = one_line_error(invoke("plan", tmp_path / "t.json", "--devices", 1, "--max-memory", "1GB", "--out", tmp_path / "p.json"))
    assert "table 0, key 'pooling_factor': '1.5' is a string, not a number" in line
    # a CSV cell is text: numbers in it are still read
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor,distribution,seed\na,100,16,1.5,uniform,7\n")
    assert invoke("plan", tmp_path / "t.csv", "--devices", 1, "--max-memory", "1GB", "--out", tmp_path / "p.json").exit_code == 0


def test_duplicate_csv_header_columns_are_refused(tmp_path):
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor,rows\na,100,16,1,999999\n")
    line = one_line_error(invoke("plan", tmp_path / "t.csv", "--devices", 1, "--max-memory", "1GB", "--out", tmp_path / "p.json"))
    assert "t.csv: line 1: column 'rows' is in the header twice" in line and not (tmp_path / "p.json").exists()


# --------------------------------------------------------------------------------------------
# seeds, task files that are not, models that are not
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["dlrm", "wide", "hot", "mixed"])
def test_every_family_takes_every_documented_seed(family, tmp_path):
    for seed in (MAX_SEED, MAX_SEED // 100_003):
        r = invoke("data", "synth", "--family", family, "--tables", 4, "--seed", seed, "--out", tmp_path / f"pool{seed}")
        assert r.exit_code == 0, r.stderr
        assert invoke("plan", tmp_path / f"pool{seed}" / "tables.csv", "--devices", 2, "--max-memory", "10TB", "--out", tmp_path / "p.json").exit_code == 0
    line = one_line_error(invoke("data", "synth", "--family", family, "--seed", MAX_SEED + 1, "--out", tmp_path / "x"))
    assert "--seed" in line and "'t0'" not in line


def test_dlrm_pools_below_the_old_limit_are_unchanged():
    """The stream seeds wrap modulo 2^63 only past MAX_SEED // 100,003: every earlier pool is the same."""
    seed = MAX_SEED // 100_003 - 1
    assert [t.seed for t in synth_pool(PoolConfig(tables=3, seed=seed))] == [seed * 100_003 + i for i in range(3)]


def test_a_plan_or_a_pretty_printed_file_as_tasks_says_task_files_are_json_lines(plan, tmp_path):
    (tmp_path / "pretty.json").write_text(json.dumps(plan, indent=1))
    line = one_line_error(invoke("plan", "--tasks", tmp_path / "pretty.json", "--out", tmp_path / "p.jsonl"))
    assert "one JSON document over several lines, but a task file is JSON lines" in line
    (tmp_path / "plan.json").write_text(json.dumps(plan) + "\n")
    line = one_line_error(invoke("plan", "--tasks", tmp_path / "plan.json", "--out", tmp_path / "p.jsonl"))
    assert "line 1: this is a plan, not a task" in line


def test_a_raw_pickle_as_model_prints_only_our_line(pool, tmp_path):
    (tmp_path / "raw.pkl").write_bytes(pickle.dumps({"format": "x"}, protocol=4))
    script = Path(sys.executable).with_name("dreamshard")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "dreamshard.cli"]
    p = subprocess.run([*cmd, "plan", str(pool / "tables.csv"), "--devices", "2", "--max-memory", "10TB", "--planner", "dreamshard",
                        "--model", str(tmp_path / "raw.pkl"), "--out", str(tmp_path / "p.json")],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "raw.pkl: cannot read this model file" in p.stderr, p.stderr
    assert "weights_only" not in p.stderr  # torch's advice would run the file's code
