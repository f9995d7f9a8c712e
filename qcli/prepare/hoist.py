"""Move the weights a Loop, Scan or If body holds as its own constants into the main graph:

    Loop body: w = Constant(value = float[256, 768]) ; h = MatMul(s, w)
    -> main graph initializer w_1 (a name no graph uses) ; the body reads it from the outer
       scope, as ONNX lets a subgraph read any outer tensor

The body computes the same values; the quantizer then stores such a weight as it stores every
weight a body reads from the outer scope (qcli.plan.controlflow: 8- or 16-bit integers folded
at load), where before it stayed float: the table recognizer's attention-GRU decoder, whose
weights are Constant nodes inside its Loop, came out 1.56x smaller. Only float constants of
HOIST_MIN elements or more move (a shape, an axis or a bias stays where it is); a name that
another graph defines, or that a nested body redefines, stays in its body.
"""

from __future__ import annotations

from collections import Counter

import onnx

from qcli.graph import iter_graphs, node_subgraphs
from qcli.info import element_count, tensor_bytes
from qcli.prepare._graph import NameAllocator, Options, PassResult, tensor_names

HOIST_MIN = 1024  # elements from which a body's float constant is a weight
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def hoist_body_weights(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    graph = model.graph
    defined = Counter(name for _, g in iter_graphs(graph) for name in _defines(g))
    names = NameAllocator(tensor_names(graph))
    moved, size = 0, 0
    for node in graph.node:
        for body in node_subgraphs(node):
            for sub in [g for _, g in iter_graphs(body)]:
                for tensor in _weights(sub, defined):
                    fresh = names.fresh(tensor.name)
                    if fresh != tensor.name:
                        _rename_reads(sub, tensor.name, fresh)
                    hoisted = onnx.TensorProto()
                    hoisted.CopyFrom(tensor)
                    hoisted.name = fresh
                    graph.initializer.append(hoisted)
                    moved += 1
                    size += tensor_bytes(tensor.data_type, element_count(tensor.dims))
    if not moved:
        return PassResult(model)
    return PassResult(model, True, [f"moved {moved} weight(s) ({size / 1e6:.2f} MB) out of Loop/Scan/If bodies "
                                    "into the main graph, which the bodies read them from (stored like its weights)"])


def _defines(graph: onnx.GraphProto) -> list[str]:
    return [*(o for n in graph.node for o in n.output if o), *(t.name for t in graph.initializer),
            *(v.name for v in graph.input)]


def _weights(graph: onnx.GraphProto, defined: Counter) -> list[onnx.TensorProto]:
    """The float constants of HOIST_MIN elements or more `graph` defines, removed from it: its
    initializers and its Constant nodes' values (named as their outputs), each defined nowhere
    else in the model."""
    def wanted(t: onnx.TensorProto, name: str) -> bool:
        return t.data_type in _FLOATS and element_count(t.dims) >= HOIST_MIN and defined[name] == 1

    found = [t for t in graph.initializer if wanted(t, t.name)]
    for t in found:
        graph.initializer.remove(t)
    for node in list(graph.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1 and (
                node.attribute[0].name == "value" and wanted(node.attribute[0].t, node.output[0])):
            value = onnx.TensorProto()
            value.CopyFrom(node.attribute[0].t)
            value.name = node.output[0]
            found.append(value)
            graph.node.remove(node)
    return found


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of `old` in `graph` and the graphs below it (none redefines it: `_weights`)."""
    for _, g in iter_graphs(graph):
        for node in g.node:
            for k, name in enumerate(node.input):
                if name == old:
                    node.input[k] = new
        for v in g.output:
            if v.name == old:
                v.name = new
