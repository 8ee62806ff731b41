import gzip
import io
from dataclasses import replace

import numpy as np
import pytest
import torch

from dreamshard.bins import BIN_EDGES, NUM_BINS, REFERENCE_BATCH, count_bins, reuse_stats, reuse_stats_many
from dreamshard.plan import row_cuts
from dreamshard.streams import (empirical_reuse, load_dlrm_file, row_range_stats, row_sample, row_sample_batch, row_shard_spec, shard_batch,
                                stream_bins, synthetic_bags, table_bags, tables_from_dlrm)
from dreamshard.tables import TableSpec
from dreamshard.validation import DataError


@pytest.mark.parametrize("rows,pf,dist", [(5_000, 4.0, "zipf:1.2"), (300_000, 12.0, "zipf:0.8"), (2_000, 1.0, "uniform")])
def test_analytic_reuse_matches_sampled_stream(rows, pf, dist):
    t = TableSpec("a", rows, 8, pf, distribution=dist, seed=11)
    expected = reuse_stats(rows, pf, dist, 16_384)
    _, ix = synthetic_bags(t, 16_384)
    got = empirical_reuse(ix)
    assert np.abs(np.array(expected["bins"]) - got["bins"]).sum() < 0.03
    # lookup-weighted bins hinge on the few hottest rows, whose counts straddle bin edges by chance
    assert np.abs(np.array(expected["lookup_bins"]) - got["lookup_bins"]).sum() < 0.08
    assert abs(got["unique"] / expected["unique"] - 1) < 0.03


def test_streams_deterministic_and_in_range():
    t = TableSpec("a", 777, 8, 3.0, distribution="zipf:1.05", seed=5)
    l1, i1 = synthetic_bags(t, 1000, step=2)
    l2, i2 = synthetic_bags(t, 1000, step=2)
    assert torch.equal(l1, l2) and torch.equal(i1, i2)
    _, i3 = synthetic_bags(t, 1000, step=3)
    assert not torch.equal(i1[:100], i3[:100])
    assert int(i1.min()) >= 0 and int(i1.max()) < 777 and int(l1.sum()) == i1.numel()
    assert abs(l1.double().mean().item() - 3.0) < 0.3


def test_shard_batch_layout():
    tables = [TableSpec("a", 100, 4, 2.0, distribution="uniform", seed=1), TableSpec("b", 50, 8, 0.0, distribution="uniform", seed=2)]
    indices, offsets = shard_batch(tables, 64)
    assert offsets.numel() == 2 * 64 + 1 and int(offsets[-1]) == indices.numel()
    assert int(offsets[128]) == int(offsets[64])  # table b has no lookups


def _write_dlrm(path, lengths, rng):
    T, B = lengths.shape
    offsets = torch.zeros(T * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths.flatten(), 0)
    indices = torch.from_numpy(rng.integers(0, 1000, int(offsets[-1]))).to(torch.int64)
    buf = io.BytesIO()
    torch.save((indices, offsets, lengths), buf)
    data = gzip.compress(buf.getvalue()) if str(path).endswith(".gz") else buf.getvalue()
    path.write_bytes(data)
    return indices, offsets


@pytest.mark.parametrize("suffix", [".pt", ".pt.gz"])
def test_dlrm_format_loader(tmp_path, suffix):
    rng = np.random.default_rng(0)
    lengths = torch.from_numpy(rng.integers(0, 6, (3, 32))).to(torch.int64)
    lengths[2] = 0  # a table with no lookups
    path = tmp_path / f"small{suffix}"
    indices, offsets = _write_dlrm(path, lengths, rng)
    specs = tables_from_dlrm(path, dims=[4, 8, 16])
    assert [s.dim for s in specs] == [4, 8, 16]
    t0 = indices[: int(offsets[32])]
    assert specs[0].rows == int(t0.max()) + 1
    assert specs[0].pooling_factor == pytest.approx(lengths[0].double().mean().item())
    assert specs[2].pooling_factor == 0
    assert specs[0].bins == pytest.approx(tuple(empirical_reuse(t0)["bins"]))
    # streams replay the file's bags, cycling samples for a larger batch
    ln, ix = table_bags(specs[1], 64)
    assert torch.equal(ln[:32], lengths[1]) and torch.equal(ln[32:], lengths[1])
    assert torch.equal(ix[: int(lengths[1].sum())], indices[int(offsets[32]) : int(offsets[64])])


def test_dlrm_loader_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(DataError, match="cannot read this DLRM dataset file"):
        load_dlrm_file(bad)
    wrong = tmp_path / "wrong.pt"
    torch.save((torch.zeros(3, dtype=torch.int64), torch.zeros(5, dtype=torch.int64), torch.ones(2, 2, dtype=torch.int64)), wrong)
    with pytest.raises(DataError, match="offsets"):
        load_dlrm_file(wrong)


