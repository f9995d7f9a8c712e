"""Fill `value_info` with onnx shape inference (non-strict, with data propagation), so later
stages know every tensor's dtype and shape. Never fails: if inference raises, the model is
kept as it was and a note says so.

Inference runs on a light copy of the model (big weights declared by type and shape only),
which works the same for models over 2 GB; the inferred value_info (and graph-output types)
are then copied back, graph by graph. Value_info the exporter wrote is kept when it agrees;
if it contradicts inference, inference is retried without it.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from qcli.data import DataFolder
from qcli.graph import iter_graphs
from qcli.info import tensor_bytes
from qcli.prepare._graph import Options, PassResult, light_copy


def infer_shapes(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    before = _typed(model)
    light = light_copy(model)
    try:
        inferred = _infer(light.model)
    except Exception as first:  # onnx raises InferenceError, ValidationError, RuntimeError...
        for _, graph in iter_graphs(light.model.graph):
            del graph.value_info[:]
        try:
            inferred = _infer(light.model)
        except Exception:
            reason = str(first).strip().splitlines()[0] if str(first).strip() else type(first).__name__
            return PassResult(model, False, [
                f"shape inference failed ({reason[:200]}): later stages see fewer tensor types"
            ])
    added = set(light.added_inputs)
    for (_, target), (_, source) in zip(iter_graphs(model.graph), iter_graphs(inferred.graph), strict=True):
        del target.value_info[:]
        target.value_info.extend(v for v in source.value_info if v.name not in added)
        for mine, theirs in zip(target.output, source.output, strict=True):
            if mine.name == theirs.name:
                mine.type.CopyFrom(theirs.type)
    after = _typed(model)
    gained = len(after - before)
    if not gained:
        return PassResult(model, False, [])
    return PassResult(model, True, [f"shape inference typed {gained} more tensors"])


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)


def _typed(model: onnx.ModelProto) -> set[str]:
    """Tensors whose element type is known (value_info or graph outputs), all graphs."""
    names = set()
    for _, graph in iter_graphs(model.graph):
        for value in (*graph.value_info, *graph.output):
            if value.type.tensor_type.elem_type:
                names.add(value.name)
    return names


def activation_bytes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """Bytes of the main graph's intermediate tensors and outputs for one run with inputs of
    these `shapes`, as shape inference sizes them (tensors it cannot size count 0): an upper
    bound of what the run holds at once, less what onnxruntime's planner reuses. Deterministic:
    what a run's size is chosen on (qcli.holdout)."""
    return sum(tensor_sizes(model, shapes).values())


RUN_BYTES = 64 << 20  # one run's intermediate tensors, at most (but one sample's): `batch_within`


def batch_within(model: onnx.ModelProto, folder: DataFolder, most: int, budget: int = RUN_BYTES) -> int:
    """Samples per run over `folder`: `most`, fewer when one sample's intermediate tensors
    (`activation_bytes` at its first sample's input shapes) pass `budget`; at least one. A
    session keeps the memory of its largest run: the speech-quality CNN's 9 s clips (367 MB of
    tensors each) held 3.1 GB in batches of 32 per session, and a clip's run takes as long per
    sample alone. Verification's probe and `analyze` size their runs so.

    >>> import numpy as np, onnx.parser
    >>> from qcli.data import model_inputs
    >>> m = onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
    ...     g (float[N, 1000] x) => (float[N, 1000] y) { y = Relu(x) }''')
    >>> root = getfixture("tmp_path")
    >>> np.save(root / "0.npy", np.zeros((1, 1000), np.float32))
    >>> folder = DataFolder(root, model_inputs(m))
    >>> batch_within(m, folder, 32), batch_within(m, folder, 32, budget=10_000)
    (32, 2)
    """
    first = next(iter(folder.batches(1)), None)
    if first is None:
        return most
    per_sample = activation_bytes(model, {name: array.shape for name, array in first.inputs.items()})
    return max(1, min(most, budget // max(per_sample, 1)))


def tensor_sizes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Tensor -> its bytes in one run with inputs of these `shapes`, for the main graph's
    intermediate tensors and outputs shape inference can size (none when it fails)."""
    light = light_copy(model).model
    for value in light.graph.input:
        if value.name in shapes:
            value.type.tensor_type.ClearField("shape")
            value.type.tensor_type.shape.dim.extend(
                helper.make_tensor_type_proto(1, shapes[value.name]).tensor_type.shape.dim)
    del light.graph.value_info[:]
    try:
        inferred = _infer(light)
    except Exception:  # onnx raises InferenceError, ValidationError, RuntimeError...
        return {}
    sizes = {}
    for value in (*inferred.graph.value_info, *inferred.graph.output):
        t = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if t.elem_type and t.HasField("shape") and all(d >= 0 for d in dims):
            sizes[value.name] = tensor_bytes(t.elem_type, math.prod(dims))
    return sizes
