"""Fuzzing the command line with malformed table, task and plan files and option values, output
paths, calibration records, the resume of a finished training run and two processes writing the
same output at once.

Every case is generated together with whether it is valid: each field is drawn either from values
that are valid or from values that are not (wrong type, out of range, over a limit, missing,
duplicated, not finite, garbage text). The case then runs through the real CLI code in-process
(click's CliRunner) and must end as its validity says:

- valid   → exit status 0 and the output file written (and readable back);
- invalid → exit status 2, exactly one line on stderr starting with "error:" and naming the file
  (for file errors), no traceback, and no output file.

A handful run as real subprocesses (`.venv/bin/dreamshard`) for exit statuses and stderr.

Examples per fuzz test: DREAMSHARD_FUZZ_EXAMPLES (default 150: about 790 cases over the file,
option and output-path fuzzers, the model-file and concurrent-writer fuzzers (a third as many
each), the records fuzzer (a fifth) and the resume fuzzer (six trainings); a minute or two; e.g.
DREAMSHARD_FUZZ_EXAMPLES=3000 for a long run). Half the cases are drawn clean
(every field valid), half with flaws. Default runs are derandomized (the same cases every time); a
run with the variable set draws new ones.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dreamshard.plan import load_plans
from dreamshard.planners import PLANNERS
from dreamshard.report import missing_arguments
from dreamshard.tables import BIN_COLUMNS, NUM_BINS
from dreamshard.tasks import load_tasks
from dreamshard.validation import MAX_DEVICES, MAX_MEMORY_BYTES, MAX_ROWS, MAX_SEED
from cli_helpers import invoke, small_pool

EXAMPLES = int(os.environ.get("DREAMSHARD_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="DREAMSHARD_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])

ROOT = Path(__file__).resolve().parents[1]
_script = Path(sys.executable).with_name("dreamshard")
DREAMSHARD = [str(_script)] if _script.is_file() else [sys.executable, "-m", "dreamshard.cli"]
BIG_MEMORY = 10**13  # every valid case fits: its failures can only come from bad input


# --------------------------------------------------------------------------------------------
# Fixtures and the one check every case ends with
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    return small_pool(tmp_path_factory, 8, 5, "fuzzpool")


@pytest.fixture(scope="module")
def base_plan(pool, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fuzzplan") / "plan.json"
    r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", BIG_MEMORY, "--planner", "size", "--out", out)
    assert r.exit_code == 0, r.stderr
    plan = json.loads(out.read_text())
    # at least 3 tables on device 1: two edits cannot empty it, so one device is then always invalid
    devices = [e["shards"][0]["device"] for e in plan["tables"]]
    assert plan["format"] == "dreamshard.plan/2" and all(len(e["shards"]) == 1 for e in plan["tables"])
    assert devices.count(1) >= 3 and set(devices) == {0, 1}
    return plan


def check(result, valid: bool, outputs: list[Path], names: str | None = None, case=None) -> None:
    """The CLI ended as the case's validity says (see the module docstring)."""
    event(f"valid={valid} exit={result.exit_code}")  # shown by pytest --hypothesis-show-statistics
    context = f"case={case!r}\nexit={result.exit_code}\nstderr={result.stderr!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"uncaught {result.exception!r}\n{context}"
    assert "Traceback" not in result.stderr, context
    if valid:
        assert result.exit_code == 0, context
        assert all(p.exists() for p in outputs), context
    else:
        assert result.exit_code == 2, context
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), context
        if names:
            assert names in lines[0], context
        assert not any(p.exists() for p in outputs), context
        leftovers = [p for out in outputs for p in out.parent.glob(out.name + ".tmp*")]
        assert not leftovers, context


class valid_or_not:  # noqa: N801 - reads as a strategy
    """A field's values: `good` ones and `bad` ones. `pick(draw, clean)` gives (value, ok): always a
    good one in a clean case (half the cases are drawn clean: every field valid), else a bad one
    about `p_bad` of the time (one_of picks its branches about evenly: the good one is listed k times)."""

    def __init__(self, good, bad, p_bad: float = 0.3) -> None:
        k = max(1, round((1 - p_bad) / p_bad))
        self.good = good.map(lambda v: (v, True))
        self.mixed = st.one_of(*[self.good] * k, bad.map(lambda v: (v, False)))

    def pick(self, draw, clean: bool):
        return draw(self.good if clean else self.mixed)


def flaw(draw, clean: bool, one_in: int) -> bool:
    """Whether to add a structural flaw (a missing column, a bad line...): never in a clean case."""
    return not clean and draw(st.integers(0, one_in - 1)) == 0


# Text without a digit is never a valid number (nan and inf, which it may spell, are refused too)
NOT_NUMBER_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Nd", "No", "Cs"], blacklist_characters="\x00"), min_size=1, max_size=12)
NOT_DISTRIBUTION_TEXT = NOT_NUMBER_TEXT.filter(lambda s: s.strip() != "uniform" and not s.strip().startswith(("zipf:", "dlrm:")))


def onehot(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(NUM_BINS)]


# --------------------------------------------------------------------------------------------
# Table files (CSV and JSON) through `plan TABLES_FILE`
# --------------------------------------------------------------------------------------------

CSV_ROWS = valid_or_not(st.integers(1, 10**6).map(str) | st.sampled_from(["1e3", "250.0"]),
                        st.sampled_from(["0", "-1", "1.5", "1e30", str(MAX_ROWS + 1), "nan", "inf", "", " ", "0x10", "1,000", "True"]) | NOT_NUMBER_TEXT)
CSV_DIM = valid_or_not(st.sampled_from(["4", "8", "16", "64", "128", "1024", "16.0"]),
                       st.sampled_from(["0", "-4", "6", "2", "1028", "2048", "8.5", "nan", ""]) | NOT_NUMBER_TEXT)
CSV_POOLING = valid_or_not((st.just(0.0) | st.floats(1e-9, 100)).map(lambda x: f"{x:.6g}"),
                           st.sampled_from(["-1", "nan", "inf", "-inf", "1e5", "", "1e400", "1e-247"]) | NOT_NUMBER_TEXT)
CSV_SEED = valid_or_not(st.sampled_from(["", "0", "7", str(MAX_SEED)]), st.sampled_from(["-1", "1.5", str(2**64), "nan"]) | NOT_NUMBER_TEXT)
CSV_DIST = valid_or_not(st.sampled_from(["uniform", "zipf:1.1", "zipf:0.5"]),
                        st.sampled_from(["zipf:0", "zipf:-1", "zipf:x", "zipf:1e9", "normal", "dlrm:foo", "dlrm:#x", "zipf:nan"]) | NOT_DISTRIBUTION_TEXT)
