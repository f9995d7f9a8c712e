"""The deployment a run decides for: the target profile, the batch the model is served at and
its threads (config `target:`), and whether latency verdicts are predicted from the profile
(`verify.latency: predicted`, the default: the same on any machine, under any load) or
measured on this machine's clock (`measured`: A/B timing, machine-dependent)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qcli.config import Config
from qcli.model import fingerprint
from qcli.target.predict import Prediction, predict
from qcli.target.profile import Profile, resolve


@dataclass
class Deployment:
    profile: Profile
    chosen: str  # how the profile was chosen (`resolve`), for the summary
    batch: int = 1
    threads: int | None = None
    measured: bool = False  # verify.latency: measured

    @classmethod
    def of(cls, config: Config) -> Deployment:
        """The config's deployment (ConfigError, exit 2, for a profile that cannot be had)."""
        t = config.target
        profile, chosen = resolve(t.profile)
        return cls(profile, chosen, t.batch, t.threads if t.threads is not None else profile.threads,
                   config.verify.latency == "measured")

    def predict(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Prediction:
        """`model`'s predicted latency on `feeds` (one session and one profiled run: callers
        keep what they ask for again, as the probe keeps its reference's)."""
        return predict(model, feeds, self.profile, self.threads)

    def describe(self) -> str:
        how = "predicted" if not self.measured else "measured on this machine"
        other = (f" (its kernels measured at batch {self.profile.batch})"
                 if self.profile.kind == "measured" and self.profile.batch != self.batch and not self.measured else "")
        c = self.profile.calibration
        fitted = f", calibrated on {c.model} at batch {c.batch}" if c is not None and not self.measured else ""
        return f"target {self.profile.name} ({self.chosen}{fitted}), batch {self.batch}{other}, latency {how}"

    def elsewhere(self, model: onnx.ModelProto) -> str | None:
        """What to say when the profile was calibrated on another model than `model`."""
        c = self.profile.calibration
        if c is None or self.measured or c.sha256 == fingerprint(model):
            return None
        return (f"target {self.profile.name} was calibrated on another model ({c.model}): its factors fit that "
                "model's graphs; `qcli target measure --model` calibrates one on this model")

