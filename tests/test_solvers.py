"""Range solvers on observer statistics: hand-computable cases, the invariants every range must
keep (contains 0, symmetric when asked), and measured quantization error on the actual data."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from qcli.calibrate.grid import GridHistogram
from qcli.calibrate.kl import kl_divergences, kl_range
from qcli.calibrate.mse import QuantizationError, mse_range
from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.solvers import SOLVERS, clipped_fraction, percentile_range, solve_range
from qcli.errors import CalibrationError, ConfigError
from qcli.scheme import QUANT_DTYPES, quant_dtype

INT8, UINT8, INT16, INT4 = (quant_dtype(n) for n in ("int8", "uint8", "int16", "int4"))


def observe(x: np.ndarray, name: str = "t") -> TensorObserver:
    obs = TensorObserver(name=name)
    obs.update(x)
    return obs


def fake_quant(x: np.ndarray, lo: float, hi: float, qdtype, symmetric: bool) -> np.ndarray:
    """Quantize -> dequantize as onnxruntime does: symmetric uses the narrow signed grid
    +-(2**(bits-1) - 1) with zero point 0; asymmetric the full range with a rounded zero point."""
    if symmetric:
        qmax = 2 ** (qdtype.bits - 1) - 1
        scale = hi / qmax
        return np.clip(np.rint(x / scale), -qmax, qmax) * scale
    scale = (hi - lo) / (qdtype.qmax - qdtype.qmin)
    zp = np.clip(np.rint(qdtype.qmin - lo / scale), qdtype.qmin, qdtype.qmax)
    return (np.clip(np.rint(x / scale) + zp, qdtype.qmin, qdtype.qmax) - zp) * scale


def measured_mse(x, lo, hi, qdtype, symmetric) -> float:
    return float(np.mean((x - fake_quant(x, lo, hi, qdtype, symmetric)) ** 2))


@pytest.fixture(scope="module")
def gaussian_with_outlier():
    """1M N(0, 1) values and one outlier at 30 sigma."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=1_000_000)
    x[123] = 30.0
    return x


# ------------------------------------------------------------------------------ scheme


def test_quant_dtype_table():
    assert (INT8.qmin, INT8.qmax, INT8.bits, INT8.signed) == (-128, 127, 8, True)
    assert (UINT8.qmin, UINT8.qmax) == (0, 255)
    assert (INT16.qmin, INT16.qmax, INT16.numpy_dtype) == (-32768, 32767, np.dtype(np.int16))
    assert (INT4.qmin, INT4.qmax, quant_dtype("uint4").qmax) == (-8, 7, 15)
    for d in QUANT_DTYPES.values():
        info = ml_dtypes.finfo(d.numpy_dtype) if d.is_float else np.iinfo(d.numpy_dtype)
        assert info.min <= d.qmin < d.qmax <= info.max
    assert [(d.qmin, d.qmax) for d in QUANT_DTYPES.values() if d.is_float] == [(-448, 448), (-57344, 57344)]
    with pytest.raises(ConfigError, match="unknown quantized dtype 'unit8'") as e:
        quant_dtype("unit8")
    assert "uint8" in e.value.hint


# ------------------------------------------------------------------------ invariants


DATASETS = {
    "gaussian": np.random.default_rng(1).normal(0.3, 2.0, size=20_000),
    "relu": np.maximum(np.random.default_rng(2).normal(size=20_000), 0),
    "negative": -np.random.default_rng(3).exponential(size=20_000),
    "offset": np.random.default_rng(4).uniform(100.0, 101.0, size=5_000),
    "constant": np.full(100, -2.5),
    "zeros": np.zeros(100),
    "tiny": np.random.default_rng(5).normal(size=1_000) * 1e-30,
}


