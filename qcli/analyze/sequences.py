"""A sequence output (class scores per position, `[N, T, C]` or `[T, N, C]`) compared as the text
it decodes to: the share of samples whose argmax sequence is unchanged, CTC-collapsed when the
blank is known, stripped of `verify.sequence_trim` at both ends; positions as a detail.

The prediction for unseen samples (qcli.analyze.margins) takes a CTC path's decisions, not its
positions. A position flipping to a class that leaves the collapsed sequence as it was (a blank
beside a character whose run goes on, the character of one neighbour at a blank, a run's
boundary moving) changes nothing; a character moving by one position flips two positions and
changes nothing either. So the decisions are: each position against the classes that would
change the sequence there (with a character, the blank never: losing the character is the
run's decision), and each character run surviving somewhere in its run or the blanks beside
it. Counting positions instead predicted 0.02 sequences unchanged on PaddleOCR's recognizer
where 0.91 were (32 rendered lines).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcli.analyze.margins import TINY, probabilities


def ctc_collapse(ids: np.ndarray, blank: int) -> np.ndarray:
    """A CTC path as the label it decodes to: repeats merged, then blanks dropped.

    >>> ctc_collapse(np.array([0, 3, 3, 0, 3, 5, 5, 0]), 0).tolist()
    [3, 3, 5]
    """
    ids = np.asarray(ids)
    if ids.size == 0:
        return ids
    keep = np.concatenate(([True], ids[1:] != ids[:-1]))
    ids = ids[keep]
    return ids[ids != blank]


def strip(ids: np.ndarray, trim: tuple[int, ...]) -> np.ndarray:
    """`ids` without the `trim` classes at either end (str.strip for class ids).

    >>> strip(np.array([9, 9, 3, 9, 5, 9]), (9,)).tolist()
    [3, 9, 5]
    """
    keep = ~np.isin(ids, trim)
    if not keep.any():
        return ids[:0]
    return ids[int(keep.argmax()): ids.size - int(keep[::-1].argmax())]


def as_sequences(value: np.ndarray, batch: int) -> np.ndarray:
    """Scores per position as a float32 `[N, T, C]` copy (from `[N, T, C]` or `[T, N, C]`: the
    batch axis is the one of size `batch`, the first when both are). float32: margins are kept
    in it anyway, and a recognizer's batch is 8 x 40 x 6625 scores."""
    x = np.array(value, dtype=np.float32)
    if x.ndim == 3 and x.shape[0] != batch and x.shape[1] == batch:
        x = x.transpose(1, 0, 2).copy()
    return x.reshape(batch if x.shape[0] == batch else 1, -1, x.shape[-1])


def merge_ends(x: np.ndarray, y: np.ndarray, blank: int | None, trim: tuple[int, ...]) -> None:
    """In both models' `[N, T, C]` log scores, in place: the blank and `trim` classes made one
    class (the first of them) at the positions before the float model's (`x`) first and after
    its last other class. There a blank read as a space, or a space as a blank, changes nothing
    once the ends are trimmed.

    >>> x = np.log([[[.6, .1, .3], [.1, .8, .1], [.4, .1, .5]]])  # blank 0, space 2: "1"
    >>> y = np.log([[[.3, .1, .6], [.1, .8, .1], [.6, .1, .3]]])
    >>> merge_ends(x, y, 0, (2,)); x.argmax(-1).tolist(), y.argmax(-1).tolist(), np.exp(x[0, 2]).round(2).tolist()
    ([[0, 1, 0]], [[0, 1, 0]], [0.9, 0.1, 0.0])
    """
    group = ([blank] if blank is not None else []) + [c for c in trim if c != blank and c < x.shape[-1]]
    ids = x.argmax(axis=-1)
    content = ~np.isin(ids, group)
    last = ids.shape[1] - 1 - content[:, ::-1].argmax(axis=1)
    first = np.where(content.any(axis=1), content.argmax(axis=1), ids.shape[1])
    positions = np.arange(ids.shape[1])
    ends = (positions < first[:, None]) | (positions > last[:, None])
    for a in (x, y):
        merged = np.logaddexp.reduce(a[..., group], axis=-1)
        a[..., group[0]] = np.where(ends, merged, a[..., group[0]])
        for c in group[1:]:
            a[..., c] = np.where(ends, -np.inf, a[..., c])


