"""TensorObserver: the streamed statistics equal those of all the data at once, exactly, however
the data is batched, ordered or sharded; and they survive a JSON round trip."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from qcli.calibrate.grid import GridHistogram, bin_counts, grid_exponent, grid_index
from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.sampling import WHOLE_SAMPLES, sample_stride, sample_subset, sample_walk
from qcli.errors import CalibrationError


def observe(batches, max_bins=4096, name=None) -> TensorObserver:
    obs = TensorObserver(max_bins=max_bins, name=name)
    for b in batches:
        obs.update(b)
    return obs


def reference_counts(data: np.ndarray, h: GridHistogram) -> np.ndarray:
    """np.histogram of all the data on the observer's final bin edges."""
    counts, _ = np.histogram(data.astype(np.float64), bins=h.edges)
    return counts


def batches_with_growing_range(rng) -> list[np.ndarray]:
    # Small range first, then wider and shifted, so the grid coarsens several times; sizes
    # straddle the chunk size; values on exact grid edges test the binning's exactness.
    return [
        rng.normal(0.0, 0.01, size=1000).astype(np.float32),
        rng.normal(0.5, 1.0, size=(70_000, 2)).astype(np.float32),
        np.array([-3.0, -0.25, 0.0, 0.125, 2.0**-9, -(2.0**-9)], dtype=np.float32),
        rng.uniform(-7.0, 40.0, size=(3, 5, 7)).astype(np.float32),
        rng.standard_t(2, size=5000).astype(np.float32),
    ]


def test_stream_equals_numpy_on_concatenated_data():
    rng = np.random.default_rng(0)
    batches = batches_with_growing_range(rng)
    obs = observe(batches)
    data = np.concatenate([b.ravel() for b in batches])

    assert obs.min == data.min() and obs.max == data.max()
    assert obs.count == data.size and obs.samples == len(batches)
    h = obs.histogram
    np.testing.assert_array_equal(h.counts, reference_counts(data, h))
    np.testing.assert_array_equal(obs.bin_counts, h.counts)
    np.testing.assert_array_equal(obs.bin_edges, h.edges)
    # The bins span exactly [min, max] on the grid of the smallest width that fits max_bins.
    assert h.exponent == grid_exponent(obs.min, obs.max, obs.max_bins)
    assert h.first == math.floor(obs.min / h.width) and h.last == math.floor(obs.max / h.width)


def test_resolution_guarantee():
    rng = np.random.default_rng(1)
    for _ in range(50):
        lo, hi = sorted(rng.uniform(-1e3, 1e3, size=2) * 10.0 ** rng.integers(-6, 6))
        obs = observe([rng.uniform(lo, hi, size=100), np.array([lo, hi])], max_bins=512)
        n = len(obs.bin_counts)
        assert n <= 512
        assert (obs.max - obs.min) / obs.bin_width > (512 - 1) / 2


def test_merge_of_shards_equals_single_stream_exactly():
    rng = np.random.default_rng(2)
    batches = batches_with_growing_range(rng)
    single = observe(batches).to_dict()
    for split in (1, 2, 4):
        for order in (lambda xs: xs, lambda xs: xs[::-1]):
            shards = [observe(order(batches[:split])), observe(order(batches[split:]))]
            merged = shards[1].merge(shards[0])  # merge in the "wrong" order too
            assert merged.to_dict() == single
    # Three-way, into an empty observer.
    total = TensorObserver()
    for part in (batches[3:], batches[:1], batches[1:3]):
        total.merge(observe(part))
    assert total.to_dict() == single


