"""onnxruntime sessions as qcli runs them: CPU provider, no idle spinning, any model size.

Spinning is off (`session.intra_op.allow_spinning = 0`) because two sessions in one process
(float and quantized, timed alternately) otherwise steal each other's cores: measured 50-200%
slower float timings on a 2-core machine (DESIGN.md §7).

A model holding float16/bfloat16 tensors runs as its float32 twin (`qcli.twin.emulated`): each
value rounded to its 16-bit type as a GPU stores it, which onnxruntime's CPU provider would
otherwise not do (no bfloat16 kernels; float16 run through Casts its optimizer removes). A
model with float8 Q/DQ runs with basic optimizations only: the extended level's Relu +
QuantizeLinear fusion drops a Relu before a float8 QuantizeLinear whose zero point is 0 (fit
for uint8 only; onnxruntime 1.32 on the sample CNN: top-1 agreement 0.19 instead of 1.0).
"""

from __future__ import annotations

import itertools
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import EncodeError

from qcli.errors import InternalError, ModelError
from qcli.info import element_count, tensor_bytes
from qcli.lazy import referenced, relative
from qcli.model import clamp_ir_version, save_model, without_initializers
from qcli.scheme import FLOAT8_TYPES
from qcli.twin import emulated

_INLINE_LIMIT = 2**31 - 256 * 2**20  # models bigger than this go through a temporary file
_HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
SHARED_MIN_BYTES = 1024  # smaller initializers stay in the model: a reference costs about as much


