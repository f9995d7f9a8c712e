"""A weight's quantized form (integers, scale, zero point) under its plan, and the memo that
the builds from one float graph share (the precision search builds hundreds of candidates from
one prepared model; their weights are the same each time). Used by the Q/DQ rewrite
(qcli/qdq.py) and the dynamic nodes (qcli/dynamic.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
import onnx

from qcli.plan import WeightPlan
from qcli.runtime import SharedStore
from qcli.scheme import PerBlock, choose_qparams, quantize

Weight = tuple[np.ndarray, np.ndarray, np.ndarray]  # integers, scale, zero point


@dataclass
class WeightMemo:
    """What the builds from one float graph share (qcli.prepare's PrepareResult.quantized):
    its weights as quantized by earlier builds, by what they were quantized for, and the graph
    without its initializers (qcli.qdq copies that, not the float weights it replaces), and its
    float initializers held once for the sessions of lean builds (`SharedStore`)."""

    weights: dict[Hashable, Weight] = field(default_factory=dict)
    shell: onnx.ModelProto | None = None
    shared: SharedStore | None = None


def quantized_weight(values: np.ndarray, plan: WeightPlan) -> Weight:
    """A float weight's integers, scale and zero point under `plan`: per tensor, per channel
    along `plan.axis`, or per block of values along it.

    >>> from qcli.scheme import QuantScheme
    >>> plan = WeightPlan("w", QuantScheme.of("int8", "per_channel", True), 1)
    >>> q, s, z = quantized_weight(np.array([[1.0, -0.5], [-2.0, 0.25]], np.float32), plan)
    >>> q.tolist(), [round(float(v), 5) for v in s], z.tolist()
    ([[64, -127], [-127, 64]], [0.01575, 0.00394], [0, 0])
    """
    scheme, axis = plan.scheme, plan.axis
    scale, zero = weight_qparams(values, plan)
    if isinstance(scheme.granularity, PerBlock) and axis is not None:
        block, size = scheme.granularity.size, values.shape[axis]
        q = quantize(values, _expand_blocks(scale, block, axis, size), _expand_blocks(zero, block, axis, size),
                     scheme.dtype, None, scheme.symmetric)
    else:
        q = quantize(values, scale, zero, scheme.dtype, axis, scheme.symmetric)
    return q, scale, zero


def weight_qparams(values: np.ndarray, plan: WeightPlan) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point of a weight: one, one per channel along `axis`, or one per block of
    values along `axis` (then shaped like the weight with that axis shortened)."""
    scheme, axis = plan.scheme, plan.axis
    if axis is None:
        return choose_qparams(values.min(), values.max(), scheme.dtype, scheme.symmetric)
    if isinstance(scheme.granularity, PerBlock):
        moved = np.moveaxis(values, axis, 0)
        size, block = moved.shape[0], scheme.granularity.size
        count = -(-size // block)
        padded = np.pad(moved, [(0, count * block - size)] + [(0, 0)] * (moved.ndim - 1))
        blocks = padded.reshape(count, block, *moved.shape[1:])
        scale, zero = choose_qparams(blocks.min(axis=1), blocks.max(axis=1), scheme.dtype, scheme.symmetric)
        return np.moveaxis(scale, 0, axis), np.moveaxis(zero, 0, axis)
    other = tuple(a for a in range(values.ndim) if a != axis)
    return choose_qparams(values.min(axis=other), values.max(axis=other), scheme.dtype, scheme.symmetric)


def _expand_blocks(param: np.ndarray, block: int, axis: int, size: int) -> np.ndarray:
    """Per-block params repeated to the weight's shape (for quantizing the values)."""
    return np.take(np.repeat(param, block, axis=axis), np.arange(size), axis=axis)


def weight_of(memo: WeightMemo | None, key: Hashable, values: Callable[[], np.ndarray],
              plan: WeightPlan) -> Weight:
    """`quantized_weight(values(), plan)`, remembered in `memo` under `key` (None: computed)."""
    if memo is None:
        return quantized_weight(values(), plan)
    if key not in memo.weights:
        memo.weights[key] = frozen(quantized_weight(values(), plan))
    return memo.weights[key]


def frozen(weight: Weight) -> Weight:
    """The arrays made read-only: a remembered weight is shared by every later build."""
    for array in weight:
        array.setflags(write=False)
    return weight
