"""Empirical bias correction (Nagel et al. 2019, §4.2; AIMET's and Quark's bias correction):
rounding a weight to int8 is not zero-mean per output channel, so a quantized Conv, Gemm or
MatMul adds a systematic shift to each channel of its output. It is measured over the
calibration data and taken out of the node's float bias before the bias becomes int32.

What is measured, per target node (a quantized node of `op_types` whose weight is quantized):

    shift_c = mean over data and positions of  node(xq, Wq, bq)[c] - node(xq, W, b)[c]

with xq the input the int8 model really feeds it (dequantized), Wq/bq the int8/int32 weight
and bias dequantized, W/b the float ones: the node's own error, given its real inputs. Both
branches run side by side in one copy of the all-int8 model, one pass over the calibration
samples. AIMET measures instead the whole shift at each layer, float model against quantized
model, correcting layer by layer: one pass of the data per layer. A one-pass measure of that
whole shift would count each upstream node's shift again downstream (and over-correct);
the node-local shift adds up instead. The mean shift of activation rounding is left out: it is
unbiased but where the range clips, which the calibration method chose to trade.

Where the correction goes: Conv/ConvTranspose/Gemm subtract it from their bias (a node without
one gets a zero bias in preparation, `add_zero_biases`, so that every plan already has the
int32 bias the corrected values go into; a Gemm's C is divided by beta); a MatMul from the
constant [N] of the Add that alone reads its output, else it is not corrected (noted).

Data: the shifts need the int8 model, so they are measured after calibration, at quantize
time, with `--data` (qcli.verify.quantize_checked); under k-fold verification each fold's
model gets the shifts of its own all-int8 model measured on the other folds' samples alone
(as its ranges are), so a fold is never compared on samples its correction read. A
calibration file holds ranges only: `--calib` with bias correction is refused (exit 2). The
shifts live on the calibration table in memory (`CalibrationTable.bias_shifts`), so every
rebuild of the rescue and auto-precision (their workers included) applies the same numbers,
and only to nodes still quantized the way they were measured (same activation and weight
schemes): a node promoted to float or int16 keeps its float bias. Deterministic: the pass
runs on one thread, sums in float64.

Reported per node: the largest |shift| and the node's output SQNR (against the float-weight
branch, same inputs) before and after the correction, computed from the same pass (the
correction removes each channel's mean error: sum (e - mean)^2 = sum e^2 - n * mean^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.data import DataFolder
from qcli.errors import QcliError
from qcli.lazy import tensor_array
from qcli.plan import Plan
from qcli.prepare._graph import NameAllocator, add_initializer, is_default_domain, tensor_names, use_counts
from qcli.runtime import make_session

BIASED = ("Conv", "ConvTranspose", "Gemm")  # ops with a bias input (index 2)



def needs_data() -> QcliError:
    """The error of bias correction asked for without calibration data to measure on."""
    return QcliError(
        "recovery step 'bias_correction' needs --data DIR: it measures the int8 model's output shift on the "
        "calibration samples, which a calibration file does not hold",
        hint="give --data DIR instead of --calib FILE, or drop bias_correction from recovery:",
    )


@dataclass(frozen=True)
class Shift:
    """One node's measured mean output shift per channel, the schemes it was measured under,
    and its output SQNR (dB) against float weights before and after the correction."""

    values: tuple[float, ...]
    signature: str
    sqnr_before: float
    sqnr_after: float


Shifts = dict[str, Shift]  # node key (its first output in the prepared graph) -> shift


@dataclass(frozen=True)
class Target:
    """A node whose shift is measured: its index and key in the prepared graph, where its bias
    lives (an initializer, and the factor the shift is multiplied by there) and its channels."""

    index: int
    key: str
    weight: str
    bias: str
    factor: float
    channels: int
    signature: str


def add_zero_biases(model: onnx.ModelProto, op_types: Iterable[str]) -> list[str]:
    """Give every Conv/ConvTranspose/Gemm of `op_types` with a float initializer weight and no
    bias a zero bias `<node>/bias` (the float model computes the same); the keys of those
    nodes."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    names = NameAllocator(tensor_names(graph))
    added = []
    for node in graph.node:
        if node.op_type not in op_types or node.op_type not in BIASED or not is_default_domain(node):
            continue
        if len(node.input) > 2 and node.input[2] or len(node.input) < 2 or node.input[1] not in inits:
            continue
        channels = _channels(node, inits[node.input[1]])
        if channels is None or (node.op_type == "Gemm" and _attr(node, "beta", 1.0) == 0.0):
            continue
        dtype = helper.tensor_dtype_to_np_dtype(inits[node.input[1]].data_type)
        name = names.fresh(f"{node.name or node.output[0]}/bias")
        add_initializer(graph, np.zeros(channels, dtype), name)
        while len(node.input) < 2:
            node.input.append("")
        if len(node.input) == 2:
            node.input.append(name)
        else:
            node.input[2] = name
        added.append(node.output[0])
    return added


