"""The deployment a run decides for: the target profile, the batch the model is served at and
its threads (config `target:`), and whether latency verdicts are predicted from the profile
(`verify.latency: predicted`, the default: the same on any machine, under any load) or
measured on this machine's clock (`measured`: A/B timing, machine-dependent)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from qcli.config import Config
from qcli.target.predict import Prediction, predict
from qcli.target.profile import Profile, resolve


@dataclass
class Deployment:
    profile: Profile
    chosen: str  # how the profile was chosen (`resolve`), for the summary
    batch: int = 1
    threads: int | None = None
    measured: bool = False  # verify.latency: measured
    _predictions: dict[bytes, Prediction] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(cls, config: Config) -> Deployment:
        """The config's deployment (ConfigError, exit 2, for a profile that cannot be had)."""
        t = config.target
        profile, chosen = resolve(t.profile)
        return cls(profile, chosen, t.batch, t.threads if t.threads is not None else profile.threads,
                   config.verify.latency == "measured")

    def predict(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Prediction:
        """`model`'s predicted latency on `feeds`, kept by the model's bytes (the reference is
        asked for once per candidate)."""
        key = _digest(model)
        if key not in self._predictions:
            if len(self._predictions) > 8:
                self._predictions.pop(next(iter(self._predictions)))
            self._predictions[key] = predict(model, feeds, self.profile, self.threads)
        return self._predictions[key]

    def describe(self) -> str:
        how = "predicted" if not self.measured else "measured on this machine"
        return f"target {self.profile.name} ({self.chosen}), batch {self.batch}, latency {how}"


def _digest(model: onnx.ModelProto) -> bytes:
    import hashlib

    h = hashlib.sha256(model.graph.SerializeToString())
    for part in model.opset_import:
        h.update(part.SerializeToString())
    return h.digest()
