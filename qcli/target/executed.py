"""The graph onnxruntime actually runs for a model, as kernel calls with their work.

One session writes the graph it runs after its fusions (QDQ groups into QLinearConv, QGemm,
MatMulNBits, ...) and profiles one run on the given feeds: the profile names each kernel call
with its op and the shapes it saw (a Loop body's nodes once per iteration), and the written
graph gives the dims of the weights (the profile shows prepacked weights' shapes, not theirs).
Nothing here reads a clock: the profile's durations are ignored, so the same model and feeds
give the same kernels on an idle or a busy machine. The written graph's constants are also the
weights onnxruntime holds in memory (`Executed.weight_bytes`): MatMulNBits keeps its packed
4-bit blocks, a Cast of a float16 weight to float it folds holds the float result.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from qcli.info import weight_census
from qcli.runtime import make_session
from qcli.target.kernels import Kernel, Operand, kernel


@dataclass(frozen=True)
class Executed:
    """The kernel calls of one run, in the order onnxruntime made them, and the bytes of the
    constants of the graph it runs (the weights it holds, before any prepacking)."""

    kernels: list[Kernel]
    weight_bytes: int


def executed(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int | None = None) -> list[Kernel]:
    """The kernel calls of one run of `model` on `feeds`, in the order onnxruntime made them."""
    return run(model, feeds, threads).kernels


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int | None = None) -> Executed:
    """One run of `model` on `feeds`: its kernel calls and the weights onnxruntime holds."""
    with tempfile.TemporaryDirectory(prefix="qcli-target-") as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        session = make_session(model, threads, profile=Path(tmp) / "profile", timing=True, optimized=optimized,
                               frugal=True)
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
        written = onnx.load(str(optimized), load_external_data=False)
    nodes, constants = _nodes(written.graph, {})
    return Executed([_kernel(e, nodes, constants) for e in events
                     if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")],
                    weight_census(written)["bytes"])


def _nodes(graph: onnx.GraphProto, constants: dict[str, tuple[int, ...]]) -> tuple[dict, dict]:
    """Every node of `graph` and its subgraphs by name, and the dims of every initializer."""
    constants.update({t.name: tuple(t.dims) for t in graph.initializer})
    nodes = {n.name: n for n in graph.node}
    for n in graph.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                nodes.update(_nodes(sub, constants)[0])
    return nodes, constants


def _kernel(event: dict, nodes: dict[str, onnx.NodeProto], constants: dict[str, tuple[int, ...]]) -> Kernel:
    name = event["name"][: -len("_kernel_time")]
    args = event.get("args", {})
    node = nodes.get(name)
    inputs = _inputs(args.get("input_type_shape", []), list(node.input) if node is not None else [], constants)
    outputs = [_operand(shape, "", {}) for shape in args.get("output_type_shape", [])]
    attributes = list(node.attribute) if node is not None else []
    attrs = {a.name: a.i for a in attributes if a.type == onnx.AttributeProto.INT}
    activation = any(a.name == "activation" and a.s for a in attributes)  # NCHWc's and FusedConv's
    return kernel(name, args.get("op_name", node.op_type if node is not None else "?"), inputs, outputs, attrs,
                  activation)


def _inputs(shapes: list[dict], names: list[str], constants: dict[str, tuple[int, ...]]) -> list[Operand]:
    """A call's inputs: the profile lists one shape per input, but none for weights a kernel
    prepacked and freed (an LSTM's W and R); then the listed shapes go to the inputs that are
    not initializers, in order, and the initializers take their dims from the written graph.

    >>> ops = _inputs([{"float": [5, 1, 8]}], ["x", "W", "R"], {"W": (1, 16, 8), "R": (1, 16, 4)})
    >>> [(o.shape, o.constant) for o in ops]
    [((5, 1, 8), False), ((1, 16, 8), True), ((1, 16, 4), True)]
    """
    if len(shapes) >= len(names):
        return [_operand(shape, names[k] if k < len(names) else "", constants) for k, shape in enumerate(shapes)]
    listed = iter(shapes)
    return [_operand(next(listed, {}), "", {}) if name not in constants else _operand({}, name, constants)
            for name in names if name]


def _operand(typed: dict[str, list[int]], name: str, constants: dict[str, tuple[int, ...]]) -> Operand:
    """A profile's `{"float": [1, 3, 224, 224]}`; an initializer's dims from the written graph."""
    (dtype, shape), = typed.items() if typed else (("float", []),)  # an omitted one: float, like the weights
    if name in constants:
        return Operand(dtype, constants[name], True)
    return Operand(dtype, tuple(int(d) for d in shape))
