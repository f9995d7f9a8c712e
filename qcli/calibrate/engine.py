"""`calibrate`: prepare the model, plan it, observe exactly the tensors the plan quantizes over
one pass of the data, and solve every method's ranges -> a CalibrationTable."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from qcli.calibrate.collect import collect
from qcli.calibrate.table import METHODS, CalibrationTable, RangeSettings, build_table
from qcli.config import Config
from qcli.data import DataFolder
from qcli.model import fingerprint


def calibrate(
    model: onnx.ModelProto,
    folder: DataFolder,
    config: Config,
    *,
    progress: Callable[[int], None] | None = None,
    force: bool = False,
    strict: bool = False,
    methods: tuple[str, ...] = METHODS,
) -> CalibrationTable:
    """Observe the activations `config`'s quantization needs over `folder` and solve the
    ranges of all four methods for the configured activation dtype.

    The histograms keep at least `bins` bins across each tensor's range (twice that at most),
    which is what the KL solver works on. The table is keyed to the fingerprint of `model`
    as given (before preparation), which is what `quantize` checks.
    """
    from qcli.plan import make_plan
    from qcli.prepare import prepare
    from qcli.quantize import check_unmatched

    prepared = prepare(model, force=force).model
    plan = make_plan(prepared, config)
    check_unmatched(plan, strict)
    collected = collect(
        prepared,
        folder,
        batch_size=config.calibration.batch_size,
        tensors=plan.calibrated_tensors,
        max_bins=2 * config.calibration.bins,
        progress=progress,
    )
    settings = RangeSettings.of(config)
    table = build_table(
        collected.observers, fingerprint(model), collected.samples, settings, methods, collected.aliases
    )
    table.warnings += [f"config rule {text}" for text in plan.unmatched]
    return table
