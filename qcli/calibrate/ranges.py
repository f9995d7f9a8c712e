"""What every range solver reads and returns, and the range every other method starts from.

A solver reads a tensor's statistics (`RangeStats`: a `TensorObserver` fits) and returns the
float range `(lo, hi)` its quantization covers, always with `lo <= 0 <= hi` (zero must be exactly
representable) and `lo == -hi` when symmetric. `minmax_range` is the observed range; the other
methods never reach past it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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


@dataclass(frozen=True)
class RangeSettings:
    """What a range depends on besides the statistics: method, its parameters, the target."""

    method: str = "mse"
    percentile: float = 99.999
    bins: int = 2048
    dtype: str = "uint8"
    symmetric: bool = False

    @classmethod
    def of(cls, config) -> RangeSettings:
        """The settings a `Config` asks for (its calibration and activations sections). A
        weight-only config (`activations: {dtype: float}`) has no activation type: the ranges
        the table keeps are then solved for uint8, the default; a node an override quantizes
        has its range solved for its own type on demand (`range`). A float8 type's range is solved
        as int8's (symmetric, 8 bits): the KL and MSE solvers model a uniform grid, float8's is
        not, and its scale is range / largest whatever solved the range."""
        c, a = config.calibration, config.activations
        dtype = "uint8" if a.dtype == "float" else "int8" if a.dtype.startswith("float8") else a.dtype
        return cls(c.method, c.percentile, c.bins, dtype, a.symmetric)

    def params(self, method: str) -> dict[str, Any]:
        if method == "percentile":
            return {"percentile": self.percentile}
        if method == "kl":
            return {"bins": self.bins}
        return {}
