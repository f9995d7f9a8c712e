"""A weight's quantized form (integers, scale, zero point) under its plan, and the memo that
the builds from one float graph share (the precision search builds hundreds of candidates from
one prepared model; their weights are the same each time). Used by the Q/DQ rewrite
(qcli/qdq.py) and the dynamic nodes (qcli/dynamic.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TypeVar

import numpy as np
import onnx

from qcli.plan import WeightPlan
from qcli.runtime import SharedStore
from qcli.scheme import PerBlock, QuantScheme, choose_qparams, full_range, quantize

Weight = tuple[np.ndarray, np.ndarray, np.ndarray]  # integers, scale, zero point
_Arrays = TypeVar("_Arrays", bound=tuple)


@dataclass
class WeightMemo:
    """What the builds from one float graph share (qcli.prepare's PrepareResult.quantized):
    its weights as quantized by earlier builds, by what they were quantized for, and the graph
    without its initializers (qcli.qdq copies that, not the float weights it replaces), and its
    float initializers held once for the sessions of lean builds (`SharedStore`)."""

    weights: dict[Hashable, Weight | Nibbles] = field(default_factory=dict)
    shell: onnx.ModelProto | None = None
    shared: SharedStore | None = None

    def get(self, key: Hashable) -> Weight | None:
        held = self.weights.get(key)
        return held.weight() if isinstance(held, Nibbles) else held

    def put(self, key: Hashable, weight: Weight, plan: WeightPlan) -> Weight:
        """Remember `weight`: 4-bit integers two per byte (a decoder's int4 weights held in
        int8 were 319 of the 368M-parameter model's 903 MB after its build), the rest as they
        are, read-only (every later build shares them)."""
        self.weights[key] = Nibbles.of(weight) if _nibble(plan) else frozen(weight)
        return frozen(weight)


@dataclass(frozen=True)
class Nibbles:
    """A weight whose integers fit in 4 bits, held two per byte, the first in the low nibble.

    >>> w = (np.array([[-8, 7, -1]], np.int8), np.ones(1, np.float32), np.zeros(1, np.int8))
    >>> Nibbles.of(w).weight()[0].tolist()
    [[-8, 7, -1]]
    """

    packed: np.ndarray
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: np.ndarray
    zero: np.ndarray

    @classmethod
    def of(cls, weight: Weight) -> Nibbles:
        q, scale, zero = weight
        nibbles = np.ascontiguousarray(q).astype(np.int8, copy=False).ravel().view(np.uint8)  # two's complement
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        return cls((nibbles[0::2] & np.uint8(0x0F)) | (nibbles[1::2] << np.uint8(4)), q.shape, q.dtype,
                   *frozen((scale, zero)))

    def weight(self) -> Weight:
        nibbles = np.empty(self.packed.size * 2, np.uint8)
        nibbles[0::2], nibbles[1::2] = self.packed & 0x0F, self.packed >> 4
        q = nibbles[:int(np.prod(self.shape))]
        if np.dtype(self.dtype).kind == "i":
            q = (q ^ 8).astype(np.int8) - np.int8(8)  # two's complement of 4 bits
        return frozen((q.astype(self.dtype, copy=False).reshape(self.shape), self.scale, self.zero))


def quantized_weight(values: np.ndarray, plan: WeightPlan,
                     params: tuple[np.ndarray, np.ndarray] | None = None) -> Weight:
    """A float weight's integers, scale and zero point under `plan`: per tensor, per channel
    along `plan.axis`, or per block of values along it; `params`: the scale and zero point to
    round by, shaped as `weight_qparams` gives them (a clipped range: values past it saturate).

    >>> from qcli.scheme import QuantScheme
    >>> plan = WeightPlan("w", QuantScheme.of("int8", "per_channel", True), 1)
    >>> q, s, z = quantized_weight(np.array([[1.0, -0.5], [-2.0, 0.25]], np.float32), plan)
    >>> q.tolist(), [round(float(v), 5) for v in s], z.tolist()
    ([[64, -127], [-127, 64]], [0.01575, 0.00394], [0, 0])
    """
    scheme, axis = plan.scheme, plan.axis
    view = grouped(values, plan) if params is None and full_range(scheme.dtype, scheme.symmetric) else None
    if view is not None:  # the integers of the scale chosen, kept: not rounded a third time
        q, scale, zero = _rounded(*view, scheme)
        return q.reshape(values.shape), scale, zero
    scale, zero = params if params is not None else weight_qparams(values, plan)
    if isinstance(scheme.granularity, PerBlock) and axis is not None and values.shape[axis] % scheme.granularity.size:
        block, size = scheme.granularity.size, values.shape[axis]
        q = quantize(values, _expand_blocks(scale, block, axis, size), _expand_blocks(zero, block, axis, size),
                     scheme.dtype, None, scheme.symmetric)
    elif isinstance(scheme.granularity, PerBlock) and axis is not None:  # whole blocks: broadcast, not repeated
        blocks = _blocked(values, axis, scheme.granularity.size)
        q = quantize(blocks, np.expand_dims(scale, axis + 1), np.expand_dims(zero, axis + 1), scheme.dtype, None,
                     scheme.symmetric).reshape(values.shape)
    else:
        q = quantize(values, scale, zero, scheme.dtype, axis, scheme.symmetric)
    return q, scale, zero


def weight_qparams(values: np.ndarray, plan: WeightPlan) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point of a weight: one, one per channel along `axis`, or one per block of
    values along `axis` (then shaped like the weight with that axis shortened)."""
    scheme, axis = plan.scheme, plan.axis
    view = grouped(values, plan)
    if view is not None:
        return _qparams(*view, scheme)
    if axis is not None and isinstance(scheme.granularity, PerBlock):  # a last, shorter block: padded
        block = scheme.granularity.size
        moved = np.moveaxis(values, axis, 0)
        size = moved.shape[0]
        count = -(-size // block)
        padded = np.pad(moved, [(0, count * block - size)] + [(0, 0)] * (moved.ndim - 1))
        scale, zero = _qparams(padded.reshape(count, block, *moved.shape[1:]), 1, scheme)
        return np.moveaxis(scale, 0, axis), np.moveaxis(zero, 0, axis)
    raise AssertionError("unreachable: grouped covers every other plan")


_Grouping = tuple[np.ndarray, int | tuple[int, ...] | None]


def grouped(values: np.ndarray, plan: WeightPlan) -> _Grouping | None:
    """`values` viewed so that each group of one scale is a reduction over the returned axes
    (None: the whole tensor); None for blocks that do not divide their axis (padded instead)."""
    scheme, axis = plan.scheme, plan.axis
    if axis is None:
        return values, None
    if not isinstance(scheme.granularity, PerBlock):
        return values, tuple(a for a in range(values.ndim) if a != axis)
    block = scheme.granularity.size
    return (_blocked(values, axis, block), axis + 1) if values.shape[axis] % block == 0 else None


def _qparams(values: np.ndarray, reduce: int | tuple[int, ...] | None,
             scheme: QuantScheme) -> tuple[np.ndarray, np.ndarray]:
    """`choose_qparams` for each group of `values` over the axes `reduce`. A full-range scheme
    (qcli.scheme.full_range: int4 -8..7) clips a value as large as the group's largest but of
    the other sign by a step: each group then takes, of that scale and the symmetric one (int4:
    the largest magnitude at 7), the one of least squared rounding error.

    >>> from qcli.plan import WeightPlan
    >>> w = np.array([[0.7, -0.7, 0.3, 0.1], [0.8, -0.1, 0.2, 0.4]], np.float32)  # two blocks
    >>> s, _ = _qparams(w, 1, QuantScheme.of("int4", "per_block", True, 4))
    >>> [round(float(v), 4) for v in s]  # 0.7 / 7: exact; 0.8 / -8: the finer step
    [0.1, -0.1]
    """
    if full_range(scheme.dtype, scheme.symmetric):
        return _rounded(values, reduce, scheme)[1:]
    return choose_qparams(values.min(axis=reduce), values.max(axis=reduce), scheme.dtype, scheme.symmetric)


_PIECE = 1 << 16  # values rounded at once: the two candidates' temporaries stay in a core's cache


def _rounded(values: np.ndarray, reduce: int | tuple[int, ...] | None, scheme: QuantScheme) -> Weight:
    """A full-range scheme's integers, scale and zero point (`_qparams`), the integers those of
    the scale each group chose (kept, not rounded a third time), in `pieces`."""
    parts = [_rounded_piece(values[rows], reduce, scheme) for rows in pieces(values, reduce, _PIECE)]
    if len(parts) == 1:
        return parts[0]
    q, scale, zero = (np.concatenate(arrays) for arrays in zip(*parts, strict=True))
    return q, scale, zero


def pieces(values: np.ndarray, reduce: int | tuple[int, ...] | None, size: int) -> list[slice | EllipsisType]:
    """Rows of `values` along axis 0 of about `size` values each, when no group of one scale spans
    that axis (each piece's groups then whole, and their scales the same rows of the scales'
    axis 0), so that a large weight's temporaries stay in cache; else the whole of it (`...`)."""
    axes = () if reduce is None else (reduce,) if isinstance(reduce, int) else reduce
    if reduce is None or 0 in axes or values.ndim == 0 or values.size <= size:
        return [...]
    rows = max(1, size * values.shape[0] // values.size)
    return [slice(i, i + rows) for i in range(0, values.shape[0], rows)]


def expander(reduce: int | tuple[int, ...] | None) -> Callable[[np.ndarray], np.ndarray]:
    """What makes a group's parameter (scale, zero point) broadcast against its values."""
    return (lambda a: np.expand_dims(a, reduce)) if reduce is not None else (lambda a: a)


def _rounded_piece(values: np.ndarray, reduce: int | tuple[int, ...] | None, scheme: QuantScheme) -> Weight:
    """`_rounded` on one piece, in float32 and in place: each candidate's error is measured in
    its own steps (squared, then times the step squared), its integers clipped only at the top
    (the full range's largest magnitude lands on the most negative integer exactly; the narrow
    one's on the largest, of either sign)."""
    lo, hi = values.min(axis=reduce), values.max(axis=reduce)
    dtype = scheme.dtype
    keep = expander(reduce)
    rounded, errors = [], []
    for full in (True, False):
        scale = choose_qparams(lo, hi, dtype, True, full=full)[0]
        steps = np.asarray(values / keep(scale), np.float32)
        q = np.asarray(np.rint(steps))  # an array for a one-value weight too (`out=` below)
        if full:
            np.minimum(q, dtype.qmax, out=q)
        steps -= q
        np.square(steps, out=steps)
        errors.append(steps.sum(axis=reduce) * np.square(scale))
        rounded.append((q, scale))
    narrower = errors[1] < errors[0]
    (q_full, s_full), (q_narrow, s_narrow) = rounded
    q = np.where(keep(narrower), q_narrow, q_full).astype(dtype.numpy_dtype)
    return q, np.where(narrower, s_narrow, s_full).astype(np.float32), np.zeros(narrower.shape, dtype.numpy_dtype)


def _blocked(values: np.ndarray, axis: int, block: int) -> np.ndarray:
    """`values` with `axis` split into (blocks, block): whole blocks only."""
    shape = values.shape
    return values.reshape(*shape[:axis], shape[axis] // block, block, *shape[axis + 1:])


def _expand_blocks(param: np.ndarray, block: int, axis: int, size: int) -> np.ndarray:
    """Per-block params repeated to the weight's shape (for quantizing the values)."""
    return np.take(np.repeat(param, block, axis=axis), np.arange(size), axis=axis)


def weight_of(memo: WeightMemo | None, key: Hashable, values: Callable[[], np.ndarray],
              plan: WeightPlan) -> Weight:
    """`quantized_weight(values(), plan)`, remembered in `memo` under `key` (None: computed)."""
    if memo is None:
        return quantized_weight(values(), plan)
    held = memo.get(key)
    return held if held is not None else memo.put(key, quantized_weight(values(), plan), plan)


def frozen(weight: _Arrays) -> _Arrays:
    """The arrays made read-only: a remembered weight is shared by every later build."""
    for array in weight:
        array.setflags(write=False)
    return weight


def _nibble(plan: WeightPlan) -> bool:
    dtype = plan.scheme.dtype
    return dtype.bits <= 4 and not dtype.is_float
