"""The float32 twin of a model that holds float16/bfloat16 tensors: what qcli runs and measures
such a model on, on CPU (docs/guides/formats.md). onnxruntime's CPU provider has no
bfloat16 kernels, and runs float16 nodes through Casts to float32 that its optimizer then
removes, so the model itself would measure as float32.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.graph import opset_version
from qcli.half import HALF_TYPES, int_attr, place, type_variables
from qcli.lazy import tensor_array

_FLOAT = onnx.TensorProto.FLOAT

_HALF_ENUMS = {h.onnx_type for h in HALF_TYPES.values()}


def holds_half(model: onnx.ModelProto) -> bool:
    """Whether the model holds float16/bfloat16 tensors inside (constants, Casts to them) and
    takes and gives none: what `emulated` runs as a float32 twin."""
    graph = model.graph
    io_half = any(v.type.tensor_type.elem_type in _HALF_ENUMS for v in (*graph.input, *graph.output))
    return not io_half and (any(t.data_type in _HALF_ENUMS for t in graph.initializer) or any(
        n.op_type == "Cast" and int_attr(n, "to", 0) in _HALF_ENUMS for n in graph.node))


def emulated(model: onnx.ModelProto, rounding: bool = True) -> onnx.ModelProto | None:
    """A float32 twin of a model that holds float16/bfloat16 tensors, for measuring it on CPU:
    its constants widened (exactly), every node computing in float32, and each value a node
    writes in a half type rounded to it (a Cast to it and back, which onnxruntime keeps).
    onnxruntime's CPU provider has no bfloat16 kernels, and runs float16 nodes through Casts
    to float32 that its optimizer then removes, so the float16 model itself would measure as
    float32. Without `rounding`, the twin times as CPU runs the model (float32 throughout):
    what latency is measured on. None when the model holds no half tensors, or takes or gives
    one (it runs as is)."""
    if not holds_half(model):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kinds: dict[str, int] = {}  # half tensor -> its type
    for init in out.graph.initializer:
        if init.data_type in _HALF_ENUMS:
            kinds[init.name] = init.data_type
            init.CopyFrom(numpy_helper.from_array(tensor_array(init).astype(np.float32), init.name))
    nodes: list[onnx.NodeProto] = []
    opset = opset_version(model)
    for node in out.graph.node:
        written = _twin_node(node, kinds, opset)
        nodes.append(node)
        for name, kind in written.items():
            kinds[name] = kind
            if not rounding:
                continue
            node.output[list(node.output).index(name)] = f"{name}/exact"
            nodes += [helper.make_node("Cast", [f"{name}/exact"], [f"{name}/rounded"], to=kind),
                      helper.make_node("Cast", [f"{name}/rounded"], [name], to=_FLOAT)]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.graph.value_info[:]
    return out


def _twin_node(node: onnx.NodeProto, kinds: dict[str, int], opset: int) -> dict[str, int]:
    """Make `node` compute in float32; the outputs it wrote in a half type, and which."""
    if node.op_type == "Cast":
        kind = int_attr(node, "to", 0)
        if kind in _HALF_ENUMS:
            next(a for a in node.attribute if a.name == "to").i = _FLOAT
            return {node.output[0]: kind}
        return {}
    if node.op_type in ("Constant", "ConstantOfShape"):
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _HALF_ENUMS:
                kind = a.t.data_type
                a.t.CopyFrom(numpy_helper.from_array(tensor_array(a.t).astype(np.float32), a.t.name))
                return {node.output[0]: kind}
        return {}
    found = type_variables(node, opset)
    if found is None:
        return {}
    written: dict[str, int] = {}
    for at in found[1].values():
        read = next((kinds[place(node, p)] for p in at if not p[0] and place(node, p) in kinds), None)
        if read is not None:
            written.update({place(node, p): read for p in at if p[0]})
    return written
