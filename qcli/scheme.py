"""Quantized integer types qcli can target: one immutable row per type (bits, signedness,
integer range, numpy and ONNX types), looked up by name with `quant_dtype("int8")`; how a
tensor is quantized (`QuantScheme`: type, granularity as a type, symmetry); and the qparams
math (pure numpy).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

from qcli.errors import ConfigError


@dataclass(frozen=True)
class QuantDtype:
    """An integer type that quantized values are stored in.

    `qmin`/`qmax` are the full integer range of the type (int8: -128..127); a symmetric
    scheme may choose to use a narrower one. `numpy_dtype` is the numpy type that holds the
    values (int4/uint4 have none of their own: they are held in int8/uint8 and packed only
    when written to ONNX). `onnx_type` is the `TensorProto` data-type enum.

    >>> quant_dtype("uint8").qmax, quant_dtype("int4").qmin
    (255, -8)
    """

    name: str
    bits: int
    signed: bool
    numpy_dtype: np.dtype
    onnx_type: int
    largest: int = 0  # a float8 type's largest finite value (0: an integer type)

    @property
    def is_float(self) -> bool:
        """A float8 type: values on its own non-uniform grid, symmetric scales only."""
        return self.largest > 0

    @property
    def qmin(self) -> int:
        if self.is_float:
            return -self.largest
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        if self.is_float:
            return self.largest
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def levels(self) -> int:
        """Number of representable integers, 2**bits."""
        return 1 << self.bits


FLOAT8_OPSET = 19  # QuantizeLinear/DequantizeLinear take float8 from opset 19
TWO_BIT_OPSET = 25  # DequantizeLinear takes int2/uint2 from opset 25

QUANT_DTYPES: dict[str, QuantDtype] = {
    d.name: d
    for d in (
        QuantDtype("uint8", 8, False, np.dtype(np.uint8), TensorProto.UINT8),
        QuantDtype("int8", 8, True, np.dtype(np.int8), TensorProto.INT8),
        QuantDtype("uint16", 16, False, np.dtype(np.uint16), TensorProto.UINT16),
        QuantDtype("int16", 16, True, np.dtype(np.int16), TensorProto.INT16),
        QuantDtype("uint4", 4, False, np.dtype(np.uint8), TensorProto.UINT4),
        QuantDtype("int4", 4, True, np.dtype(np.int8), TensorProto.INT4),
        # 2-bit weights (TWO_BIT_OPSET): onnxruntime runs them only fused into MatMulNBits
        QuantDtype("uint2", 2, False, np.dtype(np.uint8), TensorProto.UINT2),
        QuantDtype("int2", 2, True, np.dtype(np.int8), TensorProto.INT2),
        # FP8 (opset 19+, FLOAT8_OPSET): scale = range / largest, zero point 0, values rounded to
        # the type's grid; for TensorRT on GPUs with FP8 (onnxruntime's CPU runs the Q/DQ pairs).
        QuantDtype("float8e4m3fn", 8, True, np.dtype(ml_dtypes.float8_e4m3fn), TensorProto.FLOAT8E4M3FN, 448),
        QuantDtype("float8e5m2", 8, True, np.dtype(ml_dtypes.float8_e5m2), TensorProto.FLOAT8E5M2, 57344),
        # Only for biases (their scale is input_scale * weight_scale, no calibration).
        QuantDtype("int32", 32, True, np.dtype(np.int32), TensorProto.INT32),
    )
}


FLOAT8_TYPES = frozenset(d.onnx_type for d in QUANT_DTYPES.values() if d.is_float)  # ONNX enums
_FLOAT8_NUMPY = frozenset(d.numpy_dtype for d in QUANT_DTYPES.values() if d.is_float)


def quant_dtype(name: str) -> QuantDtype:
    """The quantized type called `name` ('int8', 'uint16', ...); ConfigError if unknown."""
    try:
        return QUANT_DTYPES[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), QUANT_DTYPES, n=1)
        hint = f"did you mean {close[0]!r}?" if close else None
        raise ConfigError(
            f"unknown quantized dtype {name!r}; expected one of {', '.join(QUANT_DTYPES)}",
            hint=hint,
        ) from None


# --------------------------------------------------------------------------- schemes


@dataclass(frozen=True)
class PerTensor:
    """One scale (and zero point) for the whole tensor."""


@dataclass(frozen=True)
class PerChannel:
    """One scale per slice along the op's channel axis (chosen per op by `rules.weight_axis`)."""


