"""Upgrade the default-domain opset to 13 (per-channel QuantizeLinear/DequantizeLinear and int8
axes need it), or to 21 when asked (`Options.opset`: per-block weights need DequantizeLinear's
block_size), with `onnx.version_converter`, and raise the IR version to what the opset needs.

At that opset or newer: nothing to do. The conversion runs before the other passes, so what
it adds (e.g. ReduceMean's `axes` as a Constant input from opset 18) is folded like the
model's own constants, and every later stage reads one graph. Where onnx's converter changes
numerics or names, qcli does the conversion itself (checked against onnxruntime running the
original model):
- Upsample (7-9) and Resize-10 meant `asymmetric` coordinates and, in nearest mode, floor
  rounding when upsampling (ceil when downsampling); the converter keeps Resize-11's
  defaults (`half_pixel`, `round_prefer_floor`), and gives the new Resize (and ScatterElements
  for Scatter) new node and output names. These nodes are hidden from the converter in a
  placeholder domain and rewritten here as Resize-13 / ScatterElements, names unchanged.
- Hardmax below 13 flattened the input to 2-D at `axis`; the converter keeps the node as is,
  which now means "along `axis` only": it is rewritten as Flatten -> Hardmax -> Reshape first.
Softmax/LogSoftmax are converted right by onnx (as Flatten -> Softmax -> Reshape when the
input is not 2-D); the Softmax node then writes `<output>_intermediate`, the Reshape the
original output name.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from qcli.errors import ModelError
from qcli.graph import iter_graphs
from qcli.lazy import tensor_array
from qcli.model import max_ir_version
from qcli.prepare._graph import (
    BLOCK_OPSET,
    DEFAULT_DOMAINS,
    TARGET_OPSET,
    NameAllocator,
    Options,
    PassResult,
    is_default_domain,
    label,
    light_copy,
    node_names,
    plural,
    tensor_names,
    tensor_nbytes,
    transplant,
)

_NEEDED_FOR = {BLOCK_OPSET: "per-block weights"}  # why an opset above 13 was asked for, in notes
# Ops onnx's converter replaces by new nodes with new output and node names (breaking the
# names calibration and overrides use); they are converted here instead.
_SET_ASIDE = ("Upsample", "Resize", "Scatter")
PENDING = "qcli.pending"
REEXPORT_HINT = (
    "re-export the model at opset 13 or newer (e.g. torch.onnx.export(..., opset_version=17)), "
    "or upgrade it yourself with onnx.version_converter and pass the result"
)


def _reexport_hint(target: int) -> str:
    if target == BLOCK_OPSET:
        return f"use weights granularity per_channel, or re-export the model at opset {BLOCK_OPSET}"
    return REEXPORT_HINT.replace(f"opset {TARGET_OPSET} ", f"opset {target} ")


def default_opset(model: onnx.ModelProto) -> int | None:
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return entry.version
    return None


def upgrade_opset(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    """Convert a model below `options.opset` (13 by default) to that opset; leave any other
    model alone."""
    old, target = default_opset(model), options.opset
    if old is None or old >= target:
        return PassResult(model)
    _check_ops_exist(model, old, target)
    notes: list[str] = []
    hardmax = _rewrite_hardmax(model)
    if hardmax:
        notes.append(
            f"rewrote {plural(hardmax, 'Hardmax node')} as Flatten -> Hardmax -> Reshape to keep "
            f"the opset-{old} meaning of 'axis'"
        )
    light = light_copy(model)
    _set_aside(light.model, old)
    try:
        converted = version_converter.convert_version(light.model, target)
    except Exception as exc:  # the converter raises RuntimeError / ValidationError / others
        raise _conversion_error(exc, model, old, target) from exc
    transplant(converted, model, light)
    why = _NEEDED_FOR.get(target)
    notes.insert(0, f"upgraded opset {old} -> {target}" + (f" for {why}" if why else ""))
    notes.extend(_finish_set_aside(model, old))
    old_ir = model.ir_version
    needed = helper.find_min_ir_version_for(
        [o for o in model.opset_import if o.domain in DEFAULT_DOMAINS], ignore_unknown=True
    )
    model.ir_version = max(old_ir, min(needed, max_ir_version()))
    if model.ir_version != old_ir:
        notes.insert(1, f"raised the IR version {old_ir} -> {model.ir_version} (opset {target} needs it)")
    return PassResult(model, True, notes)


def _check_ops_exist(model: onnx.ModelProto, version: int, target: int) -> None:
    """The converter fails with an unreadable assertion on ops unknown at the model's opset."""
    for _, graph in iter_graphs(model.graph):
        for node in graph.node:
            if not is_default_domain(node):
                continue
            try:
                onnx.defs.get_schema(node.op_type, version, "")
            except onnx.defs.SchemaError:
                raise ModelError(
                    f"cannot upgrade opset {version} -> {target}: {label(node)} uses "
                    f"'{node.op_type}', which is not a standard ONNX op at opset {version}",
                    hint="the model's opset_import does not match its ops; " + _reexport_hint(target),
                ) from None


def _conversion_error(exc: Exception, model: onnx.ModelProto, version: int, target: int) -> ModelError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\S*convert\.cc:\d+: \w+: ", "", text)  # C++ file/line prefix
    ops = sorted({n.op_type for _, g in iter_graphs(model.graph) for n in g.node}, key=lambda s: (-len(s), s))
    named = next((op for op in ops if re.search(rf"\b{re.escape(op)}", text)), None)
    where = f" on {named}" if named else ""
    return ModelError(
        f"onnx's version converter failed{where} upgrading opset {version} -> {target}: {text}",
        hint=_reexport_hint(target),
    )


