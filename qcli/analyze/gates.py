"""Quality gates: thresholds a report must meet (the CLI exits 1 when one fails).

- `max_accuracy_drop` (fraction, 0.01 = one point): with labels, on top-1 (float - quantized);
  without labels, on the largest loss over the outputs, each by its kind (qcli.analyze.kinds):
  1 - its top-1 or sequence agreement, mask IoU or element agreement, 1 - its mean cosine
  (cosine outputs), its relative error squared (regression outputs: the share of the float
  output's variance the error leaves, 1 - R²); `ignore` outputs are not gated;
- `min_speedup`: float median latency / quantized median latency;
- `min_decode_speedup`: a decoder's decode step after the prompt, the same ratio (tokens/s);
- `min_compression`: float file bytes / quantized file bytes;
- `min_memory_reduction`: the weights onnxruntime holds to run the float model / the quantized
  one's (a float16 weight cast to float, which onnxruntime folds at load, halves the file, not this).
Each result says by how much it passed or missed, e.g. "speedup 0.92x < 1.10x (short by 0.18x)".
"""

from __future__ import annotations

from dataclasses import dataclass

from qcli.analyze.fidelity import AGREEMENT
from qcli.analyze.kinds import Kind
from qcli.analyze.report import Accuracy, Decode, Fidelity, GateResult, Memory, Predicted, Size, Speed, rounded
from qcli.errors import ConfigError


@dataclass(frozen=True)
class Gates:
    max_accuracy_drop: float | None = None
    min_speedup: float | None = None
    min_compression: float | None = None
    min_decode_speedup: float | None = None
    min_memory_reduction: float | None = None

    def __post_init__(self) -> None:
        drop = self.max_accuracy_drop
        if drop is not None and not 0 <= drop <= 1:
            raise ConfigError(
                f"max_accuracy_drop must be a fraction between 0 and 1, got {drop}",
                hint="0.01 allows one point of top-1 accuracy",
            )
        for name in ("min_speedup", "min_compression", "min_decode_speedup", "min_memory_reduction"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be a positive ratio, got {value}")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_accuracy_drop, self.min_speedup, self.min_compression,
                                           self.min_decode_speedup, self.min_memory_reduction))


def accuracy_measure(accuracy: Accuracy | None, fidelity: list[Fidelity]) -> tuple[str, float | None, bool]:
    """(metric name, drop as a fraction, whether it is in points of top-1) for the accuracy gate."""
    if accuracy is not None:
        return "top-1 drop", accuracy.top1_drop, True
    losses = [loss for f in fidelity for loss in _losses(f)]
    if not losses:
        return "accuracy drop", None, False
    return max(losses, key=lambda loss: loss[1])


# The agreement each kind is judged by: (the report's attribute for it, its name as verification says it)
_AGREEMENT = {k.value: (attr, AGREEMENT[k]) for k, attr in (
    (Kind.TOP1, "top1_agreement"), (Kind.SEQUENCE, "sequence_agreement"), (Kind.MASK, "mask_iou"),
    (Kind.BOXES, "box_f1"), (Kind.MAP, "map_iou"), (Kind.PER_ELEMENT, "agreement"))}


def _losses(f: Fidelity) -> list[tuple[str, float, bool]]:
    """(metric, loss, in points) of one output by its kind: 1 - its agreement, 1 - its cosine."""
    losses = []
    if f.kind in _AGREEMENT:
        key, name = _AGREEMENT[f.kind]
        value = getattr(f, key)
        if value is not None:
            losses.append((f"1 - {name} ({f.output})", 1.0 - value, True))
    if f.kind == "cosine" and f.cosine is not None:
        losses.append((f"1 - cosine ({f.output})", 1.0 - f.cosine, False))
    if f.kind == "regression" and f.relative_error is not None:
        losses.append((f"unexplained variance ({f.output})", f.relative_error ** 2, False))
    if f.kind == "tokens" and f.perplexity_increase is not None:
        losses.append((f"perplexity increase ({f.output})", max(f.perplexity_increase, 0.0), False))
    return losses


def check_gates(
    gates: Gates, accuracy: Accuracy | None, fidelity: list[Fidelity], speed: Speed | None, size: Size,
    predicted: Predicted | None = None, decode: Decode | None = None, memory: Memory | None = None,
) -> list[GateResult]:
    """Each gate set, checked; a speedup is the target profile's prediction when there is one
    (the same on any machine), else the timing's."""
    results = []
    if gates.max_accuracy_drop is not None:
        metric, value, points = accuracy_measure(accuracy, fidelity)
        results.append(_at_most("max_accuracy_drop", metric, value, gates.max_accuracy_drop, points))
    if gates.min_speedup is not None:
        value = predicted.speedup if predicted else speed.speedup if speed else None
        results.append(_at_least("min_speedup", "predicted speedup" if predicted else "speedup", value,
                                 gates.min_speedup))
    if gates.min_compression is not None:
        results.append(_at_least("min_compression", "compression", size.compression, gates.min_compression))
    if gates.min_decode_speedup is not None:
        value = predicted.decode_speedup if predicted else decode.step.speedup if decode else None
        results.append(_at_least("min_decode_speedup", "predicted decode speedup" if predicted else "decode speedup",
                                 value, gates.min_decode_speedup))
    if gates.min_memory_reduction is not None:
        results.append(_at_least("min_memory_reduction", "memory reduction",
                                 memory.reduction if memory else None, gates.min_memory_reduction))
    return results


def _at_most(name: str, metric: str, value: float | None, limit: float, points: bool) -> GateResult:
    if value is None:
        return GateResult(name, metric, None, limit, False, None,
                          f"{metric}: not measurable (no class-score or float output to compare)")

    def show(x: float) -> str:
        if points:
            n = 100 * x
            return f"{n:.2f} point" + ("" if abs(n) == 1 else "s")
        return f"{x:.4g}"

    margin = limit - value
    passed = value <= limit + 1e-12
    if passed:
        message = f"{metric} {show(value)} <= {show(limit)} ({show(margin)} to spare)"
    else:
        message = f"{metric} {show(value)} > {show(limit)} (over by {show(-margin)})"
    return GateResult(name, metric, rounded(value), limit, passed, rounded(margin), message)


def _at_least(name: str, metric: str, value: float | None, limit: float) -> GateResult:
    if value is None:
        return GateResult(name, metric, None, limit, False, None, f"{metric}: not measured")
    margin = value - limit
    passed = value >= limit
    if passed:
        message = f"{metric} {value:.2f}x >= {limit:.2f}x ({margin:.2f}x to spare)"
    else:
        message = f"{metric} {value:.2f}x < {limit:.2f}x (short by {-margin:.2f}x)"
    return GateResult(name, metric, rounded(value), limit, passed, rounded(margin), message)