BAD_BIN = st.sampled_from(["-0.5", "nan", "2", "x", "", "inf"])


@st.composite
def csv_table_file(draw):
    """(text, valid): a CSV table file of 1–4 rows with bins given (fast) or derived from a distribution."""
    clean = draw(st.booleans())
    with_bins = draw(st.integers(0, 9)) < 8
    header = ["name", "rows", "dim", "pooling_factor", "distribution", "seed"] + (BIN_COLUMNS if with_bins else [])
    dropped = None
    if flaw(draw, clean, 20):  # a required column missing from the header
        dropped = draw(st.sampled_from(["name", "rows", "dim", "pooling_factor"]))
        header.remove(dropped)
    valid = dropped is None
    rows, names = [], []
    for i in range(draw(st.integers(1, 3 if with_bins else 2))):
        name, ok_name = f"t{i}", True
        kind = draw(st.integers(0, 29)) if not clean else -1
        if kind == 0 and names:
            name, ok_name = names[0], False  # a duplicate name
        elif kind == 1:
            name, ok_name = draw(st.sampled_from(["", "   "])), False
        names.append(name)
        cells = {"name": (name, ok_name), "rows": CSV_ROWS.pick(draw, clean), "dim": CSV_DIM.pick(draw, clean), "pooling_factor": CSV_POOLING.pick(draw, clean), "seed": CSV_SEED.pick(draw, clean)}
        if with_bins:
            cells["distribution"] = draw(st.just(("", True))) if draw(st.booleans()) else CSV_DIST.pick(draw, clean)
            bins, ok_bins = [f"{b:g}" for b in onehot(draw(st.integers(0, NUM_BINS - 1)))], True
            if flaw(draw, clean, 10):
                bins[draw(st.integers(0, NUM_BINS - 1))] = draw(BAD_BIN)
                ok_bins = False
            cells.update({c: (b, ok_bins) for c, b in zip(BIN_COLUMNS, bins)})
        else:
            cells["distribution"] = CSV_DIST.pick(draw, clean)
        row = [cells[c][0] for c in header]
        valid &= all(cells[c][1] for c in header)
        if flaw(draw, clean, 40):  # more fields than the header
            row.append("extra")
            valid = False
        rows.append(row)
    f = io.StringIO()
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)
    return f.getvalue(), valid


JSON_GARBAGE = st.sampled_from([None, True, False, [], {}, "abc", [1, 2], {"a": 1}])
JSON_ROWS = valid_or_not(st.integers(1, 10**6), st.sampled_from([0, -1, 1.5, 1e30, MAX_ROWS + 1, float("nan"), float("inf"), 2**70]) | JSON_GARBAGE)
JSON_DIM = valid_or_not(st.sampled_from([4, 8, 16, 64, 1024, 32.0]), st.sampled_from([0, -4, 6, 2048, 8.5, float("nan")]) | JSON_GARBAGE)
JSON_POOLING = valid_or_not(st.just(0.0) | st.floats(1e-9, 100), st.sampled_from([-1, float("nan"), float("inf"), 1e5, 10**400]) | JSON_GARBAGE)
JSON_SEED = valid_or_not(st.integers(0, 1000), st.sampled_from([-1, 1.5, 2**64, float("nan")]) | JSON_GARBAGE.filter(lambda v: v not in (None,)))
JSON_DIST = valid_or_not(st.sampled_from(["uniform", "zipf:1.1", None]), st.sampled_from(["zipf:0", "normal", "dlrm:x", 5, True, [], {}]))
JSON_BINS = valid_or_not(st.integers(0, NUM_BINS - 1).map(onehot),
                         st.sampled_from([onehot(0)[:16], [-0.1] + [0.0] * 16, [float("nan")] * 17, [1.5] + [0.0] * 16, "x", 5, [None] * 17, [True] + [0.0] * 16]))


@st.composite
def json_table_file(draw):
    """(text, valid): a JSON table file: {"tables": [...]} or a bare list, of objects or garbage."""
    tables, valid, clean = [], True, draw(st.booleans())
    for i in range(draw(st.integers(1, 3))):
        if flaw(draw, clean, 20):
            tables.append(draw(JSON_GARBAGE | st.integers() | st.floats(allow_nan=False)))  # not a table at all
            valid = False
            continue
        fields = {"rows": JSON_ROWS.pick(draw, clean), "dim": JSON_DIM.pick(draw, clean), "pooling_factor": JSON_POOLING.pick(draw, clean), "seed": JSON_SEED.pick(draw, clean),
                  "distribution": JSON_DIST.pick(draw, clean), "bins": JSON_BINS.pick(draw, clean)}
        t = {"name": f"t{i}", **{k: v for k, (v, _) in fields.items()}}
        valid &= all(ok for _, ok in fields.values())
        if flaw(draw, clean, 20):
            del t[draw(st.sampled_from(["name", "rows", "dim", "pooling_factor"]))]
            valid = False
        tables.append(t)
    doc = draw(st.sampled_from(["object", "list"] + ([] if clean else ["object", "garbage"])))
    if doc == "garbage":
        return draw(st.sampled_from(["", "{", "[1, 2", "null", "5", '"tables"', '{"tables": 5}', '{"tables": []}', "[]", "\x00\x01"])), False
    return json.dumps({"tables": tables} if doc == "object" else tables), valid


@FUZZ
@given(case=st.one_of(csv_table_file().map(lambda c: ("csv",) + c), json_table_file().map(lambda c: ("json",) + c)))
def test_fuzz_table_files(pool, case):
    suffix, text, valid = case
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / f"tables.{suffix}", Path(d) / "plan.json"
        src.write_text(text)
        r = invoke("plan", src, "--devices", 2, "--max-memory", BIG_MEMORY, "--planner", "size", "--out", out)
        check(r, valid, [out], names=str(src), case=case)
        if valid:
            (plan,) = load_plans(out)
            assert plan.devices == 2 and 1 <= len(plan.task.tables) <= 3


# --------------------------------------------------------------------------------------------
# Task files through `plan --tasks`
# --------------------------------------------------------------------------------------------

