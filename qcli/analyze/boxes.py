"""A detector's boxes, compared as its users compare them: decoded, thresholded, suppressed, and
matched between the two models, pooled over the samples as a detector's users pool them.

A `boxes` output (qcli.analyze.kinds) holds, per sample, A candidates of K attributes: the box
as centre x, centre y, width, height in pixels, then one score per class (YOLOv8's `[N, 4 + C,
A]`, or anchors first, `[N, A, 4 + C]`). Per sample and model: the candidates whose best class
score reaches the threshold (`verify.thresholds`, default 0.25: YOLO's), at most TOP_K of them
by score, then non-maximum suppression per class at IoU 0.5. Two boxes match when they are of
the same class and overlap at IoU >= 0.5 (greedy, highest score first). The figure is the F1
over every sample's boxes, 2 x matched / (float's boxes + quantized's boxes), 1 when neither
model found any, gated like an agreement; its interval is Wilson's for matched boxes out of the
boxes compared, so a check resting on few boxes says so. A mean of each sample's F1 would count
every empty crop as a perfect sample: on NudeNet's held-out photos it gave 0.97 where the
boxes' F1 was 0.73 (8 of 12 float boxes kept).

>>> row = np.array([[50, 50, 20, 20, 0.9, 0.1], [52, 50, 20, 20, 0.8, 0.0], [200, 200, 10, 10, 0.1, 0.6]])
>>> [(b.cls, round(b.score, 2)) for b in detections(row, 0.25)]
[(0, 0.9), (1, 0.6)]
>>> moved = row.copy(); moved[2, :2] = [230, 230]
>>> box_f1(detections(row, 0.25), detections(moved, 0.25))
0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qcli.analyze.intervals import Z95, wilson

IOU = 0.5  # suppression and matching
TOP_K = 1000  # candidates kept per sample before suppression, by score
DEFAULT_THRESHOLD = 0.25


@dataclass(frozen=True)
class Detection:
    box: tuple[float, float, float, float]  # x0, y0, x1, y1
    score: float
    cls: int


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of `a` [n, 4] with every box of `b` [m, 4] (x0, y0, x1, y1)."""
    lo, hi = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def detections(candidates: np.ndarray, threshold: float) -> list[Detection]:
    """One sample's detections: `candidates` [A, 4 + C] (centre x, y, width, height, scores)."""
    scores = candidates[:, 4:]
    best, cls = scores.max(axis=1), scores.argmax(axis=1)
    keep = np.flatnonzero(best >= threshold)
    keep = keep[np.argsort(-best[keep], kind="stable")][:TOP_K]
    c = candidates[keep, :4].astype(np.float64)
    boxes = np.concatenate([c[:, :2] - c[:, 2:] / 2, c[:, :2] + c[:, 2:] / 2], axis=1)
    out: list[Detection] = []
    for k in np.unique(cls[keep]):
        mine = np.flatnonzero(cls[keep] == k)  # in score order
        alive = np.ones(mine.size, bool)
        overlaps = _iou(boxes[mine], boxes[mine])
        for i in range(mine.size):
            if alive[i]:
                alive[i + 1:] &= overlaps[i, i + 1:] < IOU
        out += [Detection(tuple(boxes[j]), float(best[keep[j]]), int(k)) for j in mine[alive]]
    return sorted(out, key=lambda d: (-d.score, d.cls, d.box))


def box_f1(a: list[Detection], b: list[Detection]) -> float:
    """2 x matched / (len(a) + len(b)): boxes of one class at IoU >= 0.5, greedily by score; 1
    when both are empty."""
    if not a and not b:
        return 1.0
    return 2 * matched(a, b) / (len(a) + len(b))


def matched(a: list[Detection], b: list[Detection]) -> int:
    """Boxes of `a` with a box of `b` of their class at IoU >= 0.5, greedily by score (each box
    of `a` takes the untaken one it overlaps most)."""
    if not a or not b:
        return 0
    overlaps = _iou(np.array([d.box for d in a]), np.array([e.box for e in b]))
    overlaps[np.array([d.cls for d in a])[:, None] != np.array([e.cls for e in b])[None, :]] = 0.0
    found = 0
    for row in overlaps:
        j = int(row.argmax())
        if row[j] >= IOU:
            overlaps[:, j] = 0.0  # taken
            found += 1
    return found


@dataclass
class BoxAccumulator:
    """The two models' detections over all samples, matched (module docstring).

    >>> acc = BoxAccumulator()
    >>> one = np.array([[[50, 50, 20, 20, 0.9]], [[9, 9, 4, 4, 0.1]]], np.float32)  # [N, A, K]
    >>> acc.axis = 2; acc.update(one, one, 2); acc.f1, acc.boxes, acc.samples
    (1.0, 1, 2)
    """

    threshold: float = DEFAULT_THRESHOLD
    axis: int = 1  # the attributes' axis of a batch: 1 ([N, K, A]) or 2 ([N, A, K])
    boxes: int = 0  # the float model's detections, over all samples
    found: int = 0  # the quantized model's
    matched: int = 0
    samples: int = 0

    def update(self, reference: np.ndarray, value: np.ndarray, batch: int) -> None:
        x, y = (np.moveaxis(np.asarray(v, dtype=np.float32), self.axis, -1) for v in (reference, value))
        for i in range(x.shape[0]):
            a, b = detections(x[i], self.threshold), detections(y[i], self.threshold)
            self.boxes += len(a)
            self.found += len(b)
            self.matched += matched(a, b)
        self.samples += x.shape[0]

    @property
    def f1(self) -> float | None:
        if not self.samples:
            return None
        return 2 * self.matched / (self.boxes + self.found) if self.boxes + self.found else 1.0

    def interval(self, z: float = Z95) -> tuple[float, float] | None:
        """Wilson's interval of matched boxes out of the boxes compared (the two models' mean)."""
        if not self.samples:
            return None
        return wilson(self.matched, (self.boxes + self.found) / 2, z) if self.boxes + self.found else (1.0, 1.0)


def box_layout(values: Sequence[np.ndarray]) -> int | None:
    """The attributes' axis (1 or 2) when these `[N, ., .]` batches hold decoded boxes with
    class scores: 5 to 1024 attributes, more candidates than attributes, the first four (centre
    and size, in pixels) never negative and reaching past 1, the rest probabilities; else None.
    Boxes in other units or encodings (offsets to a grid, before the exporter's decode) are not
    recognised."""
    first = np.asarray(values[0])
    if first.ndim != 3 or not np.issubdtype(first.dtype, np.floating):
        return None
    for axis in (1, 2):
        k, a = first.shape[axis], first.shape[3 - axis]
        if not 5 <= k <= 1024 or a <= k:
            continue
        rows = [np.moveaxis(np.asarray(v, dtype=np.float32), axis, -1) for v in values]
        coords, scores = [r[..., :4] for r in rows], [r[..., 4:] for r in rows]
        if (all(float(c.min()) >= 0 for c in coords) and max(float(c.max()) for c in coords) > 1.5
                and all(float(s.min()) >= 0 and float(s.max()) <= 1 + 1e-6 for s in scores)):
            return axis
    return None
