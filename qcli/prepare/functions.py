"""Inline the model's local functions: each call node becomes the function's body.

Exporters write modules as local functions (`torch.onnx.export(..., export_modules_as_functions=
True)`, onnxscript): a call is a node of the function's own domain, so the quantizer would leave
everything inside float, as any custom-domain op. onnxruntime inlines local functions when it
loads a model anyway, so inlining changes nothing the model computes.

The inlining is onnx's (`onnx.inliner.inline_local_functions`: formal to actual names,
attribute references, nested calls, the function's opset converted to the model's), run on a
light copy of the model (its big weights never go through C++; `transplant` puts them back).

Names: a node inlined from a main-graph call is named `<call node>/<body node>` (the body
node's name, or its op type), so reports and overrides point at the module it came from
(`/encoder/layer.0/attn/MatMul`); the `__<k>` suffix onnx's inliner appends is dropped where
the name stays unique. Calls inside If/Loop bodies and nested calls keep the inliner's names.
Tensors inside a function get the inliner's names (`<name>__<k>`).
"""

from __future__ import annotations

import re
from collections import Counter

import onnx
import onnx.inliner

from qcli.errors import ModelError
from qcli.graph import iter_graphs
from qcli.prepare._graph import Options, PassResult, light_copy, plural, transplant


def inline_functions(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    if not model.functions:
        return PassResult(model)
    local = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    calls: Counter[str] = Counter()
    named: set[str] = set()
    for k, node in enumerate(model.graph.node):
        function = local.get((node.domain, node.op_type, getattr(node, "overload", "")))
        if function is None:
            continue
        calls[function.name] += 1
        # A copy of the function for this call alone, its nodes named after the call.
        own = onnx.FunctionProto()
        own.CopyFrom(function)
        own.name = f"{function.name}__call{k}"
        prefix = node.name or f"{node.op_type}_{k}"
        for inner in own.node:
            inner.name = f"{prefix}/{inner.name or inner.op_type}"
            named.add(inner.name)
        node.op_type = own.name
        model.functions.append(own)
    if not calls and not _called_anywhere(model, local):
        return PassResult(model)  # unused functions: left alone (onnxruntime ignores them)
    light = light_copy(model)
    try:
        inlined = onnx.inliner.inline_local_functions(light.model, convert_version=True)
    except Exception as exc:  # onnx raises RuntimeError / ValidationError on a malformed function
        names = ", ".join(sorted({f.name for f in local.values()}))
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        text = re.sub(r"^\S*\.cc:\d+: \w+: (Assertion `.*?` failed: )?", "", text)  # C++ file, line, assertion
        raise ModelError(
            f"cannot inline the model's local functions ({names}): {text}",
            hint="re-export the model without functions (torch: export_modules_as_functions=False)",
        ) from exc
    transplant(inlined, model, light)
    _drop_suffixes(model.graph, named)
    total = sum(calls.values())
    what = ", ".join(f"{name} x{count}" for name, count in sorted(calls.items()))
    note = f"inlined {plural(total, 'call')} of local functions ({what})" if total else (
        "inlined the local functions called inside subgraphs")
    return PassResult(model, True, [note])


def _called_anywhere(model: onnx.ModelProto, local: dict) -> bool:
    """Whether any node (subgraphs and function bodies included) calls a local function."""
    nodes = [n for _, g in iter_graphs(model.graph) for n in g.node] + [n for f in model.functions for n in f.node]
    return any((n.domain, n.op_type, getattr(n, "overload", "")) in local for n in nodes)


def _drop_suffixes(graph: onnx.GraphProto, named: set[str]) -> None:
    """`<call>/<node>__<k>` -> `<call>/<node>` where that name is unique in the graph."""
    suffix = re.compile(r"^(.*)__\d+$")
    taken = Counter(n.name for n in graph.node)
    for node in graph.node:
        match = suffix.match(node.name)
        if match and match.group(1) in named and taken[match.group(1)] == 0:
            taken[node.name] -= 1
            node.name = match.group(1)
            taken[node.name] += 1
