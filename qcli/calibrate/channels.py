"""Per-channel statistics of one float tensor (`ChannelObserver`): min and max of every channel
along one axis, and a fixed, small sample of its rows, streaming and mergeable, and their JSON form.

SmoothQuant (qcli/recovery/smoothquant.py) reads them: the factors from the channels' abs-max,
the smoothed tensor's range from the channels' min and max divided by the factors (exact for
minmax), and `alpha: auto` measures each candidate on the sampled rows. The rows are the first
`ROWS_PER_SAMPLE` rows (evenly spaced) of each of the first `ROW_SAMPLES` samples of the stream,
so they depend on the samples alone, not on batching or sharding; `merge` of the shards in
stream order gives exactly what one observer that saw them all would hold.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from qcli.errors import CalibrationError

#: Samples whose rows are kept, and rows kept per sample (at most ROW_SAMPLES x ROWS_PER_SAMPLE).
ROW_SAMPLES = 16
ROWS_PER_SAMPLE = 8


class ChannelObserver:
    """Streaming per-channel min/max of a tensor along `axis` (negative: from the end), plus a
    deterministic sample of its rows (each row: one value per channel).

    >>> obs = ChannelObserver(axis=-1)
    >>> obs.update(np.array([[[1.0, -2.0], [3.0, 0.5]]], dtype=np.float32))
    >>> obs.min.tolist(), obs.max.tolist(), obs.rows.shape
    ([1.0, -2.0], [3.0, 0.5], (2, 2))
    """

    def __init__(self, axis: int):
        self.axis = axis
        self.min: np.ndarray | None = None  # float32, one per channel
        self.max: np.ndarray | None = None
        self.kept = 0  # samples whose rows are kept (at most ROW_SAMPLES)
        self._rows: list[np.ndarray] = []  # per kept sample: (k, channels) float32

    @property
    def channels(self) -> int:
        return 0 if self.min is None else len(self.min)

    @property
    def rows(self) -> np.ndarray:
        """The sampled rows, (n, channels) float32, in stream order."""
        if not self._rows:
            return np.zeros((0, self.channels), np.float32)
        return np.concatenate(self._rows)

    @property
    def absmax(self) -> np.ndarray:
        """max |x| per channel (0 for a channel never seen finite)."""
        assert self.min is not None and self.max is not None
        return np.maximum(np.abs(self.min), np.abs(self.max))

    def update(self, x: np.ndarray, samples: int = 1) -> None:
        """Add a batch of `samples` samples (the leading axis, when it has that many)."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 0:
            raise CalibrationError("per-channel statistics need a tensor with a channel axis, got a scalar")
        moved = np.moveaxis(x, self.axis, -1)
        flat = moved.reshape(-1, moved.shape[-1])
        finite = np.isfinite(flat)
        lo = np.where(finite, flat, np.inf).min(axis=0, initial=np.inf)
        hi = np.where(finite, flat, -np.inf).max(axis=0, initial=-np.inf)
        if self.min is None or self.max is None:
            self.min, self.max = lo, hi
        elif len(lo) != len(self.min):
            raise CalibrationError(f"a tensor's channel count changed between batches ({len(self.min)} then {len(lo)})")
        else:
            self.min, self.max = np.minimum(self.min, lo), np.maximum(self.max, hi)
        # a sample's rows are contiguous when the batch axis leads (as data folders batch)
        split = samples if samples > 0 and len(flat) % samples == 0 else 1
        per_sample = flat.reshape(split, -1, flat.shape[-1])
        for rows in per_sample:
            if self.kept >= ROW_SAMPLES:
                break
            self.kept += 1
            self._rows.append(_spread(np.nan_to_num(rows, posinf=0.0, neginf=0.0)))

    def merge(self, other: ChannelObserver) -> ChannelObserver:
        """Add `other`'s statistics, the stream that came after this one's."""
        if other.min is None or other.max is None:
            return self
        if self.min is None or self.max is None:
            self.min, self.max = other.min.copy(), other.max.copy()
        else:
            self.min, self.max = np.minimum(self.min, other.min), np.maximum(self.max, other.max)
        for rows in other._rows:
            if self.kept >= ROW_SAMPLES:
                break
            self.kept += 1
            self._rows.append(rows)
        return self

    def to_dict(self) -> dict[str, Any]:
        rows = self.rows
        return {
            "axis": self.axis,
            "min": [] if self.min is None else [float(v) for v in self.min],
            "max": [] if self.max is None else [float(v) for v in self.max],
            "row_counts": [len(r) for r in self._rows],
            "rows": base64.b64encode(rows.astype("<f4").tobytes()).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChannelObserver:
        obs = cls(int(d["axis"]))
        lo, hi = np.asarray(d["min"], np.float32), np.asarray(d["max"], np.float32)
        if lo.shape != hi.shape or lo.ndim != 1:
            raise ValueError("per-channel min and max differ in length")
        if len(lo):
            obs.min, obs.max = lo, hi
        flat = np.frombuffer(base64.b64decode(d["rows"]), dtype="<f4").astype(np.float32)
        counts = [int(c) for c in d["row_counts"]]
        if flat.size != sum(counts) * len(lo):
            raise ValueError("per-channel rows do not match their channel count")
        table = flat.reshape(-1, len(lo)) if len(lo) else flat.reshape(0, 0)
        start = 0
        for c in counts:
            obs._rows.append(table[start:start + c])
            start += c
        obs.kept = len(counts)
        return obs


def _spread(rows: np.ndarray) -> np.ndarray:
    """At most ROWS_PER_SAMPLE of a sample's rows, evenly spaced (first and last included).

    >>> _spread(np.arange(20.0).reshape(20, 1)).ravel().tolist()
    [0.0, 3.0, 5.0, 8.0, 11.0, 14.0, 16.0, 19.0]
    """
    if len(rows) <= ROWS_PER_SAMPLE:
        return np.array(rows, np.float32)
    picks = np.round(np.linspace(0, len(rows) - 1, ROWS_PER_SAMPLE)).astype(int)
    return np.array(rows[picks], np.float32)