def _harmless(ids: np.ndarray, blank: int) -> np.ndarray:
    """Per position of CTC paths `[N, T]`, two class ids (-1: none) that read there instead leave
    the collapsed sequence as it is, or whose loss is the run's decision: the blank at a
    character, and a neighbour's character where this run goes on past the other side (a
    boundary moving); at a blank, the character of one neighbour only (of both: two runs join)."""
    edge = np.full((ids.shape[0], 1), -1)
    before, after = np.concatenate([edge, ids[:, :-1]], axis=1), np.concatenate([ids[:, 1:], edge], axis=1)
    char = ids != blank
    letter_before, letter_after = (before >= 0) & (before != blank), (after >= 0) & (after != blank)
    shift = np.where(char & letter_before & (before != ids) & (after == ids), before,
                     np.where(char & letter_after & (after != ids) & (before == ids), after, -1))
    first = np.where(char, blank, np.where(letter_before & (before != after), before, -1))
    second = np.where(char, shift, np.where(letter_after & (after != before), after, -1))
    return np.stack([first, second], axis=-1)


def _runs(x: np.ndarray, y: np.ndarray, ids: np.ndarray, blank: int) -> tuple[np.ndarray, np.ndarray]:
    """Each character run's survival: the best margin of its character over the run and the
    blanks beside it, in both models (float64, in path order). On all positions at once: a
    32768-position path of short runs took 1.9 s a batch run by run."""
    flat, t = ids.ravel(), ids.shape[1]
    first = np.ones(flat.size, dtype=bool)
    first[1:] = flat[1:] != flat[:-1]
    first[::t] = True  # a run never crosses into the next sample
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], flat.size)
    chars = flat[starts]
    # the blank beside a run on each side, inside its sample (-1: none)
    left = np.where((starts % t != 0) & (flat[starts - 1] == blank), starts - 1, -1)
    inside = (ends < flat.size) & (ends % t != 0)
    right = np.where(inside & (flat[np.minimum(ends, flat.size - 1)] == blank), ends, -1)
    out = []
    for a in (x, y):
        margin = _Margins(a.reshape(-1, a.shape[-1]))
        best = np.maximum.reduceat(margin(np.arange(flat.size), flat), starts)
        for side in (left, right):
            has = side >= 0
            best[has] = np.maximum(best[has], margin(side[has], chars[has]))
        out.append(best[chars != blank].astype(np.float64))
    return out[0], out[1]


