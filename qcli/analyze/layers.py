"""Which activations the quantized model quantized, and their names on both sides.

A quantized activation is a `QuantizeLinear -> DequantizeLinear` pair in the quantized model
(weights have no QuantizeLinear: they are stored quantized). As qdq.py names things, the pair
reads `t` and writes `t_dequantized`, or, for a graph output `t`, reads `t_float` and writes `t`.
Here the float model's name is the QuantizeLinear input when the float model has it, else the
DequantizeLinear output (the graph-output case), or `t` for a pair writing `t_dequantized` (a
rewritten HardSwish's: qcli/gates.py, whose gate pair is not listed); the quantized side is
the DequantizeLinear output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qcli.gates import GATE


@dataclass(frozen=True)
class QuantizedTensor:
    tensor: str  # in the float model
    quantized_tensor: str  # the dequantized value in the quantized model
    node: str  # producer in the float model ("" for a graph input)
    op_type: str  # "input" for a graph input
    dtype: str  # quantized element type


def quantized_tensors(
    float_model: onnx.ModelProto, quantized_model: onnx.ModelProto
) -> tuple[list[QuantizedTensor], list[str]]:
    """The quantized activations in the quantized model's graph order, and "name: why" for the
    pairs that have no counterpart in the float model."""
    fgraph, qgraph = float_model.graph, quantized_model.graph
    producer = {o: n for n in fgraph.node for o in n.output if o}
    float_inputs = {i.name for i in fgraph.input} - {t.name for t in fgraph.initializer}
    dequantizers: dict[str, onnx.NodeProto] = {}
    for node in qgraph.node:
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx", "com.microsoft"):
            dequantizers.setdefault(node.input[0], node)
    zero_types = {t.name: t.data_type for t in qgraph.initializer}
    found: list[QuantizedTensor] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for node in qgraph.node:
        if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        dq = dequantizers.get(node.output[0])
        if dq is None:
            continue
        source, target = node.input[0], dq.output[0]
        if source in producer or source in float_inputs:
            name = source
        elif target in producer:
            name = target
        elif target.endswith("_dequantized") and target[: -len("_dequantized")] in producer:
            name = target[: -len("_dequantized")]  # qcli/gates.py: the pair reads `t_scaled`
        elif source.endswith(GATE) and source[: -len(GATE)] in producer:
            continue  # the gate of a rewritten HardSwish `t` (qcli/gates.py), measured as `t`
        else:
            skipped.append(f"{target}: the float model has no tensor {source!r}")
            continue
        if name in seen:
            continue
        seen.add(name)
        dtype = "uint8"  # QuantizeLinear's default output type without a zero point
        if len(node.input) > 2 and node.input[2] in zero_types:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(zero_types[node.input[2]])).name
        elif len(node.input) > 2:
            dtype = "?"
        if name in float_inputs:
            found.append(QuantizedTensor(name, target, "", "input", dtype))
        else:
            p = producer[name]
            found.append(QuantizedTensor(name, target, p.name, p.op_type, dtype))
    return found, skipped
