"""Inline `If` nodes whose condition is constant:

    If(cond = initializer True) -> the then_branch's nodes and initializers, in place

The branch's outputs are written under the If's output names; a branch tensor or node name
that is already used elsewhere in the model gets `<If name>/<name>` (made unique). Repeated
until no main-graph If has a constant condition (an inlined branch may hold another).

An If with a run-time condition, and every Loop/Scan, is left as is, with a note: the
quantizer does not look inside subgraphs, so their contents stay float.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qcli.graph import iter_graphs, node_subgraphs
from qcli.lazy import tensor_array
from qcli.prepare._graph import (
    NameAllocator,
    Options,
    PassResult,
    is_default_domain,
    label,
    prune_value_info,
    remove_unused_initializers,
)


def inline_constant_if(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    graph = model.graph
    notes: list[str] = []
    while True:
        constants = {t.name: t for t in graph.initializer}
        found = next(
            (
                (i, n) for i, n in enumerate(graph.node)
                if n.op_type == "If" and is_default_domain(n) and _is_scalar(constants.get(n.input[0]))
            ),
            None,
        )
        if found is None:
            break
        index, node = found
        taken = bool(np.asarray(tensor_array(constants[node.input[0]])).reshape(-1)[0])
        branch = "then_branch" if taken else "else_branch"
        notes.append(f"inlined the {branch} of {label(node)} (its condition is constant {taken})")
        _inline(model, index, branch)
    modified = bool(notes)
    if modified:
        remove_unused_initializers(graph)
        prune_value_info(graph)
    for node in graph.node:
        if node.op_type == "If" and is_default_domain(node):
            notes.append(f"{label(node)} has a run-time condition: its branches stay float")
        elif node.op_type in ("Loop", "Scan") and is_default_domain(node):
            notes.append(f"{label(node)} is left as is: its body stays float")
    return PassResult(model, modified, notes)


def _is_scalar(tensor: onnx.TensorProto | None) -> bool:
    return tensor is not None and int(np.prod(tensor.dims, dtype=np.int64)) == 1


def _inline(model: onnx.ModelProto, index: int, branch_name: str) -> None:
    graph = model.graph
    node = graph.node[index]
    branch = next(a.g for a in node.attribute if a.name == branch_name)
    prefix = node.name or node.output[0]

    # Names outside this branch: the model minus the If node's own subgraphs.
    outside_tensors: set[str] = set()
    outside_nodes: set[str] = set()
    for position, other in enumerate(graph.node):
        if position == index:
            outside_tensors.update(other.input)
            outside_tensors.update(other.output)
            continue
        for sub in (other, *[n for s in node_subgraphs(other) for _, g in iter_graphs(s) for n in g.node]):
            outside_tensors.update(sub.input)
            outside_tensors.update(sub.output)
            if sub.name:
                outside_nodes.add(sub.name)
    for values in (graph.input, graph.output, graph.value_info, graph.initializer):
        outside_tensors.update(v.name for v in values)
    inside = {n for _, g in iter_graphs(branch) for node_ in g.node for n in (*node_.input, *node_.output)}
    tensors = NameAllocator(outside_tensors | inside | {t.name for t in branch.initializer})
    node_names = NameAllocator(outside_nodes | {n.name for _, g in iter_graphs(branch) for n in g.node})

    defined = [o for n in branch.node for o in n.output if o] + [t.name for t in branch.initializer]
    rename: dict[str, str] = {}
    for name in defined:
        if name in outside_tensors:
            rename[name] = tensors.fresh(f"{prefix}/{name}")

    # Branch outputs take the If's output names: renamed at their producer when the branch
    # defines them (once), else copied through an Identity.
    identities = []
    claimed: set[str] = set()
    # A valid If has as many outputs as its branches; a malformed one is the checker's to report.
    for position, (inner, outer) in enumerate(zip(branch.output, node.output, strict=False)):
        if not outer:
            continue
        if inner.name in defined and inner.name not in claimed:
            rename[inner.name] = outer
            claimed.add(inner.name)
        else:
            identities.append((inner.name, outer, position))

    new_nodes = []
    for inner_node in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner_node)
        _rename_node(copy, rename)
        if copy.name and copy.name in outside_nodes:
            copy.name = node_names.fresh(f"{prefix}/{copy.name}")
        new_nodes.append(copy)
    for inner, outer, position in identities:
        new_nodes.append(helper.make_node(
            "Identity", [rename.get(inner, inner)], [outer], name=node_names.fresh(f"{prefix}/output_{position}")
        ))
    for tensor in branch.initializer:
        graph.initializer.append(tensor)
        graph.initializer[-1].name = rename.get(tensor.name, tensor.name)
    for sparse in branch.sparse_initializer:
        graph.sparse_initializer.append(sparse)
        graph.sparse_initializer[-1].values.name = rename.get(sparse.values.name, sparse.values.name)

    del graph.node[index]
    for offset, new in enumerate(new_nodes):
        graph.node.insert(index + offset, new)


def _rename_node(node: onnx.NodeProto, rename: dict[str, str]) -> None:
    for i, name in enumerate(node.input):
        node.input[i] = rename.get(name, name)
    for i, name in enumerate(node.output):
        node.output[i] = rename.get(name, name)
    for sub in node_subgraphs(node):  # outer-scope references from nested subgraphs
        for _, graph in iter_graphs(sub):
            for inner in graph.node:
                for i, name in enumerate(inner.input):
                    inner.input[i] = rename.get(name, name)
            for value in graph.output:
                value.name = rename.get(value.name, value.name)
