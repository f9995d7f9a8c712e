"""What every range solver reads and returns, and the range every other method starts from.

A solver reads a tensor's statistics (`RangeStats`: a `TensorObserver` fits) and returns the
float range `(lo, hi)` its quantization covers, always with `lo <= 0 <= hi` (zero must be exactly
representable) and `lo == -hi` when symmetric. `minmax_range` is the observed range; the other
methods never reach past it.
"""

from __future__ import annotations

from typing import Protocol

from qcli.calibrate.grid import GridHistogram
from qcli.errors import CalibrationError
from qcli.scheme import QuantDtype

Range = tuple[float, float]


class RangeStats(Protocol):
    """What a solver reads: a TensorObserver fits."""

    @property
    def name(self) -> str | None: ...

    @property
    def count(self) -> int: ...

    @property
    def min(self) -> float: ...

    @property
    def max(self) -> float: ...

    @property
    def histogram(self) -> GridHistogram | None: ...


def require_data(stats: RangeStats) -> GridHistogram:
    """The histogram of `stats`; CalibrationError naming the tensor when it saw no finite value."""
    if stats.count == 0 or stats.histogram is None:
        raise CalibrationError(
            f"tensor {stats.name or '?'!r} saw no finite values during calibration",
            hint="check that the calibration data reaches this tensor (or exclude its node)",
        )
    return stats.histogram


def with_zero(lo: float, hi: float) -> Range:
    """`[lo, hi]` widened to include 0."""
    return float(min(lo, 0.0)), float(max(hi, 0.0))


def abs_max(stats: RangeStats) -> float:
    """The largest magnitude seen (0 for an all-zero tensor)."""
    return float(max(-stats.min, stats.max, 0.0))


def minmax_range(stats: RangeStats, qdtype: QuantDtype, symmetric: bool) -> Range:
    """The observed range, widened to include 0; symmetric: +-max|x|.

    `qdtype` is unused (the range does not depend on the target type).
    """
    require_data(stats)
    if symmetric:
        t = abs_max(stats)
        return -t, t
    return with_zero(stats.min, stats.max)
