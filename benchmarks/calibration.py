"""Calibration benchmark: qcli's one-pass calibration against plain fp32 inference and against
onnxruntime's own calibrators, on the sample models, at 32, 128 and 512 samples.

    .venv/bin/python benchmarks/calibration.py            # what `make bench` runs (~2-5 min)
    .venv/bin/python benchmarks/calibration.py --quick    # 1 repetition, 32 and 128 samples
    .venv/bin/python benchmarks/calibration.py --models cnn --samples 512 --reps 5
    .venv/bin/python benchmarks/calibration.py --kinds plain qcli --qcli-root /tmp/old-checkout
    .venv/bin/python benchmarks/calibration.py --models paddle-cls paddle-rec --samples 128 --kinds plain qcli
    .venv/bin/python benchmarks/calibration.py --markdown   # the tables also in benchmarks/results/calibration.md

What is measured (each configuration in a fresh child process, one after the other):

* ``fp32 inference``: `qcli.runtime.make_session` on the model, then `session.run` over the
  samples' batches; the floor any calibration pays.
* ``fp32 + observed outputs``: the model as qcli's pass runs it (prepared, the tensors the
  default config calibrates added as outputs), over the same batches, read one after the
  other, nothing observed: what the pass would cost if observing were free. Its time plus
  qcli's solves is the floor of qcli's time in this design (row "floor" of the targets).
* ``qcli calibrate``: `qcli.quantize.calibrate` with the default config and the methods
  `qcli calibrate` solves (`solved_methods`: minmax, free, and the default method, mse; the
  file's histograms let `quantize --calib --method` solve another later), then the
  calibration file written, as `qcli calibrate` does. The notes split its time into the
  inference pass, the solves (qcli's own phases) and the file.
* ``ort MinMax / Percentile / Entropy``: `onnxruntime.quantization.calibrate.create_calibrator`
  with the op types `quantize_static` calibrates by default (QLinear and QDQ registries) and
  its default extra options, then one `collect_data` over a `CalibrationDataReader`, then
  `compute_data` -- what `quantize_static` does. If that call fails (onnxruntime's histogram
  calibrators stack every batch's outputs with `np.asarray`, which fails on batches of
  different shapes, e.g. variable-length token sequences), the failure is shown and the run
  is repeated the way `quantize_static(..., extra_options={"CalibStridedMinMax": n})` does it:
  one `collect_data` per batch (row "strided"). On the sample transformer that fails too:
  its attention mask puts -3.4e38 in the scores, and `np.histogram` cannot make bins over
  [-3.4e38, 3.4e38]; both failures are reported as they are.

Same conditions for all: the same batches (qcli's `DataFolder(...).batches(8)`, files read in
the timed region by everyone), batch size 8, and the same onnxruntime session options
(`qcli.runtime.session_options()`: default intra-op threads, spinning off; onnxruntime's
calibrators keep their own `ORT_DISABLE_ALL` optimization level). Timed from loading the model
to the result, after imports (qcli's lazily imported modules are imported before the clock
starts too); peak RSS is the child's VmHWM (whole process, imports included:
about 60-75 MB of that is numpy + onnx + onnxruntime), polled by the parent as well so that a
child killed on timeout still shows a lower bound. Each child has a timeout (`--timeout`,
default 150 s); a run that hits it is reported as "> N s".

Data: each sample folder has 256 `calib/` samples; the benchmark copies `calib/` then `eval/`
(cycling again if needed) as 512 numbered files into a temporary directory (removed at the
end; never written into the repository or the working directory), and a run with N samples
reads its first N. The transformer's samples have different lengths, so its batches are
whatever consecutive samples share a length (as qcli batches them); the same batches for all.
Exported models (`--models paddle-cls paddle-rec paddle-det`, after `make real-models`) get
seeded random inputs in [-1, 1] at a fixed shape, written to the temporary directory the same
way: their figures are about time and memory, not about ranges.

Repetitions are interleaved (plain, qcli, ort, plain, qcli, ... ) and medians are shown, so
load from other jobs on the machine spreads over all tools alike. onnxruntime's Percentile and
Entropy runs at 512 samples are repeated once only (`--ort-reps-512`), being the slow ones.

Targets (issue 5), reported and not asserted (exit status 0 unless the benchmark itself breaks):
* qcli peak RSS at 512 samples <= 1.2 x at 32 samples;
* qcli wall time <= 1.5 x plain fp32 inference over the same samples (issue 19: 2 x on the
  sample transformer);
* at 512 samples, qcli >= 5x faster and <= 1/5 the peak RSS of onnxruntime's Percentile and
  Entropy calibrators.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sheet import Page, Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

ROOT = Path(__file__).resolve().parents[1]
QCLI_ROOT = ROOT  # the qcli source tree the children import (--qcli-root)
MODELS = ("cnn", "transformer")
# Exported models (`make real-models` unpacks them; not run unless named in --models): PaddleOCR's
# text-direction classifier, recognizer and detector, fed seeded random inputs in [-1, 1] of
# the shape they are usually run at (timing and memory only: random pixels are not text).
REAL_DIR = ROOT / ".real-models" / "rapidocr_onnxruntime" / "models"
REAL_MODELS = {
    "paddle-cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
    "paddle-rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
    "paddle-det": ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320)),
}
SAMPLES = (32, 128, 512)
BATCH_SIZE = 8
ORT_METHODS = ("MinMax", "Percentile", "Entropy")
KINDS = ("plain", "floor", "qcli", *(f"ort-{m}" for m in ORT_METHODS))
LABELS = {
    "plain": "fp32 inference",
    "floor": "fp32 + observed outputs",
    "qcli": "qcli calibrate",
    **{f"ort-{m}": f"ort {m}" for m in ORT_METHODS},
}

# Targets of the issues.
RSS_FLAT = 1.2
TIME_VS_PLAIN = 1.5
TIME_VS_PLAIN_OF = {"transformer": 2.0}  # issue 19's bound where it is not TIME_VS_PLAIN
VS_ORT = 5.0


# ============================================================================ child process


def _status_kb(field: str, pid: str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _use_qcli_tree(root: str) -> None:
    """Import qcli from `root` (the repository, or another checkout for a before/after run),
    ahead of an editable install's import hook."""
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
    sys.path.insert(0, root)