@pytest.mark.parametrize("data", list(DATASETS), ids=list(DATASETS))
def test_every_range_contains_zero_and_symmetric_is_symmetric(data):
    obs = observe(DATASETS[data])
    for method in SOLVERS:
        for name in ("uint8", "int8", "int16", "uint16", "int4"):
            for symmetric in (False, True):
                lo, hi = solve_range(method, obs, quant_dtype(name), symmetric)
                where = f"{method} {name} symmetric={symmetric}"
                assert isinstance(lo, float) and isinstance(hi, float), where
                assert math.isfinite(lo) and math.isfinite(hi), where
                assert lo <= 0.0 <= hi, where
                if symmetric:
                    assert lo == -hi, where
                    assert hi <= max(-obs.min, obs.max), where
                else:
                    assert lo >= min(obs.min, 0.0) and hi <= max(obs.max, 0.0), where


def test_errors():
    empty = TensorObserver(name="act")
    with pytest.raises(CalibrationError, match="'act' saw no finite values"):
        solve_range("minmax", empty, INT8, False)
    obs = observe(np.arange(10.0))
    with pytest.raises(ConfigError, match="unknown calibration method 'entropy'"):
        solve_range("entropy", obs, INT8, False)
    with pytest.raises(ConfigError) as e:
        solve_range("percentil", obs, INT8, False)
    assert "percentile" in e.value.hint
    with pytest.raises(ConfigError, match="percentile"):
        percentile_range(obs, INT8, False, percentile=30)


# ---------------------------------------------------------------------- minmax, percentile


def test_minmax():
    obs = observe(np.array([-1.0, 3.0, 2.0]))
    assert solve_range("minmax", obs, UINT8, False) == (-1.0, 3.0)
    assert solve_range("minmax", obs, INT8, True) == (-3.0, 3.0)
    assert solve_range("minmax", observe(np.array([2.0, 5.0])), UINT8, False) == (0.0, 5.0)


def test_percentile_matches_numpy_within_a_bin():
    x = np.random.default_rng(6).normal(size=100_000)
    obs = observe(x)
    w = obs.bin_width
    lo, hi = percentile_range(obs, UINT8, False, percentile=99.9)
    assert lo == pytest.approx(np.percentile(x, 0.1), abs=w)
    assert hi == pytest.approx(np.percentile(x, 99.9), abs=w)
    lo, hi = percentile_range(obs, INT8, True, percentile=99.9)
    assert hi == pytest.approx(np.percentile(np.abs(x), 99.9), abs=w)


def test_percentile_hand_computed():
    # One value in the middle of each unit: 0.5, 1.5, ..., 999.5.
    obs = observe(np.arange(1000) + 0.5)
    lo, hi = percentile_range(obs, UINT8, False, percentile=99.9)
    # 1 value (0.1%) on each side: the cut falls at the top of the 999th value's bin.
    assert lo == 0.0  # [q(0.1), ...] widened to include 0
    assert 998.5 <= hi <= 998.5 + obs.bin_width
    assert percentile_range(obs, UINT8, False, percentile=100.0) == (0.0, 999.5)


def test_uniform_data_minmax_close_to_percentile_and_mse():
    x = np.random.default_rng(7).uniform(-1.0, 3.0, size=200_000)
    obs = observe(x)
    mm = solve_range("minmax", obs, UINT8, False)
    pc = solve_range("percentile", obs, UINT8, False)
    ms = solve_range("mse", obs, UINT8, False)
    assert pc == pytest.approx(mm, abs=1e-3)
    assert ms == pytest.approx(mm, abs=0.05)  # mse may shave a hair off uniform data


# ---------------------------------------------------------------------------- outliers


def test_outlier_is_clipped_by_all_but_minmax(gaussian_with_outlier):
    x = gaussian_with_outlier
    obs = observe(x)
    for symmetric, dt in ((True, INT8), (False, UINT8)):
        assert solve_range("minmax", obs, dt, symmetric)[1] == 30.0
        for method in ("percentile", "kl", "mse"):
            lo, hi = solve_range(method, obs, dt, symmetric)
            assert hi < 15.0, (method, symmetric)
            assert 0 < clipped_fraction(obs, lo, hi) < 1e-3
        # percentile lands near the body of the Gaussian (~4.4 sigma at 99.999%).
        assert 4.0 < solve_range("percentile", obs, dt, symmetric)[1] < 5.0
    # Symmetric int8 mse: ~4 sigma (the known MSE-optimal 8-bit clip for a Gaussian is 3.9).
    assert 3.5 < solve_range("mse", obs, INT8, True)[1] < 5.0


