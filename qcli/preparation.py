"""Which of qcli's preparation passes a verified run keeps: the user's file is the reference.

Every model qcli writes is built on its prepared float graph and judged against the user's file
as given. When the target profile predicts the prepared graph slower than the file (beyond
PREDICTION_TOLERANCE) on the first samples compared, the model is prepared again without each
combination of the passes a run may leave out (qcli.config.SKIPPABLE_PASSES) and the fastest
prediction is kept (ties: fewer passes left out, then their order). Those left out go into the
config's `prepare.skip`, so the precision config and the model's metadata reproduce the graph
without predicting again. Decided on predictions only: the same model, feeds and profile give
the same passes on any machine. The other passes (opset upgrade, constant folding, inlining)
are what quantizing needs, and stay; a graph still predicted slower gets a note.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx

from qcli.checks import PREDICTION_TOLERANCE
from qcli.config import Config
from qcli.configparts import SKIPPABLE_PASSES
from qcli.phases import phase
from qcli.prepare import PrepareResult
from qcli.quantize import prepare_for
from qcli.target.deployment import Deployment
from qcli.target.predict import Prediction


def kept_passes(model: onnx.ModelProto, config: Config, prepared: PrepareResult, feeds: dict[str, np.ndarray],
                deployment: Deployment, reference: Prediction, *,
                force: bool = False) -> tuple[PrepareResult, Config, list[str]]:
    """`prepared` and `config`, or both without the passes predicted to make `model` slower
    (module docstring), and the notes saying so. `reference`: `model`'s prediction on `feeds`
    (the caller's: the probe takes it over)."""
    original = reference.us
    with phase("predict"):
        ratio = deployment.predict(prepared.model, feeds).us / original
    if ratio <= 1 + PREDICTION_TOLERANCE:
        return prepared, config, []
    left = [name for name in SKIPPABLE_PASSES if name not in config.prepare.skip]
    best, best_config, best_ratio = prepared, config, ratio
    dropped: tuple[str, ...] = ()
    for size in range(1, len(left) + 1):
        for names in itertools.combinations(left, size):
            trial = _skipping(config, names)
            again = prepare_for(model, trial, force=force)
            with phase("predict"):
                found = deployment.predict(again.model, feeds).us / original
            if found < best_ratio:
                best, best_config, best_ratio, dropped = again, trial, found, names
    notes = []
    if dropped:
        listed = " and ".join(dropped)
        notes.append(f"preparation: {listed} left out (prepare.skip): your model is predicted at {ratio:.3f}x "
                     f"its latency on the target with {'it' if len(dropped) == 1 else 'them'}, "
                     f"{best_ratio:.3f}x without")
    if best_ratio > 1 + PREDICTION_TOLERANCE:
        changes = "; ".join(best.notes) or "no change noted"
        notes.append(f"preparation alone is predicted {best_ratio:.3f}x your model's latency on the target "
                     f"({changes}); the latency floor judges the model written against your file as given")
    return best, best_config, notes


def _skipping(config: Config, names: tuple[str, ...]) -> Config:
    """`config` with `names` added to `prepare.skip`."""
    skip = [*config.prepare.skip, *names]
    return config.model_copy(update={"prepare": config.prepare.model_validate({"skip": skip})})
