"""TensorRT's calibration cache: the text file `IInt8Calibrator::writeCalibrationCache` writes
and TensorRT's implicit INT8 mode (trtexec `--calib=FILE`, onnxruntime's TensorRT execution
provider) reads instead of calibrating itself.

Format: a header line `TRT-<version>-<calibrator>`, then one `tensor: <hex>` line per tensor,
where <hex> is the IEEE-754 float32 bit pattern of its scale, written as 8 hex digits. TensorRT's
INT8 is symmetric, so scale = max(|lo|, |hi|) / 127 of the range solved for symmetric int8 by
the table's method (a uint8 range would give a scale that clips half its values).
The header names EntropyCalibration2, the calibrator trtexec and most TensorRT samples use:
TensorRT checks that name against the calibrator reading the cache, not how the ranges were
found. Tensors qcli's plan does not quantize have no line: TensorRT keeps those layers in
higher precision (it warns of the missing scale).
"""

from __future__ import annotations

import os
import struct
from dataclasses import replace
from pathlib import Path

from qcli.calibrate.table import CalibrationTable
from qcli.files import write_text_atomic

HEADER = "TRT-8601-EntropyCalibration2"  # TensorRT 8.6.1's numbering


def trt_scales(table: CalibrationTable) -> dict[str, float]:
    """Tensor -> TensorRT scale (amax / 127) from the table's method, solved for symmetric int8."""
    settings = replace(table.settings, dtype="int8", symmetric=True)
    scales = {}
    for name in sorted(table.observers):
        lo, hi = table.range(name, settings)
        scales[name] = max(abs(float(lo)), abs(float(hi))) / 127.0
    return scales


def hex_scale(scale: float) -> str:
    """A scale as TensorRT writes it: the float32's bits in hex.

    >>> hex_scale(1.0), hex_scale(0.5 / 127)
    ('3f800000', '3b810204')
    """
    return struct.pack(">f", scale).hex()


def write_trt_cache(table: CalibrationTable, path: str | os.PathLike) -> Path:
    """Write the cache atomically; returns its path (tests/test_trt_cache.py parses it back)."""
    lines = [HEADER, *(f"{name}: {hex_scale(s)}" for name, s in trt_scales(table).items())]
    return write_text_atomic(path, "\n".join(lines) + "\n")
