"""The verdict with its uncertainty (issue 17): each gated figure's ~95% interval from its
sample count, and the rule for an interval that straddles the floor, on synthetic counts."""

from __future__ import annotations

import pytest

from qcli.analyze.fidelity import Fidelity, OutputFidelity
from qcli.analyze.intervals import mean_interval, wilson
from qcli.analyze.kinds import Kind
from qcli.analyze.verdict import meets, verdicts
from qcli.precision.goal import Goal


def top1(agree: int, n: int, cosines: list[float] | None = None, predicted: float | None = None) -> OutputFidelity:
    """A class-score output: `agree` of `n` samples with float's argmax; `cosines` per sample;
    `predicted` the agreement its margins predict (None: no margins, as on an output overridden
    to top-1 that is not float)."""
    cos = cosines if cosines is not None else [0.999] * n
    return OutputFidelity("scores", True, agree / n, sum(cos) / n, 30.0, kind=Kind.TOP1, samples=n,
                          predicted_agreement=predicted,
                          agreement_interval=wilson(agree, n),
                          cosine_interval=mean_interval(sum(cos), sum(c * c for c in cos), n))


def embedding(cosines: list[float]) -> OutputFidelity:
    n = len(cosines)
    return OutputFidelity("emb", False, None, sum(cosines) / n, 20.0, kind=Kind.COSINE, samples=n,
                          cosine_interval=mean_interval(sum(cosines), sum(c * c for c in cosines), n))


def ids(equal: int, n: int) -> OutputFidelity:
    """An integer output (one id per sample): no cosine to break a tie."""
    low, high = mean_interval(equal, equal, n)  # shares of 1 and 0: Σx = Σx² = equal
    return OutputFidelity("ids", False, None, None, None, equal / n, kind=Kind.PER_ELEMENT, samples=n,
                          agreement_interval=(max(low, 0.0), min(high, 1.0)))


def test_wilson_matches_its_formula_at_the_edges() -> None:
    assert wilson(400, 400)[0] == pytest.approx(0.99049, abs=1e-4)  # 400 of 400 clear 0.99
    assert wilson(0, 10) == (0.0, pytest.approx(0.27753, abs=1e-4))
    assert wilson(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(("agree", "n", "cosines", "passed", "how"), [
    (400, 400, None, True, "its interval is clear of the floor"),
    (16, 16, [0.999] * 16, True, "its cosine (0.9990-0.9990) is clear of 0.99"),  # straddles: the cosine decides
    (16, 16, [0.995, 0.975] * 8, False, "is not clear of 0.99"),  # 16 of 16, but the scores moved
    (15, 16, None, False, "below the floor"),  # 0.9375 < 0.99, whatever the cosine
    (64, 64, [0.9921] * 64, True, "is clear of 0.99"),
])
def test_without_margins_a_straddling_agreement_is_decided_by_the_cosine(agree: int, n: int, cosines, passed: bool,
                                                                      how: str) -> None:
    (v,) = verdicts(Fidelity((top1(agree, n, cosines),), 0.0), 0.99, None if cosines is None and passed else 0.99)
    assert v.passed is passed and how in v.how
    assert v.samples == n and v.interval == wilson(agree, n)


@pytest.mark.parametrize(("agree", "predicted", "passed", "how"), [
    (32, 0.9963, True, "predict 0.9963 on unseen samples, at or above 0.99"),
    (32, 0.9817, False, "predict 0.9817 on unseen samples, below 0.99"),  # the direction classifier's
    (31, 0.9990, False, "below the floor"),  # 31 of 32: below, whatever the margins say
])
def test_a_straddling_top1_agreement_is_decided_by_its_margins_not_the_cosine(agree: int, predicted: float,
                                                                              passed: bool, how: str) -> None:
    (v,) = verdicts(Fidelity((top1(agree, 32, [0.9999] * 32, predicted),), 0.0), 0.99, 0.99)
    assert v.passed is passed and how in v.how


def test_without_a_cosine_a_straddling_agreement_is_missed() -> None:
    (v,) = verdicts(Fidelity((ids(16, 16),), 0.0), 0.99, 0.99)
    assert v.passed  # every sample equal: no spread, the interval is [1, 1]
    (v,) = verdicts(Fidelity((ids(63, 64),), 0.0), 0.97, 0.99)
    assert v.interval is not None and v.interval[0] < 0.97 < v.value
    assert not v.passed and "has no cosine" in v.how


@pytest.mark.parametrize(("cosines", "passed"), [
    ([0.9913 + 0.0005 * (-1) ** i for i in range(16)], True),  # the encoder: narrow, clear of 0.99
    ([0.9905 + 0.01 * (-1) ** i for i in range(16)], False),  # mean 0.9905 but wide: could be below
    ([0.985] * 16, False),
])
def test_a_cosine_must_be_clear_of_its_floor(cosines: list[float], passed: bool) -> None:
    f = Fidelity((embedding(cosines),), 0.0)
    assert meets(f, 0.99, 0.99) is passed
    assert Goal(min_top1_agreement=0.99, min_cosine=0.99).accurate(f) is passed  # the search's goal: the same rule


def sequences(agree: int, n: int, positions: int, same_positions: int) -> OutputFidelity:
    """A CTC-style output: `agree` of `n` sequences unchanged, `same_positions` of `positions`
    argmax positions; every cosine 0.9999 (the probabilities barely move)."""
    p = same_positions / positions
    return OutputFidelity("ctc", True, None, 0.9999, 40.0, kind=Kind.SEQUENCE, samples=n, sequence_agreement=agree / n,
                          position_agreement=p, predicted_agreement=p ** (positions / n),
                          agreement_interval=wilson(agree, n), cosine_interval=(0.9999, 0.9999))


@pytest.mark.parametrize(("same", "passed", "predicted"), [
    (1280, True, "1.0000"),   # no position moved: the straddle is met
    (1279, False, "0.9692"),  # one position of 1280 moved: 32 sequences of 40 predict 0.969 < 0.99
])
def test_a_straddling_sequence_agreement_is_decided_by_its_positions_not_the_cosine(same: int, passed: bool,
                                                                                   predicted: str) -> None:
    (v,) = verdicts(Fidelity((sequences(32, 32, 1280, same),), 0.0), 0.99, 0.99)
    assert v.passed is passed and f"predict {predicted} on unseen samples" in v.how
    (v,) = verdicts(Fidelity((sequences(31, 32, 1280, same),), 0.0), 0.99, 0.99)
    assert not v.passed and v.how == "below the floor"  # 31 of 32: below, whatever the positions say


def mask(ious: list[float], cosine: float = 0.9999) -> OutputFidelity:
    n = len(ious)
    return OutputFidelity("map", False, None, cosine, 30.0, kind=Kind.MASK, samples=n, mask_iou=sum(ious) / n,
                          mask_agreement=0.999, agreement_interval=mean_interval(sum(ious), sum(i * i for i in ious), n),
                          cosine_interval=(cosine, cosine))


@pytest.mark.parametrize(("ious", "passed", "how"), [
    ([0.996] * 32, True, "its interval is clear of the floor"),
    ([1.0, 0.982] * 16, False, "a mean of each sample's IoU is the continuous figure"),  # mean 0.991, straddles: missed
    ([0.96] * 32, False, "below the floor"),  # the text detector's held-out IoU
])
def test_a_masks_iou_is_decided_by_its_own_interval_never_by_its_cosine(ious: list[float], passed: bool,
                                                                       how: str) -> None:
    (v,) = verdicts(Fidelity((mask(ious),), 0.0), 0.99, 0.99)
    assert v.metric == "mask IoU" and v.passed is passed and how in v.how
