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

import numpy as np
import onnx

from qcli import __version__
from qcli.analyze.gates import Gates, check_gates
from qcli.analyze.latency import measure, timed_inputs
from qcli.analyze.layers import QuantizedTensor, quantized_tensors
from qcli.analyze.metrics import FidelityAccumulator, SqnrAccumulator, TopKAccumulator, as_array, is_class_scores
from qcli.analyze.report import (
    Accuracy,
    ClassAccuracy,
    DataInfo,
    Fidelity,
    LayerError,
    Layers,
    ModelInfo,
    ReferenceFidelity,
    Report,
    Settings,
    rounded,
)
from qcli.analyze.size import compare_sizes, model_size, proto_size
from qcli.calibrate.collect import RUN_OUTPUT_BYTES, RunSize, parts, prefetch, session_with_outputs
from qcli.data import Batch, DataFolder, InputSpec, Preprocess, model_inputs
from qcli.errors import DataError, ModelError, QcliError
from qcli.model import external_data_files, fingerprint, load_model
from qcli.runtime import make_session

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
        return make_session(self.path if self.path else self.proto, threads)


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
    *,
    labels: str | Path | None = None,
    samples: int | None = None,
    batch_size: int = 32,
    runs: int = 50,
    warmup: int = 5,
    threads: int | None = None,
    latency_batch: int = 1,
    worst: int = 10,
    gates: Gates = Gates(),
    preprocess: Preprocess | None = None,
    layers: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Report:
    """Compare `quantized_model` with `float_model` over the data folder `data`.

    `labels` is a labels.csv (`file,label`) kept outside the data folder; `samples` keeps the
    first N samples; `runs` timed runs per model (0 skips latency), after `warmup` untimed ones,
    on `latency_batch` samples with `threads` intra-op threads (None: onnxruntime's default);
    `worst` is how many layers the reports list; `layers=False` skips the per-layer pass;
    `progress(n)` is called after each batch with its number of samples.
    Models may be paths or in-memory ModelProtos (sizes are then the serialized sizes).
    """
    for name, value, least in (("batch_size", batch_size, 1), ("runs", runs, 0), ("warmup", warmup, 0),
                               ("latency_batch", latency_batch, 1), ("worst", worst, 0)):
        if value < least:
            raise QcliError(f"{name} must be at least {least}, got {value}")
    if threads is not None and threads < 1:
        raise QcliError(f"threads must be at least 1, got {threads}")
    if gates.min_speedup is not None and runs == 0:
        raise QcliError("the min_speedup gate needs latency runs", hint="set runs to at least 1 (default 50)")

    fm, qm = _load(float_model), _load(quantized_model)
    inputs = _check_compatible(fm, qm)
    folder = open_data(data, inputs, labels=labels, preprocess=preprocess, samples=samples)

    plain_f, plain_q = fm.session(threads), qm.session(threads)
    pairs, skipped = quantized_tensors(fm.proto, qm.proto) if layers else ([], [])
    measures = _Measures([o.name for o in fm.proto.graph.output], pairs, {s.name for s in inputs}, qm.label)
    aug_f = aug_q = None
    if measures.from_graph:
        aug_f = session_with_outputs(fm.proto, measures.from_graph, threads)
    if pairs:
        aug_q = session_with_outputs(qm.proto, [p.quantized_tensor for p in pairs], threads)

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
            names = measures.outputs
            measures.add_outputs(
                batch, where,
                dict(zip(names, _run(plain_f, names, batch.inputs, where, fm))),
                dict(zip(names, _run(plain_q, names, batch.inputs, where, qm))),
            )
            for part in parts(batch, layer_size) if pairs else ():
                f_values = _run(aug_f, measures.from_graph, part.inputs, where, fm) if aug_f else []
                q_values = _run(aug_q, [p.quantized_tensor for p in pairs], part.inputs, where, qm)
                layer_size.note([*f_values, *q_values], part.size)
                measures.add_layers(part, where, f_values, q_values)
            if first is None:
                first = batch
            if progress is not None:
                progress(batch.size)
    finally:
        stream.close()
    del aug_f, aug_q
    if first is None:
        raise DataError(f"no samples in {folder.path}")

    notes = measures.notes()
    if layers and not pairs:
        notes.append(f"{qm.label} has no quantized activations (QuantizeLinear -> DequantizeLinear pairs)")
    total, labelled = measures.samples, measures.labelled
    speed = None
    if runs:
        feeds, lat_batch = timed_inputs(_head(first, latency_batch), inputs, latency_batch)
        if lat_batch != latency_batch:
            notes.append(f"latency timed at batch {lat_batch}: the model's inputs have a fixed batch dimension")
        speed = measure(
            lambda: plain_f.run(None, feeds), lambda: plain_q.run(None, feeds),
            runs=runs, warmup=warmup, batch=lat_batch, threads=threads,
        )

    accuracy = _accuracy(measures.class_output, measures.topk) if labelled else None
    fidelity_list = [_fidelity(n, acc) for n, acc in measures.fidelity.items()]
    reference = [ReferenceFidelity(n, _fidelity(n, a), _fidelity(n, b)) for n, (a, b) in measures.reference.items()]
    layer_report = Layers([_layer(p, measures.layers[p.tensor]) for p in pairs], skipped) if layers else None
    notes += [f"output {f.output!r}: {f.nonfinite} NaN/Inf values left out of SQNR and cosine"
              for f in fidelity_list if f.nonfinite]
    notes += [f"tensor {t.tensor!r}: {t.nonfinite} NaN/Inf values left out of its SQNR"
              for t in (layer_report.tensors if layer_report else []) if t.nonfinite]
    size = compare_sizes(
        model_size(fm.path, fm.stored) if fm.path else proto_size(fm.proto),
        model_size(qm.path, qm.stored) if qm.path else proto_size(qm.proto),
    )
    return Report(
        float_model=ModelInfo(fm.label, fingerprint(fm.proto)),
        quantized_model=ModelInfo(qm.label, fingerprint(qm.proto), _quantization_metadata(qm.proto)),
        data=DataInfo(
            path=str(folder.path), layout=folder.layout, samples=total, labelled=labelled,
            labels_file=str(labels) if labels is not None else None, batch_size=batch_size,
            reference_outputs=bool(measures.reference),
        ),
        settings=Settings(samples, batch_size, runs, warmup, threads, latency_batch, worst, layers),
        accuracy=accuracy,
        fidelity=fidelity_list,
        reference=reference,
        layers=layer_report,
        speed=speed,
        size=size,
        gates=check_gates(gates, accuracy, fidelity_list, speed, size),
        notes=notes,
        qcli_version=__version__,
    )


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
    preprocess: Preprocess | None = None,
    progress: Callable[[int], None] | None = None,
) -> Report:
    """The accuracy part only (no latency, no per-layer pass): for `qcli quantize --eval-data`.

    Accepts the models in memory, so `quantize` can check its result before writing it.
    """
    return analyze(
        float_model, quantized_model, data, labels=labels, samples=samples, batch_size=batch_size,
        runs=0, warmup=0, threads=threads, gates=Gates(max_accuracy_drop=max_accuracy_drop),
        preprocess=preprocess, layers=False, progress=progress,
    )