@dataclass(frozen=True)
class PerBlock:
    """One scale per `size` consecutive values along the reduction axis."""

    size: int


Granularity = PerTensor | PerChannel | PerBlock

GRANULARITIES = ("per_tensor", "per_channel", "per_block")  # as the config spells them


def granularity_of(name: str, block_size: int | None = None) -> Granularity:
    """The granularity the config spells `name`; `block_size` is read for 'per_block' only.

    >>> granularity_of("per_channel")
    PerChannel()
    >>> granularity_of("per_block", 32)
    PerBlock(size=32)
    >>> isinstance(granularity_of("per_tensor", 32), PerTensor)
    True
    """
    if name == "per_tensor":
        return PerTensor()
    if name == "per_channel":
        return PerChannel()
    if name == "per_block":
        if not block_size or block_size < 1:
            raise ConfigError(f"per_block granularity needs a positive block_size, got {block_size!r}")
        return PerBlock(block_size)
    raise ConfigError(f"unknown granularity {name!r}; expected one of {', '.join(GRANULARITIES)}")


@dataclass(frozen=True)
class QuantScheme:
    """How one tensor is quantized: integer type, granularity, symmetry."""

    dtype: QuantDtype
    granularity: Granularity = PerTensor()
    symmetric: bool = False

    @classmethod
    def of(
        cls, dtype: str, granularity: str = "per_tensor", symmetric: bool = False, block_size: int = 0
    ) -> QuantScheme:
        """A scheme from the config's spelling (`block_size` is read for 'per_block' only)."""
        return cls(quant_dtype(dtype), granularity_of(granularity, block_size), symmetric)


def integer_range(qdtype: QuantDtype, symmetric: bool) -> tuple[int, int]:
    """The integers a scheme uses. Symmetric signed schemes of 8 bits or more drop the most
    negative value (int8: -127..127) so that +r and -r are both exact: the convention of
    onnxruntime and TensorRT, which the range solvers assume too. Those of 4 bits or fewer
    (weights only) use every integer (int4: -8..7) with a scale of either sign (`full_range`).

    >>> integer_range(quant_dtype("int8"), True), integer_range(quant_dtype("int4"), True)
    ((-127, 127), (-8, 7))
    """
    if symmetric and qdtype.signed and not full_range(qdtype, symmetric):
        return -qdtype.qmax, qdtype.qmax
    return qdtype.qmin, qdtype.qmax


def full_range(qdtype: QuantDtype, symmetric: bool) -> bool:
    """A symmetric signed type of 4 bits or fewer: its scale maps the value of largest magnitude,
    of either sign, to the most negative integer (the scale is negative when that value is
    positive), so a block has 16 levels rather than 15: onnxruntime's MatMulNBits quantizer
    does the same (a weight's groups may keep -7..7's step instead: qcli.qweights._qparams)."""
    return symmetric and qdtype.signed and qdtype.bits <= 4


_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32