def _child(kind: str, model_path: str, data: str, samples: int, work: str, strided: bool) -> dict:
    """Run one configuration; return its figures (written as JSON by `main`)."""
    _use_qcli_tree(os.environ.get("QCLI_BENCH_ROOT", str(ROOT)))
    # Imports are outside the timed region for every kind: what they all share, here.
    import numpy  # noqa: F401
    import onnxruntime  # noqa: F401

    import qcli.data  # noqa: F401
    import qcli.model  # noqa: F401
    import qcli.runtime  # noqa: F401

    if kind in ("plain", "floor"):
        result, seconds, rss_imports = _child_inference(kind, model_path, data, samples)
    elif kind == "qcli":
        result, seconds, rss_imports = _child_qcli(model_path, data, samples, work)
    else:
        result, seconds, rss_imports = _child_ort(kind.removeprefix("ort-"), model_path, data, samples, work, strided)
    result.update(seconds=seconds, hwm_kb=_status_kb("VmHWM"), imports_kb=rss_imports)
    return result


Timed = tuple[dict, float, int | None]  # (figures, seconds, RSS after the imports in kB)


def _child_inference(kind: str, model_path: str, data: str, samples: int) -> Timed:
    """fp32 inference over the batches; "floor": the model as qcli's pass runs it (prepared, the
    calibrated tensors as outputs), nothing observed."""
    from qcli.calibrate.collect import session_with_outputs
    from qcli.config import load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.model import load_model
    from qcli.plan import make_plan
    from qcli.prepare import prepare
    from qcli.runtime import make_session

    rss_imports = _status_kb("VmRSS")
    start = time.perf_counter()
    model = load_model(model_path)
    folder = DataFolder(data, model_inputs(model), samples=samples)
    names = None
    if kind == "floor":  # what qcli's pass runs, without observing: its floor
        model = prepare(model).model
        names = list(dict.fromkeys(make_plan(model, load_config(None)).calibrated_tensors))
    session = make_session(model) if names is None else session_with_outputs(model, names)
    count = batches = 0
    for batch in folder.batches(BATCH_SIZE):
        session.run(names, batch.inputs)
        count += batch.size
        batches += 1
    seconds = time.perf_counter() - start
    return {"samples": count, "batches": batches}, seconds, rss_imports


