"""AWQ (Lin et al., 2024): each weight-only integer MatMul/Gemm weight multiplied by factors s
along its input channels, the activation divided by them, Y = (X / s) @ (s W), so that the
inputs that are large on the data get finer steps (`weights.algorithm: awq`).

Decisions:
- Targets: every activation X read as input 0 by weight-only MatMul / Gemm (transA=0) nodes
  whose integer weights are per block along the reduction axis (AWQ's group-wise int4; other
  weights keep round-to-nearest, said in a note), no other node reading those weights
  (qcli.recovery.smoothquant.targets_of). X's activations are not quantized: a statically
  quantized reader is SmoothQuant's.
- Statistics (`measure`), over every row of X on the calibration samples, in one extra pass
  through the prepared float graph: the per-channel mean |x| and the Gram matrix's diagonal
  blocks (block = the readers' largest, a power of two every smaller block divides), float64,
  C x block values per tensor (a 4096-channel input at block 32: 1 MB). One process, one sample
  a run, in order: the same data and config give the same sums on any number of workers, and a
  run returns one sample's inputs of every target (a 368M-parameter decoder's were 88 MB a
  sample of 128 tokens; runs of 8 samples took the pass to 1.52x the model's file).
- Factors: s = mean|x|^alpha, AWQ's grid alpha = 0, 0.05, ..., 0.95 (0: s = 1, round to
  nearest), normalized by sqrt(max s * min s); a channel never non-zero keeps s = 1. The alpha
  whose rounding error at the readers' outputs is least wins, earlier on a tie (no factors
  when none beats alpha 0). The error of a weight W [K, N] is Σ_blocks Σ_n dᵀ H d with d the
  block's column of Q(s W) / s - W and H its inputs' mean Gram block: the output error over
  every calibration row, each block's rounding error against its own inputs (AWQ measures the
  output on sampled rows with all blocks at once; the cross-block terms are sums of errors of
  independent signs).
- Clipping (AWQ's auto_clip): each block's range is then clipped by the ratio whose dᵀ H d is
  least (qcli.gptq.searched on the scaled weight and the Gram blocks of X / s).
- 1/s goes into X's producer as SmoothQuant's does (LayerNormalization, a per-channel Mul,
  a MatMul/Gemm's output channels), else an explicit float Mul before the readers (a GELU's
  output: AWQ's ScaledActivation). All factors from the original weights: a weight scaled along
  its input channels for one target and along its output channels for another rounds the same
  whichever is applied first (its blocks lie within one output channel).
- Weights are never changed in the graph: each changed weight is scaled, clipped and rounded
  when the build asks for it (`rounded`), one at a time, so memory holds the float graph's
  weights only where they already were (a model with external data: in its files).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from qcli.calibrate.collect import rows_of
from qcli.data import DataFolder
from qcli.errors import QcliError
from qcli.gptq import _block_errors, _per_value, searched
from qcli.graph import GraphIndex
from qcli.lazy import tensor_array
from qcli.plan import Plan, WeightPlan
from qcli.qweights import Weight, quantized_weight
from qcli.recovery.smoothquant import Reader, Target, divide, reorder, scale_initializer, targets_of
from qcli.rules import block_axis
from qcli.scheme import PerBlock

#: AWQ's grid (n_grid 20): s = mean|x|^alpha, alpha 0 (round to nearest) first.
ALPHAS = tuple(k / 20 for k in range(20))
S_FLOOR = 1e-4  # AWQ's clamp of mean|x|^alpha
OP_TYPES = ("MatMul", "Gemm")


@dataclass
class Moments:
    """Σ|x| per channel and the Gram matrix's diagonal blocks Σ x xᵀ [groups, block, block] of
    one tensor over `rows` rows (float64)."""

    abssum: np.ndarray
    gram: np.ndarray
    rows: int = 0

    @property
    def block(self) -> int:
        return int(self.gram.shape[1])

    def mean_abs(self) -> np.ndarray:
        return self.abssum / max(self.rows, 1)

    def blocks(self, size: int, s: np.ndarray | None = None) -> np.ndarray:
        """The mean Gram blocks of X / s [ceil(C / size), size, size], `size` dividing `block`."""
        g, b = self.gram.shape[0], self.block
        gram = self.gram / max(self.rows, 1)
        if s is not None:
            inv = np.pad(1.0 / s.astype(np.float64), (0, g * b - len(s)), constant_values=1.0).reshape(g, b)
            gram = gram * inv[:, :, None] * inv[:, None, :]
        k = b // size
        parts = gram.reshape(g, k, size, k, size)[:, np.arange(k), :, np.arange(k), :]  # [k, g, size, size]
        parts = parts.transpose(1, 0, 2, 3).reshape(g * k, size, size)
        return parts[:-(-len(self.abssum) // size)]


@dataclass(frozen=True)
class Change:
    """What AWQ does to one weight: multiplied by `factors` (axis, factor) and, when `clip` names
    the target tensor it reads, each block's range clipped on the Gram blocks of that tensor
    divided by `clip_s` (None: not divided)."""

    factors: tuple[tuple[int, np.ndarray], ...] = ()
    clip: str | None = None
    clip_s: np.ndarray | None = None

    def key(self) -> str:
        """A digest of the change (a memo's key: the same weight under another change differs)."""
        digest = hashlib.sha256(repr((self.clip, [a for a, _ in self.factors])).encode())
        for array in [f for _, f in self.factors] + ([self.clip_s] if self.clip_s is not None else []):
            digest.update(np.ascontiguousarray(array, np.float32).tobytes())
        return digest.hexdigest()


@dataclass
class Layer:
    """What was done to one target, for the summary: the error at its readers' outputs with
    the chosen factors, in dB below round-to-nearest's (0: left as it was)."""

    tensor: str
    readers: list[str]
    alpha: float | None
    into: str
    gain_db: float | None = None

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "readers": self.readers, "alpha": self.alpha, "into": self.into,
                "gain_db": self.gain_db}