def sample_count(
    float_model: str | Path, data: str | Path, *, samples: int | None = None, preprocess: Preprocess | None = None
) -> int:
    """How many samples `analyze` will read (for a progress bar's total); reads only headers."""
    model = load_model(float_model, load_external_data=False)
    return len(DataFolder(data, model_inputs(model), preprocess=preprocess, samples=samples))


# --------------------------------------------------------------------------- the pass


class _Measures:
    """The running sums of one pass: fidelity per output, top-k against labels, agreement with
    reference outputs, SQNR per quantized activation. Fed one batch at a time."""

    def __init__(self, outputs: list[str], pairs: list[QuantizedTensor], float_inputs: set[str], quantized: str):
        self.outputs = outputs
        self.pairs = pairs
        self.from_graph = [p.tensor for p in pairs if p.tensor not in float_inputs]  # not fed
        self.quantized = quantized
        self.fidelity = {n: FidelityAccumulator() for n in outputs}
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
        if self.samples == 0:  # the first batch decides which output holds class scores
            self.class_output = next((n for n in self.outputs if is_class_scores(np.asarray(f_out[n]))), None)
            if self.class_output is not None:
                classes = int(np.asarray(f_out[self.class_output]).shape[1])
                self.topk = (TopKAccumulator(classes), TopKAccumulator(classes))
        self.samples += batch.size
        for name in self.outputs:
            try:
                self.fidelity[name].update(f_out[name], q_out[name], batch.size)
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
                pair = self.reference.setdefault(name, (FidelityAccumulator(), FidelityAccumulator()))
                for acc, out in zip(pair, (f_out[name], q_out[name])):
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
        values = dict(zip(self.from_graph, float_values))
        values.update({k: v for k, v in batch.inputs.items() if k in self.layers})
        for p, q in zip(self.pairs, quantized_values):
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
    data: str | Path,
    inputs: list[InputSpec],
    *,
    labels: str | Path | None = None,
    preprocess: Preprocess | None = None,
    samples: int | None = None,
) -> DataFolder:
    """The data folder, with labels from `labels` (a labels.csv kept elsewhere) when given."""
    return DataFolder(data, inputs, preprocess=preprocess, samples=samples, labels=labels)


