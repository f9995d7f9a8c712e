"""Recovery: graph and weight changes that keep int8 accurate before anything goes float (README
"Recovery"; config `recovery:`). They run in a fixed order, each where its inputs exist:
equalization on the prepared float graph before calibration (weights only), SmoothQuant from
the per-channel statistics of the one calibration pass, bias correction from the quantized
model's measured output shift. A step that this version does not run is refused at the edge,
never silently skipped.
"""

from __future__ import annotations

from qcli.config import Config
from qcli.errors import ConfigError

AVAILABLE: tuple[str, ...] = ("equalization", "bias_correction")  # the steps implemented so far


def check_available(config: Config) -> None:
    """Refuse a config asking for a recovery step this version does not run."""
    missing = [s for s in config.recovery.steps if s not in AVAILABLE]
    if missing:
        available = f" (available: {', '.join(AVAILABLE)})" if AVAILABLE else ""
        raise ConfigError(f"recovery step {missing[0]!r} is not available in this version of qcli",
                          hint=f"drop it from recovery:{available}")
