"""The figure each kind of output is gated on, accumulated batch by batch (qcli.analyze.kinds):
a mask's IoU, a dense map's top region, a regression's relative error. Each keeps running sums
and each sample's figure for its interval, never an array past `update`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from qcli.analyze.intervals import Z95, Mean


def rows(value: np.ndarray, batch: int) -> np.ndarray:
    """The output as one flattened row per sample (the whole tensor as one row when it has no
    batch axis)."""
    if value.ndim >= 1 and value.shape[0] == batch:
        return value.reshape(batch, -1)
    return value.reshape(1, -1)





def iou_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of two boolean arrays, |a & b| / |a | b| (two empty rows: 1)."""
    inter, union = np.count_nonzero(a & b, axis=1), np.count_nonzero(a | b, axis=1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def class_ious(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of two class maps (each pixel's class), the mean IoU of the classes either has:
    a small class counts as much as the background (mean IoU, as segmentation is judged).

    >>> class_ious(np.array([[0, 0, 0, 1]]), np.array([[0, 0, 0, 0]]))
    array([0.375])
    """
    k = int(max(a.max(initial=0), b.max(initial=0))) + 1
    out = np.ones(a.shape[0])
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        both = np.bincount(x.astype(np.int64) * k + y, minlength=k * k).reshape(k, k)
        inter = np.diag(both)
        union = both.sum(axis=0) + both.sum(axis=1) - inter
        if (union > 0).any():
            out[i] = float(np.mean(inter[union > 0] / union[union > 0]))
    return out


@dataclass
class PerSample:
    """A figure that is the mean of each sample's, kept for its interval."""

    per_sample: Mean = field(default_factory=Mean, kw_only=True)

    @property
    def mean(self) -> float | None:
        return self.per_sample.value

    @property
    def samples(self) -> int:
        return self.per_sample.n

def row_shares(equal: np.ndarray) -> np.ndarray:
    """Per sample (row), the share of its elements that are True (an empty row: 1)."""
    return equal.mean(axis=1) if equal.shape[1] else np.ones(equal.shape[0])


@dataclass
class MaskAccumulator(PerSample):
    """Thresholded masks of both models: the mean per-sample IoU of the "on" elements (each
    sample's, for its interval), and the elements on the same side of `threshold`.

    >>> acc = MaskAccumulator(0.5)
    >>> acc.update(np.array([[0.9, 0.8, 0.1, 0.2]]), np.array([[0.9, 0.4, 0.1, 0.6]]), 1)
    >>> acc.agreement, round(acc.iou, 4)
    (0.5, 0.3333)
    """

    threshold: float = 0.5
    elements: int = 0
    equal: int = 0
    classes: int | None = None  # a per-pixel class map's class axis: compared by its argmax (`class_ious`)

    def update(self, reference: np.ndarray, value: np.ndarray, batch: int) -> None:
        if self.classes is not None:
            a, b = (rows(np.asarray(v).argmax(axis=self.classes), batch) for v in (reference, value))
            self.per_sample.add(class_ious(a, b))
        else:
            a, b = rows(np.asarray(reference) > self.threshold, batch), rows(np.asarray(value) > self.threshold, batch)
            self.per_sample.add(iou_rows(a, b))
        self.elements += a.size
        self.equal += int(np.count_nonzero(a == b))

    @property
    def agreement(self) -> float | None:
        return self.equal / self.elements if self.elements else None

    @property
    def iou(self) -> float | None:
        return self.mean


@dataclass
class RegressionAccumulator:
    """A regression output's error relative to its spread: sqrt(mean squared error / the float
    values' variance across samples, averaged over elements), with each sample's squared error
    for the interval.

    >>> acc = RegressionAccumulator()
    >>> acc.update(np.array([[1.0], [3.0]]), np.array([[1.1], [2.9]]), 2)
    >>> round(acc.relative_error, 4)
    0.1
    """

    errors: Mean = field(default_factory=Mean)  # per sample: mean squared error over its elements
    sums: np.ndarray | None = None  # per element: Σ float value, Σ its square
    squares: np.ndarray | None = None
    # An output whose first axis is not the batch (a Flatten to [N * 2, 5]) is one row per batch,
    # its length changing with the batch: its elements do not line up across rows, so the spread
    # is then that of all its values pooled (`ragged`).
    ragged: bool = False
    pooled: Mean = field(default_factory=Mean)  # every float value seen

    def update(self, reference: np.ndarray, value: np.ndarray, batch: int) -> None:
        x = rows(np.asarray(reference, dtype=np.float64), batch)
        y = rows(np.asarray(value, dtype=np.float64), batch)
        self.errors.add(((y - x) ** 2).mean(axis=1))
        self.pooled.add(x.ravel())
        if self.sums is not None and self.sums.shape[0] != x.shape[1]:
            self.ragged = True
        if not self.ragged:
            self.sums = x.sum(axis=0) if self.sums is None else self.sums + x.sum(axis=0)
            self.squares = (x * x).sum(axis=0) if self.squares is None else self.squares + (x * x).sum(axis=0)

    @property
    def spread(self) -> float | None:
        """The float values' variance across samples, averaged over elements (population); an
        output that does not vary over the samples: its mean square (else 1), so that its error
        is relative to its magnitude, and finite."""
        n = self.errors.n
        if not n or self.sums is None or self.squares is None:
            return None
        if self.ragged:
            m = self.pooled.n
            power = self.pooled.squares / m
            variance = max(power - (self.pooled.total / m) ** 2, 0.0)
        else:
            variance = float(np.mean(np.maximum(self.squares / n - (self.sums / n) ** 2, 0.0)))
            power = float(np.mean(self.squares / n))
        return variance if variance > 1e-12 * max(power, 1e-30) else (power if power > 0 else 1.0)

    def _relative(self, mse: float) -> float:
        return math.sqrt(max(mse, 0.0) / (self.spread or 1.0))

    @property
    def relative_error(self) -> float | None:
        mse = self.errors.value
        return None if mse is None else self._relative(mse)

    def interval(self, z: float = Z95) -> tuple[float, float] | None:
        found = self.errors.interval(z)
        return None if found is None else (self._relative(found[0]), self._relative(found[1]))


TOP_SHARE = 0.1  # a dense map's top region: the highest tenth of its values


@dataclass
class MapAccumulator(PerSample):
    """A dense map's (saliency, heat-map, one-channel score map) top region: per sample, the
    elements each model puts in the highest TOP_SHARE of its own values, and their IoU; and the
    PSNR over the float sample's range.

    >>> acc = MapAccumulator()
    >>> ref = np.arange(20, dtype=np.float32).reshape(1, 20)  # top tenth: elements 18 and 19
    >>> got = ref.copy(); got[0, 17] = 30  # now 17 and 19
    >>> acc.update(ref, got, 1); round(acc.iou, 4)
    0.3333
    """

    psnr: Mean = field(default_factory=Mean)  # each sample's PSNR (dB; an exact sample is left out)

    def update(self, reference: np.ndarray, value: np.ndarray, batch: int) -> None:
        x = rows(np.asarray(reference, dtype=np.float32), batch)
        y = rows(np.asarray(value, dtype=np.float32), batch)
        k = max(1, int(round(TOP_SHARE * x.shape[1])))
        a, b = _top(x, k), _top(y, k)
        self.per_sample.add(iou_rows(a, b))
        peak = (x.max(axis=1) - x.min(axis=1)).astype(np.float64)
        mse = ((y.astype(np.float64) - x) ** 2).mean(axis=1)
        keep = (mse > 0) & (peak > 0)
        self.psnr.add(10 * np.log10(peak[keep] ** 2 / mse[keep]))

    @property
    def iou(self) -> float | None:
        return self.mean


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """Per row, the k largest elements (ties broken by position: one region, however flat)."""
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]
    top = np.zeros(x.shape, bool)
    np.put_along_axis(top, order, True, axis=1)
    return top