TASK_DEVICES = valid_or_not(st.integers(1, 8), st.sampled_from([0, -1, 2.7, True, False, None, MAX_DEVICES + 1, 10**9, [], "x", 1e30]))
TASK_MEMORY = valid_or_not(st.sampled_from([BIG_MEMORY, MAX_MEMORY_BYTES]), st.sampled_from([0, -5, 1.5, True, None, MAX_MEMORY_BYTES + 1, "5GB", float("nan")]))
TASK_PRECISION = valid_or_not(st.sampled_from(["fp16", "fp32"]), st.sampled_from(["fp64", "", "FP16", 16, None]))
TASK_OPTIMIZER = valid_or_not(st.sampled_from(["sgd", "rowwise_adagrad"]), st.sampled_from(["adam", "", 1, None]))


@st.composite
def task_file(draw, names: list[str], pool_dir: str):
    """(text, number of tasks, valid): 1–3 task lines, each with its keys drawn valid or not."""
    lines, valid, clean = [], True, draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        if flaw(draw, clean, 30):
            lines.append(draw(st.sampled_from(["{", "[1, 2]", "5", '"task"', "null", "{'tables': []}"])))
            valid = False
            continue
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
        tables, ok_tables = (chosen, True) if clean else draw(st.one_of(
            st.just((chosen, True)), st.just((chosen, True)), st.just((chosen, True)), st.just((chosen, True)), st.just((chosen, True)),
            st.just((chosen + chosen[:1], False)), st.just(([], False)), st.just((chosen + ["no_such_table"], False)),
            st.just((chosen + [5], False)), st.just((chosen[0], False)), st.just((None, False))))
        keys = {"devices": TASK_DEVICES.pick(draw, clean), "max_memory_bytes": TASK_MEMORY.pick(draw, clean), "precision": TASK_PRECISION.pick(draw, clean), "optimizer": TASK_OPTIMIZER.pick(draw, clean),
                "pool": valid_or_not(st.just(pool_dir), st.sampled_from(["/no/such/pool", 5, "", None]), 0.1).pick(draw, clean)}
        task = {"tables": tables, **{k: v for k, (v, _) in keys.items()}}
        valid &= ok_tables and all(ok for _, ok in keys.values())
        if flaw(draw, clean, 30):
            del task[draw(st.sampled_from(["tables", "devices", "max_memory_bytes", "pool"]))]
            valid = False
        lines.append(json.dumps(task))
    return "\n".join(lines) + "\n", len(lines), valid


@FUZZ
@given(data=st.data())
def test_fuzz_task_files(pool, data):
    names = [line.split(",")[0] for line in (pool / "tables.csv").read_text().splitlines()[1:]]
    text, n, valid = data.draw(task_file(names, str(pool)))
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "tasks.jsonl", Path(d) / "plans.jsonl"
        src.write_text(text)
        r = invoke("plan", "--tasks", src, "--planner", data.draw(st.sampled_from(["size", "lookup", "random"])), "--out", out)
        check(r, valid, [out], names=None, case=text)
        if valid:
            assert len(load_plans(out)) == n == len(load_tasks(src))


# --------------------------------------------------------------------------------------------
# Plan files, tampered, through `measure --backend sim`
# --------------------------------------------------------------------------------------------