def choose_qparams(lo, hi, qdtype: QuantDtype, symmetric: bool, full: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and zero point (qdtype's numpy type) mapping [lo, hi] onto the integers.

    The range is first widened to contain 0 (so that 0.0, i.e. padding and ReLU's floor, is
    exact). Symmetric: zero point 0 (signed) or the middle value (unsigned: 128 for uint8) and
    scale = max|r| / (integers on the positive side); 4 bits or fewer, signed: `full_range`
    (`full=False`: the positive side's step instead, int4's largest magnitude at 7).
    Asymmetric: scale = (hi - lo) / (qmax - qmin) and zero point = round(qmin - lo / scale). A
    zero-width range gets scale 1 so that dequantization still gives exact zeros; so does a
    range too narrow for a normal float32 scale (a user's range of denormals: onnxruntime's
    kernels fail on such scales). Works elementwise on arrays (per-channel).

    >>> s, z = choose_qparams(-1.0, 3.0, quant_dtype("uint8"), symmetric=False)
    >>> float(s), int(z)  # 4 / 255 per step, 0.0 -> 64
    (0.01568627543747425, 64)
    >>> s, z = choose_qparams(-0.5, 2.54, quant_dtype("int8"), symmetric=True)
    >>> float(s), int(z)  # 2.54 / 127
    (0.019999999552965164, 0)
    >>> s, z = choose_qparams(-0.5, 2.4, quant_dtype("int4"), symmetric=True)
    >>> float(s), int(z)  # 2.4 -> -8: -0.3 per step
    (-0.30000001192092896, 0)
    """
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    qmin, qmax = integer_range(qdtype, symmetric)
    if full and full_range(qdtype, symmetric):
        scale = np.where(hi >= -lo, hi, lo) / qmin  # the largest magnitude -> qmin exactly
        zero = np.zeros_like(scale)
    elif symmetric:
        amax = np.maximum(-lo, hi)
        if qdtype.signed:
            scale = amax / qmax
            zero = np.zeros_like(scale)
        else:
            half = (qmax - qmin) // 2  # uint8: 127 steps either side of 128
            scale = amax / half
            zero = np.full_like(scale, qmin + half + 1)
    else:
        scale = (hi - lo) / (qmax - qmin)
        with np.errstate(divide="ignore", invalid="ignore"):
            zero = np.where(scale >= _TINY, np.round(qmin - lo / np.where(scale >= _TINY, scale, 1)), qmin)
        zero = np.clip(zero, qmin, qmax)
    scale = np.where(np.abs(scale) >= _TINY, scale, 1.0).astype(np.float32)
    return scale, zero.astype(qdtype.numpy_dtype)


def quantize(x, scale, zero_point, qdtype: QuantDtype, axis: int | None = None, symmetric: bool = False) -> np.ndarray:
    """x -> clip(round_half_to_even(x / scale) + zero_point), as ONNX QuantizeLinear computes it.

    `axis` is the per-channel axis of `x` when scale/zero_point are 1-D.

    >>> quantize(np.array([-1.0, 0.0, 0.3, 19.0]), np.float32(0.1), np.int8(0), quant_dtype("int8"), symmetric=True)
    array([-10,   0,   3, 127], dtype=int8)
    """
    x = np.asarray(x, dtype=np.float32)
    scale, zero_point = _broadcast(scale, x.ndim, axis), _broadcast(zero_point, x.ndim, axis)
    if qdtype.is_float:  # saturate, then round to the float8 grid (to nearest, ties to even)
        return np.clip(np.asarray(x / scale), -qdtype.largest, qdtype.largest).astype(qdtype.numpy_dtype)
    qmin, qmax = integer_range(qdtype, symmetric)
    # In place, in x / scale's float type: rint gives whole numbers, and adding a zero point of
    # at most 16 bits to one below 2**24 is exact in float32; a larger one clips either way.
    # (float64 temporaries took a BERT-base's 85M weights 0.7 s, in every trial of a search.)
    q = np.asarray(x / scale)  # a 0-d array, not a scalar, for a one-value weight
    np.rint(q, out=q)
    q += zero_point
    np.clip(q, qmin, qmax, out=q)
    return q.astype(qdtype.numpy_dtype)


def dequantize(q, scale, zero_point, axis: int | None = None) -> np.ndarray:
    """(q - zero_point) * scale, as ONNX DequantizeLinear computes it."""
    q = np.asarray(q)
    scale, zero_point = _broadcast(scale, q.ndim, axis), _broadcast(zero_point, q.ndim, axis)
    if q.dtype in _FLOAT8_NUMPY:
        return (q.astype(np.float32) * scale).astype(np.float32)
    return ((q.astype(np.int64) - zero_point.astype(np.int64)) * scale).astype(np.float32)


def _broadcast(v, ndim: int, axis: int | None) -> np.ndarray:
    v = np.asarray(v)
    if v.ndim == 0 or axis is None:
        return v
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)