def test_default_pool_matches_published_stats():
    """Target: lookup-weighted reuse histogram within L1 0.10 of the 2021 file, mean
    lookups per table-sample within 10%."""
    from dreamshard.synth import PoolConfig, pool_stats, published_stats, synth_pool

    ref = published_stats("2021")
    pool = synth_pool(PoolConfig(seed=5))
    mine = pool_stats(pool, ref.batch_size)
    assert np.abs(np.array(mine.lookup_hist) - ref.lookup_hist).sum() <= 0.10
    assert abs(mine.lookups_per_table_sample / ref.lookups_per_table_sample - 1) <= 0.10
    assert len({t.name for t in pool}) == 856 and sum(t.pooling_factor == 0 for t in pool) > 0
    assert synth_pool(PoolConfig(tables=20, seed=5)) == synth_pool(PoolConfig(tables=20, seed=5))


# --------------------------------------------------------------------------------------------
# Expected reuse statistics: the batched path against the former per-table sum
# --------------------------------------------------------------------------------------------


def _reference_stats(rows: int, pooling_factor: float, distribution: str, batch_size: int = 65_536) -> dict:
    """The former per-table `reuse_stats`, kept as the reference: for each table, the
    Poisson bin probabilities summed over ~6,000 representative ranks (every rank below 2,048,
    then 4,096 geometric buckets), ~9 ms a table."""
    from scipy.special import gammaincc

    lookups = batch_size * pooling_factor
    if lookups <= 0:
        return {"bins": [0.0] * NUM_BINS, "lookup_bins": [0.0] * NUM_BINS, "unique": 0.0, "lookups": 0.0}
    ranks = np.arange(min(rows, 2048), dtype=np.float64)
    weight = np.ones_like(ranks)
    if rows > 2048:
        edges = np.unique(np.geomspace(2048, rows, 4096).astype(np.int64))
        edges[0], edges[-1] = 2048, rows
        ranks = np.concatenate([ranks, (edges[:-1] + edges[1:] - 1) / 2.0])
        weight = np.concatenate([weight, np.diff(edges).astype(np.float64)])
    if distribution == "uniform":
        p = np.full(ranks.shape, 1.0 / rows)
    else:
        alpha, x0, x1 = float(distribution.split(":")[1]), ranks + 1.0, ranks + 2.0
        e = 1.0 - alpha
        p = (np.log(x1) - np.log(x0)) / np.log(rows + 1.0) if abs(e) < 1e-9 else (x1**e - x0**e) / ((rows + 1.0) ** e - 1.0)
    lam = lookups * p
    ks = np.array(BIN_EDGES, dtype=np.float64)
    ones = np.ones((1, lam.size))
    in_bin = np.diff(np.vstack([gammaincc(ks[:, None] + 1, lam[None, :]), ones]), axis=0)
    below = np.vstack([np.zeros_like(lam), gammaincc(ks[1:, None], lam[None, :])])
    rows_in = (in_bin * weight).sum(axis=1)
    lookups_in = (lam * np.diff(np.vstack([below, ones]), axis=0) * weight).sum(axis=1)
    return {"bins": rows_in / rows_in.sum(), "lookup_bins": lookups_in / lookups_in.sum(), "unique": rows_in.sum(), "lookups": lookups}


def _random_triples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    rows = np.maximum(np.round(10 ** rng.uniform(0, 10, n)), 1).astype(np.int64)
    pf = np.where(rng.random(n) < 0.05, 0.0, 10 ** rng.uniform(-3, 3, n))
    dists = ["uniform" if rng.random() < 0.15 else f"zipf:{a:.4f}" for a in rng.uniform(0.05, 3.0, n)]
    dists[:3] = ["zipf:1", "zipf:1.0000000001", "zipf:0.05"]  # the log form at alpha = 1; near-uniform
    return rows, pf, dists


def test_batched_reuse_stats_equal_the_per_table_sum():
    rows, pf, dists = _random_triples(300, seed=15)
    got = reuse_stats_many(rows, pf, dists)
    for i, (r, p, d) in enumerate(zip(rows, pf, dists)):
        ref = _reference_stats(int(r), float(p), d)
        where = f"rows={r} pooling={p:.4g} {d}"
        assert np.abs(got["bins"][i] - ref["bins"]).max() < 2.5e-4, where
        assert np.abs(got["lookup_bins"][i] - ref["lookup_bins"]).max() < 2.5e-4, where
        assert got["unique"][i] == pytest.approx(ref["unique"], rel=1e-4, abs=1e-9), where
        assert got["lookups"][i] == pytest.approx(ref["lookups"])
    # the one-table call is the batched one
    one = reuse_stats(int(rows[7]), float(pf[7]), dists[7])
    assert np.array_equal(one["bins"], got["bins"][7]) and one["unique"] == got["unique"][7]
    assert np.allclose(got["bins"][pf > 0].sum(axis=1), 1.0) and not got["bins"][pf == 0].any()


# --------------------------------------------------------------------------------------------
# A row range's share of the lookups and its bins, from a sample of its table's stream
# --------------------------------------------------------------------------------------------

