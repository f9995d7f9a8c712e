"""Where every tensor of one graph comes from and goes, indexed once: `GraphIndex.of(model)`.

The planning phases, the Q/DQ writer, the calibration pass and the precision search each
used to scan `graph.node` for the producer or readers of a tensor; this is the one index they
share. Node positions are indices into `graph.node`, so an index built on a model stays valid
for an exact copy of it (`ModelProto.CopyFrom`), until nodes are added, removed or rewired.
Empty names (an omitted optional input or output) are not tensors and are not indexed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

import onnx

from qcli.errors import InternalError, ModelError


@dataclass(frozen=True)
class GraphIndex:
    """Producers, readers, element types and initializers of one graph (not its subgraphs).

    >>> from onnx import parser
    >>> model = parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
    ... g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    ...     s = Mul(x, x)
    ...     y = Add(s, w)
    ... }''')
    >>> index = GraphIndex.of(model)
    >>> index.producer("s"), index.consumers("x"), index.consumers("w"), index.producer_node("y").op_type
    (0, [0, 0], [1], 'Add')
    >>> index.read_at["s"], index.written_at["y"]
    (((1, 0),), (1, 0))
    >>> sorted(index.initializers), index.inputs, sorted(index.outputs)
    (['w'], ('x',), ['y'])
    >>> index.is_float("x"), index.is_float("s")  # `s` has no type until shape inference
    (True, False)
    """

    graph: onnx.GraphProto
    written_at: Mapping[str, tuple[int, int]]  # tensor -> (node index, output position)
    read_at: Mapping[str, tuple[tuple[int, int], ...]]  # tensor -> (node index, input position), graph order
    types: Mapping[str, int]  # element type (onnx.TensorProto.*) of every typed tensor
    initializers: Mapping[str, onnx.TensorProto]
    inputs: tuple[str, ...]  # graph inputs, in order (initializers declared as inputs included)
    outputs: frozenset[str]  # graph outputs

    @classmethod
    def of(cls, source: onnx.ModelProto | onnx.GraphProto) -> GraphIndex:
        """Index the main graph of a model (or a graph): one pass over its nodes."""
        graph = source.graph if isinstance(source, onnx.ModelProto) else source
        written_at: dict[str, tuple[int, int]] = {}
        read_at: dict[str, list[tuple[int, int]]] = {}
        for i, node in enumerate(graph.node):
            for k, name in enumerate(node.input):
                if name:
                    read_at.setdefault(name, []).append((i, k))
            for k, name in enumerate(node.output):
                if name:
                    written_at[name] = (i, k)
        return cls(
            graph=graph,
            written_at=written_at,
            read_at={name: tuple(reads) for name, reads in read_at.items()},
            types=element_types(graph),
            initializers={t.name: t for t in graph.initializer},
            inputs=tuple(v.name for v in graph.input),
            outputs=frozenset(v.name for v in graph.output),
        )

    @cached_property
    def read_inside(self) -> Mapping[str, tuple[int, ...]]:
        """Tensor -> the nodes whose control-flow bodies read it from the outer scope (at any
        depth), in graph order; indexed once, on first use."""
        found: dict[str, list[int]] = {}
        for i, node in enumerate(self.graph.node):
            for name in names_used_inside(node):
                found.setdefault(name, []).append(i)
        return {name: tuple(nodes) for name, nodes in found.items()}

    def producer(self, name: str) -> int | None:
        """Index of the node writing `name`; None for graph inputs, initializers and unknown names."""
        found = self.written_at.get(name)
        return None if found is None else found[0]

    def producer_node(self, name: str) -> onnx.NodeProto | None:
        """The node writing `name`, or None."""
        found = self.written_at.get(name)
        return None if found is None else self.graph.node[found[0]]

    def consumers(self, name: str) -> list[int]:
        """Indices of the nodes reading `name`, once per read (`Mul(x, x)` reads `x` twice)."""
        return [i for i, _ in self.read_at.get(name, ())]

    def is_float(self, name: str) -> bool:
        """Whether `name` is known to be float32 (int8 kernels take and give float32 around Q/DQ)."""
        return self.types.get(name) == onnx.TensorProto.FLOAT

    @property
    def tensors(self) -> set[str]:
        """Every tensor name that is typed, produced, or a graph input."""
        return set(self.types) | set(self.written_at) | set(self.inputs)


def element_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element type of every typed tensor of a graph: initializers, then inputs, value_info
    (from shape inference) and outputs, a later declaration winning."""
    types = {t.name: t.data_type for t in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def opset_version(model: onnx.ModelProto, domain: str = "") -> int:
    """The model's opset for `domain` ("" and "ai.onnx" are the default domain)."""
    for entry in model.opset_import:
        if entry.domain in (domain, "ai.onnx" if domain == "" else domain):
            return entry.version
    raise ModelError(f"the model imports no opset for domain {domain or 'ai.onnx'!r}")


def node_names(model: onnx.ModelProto) -> list[str]:
    """Display names of the graph's nodes: their own, or `<op_type>_<index>` when unnamed."""
    return [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)]


def iter_graphs(graph: onnx.GraphProto, owner: str = "") -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graph and every subgraph below it (If branches, Loop/Scan bodies), depth first."""
    yield owner, graph
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                yield from iter_graphs(sub, f"{node.name or node.op_type}.{attr.name}")


def node_subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held by a node's attributes (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def names_used_inside(node: onnx.NodeProto) -> list[str]:
    """Every tensor name a node's subgraphs read, at any depth (outer-scope references among
    them). Over-approximates on purpose: a name listed here is never treated as unused."""
    found: dict[str, None] = {}
    for sub in node_subgraphs(node):
        for _, graph in iter_graphs(sub):
            for inner in graph.node:
                found.update(dict.fromkeys(inner.input))
            found.update(dict.fromkeys(o.name for o in graph.output))
    found.pop("", None)
    return list(found)


def computing(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A model of the part of `model` that computes `names`, its only outputs: the nodes they
    depend on, in order, and the inputs and initializers those read (a deferred tensor copied
    is its reference: qcli.lazy). onnxruntime runs every node of a graph whatever a run fetches:
    a pass that wants a decoder's first layers' inputs ran all its layers and its head."""
    graph = model.graph
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    needed: set[int] = set()
    read: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in read:
            continue
        read.add(name)
        i = producer.get(name)
        if i is not None and i not in needed:
            needed.add(i)
            stack += [n for n in graph.node[i].input if n] + names_used_inside(graph.node[i])
    out = onnx.ModelProto()
    _shell(model, out)
    part = out.graph
    part.node.extend(node for i, node in enumerate(graph.node) if i in needed)
    part.initializer.extend(t for t in graph.initializer if t.name in read)
    part.sparse_initializer.extend(t for t in graph.sparse_initializer if t.values.name in read)
    part.input.extend(v for v in graph.input if v.name in read)
    part.value_info.extend(v for v in graph.value_info if v.name in read)
    part.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    return out


def _shell(model: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """`model`'s header (IR, opsets, functions, metadata) into `out`, with an empty graph."""
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.graph.name = model.graph.name


def toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order: among ready nodes, the earliest in `nodes` goes first."""
    produced = {o for n in nodes for o in n.output}
    needs: list[set[str]] = []
    waiting: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        inputs = {n for n in node.input if n} | set(names_used_inside(node))
        missing = {n for n in inputs if n in produced and n not in available}
        needs.append(missing)
        for n in missing:
            waiting.setdefault(n, []).append(i)
    ready = [i for i, m in enumerate(needs) if not m]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for out in nodes[i].output:
            for j in waiting.pop(out, []):
                needs[j].discard(out)
                if not needs[j]:
                    heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise InternalError("the graph has a cycle")
    return order
