"""Random valid float ONNX graphs for the fuzzer: a `Builder` that op families (fuzz_ops,
fuzz_nodes, fuzz_flow) extend one node group at a time, and the `graphs()` strategy that
draws the opset (11-21), inputs, families, outputs and a static or symbolic batch dim.

The builder tracks the concrete shape of every float tensor it makes, so each family picks an
input it can take and computes its output shape. `fuzz_data.runnable` then runs the float
model in onnxruntime: it discards the rare graph onnxruntime refuses, and fails on one whose
shapes the builder got wrong (a fuzzer bug). Weights are numpy draws from a seed hypothesis
picks, so a graph shrinks by its structure (fewer nodes, smaller dims), not by its numbers.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qcli.model import clamp_ir_version

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
OPSETS = (17, 13, 21, 11, 12, 14, 15, 16, 18, 19, 20)  # 11-21, the common ones first (shrinking goes left)
BLOCKS = ("stem", "encoder/layer.0", "encoder/layer.1", "head")  # node-name scopes, for glob overrides
INPUT_NAMES = ("x", "input", "input.1", "input:0", "images", "[x]", "x y")


@dataclass(frozen=True)
class T:
    """A float tensor the graph computes, with its concrete shape (batch dims as drawn)."""

    name: str
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Input:
    name: str
    shape: tuple[int, ...]
    dtype: int = FLOAT
    high: int = 0  # int64 inputs (Gather indices): values in [0, high)


class Builder:
    """Nodes, initializers and live tensors of one graph (or subgraph, `child()`), plus the
    op types, attributes and tags it generated (`features`) for the fuzzer's summary."""

    def __init__(self, draw: Callable[[st.SearchStrategy], Any], opset: int, rng: np.random.Generator,
                 features: Counter | None = None, counter: itertools.count | None = None):
        self.draw, self.opset, self.rng = draw, opset, rng
        self.features: Counter = Counter() if features is None else features
        self._count = counter or itertools.count()
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[Input] = []
        self.live: list[T] = []
        self.consumed: set[str] = set()
        self.weights: dict[tuple, list[str]] = {}  # shape -> float weights, for sharing
        self.depth = 0  # subgraph nesting

    # ------------------------------------------------------------------ draws
    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, max(lo, hi)))

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(list(options)))

    def rarely(self) -> bool:
        """True one time in four; shrinks to False."""
        return self.draw(st.integers(0, 3)) == 3

    # ------------------------------------------------------------------ names and features
    def name(self, stem: str) -> str:
        return f"{stem}_{next(self._count)}"

    def tag(self, text: str) -> None:
        self.features[text] += 1

    def child(self) -> Builder:
        """A builder for a subgraph body: it sees this graph's live tensors and weights (outer
        scope); what it adds stays in the subgraph."""
        sub = Builder(self.draw, self.opset, self.rng, self.features, self._count)
        sub.live = list(self.live)
        sub.weights = {k: list(v) for k, v in self.weights.items()}
        sub.depth = self.depth + 1
        return sub

    # ------------------------------------------------------------------ nodes and tensors
    def node(self, op: str, inputs: Sequence[str], outputs: int | Sequence[str] = 1, **attrs: Any) -> list[str]:
        names = [self.name(op.lower()) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        scope = self.choice(BLOCKS)
        node = helper.make_node(op, list(inputs), names, name=f"/{scope}/{op}_{next(self._count)}", **attrs)
        self.nodes.append(node)
        self.consumed.update(i for i in inputs if i)
        self.features[op] += 1
        for key, value in sorted(attrs.items()):
            if not isinstance(value, onnx.GraphProto | onnx.TensorProto):
                shown = value.decode() if isinstance(value, bytes) else value
                self.features[f"{op}.{key}={shown}"] += 1
        return names

    def add(self, name: str, shape: Sequence[int]) -> T:
        t = T(name, tuple(int(d) for d in shape))
        self.live.append(t)
        return t

    def pick(self, ok: Callable[[T], bool] = lambda t: True) -> T | None:
        candidates = [t for t in reversed(self.live) if ok(t)]
        return self.choice(candidates) if candidates else None

    def ints(self, values: Sequence[int]) -> str:
        """An int64 constant (a shape, axes, starts...): an initializer or a Constant node."""
        array = np.asarray(values, dtype=np.int64)
        if self.rarely():
            return self.node("Constant", [], value=numpy_helper.from_array(array, self.name("const")))[0]
        return self._initializer(array, "shape")

    def scalar_ints(self, value: int) -> str:
        return self._initializer(np.asarray(value, dtype=np.int64), "k")

    def _initializer(self, array: np.ndarray, stem: str) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def values(self, shape: Sequence[int], scale: float = 0.5, away_from_zero: bool = False) -> np.ndarray:
        v = self.rng.normal(0.0, scale, size=tuple(shape)).astype(np.float32)
        if away_from_zero:  # divisors, variances: |v| >= 0.5
            v = (np.sign(v) + (v == 0)) * (0.5 + np.abs(v))
        return v.astype(np.float32)

    def weight(self, shape: Sequence[int], scale: float = 0.5, away_from_zero: bool = False,
               positive: bool = False) -> str:
        """A float constant: an initializer (often), a Constant or ConstantOfShape node, or an
        existing weight of the same shape (shared)."""
        shape = tuple(int(d) for d in shape)
        kind = self.choice(["initializer"] * 3 + ["constant", "constant_of_shape", "shared", "shared", "zeros"])
        shared = self.weights.get(shape, [])
        if kind == "shared" and shared and not (positive or away_from_zero):
            self.tag("weight=shared")
            return self.choice(shared)
        kind = "initializer" if kind == "shared" else kind
        value = self.values(shape, scale, away_from_zero or positive)
        value = np.abs(value) if positive else value
        if kind == "zeros" and not (positive or away_from_zero):
            value = np.zeros(shape, np.float32)
        if kind == "constant_of_shape":
            fill = numpy_helper.from_array(value.reshape(-1)[:1].copy() if value.size else np.ones(1, np.float32))
            name = self.node("ConstantOfShape", [self.ints(shape)], value=fill)[0]
        elif kind == "constant":
            name = self.node("Constant", [], value=numpy_helper.from_array(value, self.name("w")))[0]
        else:
            name = self._initializer(value, "w")
        self.tag(f"weight={kind}")
        self.weights.setdefault(shape, []).append(name)
        return name


@dataclass(frozen=True)
class Family:
    """An op family: which live tensors it can take (`fits`), and `build`, which adds its node
    group reading one of them (its new tensors go to `Builder.add`)."""

    name: str
    fits: Callable[[T], bool]
    build: Callable[[Builder, T], object]


@dataclass
class GraphCase:
    """A generated graph and what the fuzzer needs to feed it and judge its results."""

    model: onnx.ModelProto  # static dims; `fuzz_data.runnable` may swap in the symbolic one
    inputs: list[Input]
    symbolic: onnx.ModelProto | None  # the same graph with a symbolic batch dim `N`, to try
    features: Counter = field(default_factory=Counter)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the builder's output shapes
    batched: bool = False  # the model in use has the symbolic batch dim

    @property
    def text(self) -> str:
        return onnx.printer.to_text(self.model)


def draw_inputs(b: Builder) -> None:
    """One to three graph inputs sharing the batch dim, or (rarely) none: a Constant source."""
    count = 0 if b.draw(st.integers(0, 19)) == 19 else b.choice([1, 1, 2, 3])
    batch = b.choice([1, 1, 2])
    names = iter(dict.fromkeys([b.choice(INPUT_NAMES), "x2", "x3", "x4"]))
    for _ in range(count):
        rank = b.int(2, 4)
        tail = [b.int(1, 6) for _ in range(rank - 1)] if rank > 2 else [b.int(1, 12)]
        name = next(names)
        b.inputs.append(Input(name, (batch, *tail)))
        b.add(name, (batch, *tail))
    if count == 0:
        b.tag("no inputs")
        value = b.values((batch, b.int(1, 6)))
        name = b.node("Constant", [], value=numpy_helper.from_array(value, b.name("source")))[0]
        b.add(name, value.shape)


def choose_outputs(b: Builder) -> list[T]:
    """Every live tensor no node reads (up to four; the rest stay dead nodes), and sometimes a
    tensor that nodes also read (a graph output read by other nodes)."""
    dangling = [t for t in b.live if t.name not in b.consumed]
    outputs = dangling[-4:] if dangling else [b.live[-1]]
    if len(dangling) > 4:
        b.tag("dead nodes")
    if any(t.name in _input_names(b) for t in outputs):
        b.tag("input passed through to an output")
    inner = [t for t in b.live if t.name in b.consumed and t not in outputs and t.name not in _input_names(b)]
    if inner and b.rarely():
        outputs.insert(0, b.choice(inner))
        b.tag("graph output read by nodes")
    return outputs


def _input_names(b: Builder) -> set[str]:
    return {i.name for i in b.inputs}


def make_model(b: Builder, outputs: Sequence[T], symbolic: bool) -> onnx.ModelProto:
    """The model proto: inputs with static dims or a symbolic batch `N`, outputs typed by shape
    inference (static where it knows the dims)."""
    inputs = [
        helper.make_tensor_value_info(i.name, i.dtype, ["N", *i.shape[1:]] if symbolic else list(i.shape))
        for i in b.inputs
    ]
    declared = {i.name: i for i in inputs}  # an input passed through as an output keeps its type
    outs = [declared.get(t.name) or helper.make_tensor_value_info(t.name, FLOAT, None if symbolic else list(t.shape))
            for t in outputs]
    graph = helper.make_graph(b.nodes, "fuzz", inputs, outs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)])
    if symbolic:
        model = onnx.shape_inference.infer_shapes(model)
    return clamp_ir_version(model)


