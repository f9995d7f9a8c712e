"""What every planning phase reads (`Context`: the graph index, node names and rules, the
config and its selections, the tensors that stay float whatever is quantized), and the
union-find two phases group with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import onnx

from qcli.config import Config
from qcli.errors import InternalError
from qcli.graph import GraphIndex, iter_graphs, node_names, node_subgraphs
from qcli.plan.match import Selections
from qcli.rules import Kind, OpRule, activation_inputs, rule_for, weight_only_rule


@dataclass(frozen=True)
class Context:
    """The model and config one plan is made for, indexed once."""

    index: GraphIndex
    names: list[str]  # display names (`node_names`)
    rules: list[OpRule | None]  # each node's rule (`rule_for`)
    config: Config
    selections: Selections
    float_reads: dict[str, str]  # tensors that stay float whatever is quantized, and who reads them

    @classmethod
    def of(cls, model: onnx.ModelProto, config: Config, index: GraphIndex | None = None) -> Context:
        index = index if index is not None else GraphIndex.of(model)
        names = node_names(model)
        weight_only = config.activations.dtype == "float"
        rules = [weight_only_rule(node, index.initializers) if weight_only else rule_for(node)
                 for node in model.graph.node]
        return cls(index, names, rules, config, Selections.of(config, names, index), float_readers(model.graph))

    def node(self, i: int) -> onnx.NodeProto:
        return self.index.graph.node[i]

    def rule(self, i: int) -> OpRule:
        """The rule of a node that has one (a candidate)."""
        rule = self.rules[i]
        if rule is None:
            raise InternalError(f"node {self.names[i]!r} has no op rule")
        return rule

    def is_kind(self, i: int, kind: Kind) -> bool:
        rule = self.rules[i]
        return rule is not None and rule.kind == kind

    def activations(self, i: int) -> list[str]:
        """The names node `i` reads as activations (by its rule; initializers included)."""
        node = self.node(i)
        return [node.input[k] for k in activation_inputs(node, self.rule(i))]


def float_readers(graph: onnx.GraphProto) -> dict[str, str]:
    """Tensors that stay float whatever is quantized, and who reads them: inputs of If/Loop/Scan
    nodes and names their bodies read ("a Loop", "a Loop body"), and graph outputs.

    A weight among them would be held twice if a quantized node read it (float for them, int8
    for it), and the model would grow: piper's nakdimon, whose Keras LSTMs pass their weights to
    a Loop and to a first-step MatMul, grew by a fifth with those MatMuls quantized. Other float
    readers in the main graph do not count: a tied embedding's Gather (float when no anchor is
    near) shares its table with the output projection, and that projection's int8 kernel is
    worth a second copy of a quarter of the table's size."""
    reads: dict[str, str] = {}
    for node in graph.node:
        for body in node_subgraphs(node):  # outer-scope names read at any depth stay float
            reads.update((name, f"a {node.op_type} body") for _, g in iter_graphs(body) for n in g.node
                         for name in n.input)
    for node in graph.node:
        if any(True for _ in node_subgraphs(node)):
            reads.update((name, f"a {node.op_type}") for name in node.input if name)
    reads.update((name, "a graph output") for name in (o.name for o in graph.output))
    return reads


T = TypeVar("T", int, str)


class UnionFind(Generic[T]):
    """Disjoint sets; the smallest member is the root (deterministic, whatever the union order)."""

    def __init__(self) -> None:
        self.parent: dict[T, T] = {}

    def find(self, x: T) -> T:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: T, b: T) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
