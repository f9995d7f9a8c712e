"""Weight-only 8- and 16-bit weights as Cast(integers) [- zero point] * scale, written and read back.

onnxruntime folds these constants at load, so a weight-only node computes in float at float's
speed from a file about 4x smaller; a DequantizeLinear before a float Conv runs on every
inference instead (magika: 0.67x float's speed), and one before a MatMul becomes MatMulNBits,
which quantizes its input at run time. 16-bit weights (`weights.dtype: int16`, the rescue's
step between int8 and float weights, qcli/precision/stored.py) halve a float weight's bytes
with rounding about 256x finer than int8's. The values are DequantizeLinear's: (q - zero) * scale in
float32. qcli/qdq.py writes the form (`folded_weight`) where `weight_only` holds;
`folded_integers` finds it again in a written model (qcli.census.node_precisions).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.plan import WeightPlan
from qcli.scheme import PerBlock

#: the integer types written as Cast, Mul
INTEGERS = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def weight_only(wp: WeightPlan, readers: Collection[int], graph: onnx.GraphProto, dynamic: Collection[int],
                quantized: Collection[str]) -> bool:
    """Whether only nodes computing in float read the 8- or 16-bit integer weight `wp`: its quantized
    `readers` (node indices) have no input among the `quantized` activations and none is
    `dynamic` (none: only control flow reads it, qcli.plan.controlflow); per tensor or channel
    (per-block weights keep DequantizeLinear: MatMulNBits)."""
    if wp.scheme.dtype.bits not in (8, 16) or wp.scheme.dtype.is_float or isinstance(wp.scheme.granularity, PerBlock):
        return False
    return not any(
        i in dynamic or any(t in quantized for t in graph.node[i].input if t != wp.name) for i in readers)


def folded_weight(wp: WeightPlan, q: np.ndarray, scale: np.ndarray, zero: np.ndarray, out: str | None = None
                  ) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """The initializers and nodes writing `<w>_dequantized` (or `out`: the weight's own name,
    when others read it too) from `<w>_quantized` (module docstring); the zero point only when
    it is not all zeros."""
    shape = [1] * q.ndim
    if wp.axis is not None and scale.ndim == 1 and q.ndim:
        shape[wp.axis] = scale.size
    else:
        shape = []
    name = wp.name
    inits = [numpy_helper.from_array(q, f"{name}_quantized"),
             numpy_helper.from_array(scale.reshape(shape).astype(np.float32), f"{name}_scale")]
    nodes = [helper.make_node("Cast", [f"{name}_quantized"], [f"{name}_integers"], name=f"{name}_Cast",
                              to=onnx.TensorProto.FLOAT)]
    integers = f"{name}_integers"
    if np.any(zero != 0):
        inits.append(numpy_helper.from_array(zero.reshape(shape).astype(np.float32), f"{name}_zero_point"))
        nodes.append(helper.make_node("Sub", [integers, f"{name}_zero_point"], [f"{name}_centred"], name=f"{name}_Sub"))
        integers = f"{name}_centred"
    written = out or f"{name}_dequantized"
    nodes.append(helper.make_node("Mul", [integers, f"{name}_scale"], [written], name=f"{name}_Mul"))
    return inits, nodes


def folded_integers(node: onnx.NodeProto | None, producers: Mapping[str, onnx.NodeProto],
                    types: Mapping[str, int]) -> str | None:
    """The 8- or 16-bit integer initializer a Mul(Cast(q) [- zero], scale) dequantizes, else None."""
    if node is None or node.op_type != "Mul":
        return None
    source = producers.get(node.input[0])
    if source is not None and source.op_type == "Sub":
        source = producers.get(source.input[0])
    if source is None or source.op_type != "Cast" or source.input[0] not in types:
        return None
    return source.input[0] if types[source.input[0]] in INTEGERS else None
