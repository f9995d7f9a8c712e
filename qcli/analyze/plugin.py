"""A user's own metric (`verify.metric: package.module:function`): WER, CER, mAP or cents, which no
output shape can reveal.

The function is called once per compared sample as `function(float_outputs, quantized_outputs,
sample)`, each a dict of arrays by name (outputs, and the sample's model inputs, with a batch
axis of 1 where the model has one), and returns `(score, floor)`: higher scores are better, and
the mean score over the samples must reach the floor (the same floor on every call).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qcli.data import Batch
from qcli.errors import ConfigError, QcliError

MetricFunction = Callable[[dict, dict, dict], tuple[float, float]]


@dataclass(frozen=True)
class CustomScore:
    name: str  # "verify.metric mypkg.metrics:cer"
    score: float  # mean over samples
    floor: float
    samples: int

    @property
    def passed(self) -> bool:
        return self.score >= self.floor


def load_metric(spec: str) -> Metric:
    """The function `spec` ("package.module:function") names; a ConfigError (exit 2) when it
    cannot be imported or is not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"verify.metric {spec!r} is not package.module:function",
                          hint="e.g. verify.metric: mypkg.metrics:cer")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own error while importing
        raise ConfigError(f"verify.metric {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}",
                          hint="install the module or put its folder on PYTHONPATH") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ConfigError(f"verify.metric {spec!r}: module {module_name!r} has no function {attr!r}")
    return Metric(spec, function)


@dataclass(frozen=True)
class Metric:
    spec: str
    function: MetricFunction

    def start(self) -> CustomAccumulator:
        return CustomAccumulator(self)


@dataclass
class CustomAccumulator:
    """The plug-in's scores over the samples of one comparison."""

    metric: Metric
    scores: list[float] = field(default_factory=list)
    floor: float | None = None

    def update(self, reference: dict[str, np.ndarray], value: dict[str, np.ndarray], batch: Batch) -> None:
        for i in range(batch.size):
            f, q = batch.sample(reference, i), batch.sample(value, i)
            self._add(self._call(f, q, batch.sample(batch.inputs, i)))

    def _call(self, f: dict, q: dict, sample: dict) -> object:
        try:
            return self.metric.function(f, q, sample)
        except Exception as exc:
            raise QcliError(f"verify.metric {self.metric.spec!r} raised {type(exc).__name__}: {exc}") from exc

    def _add(self, returned: object) -> None:
        spec = self.metric.spec
        try:
            score, floor = (float(v) for v in returned)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            raise QcliError(f"verify.metric {spec!r} returned {returned!r}, not (score, floor)") from None
        if not (math.isfinite(score) and math.isfinite(floor)):
            raise QcliError(f"verify.metric {spec!r} returned ({score}, {floor}): both must be finite numbers")
        if self.floor is not None and floor != self.floor:
            raise QcliError(f"verify.metric {spec!r} returned floor {floor:g}, earlier {self.floor:g}: "
                            "the floor must be the same on every call")
        self.floor = floor
        self.scores.append(score)

    def result(self) -> CustomScore | None:
        if not self.scores or self.floor is None:
            return None
        return CustomScore(f"verify.metric {self.metric.spec}", float(np.mean(self.scores)), self.floor,
                           len(self.scores))
