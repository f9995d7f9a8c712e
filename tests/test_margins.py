"""The agreement predicted from the decisions' margins (qcli.analyze.margins), on draws whose
flip rate is known: margins exponential (densest at 0, where flips come from), changes normal."""

from __future__ import annotations

import numpy as np
import pytest

from qcli.analyze.margins import MarginAccumulator, flip_rate


def draws(rng: np.random.Generator, n: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    return rng.exponential(4.0, n), rng.normal(0.0, spread, n)


@pytest.mark.parametrize("spread", [0.1, 0.3, 1.0])
def test_the_flip_rate_of_many_decisions_is_the_true_one(spread: float) -> None:
    rng = np.random.default_rng(0)
    margins, changes = draws(rng, 1_000_000, spread)
    truth = float(np.mean(margins + changes < 0))
    assert flip_rate(*draws(rng, 20_000, spread)) == pytest.approx(truth, rel=0.1)


@pytest.mark.parametrize("spread", [0.1, 0.3])
def test_32_samples_that_all_agree_still_predict_their_flips(spread: float) -> None:
    """Most 32-sample sets show no flip at these rates (1-3%); the prediction from their
    margins lands near the true rate, on the safe side, and is never 0."""
    rng = np.random.default_rng(1)
    margins, changes = draws(rng, 1_000_000, spread)
    truth = float(np.mean(margins + changes < 0))
    predicted, flipped = [], []
    for _ in range(300):
        m, e = draws(rng, 32, spread)
        predicted.append(flip_rate(m, e))
        flipped.append(bool(np.any(m + e < 0)))
    unflipped = [p for p, f in zip(predicted, flipped, strict=True) if not f]
    assert len(unflipped) > 100  # 0.97 ** 32 = 38% of sets show no flip at 3%
    assert min(predicted) > 0 and float(np.median(unflipped)) > truth / 2
    assert truth <= float(np.median(predicted)) <= 1.5 * truth


def test_probabilities_are_compared_in_log_space_and_sequences_per_position() -> None:
    """Softmax rows: the margin is the log ratio of the top two; a [N, T, C] output gives
    N * T decisions and the agreement of whole samples, (1 - rate) ** T."""
    acc = MarginAccumulator()
    x = np.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]])  # N=1, T=2, C=3
    y = np.array([[[0.6, 0.3, 0.1], [0.1, 0.1, 0.8]]])
    acc.update(x, y)
    assert acc.log and acc.decisions == 2
    np.testing.assert_allclose(acc.margins, [np.log(0.7 / 0.2), np.log(0.8 / 0.1)])
    np.testing.assert_allclose(acc.changes, [np.log(0.6 / 0.3) - np.log(0.7 / 0.2), 0.0], atol=1e-12)
    rate = acc.flip_rate
    assert rate is not None and 0 < rate < 1
    assert acc.predicted(1) == pytest.approx((1 - rate) ** 2)



def test_a_few_samples_changes_with_many_samples_margins_predict_as_all_of_them_would() -> None:
    """A quick probe's 8 samples of 40 decisions each, against the check on all 32, changes
    growing with the margins (as in log space: PaddleOCR's recognizer): paired with the 32
    samples' margins (`MarginPool`, in strata) they give nearly the figure all 32 give, where
    their own 320 margins (one stratum: large changes drawn with small margins) give a fraction
    of it; with the pool holding exactly the measured margins, the figure is the plain one."""
    from qcli.analyze.margins import MarginPool

    rng = np.random.default_rng(2)
    own, pooled, full = [], [], []
    for _ in range(100):
        m = rng.exponential(4.0, 32 * 40)
        e = rng.normal(0.0, 0.02 + 0.15 * m)
        everything = MarginAccumulator()
        everything.add(m, e)
        quick, with_pool = MarginAccumulator(), MarginAccumulator(MarginPool(m, 32))
        quick.add(m[:320], e[:320])
        with_pool.add(m[:320], e[:320])
        own.append(quick.predicted(8))
        pooled.append(with_pool.predicted(8))
        full.append(everything.predicted(32))
    assert np.abs(np.array(pooled) - np.array(full)).mean() < 0.05
    assert np.mean(own) < 0.25 < 0.6 < np.mean(full)
    same = MarginAccumulator(MarginPool(m, 32))
    same.add(m, e)
    assert same.predicted(32) == pytest.approx(everything.predicted(32), rel=1e-9)


def _runs_one_by_one(x: np.ndarray, y: np.ndarray, ids: np.ndarray, blank: int) -> tuple[list[float], list[float]]:
    """The character runs' survival margins as the definition reads: run by run, over the run
    and the blanks beside it, the run's character against the best other class."""
    def best(scores: np.ndarray, c: int) -> float:
        with np.errstate(invalid="ignore"):
            return float((scores[:, c] - np.delete(scores, c, axis=-1).max(axis=-1)).max())

    margins, moved = [], []
    for i, path in enumerate(ids):
        starts = np.flatnonzero(np.concatenate(([True], path[1:] != path[:-1])))
        for s, e in zip(starts, np.append(starts[1:], path.size), strict=True):
            if path[s] != blank:
                window = [p for p in (s - 1, e) if 0 <= p < path.size and path[p] == blank] + list(range(s, e))
                margins.append(best(x[i, window], int(path[s])))
                moved.append(best(y[i, window], int(path[s])))
    return margins, moved


def test_character_runs_are_measured_as_their_definition_reads() -> None:
    """`sequences._runs` works on all positions at once: the same margins, in the same order, as
    run by run, with ties, -inf scores (merged ends) and paths of one run or of blanks only."""
    from qcli.analyze.sequences import _runs

    rng = np.random.default_rng(1)
    for _ in range(200):
        n, t, c = (int(v) for v in (rng.integers(1, 4), rng.integers(1, 30), rng.integers(2, 6)))
        x = rng.normal(size=(n, t, c)).astype(np.float32)
        x[..., 0] += rng.choice([0.0, 2.0, 9.0])  # some, many or only blanks
        x[rng.random(x.shape) < 0.05] = -np.inf
        x = np.round(x) if rng.random() < 0.3 else x  # ties
        y = x + rng.normal(scale=0.5, size=x.shape).astype(np.float32)
        ids = x.argmax(axis=-1)
        for got, want in zip(_runs(x, y, ids, 0), _runs_one_by_one(x, y, ids, 0), strict=True):
            assert got.dtype == np.float64 and np.array_equal(got, np.array(want), equal_nan=True)
