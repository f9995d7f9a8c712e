"""The rescue's step before float: the whole model weight-only (int8 weights, float activations).

When the rescue's model keeps less than half of the float model's weight bytes in integers
(it went mostly float), the model quantized weight-only (`activations: {dtype: float}`: its
8-bit weights written as Cast, Mul, which onnxruntime folds at load, qcli/qdq.py) computes in
float at float's speed from a file about 4x smaller. It needs no calibration, so every
compared sample is unseen by it, whatever the folds. It replaces the rescue's model when it
meets the same goal (the floors by the verdict rule, the latency ceiling), is not measurably
slower than it, and its weights take at most 3/4 of its bytes. One build, one measurement,
one timing: not counted in the search's trials. Only in onnxruntime's CPU scheme (uint8
asymmetric activations, 8-bit weights, as for the rescue's dynamic forms): a TensorRT config
(int8 symmetric) asks for int8 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from qcli.analyze.probe import Fidelity
from qcli.analyze.size import weight_bytes
from qcli.config import Activations, Config
from qcli.phases import phase
from qcli.precision.goal import Goal
from qcli.precision.trials import Trials
from qcli.quantize import QuantizeResult, quantize


@dataclass(frozen=True)
class Stored:
    result: QuantizeResult
    config: Config  # reproduces it: the input config with float activations, search off
    fidelity: Fidelity
    ratio: float | None
    note: str  # what it replaced, in words


#: the weight-only model must take at most this share of the rescue's model's weight bytes
SAVES = 0.75


def weight_only(trials: Trials, goal: Goal, current: QuantizeResult, current_ratio: float | None) -> Stored | None:
    """The weight-only model when the rescue's `current` (latency ratio `current_ratio`) is
    mostly float and it does better: at most SAVES of its weight bytes, the goal met, not
    measurably slower than `current` (module docstring); else None."""
    config = trials.config
    if config.activations.dtype == "float" or config.weights.dtype not in ("int8", "uint8"):
        return None
    float_bytes, now = weight_bytes(trials.prepared.model)[0], weight_bytes(current.model)[0]  # every graph
    if not float_bytes or 2 * now < float_bytes:  # half the bytes or more in integers already
        return None
    stored = config.model_copy(update={
        "activations": Activations(dtype="float", symmetric=config.activations.symmetric),
        "auto_precision": config.auto_precision.model_copy(update={"enabled": False}),
    })
    with phase("weight-only"):
        result = quantize(trials.model, stored, trials.table, prepared=trials.prepared)  # its ranges unused
        after = weight_bytes(result.model)[0]
        if after > SAVES * now:
            return None
        f = trials.probe.measure(result.model)
        if not goal.accurate(f):
            return None
        ratio = trials.probe.latency_ratio(result.model) if goal.max_latency_ratio is not None else None
    note = (f"weight-only: the rescue's model kept most weights float ({now / float_bytes:.2f} of the float "
            f"model's weight bytes); the whole model with int8 weights and float activations (computed in float, "
            f"its weights folded at load) meets the floors in {after / float_bytes:.2f} of them and is written instead")
    slower = ratio is not None and current_ratio is not None and getattr(ratio, "low", ratio) > getattr(
        current_ratio, "high", current_ratio)
    return Stored(result, stored, f, ratio, note) if goal.fast(ratio) and not slower else None