ROW_TABLES = [
    TableSpec("exact", 100_000, 8, 1.5, distribution="zipf:1.4", seed=11),  # the sample is the reference batch
    TableSpec("hot", 2_000, 8, 60.0, distribution="zipf:0.9", seed=2),  # every row resolved, hot rows uneven
    TableSpec("cold", 2_000_000, 8, 40.0, distribution="zipf:0.6", seed=5),  # most rows never seen in the sample
    TableSpec("flat", 300_000, 8, 80.0, distribution="uniform", seed=7),
]


@pytest.mark.parametrize("table", ROW_TABLES, ids=lambda t: t.name)
def test_row_range_shares_partition_the_tables_lookups(table):
    for parts in (1, 3, 8):
        stats = [row_range_stats(table, a, b) for a, b in row_cuts(table.rows, parts)]
        assert sum(share for share, _ in stats) == pytest.approx(1.0, abs=1e-12)
        for _, bins in stats:
            assert len(bins) == NUM_BINS and min(bins) >= 0.0 and sum(bins) == pytest.approx(1.0)
    # the whole table as one range is the table: every lookup, its stream's bins
    share, bins = row_range_stats(table, 0, table.rows)
    assert share == 1.0 and np.allclose(bins, stream_bins(table))


@pytest.mark.parametrize("table", ROW_TABLES, ids=lambda t: t.name)
def test_row_ranges_match_their_counts_on_the_reference_batch(table):
    """Share and bins of each eighth of the table against those counted on its whole stream at the
    reference batch: the share within its sampling error, the bins close (total variation), the simulator's price
    within 2%; the sample's own bins (what the reweighting replaces) are far off where the sample
    is smaller than the reference batch. Zipf's hot rows make the shares uneven, and the sample
    measures that."""
    from dreamshard.costs.sim import SimBackend

    _, ix = table_bags(table, REFERENCE_BATCH, 0)
    rows, counts = np.unique(ix.numpy(), return_counts=True)
    _, sample = table_bags(table, row_sample_batch(table), 0)
    n, shares = row_sample(table).lookups, []
    for a, b in row_cuts(table.rows, 8):
        share, bins = row_range_stats(table, a, b)
        i, j = np.searchsorted(rows, [a, b])
        mine = counts[i:j]
        want, (in_bins, _) = mine.sum() / counts.sum(), count_bins(mine)
        want_bins = in_bins / mine.size
        assert abs(share - want) < 4 * np.sqrt(want * (1 - want) / n), (a, b)
        # (the bins of another batch of the stream differ by up to 0.03 on the hot table's 250-row ranges)
        assert np.abs(np.array(bins) - want_bins).sum() / 2 < 0.06, (a, b)
        spec = row_shard_spec(table, a, b)
        measured = replace(spec, pooling_factor=table.pooling_factor * want, bins=tuple(want_bins))
        got, ref = SimBackend().shard_compute([[spec], [measured]]).sum(axis=1)
        assert got == pytest.approx(ref, rel=0.02), (a, b)
        if row_sample_batch(table) < REFERENCE_BATCH:
            raw = empirical_reuse(sample[(sample >= a) & (sample < b)])["bins"]
            assert np.abs(np.array(raw) - want_bins).sum() / 2 > 0.3
        shares.append(share)
    if table.name == "hot":
        assert max(shares) - min(shares) > 0.05  # an even split would be 1/8 each


@pytest.mark.parametrize("rows", [300, 120_000, 5_000_000])
def test_row_sample_counts_every_seen_row(rows):
    """The sample's rows and counts, whether counted per row (tables no larger than the sample) or
    by sorting, are those of the sampled stream."""
    table = TableSpec(name="t", rows=rows, dim=16, pooling_factor=3.0, distribution="zipf:1.1", seed=4)
    _, sample = table_bags(table, row_sample_batch(table), 0)
    want_rows, want_counts = np.unique(sample.numpy(), return_counts=True)
    got = row_sample(table)
    hot = np.isin(want_rows, got.hot_rows)
    assert np.array_equal(np.sort(np.concatenate([got.cold_rows, got.hot_rows])), want_rows)
    assert np.array_equal(np.diff(got.hot_upto), want_counts[hot]) and np.array_equal(np.diff(got.cold_upto), want_counts[~hot])
    assert got.lookups == sample.numel()


def test_a_row_ranges_bins_follow_the_stream_not_the_specs_bins():
    """A spec given bins that are not its stream's (here the default: every row read once): its row
    shards' bins are its stream's, as the kernels would see them."""
    given = TableSpec("w", 5000, 96, 20.0, distribution="zipf:1.1", seed=3)
    derived = replace(given, bins=tuple(stream_bins(given)))
    assert given.bins != derived.bins
    for a, b in row_cuts(given.rows, 4):
        share, bins = row_range_stats(given, a, b)
        assert (share, bins) == row_range_stats(derived, a, b) and bins[0] < 0.5
