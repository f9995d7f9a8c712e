"""Activation ranges chosen by the error they cause at the consuming layer's output (issue 47,
item 2): measured here, not built into qcli, because on the trained models they do no better
than qcli's `mse` ranges (docs/guides/calibration.md has the figures).

For every activation tensor qcli quantizes whose readers are all Conv, MatMul or Gemm nodes
with a constant weight, the candidates are qcli's `mse` range, f x [0 or mse's lower end, max]
and f x [min, max] for 25 fractions f from 1/4 to 1 (geometric). Each is scored by the relative
squared error of its readers' outputs when that input alone is quantized (uint8, as qcli's
default; float weights), summed over the readers and the first SAMPLES calibration samples;
the least wins (ties: `mse`'s, listed first). The chosen ranges replace the `mse` ranges of the
calibration file `qcli calibrate` wrote, and `qcli quantize --calib` builds the model:

    PYTHONPATH=. .venv/bin/python benchmarks/recovery.py --models ocr-rec ddddocr cnn-photos \\
        --rows int8 consumer-ranges
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 8  # calibration samples each candidate is scored on
FRACTIONS = np.geomspace(0.25, 1.0, 25)
READERS = ("Conv", "MatMul", "Gemm")


def quantizer(task, folders: dict[str, Path], out: Path) -> str | None:
    """recovery.py's Quantizer: calibrate, choose the ranges, quantize with them (all int8)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    calib = out.with_suffix(".calib.json")
    cli = [sys.executable, "-m", "qcli.cli"]
    subprocess.run([*cli, "calibrate", str(task.model), "--data", str(folders["calib"]), "-o", str(calib)],
                   check=True, capture_output=True, env=env)
    changed, considered = choose(task.model, folders["calib"], calib)
    subprocess.run([*cli, "quantize", str(task.model), "-o", str(out), "--calib", str(calib), "--no-verify"],
                   check=True, capture_output=True, env=env)
    return f"{changed} of {considered} ranges read by weighted layers changed"


def choose(model_path: Path, data: Path, calib: Path) -> tuple[int, int]:
    """Rewrite `calib`'s mse ranges of the tensors weighted layers read (module docstring);
    (ranges changed, tensors considered)."""
    import onnxruntime as ort

    from qcli.calibrate.table import load_table
    from qcli.config import load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.quantize import make_plan, prepare_for

    model = onnx.load(str(model_path))
    config = load_config(None)
    work = prepare_for(model, config).model
    table, doc = load_table(calib), json.loads(calib.read_text())
    weights = {i.name: i for i in work.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in work.graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append(node if node.op_type in READERS and k == 0
                                                and len(node.input) > 1 and node.input[1] in weights else None)
    tensors = [t for t in sorted(set(make_plan(work, config).observed_tensors))
               if t in table.observers and readers.get(t) and None not in readers[t]]
    fetched = list(dict.fromkeys([*tensors, *(n.output[0] for t in tensors for n in readers[t])]))
    values = _values(work, fetched, DataFolder(data, model_inputs(model), samples=SAMPLES))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    changed = 0
    for t in tensors:
        alone = [(_alone(n, weights, work, options), values[n.output[0]]) for n in readers[t]]
        lo0, hi0 = doc["tensors"][t]["ranges"]["mse"]
        low, high = min(table.observers[t].min, 0.0), max(table.observers[t].max, 0.0)
        candidates = [(lo0, hi0), *((max(low, lo0), f * high) for f in FRACTIONS),
                      *((f * low, f * high) for f in FRACTIONS)]
        scores = [_error(values[t], alone, lo, hi) for lo, hi in candidates]
        best = candidates[int(np.argmin(scores))]
        changed += best != (lo0, hi0)
        doc["tensors"][t]["ranges"]["mse"] = [float(best[0]), float(best[1])]
    calib.write_text(json.dumps(doc))
    return changed, len(tensors)


def _values(work: onnx.ModelProto, names: list[str], folder) -> dict[str, list[np.ndarray]]:
    """Each tensor's value on each sample of `folder` (one run per sample)."""
    import onnxruntime as ort

    fetching = onnx.ModelProto()
    fetching.CopyFrom(work)
    fetching.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    session = ort.InferenceSession(fetching.SerializeToString(), providers=["CPUExecutionProvider"])
    values: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for batch in folder.batches(1):
        for name, value in zip(names, session.run(names, batch.inputs), strict=True):
            values[name].append(value)
    return values


def _alone(node: onnx.NodeProto, weights: dict, work: onnx.ModelProto, options):
    """A session running `node` alone on its first input (its constant inputs as initializers)."""
    import onnxruntime as ort

    graph = helper.make_graph([node], "alone", [helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
                              [weights[n] for n in node.input[1:] if n in weights])
    model = helper.make_model(graph, opset_imports=work.opset_import, ir_version=work.ir_version)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _error(inputs: list[np.ndarray], alone: list, lo: float, hi: float) -> float:
    """The readers' relative squared output error with their input quantized to uint8 on [lo, hi]."""
    if hi <= lo:
        return float("inf")
    step = (hi - lo) / 255
    zero = np.clip(np.rint(-lo / step), 0, 255)
    total = 0.0
    for session, outputs in alone:
        name = session.get_inputs()[0].name
        for x, y in zip(inputs, outputs, strict=True):
            q = ((np.clip(np.rint(x / step) + zero, 0, 255) - zero) * step).astype(np.float32)
            got = session.run(None, {name: q})[0]
            total += float(((got - y) ** 2).sum() / max(float((y**2).sum()), 1e-30))
    return total
