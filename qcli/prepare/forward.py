"""Fold a per-channel scale or shift into the Conv that alone reads it (forward), main graph:

    Conv(Mul(X, s), W, b) -> Conv(X, W * s, b)              s on W's input channels; exact with
    Conv(Div(X, s), W, b) -> Conv(X, W / s, b)              padding too (0 * s = 0)
    Conv(Add(X, t), W, b) -> Conv(X, W, b + sum W * t)      only without padding (a padded
                                                            border reads 0, not t)

folded from the Conv backwards, one step at a time, while the step's output feeds nothing but
that Conv. `s`, `t` are constants broadcasting along the channel axis only (or single values).

Why: exporters write an activation's learnable affine (PP-LCNetV3's "lab" blocks, a scalar Mul
and Add after every HardSwish) and a decomposed HardSwish's final `/ 6` as separate ops between
the activation and the next Conv. Each is one more int8 requantization, or a float op between
Q/DQ pairs, where the Conv's per-channel int8 weights absorb a scale exactly. The float model
changes by float32 rounding only (the products are formed in float64).

Measured on the PP-OCRv4 recognizer (all-int8, held-out strings, `benchmarks/recovery.py`):
12 Mul, 12 Div and 12 Add fold; 77.1% -> 78.1% of strings unchanged, 0.59x -> 0.50x float's
latency. Moving a padded Conv's shift above its scale (Add(Mul(X, s), t) -> Mul folded,
Add(X, t / s) kept) folded 13 more Muls and Divs but cut the strings to 46%: not done.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper

from qcli.lazy import tensor_array
from qcli.prepare._graph import is_default_domain, plural, set_tensor, use_counts
from qcli.prepare.batchnorm import output_channels, per_channel

STEPS = ("Mul", "Div", "Add")


def fold_forward(graph: onnx.GraphProto, notes: list[str]) -> int:
    """Fold the steps above into their Convs; the number of nodes removed (a note says so)."""
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: node for node in graph.node for o in node.output if o}
    uses = use_counts(graph)
    gone: set[int] = set()
    folded: Counter[str] = Counter()
    position = {node.output[0]: i for i, node in enumerate(graph.node) if node.output}
    for conv in graph.node:
        if conv.op_type != "Conv" or not is_default_domain(conv) or not _own_weight(conv, initializers, uses):
            continue
        while (step := _step(producers.get(conv.input[0]), initializers, uses)) is not None:
            removed = _fold(conv, *step, initializers)
            if removed is None:
                break
            gone.add(position[removed.output[0]])
            folded[removed.op_type] += 1
    if gone:
        keep = [n for i, n in enumerate(graph.node) if i not in gone]
        del graph.node[:]
        graph.node.extend(keep)
        what = ", ".join(plural(folded[op], f"{op} node") for op in STEPS if folded[op])
        notes.append(f"folded {what} with per-channel constants into the Conv reading them")
    return len(gone)


def _own_weight(conv: onnx.NodeProto, initializers: dict, uses: Counter[str]) -> bool:
    """The Conv's weight and bias are float initializers only it reads (rewritten in place)."""
    names = [n for n in conv.input[1:3] if n]
    return len(conv.input) >= 2 and all(
        n in initializers and initializers[n].data_type == onnx.TensorProto.FLOAT and uses[n] == 1 for n in names)


def _step(node: onnx.NodeProto | None, initializers: dict, uses: Counter[str]
          ) -> tuple[onnx.NodeProto, str, onnx.TensorProto] | None:
    """(node, its non-constant input, its constant) when `node` is a Mul/Div/Add of one value by
    a float constant whose output only one reader reads."""
    if node is None or node.op_type not in STEPS or not is_default_domain(node) or len(node.input) != 2:
        return None
    if uses[node.output[0]] != 1:
        return None
    a, b = node.input
    if b in initializers and a not in initializers:
        source, constant = a, initializers[b]
    elif a in initializers and b not in initializers and node.op_type != "Div":
        source, constant = b, initializers[a]
    else:
        return None
    return (node, source, constant) if constant.data_type == onnx.TensorProto.FLOAT else None


def _fold(conv: onnx.NodeProto, node: onnx.NodeProto, source: str, constant: onnx.TensorProto,
          initializers: dict) -> onnx.NodeProto | None:
    """Fold one step into `conv` (module docstring); the node that goes, None when nothing can
    fold (nothing changed then)."""
    if output_channels(conv, initializers) is None:  # not a weight of rank 3 or more
        return None
    weight = tensor_array(initializers[conv.input[1]]).astype(np.float64)
    groups = next((a.i for a in conv.attribute if a.name == "group"), 1)
    # one value per input channel of the Conv's [N, C, ...] input, C = C/groups x groups
    per = per_channel(constant, weight.shape[1] * groups, weight.ndim)
    if per is None:
        return None
    if node.op_type != "Add":
        if not np.all(per):
            return None
        _scale(initializers[conv.input[1]], weight, groups, per if node.op_type == "Mul" else 1 / per)
    elif _padded(conv) or not _add_bias(conv, _by_output(weight, groups, per), initializers):
        return None
    conv.input[0] = source
    return node


def _grouped(weight: np.ndarray, groups: int, per: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W as [groups, M/groups, C/groups, k...] and `per` (one value per input channel) shaped to
    multiply it: input channel g * (C/groups) + j reaches group g's outputs through W[o, j]."""
    grouped = weight.reshape((groups, weight.shape[0] // groups) + weight.shape[1:])
    return grouped, per.reshape((groups, 1, weight.shape[1]) + (1,) * (weight.ndim - 2))


def _scale(tensor: onnx.TensorProto, weight: np.ndarray, groups: int, per: np.ndarray) -> None:
    grouped, factor = _grouped(weight, groups, per)
    set_tensor(tensor, (grouped * factor).reshape(weight.shape).astype(np.float32), tensor.name)


def _by_output(weight: np.ndarray, groups: int, per: np.ndarray) -> np.ndarray:
    """What adding `per` to the input adds to each output channel of an unpadded Conv."""
    grouped, shift = _grouped(weight, groups, per)
    return (grouped * shift).reshape(weight.shape[0], -1).sum(axis=1)


def _padded(conv: onnx.NodeProto) -> bool:
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    auto = attrs.get("auto_pad", b"NOTSET")
    return any(attrs.get("pads", [])) or (auto.decode() if isinstance(auto, bytes) else auto) not in ("NOTSET", "VALID")


def _add_bias(conv: onnx.NodeProto, shift: np.ndarray, initializers: dict) -> bool:
    if len(conv.input) > 2 and conv.input[2]:
        bias = initializers[conv.input[2]]
        set_tensor(bias, (tensor_array(bias).astype(np.float64) + shift).astype(np.float32), bias.name)
        return True
    return False
