"""Streaming accuracy and error measures: each accumulator takes one batch at a time, keeps only
running sums, and never holds an array past the `update` call (but the decisions' margins,
two float32 each: qcli.analyze.margins).

The math, on a float reference `x` and a quantized result `y`:
- SQNR (dB) = 10 log10(Σx² / Σ(y − x)²), summed over every element seen;
- cosine = mean over samples of x·y / (|x| |y|) (each sample flattened);
- top-1 agreement = fraction of samples whose argmax over classes is the same;
- sequence agreement = fraction of samples whose whole argmax sequence (CTC-collapsed when the
  blank is known) is the same; position agreement = fraction of positions
  (qcli.analyze.sequences);
- mask IoU = mean over samples of |A ∩ B| / |A ∪ B| of the thresholded masks (the labels or
  pixels "on"; 1 when both are empty): what a mask is gated on; mask agreement = fraction of
  elements on the same side of the threshold, reported (a sparse map's background fills it);
  a per-pixel class map's: per sample, the mean over the classes either argmax map has of their
  IoU (mean IoU), and the pixels whose class agrees;
- relative error (regression) = sqrt(mean squared error / the float values' variance across the
  compared samples, averaged over elements): 0.1 means the quantized output explains 99% of it;
- perplexity increase (a language model's logits) = quantized / float perplexity on the text's
  next tokens - 1 (qcli.analyze.tokens).
The metric an output is judged by follows its kind (qcli.analyze.kinds). Each gated figure has
an interval (~95% by default; `verify.confidence` sets it, qcli.analyze.confidence): a share of
samples (top-1, sequence) the Wilson score interval, a mean over samples (cosine; element
agreement and mask IoU, per sample) mean ± z standard errors.

>>> sqnr_db(100.0, 1.0)
20.0
>>> acc = SqnrAccumulator(); acc.update(np.array([3.0, 4.0]), np.array([3.0, 4.5])); round(acc.db, 2)
20.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from qcli.analyze.boxes import DEFAULT_THRESHOLD, BoxAccumulator
from qcli.analyze.figures import MapAccumulator, MaskAccumulator, RegressionAccumulator, row_shares, rows
from qcli.analyze.intervals import Z95, Mean, wilson
from qcli.analyze.kinds import Kind, OutputKind, decide
from qcli.analyze.margins import MarginAccumulator, MarginPool
from qcli.analyze.sequences import SequenceAccumulator
from qcli.analyze.tokens import TokenAccumulator

# Below this much noise power per unit of signal the two tensors are equal for any purpose;
# SQNR is then reported as None ("exact") rather than as an infinite number JSON cannot hold.
_SILENT_SIGNAL = 1e-30

MARGIN_KINDS = (Kind.TOP1, Kind.SEQUENCE)  # the kinds whose decisions' margins are kept (qcli.analyze.margins)


def sqnr_db(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); None when there is no noise at all (the tensors are equal).

    >>> sqnr_db(1.0, 0.001)
    30.0
    >>> sqnr_db(5.0, 0.0) is None
    True
    """
    if noise <= 0:
        return None
    return 10.0 * math.log10(max(signal, _SILENT_SIGNAL) / noise)


def as_array(value) -> np.ndarray:
    """An output as onnxruntime returns it, as an array. A sequence of maps (skl2onnx's ZipMap:
    one {class: probability} dict per sample) becomes `[N, C]` float32 scores in the maps' key
    order, so it is compared as class scores (np.asarray would give dicts, never equal).

    >>> as_array([{0: 0.25, 1: 0.75}, {0: 1.0, 1: 0.0}]).tolist()
    [[0.25, 0.75], [1.0, 0.0]]
    """
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = list(value[0])
        return np.array([[v[k] for k in keys] for v in value], dtype=np.float32)
    return np.asarray(value)


def top5_hits(scores: np.ndarray, labels: np.ndarray) -> int:
    """Rows of `scores` whose 5 highest include the row's label (all, with fewer than 5 classes).

    >>> top5_hits(np.array([[0.0, 1, 2, 3, 4, 5], [5.0, 4, 3, 2, 1, 0]]), np.array([0, 0]))
    1
    """
    if scores.shape[1] <= 5:
        return scores.shape[0]
    top = np.argpartition(-scores, 4, axis=1)[:, :5]
    return int((top == np.asarray(labels).reshape(-1, 1)).any(axis=1).sum())


def is_class_scores(value: np.ndarray) -> bool:
    """A class-score output: float, rank 2 `[N, C]` with at least 2 classes."""
    return value.ndim == 2 and value.shape[1] >= 2 and np.issubdtype(value.dtype, np.floating)


