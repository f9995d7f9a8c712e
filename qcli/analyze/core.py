"""`analyze`: run the float and the quantized model over a data folder and measure everything.

One pass over the data, one batch at a time. Per batch:
- both models as they are (the quantized one with its fused int8 kernels) give the outputs for
  accuracy (labels), fidelity to the float model and agreement with reference outputs;
- copies of both models with every quantized activation added as a graph output give the
  per-layer SQNR (running sums of signal² and noise² per tensor; the arrays die with the batch).
  Copies, because extra outputs stop onnxruntime's Q/DQ fusion: the accuracy must come from the
  model as deployed.
Then latency (alternating timed runs, latency.py) and size. Nothing is printed; errors are
QcliError subclasses naming the file or input at fault.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qcli import __version__
from qcli.analyze.confidence import z_of
from qcli.analyze.decode import time_decode
from qcli.analyze.gates import Gates, check_gates
from qcli.analyze.kinds import Kind, OutputKind, check_outputs, output_kinds
from qcli.analyze.latency import measure, timed_inputs
from qcli.analyze.layers import QuantizedTensor, quantized_tensors
from qcli.analyze.metrics import FidelityAccumulator, SqnrAccumulator, TopKAccumulator, as_array
from qcli.analyze.options import AnalyzeOptions
from qcli.analyze.pairing import check_compatible
from qcli.analyze.predicted import predicted as predicted_by
from qcli.analyze.records import accuracy_record, fidelity_record, layer_record
from qcli.analyze.report import (
    DataInfo,
    Decode,
    Layers,
    Memory,
    ModelInfo,
    ModelSize,
    Predicted,
    ReferenceFidelity,
    Report,
    Settings,
    Speed,
)
from qcli.analyze.size import compare_sizes, model_size, proto_size
from qcli.calibrate.collect import RUN_OUTPUT_BYTES, RunSize, parts, prefetch, session_with_outputs
from qcli.config import Verify
from qcli.data import Batch, DataFolder, InputSpec, Reading, model_inputs
from qcli.errors import DataError, ModelError, QcliError
from qcli.model import external_data_files, fingerprint, load_model
from qcli.prepare.shapes import RUN_BYTES, batch_within
from qcli.runtime import make_session
from qcli.twin import holds_half

ModelArg = str | Path | onnx.ModelProto


@dataclass
class _Model:
    proto: onnx.ModelProto
    path: Path | None  # None: given in memory
    stored: onnx.ModelProto  # as on disk (external data not loaded), for the size

    @property
    def label(self) -> str:
        return str(self.path) if self.path else "<in memory>"

    def session(self, threads: int | None):
        """From the file; a float16/bfloat16 model from its proto, which runs as its float32
        twin (qcli.twin: onnxruntime's CPU provider lacks most half kernels, bfloat16 Resize...)."""
        return make_session(self.path if self.path and not holds_half(self.proto) else self.proto, threads)

    def size(self) -> ModelSize:
        return model_size(self.path, self.stored) if self.path else proto_size(self.proto)


def _load(model: ModelArg) -> _Model:
    if isinstance(model, onnx.ModelProto):
        return _Model(model, None, model)
    path = Path(model)
    stored = load_model(path, load_external_data=False)
    proto = load_model(path) if external_data_files(stored) else stored
    return _Model(proto, path, stored)


def analyze(
    float_model: ModelArg,
    quantized_model: ModelArg,
    data: str | Path,
    options: AnalyzeOptions | None = None,
    *,
    labels: str | Path | None = None,
    gates: Gates = Gates(),
    reading: Reading | None = None,
    progress: Callable[[int], None] | None = None,
    verify: Verify | None = None,
    deployment: Any = None,
    **settings: Any,
) -> Report:
    """Compare `quantized_model` with `float_model` over the data folder `data`.

    `options` says what to measure and how long (`AnalyzeOptions`: samples, batch size, latency
    runs, per-layer pass...); its fields may also be given as keywords (`runs=0`), laid over it.
    `labels` is a labels.csv (`file,label`) kept outside the data folder; `progress(n)` is called
    after each batch with its number of samples. Models may be paths or in-memory ModelProtos
    (sizes are then the serialized sizes). Each output is compared by the metric of its kind
    (qcli.analyze.kinds, decided on the first batch), `verify.outputs` and `ctc_blank` first.
    `deployment` (qcli.target.deployment): the latency predicted for its target is reported and,
    unless it says measured, is what `min_speedup` gates on.
    """
    opts = AnalyzeOptions.of(options, **settings)
    predicts = deployment is not None and not deployment.measured
    if gates.min_speedup is not None and opts.runs == 0 and not predicts:
        raise QcliError("the min_speedup gate needs latency runs", hint="set runs to at least 1 (default 50)")
    fm, qm = _load(float_model), _load(quantized_model)
    inputs = check_compatible(fm, qm)
    folder = open_data(data, inputs, labels=labels, reading=reading, samples=opts.samples)
    if verify is not None:
        check_outputs(fm.proto, verify.outputs)
    asked = opts.batch_size
    opts = opts.model_copy(update={"batch_size": batch_within(fm.proto, folder, asked)})
    sessions = _Sessions.open(fm, qm, inputs, opts, verify or Verify())
    first = _one_pass(sessions, folder, opts.batch_size, progress)
    notes = sessions.measures.notes()
    if opts.batch_size < asked:
        notes.append(f"batches of {opts.batch_size} sample(s), not {asked}: a run's intermediate tensors are kept "
                     f"under {RUN_BYTES >> 20} MB (shape inference's sizes); the figures do not depend on the batch")
    if opts.layers and not sessions.measures.pairs:
        notes.append(f"{qm.label} has no quantized activations (QuantizeLinear -> DequantizeLinear pairs)")
    speed, decode, latency_notes = _latency(sessions, first, inputs, opts)
    predicted, memory = predicted_by(fm.proto, qm.proto, first, inputs, deployment) if predicts else (None, None)
    return _report(sessions, folder, labels, opts, gates, speed, notes + latency_notes, predicted, decode, memory)


def evaluate(
    float_model: ModelArg,
    quantized_model: ModelArg,
    data: str | Path,
    *,
    labels: str | Path | None = None,
    samples: int | None = None,
    batch_size: int = 32,
    threads: int | None = None,
    max_accuracy_drop: float | None = None,
    reading: Reading | None = None,
    progress: Callable[[int], None] | None = None,
    verify: Verify | None = None,
) -> Report:
    """The accuracy part only (no latency, no per-layer pass): for `qcli quantize --eval-data`.

    Accepts the models in memory, so `quantize` can check its result before writing it.
    """
    options = AnalyzeOptions.of(samples=samples, batch_size=batch_size, runs=0, warmup=0, threads=threads, layers=False)
    return analyze(
        float_model, quantized_model, data, options, labels=labels, gates=Gates(max_accuracy_drop=max_accuracy_drop),
        reading=reading, progress=progress, verify=verify,
    )


def sample_count(
    float_model: str | Path, data: str | Path, *, samples: int | None = None, reading: Reading | None = None
) -> int:
    """How many samples `analyze` will read (for a progress bar's total); reads only headers."""
    model = load_model(float_model, load_external_data=False)
    return len(DataFolder(data, model_inputs(model), reading=reading, samples=samples))


# --------------------------------------------------------------------------- the pass


@dataclass
class _Sessions:
    """The sessions of one analysis and the running sums they feed. `plain_*` run the models as
    deployed (fused int8 kernels: the accuracy); `layers_*` return every quantized activation
    too (the per-layer SQNR), None when there is none to return."""

    fm: _Model
    qm: _Model
    plain_f: Any
    plain_q: Any
    layers_f: Any
    layers_q: Any
    measures: _Measures
    skipped: list

    @classmethod
    def open(cls, fm: _Model, qm: _Model, inputs: list[InputSpec], opts: AnalyzeOptions, verify: Verify) -> _Sessions:
        plain_f, plain_q = fm.session(opts.threads), qm.session(opts.threads)
        pairs, skipped = quantized_tensors(fm.proto, qm.proto) if opts.layers else ([], [])
        measures = _Measures(fm.proto, pairs, {s.name for s in inputs}, qm.label, verify)
        layers_f = session_with_outputs(fm.proto, measures.from_graph, opts.threads) if measures.from_graph else None
        layers_q = session_with_outputs(qm.proto, measures.quantized_names, opts.threads) if pairs else None
        return cls(fm, qm, plain_f, plain_q, layers_f, layers_q, measures, skipped)

    def add_outputs(self, batch: Batch, where: str) -> None:
        names = self.measures.outputs
        self.measures.add_outputs(
            batch, where,
            dict(zip(names, _run(self.plain_f, names, batch.inputs, where, self.fm), strict=True)),
            dict(zip(names, _run(self.plain_q, names, batch.inputs, where, self.qm), strict=True)),
        )

    def add_layers(self, part: Batch, where: str, size: RunSize) -> None:
        m = self.measures
        f_values = _run(self.layers_f, m.from_graph, part.inputs, where, self.fm) if self.layers_f else []
        q_values = _run(self.layers_q, m.quantized_names, part.inputs, where, self.qm)
        size.note([*f_values, *q_values], part.size)
        m.add_layers(part, where, f_values, q_values)


def _one_pass(
    sessions: _Sessions, folder: DataFolder, batch_size: int, progress: Callable[[int], None] | None
) -> Batch:
    """Feed every batch to both models and the measures; the first batch (for latency)."""
    first: Batch | None = None
    # The per-layer pass returns every quantized activation of both models: a batch's worth
    # is run in parts of at most RUN_OUTPUT_BYTES (`RunSize`, as calibration does). A
    # BERT-base's 483 activations at batch 32 took analyze to a 9.5 GB peak in whole batches.
    layer_size = RunSize(RUN_OUTPUT_BYTES)
    # A background thread reads and batches the next samples while onnxruntime runs.
    stream = prefetch(folder.batches(batch_size))
    try:
        for batch in stream:
            where = _where(folder, batch)
            sessions.add_outputs(batch, where)
            for part in parts(batch, layer_size) if sessions.measures.pairs else ():
                sessions.add_layers(part, where, layer_size)
            if first is None:
                first = batch
            if progress is not None:
                progress(batch.size)
    finally:
        stream.close()
    sessions.layers_f = sessions.layers_q = None  # their memory is not needed for the timed runs
    if first is None:
        raise DataError(f"no samples in {folder.path}")
    return first


def _latency(
    sessions: _Sessions, first: Batch, inputs: list[InputSpec], opts: AnalyzeOptions
) -> tuple[Speed | None, Decode | None, list[str]]:
    """Alternating timed runs of both models on the first `latency_batch` samples, and of a
    decoder's decode step after them (qcli.analyze.decode); notes."""
    if not opts.runs:
        return None, None, []
    feeds, batch = timed_inputs(first, inputs, opts.latency_batch)
    notes = []
    if batch != opts.latency_batch:
        notes.append(f"latency timed at batch {batch}: the model's inputs have a fixed batch dimension")
    for which, session in (("float", sessions.plain_f), ("quantized", sessions.plain_q)):
        _runs_at(session, feeds, which, batch, first.size)
    speed = measure(
        lambda: sessions.plain_f.run(None, feeds), lambda: sessions.plain_q.run(None, feeds),
        runs=opts.runs, warmup=opts.warmup, batch=batch, threads=opts.threads,
    )
    decode = time_decode(sessions.plain_f, sessions.plain_q, feeds, runs=opts.runs, warmup=opts.warmup,
                         batch=batch, threads=opts.threads)
    return speed, decode, notes


def _runs_at(session: Any, feeds: dict[str, np.ndarray], which: str, batch: int, samples: int) -> None:
    """One run of the `which` model on the timed feeds; ModelError when it cannot run at that
    batch (an exporter may have fixed the batch size inside the graph), before any timing."""
    try:
        session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's Fail / InvalidArgument / RuntimeException
        why = ("it fails as given, before any change by qcli: it may fix its batch size inside the graph (a "
               "Reshape to the export-time shape)" if which == "float" else "the float model runs at this batch")
        raise ModelError(
            f"the {which} model cannot run at latency batch {batch} (analyze.latency_batch, --latency-batch): "
            f"onnxruntime: {str(exc).strip()}",
            hint=f"{why}; time both at the batch the samples come in: --latency-batch {samples}",
        ) from exc


def _report(
    sessions: _Sessions, folder: DataFolder, labels: str | Path | None, opts: AnalyzeOptions, gates: Gates,
    speed: Speed | None, notes: list[str], predicted: Predicted | None = None, decode: Decode | None = None,
    memory: Memory | None = None,
) -> Report:
    """The measures summed up, sizes compared and gates checked."""
    m, fm, qm = sessions.measures, sessions.fm, sessions.qm
    accuracy = accuracy_record(m.class_output, m.topk)
    fidelity = [fidelity_record(n, acc) for n, acc in m.fidelity.items()]
    reference = [ReferenceFidelity(n, fidelity_record(n, a), fidelity_record(n, b))
                 for n, (a, b) in m.reference.items()]
    layers = Layers([layer_record(p, m.layers[p.tensor]) for p in m.pairs], sessions.skipped) if opts.layers else None
    notes = notes + [f"output {f.output!r}: {f.nonfinite} NaN/Inf values left out of SQNR and cosine"
                     for f in fidelity if f.nonfinite]
    notes += [f"tensor {t.tensor!r}: {t.nonfinite} NaN/Inf values left out of its SQNR"
              for t in (layers.tensors if layers else []) if t.nonfinite]
    size = compare_sizes(fm.size(), qm.size())
    return Report(
        float_model=ModelInfo(fm.label, fingerprint(fm.proto)),
        quantized_model=ModelInfo(qm.label, fingerprint(qm.proto), _quantization_metadata(qm.proto)),
        data=DataInfo(
            path=str(folder.path), layout=folder.layout, samples=m.samples, labelled=m.labelled,
            labels_file=str(labels) if labels is not None else None, batch_size=opts.batch_size,
            reference_outputs=bool(m.reference),
        ),
        settings=Settings(**opts.model_dump()),
        accuracy=accuracy,
        fidelity=fidelity,
        reference=reference,
        layers=layers,
        speed=speed,
        size=size,
        gates=check_gates(gates, accuracy, fidelity, speed, size, predicted, decode, memory),
        notes=notes,
        qcli_version=__version__,
        predicted=predicted,
        decode=decode,
        memory=memory,
    )


class _Measures:
    """The running sums of one pass: fidelity per output, top-k against labels, agreement with
    reference outputs, SQNR per quantized activation. Fed one batch at a time."""

    def __init__(self, model: onnx.ModelProto, pairs: list[QuantizedTensor], float_inputs: set[str], quantized: str,
                 verify: Verify):
        self.model, self.verify = model, verify
        self.outputs = [o.name for o in model.graph.output]
        self.kinds: dict[str, OutputKind] = {}
        self.pairs = pairs
        self.from_graph = [p.tensor for p in pairs if p.tensor not in float_inputs]  # not fed
        self.quantized_names = [p.quantized_tensor for p in pairs]
        self.quantized = quantized
        self.fidelity: dict[str, FidelityAccumulator] = {}
        self.reference: dict[str, tuple[FidelityAccumulator, FidelityAccumulator]] = {}
        self.layers = {p.tensor: SqnrAccumulator() for p in pairs}
        self.class_output: str | None = None
        self.topk: tuple[TopKAccumulator, TopKAccumulator] | None = None
        self.samples = 0
        self.had_reference = self.unusable_labels = False

    @property
    def labelled(self) -> int:
        return self.topk[0].samples if self.topk else 0

    def add_outputs(self, batch: Batch, where: str, f_out: dict, q_out: dict) -> None:
        if self.samples == 0:  # the first batch decides each output's kind, and which holds class scores
            values = {n: [np.asarray(f_out[n])] for n in self.outputs}
            self.kinds = output_kinds(self.model, values, self.verify.outputs, self.verify.ctc_blank,
                                      self.verify.sequence_trim, self.verify.thresholds)
            z = z_of(self.verify.confidence)
            self.fidelity = {n: FidelityAccumulator(self.kinds[n], z=z) for n in self.outputs}
            self.class_output = next((n for n in self.outputs if self.kinds[n].kind is Kind.TOP1), None)
            if self.class_output is not None:
                classes = int(np.asarray(f_out[self.class_output]).shape[1])
                self.topk = (TopKAccumulator(classes), TopKAccumulator(classes))
        self.samples += batch.size
        for name in self.outputs:
            try:
                self.fidelity[name].update(f_out[name], q_out[name], batch.size, batch.inputs)
            except ValueError as exc:
                raise ModelError(
                    f"output {name!r} of {self.quantized} does not match the float model's on {where}: {exc}",
                    hint="compare the quantized model with the float model it was made from",
                ) from exc
        if batch.label is not None:
            self._add_labels(batch.label, where, f_out, q_out)
        if batch.outputs:
            self.had_reference = True
            for name, ref in _reference_outputs(batch.outputs, self.outputs).items():
                kind = self.kinds.get(name)
                pair = self.reference.setdefault(name, (FidelityAccumulator(kind), FidelityAccumulator(kind)))
                for acc, out in zip(pair, (f_out[name], q_out[name]), strict=True):
                    try:
                        acc.update(ref, out, batch.size)
                    except ValueError as exc:
                        raise DataError(f"{where}: reference output {name!r} does not fit the model's: {exc}") from exc

    def _add_labels(self, labels: np.ndarray, where: str, f_out: dict, q_out: dict) -> None:
        if self.topk is None:
            self.unusable_labels = True
            return
        name, classes = self.class_output, self.topk[0].classes
        scores = np.asarray(f_out[name])
        if scores.shape[0] != labels.shape[0]:
            raise DataError(f"{where}: {labels.shape[0]} labels for {scores.shape[0]} rows of output {name!r}")
        bad = labels[(labels < 0) | (labels >= classes)]
        if bad.size:
            raise DataError(
                f"{where}: label {int(bad[0])} is out of range for output {name!r} ({classes} classes)",
                hint="labels are class indices 0..C-1 of the model's class-score output",
            )
        self.topk[0].update(scores, labels)
        self.topk[1].update(np.asarray(q_out[name]), labels)

    def add_layers(self, batch: Batch, where: str, float_values: list, quantized_values: list) -> None:
        values = dict(zip(self.from_graph, float_values, strict=True))
        values.update({k: v for k, v in batch.inputs.items() if k in self.layers})
        for p, q in zip(self.pairs, quantized_values, strict=True):
            try:
                self.layers[p.tensor].update(values[p.tensor], q)
            except ValueError as exc:
                raise ModelError(
                    f"{self.quantized}: tensor {p.quantized_tensor!r} does not match the float model's "
                    f"{p.tensor!r} on {where}: {exc}"
                ) from exc

    def notes(self) -> list[str]:
        notes = []
        if self.unusable_labels:
            notes.append("the data has labels but no output holds class scores ([N, C] float): no top-1")
        if self.topk and 0 < self.labelled < self.samples:
            notes.append(f"{self.labelled} of {self.samples} samples have labels: accuracy counts those")
        if self.class_output is None:
            notes.append("no class-score output ([N, C] float, C >= 2): no top-1 agreement")
        if self.had_reference and not self.reference:
            notes.append("the reference outputs match no model output by name or position: not used")
        return notes


# --------------------------------------------------------------------------- data


def open_data(
    data: str | Path, inputs: list[InputSpec], *, labels: str | Path | None = None,
    reading: Reading | None = None, samples: int | None = None,
) -> DataFolder:
    """The data folder, with labels from `labels` (a labels.csv kept elsewhere) when given."""
    return DataFolder(data, inputs, reading=reading, samples=samples, labels=labels)


def _where(folder: DataFolder, batch: Batch) -> str:
    s = batch.sources
    return str(folder.path / s[0]) if len(s) == 1 else f"{folder.path / s[0]} .. {s[-1]}"


def _reference_outputs(refs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Reference outputs keyed by model output name: by name when they carry the model's names,
    else by position (output_0.pb is the first output)."""
    if all(k in names for k in refs):
        return dict(refs)
    if len(refs) <= len(names):
        return {names[i]: v for i, v in enumerate(refs.values())}
    return {}


def _run(session, names: list[str], feeds: dict[str, np.ndarray], where: str, model: _Model) -> list:
    try:
        return [as_array(v) for v in session.run(names, feeds)]
    except Exception as exc:  # onnxruntime's Fail / InvalidArgument / RuntimeException
        raise DataError(
            f"onnxruntime failed running {model.label} on {where}: {str(exc).strip()}",
            hint="check that this sample is a valid input for the model",
        ) from exc


def _quantization_metadata(model: onnx.ModelProto) -> dict | None:
    meta = {p.key: p.value for p in model.metadata_props}
    found = {}
    for key in ("qcli.version", "qcli.config", "qcli.calibration"):
        if key in meta:
            try:
                found[key.removeprefix("qcli.")] = json.loads(meta[key]) if key != "qcli.version" else meta[key]
            except json.JSONDecodeError:
                found[key.removeprefix("qcli.")] = meta[key]
    return found or None