@st.composite
def tampered_plan(draw, base: dict):
    """(document, valid): the base plan with 1–3 edits, each valid or not."""
    plan, valid, clean = copy.deepcopy(base), True, draw(st.booleans())
    plan["max_memory_bytes"] = BIG_MEMORY
    edits = draw(st.lists(st.sampled_from(["devices", "memory", "precision", "optimizer", "batch_size", "format", "tables", "device", "columns", "rows", "dim",
                                           "pooling_factor", "bins", "distribution", "seed", "name", "predicted", "notes", "doc", "row_range"]),
                           min_size=1, max_size=3, unique=True))  # one edit per key: a later one never undoes an earlier invalid one
    if "dim" in edits and "columns" in edits:
        edits.remove("columns")  # a new dim re-tiles the table's shards; its columns are the dim edit's
    if "rows" in edits and "row_range" in edits:
        edits.remove("row_range")  # a row range spans the rows the spec had when it was drawn
    edits.sort(key=lambda e: e == "row_range")  # last: an edit of the shards after it would drop its rows
    n = len(plan["tables"])
    for edit in edits:
        i = draw(st.integers(0, n - 1)) if isinstance(plan.get("tables"), list) and plan["tables"] and isinstance(plan["tables"][0], dict) else None
        spec = plan["tables"][i]["spec"] if i is not None and "spec" in plan["tables"][i] else None
        if edit == "devices":
            v, ok = valid_or_not(st.integers(2, 8), st.sampled_from([0, 1, -1, 2.5, True, None, [], MAX_DEVICES + 1, 10**6, 10**9, "2", "8"]), 0.6).pick(draw, clean)
            if ok and isinstance(plan.get("devices"), int) and not isinstance(plan["devices"], bool):
                v = max(v, plan["devices"])  # never fewer devices than a valid table's device needs
            plan["devices"] = v
        elif edit == "memory":
            v, ok = valid_or_not(st.just(BIG_MEMORY * 10), st.sampled_from([0, -1, 1.5, True, None, MAX_MEMORY_BYTES + 1, 1000]), 0.6).pick(draw, clean)
            plan["max_memory_bytes"] = v
        elif edit == "precision":
            v, ok = valid_or_not(st.sampled_from(["fp16", "fp32"]), st.sampled_from(["fp64", "", 16, None]), 0.6).pick(draw, clean)
            plan["workload"]["precision"] = v
        elif edit == "optimizer":
            v, ok = valid_or_not(st.sampled_from(["sgd", "rowwise_adagrad"]), st.sampled_from(["adam", None, 1]), 0.6).pick(draw, clean)
            plan["workload"]["optimizer"] = v
        elif edit == "batch_size":
            v, ok = valid_or_not(st.integers(1, 2**20), st.sampled_from([0, -1, 2.5, True, None, "x", 2**40, "1024"]), 0.6).pick(draw, clean)
            plan["workload"]["batch_size"] = v
        elif edit in ("format", "tables", "doc") and clean:
            ok = True  # these edits are all flaws: none in a clean case
        elif edit == "format":
            plan["format"], ok = draw(st.sampled_from(["dreamshard.plan/9", "dreamshard.table/2", None, 1, ""])), False  # plan/1-3 are read
        elif edit == "tables":
            plan["tables"], ok = draw(st.sampled_from([[], {}, None, 5, [5], [None], ["x"]])), False
        elif edit == "device" and i is not None and isinstance(plan["tables"][i].get("shards"), list) and plan["tables"][i]["shards"] \
                and isinstance(plan["tables"][i]["shards"][0], dict):
            top = plan["devices"] if isinstance(plan.get("devices"), int) and not isinstance(plan["devices"], bool) and plan["devices"] >= 2 else 2
            v, ok = valid_or_not(st.integers(0, top - 1), st.sampled_from([-1, top, 0.5, True, None, "x", 10**9, "0", "1"]), 0.6).pick(draw, clean)
            plan["tables"][i]["shards"][0]["device"] = v
        elif edit == "columns" and i is not None:
            dim, shards = spec["dim"], plan["tables"][i]["shards"]
            if not isinstance(shards, list) or not shards or not isinstance(shards[0], dict):
                ok = True  # an earlier edit already broke this table's shards
            else:
                device, half = shards[0]["device"], dim // 8 * 4  # a valid cut: widths multiples of 4
                halves = [{"device": device, "columns": [0, half]}, {"device": device, "columns": [half, dim]}] if half >= 4 else None
                v, ok = valid_or_not(st.sampled_from([x for x in ([{"device": device, "columns": [0, dim]}], halves) if x]),
                                     st.sampled_from([[{"device": device, "columns": c}] for c in ([0, dim - 2], [4, dim], [0, dim + 4], [0], "x", [dim, 0], ["0", str(dim)])]
                                                     + [[], "x"]), 0.6).pick(draw, clean)
                plan["tables"][i]["shards"] = v
        elif spec is not None and edit in ("rows", "dim", "pooling_factor", "bins", "distribution", "seed", "name"):
            good, bad = {
                "rows": (st.integers(1, 10**5), st.sampled_from([0, -100, 1e30, 2.5, True, None, "x", MAX_ROWS + 1, "100"])),
                "dim": (st.sampled_from([4, 8, 64, 256]), st.sampled_from([6, 0, -4, 2048, 4.5, None, "x", "64"])),
                "pooling_factor": (st.just(0.0) | st.floats(1e-9, 100), st.sampled_from([-1.0, float("nan"), float("inf"), 1e6, None, "x", True])),
                "bins": (st.integers(0, NUM_BINS - 1).map(onehot), st.sampled_from([onehot(0)[:16], [-0.1] + [0.0] * 16, [float("nan")] * 17, "x", 5])),
                "distribution": (st.sampled_from(["uniform", "zipf:1.2"]), st.sampled_from(["zipf:0", "gauss", 5, []])),
                "seed": (st.integers(0, 100), st.sampled_from([-1, 1.5, 2**64, True])),
                "name": (st.just(f"renamed{i}"), st.sampled_from([None, "", "   "])),
            }[edit]
            v, ok = valid_or_not(good, bad, 0.6).pick(draw, clean)
            spec[edit] = v
            if edit == "dim" and ok and isinstance(plan["tables"][i].get("shards"), list):  # keep the shards tiling the new dim
                plan["tables"][i]["shards"] = [{"device": plan["tables"][i]["shards"][0]["device"], "columns": [0, v]}]
            if edit == "name" and not ok and draw(st.booleans()) and n > 1:  # (ok is False: not a clean case)
                spec["name"] = plan["tables"][(i + 1) % n]["spec"]["name"]  # a table listed twice
        elif edit == "row_range" and i is not None and isinstance(plan["tables"][i].get("shards"), list) and len(plan["tables"][i]["shards"]) == 1 \
                and isinstance(plan["tables"][i]["shards"][0], dict) and isinstance(spec.get("rows"), int) and not isinstance(spec["rows"], bool) and spec["rows"] >= 1:
            rows = spec["rows"]
            v, ok = valid_or_not(st.just([0, rows]), st.sampled_from([["0", str(rows)], [0, str(rows)], ["0", rows], [0, rows + 1], [0.5, rows]]), 0.6).pick(draw, clean)
            plan["tables"][i]["shards"][0]["rows"] = v
        elif edit == "predicted":
            plan["predicted"], ok = valid_or_not(st.just(None), st.sampled_from([5, "x", []]), 0.6).pick(draw, clean)
        elif edit == "notes":
            plan["notes"], ok = valid_or_not(st.just(["a note"]), st.sampled_from(["x", [1], None]), 0.6).pick(draw, clean)
        elif edit == "doc":
            return draw(st.sampled_from([[plan], 5, "plan", None])), False
        else:
            ok = True
        valid &= ok
    return plan, valid


@FUZZ
@given(data=st.data())
def test_fuzz_plan_files(base_plan, data):
    doc, valid = data.draw(tampered_plan(base_plan))
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "plan.json", Path(d) / "report.json"
        cut = not valid and data.draw(st.integers(0, 9)) == 0  # now and then a file cut short
        src.write_text(json.dumps(doc)[: -3 if cut else None])
        valid = valid and not cut
        r = invoke("measure", src, "--backend", "sim", "--out", out)
        check(r, valid, [out], names=str(src), case=doc)
        if valid:
            assert json.loads(out.read_text())["overall_ms"] > 0


# --------------------------------------------------------------------------------------------
# Model files, tampered, through `plan --planner dreamshard --model`
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_state() -> dict:
    from dreamshard.learned.nets import DreamShardModel

    return DreamShardModel.load().state()  # the shipped model's


@st.composite
def tampered_model(draw, base: dict):
    """(object to torch.save or bytes, valid)."""
    if draw(st.booleans()):  # clean: the model as shipped, or with other harmless metadata
        return {**base, "meta": draw(st.sampled_from([base["meta"], {}, {"note": "x"}]))}, True
    state = dict(base)
    edit = draw(st.sampled_from(["drop", "type", "shape", "extra", "garbage", "bytes", "format"]))
    if edit == "drop":
        del state[draw(st.sampled_from(["cost_net", "policy", "sees_table", "normalization", "best_of"]))]
    elif edit == "type":
        key = draw(st.sampled_from(["sees_table", "normalization", "best_of", "score", "linear_features", "keep_room", "cost_net", "policy", "meta"]))
        state[key] = draw(st.sampled_from({"normalization": [None, "z-score", 1], "meta": ["x", 3.5, [1]]}.get(key, [None, "x", 3.5, [1], -1])))
        if key == "best_of" and state[key] == "x":
            state[key] = 0
    elif edit == "shape":
        net = draw(st.sampled_from(["cost_net", "policy"]))
        key = draw(st.sampled_from(sorted(base[net])))
        state[net] = {**base[net], key: torch.zeros(draw(st.integers(1, 3)), 7)}
    elif edit == "extra":
        net = draw(st.sampled_from(["cost_net", "policy"]))
        state[net] = {**base[net], "surprise.weight": torch.zeros(2)}
    elif edit == "garbage":
        return draw(st.sampled_from([[1, 2], 5, "model", None, {"format": "dreamshard.model/1"}])), False
    elif edit == "bytes":
        return draw(st.sampled_from([b"", b"not a torch file", b"PK\x03\x04 broken zip"])), False
    else:
        state["format"] = draw(st.sampled_from(["dreamshard.model/2", None, ""]))
    return state, False


@settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
@given(data=st.data())
def test_fuzz_model_files(pool, model_state, data):
    obj, valid = data.draw(tampered_model(model_state))
    with tempfile.TemporaryDirectory() as d:
        model, out = Path(d) / "model.pt", Path(d) / "plan.json"
        if isinstance(obj, bytes):
            model.write_bytes(obj)
        else:
            torch.save(obj, model)
        r = invoke("plan", pool / "tables.csv", "--devices", 2, "--max-memory", BIG_MEMORY, "--planner", "dreamshard", "--model", model, "--out", out)
        check(r, valid, [out], names=str(model), case=obj if not isinstance(obj, dict) else {k: v for k, v in obj.items() if k not in ("cost_net", "policy")})


# --------------------------------------------------------------------------------------------
# Option values
# --------------------------------------------------------------------------------------------

OPT_DEVICES = valid_or_not(st.integers(1, 8).map(str), st.sampled_from(["0", "-1", str(MAX_DEVICES + 1), "2.5", "x", "", "1e9", "nan"]), 0.3)
OPT_MEMORY = valid_or_not(st.sampled_from(["10TB", "80000GB", str(BIG_MEMORY), "9.5TiB"]),
                          st.sampled_from(["0", "0.5", "-5GB", "5 parsecs", "", "1e30", "GB", "5000TB", "nan", "inf"]), 0.3)
OPT_SEED = valid_or_not(st.sampled_from(["0", "1", str(MAX_SEED)]), st.sampled_from(["-1", str(MAX_SEED + 1), "1.5", "x"]), 0.3)
# The planners that place every valid task with their defaults: not those that need an argument
# (oracle: --backend, tested in tests/test_oracle.py) nor torchrec (its own memory reservation
# refuses tight tasks the others place, by design: tests/test_torchrec_planner.py).
OPT_PLANNER = valid_or_not(st.sampled_from(sorted(n for n in PLANNERS if not missing_arguments(n) and n != "torchrec")), st.sampled_from(["nope", "", "SIZE"]), 0.2)
OPT_BATCH = valid_or_not(st.sampled_from(["1", "1024", "65536"]), st.sampled_from(["0", "-1", str(2**40), "1.5", "x"]), 0.3)
OPT_TABLE_COUNT = valid_or_not(st.sampled_from(["1", "2", "2:4", "4"]), st.sampled_from(["0", "5:2", "x", "1:2:3", "-1", "100000000", "4:100001"]), 0.3)
OPT_COUNT = valid_or_not(st.sampled_from(["0", "1", "3"]), st.sampled_from(["-1", "x", str(10**6), "1.5"]), 0.3)


@st.composite
def option_case(draw, pool: Path, plan_file: Path, d: Path):
    """(args, outputs, valid) for `plan`, `measure` or `data tasks`, with option values valid or not."""
    regular = d / "regular"
    clean = draw(st.booleans())
    out_file = valid_or_not(st.sampled_from([d / "out.json", d / "sub" / "out.json"]), st.sampled_from([regular / "out.json", d]), 0.15)
    command = draw(st.sampled_from(["plan", "measure", "tasks"]))
    if command == "plan":
        opts = {"--devices": OPT_DEVICES.pick(draw, clean), "--max-memory": OPT_MEMORY.pick(draw, clean), "--seed": OPT_SEED.pick(draw, clean), "--planner": OPT_PLANNER.pick(draw, clean)}
        (out, ok_out) = out_file.pick(draw, clean)
        args = ["plan", pool / "tables.csv", *[x for k, (v, _) in opts.items() for x in (k, v)], "--out", out]
        outputs, valid = ([out] if out != d else []), ok_out and all(ok for _, ok in opts.values())
    elif command == "measure":
        opts = {"--batch-size": OPT_BATCH.pick(draw, clean), "--precision": valid_or_not(st.sampled_from(["fp16", "fp32"]), st.sampled_from(["fp64", ""]), 0.2).pick(draw, clean)}
        (out, ok_out) = out_file.pick(draw, clean)
        unused = flaw(draw, clean, 10)  # an option the simulator would ignore
        args = ["measure", plan_file, "--backend", "sim", *[x for k, (v, _) in opts.items() for x in (k, v)], "--out", out] + (["--iters", "5"] if unused else [])
        outputs, valid = ([out] if out != d else []), ok_out and not unused and all(ok for _, ok in opts.values())
    else:
        opts = {"--tables": OPT_TABLE_COUNT.pick(draw, clean), "--devices": OPT_DEVICES.pick(draw, clean), "--max-memory": OPT_MEMORY.pick(draw, clean), "--num-train": OPT_COUNT.pick(draw, clean),
                "--num-test": OPT_COUNT.pick(draw, clean), "--seed": valid_or_not(st.sampled_from(["0", "3"]), st.sampled_from(["-1", "x"]), 0.2).pick(draw, clean)}
        out, ok_out = valid_or_not(st.just(d / "tasks"), st.sampled_from([regular, regular / "tasks"]), 0.15).pick(draw, clean)
        args = ["data", "tasks", "--pool", pool, *[x for k, (v, _) in opts.items() for x in (k, v)], "--out", out]
        outputs, valid = [out / "train.jsonl", out / "test.jsonl"], ok_out and all(ok for _, ok in opts.values())
    return args, outputs, valid


@FUZZ
@given(data=st.data())
def test_fuzz_option_values(pool, base_plan, data):
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "regular").write_text("a regular file in the way of a folder")
        plan_file = d / "plan.json"
        plan_file.write_text(json.dumps(base_plan))
        args, outputs, valid = data.draw(option_case(pool, plan_file, d))
        check(invoke(*args), valid, outputs, case=args)


# --------------------------------------------------------------------------------------------
# Output paths: nothing a command writes may destroy (issue 34)
# --------------------------------------------------------------------------------------------

# what `--out` names: (kind, valid). A valid one is written; an invalid one is refused with one
# line and left exactly as it was (a FIFO still a FIFO, an input's bytes unchanged).
OUT_KINDS = valid_or_not(st.sampled_from(["new", "existing", "in a new folder", "long name that fits"]),
                         st.sampled_from(["fifo", "device node", "folder", "name over 255 bytes", "trailing slash", "the input", "a link to the input",
                                          "a hard link to the input", "under a regular file"]), 0.5)


