"""Load, fingerprint, save and validate ONNX models.

Every model qcli reads goes through `load_model` (clear errors for missing, truncated or
non-ONNX files; external data resolved beside the model) and every model it writes goes
through `save_model` (atomic: temp files in the target folder, then rename; external data for
models whose protobuf would pass 2 GB) and `check_model` (onnx checker + onnxruntime load).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError, EncodeError
from onnx import helper, numpy_helper

from qcli.errors import InternalError, ModelError
from qcli.files import write_error
from qcli.graph import iter_graphs
from qcli.lazy import all_tensors, defer, deferred, deferred_bytes, inline, tensor_array, tensor_raw

# Protobuf cannot serialise a message over 2 GiB; above this much weight data we write the
# tensors to an external data file instead (the same threshold onnx uses).
PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_DATA_THRESHOLD = 1024  # bytes: tensors at least this big go to the external file


def load_model(path: str | os.PathLike, *, load_external_data: bool = True) -> onnx.ModelProto:
    """Read an ONNX model or raise ModelError saying what is wrong. Its external data stays in
    its files, each tensor read when needed (`qcli.lazy`); `load_external_data=False` leaves the
    references as stored (for the files' names and sizes)."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model file not found: {path}", hint="check the path")
    if path.is_dir():
        raise ModelError(f"{path} is a folder, not an ONNX model file", hint="pass the .onnx file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"cannot read model {path}: {exc.strerror}") from exc
    not_onnx = ModelError(
        f"{path} is not a valid ONNX model (the file is empty, truncated or of another format)",
        hint="re-export the model, or check that the download or copy finished",
    )
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise not_onnx from exc
    # Protobuf happily parses some non-ONNX bytes into a near-empty message: require the
    # fields every real model has (a graph without nodes is valid: its outputs are inputs or
    # initializers, as qcli writes when it folds a model's only Constant).
    if model.ir_version <= 0 or not model.opset_import or not (model.graph.node or model.graph.output):
        raise not_onnx
    if load_external_data:
        defer(model, path.parent, shown_as=path)
    return model


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """Names of the external data files a model (as stored on disk) refers to, sorted."""
    names = set()
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    names.add(entry.value)
    return sorted(names)


class Owned:
    """A model handed over with nothing else holding it (the CLI's, read from its file), to a
    function that may then free its weights once it holds them elsewhere (qcli.verify: lent by
    the prepared model, `qcli.runtime.Loan`). `take()` gives the model and forgets it."""

    def __init__(self, model: onnx.ModelProto):
        self._model: onnx.ModelProto | None = model

    def take(self) -> onnx.ModelProto:
        model, self._model = self._model, None
        if model is None:
            raise ValueError("this model was taken already")
        return model


def without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose main graph has no initializers, made field by field. Copying the
    whole model and deleting them is not the same: protobuf's upb keeps the deleted weights'
    bytes in the copy's arena for as long as the copy lives (ddddocr: 52 MB a copy)."""
    shell = onnx.ModelProto()
    for descriptor, value in model.ListFields():
        if descriptor.name != "graph":
            _copy_field(shell, descriptor, value)
    for descriptor, value in model.graph.ListFields():
        if descriptor.name != "initializer":
            _copy_field(shell.graph, descriptor, value)
    return shell


def _copy_field(target, descriptor, value) -> None:
    repeated = descriptor.is_repeated if hasattr(descriptor, "is_repeated") else (
        descriptor.label == descriptor.LABEL_REPEATED  # protobuf < 5.28
    )
    if repeated:
        getattr(target, descriptor.name).extend(value)
    elif descriptor.type == descriptor.TYPE_MESSAGE:
        getattr(target, descriptor.name).CopyFrom(value)
    else:
        setattr(target, descriptor.name, value)


def fingerprint(model: onnx.ModelProto) -> str:
    """sha256 of the graph and its weights (not of metadata such as producer or doc strings).

    Weights are hashed by name, type, shape and values, so a model hashes the same whether its
    tensors are stored inline or were loaded from external data (as `load_model` does).
    """
    digest = hashlib.sha256()
    for entry in sorted((o.domain, o.version) for o in model.opset_import):
        digest.update(repr(entry).encode())
    graph = model.graph
    for part in (*graph.node, *graph.input, *graph.output, *graph.sparse_initializer, *model.functions):
        digest.update(part.SerializeToString(deterministic=True))
    for tensor in graph.initializer:
        digest.update(f"{tensor.name}|{tensor.data_type}|{list(tensor.dims)}".encode())
        values = np.ascontiguousarray(tensor_array(tensor))
        if values.dtype == object:  # strings: their bytes, not the buffer's pointers
            digest.update(repr(values.ravel().tolist()).encode())
        else:
            digest.update(values.reshape(-1).view(np.uint8).data)  # the bytes themselves: no copy
    return "sha256:" + digest.hexdigest()


@functools.lru_cache(maxsize=1)
def max_ir_version() -> int:
    """The highest IR version the installed onnxruntime loads (probed, not assumed)."""
    import onnxruntime as ort

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for version in range(onnx.IR_VERSION, 6, -1):
        probe.ir_version = version
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception as exc:  # onnxruntime raises its own Fail type
            found = re.search(r"max supported IR version: (\d+)", str(exc))
            if found:
                return int(found.group(1))
    return 7


def clamp_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """Lower the model's IR version to what onnxruntime loads (onnx's helpers write newer)."""
    model.ir_version = min(model.ir_version, max_ir_version())
    return model


def serialized_size(model: onnx.ModelProto) -> int:
    """The model's serialized bytes; past protobuf's 2 GiB, where protobuf (upb) refuses to count
    them (EncodeError "Failed to serialize proto"), at least `PROTOBUF_LIMIT`: the sum of its
    tensors' bytes, a lower bound."""
    try:
        return model.ByteSize()
    except EncodeError:
        return max(PROTOBUF_LIMIT, sum(len(t.raw_data) for t in model.graph.initializer))


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, check: bool = False) -> Path:
    """Write `model` to `path` atomically; big models get their weights in `<name>.data`.

    Everything is first written to a temporary folder beside the target, then renamed into
    place, so an interrupted run never leaves a half-written model under the final name.
    With `check`, the written files must pass `check_model` before they are renamed: a model
    that fails validation never appears under the final name. A failed write is an OutputError.
    """
    path = Path(path)
    try:
        _write_model(model, path, check)
    except OSError as exc:  # check_writable caught the usual causes before the work
        raise write_error(path, exc) from exc
    return path


def _write_model(model: onnx.ModelProto, path: Path, check: bool) -> None:
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    data_name = path.name + ".data"
    external = serialized_size(model) + deferred_bytes(model) > PROTOBUF_LIMIT - 64 * 2**20
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
    try:
        tmp_model = tmpdir / path.name
        if external:
            _write_external(model, tmp_model, data_name)
        else:
            tmp_model.write_bytes(_inlined(model).SerializeToString(deterministic=True))
        if check:
            check_model(tmp_model, shown_as=path)
        if external and (tmp_model.parent / data_name).exists():
            os.replace(tmp_model.parent / data_name, parent / data_name)
        os.replace(tmp_model, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` whole: a copy with its deferred tensors read into it (`qcli.lazy`), else itself."""
    if not deferred_bytes(model):
        return model
    whole = onnx.ModelProto()
    whole.CopyFrom(model)
    for tensor in all_tensors(whole):
        inline(tensor)
    return whole


EXTERNAL_ALIGNMENT = 4096  # a page: onnxruntime maps a tensor at such an offset instead of copying it


def _write_external(model: onnx.ModelProto, tmp_model: Path, data_name: str) -> None:
    """`model` at `tmp_model` with its tensors from EXTERNAL_DATA_THRESHOLD bytes in `data_name`
    beside it, written one at a time: the main graph's weights are never copied into a second
    ModelProto (onnx's save_model with external data copies the whole model first; it also
    refused a location that exists relative to the working directory)."""
    shell = without_initializers(model)
    offset = 0
    with open(tmp_model.parent / data_name, "wb") as data:
        def stored(tensor: onnx.TensorProto) -> onnx.TensorProto:
            nonlocal offset
            raw = _raw(tensor)
            if raw is None:
                whole = onnx.TensorProto()
                whole.CopyFrom(tensor)
                inline(whole)
                return whole
            data.write(bytes(-offset % EXTERNAL_ALIGNMENT))
            offset += -offset % EXTERNAL_ALIGNMENT
            data.write(raw)
            ref = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type,
                                   data_location=onnx.TensorProto.EXTERNAL)
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                ref.external_data.add(key=key, value=value)
            offset += len(raw)
            return ref

        shell.graph.initializer.extend(stored(t) for t in model.graph.initializer)
        for _, graph in list(iter_graphs(shell.graph))[1:]:  # If/Loop/Scan bodies' weights, converted in place
            for i, tensor in enumerate(graph.initializer):
                graph.initializer[i].CopyFrom(stored(tensor))
    for tensor in all_tensors(shell):  # Constant nodes' values
        inline(tensor)
    tmp_model.write_bytes(shell.SerializeToString(deterministic=True))


def _raw(tensor: onnx.TensorProto) -> bytes | None:
    """`tensor`'s bytes as an external file holds them when it has EXTERNAL_DATA_THRESHOLD or
    more, else None."""
    if deferred(tensor):
        raw = tensor_raw(tensor)
    elif tensor.HasField("raw_data"):
        raw = tensor.raw_data
    elif tensor.data_location != onnx.TensorProto.EXTERNAL and tensor.ByteSize() >= EXTERNAL_DATA_THRESHOLD:
        raw = numpy_helper.from_array(tensor_array(tensor), tensor.name).raw_data  # typed fields
    else:
        return None
    return raw if len(raw) >= EXTERNAL_DATA_THRESHOLD else None


def check_model(path: str | os.PathLike, *, shown_as: str | os.PathLike | None = None) -> None:
    """Validate a model qcli wrote: onnx's checker, then an onnxruntime session must load it.
    A failure is qcli's bug (InternalError, exit 3): the input model loaded and ran. Messages
    name `shown_as` (the final path) when checking a temporary file."""
    import onnxruntime as ort

    path = Path(path)
    name = shown_as or path
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise InternalError(f"the model written to {name} fails the ONNX checker: {exc}") from exc
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        if not _loads_as_twin(path):
            raise InternalError(f"onnxruntime cannot load the model written to {name}: {exc}") from exc


def _loads_as_twin(path: Path) -> bool:
    """Whether a model onnxruntime's CPU provider cannot load is a bfloat16 one (no CPU kernels)
    that passes onnx's full type check and whose float32 twin (`qcli.twin.emulated`) loads."""
    import onnxruntime as ort

    from qcli.twin import emulated

    model = onnx.load(str(path))
    if not any(t.data_type == onnx.TensorProto.BFLOAT16 for t in model.graph.initializer) and not any(
            a.name == "to" and a.i == onnx.TensorProto.BFLOAT16 for n in model.graph.node for a in n.attribute):
        return False
    try:
        onnx.checker.check_model(_types_only(model), full_check=True)
        twin = emulated(model)
        return twin is not None and bool(ort.InferenceSession(twin.SerializeToString(),
                                                              providers=["CPUExecutionProvider"]))
    except Exception:  # the type check's or onnxruntime's: the model is not fit either way
        return False


def _types_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the shapes of its outputs and intermediate values inferred again (types
    kept): onnx's full check then checks types, not an exporter's stale output shape (ddddocr
    declares [1, N] for a [T, N, C] output, which onnxruntime merges leniently). An output whose
    shape inference cannot tell (an If's, say) keeps the declared one: the check needs a shape."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for value in out.graph.output:
        value.type.tensor_type.ClearField("shape")
    out = onnx.shape_inference.infer_shapes(out)
    for value, declared in zip(out.graph.output, model.graph.output, strict=True):
        if not value.type.tensor_type.HasField("shape") and declared.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.CopyFrom(declared.type.tensor_type.shape)
    return out


def tensor_from_attribute(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a `Constant` node holds (any of its value attributes), or None."""
    for attr in node.attribute:
        if attr.name == "value":
            return attr.t
        if attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            values = helper.get_attribute_value(attr)
            dtype = np.float32 if "float" in attr.name else np.int64
            return numpy_helper.from_array(np.asarray(values, dtype=dtype), node.output[0])
    return None
