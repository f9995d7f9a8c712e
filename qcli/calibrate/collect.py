"""One inference pass over a data folder that feeds one `TensorObserver` per activation.

The model is run with the activations to observe added as extra graph outputs (only those:
not every intermediate), one batch at a time; each batch's arrays update the observers and
are dropped, so memory stays flat in the number of samples. Which tensors: every float tensor
the graph computes at run time (graph inputs and node outputs not derived from constants
alone) in the main graph. Tensors inside If/Loop bodies cannot be graph outputs and are not
observed; the quantizer leaves those subgraphs float unless they are inlined first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from qcli.calibrate.observers import DEFAULT_MAX_BINS, TensorObserver
from qcli.data import DataFolder
from qcli.errors import DataError
from qcli.rules import activation_inputs, rule_for
from qcli.runtime import make_session

FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
}
# Ops whose output is not a function of their inputs: never treated as constant.
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every typed tensor of the main graph, after shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=False)
    except Exception:  # inference is a help here, not a requirement: types are re-checked at run time
        inferred = model
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def activation_tensors(model: onnx.ModelProto) -> list[str]:
    """Float tensors computed at run time, in graph order (inputs first).

    A node whose inputs are all constant (initializers, Constant outputs, or outputs of such
    nodes) computes a constant: its outputs are weights, not activations.
    """
    graph = model.graph
    types = tensor_types(model)
    constant = {t.name for t in graph.initializer} | {""}
    names: list[str] = [i.name for i in graph.input if i.name not in constant]
    for node in graph.node:
        if node.op_type not in _RANDOM_OPS and all(i in constant for i in node.input):
            constant.update(node.output)
        else:
            names.extend(o for o in node.output if o)
    seen: set[str] = set()
    out = []
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        if types.get(name, onnx.TensorProto.FLOAT) in FLOAT_TYPES:  # unknown: checked at run time
            out.append(name)
    return out


def calibration_tensors(model: onnx.ModelProto, *, all_rules: bool = False) -> list[str]:
    """The activations a default quantization needs ranges for, in graph order.

    Those are the activation inputs and the outputs of every node with a rule (rules.py),
    except ops that are float by default (unless `all_rules`), and except a producer's output
    that only feeds a Relu/Clip: the clipped output is observed instead, and not asking
    onnxruntime for the unclipped one keeps its Conv+Relu fusion (and our pass fast).
    """
    wanted = set(activation_tensors(model))
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    picked: set[str] = set()
    for node in model.graph.node:
        rule = rule_for(node)
        if rule is None or (rule.default_float and not all_rules):
            continue
        if rule.kind != "fold":  # a folded op's input is its producer's output
            picked.update(node.input[i] for i in activation_inputs(node, rule))
        for out in node.output:
            users = consumers.get(out, [])
            folded = (
                users
                and out not in graph_outputs
                and all((r := rule_for(u)) is not None and r.kind == "fold" for u in users)
            )
            if not folded:
                picked.add(out)
    return [name for name in activation_tensors(model) if name in picked and name in wanted]


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph also outputs `names` (types left to onnxruntime)."""
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    existing = {o.name for o in augmented.graph.output}
    for name in names:
        if name not in existing:
            augmented.graph.output.append(onnx.ValueInfoProto(name=name))
    return augmented


@dataclass
class Collected:
    """What one pass produced: an observer per float tensor, and what was left out."""

    observers: dict[str, TensorObserver]
    samples: int
    batches: int
    skipped: list[str] = field(default_factory=list)  # requested tensors that were not float


def collect(
    model: onnx.ModelProto,
    folder: DataFolder,
    *,
    batch_size: int = 8,
    tensors: list[str] | None = None,
    max_bins: int = DEFAULT_MAX_BINS,
    progress: Callable[[int], None] | None = None,
) -> Collected:
    """Run `model` over `folder` once and observe `tensors` (default: `calibration_tensors`)."""
    names = calibration_tensors(model) if tensors is None else list(tensors)
    session = make_session(with_outputs(model, names))
    observers = {name: TensorObserver(max_bins=max_bins, name=name) for name in names}
    skipped: list[str] = []
    samples = batches = 0
    for batch in folder.batches(batch_size):
        try:
            values = session.run(names, batch.inputs)
        except Exception as exc:  # onnxruntime's Fail / InvalidArgument / RuntimeException
            where = batch.sources[0] if len(batch.sources) == 1 else f"{batch.sources[0]} .. {batch.sources[-1]}"
            raise DataError(
                f"onnxruntime failed on {folder.path / where}: {str(exc).strip()}",
                hint="check that this sample is a valid input for the model",
            ) from exc
        for name, value in zip(names, values):
            observer = observers.get(name)
            if observer is None:
                continue
            if not isinstance(value, np.ndarray) or not np.issubdtype(value.dtype, np.floating):
                del observers[name]
                skipped.append(name)
                continue
            observer.update(value, samples=batch.size)
        samples += batch.size
        batches += 1
        if progress is not None:
            progress(batch.size)
    return Collected(observers, samples, batches, skipped)
