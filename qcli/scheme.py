"""Quantized integer types qcli can target: one immutable row per type (bits, signedness,
integer range, numpy and ONNX types), looked up by name with `quant_dtype("int8")`.

The quantization scheme (granularity, symmetry) and the qparams math will live here too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

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

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def levels(self) -> int:
        """Number of representable integers, 2**bits."""
        return 1 << self.bits


QUANT_DTYPES: dict[str, QuantDtype] = {
    d.name: d
    for d in (
        QuantDtype("uint8", 8, False, np.dtype(np.uint8), TensorProto.UINT8),
        QuantDtype("int8", 8, True, np.dtype(np.int8), TensorProto.INT8),
        QuantDtype("uint16", 16, False, np.dtype(np.uint16), TensorProto.UINT16),
        QuantDtype("int16", 16, True, np.dtype(np.int16), TensorProto.INT16),
        QuantDtype("uint4", 4, False, np.dtype(np.uint8), TensorProto.UINT4),
        QuantDtype("int4", 4, True, np.dtype(np.int8), TensorProto.INT4),
        # Only for biases (their scale is input_scale * weight_scale, no calibration).
        QuantDtype("int32", 32, True, np.dtype(np.int32), TensorProto.INT32),
    )
}


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
