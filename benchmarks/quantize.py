"""Quantization benchmark: qcli against onnxruntime's `quantize_static` on the sample models.

    .venv/bin/python benchmarks/quantize.py                        # all sample models (~3 min)
    .venv/bin/python benchmarks/quantize.py --models cnn --runs 300 --rounds 3
    .venv/bin/python benchmarks/quantize.py --markdown             # tables also in benchmarks/results/quantize.md
    PYTHONPATH=. .venv/bin/python benchmarks/quantize.py --exported   # the exported models: benchmarks/exported.py

Each sample model (`sample_models/<name>/`) is quantized, in this one process, by:

* ``qcli``: `qcli.verify.quantize_checked` with the default config over `calib/` (calibrate,
  quantize, verify on held-back samples, rescue when a floor is missed), then
  `qcli.model.save_model` and `qcli.model.check_model` -- what `qcli quantize MODEL -o OUT
  --data calib/` does; ``qcli --no-verify``: the same without verification (the plain int8
  rewrite, calibrated on every sample).
* ``ort-minmax``, ``ort-percentile``, ``ort-entropy``: onnxruntime's recommended pipeline,
  `quant_pre_process` then `quantize_static(quant_format=QDQ, per_channel=True,
  activation_type=QUInt8, weight_type=QInt8, calibrate_method=...)`, its documented defaults
  otherwise. If `quant_pre_process` fails, the failure is shown and it is retried with
  `skip_symbolic_shape=True` (what its error suggests), then skipped. The calibration data are
  exactly qcli's: every sample of `calib/`, read with `qcli.data.DataFolder` and fed through a
  `CalibrationDataReader`, 8 samples per call (as qcli batches them), one per call when the
  samples' shapes vary (the transformer's token sequences). A variant that fails is a result:
  its error line is shown and one documented fallback is run -- `CalibStridedMinMax=1` (one
  `collect_data` per call; onnxruntime's histogram calibrators otherwise stack all calls'
  outputs and fail on different shapes) when the shapes vary, `per_channel=False` otherwise.
  A written model that onnxruntime cannot load counts as a failure (checked untimed).
  "ort best" is the onnxruntime variant with the highest accuracy; every variant run is shown.

Measured for the fp32 model and every quantized model:

* top-1 accuracy on `eval/` (labelled), batches of 64 where the samples' shapes agree;
* latency: `qcli.runtime.make_session(path, threads=2)` (intra-op threads 2, spinning off),
  all models of a sample model in the same process, after 5 warm-up runs each, then cycles of
  one run per model in turn (the order rotating each cycle); median and p90 of at least
  `--runs` (default 100) timed runs per model -- more for fast models, as many as fit in 2 s --
  at batch 1 and batch N (cnn, mlp: the first eval samples, N = 32; transformer: eval samples
  of 64 tokens, N = 16). The timed section runs `--rounds` times (default 2; the machine is
  shared) and each model's better round (lower median) is shown; the spread between rounds
  is printed;
* file size in bytes;
* quantize wall time: qcli from loading the model to the written file checked by the ONNX
  checker and an onnxruntime load (calibration included); onnxruntime from `quant_pre_process`
  to the written file (a failed attempt is not counted in its fallback's time).

Under each table: which op types onnxruntime's optimizer leaves in each quantized model
(`SessionOptions.optimized_model_filepath`), so unfused Q/DQ groups are visible, and how the
weights were stored (int8 per-channel / per-tensor DequantizeLinear inputs).

Targets (issue 7), reported with the measured figure and PASS / MISS, not asserted (the exit
status is 0 unless the benchmark itself breaks):
* cnn: top-1 drop <= 0.5 points; >= 3.5x smaller; int8 latency <= 0.7x fp32 (both batches);
* transformer: top-1 drop <= 1 point with the default config;
* mlp (opset 11, weights in Constant nodes): quantizes with the default config; >= 3x smaller;
* every model: qcli's top-1 >= onnxruntime's best variant's, and its latency <= 1.05x that
  variant's (both batches). Everything is written into a temporary
directory, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_quantize import (  # noqa: E402  (benchmarks/ort_quantize.py)
    PER_TENSOR,
    STRIDED,
    calibration_reader,
    error_line,
    ort_preprocess,
    run_quantize_static,
)
from sheet import THREADS, Column, Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

MODELS = ("cnn", "transformer", "mlp")
ORT_METHODS = ("MinMax", "Percentile", "Entropy")
WARMUP = 5
MIN_SECONDS = 2.0  # each timed section runs at least this long (short runs get more repetitions)
MAX_RUNS = 5000
EVAL_BATCH = 64


@dataclass(frozen=True)
class Workload:
    """How a sample model is fed: calibration samples per reader call and the timed batches."""

    calib_per_call: int
    batch_n: int
    seq_len: int | None = None  # only samples of this length are timed (token models)

    @property
    def varying_shapes(self) -> bool:
        """Token models: the calibration samples have different lengths."""
        return self.seq_len is not None


WORKLOADS = {
    "cnn": Workload(calib_per_call=8, batch_n=32),
    "mlp": Workload(calib_per_call=8, batch_n=32),
    "transformer": Workload(calib_per_call=1, batch_n=16, seq_len=64),
}


@dataclass
class Timing:
    median_ms: float
    p90_ms: float
    runs: int


@dataclass
class Variant:
    """One model of the comparison and its measured figures."""

    name: str
    path: Path | None = None
    quantize_s: float | None = None
    error: str | None = None
    top1: float | None = None  # percent
    latency: dict[int, Timing] = field(default_factory=dict)  # batch -> timing
    spread: float = 0.0  # largest relative difference between rounds' medians
    ops: Counter = field(default_factory=Counter)  # op types after onnxruntime's optimizer
    weights: str = ""
    size: int = 0  # bytes

    @property
    def ok(self) -> bool:
        return self.path is not None and self.error is None


@dataclass
class ModelResult:
    name: str
    variants: list[Variant]
    notes: list[str]
    batch_n: int
    samples: str = ""  # what the figures were measured on

    def get(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def ort_best(self) -> Variant | None:
        ran = [v for v in self.variants if v.name.startswith("ort") and v.ok and v.top1 is not None]
        return max(ran, key=lambda v: v.top1) if ran else None


# ============================================================================ quantizers


def quantize_qcli(model_path: Path, calib: Path, out: Path, verify: bool = True) -> Variant:
    """`qcli quantize MODEL -o OUT --data calib/` with the default config (verification and its
    rescue included), timed end to end; `verify=False`: with `--no-verify` (the plain rewrite)."""
    from qcli.config import load_config
    from qcli.model import check_model, load_model, save_model
    from qcli.verify import quantize_checked

    name = "qcli" if verify else "qcli --no-verify"
    start = time.perf_counter()
    try:
        config = load_config(None)
        if not verify:
            config = config.merged(verify={"enabled": False})
        model = load_model(model_path)
        save_model(quantize_checked(model, config, data=calib).result.model, out)
        check_model(out)
    except Exception as exc:  # a failure is a result of the benchmark
        return Variant(name, error=error_line(exc))
    return Variant(name, path=out, quantize_s=time.perf_counter() - start)


def quantize_ort(model_path: Path, calib: Path, work: Path, workload: Workload) -> tuple[list[Variant], list[str]]:
    """Every onnxruntime variant (see the module docstring), with the fallback of failures.
    A variant whose written model onnxruntime cannot load has failed too (checked untimed)."""
    from qcli.runtime import make_session

    start = time.perf_counter()
    source, notes = ort_preprocess(model_path, work / "ort-preprocessed.onnx")
    pre_s = time.perf_counter() - start
    reader = partial(calibration_reader, model_path, calib, workload.calib_per_call)
    fallback = STRIDED if workload.varying_shapes else PER_TENSOR
    variants = []
    for method in ORT_METHODS:
        for label, options in (("", {}), fallback):
            name = f"ort-{method.lower()}" + (f" {label}" if label else "")
            out = work / f"{name.replace(' ', '-')}.onnx"
            try:
                seconds = run_quantize_static(source, reader, out, method, **options)
                make_session(out, threads=THREADS)
                variants.append(Variant(name, path=out, quantize_s=pre_s + seconds))
                break
            except Exception as exc:
                variants.append(Variant(name, error=error_line(exc)))
    if any(not v.ok for v in variants):
        label, options = fallback
        notes.append(f"'{label}' = the failed variant rerun with {options}")
    return variants, notes


# ============================================================================ measurements


def model_inputs_of(path: Path):
    from qcli.data import model_inputs
    from qcli.model import load_model

    return model_inputs(load_model(path))


def top1(session, eval_dir: Path, specs) -> float:
    """Top-1 accuracy (percent) of the first output's argmax against the samples' labels."""
    from qcli.data import DataFolder

    correct = total = 0
    for batch in DataFolder(eval_dir, specs).batches(EVAL_BATCH):
        logits = session.run(None, batch.inputs)[0]
        correct += int((logits.argmax(axis=-1) == batch.label).sum())
        total += batch.size
    return 100.0 * correct / total


def latency_feeds(eval_dir: Path, specs, workload: Workload) -> dict[int, dict[str, np.ndarray]]:
    """The timed inputs: the first eval sample(s) (of `seq_len` tokens if set), batch 1 and N."""
    from qcli.data import DataFolder

    picked = []
    for batch in DataFolder(eval_dir, specs).batches(1):
        shape = next(iter(batch.inputs.values())).shape
        if workload.seq_len is None or shape[-1] == workload.seq_len:
            picked.append(batch.inputs)
        if len(picked) == workload.batch_n:
            break
    stack = {name: np.concatenate([p[name] for p in picked]) for name in picked[0]}
    return {1: picked[0], len(picked): stack}


def time_round(sessions: dict, feeds: dict[str, np.ndarray], runs: int) -> dict[str, Timing]:
    """Warm up every session, then cycles of one run per session in turn, the order rotating
    each cycle (so no model always follows the same neighbour): at least `runs` cycles and,
    for fast models, as many more as fit in MIN_SECONDS (at most MAX_RUNS)."""
    for session in sessions.values():
        for _ in range(WARMUP):
            session.run(None, feeds)
    names = list(sessions)
    times: dict[str, list[float]] = {name: [] for name in names}
    began, i = time.perf_counter(), 0
    while i < runs or (i < MAX_RUNS and time.perf_counter() - began < MIN_SECONDS):
        i += 1
        for name in names[i % len(names):] + names[: i % len(names)]:
            start = time.perf_counter()
            sessions[name].run(None, feeds)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: Timing(float(np.median(t)), float(np.percentile(t, 90)), len(t)) for name, t in times.items()}


def measure_latency(variants: list[Variant], sessions: dict, feeds: dict[int, dict], runs: int, rounds: int) -> int:
    """Fill each variant's latency with its best round per batch size, and the rounds' spread.
    Returns the fewest timed runs any model got."""
    by_name = {v.name: v for v in variants}
    fewest = MAX_RUNS
    for batch, feed in feeds.items():
        results = [time_round(sessions, feed, runs) for _ in range(rounds)]
        fewest = min([fewest] + [t.runs for r in results for t in r.values()])
        for name in sessions:
            medians = [r[name].median_ms for r in results]
            by_name[name].latency[batch] = min((r[name] for r in results), key=lambda t: t.median_ms)
            by_name[name].spread = max(by_name[name].spread, max(medians) / min(medians) - 1)
    return fewest


def optimized_ops(path: Path, work: Path) -> Counter:
    """Op types of the graph onnxruntime actually runs (after its optimizer, 2 threads)."""
    import onnxruntime as ort

    from qcli.runtime import session_options

    out = work / f"{path.stem}.optimized.onnx"
    options = session_options(THREADS)
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(str(out)).graph.node)


def weight_storage(path: Path) -> str:
    """How the weights are stored: int8 DequantizeLinear inputs, per-channel or per-tensor."""
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    per_channel = per_tensor = 0
    for node in model.graph.node:
        x = inits.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if x is None or x.data_type != onnx.TensorProto.INT8 or len(x.dims) < 2:
            continue
        scale = inits.get(node.input[1])
        if scale is not None and int(np.prod(scale.dims)) > 1:
            per_channel += 1
        else:
            per_tensor += 1
    return f"int8 weights {per_channel} per-channel, {per_tensor} per-tensor"


def measure(result: ModelResult, folder: Path, work: Path, runs: int, rounds: int, workload: Workload) -> None:
    """Accuracy, latency, optimized-graph ops and weight storage of every variant that ran."""
    from qcli.data import DataFolder
    from qcli.runtime import make_session

    specs = model_inputs_of(folder / "model.onnx")
    ran = [v for v in result.variants if v.ok]
    sessions = {v.name: make_session(v.path, threads=THREADS) for v in ran}
    for v in ran:
        v.size = v.path.stat().st_size
        v.top1 = top1(sessions[v.name], folder / "eval", specs)
        if v.name != "fp32":
            v.ops = optimized_ops(v.path, work)
            v.weights = weight_storage(v.path)
    feeds = latency_feeds(folder / "eval", specs, workload)
    result.batch_n = max(feeds)
    fewest = measure_latency(ran, sessions, feeds, runs, rounds)
    result.samples = (f"{len(DataFolder(folder / 'calib', specs))} calibration samples, "
                      f"{len(DataFolder(folder / 'eval', specs))} eval samples, "
                      f"latency: best of {rounds} rounds of >= {fewest} runs")


def benchmark_model(name: str, folder: Path, work: Path, runs: int, rounds: int) -> ModelResult:
    """Quantize one sample model every way, then measure every result."""
    workload = WORKLOADS.get(name, Workload(calib_per_call=8, batch_n=32))
    model_path = folder / "model.onnx"
    qcli = quantize_qcli(model_path, folder / "calib", work / "qcli.onnx")
    plain = quantize_qcli(model_path, folder / "calib", work / "qcli-plain.onnx", verify=False)
    ort_variants, notes = quantize_ort(model_path, folder / "calib", work, workload)
    result = ModelResult(name, [Variant("fp32", path=model_path), qcli, plain, *ort_variants], notes, workload.batch_n)
    measure(result, folder, work, runs, rounds, workload)
    return result


# ============================================================================ report


def _ratio(a: float | None, b: float | None, fmt: str = "{:.2f}x") -> str:
    return fmt.format(a / b) if a and b else ""


def model_table(result: ModelResult) -> Sheet:
    """One row per variant: accuracy, latency at batch 1 and N, size, quantize time; the notes under it."""
    n = result.batch_n
    figures = ("top-1 %", "drop (pts)", "b1 ms (p90)", "vs fp32", f"b{n} ms (p90)", "vs fp32", "size B", "x smaller",
               "quantize s")
    table = Sheet(f"{result.name} ({result.samples})",
                  [Column("model", no_wrap=True), *((figure, "right") for figure in figures)])
    table.notes = model_notes(result)
    fp32, best = result.get("fp32"), result.ort_best
    for v in result.variants:
        label = v.name + (" [bold](best)[/bold]" if v is best else "")
        if not v.ok:
            table.add_row(label, "[red]failed[/red]", *[""] * 8)
            continue
        cells = [f"{v.top1:.2f}", f"{fp32.top1 - v.top1:+.2f}" if v is not fp32 else ""]
        for batch in (1, n):
            t, base = v.latency.get(batch), fp32.latency.get(batch)
            cells += [f"{t.median_ms:.3f} ({t.p90_ms:.3f})" if t else "",
                      _ratio(t and t.median_ms, base and base.median_ms)]
        cells += [f"{v.size:,}", _ratio(fp32.size, v.size), f"{v.quantize_s:.2f}" if v.quantize_s else ""]
        table.add_row(label, *cells)
    return table


def model_notes(result: ModelResult) -> list[str]:
    """Failures, pre-processing notes, timing spread, weight storage and optimized-graph ops."""
    lines = list(result.notes)
    lines += [f"{v.name}: {v.error}" for v in result.variants if v.error]
    spread = max((v.spread for v in result.variants if v.ok), default=0.0)
    lines.append(f"latency: the rounds' medians of one model differ by up to {spread:.0%} (shared machine)")
    lines += same_graph_notes(result)
    for v in result.variants:
        if v.ok and v.ops:
            ops = ", ".join(f"{op} {count}" for op, count in sorted(v.ops.items(), key=lambda kv: (-kv[1], kv[0])))
            lines.append(f"{v.name}: {v.weights}; optimized graph: {ops}")
    return lines


def same_graph_notes(result: ModelResult) -> list[str]:
    """Quantized models with the same optimized op counts and weight storage should run alike:
    how far apart their medians are is a floor for the timing noise."""
    groups: dict[tuple, list[Variant]] = {}
    for v in result.variants:
        if v.ok and v.ops:
            groups.setdefault((tuple(sorted(v.ops.items())), v.weights), []).append(v)
    lines = []
    for group in (g for g in groups.values() if len(g) > 1):
        gaps = []
        for batch in (1, result.batch_n):
            medians = [v.latency[batch].median_ms for v in group]
            gaps.append(f"b{batch} {max(medians) / min(medians) - 1:.0%}")
        lines.append(f"same optimized graph ({', '.join(v.name for v in group)}): medians differ by "
                     f"{', '.join(gaps)} -- latency gaps of that size are noise")
    return lines


def _verdict(met: bool | None) -> str:
    if met is None:
        return "[yellow]n/a[/yellow]"
    return "[green]PASS[/green]" if met else "[bold red]MISS[/bold red]"


def target_rows(result: ModelResult) -> list[tuple[str, str, bool | None]]:
    """(target, measured figure, met) for the issue's targets that apply to this model."""
    fp32, qcli, best, n = result.get("fp32"), result.get("qcli"), result.ort_best, result.batch_n
    if not (qcli and qcli.ok):
        return [("qcli quantizes with the default config", qcli.error if qcli else "not run", False)]
    drop = fp32.top1 - qcli.top1
    shrink = fp32.size / qcli.size
    rows = []
    if result.name == "cnn":
        rows.append(("top-1 drop <= 0.5 pts", f"{drop:+.2f} pts", drop <= 0.5))
        rows.append(("size >= 3.5x smaller", f"{shrink:.2f}x", shrink >= 3.5))
        for batch in (1, n):
            r = qcli.latency[batch].median_ms / fp32.latency[batch].median_ms
            rows.append((f"int8 latency b{batch} <= 0.7x fp32", f"{r:.2f}x", r <= 0.7))
    if result.name == "transformer":
        rows.append(("accuracy drop <= 1 pt (default config)", f"{drop:+.2f} pts", drop <= 1.0))
    if result.name == "mlp":
        rows.append(("quantizes with the default config", "yes", True))
        rows.append(("shrinks >= 3x", f"{shrink:.2f}x", shrink >= 3.0))
    if best is None:
        return rows + [("accuracy >= onnxruntime quantize_static", "no onnxruntime variant ran", None)]
    rows.append((f"top-1 >= onnxruntime's best ({best.name})", f"{qcli.top1:.2f} vs {best.top1:.2f}",
                 qcli.top1 >= best.top1))
    for batch in (1, n):
        r = qcli.latency[batch].median_ms / best.latency[batch].median_ms
        rows.append((f"latency b{batch} <= 1.05x {best.name}", f"{r:.2f}x", r <= 1.05))
    return rows


