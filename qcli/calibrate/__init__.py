"""Calibration: streaming per-tensor statistics (observers) and the range solvers that turn
them into quantization ranges (minmax, percentile, kl, mse)."""

from __future__ import annotations

from qcli.calibrate.grid import GridHistogram
from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.solvers import SOLVERS, clipped_fraction, solve_range

__all__ = ["SOLVERS", "GridHistogram", "TensorObserver", "clipped_fraction", "solve_range"]