def _where(folder: DataFolder, batch: Batch) -> str:
    s = batch.sources
    return str(folder.path / s[0]) if len(s) == 1 else f"{folder.path / s[0]} .. {s[-1]}"


def _head(batch: Batch, n: int) -> Batch:
    if batch.size <= n:
        return batch
    return Batch({k: v[:n] for k, v in batch.inputs.items()}, None, None, batch.sources[:n])


def _reference_outputs(refs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Reference outputs keyed by model output name: by name when they carry the model's names,
    else by position (output_0.pb is the first output)."""
    if all(k in names for k in refs):
        return dict(refs)
    if len(refs) <= len(names):
        return {names[i]: v for i, v in enumerate(refs.values())}
    return {}


# --------------------------------------------------------------------------- models


def _check_compatible(fm: _Model, qm: _Model) -> list[InputSpec]:
    """The float model's inputs, after checking the quantized model takes and gives the same."""
    fin, qin = model_inputs(fm.proto), model_inputs(qm.proto)
    fnames, qnames = [s.name for s in fin], [s.name for s in qin]
    if sorted(fnames) != sorted(qnames):
        raise ModelError(
            f"the models take different inputs: {fm.label} takes {', '.join(fnames)}; "
            f"{qm.label} takes {', '.join(qnames)}",
            hint="compare a quantized model with the float model it was made from",
        )
    qspec = {s.name: s for s in qin}
    for f in fin:
        q = qspec[f.name]
        if f.dtype != q.dtype or len(f.shape) != len(q.shape):
            raise ModelError(
                f"input {f.name!r} differs: {fm.label} expects {f.dtype} {f.shape_text()}, "
                f"{qm.label} expects {q.dtype} {q.shape_text()}",
                hint="compare a quantized model with the float model it was made from",
            )
    fout = [o.name for o in fm.proto.graph.output]
    qout = {o.name for o in qm.proto.graph.output}
    missing = [n for n in fout if n not in qout]
    if missing:
        raise ModelError(
            f"{qm.label} lacks output(s) {', '.join(map(repr, missing))} of {fm.label}",
            hint="compare a quantized model with the float model it was made from",
        )
    return fin


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


# --------------------------------------------------------------------------- results


def _accuracy(output: str | None, topk: tuple[TopKAccumulator, TopKAccumulator]) -> Accuracy:
    f, q = topk
    top5_drop = f.top5_rate - q.top5_rate if f.top5_rate is not None else None
    return Accuracy(
        output=output or "",
        classes=f.classes,
        samples=f.samples,
        float=ClassAccuracy(rounded(f.top1_rate), rounded(f.top5_rate)),
        quantized=ClassAccuracy(rounded(q.top1_rate), rounded(q.top5_rate)),
        top1_drop=rounded(f.top1_rate - q.top1_rate),
        top5_drop=rounded(top5_drop),
    )


def _fidelity(name: str, acc: FidelityAccumulator) -> Fidelity:
    kind = "class-scores" if acc.class_scores else "float" if acc.floating else "other"
    return Fidelity(
        output=name,
        kind=kind,
        samples=acc.samples,
        top1_agreement=rounded(acc.top1_agreement),
        cosine=rounded(acc.cosine),
        cosine_min=rounded(acc.cosine_min) if acc.floating and acc.samples else None,
        sqnr_db=rounded(acc.sqnr.db, 5) if acc.floating else None,
        max_abs_error=rounded(acc.sqnr.max_abs) if acc.floating else None,
        exact_match=rounded(acc.exact / acc.samples) if acc.samples else 0.0,
        nonfinite=acc.sqnr.nonfinite,
        agreement=rounded(acc.element_agreement),
    )


def _layer(p, acc: SqnrAccumulator) -> LayerError:
    n = max(acc.elements, 1)
    return LayerError(
        tensor=p.tensor,
        quantized_tensor=p.quantized_tensor,
        node=p.node,
        op_type=p.op_type,
        dtype=p.dtype,
        elements=acc.elements,
        sqnr_db=rounded(acc.db, 5),
        mse=rounded(acc.noise / n),
        signal_power=rounded(acc.signal / n),
        max_abs_error=rounded(acc.max_abs),
        nonfinite=acc.nonfinite,
    )
