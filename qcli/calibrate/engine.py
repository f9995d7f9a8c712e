"""`calibrate`: one pass over a data folder -> a CalibrationTable with every method's ranges."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from qcli.calibrate.collect import collect
from qcli.calibrate.table import CalibrationTable, RangeSettings, build_table
from qcli.config import Config
from qcli.data import DataFolder
from qcli.model import fingerprint


def range_settings(config: Config) -> RangeSettings:
    c, a = config.calibration, config.activations
    return RangeSettings(c.method, c.percentile, c.bins, a.dtype, a.symmetric)


def calibrate(
    model: onnx.ModelProto,
    folder: DataFolder,
    config: Config,
    *,
    progress: Callable[[int], None] | None = None,
) -> CalibrationTable:
    """Observe the model's activations over `folder` (its first `config.calibration.samples`)
    and solve the ranges of all four methods for the configured activation dtype.

    The histograms keep at least `bins` bins across each tensor's range (twice that at most),
    which is what the KL solver works on.
    """
    collected = collect(
        model,
        folder,
        batch_size=config.calibration.batch_size,
        max_bins=2 * config.calibration.bins,
        progress=progress,
    )
    return build_table(collected.observers, fingerprint(model), collected.samples, range_settings(config))