@pytest.mark.parametrize("symmetric", [True, False])
def test_mse_range_beats_minmax_on_measured_error(gaussian_with_outlier, symmetric):
    x = gaussian_with_outlier
    obs = observe(x)
    dt = INT8 if symmetric else UINT8
    err = {m: measured_mse(x, *solve_range(m, obs, dt, symmetric), dt, symmetric) for m in SOLVERS}
    assert err["mse"] < err["minmax"] / 1.5
    assert err["mse"] <= min(err.values()) * 1.02


def test_mse_keeps_an_outlier_when_clipping_it_costs_more():
    # Squared error weighs one outlier at 1000 sigma among 200k values more than the rounding
    # error of minmax's coarse step (which rounds the whole Gaussian to 0: MSE 1); so mse keeps
    # it, and its measured error is still the lowest. percentile and kl clip it.
    rng = np.random.default_rng(12)
    x = rng.normal(size=200_000)
    x[7] = 1000.0
    obs = observe(x)
    err = {m: measured_mse(x, *solve_range(m, obs, INT8, True), INT8, True) for m in SOLVERS}
    assert err["mse"] <= min(err.values()) * 1.02
    assert solve_range("percentile", obs, INT8, True)[1] < 10.0
    # kl's smallest candidate is 128 of its (at most 2048) bins over [0, 1000]: >= 1000/16.
    assert solve_range("kl", obs, INT8, True)[1] < 500.0


@pytest.mark.parametrize("name", ["int8", "uint8", "int4", "int16"])
def test_mse_model_predicts_measured_error(name):
    # The histogram-based expected error of QuantizationError matches fake-quant on the data.
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.normal(size=100_000), rng.laplace(2.0, 0.5, size=50_000)])
    obs = observe(x)
    dt = quant_dtype(name)
    expected = QuantizationError(obs.histogram)
    for symmetric in (True, False):
        lo, hi = mse_range(obs, dt, symmetric)
        if symmetric:
            qmax = 2 ** (dt.bits - 1) - 1
            model = expected(np.array([-hi]), np.array([hi]), np.array([hi / qmax]))[0]
        else:
            step = (hi - lo) / (dt.qmax - dt.qmin)
            zp = np.clip(np.rint(dt.qmin - lo / step), dt.qmin, dt.qmax)
            lo_q = (dt.qmin - zp) * step
            hi_q = lo_q + (dt.qmax - dt.qmin) * step
            model = expected(np.array([lo_q]), np.array([hi_q]), np.array([step]))[0]
        assert model / x.size == pytest.approx(measured_mse(x, lo, hi, dt, symmetric), rel=0.05)


@pytest.mark.parametrize("kind", ["skewed", "heavy-tailed", "one outlier"])
def test_mse_range_is_as_good_as_the_best_of_a_fine_grid(kind):
    """The search (a coarse grid, two finer ones, coordinate descent within a reach) against
    brute force: the expected error of every (lo, hi) on a 240 x 240 grid of fractions."""
    rng = np.random.default_rng(3)
    x = {"skewed": np.concatenate([rng.normal(-0.2, 0.3, 60_000), rng.exponential(1.5, 40_000)]),
         "heavy-tailed": rng.standard_t(2.5, 100_000),
         "one outlier": np.append(rng.normal(0.5, 1.0, 100_000), [-3.0, 60.0])}[kind]
    obs = observe(x)
    h = obs.histogram
    while len(h.counts) > 1024:
        h = h.coarsen(1)
    err = QuantizationError(h)

    def expected(lo, hi):
        step = (hi - lo) / 255
        zp = np.clip(np.rint(-lo / step), 0, 255)
        return err((0 - zp) * step, (255 - zp) * step, step)

    fractions = np.geomspace(2.0**-8, 1.0, 240)
    lo, hi = np.meshgrid(fractions * obs.min, fractions * obs.max)
    brute = float(expected(lo.ravel(), hi.ravel()).min())
    found = float(expected(*(np.array([v]) for v in mse_range(obs, UINT8, False)))[0])
    assert found <= 1.002 * brute  # the coarse grid alone: up to 0.9% above