def _child_qcli(model_path: str, data: str, samples: int, work: str) -> Timed:
    """`qcli.quantize.calibrate` with the default config, then the file written; the time split
    into its steps by wrapping the functions `calibrate` calls."""
    import importlib

    from qcli import quantize as engine
    from qcli.calibrate import table
    from qcli.config import load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.model import load_model
    from qcli.phases import recording

    # Import what is imported lazily, outside the timed region, as every kind's imports are.
    for lazy in ("qcli.rules", "qcli.scheme"):
        try:
            importlib.import_module(lazy)
        except ImportError:
            pass

    # One call per step: negligible overhead.
    parts: dict[str, float] = {}

    def timed(key, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[key(*args) if callable(key) else key] = (
                    parts.get(key(*args) if callable(key) else key, 0.0) + time.perf_counter() - t
                )
        return wrapper

    for module, name, key in (
        (engine, "prepare", "prepare"),
        (engine, "make_plan", "plan"),
        (engine, "collect", "pass"),
    ):
        if hasattr(module, name):  # the engine may change; a missing step is just not split
            setattr(module, name, timed(key, getattr(module, name)))
    config = load_config(None).merged(calibration={"samples": samples, "batch_size": BATCH_SIZE})
    rss_imports = _status_kb("VmRSS")
    start = time.perf_counter()
    model = load_model(model_path)
    folder = DataFolder(data, model_inputs(model), samples=config.calibration.samples)
    with recording() as phases:  # the solves run in the pass's shadow, maybe in a helper process
        calibration = engine.calibrate(model, folder, config, methods=table.solved_methods(config.calibration.method))
    parts["solve"] = phases.seconds.get("solve", 0.0)
    t_save = time.perf_counter()
    table.save_table(calibration, Path(work) / "model.calib.json")
    seconds = time.perf_counter() - start
    parts["save"] = time.perf_counter() - t_save
    parts["other"] = seconds - sum(parts.values())  # model load, fingerprint, table...
    result = {"samples": calibration.samples, "tensors": len(calibration.observers), "parts": parts}
    return result, seconds, rss_imports


def _child_ort(method: str, model_path: str, data: str, samples: int, work: str, strided: bool) -> Timed:
    """onnxruntime's calibrator for `method`, as `quantize_static` runs it (`strided`: one
    `collect_data` per batch, as its CalibStridedMinMax option does)."""
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import (
        CalibraterBase,
        CalibrationDataReader,
        CalibrationMethod,
        create_calibrator,
    )
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    from qcli.data import DataFolder, model_inputs
    from qcli.model import load_model
    from qcli.runtime import session_options

    def create_inference_session(self):  # onnxruntime's, with qcli's thread settings
        options = session_options()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.infer_session = ort.InferenceSession(
            self.augmented_model_path, sess_options=options, providers=self.execution_providers
        )

    CalibraterBase.create_inference_session = create_inference_session

    class Reader(CalibrationDataReader):
        def __init__(self, batches):
            self.batches = batches

        def get_next(self):
            return next(self.batches, None)

    op_types = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))  # quantize_static's default
    rss_imports = _status_kb("VmRSS")
    start = time.perf_counter()
    model = load_model(model_path)
    folder = DataFolder(data, model_inputs(model), samples=samples)
    calibrator = create_calibrator(
        Path(model_path),
        op_types,
        augmented_model_path=str(Path(work) / "augmented_model.onnx"),
        calibrate_method=getattr(CalibrationMethod, method),
    )
    batches = folder.batches(BATCH_SIZE)
    if strided:  # quantize_static's CalibStridedMinMax: one collect_data per stride
        for batch in batches:
            calibrator.collect_data(Reader(iter([batch.inputs])))
    else:
        calibrator.collect_data(Reader(b.inputs for b in batches))
    ranges = calibrator.compute_data()
    seconds = time.perf_counter() - start
    return {"tensors": len(ranges.data)}, seconds, rss_imports


# =========================================================================== parent process


def make_data(source: Path, target: Path, count: int) -> None:
    """`count` sample files: calib/ then eval/ (then again), numbered, into `target`; for an
    exported model (`source` its .onnx file), seeded random inputs of its REAL_MODELS shape."""
    if source.suffix == ".onnx":
        import numpy as np
        import onnx

        shape = next(shape for file, shape in REAL_MODELS.values() if file == source.name)
        name = onnx.load(str(source), load_external_data=False).graph.input[0].name
        rng = np.random.default_rng(0)
        target.mkdir(parents=True)
        for i in range(count):
            arrays: dict[str, Any] = {name: rng.uniform(-1, 1, size=shape).astype(np.float32)}
            np.savez(target / f"{i:05d}.npz", **arrays)
        return
    files = sorted((source / "calib").glob("*.npz")) + sorted((source / "eval").glob("*.npz"))
    if not files:
        raise SystemExit(f"no .npz samples in {source}/calib or {source}/eval")
    target.mkdir(parents=True)
    for i in range(count):
        shutil.copyfile(files[i % len(files)], target / f"{i:05d}.npz")