def _families() -> list[Family]:
    import fuzz_flow
    import fuzz_nodes
    import fuzz_ops

    return [*fuzz_ops.FAMILIES, *fuzz_nodes.FAMILIES, *fuzz_flow.FAMILIES]


@st.composite
def graphs(draw: Callable[[st.SearchStrategy], Any], max_steps: int = 6) -> GraphCase:
    """A valid float graph of 1..max_steps node groups over opsets 11-21 (see the module docstring)."""
    opset = draw(st.sampled_from(OPSETS))
    b = Builder(draw, opset, np.random.default_rng(draw(st.integers(0, 2**16))))
    b.tag(f"opset={opset}")
    draw_inputs(b)
    families = _families()
    for _ in range(draw(st.integers(1, max_steps))):
        usable = [f for f in families if any(f.fits(t) for t in b.live)]
        family = draw(st.sampled_from(usable))
        family.build(b, b.pick(family.fits))
    outputs = choose_outputs(b)
    b.tag(f"outputs={len(outputs)}")
    static = make_model(b, outputs, symbolic=False)
    symbolic = make_model(b, outputs, symbolic=True) if b.inputs and draw(st.booleans()) else None
    return GraphCase(static, b.inputs, symbolic, b.features, {t.name: t.shape for t in outputs})