def test_quantization_error_against_numeric_integration():
    h = GridHistogram(exponent=-2, first=-6, counts=np.array([1, 0, 4, 7, 2, 0, 0, 3, 5, 1]))
    err = QuantizationError(h)
    lo, hi = np.array([-0.9, -1.2, -0.3]), np.array([0.9, 0.6, 2.7])
    step = np.array([0.3, 0.2, 0.3])
    # Brute force: many points spread uniformly in each bin.
    got = err(lo, hi, step)
    u = (np.arange(20_000) + 0.5) / 20_000
    for c in range(3):
        total = 0.0
        for j, n in enumerate(h.counts):
            xs = h.edges[j] + u * h.width
            q = np.clip(np.rint(xs / step[c]) * step[c], lo[c], hi[c])
            total += n * np.mean((xs - q) ** 2)
        assert got[c] == pytest.approx(total, rel=1e-6)


# ---------------------------------------------------------------------------------- kl


def smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    zeros = p == 0
    if zeros.all():
        return None
    out = p + eps * zeros - eps * zeros.sum() / (~zeros).sum() * ~zeros
    return None if (out <= 0).any() else out


def kl_reference(counts: np.ndarray, levels: int) -> np.ndarray:
    """TensorRT/MXNet entropy calibration, one candidate at a time, spelled out plainly."""
    h = counts.astype(np.float64)
    divergences = []
    for i in range(levels, len(h) + 1):
        p = h[:i].copy()
        p[-1] += h[i:].sum()
        nonzero = p != 0
        merged = i // levels
        q = np.zeros(i)
        for g in range(levels):
            start = g * merged
            stop = i if g == levels - 1 else start + merged
            if nonzero[start:stop].sum():
                q[start:stop] = h[start:stop].sum() / nonzero[start:stop].sum()
        q[~nonzero] = 0
        ps, qs = smooth(p), smooth(q)
        if ps is None or qs is None:
            divergences.append(np.inf)
            continue
        ps, qs = ps / ps.sum(), qs / qs.sum()
        divergences.append(np.sum(ps * np.log(ps / qs)))
    return np.array(divergences)


@pytest.mark.parametrize("levels", [8, 16, 128])
@pytest.mark.parametrize("shape", ["gaussian", "laplace_with_outliers", "sparse"])
def test_kl_vectorized_equals_reference_loop(levels, shape):
    rng = np.random.default_rng(levels)
    if shape == "gaussian":
        counts = np.histogram(np.abs(rng.normal(size=50_000)), bins=400)[0]
    elif shape == "laplace_with_outliers":
        x = np.concatenate([np.abs(rng.laplace(size=20_000)), [30.0, 31.0, 45.0]])
        counts = np.histogram(x, bins=300)[0]
    else:  # mostly empty bins: smoothing fails for some candidates (-> inf in both)
        counts = np.zeros(260, dtype=np.int64)
        counts[rng.choice(260, size=12, replace=False)] = rng.integers(1, 50, size=12)
        counts[0] = 100
    ref = kl_reference(counts, levels)
    got = kl_divergences(counts, levels)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-9, atol=1e-12)
    assert np.argmin(got) == np.argmin(ref)


def test_kl_on_gaussian_lands_in_a_sensible_band():
    x = np.random.default_rng(9).normal(size=200_000)
    obs = observe(x)
    lo, hi = kl_range(obs, INT8, True)
    assert 2.5 <= hi <= 5.0 and hi <= max(-obs.min, obs.max)
    lo, hi = kl_range(obs, UINT8, False)  # mixed signs: +-T clipped to the data
    assert obs.min <= lo < 0 < hi <= obs.max and 2.5 <= hi