class SharedWeights:
    """Initializers of one float graph held once, as an in-memory external-data file that the
    sessions of the models built from the graph read (`reference`; make_session supplies the
    buffer): the precision search's candidates, mostly float weights copied from one graph, then
    neither copy those weights into their ModelProto nor serialize them nor make onnxruntime
    parse them (ddddocr's 54 MB: ~80 ms serializing and ~60 ms of loading a session, per
    candidate and fold). Such a model is for sessions only: it is never written."""

    _counter = itertools.count()

    def __init__(self, initializers: Iterable[onnx.TensorProto]):
        data = bytearray()  # grown tensor by tensor: no second copy of every weight at once
        self.at: dict[str, tuple[int, int]] = {}  # name -> (offset, length) in the buffer
        for tensor in initializers:
            raw = tensor.raw_data
            if (tensor.data_location == onnx.TensorProto.EXTERNAL or len(raw) < SHARED_MIN_BYTES
                    or tensor.data_type in _HALF_TYPES):  # a 16-bit float runs through its twin (values read)
                continue
            data += bytes(-len(data) % 64)  # aligned as onnxruntime's own external data files are
            self.at[tensor.name] = (len(data), len(raw))
            data += raw
        self.buffer = np.frombuffer(data, np.uint8)
        self.location = f"qcli-shared-{next(self._counter)}.bin"  # never a file: only a key
        _SHARED[self.location] = self

    def reference(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """`tensor` (one of the graph's initializers, unchanged) as a reference into the buffer;
        itself when the buffer does not hold it."""
        if tensor.name not in self.at:
            return tensor
        return _external(tensor, self.location, *self.at[tensor.name])


def _external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> onnx.TensorProto:
    """`tensor`'s name, type and shape, its values at `offset` in the in-memory file `location`."""
    ref = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type,
                           data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        ref.external_data.add(key=key, value=value)
    return ref


_SHARED: weakref.WeakValueDictionary[str, SharedWeights] = weakref.WeakValueDictionary()


class Loan:
    """The float model's main-graph initializers that `lender` (the prepared model) holds byte
    for byte, lent by it: `with Loan(model, prepared.model) as model:` gives a copy of `model`
    whose such initializers are references, and keeps no reference to `model`, so that a
    caller who held the only one frees its weights (the verification's float model: else held
    twice beside the prepared one; the encoder's peak 477 -> 428 MB). A session of the copy
    reads them from a buffer made from the lender's tensors while it loads (`make_session`;
    onnxruntime copies them), so the lender must not change meanwhile. Outside the block the
    references resolve no more: the copy is for the block's sessions and graph reads only
    (`inlined` gives a whole model). A model past `_INLINE_LIMIT` borrows nothing: it loads
    through a file, with no second copy in memory."""

    _counter = itertools.count()

    def __init__(self, model: onnx.ModelProto, lender: onnx.ModelProto):
        theirs = {t.name: t for t in lender.graph.initializer}
        self.lender, self.at, self.size = lender, {}, 0  # name -> (offset, length); the buffer's size
        self.location = f"qcli-lent-{next(self._counter)}.bin"  # never a file: only a key
        for tensor in model.graph.initializer:
            if self.size >= _INLINE_LIMIT:
                break
            length = _same_bytes(tensor, theirs.get(tensor.name))
            if length:
                self.size += -self.size % 64  # aligned as onnxruntime's own external data files are
                self.at[tensor.name] = (self.size, length)
                self.size += length
        if self.size >= _INLINE_LIMIT:  # such a model loads through a file (`make_session`): nothing lent
            self.at, self.size = {}, 0
        light = without_initializers(model) if self.at else model
        if self.at:
            light.graph.initializer.extend(
                _external(t, self.location, *self.at[t.name]) if t.name in self.at else t
                for t in model.graph.initializer)
        self.model: onnx.ModelProto | None = light

    def __enter__(self) -> onnx.ModelProto:
        _LENT[self.location] = self
        model, self.model = self.model, None  # the caller's from here
        assert model is not None, "a Loan is entered once"
        return model

    def __exit__(self, *exc: object) -> None:
        _LENT.pop(self.location, None)

    def buffer(self) -> np.ndarray:
        """The lent tensors' bytes at their offsets (a new buffer: for one session's load)."""
        data = bytearray(self.size)
        for tensor in self.lender.graph.initializer:
            if tensor.name in self.at:
                offset, length = self.at[tensor.name]
                raw = tensor.raw_data
                if len(raw) != length:
                    raise InternalError(f"the prepared model's {tensor.name!r} changed while it lent its bytes")
                data[offset:offset + length] = raw
        return np.frombuffer(data, np.uint8)


def _same_bytes(tensor: onnx.TensorProto, other: onnx.TensorProto | None) -> int:
    """The length of `tensor`'s bytes when `other` holds its values the same way (both inline
    raw bytes, from SHARED_MIN_BYTES; the same type, shape and bytes), else 0."""
    if other is None or onnx.TensorProto.EXTERNAL in (tensor.data_location, other.data_location) or (
            tensor.data_type != other.data_type or list(tensor.dims) != list(other.dims)):
        return 0
    raw = tensor.raw_data
    return len(raw) if len(raw) >= SHARED_MIN_BYTES and raw == other.raw_data else 0


_LENT: dict[str, Loan] = {}  # the loans whose block runs (`Loan.__enter__`)


def _locations(model: onnx.ModelProto) -> list[str]:
    """The in-memory files the model's main-graph initializers reference, sorted."""
    return sorted({e.value for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                   for e in t.external_data if e.key == "location"})


def inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its lent initializers (`Loan`) inline again: a whole model, for another
    process (qcli.precision.trials' workers); `model` itself when it has none."""
    loans = [_LENT[name] for name in _locations(model) if name in _LENT]
    if not loans:
        return model
    lent = {t.name: t for loan in loans for t in loan.lender.graph.initializer if t.name in loan.at}
    whole = without_initializers(model)
    whole.graph.initializer.extend(lent.get(t.name, t) for t in model.graph.initializer)
    return whole


class SharedStore:
    """The float initializers of one graph that lean builds keep, each put in a `SharedWeights`
    buffer the first time a build keeps it (one buffer per build that adds any) and referenced
    from there after: a search whose candidates quantize most weights holds only what they keep
    float, not every weight again (the encoder's lean builds keep 0.1 of its 69 MB). A tensor's
    reference never changes once made, so a model built twice serializes the same."""

    def __init__(self) -> None:
        self._offered: set[str] = set()
        self._holder: dict[str, SharedWeights] = {}  # holds the buffers: the lean models' sessions read them

    def references(self, tensors: list[onnx.TensorProto]) -> list[onnx.TensorProto]:
        """`tensors` (initializers of the graph, unchanged), each as a reference into a buffer
        when one holds it or it is added now; itself when it is not held (small, external,
        16-bit float: `SharedWeights`)."""
        new = [t for t in tensors if t.name not in self._offered]
        if new:
            self._offered.update(t.name for t in new)
            part = SharedWeights(new)
            self._holder.update(dict.fromkeys(part.at, part))
        return [self._holder[t.name].reference(t) if t.name in self._holder else t for t in tensors]

    @property
    def held(self) -> set[str]:
        """The names of the tensors the buffers hold."""
        return set(self._holder)


def _in_memory(model: onnx.ModelProto) -> tuple[list[str], list[np.ndarray]]:
    """The in-memory files the model's initializers reference (`SharedWeights`, `Loan`) and
    their buffers, for a session's load."""
    locations = [name for name in _locations(model) if name in _SHARED or name in _LENT]
    return locations, [_SHARED[n].buffer if n in _SHARED else _LENT[n].buffer() for n in locations]


def session_options(threads: int | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Fatal only: warnings (unused initializers) are noise, and an error of a run comes back as
    # the exception qcli turns into its message (naming the file); onnxruntime's own log line
    # of it printed the same text again, before the message, in red.
    options.log_severity_level = 4
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options


def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(tensor_bytes(t.data_type, element_count(t.dims)) for t in model.graph.initializer)


def _holds_float8(model: onnx.ModelProto) -> bool:
    """Whether the model has float8 Q/DQ (float8 zero points or weights)."""
    return any(t.data_type in FLOAT8_TYPES for t in model.graph.initializer)


def _serialized(model: onnx.ModelProto) -> bytes | None:
    """The model's bytes, None past what onnxruntime takes in memory. One serialization: the
    protobuf's ByteSize costs as much as serializing (upb), and trials make many sessions."""
    try:
        data = model.SerializeToString()
    except EncodeError:  # protobuf refuses messages of 2 GiB and more
        return None
    return data if len(data) < _INLINE_LIMIT else None


#: Inline weights (bytes) from which a session loads them from a temporary buffer (`_weights_aside`)
ASIDE_MIN_BYTES = 1 << 20


def _weights_aside(model: onnx.ModelProto) -> tuple[onnx.ModelProto, SharedWeights | None]:
    """`model` with its main graph's inline weights as references into a new in-memory buffer,
    and the buffer; `(model, None)` below ASIDE_MIN_BYTES, and from `_INLINE_LIMIT` (such a
    model loads through a file, as before: no second copy in memory). onnxruntime copies the
    weights when it loads them, so the buffer is dropped once the session exists, and the load
    neither serializes them nor parses them as protobuf (faster, and a lower peak while it
    loads: docs/benchmarks.md, exported.py). The outputs are the same bits (the same tensors)."""
    inline = [t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    size = sum(tensor_bytes(t.data_type, element_count(t.dims)) for t in inline)
    if not ASIDE_MIN_BYTES <= size < _INLINE_LIMIT:  # past it, through a file as before: no copy in memory
        return model, None
    weights = SharedWeights(inline)
    if not weights.at:
        return model, None
    lean = without_initializers(model)
    lean.graph.initializer.extend([weights.reference(t) for t in model.graph.initializer])
    return lean, weights


#: Weights (bytes) from which a pass over data (`make_session(pass_only=True)`) leaves them unpacked
UNPACKED_BYTES = 256 << 20


def make_session(
    model: onnx.ModelProto | str | Path, threads: int | None = None, profile: str | Path | None = None,
    timing: bool = False, optimized: Path | None = None, pass_only: bool = False, frugal: bool = False,
    one_shape: bool = False,
) -> ort.InferenceSession:
    """An onnxruntime CPU session for a ModelProto (kept in memory when it fits) or a path.
    `profile`: a file-name prefix; the session then records onnxruntime's profile there
    (`session.end_profiling()` writes it and returns its path). `timing`: the session times the
    model (a float16/bfloat16 model's twin computes in float32 without rounding, as CPU does).
    `optimized`: where onnxruntime writes the graph it runs, after its fusions (weights past
    1 KB in a `.data` file beside it). `pass_only`: a session for a pass over data, never timed:
    past UNPACKED_BYTES of weights onnxruntime does not pack them for its kernels. A packed copy
    is made per session and outlives it: each new session of a 1.47 GB decoder after another
    had run peaked at 2.75 GB; unpacked, the weights stay the file's pages (1.34 GB), the pass
    12% slower. `frugal`: a session for one pass, never timed nor kept: no memory arena and no
    memory pattern, whose blocks, planned per input shape, outlive the run (nakdimon's sentences
    of 12-52 characters, a pattern each: its peak 500 -> 368-392 MB with the float reference's
    session not kept, wall unchanged). `one_shape`: every run of the frugal session has the same
    input shapes, so its one memory pattern is planned: without one onnxruntime allocates each
    tensor apart, and glibc held 1.85 GB after 64 runs of the layout detector's 608 x 800 pages
    (221 MB with it; a pass over the text detector's 64 pages 2.2 -> 1.4 s)."""
    options = session_options(threads)
    if frugal:
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = one_shape
    if pass_only and isinstance(model, onnx.ModelProto) and _weight_bytes(model) >= UNPACKED_BYTES:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                          optimized.name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    if isinstance(model, onnx.ModelProto) and _holds_float8(model):
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    providers = ["CPUExecutionProvider"]
    if isinstance(model, onnx.ModelProto):
        model = emulated(model, rounding=not timing) or model  # float16/bfloat16 nodes: a float32 twin
    try:
        if isinstance(model, (str, Path)):
            return ort.InferenceSession(str(model), options, providers=providers)
        return _session_of(model, options, providers)
    except ModelError:
        raise
    except Exception as exc:  # onnxruntime's Fail / InvalidGraph / NotImplemented
        raise ModelError(
            f"onnxruntime cannot load the model: {str(exc).strip()}",
            hint="check that the model runs in onnxruntime on its own",
        ) from exc


def _session_of(model: onnx.ModelProto, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """A session of the in-memory `model`: from its bytes, its weights left in the user's file
    read by onnxruntime from there (qcli.lazy), or through a temporary file past what
    onnxruntime takes in memory."""
    model, aside = _weights_aside(model)  # noqa: F841 - held until the session has copied it
    locations, buffers = _in_memory(model)  # held until the session has copied them
    ir_version = model.ir_version
    clamp_ir_version(model)  # onnx's helpers may write an IR newer than onnxruntime loads
    try:
        with relative(model) as folder:
            data = _serialized(model)
        if folder is not None and locations:  # onnxruntime then looks for every file among those in memory
            files = sorted({Path(p).name for p in referenced(model)})
            locations += files
            buffers += [np.memmap(Path(folder) / name, np.uint8, mode="r") for name in files]
        elif folder is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        if locations:
            options.add_external_initializers_from_files_in_memory(locations, buffers, [len(b) for b in buffers])
        if data is not None:
            return _without_bytes(ort.InferenceSession(data, options, providers=providers))
        with tempfile.TemporaryDirectory(prefix="qcli-") as tmp:
            path = save_model(model, Path(tmp) / "model.onnx")
            return ort.InferenceSession(str(path), options, providers=providers)
    finally:
        model.ir_version = ir_version


def _without_bytes(session: ort.InferenceSession) -> ort.InferenceSession:
    """`session` without onnxruntime's Python-side copy of the serialized model, which it keeps
    only to create the session again on another provider (qcli runs on CPU alone): the float
    reference session of ddddocr held 52 MB of it for the whole verification."""
    if hasattr(session, "_model_bytes"):
        session._model_bytes = None
    return session
