"""HardSwish and HardSigmoid between a DequantizeLinear and a QuantizeLinear, rewritten as an
integer Add (and Mul): onnxruntime has no integer kernel for either, so a quantized
MobileNetV3 or PP-LCNet runs every one as DequantizeLinear, float HardSigmoid and Mul,
QuantizeLinear between two int8 convolutions, where Add and Mul between Q/DQ pairs fuse into
QLinearAdd and QLinearMul.

HardSigmoid(x) = clip(a*x + b, 0, 1) = a * clip(x + c, 0, 1/a) with c = b/a, and HardSwish(x)
= x * HardSigmoid(x) (a = 1/6, b = 1/2):
- HardSigmoid: Add(x, c) quantized with the output's zero point and scale / a gives the
  output's integers, clipped by saturation (hence only when that zero point is the type's
  minimum and the largest value is at most 1, float32's rounding aside); the output's
  DequantizeLinear is unchanged;
- HardSwish: the gate Add(x, c) quantized on exactly [0, 1/a] (zero point at the type's
  minimum: saturation clips it), then Mul(x, gate) quantized with the output's zero point and
  scale / a, whose integers are the output's: its DequantizeLinear (scale unchanged) reads
  x * gate * a. The gate's rounding (1/a over 255 steps) is the only change of value.
Both are plain ONNX (any runtime computes the same). Not with symmetric activations: the gate
needs a zero point (TensorRT takes none). Names derive from the rewritten node's output `t`:
`t_gate` (its pair: `t_gate_quantized`, `t_gate_dequantized`) and `t_scaled` (the Add or Mul
before the output's QuantizeLinear; qcli/analyze/layers.py names it `t`); the constants, one
per value and type, `gate_offset_<c>_<type>` and `gate_<1/a>_<type>_scale`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.lazy import tensor_array

GATE = "_gate"  # a rewritten HardSwish `t`'s gate is `t_gate`

#: op type -> (a, b) defaults; HardSwish has none: a = 1/6, b = 1/2
GATES = {"HardSigmoid": (0.2, 0.5), "HardSwish": (1.0 / 6.0, 0.5)}


def integer_gates(graph: onnx.GraphProto, symmetric: set[str]) -> int:
    """Rewrite, in place, each HardSwish/HardSigmoid read from a DequantizeLinear and read only
    by a QuantizeLinear (module docstring); `symmetric`: the quantized tensors whose scheme is
    symmetric (left alone). The nodes keep their order (the new ones where the old one was);
    the constants (offset, gate scale) are one per value and type. Returns how many were
    rewritten."""
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    nodes: list[onnx.NodeProto] = []
    added: dict[str, onnx.TensorProto] = {}
    emitted: set[str] = set()
    count = 0
    for node in graph.node:
        new = None
        if node.op_type in GATES and node.domain in ("", "ai.onnx") and node.output[0] not in outputs:
            new = _rewrite(node, producer.get(node.input[0]), readers.get(node.output[0], []), inits, symmetric)
        if new is None:
            nodes.append(node)
            continue
        new_nodes, new_inits = new
        nodes += [n for n in new_nodes if n.name not in emitted]  # a shared constant's node once
        emitted.update(n.name for n in new_nodes)
        added.update((t.name, t) for t in new_inits if t.name not in added)
        count += 1
    if count:
        graph.initializer.extend(added.values())
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _rewrite(node: onnx.NodeProto, dq: onnx.NodeProto | None, readers: list[onnx.NodeProto],
             inits: dict[str, onnx.TensorProto], symmetric: set[str]
             ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]] | None:
    """The nodes and initializers replacing `node` (the output's QuantizeLinear edited in
    place), or None when the pattern or its conditions do not hold."""
    t = node.output[0]
    if dq is None or dq.op_type != "DequantizeLinear" or len(readers) != 1 or t in symmetric:
        return None
    q = readers[0]
    if q.op_type != "QuantizeLinear" or len(q.input) < 3 or q.input[1] not in inits or q.input[2] not in inits:
        return None
    scale, zero = tensor_array(inits[q.input[1]]), tensor_array(inits[q.input[2]])
    if scale.size != 1 or zero.dtype not in (np.uint8, np.int8):
        return None
    a, b = _slope_offset(node)
    if a <= 0 or b <= 0:
        return None
    info = np.iinfo(zero.dtype)
    swish = node.op_type == "HardSwish"
    if not swish and (int(zero) != info.min or (info.max - int(zero)) * float(scale) > 1.0 + 1e-6):
        return None  # saturation would not clip where HardSigmoid does
    x, c, kind = dq.output[0], b / a, zero.dtype.name
    offset = f"gate_offset_{c:g}_{kind}"  # shared: the names say the values
    inits_new = [
        numpy_helper.from_array(np.array(info.max, dtype=zero.dtype), f"{offset}_quantized"),
        numpy_helper.from_array(np.array(c / info.max, dtype=np.float32), f"{offset}_scale"),
        numpy_helper.from_array(np.array(0, dtype=zero.dtype), f"{offset}_zero_point"),
        numpy_helper.from_array(np.array(float(scale) / a, dtype=np.float32), f"{t}_scaled_scale"),
    ]
    out = [helper.make_node("DequantizeLinear", [f"{offset}_quantized", f"{offset}_scale", f"{offset}_zero_point"],
                            [offset], name=f"{offset}_DQ")]
    gate = f"{t}{GATE}" if swish else f"{t}_scaled"
    out.append(helper.make_node("Add", [x, offset], [gate], name=f"{gate}_Add"))
    if swish:
        pair = f"gate_{1.0 / a:g}_{kind}"  # the gate's quantizer: exactly [0, 1/a]
        step = np.array((1.0 / a) / (info.max - info.min), dtype=np.float32)
        inits_new += [numpy_helper.from_array(step, f"{pair}_scale"),
                      numpy_helper.from_array(np.array(info.min, dtype=zero.dtype), f"{pair}_zero_point")]
        qparams = [f"{pair}_scale", f"{pair}_zero_point"]
        out += [helper.make_node("QuantizeLinear", [gate, *qparams], [f"{gate}_quantized"], name=f"{gate}_Q"),
                helper.make_node("DequantizeLinear", [f"{gate}_quantized", *qparams], [f"{gate}_dequantized"],
                                 name=f"{gate}_DQ"),
                helper.make_node("Mul", [x, f"{gate}_dequantized"], [f"{t}_scaled"], name=f"{t}_scaled_Mul")]
    q.input[0], q.input[1] = f"{t}_scaled", f"{t}_scaled_scale"
    return out, inits_new


def _slope_offset(node: onnx.NodeProto) -> tuple[float, float]:
    """(a, b) of the gate clip(a*x + b, 0, 1): the node's alpha and beta, else the defaults."""
    a, b = GATES[node.op_type]
    for attr in node.attribute:
        if attr.name == "alpha":
            a = attr.f
        elif attr.name == "beta":
            b = attr.f
    return a, b