def make_null_device(path: Path) -> None:
    """A private copy of /dev/null (a character device) at `path`: never the system's own, which a
    regressed writer run as root would replace with a regular file. Skips the case where creating
    a device node is not allowed (not root)."""
    import stat as _stat

    try:
        os.mknod(path, 0o666 | _stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")


def _snapshot(p: Path):
    """What a path is, to compare before and after: its kind and, for a regular file, its bytes."""
    try:
        st_mode = os.lstat(p).st_mode
    except OSError:  # not there, or a file in the way of its folder
        return None
    import stat as _stat

    if _stat.S_ISREG(st_mode):
        return ("file", p.read_bytes())
    return (_stat.S_IFMT(st_mode), None)


@FUZZ
@given(data=st.data())
def test_fuzz_output_paths(pool, base_plan, data):
    kind, valid = OUT_KINDS.pick(data.draw, data.draw(st.booleans()))
    command = data.draw(st.sampled_from(["plan", "measure", "export"]))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        tables, plan = d / "tables.csv", d / "plan.json"
        tables.write_bytes((pool / "tables.csv").read_bytes())
        plan.write_text(json.dumps(base_plan))
        source = tables if command == "plan" else plan
        out = {"new": d / "out.json", "existing": d / "old.json", "in a new folder": d / "sub" / "out.json", "long name that fits": d / ("n" * 240 + ".json"),
               "fifo": d / "fifo", "device node": d / "null", "folder": d / "folder", "name over 255 bytes": d / ("n" * 256),
               "trailing slash": f"{d}/out.json/", "the input": source, "a link to the input": d / "link", "a hard link to the input": d / "hard",
               "under a regular file": d / "plan.json" / "out.json"}[kind]
        if kind == "existing":
            out.write_text("an old report")
        elif kind == "fifo":
            os.mkfifo(out)
        elif kind == "device node":
            make_null_device(out)
        elif kind == "folder":
            out.mkdir()
        elif kind == "a link to the input":
            out.symlink_to(source)
        elif kind == "a hard link to the input":
            os.link(source, out)
        before = {p: _snapshot(p) for p in (Path(str(out).rstrip("/")), tables, plan)}
        args = {"plan": ["plan", tables, "--devices", 2, "--max-memory", BIG_MEMORY, "--planner", "size", "--out", out],
                "measure": ["measure", plan, "--backend", "sim", "--out", out],
                "export": ["export", "torchrec", plan, "--out", out]}[command]
        r = invoke(*args)
        case = (command, kind)
        event(f"valid={valid} exit={r.exit_code}")
        assert result_is_clean(r), (case, r.stderr)
        if valid:
            assert r.exit_code == 0, (case, r.stderr)
            assert _snapshot(Path(out))[0] == "file" and Path(out).read_text() != "an old report", case
        else:
            assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), (case, r.stderr)
            assert {p: _snapshot(p) for p in before} == before, case
        assert not [p for p in d.rglob("*") if ".tmp" in p.name], case


def result_is_clean(r) -> bool:
    return (r.exception is None or isinstance(r.exception, SystemExit)) and "Traceback" not in r.stderr


# --------------------------------------------------------------------------------------------
# Calibration records through `calibrate --from-records` (issue 34)
# --------------------------------------------------------------------------------------------

RECORDS = ROOT / "benchmarks" / "results" / "cpu_fbgemm_calib_records.jsonl"  # CPU shards measured with fbgemm
FIT_TERMS = 8  # fbgemm's cost model: a fit needs at least this many measured shards
REC_TIME = valid_or_not(st.floats(1e-3, 1e3), st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, "1.0", None, True, [1.0]]), 0.15)
REC_BATCH = valid_or_not(st.just(None), st.sampled_from(["2048", 0, -1, 2.5, None, True]), 0.1)  # None: the record's own
REC_TABLES = valid_or_not(st.just(None), st.sampled_from(["empty", "x", "number", "bad dim", "string rows"]), 0.1)
REC_PLACEMENT = valid_or_not(st.sampled_from([None, 0, 3]), st.sampled_from([-1, "0", 1.5, True]), 0.1)


@st.composite
def records_file(draw, base: list[dict]):
    """(JSON lines, valid, measured shards): 1-14 records, each key drawn valid or not; now and
    then the empty device of a placement (no tables, zero times), which is valid but no shard."""
    clean, lines, valid, shards = draw(st.booleans()), [], True, 0
    for i in range(draw(st.integers(FIT_TERMS + 2, 14) if clean else st.integers(1, 12))):
        rec = dict(base[i % len(base)])
        if draw(st.integers(0, 9)) == 0:  # an empty device of placement 0
            rec.update(tables=[], fwd_ms=0.0, bwd_ms=0.0, placement=0, device=1)
            lines.append(json.dumps(rec))
            continue
        picks = {"fwd_ms": REC_TIME.pick(draw, clean), "bwd_ms": REC_TIME.pick(draw, clean), "batch_size": REC_BATCH.pick(draw, clean),
                 "tables": REC_TABLES.pick(draw, clean), "placement": REC_PLACEMENT.pick(draw, clean)}
        for key in ("fwd_ms", "bwd_ms", "placement"):
            rec[key] = picks[key][0]
        if picks["batch_size"][0] is not None or not picks["batch_size"][1]:
            rec["batch_size"] = picks["batch_size"][0]
        t = picks["tables"][0]
        if t is not None:
            first = dict(rec["tables"][0])
            rec["tables"] = {"empty": [], "x": "x", "number": [5], "bad dim": [{**first, "dim": 6}], "string rows": [{**first, "rows": str(first["rows"])}]}[t]
        # "empty" is among the bad tables: outside a placement a shard needs tables, and inside one an
        # empty device takes no time (these records' times are positive)
        valid &= all(v for _, v in picks.values())
        shards += 1
        text = json.dumps(rec)
        if flaw(draw, clean, 20):
            text, valid = text[:-4], False  # a line cut short
        lines.append(text)
    return "\n".join(lines) + "\n", valid and shards >= FIT_TERMS, shards


@pytest.fixture(scope="module")
def base_records() -> list[dict]:
    return [json.loads(line) for line in RECORDS.read_text().splitlines()[:12]]


