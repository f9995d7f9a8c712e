"""onnxruntime's static quantization as the benchmarks run it: `quant_pre_process` (with the
fallback its error suggests), then `quantize_static` (QDQ, QUInt8 activations, QInt8 weights,
per channel) over qcli's calibration samples; failures as one error line, its prints silenced.
Used by quantize.py, exported.py, recovery.py and target.py (benchmarks/quantize.py describes
the pipeline)."""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ERROR_CHARS = 220
# Fallbacks of a failed onnxruntime variant (label, quantize_static options): one, chosen by data.
STRIDED = ("strided", {"extra_options": {"CalibStridedMinMax": 1}})
PER_TENSOR = ("per-tensor", {"per_channel": False})


def error_line(exc: BaseException) -> str:
    """The exception's type and last non-empty message line; a long one keeps its start and
    its end (where onnxruntime's load errors say what is wrong)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
    half = ERROR_CHARS // 2
    return text if len(text) <= ERROR_CHARS else f"{text[:half]} … {text[-half:]}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence onnxruntime.quantization's prints, logging warnings and numpy's RuntimeWarnings."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def calibration_reader(model_path: Path, calib: Path, per_call: int):
    """A CalibrationDataReader over every sample of `calib` (read now), `per_call` samples per
    call, with the `__len__` / `set_range` that `CalibStridedMinMax` needs."""
    from onnxruntime.quantization import CalibrationDataReader

    from qcli.data import DataFolder, model_inputs
    from qcli.model import load_model

    class Reader(CalibrationDataReader):
        def __init__(self, feeds: list[dict[str, np.ndarray]]):
            self.feeds = feeds
            self.set_range(0, len(feeds))

        def get_next(self):
            return next(self.iterator, None)

        def __len__(self) -> int:
            return len(self.feeds)

        def set_range(self, start_index: int, end_index: int) -> None:
            self.iterator = iter(self.feeds[start_index:end_index])

    folder = DataFolder(calib, model_inputs(load_model(model_path)))
    return Reader([batch.inputs for batch in folder.batches(per_call)])


PER_CHANNEL_OPSET = 13  # DequantizeLinear's axis: below it, quantize_static writes models onnxruntime refuses


def ort_preprocess(model_path: Path, out: Path) -> tuple[Path, list[str]]:
    """`quant_pre_process` as onnxruntime's docs recommend; on failure, the variant its error
    suggests, then none. A model below opset 13 is first converted to it (onnx's version
    converter), as onnxruntime's warning asks for per-channel weights: without it,
    quantize_static writes per-channel DequantizeLinear nodes the model's opset lacks, which
    onnxruntime refuses to load (the PaddleOCR models, ddddocr, dnsmos, basic-pitch). Returns
    the model to quantize and what went wrong."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    notes: list[str] = []
    model_path, out = _at_least_opset(model_path, out.with_suffix(".opset13.onnx"), notes).resolve(), out.resolve()
    for label, options in (("quant_pre_process", {}), ("quant_pre_process(skip_symbolic_shape=True)",
                                                        {"skip_symbolic_shape": True})):
        try:
            with quiet(), contextlib.chdir(out.parent):  # sym_shape_infer_temp.onnx is written to the cwd
                quant_pre_process(str(model_path), str(out), **options)
            return out, notes
        except Exception as exc:
            notes.append(f"onnxruntime {label} failed: {error_line(exc)}")
    notes.append("onnxruntime quantizes the model without pre-processing")
    return model_path, notes


def _at_least_opset(model_path: Path, out: Path, notes: list[str]) -> Path:
    """`model_path`, or its conversion to PER_CHANNEL_OPSET written to `out` when below it."""
    import onnx

    model = onnx.load(str(model_path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), PER_CHANNEL_OPSET)
    if opset >= PER_CHANNEL_OPSET:
        return model_path
    try:
        converted = onnx.version_converter.convert_version(model, PER_CHANNEL_OPSET)
        onnx.save(converted, str(out))
    except Exception as exc:  # noqa: BLE001 - a benchmark note, not a crash
        notes.append(f"onnx's version converter failed on opset {opset}: {error_line(exc)}")
        return model_path
    notes.append(f"converted from opset {opset} to {PER_CHANNEL_OPSET} for per-channel weights")
    return out


def run_quantize_static(source: Path, reader_factory: Callable, out: Path, method: str, **options) -> float:
    """One `quantize_static` call (QDQ, QUInt8 activations, QInt8 weights); returns seconds."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    start = time.perf_counter()
    source, out = source.resolve(), out.resolve()
    with quiet(), contextlib.chdir(out.parent):  # its temporary files go beside the output, not the caller's cwd
        quantize_static(
            str(source), str(out), reader_factory(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, method),
            **{"per_channel": True, **options},
        )
    return time.perf_counter() - start