def run_child(
    kind: str, model: Path, data: Path, samples: int, timeout: float, strided: bool = False
) -> dict:
    """Run one configuration in a fresh interpreter; poll its VmHWM; enforce the timeout."""
    with tempfile.TemporaryDirectory(prefix="qcli-bench-run-") as work:
        out = Path(work) / "result.json"
        cmd = [
            sys.executable, __file__, "--child", kind, "--model", str(model), "--data", str(data),
            "--n", str(samples), "--work", work, "--result", str(out),
        ] + (["--strided"] if strided else [])
        env = dict(os.environ, QCLI_BENCH_ROOT=str(QCLI_ROOT))
        err_path = Path(work) / "stderr.txt"
        with open(err_path, "w") as err:  # a file, not a pipe: a chatty child cannot block on it
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
            pid, hwm, start = str(proc.pid), 0, time.perf_counter()
            while proc.poll() is None:
                hwm = max(hwm, _status_kb("VmHWM", pid) or 0)
                if time.perf_counter() - start > timeout:
                    proc.kill()
                    proc.wait()
                    return {"timeout": timeout, "hwm_kb": hwm}
                time.sleep(0.05)
        stderr = err_path.read_text(errors="replace")
        if proc.returncode != 0 or not out.is_file():
            lines = [line for line in stderr.strip().splitlines() if line.strip()]
            return {"error": lines[-1] if lines else f"exit status {proc.returncode}", "hwm_kb": hwm}
        return json.loads(out.read_text())


def model_file(source: Path) -> Path:
    """The model of a sample model folder, or the exported model's file itself."""
    return source if source.suffix == ".onnx" else source / "model.onnx"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(runs: list[dict]) -> dict:
    """Median figures of repeated runs (or the failure / timeout of the first failing run)."""
    bad = [r for r in runs if "error" in r or "timeout" in r]
    if bad:
        return bad[0]
    out = dict(runs[-1])
    out["seconds"] = _median([r["seconds"] for r in runs])
    out["hwm_kb"] = _median([r["hwm_kb"] for r in runs])
    out["all_seconds"] = [r["seconds"] for r in runs]
    if "parts" in out:
        out["parts"] = {k: _median([r["parts"][k] for r in runs]) for k in out["parts"]}
    return out


def fmt_time(r: dict) -> str:
    if "timeout" in r:
        return f"> {r['timeout']:g} s"
    if "error" in r:
        return "failed"
    return f"{r['seconds']:.2f} s"


def fmt_mb(r: dict) -> str:
    if not r.get("hwm_kb"):
        return "-"
    mb = r["hwm_kb"] / 1024
    return f"> {mb:.0f} MB" if "timeout" in r else f"{mb:.0f} MB"


def ok(r: dict) -> bool:
    return "seconds" in r and "error" not in r and "timeout" not in r


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.child:
        result = _child(args.child, args.model, args.data, args.n, args.work, args.strided)
        Path(args.result).write_text(json.dumps(result))
        return 0

    global QCLI_ROOT
    QCLI_ROOT = args.qcli_root.resolve()
    if args.quick:
        args.reps, args.samples = 1, [s for s in args.samples if s <= 128] or [32]

    page = bench_page(args.markdown, f"batch size {BATCH_SIZE}, {args.reps} repetition(s) (median)", width=120,
                      threads=None)
    models = _find_models(args.models, page)
    if not models:
        page.line("no sample models to benchmark")
        page.write()
        return 0
    t_start = time.perf_counter()
    results = _run_all(models, args, page)
    elapsed = time.perf_counter() - t_start

    report(page, models, args, results)
    page.line(f"benchmark took {elapsed:.0f} s")
    page.write()
    if args.json:
        args.json.write_text(json.dumps({f"{m}|{n}|{k}": v for (m, n, k), v in results.items()}, indent=1))
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"sample models, or exported ones ({', '.join(REAL_MODELS)}; make real-models)")
    p.add_argument("--samples", nargs="+", type=int, default=list(SAMPLES))
    p.add_argument("--reps", type=int, default=3, help="repetitions of each configuration (median)")
    p.add_argument("--ort-reps-512", type=int, default=1,
                   help="repetitions of ort Percentile/Entropy at >= 512 samples")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds before a child is killed")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--quick", action="store_true", help="1 repetition at 32 and 128 samples")
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    add_markdown_option(p, __file__)
    p.add_argument("--qcli-root", type=Path, default=ROOT,
                   help="qcli source tree to measure (default: this repository), for before/after runs")
    # child mode (internal)
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--strided", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _find_models(names: list[str], page: Page) -> list[tuple[str, Path]]:
    """(name, sample model folder or exported model file) of each model found; the others are
    reported as skipped."""
    models = []
    for name in names:
        if name in REAL_MODELS:
            path = REAL_DIR / REAL_MODELS[name][0]
            if path.is_file():
                models.append((name, path))
            else:
                page.line(f"[yellow]skipped {name}: {path} not found (make real-models)[/yellow]")
            continue
        folder = ROOT / "sample_models" / name
        if (folder / "model.onnx").is_file():
            models.append((name, folder))
        else:
            page.line(f"[yellow]skipped {name}: {folder / 'model.onnx'} not found[/yellow]")
    return models