@dataclass
class Scaled:
    model: onnx.ModelProto  # the graph with 1/s folded or multiplied in; its weights unchanged
    changes: dict[str, Change] = field(default_factory=dict)  # weight -> what `rounded` does to it
    layers: list[Layer] = field(default_factory=list)


def needs_data() -> QcliError:
    return QcliError(
        "weights.algorithm awq needs --data DIR: it reads its layers' input statistics on the calibration "
        "samples, which a calibration file does not hold",
        hint="give --data DIR instead of --calib FILE, or set weights.algorithm: rtn")


# ------------------------------------------------------------------ which tensors


def targets(model: onnx.ModelProto, plan: Plan, index: GraphIndex | None = None) -> list[Target]:
    """The activations AWQ scales in the prepared float `model` under `plan` (module docstring)."""
    index = index or GraphIndex.of(model)
    weight_only = {d.index for d in plan.nodes if d.quantized and not d.reason and not d.dynamic}
    return targets_of(index, lambda i, node: _reader(i, node, index, plan, weight_only))


def _reader(i: int, node: onnx.NodeProto, index: GraphIndex, plan: Plan, weight_only: set[int]) -> Reader | None:
    if node.op_type not in OP_TYPES or node.domain not in ("", "ai.onnx") or i not in weight_only:
        return None
    if len(node.input) < 2 or node.input[1] not in index.initializers or node.input[0] in plan.activations:
        return None
    if any(a.name == "transA" and a.i for a in node.attribute):
        return None
    dims = list(index.initializers[node.input[1]].dims)
    wp = plan.weights.get(node.input[1])
    axis = block_axis(node, len(dims))
    if len(dims) != 2 or wp is None or wp.scheme.dtype.is_float or axis is None or wp.axis != axis \
            or not isinstance(wp.scheme.granularity, PerBlock):
        return None
    return Reader(i, node.name or node.output[0], node.input[1], axis)


def requests(found: list[Target], plan: Plan) -> dict[str, int]:
    """Tensor -> the Gram block `measure` keeps for it: its readers' largest block."""
    return {t.tensor: max(_block(plan.weights[r.weight]) for r in t.readers) for t in found}


def _block(wp: WeightPlan) -> int:
    assert isinstance(wp.scheme.granularity, PerBlock)
    return wp.scheme.granularity.size


# ------------------------------------------------------------------ the statistics


def measure(model: onnx.ModelProto, blocks: Mapping[str, int], folders: Sequence[DataFolder],
            progress: Callable[[int], None] | None = None) -> dict[str, Moments]:
    """The `Moments` of each tensor of `blocks` (tensor -> block), one pass over `folders`, a
    sample a run."""
    names = sorted(blocks)
    if not names:
        return {}
    found: dict[str, Moments] = {}
    for name, x in rows_of(model, names, folders, 1, progress):
        _add(found, name, x, blocks[name])
    return found


