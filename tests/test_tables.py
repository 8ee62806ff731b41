import json

import numpy as np
import pytest

from dreamshard.tables import NUM_BINS, NUM_FEATURES, TableError, TableSpec, features, load_tables, save_tables

HEADER = "name,rows,dim,pooling_factor,distribution\n"


def write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_with_distribution_derives_bins(tmp_path):
    p = write(tmp_path, HEADER + "a,1000,16,3.5,zipf:1.1\nb,50000,64,0,uniform\n")
    a, b = load_tables(p)
    assert (a.rows, a.dim, a.pooling_factor) == (1000, 16, 3.5)
    assert len(a.bins) == NUM_BINS and abs(sum(a.bins) - 1) < 1e-6
    # 229k lookups over 1000 rows: every accessed row is used many times, none once
    assert a.bins[0] < 0.05
    assert sum(b.bins) == 0  # zero-lookup table touches no row


def test_csv_with_bins_roundtrip(tmp_path):
    t = TableSpec("x", 123, 8, 2.0, bins=tuple([0.5, 0.5] + [0.0] * 15), distribution="zipf:0.9", seed=7)
    save_tables([t], tmp_path / "a.csv")
    save_tables([t], tmp_path / "a.json")
    assert load_tables(tmp_path / "a.csv") == [t]
    assert load_tables(tmp_path / "a.json") == [t]


@pytest.mark.parametrize(
    "row, needle",
    [
        ("a,-5,16,1,uniform", "column 'rows'"),
        ("a,10.5,16,1,uniform", "column 'rows'"),
        ("a,100,6,1,uniform", "column 'dim'"),
        ("a,100,0,1,uniform", "column 'dim'"),
        ("a,100,16,nan,uniform", "column 'pooling_factor'"),
        ("a,100,16,,uniform", "column 'pooling_factor'"),
        ("a,100,16,1,zipf:x", "column 'distribution'"),
        ("a,100,16,1,", "distribution"),
    ],
)
def test_bad_values_name_file_line_column(tmp_path, row, needle):
    p = write(tmp_path, HEADER + "ok,10,4,1,uniform\n" + row + "\n")
    with pytest.raises(TableError) as e:
        load_tables(p)
    msg = str(e.value)
    assert str(p) in msg and "line 3" in msg and needle in msg and "\n" not in msg


def test_missing_column_and_duplicate_name(tmp_path):
    with pytest.raises(TableError, match="missing column 'dim'"):
        load_tables(write(tmp_path, "name,rows,pooling_factor\na,1,1\n"))
    with pytest.raises(TableError, match="line 3, column 'name': duplicate"):
        load_tables(write(tmp_path, HEADER + "a,10,4,1,uniform\na,10,4,1,uniform\n"))


def test_bins_must_be_complete(tmp_path):
    cols = ",".join(f"bin_{i}" for i in range(NUM_BINS))
    vals = ",".join(["1"] + ["0"] * (NUM_BINS - 2))  # one short
    with pytest.raises(TableError, match="bin_16"):
        load_tables(write(tmp_path, f"name,rows,dim,pooling_factor,{cols}\na,10,4,1,{vals},\n"))


def test_bytes_and_features():
    t = TableSpec("a", 1000, 16, 2.0)
    assert t.bytes("fp16") == 32_000 and t.bytes("fp32") == 64_000
    assert t.bytes("fp16", "rowwise_adagrad") == 32_000 + 4_000
    tables = [TableSpec(f"t{i}", 10 ** (i + 2), 4 * 2**i, float(i)) for i in range(5)]
    fixed = features(tables, "fixed")
    assert fixed.shape == (5, NUM_FEATURES)
    assert np.all(fixed[:, :4] >= 0) and np.all(fixed[:, :4] <= 1.01)
    # fixed features do not depend on the task's other tables; per-task z-scores do
    assert np.allclose(features(tables[:2], "fixed"), fixed[:2])
    task = features(tables, "task")
    assert np.allclose(task[:, :4].mean(axis=0), 0, atol=1e-5)
    assert not np.allclose(features(tables[:2], "task"), task[:2])
    with pytest.raises(ValueError):
        features(tables, "bogus")