def _float(value: np.ndarray) -> np.ndarray:
    """float32 (or float64) view of an array: half precision would lose the sums."""
    value = np.asarray(value)
    return value if value.dtype in (np.float32, np.float64) else value.astype(np.float32)


_CHUNK = 1 << 20


def _sum_squares(v: np.ndarray) -> float:
    """Σv² of a flat array; BLAS dot per chunk of 1M elements, summed in float64 (a float32 dot
    over a chunk is accurate to ~1e-7 relative; a float64 copy of every activation costs 6x the time)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected by the caller
        return float(sum(float(np.dot(v[i : i + _CHUNK], v[i : i + _CHUNK])) for i in range(0, v.size, _CHUNK)))


@dataclass
class SqnrAccumulator:
    """Running Σx², Σ(y − x)², max |y − x| and element count over all batches."""

    signal: float = 0.0
    noise: float = 0.0
    max_abs: float = 0.0
    elements: int = 0
    nonfinite: int = 0  # elements left out because either side was NaN or infinite

    def update(self, reference: np.ndarray, value: np.ndarray) -> None:
        x, y = _float(reference), _float(value)
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {list(x.shape)} vs {list(y.shape)}")
        with np.errstate(over="ignore", invalid="ignore"):  # inf - inf: counted below
            x, diff = x.ravel(), (y - x).ravel()
        signal, noise = _sum_squares(x), _sum_squares(diff)
        if not (math.isfinite(signal) and math.isfinite(noise)):
            # Rare: NaN/Inf somewhere, or float32 squares past 3.4e38. Redo in float64 on the
            # finite elements only, and count the others.
            keep = np.isfinite(x) & np.isfinite(diff)
            self.nonfinite += int(keep.size - np.count_nonzero(keep))
            x, diff = x[keep].astype(np.float64), diff[keep].astype(np.float64)
            signal, noise = _sum_squares(x), _sum_squares(diff)
        self.signal += signal
        self.noise += noise
        if diff.size:
            self.max_abs = max(self.max_abs, float(diff.max()), -float(diff.min()))
        self.elements += x.size

    @property
    def db(self) -> float | None:
        return sqnr_db(self.signal, self.noise)


@dataclass
class FidelityAccumulator:
    """How closely `value` follows `reference` for one output, over all batches.

    Float outputs: SQNR, mean and minimum per-sample cosine, max abs error; then by kind:
    `top1` the top-1 agreement, `sequence` the sequence and position agreement, `mask` the
    thresholded masks' agreement and IoU. Every output: fraction of samples exactly equal; other
    outputs (integers, bools: class ids, masks, per-token tags) also the fraction of elements
    equal. `kind`: decided from the first batch's values alone when not given.
    """

    kind: OutputKind | None = None
    pool: MarginPool | None = None  # the float margins of more samples (qcli.analyze.margins)
    z: float = Z95  # the intervals' half-width in standard errors (verify.confidence: qcli.analyze.confidence)

    samples: int = 0
    agree: int = 0
    in_top5: int = 0  # class scores: samples whose float top-1 is among the quantized top 5
    classes: int = 0  # class scores: how many
    exact: int = 0
    equal: int = 0  # elements equal (integer/bool outputs)
    compared: int = 0
    cosines: Mean = field(default_factory=Mean)  # per sample (rows without NaN/Inf)
    cosine_min: float = 1.0
    equal_rows: Mean = field(default_factory=Mean)  # per-element outputs: each sample's share of elements equal
    floating: bool | None = None
    reshaped: int = 0  # samples whose quantized output is not shaped as float's (`_reshaped`)
    spatial: bool = False  # says where: a map or a detector's boxes (`_start`; verify.min_spatial_agreement)

    def __post_init__(self) -> None:
        self.sqnr = SqnrAccumulator()
        self.sequence: SequenceAccumulator | None = None
        self.mask: MaskAccumulator | None = None
        self.regression: RegressionAccumulator | None = None
        self.boxes: BoxAccumulator | None = None
        self.map: MapAccumulator | None = None
        self.tokens: TokenAccumulator | None = None
        self.margins: MarginAccumulator | None = None  # top-1 and sequence outputs: the decisions' margins

    @property
    def class_scores(self) -> bool:
        return self.kind is not None and self.kind.kind is Kind.TOP1

    def update(self, reference: np.ndarray, value: np.ndarray, batch: int,
               inputs: Mapping[str, np.ndarray] | None = None) -> None:
        """One batch of both models' values of this output; `inputs`: the batch's inputs (a
        language model's next tokens are its `input_ids`)."""
        reference, value = np.asarray(reference), np.asarray(value)
        if self.floating is None:
            self._start(reference)
        if reference.shape != value.shape:
            self._reshaped(reference, value, batch)
            return
        x, y = rows(reference, batch), rows(value, batch)
        self.samples += x.shape[0]
        equal = x == y
        self.exact += int(np.all(equal, axis=1).sum())
        if self._per_element:
            self.equal += int(np.count_nonzero(equal))
            self.compared += equal.size
            self.equal_rows.add(row_shares(equal))
        if not self.floating:
            return
        self.sqnr.update(x, y)
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            dot = np.einsum("ij,ij->i", x64, y64)
            nx, ny = np.linalg.norm(x64, axis=1), np.linalg.norm(y64, axis=1)
            norms = nx * ny
            empty = np.where((nx == 0) & (ny == 0), 1.0, 0.0)  # two zero rows agree; one does not
            cosine = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), empty)
        # Rows holding NaN/Inf (or whose norms overflow) have no cosine; the SQNR counts them.
        finite = np.isfinite(x64).all(axis=1) & np.isfinite(y64).all(axis=1) & np.isfinite(cosine)
        self.cosines.add(cosine[finite])
        if finite.any():
            self.cosine_min = min(self.cosine_min, float(cosine[finite].min()))
        if self.class_scores:
            self.agree += int((x.argmax(axis=1) == y.argmax(axis=1)).sum())
            self.in_top5 += top5_hits(y, x.argmax(axis=1))
            self.classes = x.shape[1]
        if self.sequence is not None:
            decisions = self.sequence.update(reference, value, batch)
            if self.margins is not None:
                self.margins.add(*decisions)
        if self.tokens is not None:
            ids = (inputs or {}).get("input_ids")
            self.tokens.update(reference, value, None if ids is None else np.asarray(ids))
        for figure in (self.mask, self.regression, self.boxes, self.map):  # the one of its kind, if any
            if figure is not None:
                figure.update(reference, value, batch)
        if self.margins is not None and self.sequence is None:  # the float64 rows above, cut into decisions
            self.margins.update(x64, y64, reference.shape[-1] if reference.ndim else 1)

    def _start(self, reference: np.ndarray) -> None:
        """The first batch's float values decide the kind (when not given) and its figures; a
        mask is a map (`spatial`) when two of its axes past the batch's have more than one element
        ([N, 1, H, W], a note transcriber's [N, frames, pitches]), not one probability or a set of
        labels per sample."""
        self.floating = bool(np.issubdtype(reference.dtype, np.floating))
        if self.kind is None:
            self.kind = decide("", [reference], None, None)
        self.spatial = self.kind.kind in (Kind.MAP, Kind.BOXES) or (self.kind.kind is Kind.MASK and (
            self.kind.classes is not None or sum(d > 1 for d in reference.shape[1:]) >= 2))
        if self.kind.kind is Kind.SEQUENCE and self.floating:
            self.sequence = SequenceAccumulator(self.kind.blank, self.kind.trim)
        if self.kind.kind in MARGIN_KINDS and self.floating:
            self.margins = MarginAccumulator(self.pool)
        if self.kind.kind is Kind.MASK and self.floating:
            self.mask = MaskAccumulator(0.5 if self.kind.threshold is None else self.kind.threshold,
                                        classes=self.kind.classes)
        if self.kind.kind is Kind.REGRESSION and self.floating:
            self.regression = RegressionAccumulator()
        if self.kind.kind is Kind.MAP and self.floating:
            self.map = MapAccumulator()
        if self.kind.kind is Kind.TOKENS and self.floating:
            self.tokens = TokenAccumulator(self.z)
        if self.kind.kind is Kind.BOXES and self.floating:
            self.boxes = BoxAccumulator(self.kind.threshold or DEFAULT_THRESHOLD, self.kind.axis or 1)

    def _reshaped(self, reference: np.ndarray, value: np.ndarray, batch: int) -> None:
        """A batch whose quantized output is not shaped as float's (a Loop that ran more or
        fewer steps, an in-graph NMS that kept more or fewer boxes): each of its samples
        disagrees: no exact match, cosine 0, top-1 changed, a mask's or map's IoU 0, a
        regression's error infinite; a sequence is compared on the steps both have and
        counts as changed; a detector's boxes are matched as always (their count may differ)."""
        self.samples += batch
        self.reshaped += batch
        if self._per_element:
            self.compared += max(reference.size, value.size)
            self.equal_rows.add(np.zeros(batch))
        if not self.floating:
            return
        self.cosines.add(np.zeros(batch))
        self.cosine_min = 0.0
        if self.sequence is not None:
            decisions = self.sequence.reshaped(reference, value, batch)
            if self.margins is not None:
                self.margins.add(*decisions)
        if self.boxes is not None and reference.shape[:1] == value.shape[:1]:
            self.boxes.update(reference, value, batch)
        for figure in (self.mask, self.map):
            if figure is not None:
                figure.per_sample.add(np.zeros(batch))
        if self.regression is not None:
            self.regression.errors.add(np.full(batch, np.inf))

    @property
    def top1_agreement(self) -> float | None:
        return self.agree / self.samples if self.class_scores and self.samples else None

    @property
    def top5_agreement(self) -> float | None:
        """The share of samples whose float top-1 the quantized model keeps in its top 5 (with
        at least 5 classes): reported beside the top-1 agreement, never gated."""
        if not (self.class_scores and self.samples) or self.classes < 5:
            return None
        return self.in_top5 / self.samples

    def changed(self) -> int | None:
        """Samples whose gated decision changed so far, for the outputs whose gated agreement
        is a share of samples (top-1, sequence); None for the rest."""
        if self.class_scores:
            return self.samples - self.agree
        if self.sequence is not None:
            return self.sequence.samples - self.sequence.same
        return None

    def lost(self) -> float | None:
        """How far the gated agreement's sum over the samples so far is below theirs: the
        samples changed (top-1, sequence), or the sum of 1 - each row's IoU (a mask's or a
        map's: a mean of per-row figures of at most 1); None for the rest. Nothing the samples
        still to come can win it back. An output without a batch axis has a row per batch, so
        this is counted in fewer rows than the samples and a floor over the samples is judged
        on the safe side."""
        if (changed := self.changed()) is not None:
            return changed
        per = self.mask or self.map
        return None if per is None else per.samples - per.per_sample.total

    @property
    def predicted_agreement(self) -> float | None:
        """The agreement unseen samples would keep (top-1, sequence), as the decisions' margins
        predict it (qcli.analyze.margins); a sequence's, at most what its position agreement
        predicts."""
        found = self.margins.predicted(self.samples) if self.margins is not None else None
        by_positions = self.sequence.predicted if self.sequence is not None else None
        values = [v for v in (found, by_positions) if v is not None]
        return min(values) if values else None

    @property
    def element_agreement(self) -> float | None:
        """Integer/bool outputs: the fraction of elements equal (of samples, for an [N] ArgMax;
        of pixels for a mask, of tokens for a tagger's ids)."""
        return self.equal / self.compared if self._per_element and self.compared else None

    @property
    def _per_element(self) -> bool:
        """Compared element by element: integer outputs, and float ones `verify.outputs` says so."""
        return not self.floating or (self.kind is not None and self.kind.kind is Kind.PER_ELEMENT)

    @property
    def cosine(self) -> float | None:
        return self.cosines.value if self.floating else None

    @property
    def cosine_interval(self) -> tuple[float, float] | None:
        return self.cosines.interval(self.z) if self.floating else None

    @property
    def relative_error(self) -> float | None:
        return self.regression.relative_error if self.regression is not None else None

    @property
    def error_interval(self) -> tuple[float, float] | None:
        return self.regression.interval(self.z) if self.regression is not None else None

    @property
    def agreement_interval(self) -> tuple[float, float] | None:
        """The interval of the agreement this output's kind is gated on."""
        if self.sequence is not None and self.sequence.samples:
            return wilson(self.sequence.same, self.sequence.samples, self.z)
        if self.mask is not None and self.mask.samples:
            return self.mask.per_sample.share_interval(self.z)
        if self.boxes is not None and self.boxes.samples:
            return self.boxes.interval(self.z)
        if self.map is not None and self.map.samples:
            return self.map.per_sample.share_interval(self.z)
        if self.tokens is not None and self.tokens.samples:
            return self.tokens.same.share_interval(self.z)
        if self.class_scores and self.samples:
            return wilson(self.agree, self.samples, self.z)
        if self._per_element:
            return self.equal_rows.share_interval(self.z)
        return None


@dataclass
class TopKAccumulator:
    """Top-1 and top-5 hits of class scores against integer labels."""

    classes: int
    samples: int = 0
    top1: int = 0
    top5: int = 0

    def update(self, scores: np.ndarray, labels: np.ndarray) -> None:
        labels = np.asarray(labels).reshape(-1)
        self.samples += labels.shape[0]
        self.top1 += int((scores.argmax(axis=1) == labels).sum())
        if self.classes >= 5:
            self.top5 += top5_hits(scores, labels)

    @property
    def top1_rate(self) -> float | None:
        return self.top1 / self.samples if self.samples else None

    @property
    def top5_rate(self) -> float | None:
        return self.top5 / self.samples if self.samples and self.classes >= 5 else None