def _add(found: dict[str, Moments], name: str, x: np.ndarray, block: int) -> None:
    groups = -(-x.shape[1] // block)
    held = found.setdefault(name, Moments(np.zeros(x.shape[1]), np.zeros((groups, block, block))))
    held.abssum += np.abs(x).sum(axis=0, dtype=np.float64)
    parts = np.pad(x, [(0, 0), (0, groups * block - x.shape[1])]).reshape(len(x), groups, block).transpose(1, 2, 0)
    held.gram += np.matmul(parts, parts.transpose(0, 2, 1))
    held.rows += len(x)


# ------------------------------------------------------------------ the factors


def factors(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """s = max(mean|x|, 1e-4)^alpha / sqrt(max s * min s), 1 for a channel never non-zero.

    >>> factors(np.array([4.0, 1.0, 0.0]), 0.5).tolist()
    [1.4142135381698608, 0.7071067690849304, 1.0]
    """
    live = mean_abs > 0
    if not live.any():
        return np.ones(len(mean_abs), np.float32)
    s = np.maximum(mean_abs, S_FLOOR) ** alpha
    s = s / math.sqrt(float(s[live].max() * s[live].min()))
    return np.where(live, s, 1.0).astype(np.float32)


def _choose(t: Target, moments: Moments, index: GraphIndex, plan: Plan) -> tuple[np.ndarray | None, float, float]:
    """(s or None, alpha, gain in dB over round-to-nearest) of a target."""
    weights = [(tensor_array(index.initializers[r.weight]).astype(np.float32), r.axis, plan.weights[r.weight])
               for r in t.readers]
    mean_abs = moments.mean_abs()
    errors = [_error(weights, moments, factors(mean_abs, alpha)) for alpha in ALPHAS]
    best = int(np.argmin(errors))  # the first of equal ones: alpha 0 before any factors
    gain = 10 * math.log10(errors[0] / errors[best]) if errors[best] > 0 else 0.0
    return (None if best == 0 else factors(mean_abs, ALPHAS[best])), ALPHAS[best], round(gain, 2)


def _error(weights: Iterable[tuple[np.ndarray, int, WeightPlan]], moments: Moments, s: np.ndarray) -> float:
    """Σ over readers of the rounding error of Q(s W) / s at the output (module docstring)."""
    total = 0.0
    for values, axis, wp in weights:
        view = [1] * values.ndim
        view[axis] = -1
        scaled = values * s.reshape(view)
        q, scale, zero = quantized_weight(scaled, wp)
        d = (q.astype(np.float32) - _per_value(zero, wp, q.shape)) * _per_value(scale, wp, q.shape)
        d = d / s.reshape(view) - values
        d = np.moveaxis(d, axis, -1).reshape(-1, d.shape[axis])  # [N, K]
        size = _block(wp)
        total += float(_block_errors(d, moments.blocks(size).astype(np.float32), -(-d.shape[1] // size), size).sum())
    return total


# ------------------------------------------------------------------ the transform


def scaled(model: onnx.ModelProto, plan: Plan, grams: Mapping[str, object] | None) -> Scaled:
    """AWQ on the prepared float `model` (not changed) under `plan`, with the `Moments` of
    `grams` (None: not measured, exit 2): the graph with 1/s in it and what each weight becomes."""
    index = GraphIndex.of(model)
    found = targets(model, plan, index)
    if found and grams is None:
        raise needs_data()
    chosen = [_choose(t, _moments(grams, t.tensor), index, plan) for t in found]  # original weights
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name: i for i in out.graph.initializer}
    factors_of: dict[str, list[tuple[int, np.ndarray]]] = {}
    clips: dict[str, tuple[str, np.ndarray | None]] = {}
    done = Scaled(out)

    def scale(name: str, factor: np.ndarray, axis: int) -> None:
        wp = plan.weights.get(name)
        if wp is not None and not wp.scheme.dtype.is_float:  # rounded later, from the file's values
            factors_of.setdefault(name, []).append((axis, factor))
        else:
            scale_initializer(inits[name], factor, axis)

    for t, (s, alpha, gain) in zip(found, chosen, strict=True):
        readers = [r.name for r in t.readers]
        for r in t.readers:
            if s is not None:
                factors_of.setdefault(r.weight, []).append((r.axis, s))
            clips[r.weight] = (t.tensor, s)
        if s is None:
            done.layers.append(Layer(t.tensor, readers, None, "left unscaled (round to nearest's error least)"))
            continue
        into, _ = divide(out, t, s, scale, "awq")
        done.layers.append(Layer(t.tensor, readers, alpha, into, gain))
    reorder(out)
    for name in dict.fromkeys([*factors_of, *clips]):
        clip, clip_s = clips.get(name, (None, None))
        done.changes[name] = Change(tuple(factors_of.get(name, ())), clip, clip_s)
    return done


def _moments(grams: Mapping[str, object] | None, tensor: str) -> Moments:
    held = None if grams is None else grams.get(tensor)
    if not isinstance(held, Moments):
        raise needs_data()
    return held


def rounded(values: np.ndarray, wp: WeightPlan, change: Change, grams: Mapping[str, object]) -> Weight:
    """`values` scaled by `change`'s factors and rounded under `wp`, each block's range clipped
    on the Gram blocks of the input it reads (`qcli.gptq.searched`)."""
    values = values.astype(np.float32)
    for axis, factor in change.factors:
        view = [1] * values.ndim
        view[axis] = -1
        values = values * factor.reshape(view)
    if change.clip is None:
        return quantized_weight(values, wp)
    gram = _moments(grams, change.clip).blocks(_block(wp), change.clip_s)
    return quantized_weight(values, wp, searched(values, wp, gram))


def notes(changes: Mapping[str, Change], plan: Plan, layers: list[Layer]) -> list[str]:
    """How many activations AWQ scaled, and which integer weights it leaves to round to nearest."""
    scaled_count = sum(1 for layer in layers if layer.alpha is not None)
    said = [f"awq: {scaled_count} of {len(layers)} activation(s) scaled, {len(changes)} weight(s) scaled or clipped"]
    rest = sorted(n for n, w in plan.weights.items() if n not in changes and not w.scheme.dtype.is_float)
    if rest:
        said.append(f"awq: {len(rest)} weight(s) rounded to nearest (not a per-block MatMul or Gemm weight of a "
                    "float input that only its readers read): " + ", ".join(rest[:5])
                    + (", ..." if len(rest) > 5 else ""))
    return said