def targets(model: onnx.ModelProto, plan: Plan, op_types: Iterable[str]) -> tuple[list[Target], list[str]]:
    """The nodes of `plan` (on the prepared `model`) whose shift is measured and corrected, and
    notes on the quantized nodes of `op_types` that cannot take a correction."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses = use_counts(graph)
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    found, skipped = [], []
    for d in plan.nodes:
        node = graph.node[d.index]
        if not d.quantized or d.reason or d.dynamic or node.op_type not in op_types or d.index in plan.dynamic:
            continue
        weight = node.input[1] if len(node.input) > 1 else ""
        if weight not in plan.weights or uses[weight] != 1:
            skipped.append(d.name)
            continue
        place = _bias_place(graph, d.index, inits, uses, readers)
        channels = _channels(node, inits[weight])
        # a bias broadcast from fewer values (a scalar, [1]) cannot take a per-channel correction
        if place is None or channels is None or int(np.prod(inits[place[0]].dims)) != channels:
            skipped.append(d.name)
            continue
        found.append(Target(d.index, node.output[0], weight, place[0], place[1], channels,
                            _signature(plan, node)))
    notes = [f"bias correction: {len(skipped)} node(s) have no bias of their own to correct "
             f"(a MatMul without a following Add of a constant, or a shared weight or bias): "
             f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}"] if skipped else []
    return found, notes


def _bias_place(graph: onnx.GraphProto, i: int, inits: dict[str, onnx.TensorProto], uses,
                readers: dict[str, list[int]]) -> tuple[str, float] | None:
    """(bias initializer, factor) of node `i`: its own bias input (Gemm: 1 / beta), or a
    MatMul's following Add's constant; None when it has none of its own."""
    node = graph.node[i]
    if node.op_type in BIASED:
        bias = node.input[2] if len(node.input) > 2 else ""
        if not bias or bias not in inits or uses[bias] != 1:
            return None
        beta = _attr(node, "beta", 1.0) if node.op_type == "Gemm" else 1.0
        return (bias, 1.0 / beta) if beta > 0 else None
    nexts = readers.get(node.output[0], [])
    if len(nexts) != 1 or node.output[0] in {o.name for o in graph.output}:
        return None
    add = graph.node[nexts[0]]
    if add.op_type != "Add" or not is_default_domain(add):
        return None
    other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
    if other not in inits or uses[other] != 1 or other == node.output[0]:
        return None
    return other, 1.0


def _signature(plan: Plan, node: onnx.NodeProto) -> str:
    """The schemes a node's shift depends on: its input's activation scheme and its weight's."""
    schemes = {t: g.scheme for g in plan.groups for t in g.tensors}
    return f"{schemes.get(node.input[0])!r} x {plan.weights[node.input[1]].scheme!r}"


def _channels(node: onnx.NodeProto, weight: onnx.TensorProto) -> int | None:
    dims = list(weight.dims)
    if node.op_type == "Conv" and len(dims) >= 3:
        return dims[0]
    if node.op_type == "ConvTranspose" and len(dims) >= 3:
        return dims[1] * int(_attr(node, "group", 1))
    if node.op_type == "Gemm" and len(dims) == 2:
        return dims[0] if _attr(node, "transB", 0) else dims[1]
    if node.op_type == "MatMul" and len(dims) == 2:
        return dims[1]
    return None


def _attr(node: onnx.NodeProto, name: str, default: float) -> float:
    for a in node.attribute:
        if a.name == name:
            return a.f if a.type == onnx.AttributeProto.FLOAT else a.i
    return default


# --------------------------------------------------------------------------- measuring


def measure(prepared: onnx.ModelProto, quantized: onnx.ModelProto, found: list[Target],
            folders: Iterable[DataFolder], batch_size: int, progress: Callable[[int], None] | None = None) -> Shifts:
    """Each target's shift (module docstring), over one pass of `folders` (parts of one data
    folder, read one after another) through `quantized` (the all-int8 model made from
    `prepared`), side by side with float-weight copies."""
    if not found:
        return {}
    probe, outputs = _instrument(prepared, quantized, found)
    session = make_session(probe, threads=1)
    sums = {t.key: np.zeros(t.channels) for t in found}
    totals = {t.key: np.zeros(3) for t in found}  # elements, sum e^2, sum ref^2
    for batch in (b for folder in folders for b in folder.batches(batch_size)):
        values = dict(zip(outputs, session.run(outputs, batch.inputs), strict=True))
        for t in found:
            sums[t.key] += values[f"{t.key}/bc_sum"].astype(np.float64)
            totals[t.key] += [float(values[f"{t.key}/bc_size"]) / t.channels,
                              float(values[f"{t.key}/bc_err2"]), float(values[f"{t.key}/bc_ref2"])]
        if progress is not None:
            progress(batch.size)
    shifts = {}
    for t in found:
        n, err2, ref2 = totals[t.key]
        if n == 0:
            continue
        mean = sums[t.key] / n
        after = max(err2 - n * float(np.sum(mean**2)), 0.0)
        shifts[t.key] = Shift(tuple(float(v) for v in mean), t.signature, _db(ref2, err2), _db(ref2, after))
    return shifts