def verdict_table(results: list[ModelResult]) -> Sheet:
    table = Sheet("Targets (issue 7; reported, not asserted)", ["model", "target", ("measured", "right"), ""])
    for result in results:
        rows = target_rows(result)
        for i, (target, measured, met) in enumerate(rows):
            table.add_row(result.name if i == 0 else "", target, measured, _verdict(met),
                          end_section=i == len(rows) - 1)
    return table


# ============================================================================ main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--exported" in argv:  # wall time and peak RSS on the exported models (its own options)
        import exported  # benchmarks/exported.py

        return exported.main([a for a in argv if a != "--exported"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--runs", type=int, default=100, help="timed runs per model and batch size (median, p90)")
    parser.add_argument("--rounds", type=int, default=2, help="repetitions of the timed section (best median)")
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)

    page = bench_page(args.markdown, f"{args.runs} timed runs x {args.rounds} rounds")
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="qcli-bench-quantize-") as tmp:
        for name in args.models:
            folder = ROOT / "sample_models" / name
            if not (folder / "model.onnx").is_file():
                page.line(f"[yellow]skipped {name}: {folder / 'model.onnx'} not found[/yellow]")
                continue
            work = Path(tmp) / name
            work.mkdir()
            result = benchmark_model(name, folder, work, args.runs, args.rounds)
            results.append(result)
            page.table(model_table(result))
            page.print()
    if results:
        page.table(verdict_table(results))
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
