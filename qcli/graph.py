"""Where every tensor of one graph comes from and goes, indexed once: `GraphIndex.of(model)`.

The planning phases, the Q/DQ writer, the calibration pass and the precision search each
used to scan `graph.node` for the producer or readers of a tensor; this is the one index they
share. Node positions are indices into `graph.node`, so an index built on a model stays valid
for an exact copy of it (`ModelProto.CopyFrom`), until nodes are added, removed or rewired.
Empty names (an omitted optional input or output) are not tensors and are not indexed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx


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