def _db(signal: float, noise: float) -> float:
    return round(10 * math.log10(signal / noise), 2) if noise > 0 and signal > 0 else math.inf


def _instrument(prepared: onnx.ModelProto, quantized: onnx.ModelProto,
                found: list[Target]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of `quantized` where each target also runs with its float weight and bias on the
    same input, and writes per channel the sum of (int8 - float) output, the element count and
    the sums of squares of the error and of the float-weight output."""
    probe = onnx.ModelProto()
    probe.CopyFrom(quantized)
    graph = probe.graph
    del graph.output[:]
    floats = {t.name: t for t in prepared.graph.initializer}
    by_weight = {n.input[1]: n for n in graph.node if len(n.input) > 1}
    outputs: list[str] = []
    for t in found:
        node = by_weight.get(f"{t.weight}_dequantized")
        if node is None:
            continue
        source = prepared.graph.node[t.index]
        ref = helper.make_node(node.op_type, [node.input[0], f"{t.key}/bc_w", *([f"{t.key}/bc_b"]
                               if source.op_type in BIASED else [])], [f"{t.key}/bc_ref"], name=f"{t.key}/bc_ref")
        ref.attribute.extend(node.attribute)
        graph.initializer.append(_renamed(floats[t.weight], f"{t.key}/bc_w"))
        if source.op_type in BIASED:
            graph.initializer.append(_renamed(floats[t.bias], f"{t.key}/bc_b"))
        shape = [0, t.channels, -1] if node.op_type.startswith("Conv") else [-1, t.channels]
        axes = [0, 2] if node.op_type.startswith("Conv") else [0]
        graph.initializer.extend([numpy_helper.from_array(np.array(shape, np.int64), f"{t.key}/bc_shape"),
                                  numpy_helper.from_array(np.array(axes, np.int64), f"{t.key}/bc_axes")])
        k = t.key
        graph.node.extend([
            ref,
            helper.make_node("Sub", [node.output[0], f"{k}/bc_ref"], [f"{k}/bc_err"]),
            helper.make_node("Reshape", [f"{k}/bc_err", f"{k}/bc_shape"], [f"{k}/bc_flat"]),
            helper.make_node("ReduceSum", [f"{k}/bc_flat", f"{k}/bc_axes"], [f"{k}/bc_sum"], keepdims=0),
            helper.make_node("Size", [f"{k}/bc_err"], [f"{k}/bc_size"]),
            helper.make_node("ReduceSumSquare", [f"{k}/bc_err"], [f"{k}/bc_err2"], keepdims=0),
            helper.make_node("ReduceSumSquare", [f"{k}/bc_ref"], [f"{k}/bc_ref2"], keepdims=0),
        ])
        outputs += [f"{k}/bc_sum", f"{k}/bc_size", f"{k}/bc_err2", f"{k}/bc_ref2"]
    graph.output.extend(helper.make_empty_tensor_value_info(name) for name in outputs)
    return probe, outputs


def _renamed(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


# --------------------------------------------------------------------------- applying


def corrected(prepared: onnx.ModelProto, found: list[Target], shifts: Shifts) -> tuple[onnx.ModelProto, dict]:
    """A copy of `prepared` with each target's shift taken out of its bias, when it was
    measured under the same schemes; and the report of what was corrected."""
    work = onnx.ModelProto()
    work.CopyFrom(prepared)
    inits = {t.name: t for t in work.graph.initializer}
    done: dict[str, Shift] = {}
    for t in found:
        shift = shifts.get(t.key)
        if shift is None or shift.signature != t.signature:
            continue
        tensor = inits[t.bias]
        bias = tensor_array(tensor)
        new = (bias.astype(np.float64) - np.asarray(shift.values).reshape(bias.shape) * t.factor).astype(bias.dtype)
        tensor.CopyFrom(numpy_helper.from_array(new, t.bias))
        done[t.key] = shift
    return work, report(done)


def report(done: Shifts) -> dict:
    """What the correction changed: the nodes, the largest shift, each node's SQNR before/after."""
    if not done:
        return {"nodes": 0}
    peaks = {k: float(np.asarray(s.values)[np.argmax(np.abs(s.values))]) for k, s in done.items()}
    largest = max(peaks, key=lambda k: (abs(peaks[k]), k))
    return {
        "nodes": len(done),
        "largest_shift": {"node": largest, "value": round(peaks[largest], 6)},
        "sqnr_db": {k: [s.sqnr_before, s.sqnr_after] for k, s in sorted(done.items())},
    }