def test_sampled_histogram_is_a_fixed_subset_of_each_sample_and_merges_exactly():
    rng = np.random.default_rng(12)
    # 40 samples of 3x50 values (n = 150, at least 16 binned: stride 7), some with NaN; the
    # first WHOLE_SAMPLES (32) binned whole.
    samples = [rng.normal(i % 4, 1 + i % 3, size=(1, 3, 50)).astype(np.float32) for i in range(40)]
    samples[5][0, 0, 3] = samples[35][0, 0, 7] = np.nan
    assert sample_stride(150, 16) == 7 and WHOLE_SAMPLES == 32
    subset = np.concatenate([s.reshape(-1)[:: 1 if i < 32 else 7] for i, s in enumerate(samples)])
    everything = np.concatenate([s.reshape(-1) for s in samples])

    def run(groups, cuts=()):
        parts, edges = [], [0, *cuts, len(groups)]
        for a, b in itertools.pairwise(edges):
            obs = TensorObserver(max_bins=256, sample_values=16)
            first = sum(len(g) for g in groups[:a])  # a shard starts at this sample
            for g in groups[a:b]:
                obs.update_layout(g[0], samples=len(g))
                obs.update_values(np.concatenate(g), samples=len(g), first=first)
                first += len(g)
            parts.append(obs)
        for other in parts[1:]:
            parts[0].merge(other)
        return parts[0]

    one_by_one = run([[s] for s in samples])
    finite = everything[np.isfinite(everything)]
    assert (one_by_one.min, one_by_one.max, one_by_one.count) == (finite.min(), finite.max(), finite.size)
    assert one_by_one.nan_count == 2 and one_by_one.binned == np.isfinite(subset).sum()
    assert one_by_one.binned < one_by_one.count
    h = one_by_one.histogram
    np.testing.assert_array_equal(h.counts, reference_counts(subset[np.isfinite(subset)], h))
    expected = {**one_by_one.to_dict(), "shape": None}
    for size in (3, 8, 40):  # batched differently, and split into shards merged afterwards
        groups = [samples[i : i + size] for i in range(0, len(samples), size)]
        assert {**run(groups).to_dict(), "shape": None} == expected
        assert {**run(groups, cuts=(len(groups) // 2,)).to_dict(), "shape": None} == expected
    back = TensorObserver.from_dict(json.loads(json.dumps(one_by_one.to_dict())))
    assert back.to_dict() == one_by_one.to_dict()
    # A batch whose first dimension is not its sample count is binned whole.
    batch = np.concatenate(samples[:4]).reshape(3, 4, 50)
    assert sample_subset(batch, 4, 16, first=100) is None
    assert sample_subset(batch.reshape(4, 3, 50), 4, 16, first=100).size == 4 * 22
    with pytest.raises(ValueError, match="sample_values differ"):
        one_by_one.merge(TensorObserver(max_bins=256))


def test_sizes_without_a_small_prime_stride_are_walked_not_binned_whole():
    # 48 = 2**4 * 3 values a sample, at least 16 binned: n // m = 3, and 2 and 3 divide 48, so
    # there is no stride; the walk (i * 5) % 48 for i < 16 takes 16 distinct values that cover
    # every column of a 4x12 sample, instead of all 48 (exported models' sizes are mostly
    # products of 2, 3 and 5: the PaddleOCR classifier had 5 tensor shapes like this).
    assert sample_stride(48, 16) == 1 and sample_walk(48, 16) == (5, 16)
    positions = (np.arange(16) * 5) % 48
    assert len(set(positions.tolist())) == 16 and set((positions % 12).tolist()) == set(range(12))
    rng = np.random.default_rng(5)
    samples = [rng.normal(size=(1, 4, 12)).astype(np.float32) for _ in range(40)]
    subset = np.concatenate([s.reshape(-1) if i < WHOLE_SAMPLES else s.reshape(-1)[positions] for i, s in enumerate(samples)])
    results = []
    for size in (1, 3, 8):
        obs = TensorObserver(max_bins=256, sample_values=16)
        for start in range(0, 40, size):
            obs.update(np.concatenate(samples[start : start + size]), samples=len(samples[start : start + size]))
        results.append({**obs.to_dict(), "shape": None})
    assert results[0] == results[1] == results[2]
    assert results[0]["binned"] == subset.size == 32 * 48 + 8 * 16 and results[0]["count"] == 40 * 48
    h = TensorObserver.from_dict(results[0]).histogram
    np.testing.assert_array_equal(h.counts, reference_counts(subset, h))


def test_batch_order_does_not_matter():
    rng = np.random.default_rng(3)
    batches = batches_with_growing_range(rng)
    forward = observe(batches).to_dict()
    for perm in (rng.permutation(len(batches)) for _ in range(5)):
        assert observe([batches[i] for i in perm]).to_dict() == forward


def test_merge_with_smaller_bin_budget_uses_it():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=1000), rng.normal(3.0, 2.0, size=1000)
    merged = observe([a], max_bins=4096).merge(observe([b], max_bins=256))
    assert merged.to_dict() == observe([a, b], max_bins=256).to_dict()


def test_round_trip_through_json():
    rng = np.random.default_rng(5)
    obs = observe(batches_with_growing_range(rng), name="conv1")
    d = obs.to_dict()
    text = json.dumps(d)
    back = TensorObserver.from_dict(json.loads(text), name="conv1")
    assert back.to_dict() == d
    assert back.min == obs.min and back.max == obs.max and back.bin_width == obs.bin_width
    np.testing.assert_array_equal(back.bin_counts, obs.bin_counts)
    # A restored observer keeps accumulating exactly like the original.
    more = rng.normal(10.0, 50.0, size=999).astype(np.float32)
    obs.update(more)
    back.update(more)
    assert back.to_dict() == obs.to_dict()


def test_float16_float32_float64_inputs_agree():
    rng = np.random.default_rng(6)
    x16 = (rng.normal(size=(64, 300)) * 8).astype(np.float16)
    o16 = observe([x16])
    o64 = observe([x16.astype(np.float64)])
    o32 = observe([x16.astype(np.float32)])
    assert o16.dtype == "float16" and o64.dtype == "float64"
    for o in (o32, o64):
        assert (o.min, o.max, o.count, o.bin_width) == (o16.min, o16.max, o16.count, o16.bin_width)
        np.testing.assert_array_equal(o.bin_counts, o16.bin_counts)
    np.testing.assert_array_equal(o16.bin_counts, reference_counts(x16.ravel(), o16.histogram))


def test_constant_and_zero_tensors():
    obs = observe([np.full((4, 4), 3.0, dtype=np.float32)] * 3)
    assert obs.min == obs.max == 3.0 and obs.count == 48
    assert obs.bin_counts.tolist() == [48]
    assert obs.bin_edges[0] <= 3.0 < obs.bin_edges[1]

    zeros = observe([np.zeros(10, dtype=np.float32)])
    assert zeros.min == zeros.max == 0.0 and zeros.bin_counts.tolist() == [10]
    # A constant tensor then real data: the grid coarsens from the finest width without trouble.
    zeros.update(np.linspace(-1, 1, 101))
    assert zeros.count == 111 and zeros.bin_counts.sum() == 111


def test_empty_batches():
    obs = TensorObserver(name="t")
    obs.update(np.zeros((0, 3), dtype=np.float32), samples=0)
    assert obs.count == 0 and math.isnan(obs.min) and obs.histogram is None
    assert obs.bin_counts.size == 0
    d = obs.to_dict()
    assert d["min"] is None and d["histogram"] is None
    assert TensorObserver.from_dict(json.loads(json.dumps(d))).to_dict() == d

    obs.update(np.array([[1.0, 2.0, 3.0]], dtype=np.float32))
    obs.update(np.zeros((0, 3), dtype=np.float32), samples=0)
    assert obs.count == 3 and obs.min == 1.0 and obs.max == 3.0
    assert obs.shape == (None, 3)  # leading dim differed between batches
    one = observe([np.array([[1.0, 2.0, 3.0]], dtype=np.float32)])
    assert one.merge(TensorObserver()).count == 3


def test_nan_and_inf_are_counted_not_binned():
    x = np.array([1.0, np.nan, -2.0, np.inf, np.nan, -np.inf, 0.5], dtype=np.float32)
    obs = observe([x], name="logits")
    assert (obs.nan_count, obs.posinf_count, obs.neginf_count, obs.nonfinite_count) == (2, 1, 1, 4)
    assert obs.count == 3 and obs.min == -2.0 and obs.max == 1.0
    assert obs.bin_counts.sum() == 3
    with pytest.raises(CalibrationError, match=r"'logits' has 2 NaN and 1 \+Inf and 1 -Inf"):
        obs.require_finite()
    # A batch of nothing but NaN changes no statistics but the counts.
    obs.update(np.full(5, np.nan))
    assert obs.nan_count == 7 and obs.count == 3
    observe([np.ones(3)]).require_finite()  # finite: no error


def test_binning_is_exact_at_the_extremes():
    # Tiny negative values next to a wide range: scaling by 2**-k underflows to -0.0 unless
    # handled; they belong in bin -1.
    cases = ((np.float32, np.float32(-1e-45)), (np.float64, -5e-324), (np.float64, -1e-310))
    for dtype, tiny in cases:
        x = np.array([tiny, 0.0, 1e5, -3.0], dtype=dtype)
        obs = observe([x])
        h = obs.histogram
        assert h.exponent > 0
        index = [grid_index(float(v), h.exponent) - h.first for v in x]
        expected = np.bincount(index, minlength=len(h.counts))
        np.testing.assert_array_equal(h.counts, expected)
    # Huge and tiny magnitudes.
    x = np.array([-3e38, 3e38, 1e-30], dtype=np.float32)
    obs = observe([x])
    assert obs.min == float(x[0]) and obs.max == float(x[1]) and obs.bin_counts.sum() == 3


def test_bin_counts_matches_floor_formula():
    rng = np.random.default_rng(7)
    x = (rng.normal(size=200_000) * 100).astype(np.float32)
    for k in (-3, 0, 2):
        first = grid_index(float(x.min()), k)
        n = grid_index(float(x.max()), k) - first + 1
        index = (np.floor(x.astype(np.float64) / 2.0**k) - first).astype(np.int64)
        ref = np.bincount(index, minlength=n)
        np.testing.assert_array_equal(bin_counts(x, k, first, n), ref)


def test_grid_histogram_coarsen_and_fold():
    rng = np.random.default_rng(8)
    x = rng.normal(size=10_000)
    h = observe([x]).histogram
    for steps in (1, 3, 70):
        c = h.coarsen(steps)
        np.testing.assert_array_equal(c.counts, reference_counts(x, c))
    f = h.fold()
    assert f.first == 0 and f.total == h.total
    # Away from exact grid edges, folding is |x|'s histogram.
    np.testing.assert_array_equal(f.counts, reference_counts(np.abs(x), f))
    small = h.fold(max_bins=100)
    assert len(small.counts) <= 100 and small.total == h.total
    np.testing.assert_array_equal(small.counts, reference_counts(np.abs(x), small))
    # Data far from 0: the folded histogram starts at 0 but stays small.
    far = observe([rng.uniform(1000.0, 1000.5, size=100)]).histogram.fold(max_bins=2048)
    assert len(far.counts) <= 2048 and far.total == 100


def test_shape_dtype_and_mismatches():
    obs = observe([np.zeros((2, 3, 4), np.float32), np.zeros((5, 3, 4), np.float32)])
    assert obs.shape == (None, 3, 4) and obs.samples == 2
    assert obs.to_dict()["shape"] == [None, 3, 4]
    obs.merge(observe([np.zeros((1, 3, 4), np.float16)]))
    assert obs.dtype == "float32"  # the common type, whatever the merge order
    assert observe([np.zeros(3, np.float64)]).merge(obs).dtype == "float64"
    with pytest.raises(TypeError):
        obs.update(np.arange(3))


def test_from_dict_rejects_corrupt_statistics():
    good = observe([np.linspace(-1, 1, 50)]).to_dict()
    for mutate in (
        lambda d: d.pop("histogram"),
        lambda d: d["histogram"]["counts"].append(1),
        lambda d: d.update(count=d["count"] + 1),
        lambda d: d.update(max=5.0),
        lambda d: d["histogram"].update(log2_bin_width="x"),
        lambda d: d["histogram"].update(log2_bin_width=d["histogram"]["log2_bin_width"] + 1),
        lambda d: d.update(max_bins=1),
        lambda d: d.update(count=0),
    ):
        d = json.loads(json.dumps(good))
        mutate(d)
        with pytest.raises(CalibrationError, match="'act'"):
            TensorObserver.from_dict(d, name="act")


def test_layout_and_values_may_be_noted_apart():
    # A caller may note each batch's layout and pass the values pooled: same statistics.
    rng = np.random.default_rng(9)
    batches = batches_with_growing_range(rng)
    whole = observe(batches, name="t")
    split = TensorObserver(name="t")
    for b in batches:
        split.update_layout(b)
    split.update_values(np.concatenate([b.ravel() for b in batches[:3]]))
    split.update_values(batches[3])
    split.update_values(list(batches[4]))
    assert split.to_dict() == whole.to_dict()
    with pytest.raises(TypeError):
        split.update_values(np.arange(3))
    with pytest.raises(TypeError):
        split.update_layout(np.arange(3))


def test_adopt_values_keeps_own_layout():
    rng = np.random.default_rng(10)
    x = rng.normal(size=(4, 6, 8)).astype(np.float32)
    x[0, 0, 0] = np.nan
    source = observe([x, x[:2] * 3])
    view = TensorObserver(name="t")
    for b in (x, x[:2] * 3):
        view.update_layout(b.transpose(0, 2, 1).reshape(len(b), -1))
    view.adopt_values(source)
    direct = observe([x.transpose(0, 2, 1).reshape(4, -1), (x[:2] * 3).transpose(0, 2, 1).reshape(2, -1)], name="t")
    assert view.to_dict() == direct.to_dict()
    assert view.shape == (None, 48) and source.shape == (None, 6, 8)
    # The copy is independent of its source.
    view.update(np.array([100.0], np.float32))
    assert source.max < 100 and view.max == 100
    with pytest.raises(ValueError):
        TensorObserver(max_bins=64).adopt_values(source)


def test_a_histogram_handed_out_does_not_change_later():
    obs = observe([np.linspace(-1, 1, 101)])
    held = obs.histogram
    counts = held.counts.copy()
    obs.update(np.linspace(-0.5, 0.5, 11))  # inside the range: counted in place
    assert (held.counts == counts).all() and obs.histogram.total == 112
    held_counts = obs.bin_counts
    obs.update(np.zeros(5))
    assert held_counts.sum() == 112 and obs.bin_counts.sum() == 117


def test_float32_binning_is_exact_at_positive_exponents():
    # Wide float32 ranges are binned in float32 too; values that underflow when scaled
    # (tiny negatives, subnormals, -0.0) must land where float64 arithmetic puts them.
    rng = np.random.default_rng(11)
    specials = np.array(
        [-1e-45, -1e-40, -1e-38, -0.0, 0.0, 1e-45, 1e-40, -1.0, 1.0, -3e38, 3e38], dtype=np.float32
    )
    for k in (1, 7, 40, 100, 126):
        spread = 2.0 ** min(k + 8, 120)
        x = np.concatenate([specials, (rng.standard_normal(5000) * spread).astype(np.float32)])
        x = x[np.abs(x.astype(np.float64)) < 2.0 ** (k + 23)]  # indices stay below 2**24
        index = np.floor(x.astype(np.float64) / 2.0**k)  # exact in float64 for these values
        first, n = int(index.min()), int(index.max() - index.min()) + 1
        ref = np.bincount((index - first).astype(np.int64), minlength=n)
        np.testing.assert_array_equal(bin_counts(x, k, first, n), ref)


def test_large_samples_are_binned_whole_up_to_a_value_budget(monkeypatch) -> None:
    # With a 100-value budget, samples of 48 values are binned whole for the first 3 samples,
    # not 32; later ones contribute their 16-value walk. Batching still does not matter.
    from qcli.calibrate import sampling as observers

    monkeypatch.setattr(observers, "WHOLE_VALUES", 100)
    assert observers.whole_samples(48) == 3 and observers.whole_samples(1) == WHOLE_SAMPLES
    rng = np.random.default_rng(6)
    samples = [rng.normal(size=(1, 4, 12)).astype(np.float32) for _ in range(10)]
    dicts = []
    for size in (1, 4):
        obs = TensorObserver(max_bins=256, sample_values=16)
        for start in range(0, 10, size):
            obs.update(np.concatenate(samples[start : start + size]), samples=len(samples[start : start + size]))
        dicts.append({**obs.to_dict(), "shape": None})
    assert dicts[0] == dicts[1] and dicts[0]["binned"] == 3 * 48 + 7 * 16