class _Margins:
    """Scores `[P, C]`: a class's score at positions minus the best other class's there."""

    def __init__(self, scores: np.ndarray) -> None:
        rows = np.arange(scores.shape[0])
        self.scores, self.top = scores, scores.argmax(axis=-1)
        rest = scores.copy()
        rest[rows, self.top] = -np.inf
        self.first, self.second = scores[rows, self.top], rest.max(axis=-1)

    def __call__(self, p: np.ndarray, c: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # -inf - -inf: NaN, a position of no score
            return self.scores[p, c] - np.where(self.top[p] == c, self.second[p], self.first[p])


def decisions(x: np.ndarray, y: np.ndarray, blank: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The float margins of a sequence's decisions (module docstring) and their changes in the
    quantized model, from both models' `[N, T, C]` log scores (overwritten): every position
    (its class and the `_harmless` ones against the rest), then, with a blank, every character
    run. Without a blank, every position against the rest. A position where float scores every
    class alike decides nothing: its margin is infinite (left out of the predictions).

    >>> x = np.log(np.eye(3)[[[1, 0, 2, 0]]] * 0.8 + 0.1)  # "12": a run each, blanks between
    >>> y = np.log(np.eye(3)[[[0, 1, 2, 0]]] * 0.8 + 0.1)  # the 1 moved one position on
    >>> m, e = decisions(x, y, 0); m.size, int((m + e <= 0).sum())  # 4 positions, 2 runs: none flips
    (6, 0)
    >>> x, y = np.log(np.eye(3)[[[1, 0, 2, 0]]] * 0.8 + 0.1), np.log(np.eye(3)[[[0, 1, 2, 0]]] * 0.8 + 0.1)
    >>> m, e = decisions(x, y, None); int((m + e <= 0).sum())  # as positions, two flip
    2
    """
    ids = x.argmax(axis=-1)
    tied = x.max(axis=-1) == x.min(axis=-1)  # every class alike (a Loop's unwritten step): no decision
    margins, moved = _runs(x, y, ids, blank) if blank is not None else (np.empty(0), np.empty(0))
    own = ids[..., None] if blank is None else np.concatenate([ids[..., None], _harmless(ids, blank)], axis=-1)
    n, t = np.indices(ids.shape)
    found = []
    for a in (x, y):
        inside = np.full(ids.shape, -np.inf)
        a[~np.isfinite(a)] = -np.inf  # merged away (`merge_ends`) or underflowed
        for k in range(own.shape[-1]):
            c = own[..., k]
            has = c >= 0
            inside[has] = np.logaddexp(inside[has], a[n[has], t[has], c[has]])
            a[n[has], t[has], c[has]] = -np.inf
        with np.errstate(invalid="ignore"):
            found.append(inside - a.max(axis=-1))  # inf where no class could change the sequence
    found[0][tied] = np.inf  # its change: 0 (below)
    m = np.concatenate([found[0].ravel(), margins])
    with np.errstate(invalid="ignore"):
        changes = np.concatenate([found[1].ravel(), moved]) - m
    changes[:tied.size][tied.ravel()] = 0.0
    return m, changes


@dataclass
class SequenceAccumulator:
    """Samples whose whole argmax sequence (CTC-collapsed with `blank`, `trim` stripped from
    both ends) is unchanged, positions whose argmax is, and the decisions (module docstring)
    that stayed.

    >>> acc = SequenceAccumulator(blank=0)
    >>> x = np.eye(3)[[[1, 1, 0, 2], [2, 0, 0, 1]]]  # two samples, T=4, C=3
    >>> y = np.eye(3)[[[1, 0, 0, 2], [2, 2, 0, 1]]]  # same decoded "12" / "21", 2 positions moved
    >>> _ = acc.update(x, y, 2); acc.agreement, acc.position_agreement, acc.predicted
    (1.0, 0.75, 1.0)
    """

    blank: int | None = None
    trim: tuple[int, ...] = ()  # classes not counted at either end (`strip`)
    samples: int = 0
    same: int = 0
    positions: int = 0
    same_positions: int = 0
    decided: int = 0  # decisions (module docstring)
    kept: int = 0  # decisions that stayed
    log: bool | None = None  # probabilities, compared in log space (decided on the first batch)

    def update(self, reference: np.ndarray, value: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """One batch; returns its decisions' float margins and their changes (log space)."""
        x, y = as_sequences(reference, batch), as_sequences(value, batch)
        if self.log is None:
            self.log = probabilities(x.reshape(-1, x.shape[-1]))
        if self.log:
            x, y = np.log(np.maximum(x, TINY)), np.log(np.maximum(y, TINY))
        if self.trim:
            merge_ends(x, y, self.blank, self.trim)
        a, b = x.argmax(axis=-1), y.argmax(axis=-1)
        self.positions += a.size
        self.same_positions += int(np.count_nonzero(a == b))
        for p, q in zip(a, b, strict=True):
            if self.blank is not None:
                p, q = ctc_collapse(p, self.blank), ctc_collapse(q, self.blank)
            if self.trim:
                p, q = strip(p, self.trim), strip(q, self.trim)
            self.same += int(p.shape == q.shape and bool(np.all(p == q)))
        self.samples += a.shape[0]
        margins, changes = decisions(x, y, self.blank)
        self.decided += margins.size
        self.kept += int(np.count_nonzero(~(margins + changes < 0)))  # a tie or an infinite margin stays
        return margins, changes

    def reshaped(self, reference: np.ndarray, value: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """A batch whose sequences are not as long as float's (a decoding Loop that stopped at
        another step): each sample counts as changed; the steps both have are compared as
        `update` compares them (positions and decisions), the steps one alone has are positions
        changed. Other shapes (another number of classes): samples changed, nothing else.

        >>> acc = SequenceAccumulator()
        >>> x, y = np.eye(3)[[[1, 2, 0]]], np.eye(3)[[[1, 2, 2, 0]]]  # "12" then the end 0, one step later
        >>> _ = acc.reshaped(x, y, 1); acc.agreement, acc.position_agreement
        (0.0, 0.5)
        """
        x, y = as_sequences(reference, batch), as_sequences(value, batch)
        if x.shape[0] != y.shape[0] or x.shape[2] != y.shape[2]:
            self.samples += batch
            return np.zeros(0), np.zeros(0)
        steps = min(x.shape[1], y.shape[1])
        same = self.same
        decisions = self.update(x[:, :steps], y[:, :steps], x.shape[0])
        self.same = same
        self.positions += (max(x.shape[1], y.shape[1]) - steps) * x.shape[0]
        return decisions

    @property
    def agreement(self) -> float | None:
        return self.same / self.samples if self.samples else None

    @property
    def position_agreement(self) -> float | None:
        return self.same_positions / self.positions if self.positions else None

    @property
    def predicted(self) -> float | None:
        """The share of unchanged sequences that decisions changing independently at the
        measured rate would give: kept share ** (decisions per sample). Measured on many more
        trials than the sequences themselves (a finer figure where few samples show no changed
        sequence); pessimistic where changes cluster in a few samples."""
        if not self.samples:
            return None
        return (self.kept / self.decided) ** (self.decided / self.samples) if self.decided else 1.0