def _rank(graph: onnx.GraphProto, name: str) -> int | None:
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    return None


def _rewrite_hardmax(model: onnx.ModelProto) -> int:
    """Hardmax<axis=a>(x) -> Reshape(Hardmax<axis=1>(Flatten<axis=a>(x)), Shape(x)): on a 2-D
    input the old and new meanings agree, so the converter's pass-through is then right."""
    rewritten = 0
    tensors = NameAllocator(tensor_names(model.graph))
    nodes = NameAllocator(node_names(model.graph))
    inferred = None
    for graph in [g for _, g in iter_graphs(model.graph)]:
        for index in reversed(range(len(graph.node))):
            node = graph.node[index]
            if node.op_type != "Hardmax" or not is_default_domain(node):
                continue
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if inferred is None:
                try:
                    inferred = onnx.shape_inference.infer_shapes(light_copy(model).model).graph
                except Exception:  # no ranks known: every Hardmax off the last axis is rewritten
                    inferred = onnx.GraphProto()
            rank = _rank(graph, node.input[0]) or _rank(inferred, node.input[0])
            if axis == -1 or (rank is not None and axis in (rank - 1, -1)):
                continue  # along the last axis both meanings agree
            base = node.name or node.output[0]
            shape, flat, hard = (tensors.fresh(f"{node.output[0]}/{s}") for s in ("shape", "flat", "hardmax"))
            new = [
                helper.make_node("Shape", [node.input[0]], [shape], name=nodes.fresh(f"{base}/Shape")),
                helper.make_node("Flatten", [node.input[0]], [flat], name=nodes.fresh(f"{base}/Flatten"), axis=axis),
                helper.make_node("Hardmax", [flat], [hard], name=node.name, axis=1),
                helper.make_node("Reshape", [hard, shape], [node.output[0]], name=nodes.fresh(f"{base}/Reshape")),
            ]
            del graph.node[index]
            for offset, added in enumerate(new):
                graph.node.insert(index + offset, added)
            rewritten += 1
    return rewritten


def _set_aside(light: onnx.ModelProto, version: int) -> int:
    """Move the ops the converter renames (and, for Resize, gets wrong) out of its reach: they
    go to the `qcli.pending` domain, which it passes through untouched. Returns their count."""
    if version >= 11:  # Upsample, Resize-10 and Scatter only exist below opset 11
        return 0
    count = 0
    for _, graph in iter_graphs(light.graph):
        for node in graph.node:
            if node.op_type in _SET_ASIDE and is_default_domain(node):
                node.domain = PENDING
                count += 1
    if count:
        light.opset_import.append(helper.make_opsetid(PENDING, 1))
    return count


def _finish_set_aside(model: onnx.ModelProto, version: int) -> list[str]:
    """Write the set-aside nodes as their opset-13 equivalents, names unchanged."""
    tensors = NameAllocator(tensor_names(model.graph))
    resized, unsure = 0, []
    for _, graph in iter_graphs(model.graph):
        constants = _constant_values(graph)
        for node in graph.node:
            if node.domain != PENDING:
                continue
            node.domain = ""
            if node.op_type == "Scatter":  # renamed ScatterElements in opset 11, same meaning
                node.op_type = "ScatterElements"
                continue
            resized += 1
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            mode = attrs.get("mode", b"nearest").decode()
            if node.op_type == "Upsample" and "scales" in attrs:  # Upsample-7: an attribute
                scales_name = tensors.fresh(f"{node.output[0]}/scales")
                graph.initializer.append(
                    numpy_helper.from_array(np.array(attrs["scales"], np.float32), scales_name)
                )
                constants[scales_name] = np.array(attrs["scales"], np.float32)
            else:
                scales_name = node.input[1]
            # opset < 11 meant asymmetric coordinates; nearest rounds down when upsampling and
            # up when downsampling (onnxruntime's reference behaviour for these opsets)
            new_attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
            if mode == "nearest":
                scales = constants.get(scales_name)
                if node.op_type == "Upsample" or (scales is not None and np.all(scales >= 1)):
                    new_attrs["nearest_mode"] = "floor"
                elif scales is not None and np.all(scales <= 1):
                    new_attrs["nearest_mode"] = "ceil"
                else:
                    new_attrs["nearest_mode"] = "floor"
                    unsure.append(label(node).replace(node.op_type, "Resize", 1))
            inputs = [node.input[0], "", scales_name]
            del node.input[:]
            node.input.extend(inputs)
            del node.attribute[:]
            node.attribute.extend(helper.make_attribute(k, v) for k, v in new_attrs.items())
            node.op_type = "Resize"
    keep = [o for o in model.opset_import if o.domain != PENDING]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    notes = []
    if resized:
        notes.append(
            f"kept the opset-{version} meaning of {plural(resized, 'Resize/Upsample node')} "
            "(asymmetric coordinates, floor rounding), which onnx's version converter drops"
        )
    for name in unsure:
        notes.append(
            f"{name} has run-time or mixed up/down scales: nearest rounding set to floor, which "
            f"matches opset {version} only on upsampled axes"
        )
    return notes


def _constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and is_default_domain(node):
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
            if tensor is not None:
                values[node.output[0]] = tensor
    return {k: tensor_array(v) for k, v in values.items() if tensor_nbytes(v) < 4096}