def _run_all(models: list[tuple[str, Path]], args, page: Page) -> dict[tuple[str, int, str], dict]:
    """Every configuration of every model, repetitions interleaved; printed as they finish."""
    results: dict[tuple[str, int, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="qcli-bench-") as tmp:
        for name, folder in models:
            data = Path(tmp) / name
            make_data(folder, data, max(args.samples))
            for n in args.samples:
                runs: dict[str, list[dict]] = {k: [] for k in args.kinds}
                for rep in range(args.reps):
                    for kind in args.kinds:
                        slow = kind in ("ort-Percentile", "ort-Entropy") and n >= 512
                        if rep >= (args.ort_reps_512 if slow else args.reps):
                            continue
                        if runs[kind] and not ok(runs[kind][-1]):
                            continue  # a failure or timeout is not retried
                        runs[kind].append(run_child(kind, model_file(folder), data, n, args.timeout))
                for kind in args.kinds:
                    r = results[(name, n, kind)] = summarize(runs[kind])
                    _print_run(page, name, n, LABELS[kind], r)
                    if kind.startswith("ort-") and "error" in r:
                        strided = run_child(kind, model_file(folder), data, n, args.timeout, strided=True)
                        results[(name, n, kind + " strided")] = strided
                        _print_run(page, name, n, LABELS[kind] + " strided", strided)
    return results


def _print_run(page: Page, name: str, n: int, label: str, r: dict) -> None:
    page.print(f"  {name:12} {n:4d} samples  {label:32} {fmt_time(r):>10} {fmt_mb(r):>9}"
                  + (f"  {r['error'][:70]}" if "error" in r else ""), markup=False)


def report(page: Page, models, args, results) -> None:
    for name, _ in models:
        page.table(_model_table(name, args.samples, results))
    page.table(_targets_table(models, args.samples, results))


def _model_table(name: str, samples: list[int], results: dict) -> Sheet:
    """One model's table (every run, against fp32 and against qcli) and the notes under it."""
    table = Sheet(f"{name}: wall time (median) and peak RSS", [
        ("samples", "right"), "run", ("wall", "right"), ("peak RSS", "right"),
        ("time / fp32", "right"), ("time / qcli", "right"), ("RSS / qcli", "right"),
    ])
    notes = table.notes
    for n in samples:
        plain, qcli = results.get((name, n, "plain")), results.get((name, n, "qcli"))
        rows: list[tuple[str, dict]] = []
        for (m, s, kind), r in results.items():
            if m != name or s != n:
                continue
            base = kind.split(" ")[0]
            rows.append((LABELS[base] + (" strided" if kind.endswith("strided") else ""), r))
            if kind == "qcli" and ok(r):
                p = r["parts"]
                notes.append(
                    f"{name} {n} samples, qcli: {r['tensors']} tensors; "
                    + ", ".join(f"{k} {v:.2f} s" for k, v in p.items())
                    + (f"; fp32 inference: {plain['batches']} batches" if plain and ok(plain) else "")
                )
        for i, (label, r) in enumerate(rows):
            vs_plain = vs_qcli = rss_qcli = ""
            more = "> " if "timeout" in r else ""
            if plain and ok(plain) and (ok(r) or "timeout" in r):
                vs_plain = f"{more}{_secs(r) / plain['seconds']:.2f}x"
            is_qcli = label.lstrip().startswith("qcli")
            if not is_qcli and label != LABELS["plain"] and qcli and ok(qcli) and (ok(r) or "timeout" in r):
                vs_qcli = f"{more}{_secs(r) / qcli['seconds']:.1f}x"
                if r.get("hwm_kb"):
                    rss_qcli = f"{more}{r['hwm_kb'] / qcli['hwm_kb']:.1f}x"
            wall = fmt_time(r)
            if "error" in r:
                notes.append(f"{name} {n} samples, {label.strip()} failed: {r['error']}")
            table.add_row(str(n) if i == 0 else "", label, wall, fmt_mb(r), vs_plain, vs_qcli, rss_qcli,
                          end_section=i == len(rows) - 1)
    return table


def _targets_table(models, samples: list[int], results: dict) -> Sheet:
    """The issue's targets, measured: flat memory, time against fp32, speed and memory against
    onnxruntime's histogram calibrators."""
    targets = Sheet("Targets (reported, not asserted)", ["model", "target", ("measured", "right"), ""])
    for name, _ in models:
        lo, hi = min(samples), max(samples)
        a, b = results.get((name, lo, "qcli")), results.get((name, hi, "qcli"))
        if a and b and ok(a) and ok(b) and lo != hi:
            ratio = b["hwm_kb"] / a["hwm_kb"]
            targets.add_row(name, f"qcli peak RSS, {hi} / {lo} samples  <= {RSS_FLAT}", f"{ratio:.2f}",
                            _mark(ratio <= RSS_FLAT))
        for n in samples:
            _time_targets(targets, name, n, results)
        _ort_targets(targets, name, max(samples), results)
    return targets


def _time_targets(targets, name: str, n: int, results: dict) -> None:
    plain, qcli = results.get((name, n, "plain")), results.get((name, n, "qcli"))
    if not (plain and qcli and ok(plain) and ok(qcli)):
        return
    ratio, bound = qcli["seconds"] / plain["seconds"], TIME_VS_PLAIN_OF.get(name, TIME_VS_PLAIN)
    targets.add_row(name, f"qcli calibrate time / fp32, {n} samples  <= {bound}", f"{ratio:.2f}", _mark(ratio <= bound))
    ratio = qcli["parts"]["pass"] / plain["seconds"]
    targets.add_row(name, f"(not a target) qcli pass alone / fp32, {n} samples", f"{ratio:.2f}", "info")
    floor = results.get((name, n, "floor"))
    if floor and ok(floor):
        solves = sum(qcli["parts"].get(k, 0.0) for k in ("solve", "save"))
        ratio = (floor["seconds"] + solves) / plain["seconds"]
        targets.add_row(name, f"(not a target) floor: fp32 + observed outputs + qcli's solves / fp32, {n} samples",
                        f"{ratio:.2f}", "info")


def _ort_targets(targets, name: str, n: int, results: dict) -> None:
    qcli = results.get((name, n, "qcli"))
    for method in ("Percentile", "Entropy"):
        for kind in (f"ort-{method}", f"ort-{method} strided"):
            r = results.get((name, n, kind))
            if r is None or not (qcli and ok(qcli)):
                continue
            label = LABELS[f"ort-{method}"] + (" strided" if kind.endswith("strided") else "")
            if "error" in r:
                targets.add_row(name, f"{label}, {n} samples", "failed", "n/a")
                continue
            more = "> " if "timeout" in r else ""
            speed = _secs(r) / qcli["seconds"]
            targets.add_row(name, f"{label} time / qcli, {n} samples  >= {VS_ORT:g}", f"{more}{speed:.1f}",
                            _mark(speed >= VS_ORT))
            if r.get("hwm_kb"):
                mem = r["hwm_kb"] / qcli["hwm_kb"]
                targets.add_row(name, f"{label} peak RSS / qcli, {n} samples  >= {VS_ORT:g}",
                                f"{more}{mem:.1f}", _mark(mem >= VS_ORT))


def _secs(r: dict) -> float:
    return r["timeout"] if "timeout" in r else r["seconds"]


def _mark(met: bool) -> str:
    return "[green]met[/green]" if met else "[bold red]MISSED[/bold red]"


if __name__ == "__main__":
    sys.exit(main())