def test_kl_one_sided_and_wide_types():
    rng = np.random.default_rng(10)
    relu = np.maximum(rng.normal(size=100_000), 0)
    relu[:3] = [40.0, 50.0, 60.0]
    obs = observe(relu)
    lo, hi = kl_range(obs, UINT8, False)  # all 256 levels over [0, T]
    assert lo == 0.0 and 0 < hi < 60.0
    # 16-bit: 32768 levels outnumber the histogram's bins: the minmax range.
    assert kl_range(obs, INT16, True) == solve_range("minmax", obs, INT16, True)
    assert kl_range(obs, INT16, False) == (0.0, 60.0)


# ---------------------------------------------------------------------- clipped fraction


def test_clipped_fraction():
    x = np.random.default_rng(11).uniform(0.0, 1.0, size=100_000)
    obs = observe(x)
    assert clipped_fraction(obs, obs.min, obs.max) == 0.0
    assert clipped_fraction(obs, -5.0, 5.0) == 0.0
    outside = np.mean((x < 0.1) | (x > 0.8))
    assert clipped_fraction(obs, 0.1, 0.8) == pytest.approx(outside, abs=1e-3)
    assert clipped_fraction(obs, 2.0, 3.0) == 1.0


def test_ranges_solved_on_two_processes_are_the_ones_solved_in_one(monkeypatch):
    """The helper process solves its jobs as this one does, bit for bit, and `solve_many` (forced:
    min_jobs 0) gives each job's range in order; a helper that cannot start, or fails, leaves
    its jobs to this process, with the same result."""
    import shutil

    from qcli.calibrate import pool
    from qcli.calibrate.ranges import RangeSettings

    rng = np.random.default_rng(5)
    observers = [observe(rng.standard_t(3, 5_000) * (k + 1) + k % 3) for k in range(9)]
    settings = [RangeSettings(method=m) for m in ("mse", "kl", "percentile")]
    jobs = [(o, s, m) for o in observers for s in settings for m in ("minmax", s.method)]
    serial = pool.solve_many(jobs)
    assert len(serial) == len(jobs) and serial[1] == solve_range("mse", observers[0], UINT8, False)
    assert pool._answer(pool._feed(pool._spawn(), jobs), len(jobs)) == serial
    assert pool.solve_many(jobs, min_jobs=0) == serial
    for broken in filter(None, ("/nonexistent/python", shutil.which("false"))):
        monkeypatch.setattr(pool.sys, "executable", broken)
        assert pool._answer(pool._feed(pool._spawn(), jobs), len(jobs)) is None
        assert pool.solve_many(jobs, min_jobs=0) == serial
        with pool.started(pool.READY_JOBS) as helper:
            assert pool.solve_many(jobs, helper=helper) == serial


def test_a_helper_started_ahead_solves_as_this_process_does_and_ends_unused():
    """`pool.started` starts the helper before its jobs exist (from READY_JOBS searches): given
    to `solve_many`, it takes half of them, bit for bit as this process solves them; left
    unused (too few searches after all, or an error in between), it is ended on the way out."""
    from qcli.calibrate import pool
    from qcli.calibrate.ranges import RangeSettings

    rng = np.random.default_rng(7)
    jobs = [(observe(rng.standard_t(3, 4_000) * (k + 1)), RangeSettings(method="mse"), "mse") for k in range(6)]
    serial = [pool.solve(*job) for job in jobs]
    with pool.started(pool.READY_JOBS - 1) as helper:
        assert helper is None
    with pool.started(pool.READY_JOBS) as helper:
        assert helper is not None
        assert pool.solve_many(jobs, helper=helper) == serial
    assert helper.returncode == 0
    with pytest.raises(RuntimeError), pool.started(pool.READY_JOBS) as unused:
        raise RuntimeError("the pass failed")
    assert unused is not None and unused.returncode is not None and unused.stdin.closed
