"""Range solvers: from a tensor's calibration statistics (min, max, histogram) to the float
range `(lo, hi)` that its quantization will cover. Always `lo <= 0 <= hi` (zero must be exactly
representable), and `lo == -hi` when `symmetric`.

Every solver is a pure function `(stats, qdtype, symmetric, **params) -> (lo, hi)` reading only
`stats.min`, `stats.max`, `stats.count` and `stats.histogram` (a zero-aligned `GridHistogram`,
see grid.py), so one streaming pass over the data serves every method:

* ``minmax``     the observed range (ranges.py).
* ``percentile`` the p-th percentile of |x| (symmetric) or the (100-p)-th and p-th percentiles.
* ``kl``         TensorRT's entropy calibration: the |x| threshold whose quantized histogram
                 is closest (KL divergence) to the clipped reference histogram (kl.py).
* ``mse``        the range minimising the expected squared quantize/dequantize error, computed
                 exactly for values spread uniformly within each histogram bin (mse.py).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable

import numpy as np

from qcli.calibrate.grid import GridHistogram
from qcli.calibrate.kl import kl_range
from qcli.calibrate.mse import mse_range
from qcli.calibrate.ranges import Range, RangeStats, abs_max, minmax_range, require_data, with_zero
from qcli.errors import ConfigError
from qcli.scheme import QuantDtype


def percentile_range(
    stats: RangeStats, qdtype: QuantDtype, symmetric: bool, percentile: float = 99.999
) -> Range:
    """Clip the tails holding (100 - percentile)% of the values.

    Asymmetric: [q(100-p), q(p)] (each widened to include 0); symmetric: +-q_p(|x|), read from
    the histogram folded at 0. Quantiles interpolate linearly within a bin and never pass the
    observed min/max.

    Example: 1000 values, p = 99.9 -> asymmetric drops the lowest and the highest value;
    symmetric drops the value of largest magnitude.
    """
    if not 50.0 < percentile <= 100.0:
        raise ConfigError(f"percentile must be in (50, 100], got {percentile}")
    h = require_data(stats)
    p = percentile / 100.0
    if symmetric:
        folded = h.fold(max_bins=max(len(h.counts), 2048))
        t = min(_quantile(folded, p), abs_max(stats))
        return -t, t
    lo = max(_quantile(h, 1.0 - p), stats.min)
    hi = min(_quantile(h, p), stats.max)
    return with_zero(lo, hi)


def _quantile(h: GridHistogram, fraction: float) -> float:
    """The value below which `fraction` of the histogram's mass lies, interpolating linearly
    inside the bin (values assumed spread uniformly within a bin).

    >>> h = GridHistogram(exponent=0, first=0, counts=np.array([2, 0, 2]))  # bins [0,1) [1,2) [2,3)
    >>> _quantile(h, 0.25), _quantile(h, 0.5), _quantile(h, 0.75)
    (0.5, 1.0, 2.5)
    """
    cum = np.cumsum(h.counts)
    rank = fraction * float(cum[-1])
    # 0.999 * 1000 is 999.0000000000001: without snapping, the rank would step past a whole
    # value (and across any empty bins, e.g. up to an outlier).
    if abs(rank - round(rank)) <= 1e-9 * max(rank, 1.0):
        rank = float(round(rank))
    j = min(int(np.searchsorted(cum, rank, side="left")), len(cum) - 1)
    below = float(cum[j] - h.counts[j])
    within = (rank - below) / float(h.counts[j]) if h.counts[j] else 1.0
    return (h.first + j + min(max(within, 0.0), 1.0)) * h.width


Solver = Callable[..., Range]

SOLVERS: dict[str, Solver] = {
    "minmax": minmax_range,
    "percentile": percentile_range,
    "kl": kl_range,
    "mse": mse_range,
}


def solve_range(
    method: str, stats: RangeStats, qdtype: QuantDtype, symmetric: bool, **params: float
) -> Range:
    """`SOLVERS[method](stats, qdtype, symmetric, **params)`; ConfigError for an unknown method."""
    try:
        solver = SOLVERS[method]
    except KeyError:
        close = difflib.get_close_matches(str(method), SOLVERS, n=1)
        raise ConfigError(
            f"unknown calibration method {method!r}; expected one of {', '.join(SOLVERS)}",
            hint=f"did you mean {close[0]!r}?" if close else None,
        ) from None
    return solver(stats, qdtype, symmetric, **params)


def clipped_fraction(stats: RangeStats, lo: float, hi: float) -> float:
    """Share of the observed values outside [lo, hi] (0 when the range covers [min, max]);
    values inside a bin are taken as spread uniformly.

    >>> from qcli.calibrate.observers import TensorObserver
    >>> obs = TensorObserver(); obs.update(np.arange(100.0))
    >>> clipped_fraction(obs, 0.0, 99.0), clipped_fraction(obs, 0.0, 89.5)
    (0.0, 0.1)
    """
    h = require_data(stats)
    below = _mass_below(h, lo) if lo > stats.min else 0.0
    above = h.total - _mass_below(h, hi) if hi < stats.max else 0.0
    return float((below + above) / h.total)


def _mass_below(h: GridHistogram, v: float) -> float:
    """Histogram mass below v, interpolating linearly inside v's bin."""
    pos = v / h.width - h.first  # position in bins from the first edge
    j = int(math.floor(pos))
    if j < 0:
        return 0.0
    if j >= len(h.counts):
        return float(h.total)
    return float(h.counts[:j].sum() + (pos - j) * h.counts[j])
