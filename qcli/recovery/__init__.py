"""Recovery: graph and weight changes that keep int8 accurate before anything goes float
(docs/guides/recovery.md; config `recovery:`). They run in a fixed order, each where its inputs exist:
equalization on the prepared float graph before calibration (weights only), SmoothQuant from
the per-channel statistics of the one calibration pass, bias correction from the quantized
model's measured output shift.
"""

from __future__ import annotations

from qcli.config import Config
from qcli.errors import CalibrationError

GRAPH_STEPS = ("equalization",)  # steps that change the float graph calibration observes


def graph_steps(config: Config) -> tuple[str, ...]:
    """The steps of `config` that change the graph calibration observes: a calibration table
    made with other ones has the ranges of another graph."""
    return tuple(s for s in config.recovery.steps if s in GRAPH_STEPS)


def check_table(config: Config, made_with: tuple[str, ...]) -> None:
    """Refuse a calibration table observed on a graph the recovery steps of `config` change
    differently (equalization rescales the tensors between each pair)."""
    wanted = graph_steps(config)
    if made_with != wanted:
        raise CalibrationError(f"the calibration was made {_with(made_with)}, and this config runs {_with(wanted)}: "
                               "its ranges are those of another graph",
                               hint="calibrate again with the same --config as quantize")


def _with(steps: tuple[str, ...]) -> str:
    return f"with {', '.join(steps)}" if steps else "without recovery steps"

