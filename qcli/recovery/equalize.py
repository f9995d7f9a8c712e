"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization", as AIMET's
CrossLayerScaling does it): in each pair Conv1 -> [act] -> Conv2, divide Conv1's output
channel i (weight row and bias) by s_i and multiply Conv2's input channel i by s_i, with

    s_i = sqrt(r1_i * r2_i) / r2_i        r1_i = max |W1[i]|, r2_i = max |W2[:, i]|

so both ranges become sqrt(r1_i * r2_i): one per-tensor weight scale then fits every channel
(and per-channel weights lose nothing). The float model computes the same, to float rounding.

A pair is equalized only where that holds exactly:
- Conv1's output (and the activation's) is read by that one node and is no graph output;
- the activation between, if any, is positive-homogeneous (f(x / s) = f(x) / s for s > 0):
  Relu, LeakyRelu, PRelu. Clip (Relu6) and HardSwish are not: they are skipped, with a note
  counting them. AIMET turns ReLU6 into ReLU to equalize across it, which changes the float
  model (its users saw accuracy drop, quic/aimet#525; it later ignored ReLU6, #3939); qcli
  never changes what the float model computes;
- both weights (and Conv1's bias) are float initializers no other node reads, Conv1's output
  channels are Conv2's input channels (grouped and depthwise Convs included: a channel's
  range is over the weights that read it).
A channel whose range is 0 on either side keeps s = 1. Chains of three or more Convs (Conv ->
depthwise -> Conv) share their middle Conv between two pairs: one pass balances each pair in
graph order, which unbalances the pair before; `iterations` passes converge (AIMET balances
depthwise triplets with one cube-root scale instead; iterating reaches the same point).

Runs on the prepared graph (BatchNormalization folded) from `qcli.quantize.prepare_for`, so
calibration, quantization, verification and the precision search all read the equalized graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx

from qcli.lazy import tensor_array
from qcli.prepare._graph import is_default_domain, label, set_tensor, use_counts

HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu")  # f(x / s) = f(x) / s for every s > 0
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


@dataclass(frozen=True)
class Pair:
    """Node indices of one equalizable pair: Conv1, the activation between (or None), Conv2."""

    first: int
    between: int | None
    second: int


@dataclass
class Equalized:
    """What `equalize` did: the pairs it balanced ("Conv1 -> Conv2" by node label), and why
    other Conv -> Conv links were left alone (reason -> count)."""

    pairs: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    @property
    def notes(self) -> list[str]:
        notes = [f"equalization: balanced {len(self.pairs)} Conv pair(s)" if self.pairs else
                 "equalization: no Conv pair to balance"]
        notes += [f"equalization: {n} Conv pair(s) left alone: {why}" for why, n in sorted(self.skipped.items())]
        return notes

    def to_dict(self) -> dict:
        return {"pairs": list(self.pairs), "skipped": dict(sorted(self.skipped.items()))}


def scales(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """Per-channel s with r1 / s == r2 * s (both sqrt(r1 * r2)); 1 where either range is 0.

    >>> scales(np.array([4.0, 1.0, 0.0]), np.array([1.0, 4.0, 2.0])).tolist()
    [2.0, 0.5, 1.0]
    """
    ok = (r1 > 0) & (r2 > 0)
    s = np.ones_like(r1, dtype=np.float64)
    s[ok] = np.sqrt(r1[ok] * r2[ok]) / r2[ok]
    return s


def output_ranges(w: np.ndarray) -> np.ndarray:
    """max |w| per output channel of a Conv weight [O, I/g, k...]."""
    return np.abs(w).reshape(w.shape[0], -1).max(axis=1)


def input_ranges(w: np.ndarray, group: int) -> np.ndarray:
    """max |w| per input channel of a Conv weight [O, I/g, k...] with `group` groups: input
    channel g * I/g + j is read by column j of group g's rows.

    >>> w = np.arange(8, dtype=np.float64).reshape(4, 1, 2)  # depthwise, 4 channels
    >>> input_ranges(w, 4).tolist()
    [1.0, 3.0, 5.0, 7.0]
    """
    per_group = w.reshape(group, w.shape[0] // group, w.shape[1], -1)
    return np.abs(per_group).max(axis=(1, 3)).reshape(-1)


def scale_inputs(w: np.ndarray, group: int, s: np.ndarray) -> np.ndarray:
    """`w` with input channel i multiplied by s[i] (same layout as `input_ranges`)."""
    per_group = w.reshape(group, w.shape[0] // group, w.shape[1], -1)
    factor = s.reshape(group, 1, w.shape[1], 1)
    return (per_group * factor).reshape(w.shape)


def equalize(model: onnx.ModelProto, iterations: int = 1) -> Equalized:
    """Balance every equalizable Conv pair of `model`'s main graph in place (module docstring)."""
    graph = model.graph
    pairs, report = find_pairs(graph)
    if not pairs:
        return report
    inits = {t.name: t for t in graph.initializer}
    values = {name: tensor_array(inits[name]).astype(np.float64) for p in pairs
              for i in (p.first, p.second) for name in graph.node[i].input[1:3] if name}
    for _ in range(iterations):
        for p in pairs:
            _balance(graph.node[p.first], graph.node[p.second], values)
    for name, array in values.items():
        tensor = inits[name]
        set_tensor(tensor, array.astype(tensor_array(tensor).dtype), name)
    report.pairs = [f"{label(graph.node[p.first])} -> {label(graph.node[p.second])}" for p in pairs]
    return report


def _balance(first: onnx.NodeProto, second: onnx.NodeProto, values: dict[str, np.ndarray]) -> None:
    w1, w2 = values[first.input[1]], values[second.input[1]]
    group = _group(second)
    s = scales(output_ranges(w1), input_ranges(w2, group))
    values[first.input[1]] = w1 / s.reshape(-1, *([1] * (w1.ndim - 1)))
    if len(first.input) > 2 and first.input[2]:
        values[first.input[2]] = values[first.input[2]] / s
    values[second.input[1]] = scale_inputs(w2, group, s)


def find_pairs(graph: onnx.GraphProto) -> tuple[list[Pair], Equalized]:
    """The equalizable pairs in graph order, and the Conv -> [op] -> Conv links skipped, by why."""
    uses = use_counts(graph)
    outputs = {o.name for o in graph.output}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    inits = {t.name: t for t in graph.initializer}
    report = Equalized()
    pairs = []
    for i, node in enumerate(graph.node):
        if not _is_conv(node):
            continue
        link = _follow(graph, node.output[0], readers, inits)
        if link is None:
            continue
        between, second = link
        why = _why_not(graph, i, between, second, uses, outputs, inits)
        if why:
            report.skipped[why] += 1
        else:
            pairs.append(Pair(i, between, second))
    return pairs, report


def _follow(graph: onnx.GraphProto, tensor: str, readers: dict[str, list[int]],
            constants: dict[str, onnx.TensorProto]) -> tuple[int | None, int] | None:
    """(activation, Conv2) when `tensor` leads to a Conv directly or through one op whose other
    inputs are constants (an elementwise activation, Clip, PRelu...)."""
    nexts = readers.get(tensor, [])
    if len(nexts) != 1:
        return None
    node = graph.node[nexts[0]]
    if _is_conv(node) and node.input[0] == tensor:
        return None, nexts[0]
    if len(node.output) != 1 or node.input[0] != tensor or any(x and x not in constants for x in node.input[1:]):
        return None
    after = readers.get(node.output[0], [])
    if len(after) == 1 and _is_conv(graph.node[after[0]]) and graph.node[after[0]].input[0] == node.output[0]:
        return nexts[0], after[0]
    return None


def _why_not(graph: onnx.GraphProto, i: int, between: int | None, j: int, uses: Counter[str],
             outputs: set[str], inits: dict[str, onnx.TensorProto]) -> str | None:
    first, second = graph.node[i], graph.node[j]
    if between is not None:
        act = graph.node[between]
        if act.op_type not in HOMOGENEOUS or not is_default_domain(act):
            return f"a {act.op_type} between them is not positive-homogeneous"
        if act.op_type == "PRelu" and act.input[1] not in inits:
            return "a PRelu between them has a slope computed at run time"
        if uses[act.output[0]] != 1 or act.output[0] in outputs:
            return "the activation between them is read elsewhere"
    if uses[first.output[0]] != 1 or first.output[0] in outputs:
        return "the first Conv's output is read elsewhere"
    params = [first.input[1], second.input[1]] + ([first.input[2]] if len(first.input) > 2 and first.input[2] else [])
    if any(p not in inits or inits[p].data_type not in FLOAT_TYPES for p in params):
        return "a weight or bias is not a float initializer"
    if any(uses[p] != 1 for p in params):
        return "a weight or bias is shared with another node"
    w1, w2 = inits[first.input[1]], inits[second.input[1]]
    if len(w2.dims) < 3 or w2.dims[1] * _group(second) != w1.dims[0]:
        return "their channel counts do not match"
    return None


def _is_conv(node: onnx.NodeProto) -> bool:
    return node.op_type == "Conv" and is_default_domain(node) and len(node.input) >= 2


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)
