"""How well the target profile predicts latency: predicted vs measured ratio (quantized /
the user's original file, batch 1) on the exported models, with onnxruntime's quantize_static
model beside qcli's.

    PYTHONPATH=. .venv/bin/python benchmarks/target.py                      # every model
    PYTHONPATH=. .venv/bin/python benchmarks/target.py --models ocr-det --variants int8 default
    PYTHONPATH=. .venv/bin/python benchmarks/target.py --markdown   # the table also in benchmarks/results/target.md

Per model (benchmarks/heldout.py's, `make real-models`; 32 calibration samples): the models
are `int8` (`qcli quantize --no-verify`: everything qcli can quantize, int8), `default` (the
default `qcli quantize`: what it ships) and `ort` (onnxruntime's quantize_static, QDQ, as
benchmarks/quantize.py runs it). The prediction is `qcli.target.predict` under the profile
`auto` picks here; the measurement times the original and the quantized model A B B A,
ROUNDS rounds at batch 1 on the first calibration sample, and gives the median of per-round
ratios with its ~95% interval (`qcli.analyze.latency`). Issue 44's targets, reported: the
prediction within +-10% of the measurement on >= 80% of the models, and never "faster" for a
model measured > 5% slower.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (benchmarks/heldout.py)
from ort_quantize import STRIDED, calibration_reader, ort_preprocess, run_quantize_static  # noqa: E402
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

ROOT = Path(__file__).resolve().parents[1]
MODELS = [name for name in heldout.MODELS if name != "cnn-pages"]
ROUNDS = 60


def quantized(variant: str, model: Path, calib: Path, out: Path) -> str:
    """Write `variant`'s model of `model` to `out`; what happened, for the table."""
    if variant == "ort":
        source, _ = ort_preprocess(model, out.with_suffix(".pre.onnx"))
        for options in ({}, STRIDED[1]):  # samples of different lengths: one per call, strided
            try:
                run_quantize_static(source, partial(calibration_reader, model, calib, 8 if not options else 1), out,
                                    "MinMax", **options)
                return "written"
            except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash
                said = f"ort failed: {str(exc)[:60]}"
        return said
    extra = ["--no-verify"] if variant == "int8" else []
    done = subprocess.run([sys.executable, "-m", "qcli.cli", "quantize", str(model), "-o", str(out), "--data",
                           str(calib), "-q", *extra], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return f"exit {done.returncode}"


def compare(original: Path, model: Path, calib: Path):
    """(predicted ratio, predicted original ms, measured Ratio, measured original ms)."""
    import onnx

    from qcli.analyze.latency import measure, paired, timed_inputs
    from qcli.data import DataFolder, model_inputs
    from qcli.runtime import make_session
    from qcli.target import predict, resolve

    float_model, candidate = onnx.load(original), onnx.load(model)
    specs = model_inputs(float_model)
    feeds, _ = timed_inputs(next(DataFolder(calib, specs).batches(1)), specs, 1)
    profile, _ = resolve("auto")
    before, after = predict(float_model, feeds, profile), predict(candidate, feeds, profile)
    a, b = make_session(float_model, timing=True), make_session(candidate, timing=True)
    speed = measure(lambda: a.run(None, feeds), lambda: b.run(None, feeds), runs=ROUNDS, warmup=10, batch=1,
                    threads=None)
    return after.us / before.us, before.ms, paired(speed), speed.float.median_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--variants", nargs="+", default=["int8", "default", "ort"], choices=["int8", "default", "ort"])
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)
    from qcli.errors import QcliError

    page = bench_page(args.markdown)
    table = Sheet("predicted vs measured latency ratio (quantized / original file, batch 1)",
                  ["model", "variant", "original ms (pred / meas)", "predicted", "measured [95%]", "error", "ok"])
    within = total = wrong_side = 0
    with tempfile.TemporaryDirectory(prefix="qcli-bench-target-") as tmp:
        for name in args.models:
            model = heldout.MODELS[name].path
            if lacks := heldout.missing(name):
                page.line(f"[yellow]skipped {name}: {', '.join(lacks)} not found (`make real-models`)[/yellow]")
                continue
            calib = heldout.MODELS[name].write(Path(tmp) / name / "inputs")["calib"]
            for variant in args.variants:
                out = Path(tmp) / name / f"{variant}.onnx"
                said = quantized(variant, model, calib, out)
                if not out.is_file():
                    table.add_row(name, variant, "", "", said, "", "")
                    continue
                try:
                    predicted, pred_ms, measured, meas_ms = compare(model, out, calib)
                except QcliError as exc:  # onnxruntime's quantize_static writes models it cannot load
                    table.add_row(name, variant, "", "", f"does not load: {exc.message[:70]}", "", "")
                    continue
                error = predicted / float(measured) - 1
                total += 1
                within += abs(error) <= 0.10
                wrong = float(measured) > 1.05 and predicted < 1.0
                wrong_side += wrong
                page.print(f"  {name} {variant}: predicted {predicted:.3f}, measured {float(measured):.3f}")
                table.add_row(name, f"{variant} ({said})", f"{pred_ms:.3f} / {meas_ms:.3f}", f"{predicted:.3f}",
                              f"{float(measured):.3f} [{measured.low:.3f}, {measured.high:.3f}]", f"{error:+.1%}",
                              "[red]faster predicted, measured slower[/red]" if wrong else
                              ("yes" if abs(error) <= 0.10 else "[yellow]off by > 10%[/yellow]"))
            table.add_section()
            page.print(f"{name}: done ({time.strftime('%H:%M:%S')})")
    page.table(table)
    if total:
        page.line(f"within +-10%: {within} of {total} ({within / total:.0%}, target >= 80%); predicted faster "
                  f"while measured > 5% slower: {wrong_side} (target 0); load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