@settings(FUZZ, max_examples=max(10, EXAMPLES // 5))
@given(data=st.data())
def test_fuzz_calibration_records(base_records, data):
    text, valid, shards = data.draw(records_file(base_records))
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "records.jsonl", Path(d) / "cal.json"
        src.write_text(text)
        r = invoke("calibrate", "--backend", "fbgemm", "--from-records", src, "--out", out)
        check(r, valid, [out], names=str(src), case=text)
        if valid:
            assert json.loads(out.read_text())["fit"]["shards"] == shards


# --------------------------------------------------------------------------------------------
# Resuming a finished training run (issue 34): the model is never lost
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_tasks(pool, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("traintasks")
    r = invoke("data", "tasks", "--pool", pool, "--tables", "3", "--devices", 2, "--max-memory", BIG_MEMORY, "--num-train", 3, "--num-test", 1, "--out", out)
    assert r.exit_code == 0, r.stderr
    return out / "train.jsonl"


@settings(FUZZ, max_examples=max(6, EXAMPLES // 25))
@given(planner=st.sampled_from(["rnn", "autoshard"]), damage=st.sampled_from(["none", "missing", "garbage", "another run's model"]),
       log=st.booleans())
def test_fuzz_resume_of_a_finished_run(train_tasks, planner, damage, log):
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        out = d / "m.pt"
        base = ["train", "--planner", planner, "--tasks", train_tasks, "--iterations", 2, "--budget", 2, "--batch-size", 64, "--out", out]
        base += ["--log", d / "log.jsonl"] if log else []
        assert invoke(*base).exit_code == 0
        first, log_text = out.read_bytes(), (d / "log.jsonl").read_text() if log else None
        meta = torch.load(out, weights_only=True)["meta"]
        if damage == "missing":
            out.unlink()
        elif damage == "garbage":
            out.write_bytes(b"not a model")
        elif damage == "another run's model":
            torch.save({**torch.load(out, weights_only=True), "meta": {"measurements": 0}}, out)
        r = invoke(*base, "--resume")
        assert r.exit_code == 0 and result_is_clean(r), (planner, damage, r.stderr)
        lines = r.stdout.splitlines()
        if damage == "none":
            assert lines[-1] == f"{out}: this run had already finished (2 iterations, 2 measured plans); the model is left as it was"
            assert out.read_bytes() == first
        else:
            assert lines[-1] == f"wrote {out} from the last checkpoint of the finished run (2 iterations, 2 measured plans)"
        assert torch.load(out, weights_only=True)["meta"] == meta and meta["measurements"] == 2
        if log:
            assert (d / "log.jsonl").read_text() == log_text


# --------------------------------------------------------------------------------------------
# Concurrent writers: two processes writing the same --out at once
# --------------------------------------------------------------------------------------------

# The writers: (kind of --out, arguments before "--out OUT"). Two drawn (the same command with
# other options, or two commands writing the same kind of output) run at once as two processes
# (forked from this one: milliseconds, where a new interpreter takes seconds); a file must end
# exactly as one of them writes it alone, a folder as one's whole set of files written over the
# other's (never train.jsonl of one beside test.jsonl of the other).
WRITERS = {
    "plan size": ("file", lambda f: ["plan", f["pool"] / "tables.csv", "--devices", 2, "--max-memory", BIG_MEMORY, "--planner", "size"]),
    "plan lookup": ("file", lambda f: ["plan", f["pool"] / "tables.csv", "--devices", 3, "--max-memory", BIG_MEMORY, "--planner", "lookup"]),
    "plan --tasks": ("file", lambda f: ["plan", "--tasks", f["tasks"] / "train.jsonl", "--planner", "random"]),
    "measure A": ("file", lambda f: ["measure", f["plan_a"], "--backend", "sim"]),
    "measure B": ("file", lambda f: ["measure", f["plan_b"], "--backend", "sim", "--batch-size", 1024]),
    "calibrate A": ("file", lambda f: ["calibrate", "--backend", "fbgemm", "--from-records", f["records_a"]]),
    "calibrate B": ("file", lambda f: ["calibrate", "--backend", "fbgemm", "--from-records", f["records_b"]]),
    "data synth 1": ("folder", lambda f: ["data", "synth", "--tables", 12, "--seed", 1]),
    "data synth 2": ("folder", lambda f: ["data", "synth", "--tables", 9, "--seed", 2, "--family", "wide"]),
    "data tasks 0": ("folder", lambda f: ["data", "tasks", "--pool", f["pool"], "--tables", 2, "--devices", 2, "--max-memory", BIG_MEMORY, "--num-train", 3, "--num-test", 2]),
    "data tasks 1": ("folder", lambda f: ["data", "tasks", "--pool", f["pool"], "--tables", 3, "--devices", 2, "--max-memory", BIG_MEMORY, "--num-train", 2, "--num-test", 3, "--seed", 1]),
}


def _contents(out: Path) -> dict[str, bytes] | bytes | None:
    """A file's bytes, or a folder's files by name (temporary files included: none may be left)."""
    if out.is_dir():
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    return out.read_bytes() if out.exists() else None


@pytest.fixture(scope="module")
def writers(pool, base_plan, base_records, train_tasks, tmp_path_factory) -> tuple[dict, dict]:
    """The writers' inputs, and what each writes alone (its output, which must not depend on where)."""
    d = tmp_path_factory.mktemp("writers")
    plan_b = {**base_plan, "devices": 3}
    plan_b["tables"] = [{**e, "shards": [{**e["shards"][0], "device": i % 3}]} for i, e in enumerate(base_plan["tables"])]
    records = [json.loads(line) for line in RECORDS.read_text().splitlines()[:24]]
    files = {"pool": pool, "tasks": train_tasks.parent, "plan_a": d / "plan_a.json", "plan_b": d / "plan_b.json",
             "records_a": d / "records_a.jsonl", "records_b": d / "records_b.jsonl"}
    files["plan_a"].write_text(json.dumps(base_plan))
    files["plan_b"].write_text(json.dumps(plan_b))
    files["records_a"].write_text("".join(json.dumps(r) + "\n" for r in records[:12]))
    files["records_b"].write_text("".join(json.dumps(r) + "\n" for r in records[10:24]))
    alone = {}
    for name, (kind, args) in WRITERS.items():
        out = d / name.replace(" ", "_") / ("out" if kind == "folder" else "out.json")
        r = invoke(*args(files), "--out", out)
        assert r.exit_code == 0, (name, r.stderr)
        alone[name] = _contents(out)
    assert len({repr(v) for v in alone.values()}) == len(alone)  # every writer's output is its own
    return files, alone


def _slow_writes(delays: tuple[float, float]) -> None:
    """In a child: every atomic write waits before and after (a slow disk, a busy machine), so
    that two writers' files interleave as they can in the field. What is written is unchanged."""
    import time

    import dreamshard.files as files_module

    real = files_module.atomic_write

    def slow(*args, **kwargs):
        time.sleep(delays[0])
        real(*args, **kwargs)
        time.sleep(delays[1])

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("dreamshard") and getattr(module, "atomic_write", None) is real:
            module.atomic_write = slow


def _fork_cli(args: list, go: int, err: Path, delays: tuple[float, float]) -> int:
    """A child process running `dreamshard ARGS` as its entry point does, once `go` (a pipe) says
    so; its stderr to `err`, its stdout dropped. Returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        sys.stderr = open(err, "w")
        sys.stdout = open(os.devnull, "w")
        os.dup2(sys.stderr.fileno(), 2)
        os.dup2(sys.stdout.fileno(), 1)
        _slow_writes(delays)
        os.read(go, 1)
        sys.argv = ["dreamshard", *map(str, args)]
        from dreamshard.cli import main

        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the test reads it from the child's stderr
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait_all(pids: list[int], hang_s: float = 300) -> list[int]:
    """The children's exit statuses; a hang guard only (a command here takes well under a second)."""
    import time

    statuses, end = {}, time.monotonic() + hang_s
    while len(statuses) < len(pids):
        for pid in pids:
            if pid not in statuses:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            for pid in pids:
                if pid not in statuses:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
            raise AssertionError(f"concurrent writers still running after {hang_s} s: a hang")
        time.sleep(0.005)
    return [statuses[pid] for pid in pids]


@settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
@given(data=st.data())
def test_fuzz_concurrent_writers(writers, data):
    files, alone = writers
    kind = data.draw(st.sampled_from(["file", "folder"]))
    names = sorted(n for n, (k, _) in WRITERS.items() if k == kind)
    first = data.draw(st.sampled_from(names))
    others = [n for n in names if n != first]
    pair = [first, data.draw(st.sampled_from(others) if data.draw(st.integers(0, 3)) else st.just(first))]  # a quarter: the same writer twice
    delays = [data.draw(st.tuples(*[st.sampled_from([0.0, 0.0, 0.002, 0.01])] * 2)) for _ in pair]
    existing = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        out = d / ("out" if kind == "folder" else "out.json")
        if existing:  # an earlier output in the way, replaced whole
            if kind == "folder":
                out.mkdir()
                (out / "train.jsonl").write_text("an earlier run's tasks\n")
            else:
                out.write_text("an earlier report")
        go_read, go_write = os.pipe()
        try:
            pids = [_fork_cli([*WRITERS[n][1](files), "--out", out], go_read, d / f"err{i}", delays[i]) for i, n in enumerate(pair)]
            os.write(go_write, b"go")  # both at once
        finally:
            os.close(go_read)
            os.close(go_write)
        statuses = _wait_all(pids)
        case = (pair, delays, existing)
        event(f"{kind}: {'same writer' if pair[0] == pair[1] else 'two writers'}")
        for i in range(2):
            err = (d / f"err{i}").read_text()
            assert statuses[i] == 0 and "Traceback" not in err, (case, statuses[i], err)
        got = _contents(out)
        if kind == "file":
            assert got in (alone[pair[0]], alone[pair[1]]), (case, got)
        else:  # one writer's whole set, then the other's over it (an earlier file neither writes stays)
            earlier = {"train.jsonl": b"an earlier run's tasks\n"} if existing else {}
            orders = [{**earlier, **alone[a], **alone[b]} for a, b in (pair, pair[::-1])]
            assert got in orders, (case, {k: [k in o and o[k] == v for o in orders] for k, v in got.items()})
        assert not [p for p in d.rglob("*") if ".tmp" in p.name], case


# --------------------------------------------------------------------------------------------
# A handful through a real subprocess: exit statuses and stderr as a user sees them
# --------------------------------------------------------------------------------------------


def run(*args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([*DREAMSHARD, *map(str, args)], capture_output=True, text=True, env=env, timeout=240)


def test_subprocess_help_and_version_exit_0():
    for args in (["--help"], ["--version"], ["plan", "--help"], ["measure", "--help"], ["data", "dlrm", "--help"], ["calibrate", "comm", "--help"]):
        p = run(*args)
        assert p.returncode == 0 and p.stderr == "" and p.stdout, (args, p.stderr)


def test_subprocess_bad_input_one_line_exit_2(tmp_path, base_plan):
    (tmp_path / "big.csv").write_text("name,rows,dim,pooling_factor,distribution\na,1e30,16,1,uniform\n")
    (tmp_path / "list.json").write_text(json.dumps([base_plan]))
    torch.save((torch.tensor([1, -18, 3]), torch.tensor([0, 1, 2, 3]), torch.tensor([[1, 1, 1]])), tmp_path / "neg.pt")
    torch.save((torch.tensor([1.5, 2.7, 3.0]), torch.tensor([0, 1, 2, 3]), torch.tensor([[1, 1, 1]])), tmp_path / "float.pt")
    cases = [
        (["plan", tmp_path / "big.csv", "--devices", 2, "--max-memory", "5GB", "--out", tmp_path / "o.json"], "'rows': '1e30' is over the limit"),
        (["measure", tmp_path / "list.json", "--backend", "sim", "--out", tmp_path / "o.json"], "expected a dreamshard.plan/2 plan"),
        (["data", "dlrm", tmp_path / "neg.pt", "--out", tmp_path / "pool1"], "index -18 at position 1 is negative"),
        (["data", "dlrm", tmp_path / "float.pt", "--out", tmp_path / "pool2"], "indices are float32, not integers"),
        (["plan", "--bogus"], "No such option '--bogus'"),
    ]
    for args, needle in cases:
        p = run(*args)
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "pool1").exists() and not (tmp_path / "pool2").exists()


def test_subprocess_killed_worker_exit_1_names_it(tmp_path, base_plan):
    """A distributed worker killed outright (SIGKILL): exit 1, one line naming that worker, not a peer that lost it."""
    from dreamshard.costs.kernels import available_kernels
    from dreamshard.costs.runners.distributed import FAULT_ENV

    kernel = "fbgemm" if "fbgemm" in available_kernels("cpu") else "torch"
    (tmp_path / "p.json").write_text(json.dumps(base_plan))
    p = run("measure", tmp_path / "p.json", "--backend", kernel, "--runner", "distributed", "--batch-size", 64, "--iters", 1, "--warmup", 0,
            "--precision", "fp32", "--timeout", 120, env_extra={FAULT_ENV: "kill:1"})
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "worker 1 of 2 was killed by SIGKILL" in p.stderr
    assert not list(tmp_path.glob("p.cost-*"))
