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
ROUNDS rounds at batch 1 on the first calibration sample, in each of PAIRS fresh pairs of
sessions (one session pair's ratio can sit 20% off another's on a VM: where the arena and the
threads land), and gives the median of the pairs' median ratios with their range, the floor
under any prediction's error. `--profiles` prices each model under several profiles in the one
run (default: the one `auto` picks here). Issue 44's targets, reported: the prediction within
+-10% of the measurement on >= 80% of the models, and never "faster" for a model measured > 5%
slower.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
ROUNDS, PAIRS = 20, 5


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


def compare(original: Path, model: Path, calib: Path, profiles: list[str]) -> tuple[list[float], list[float]]:
    """(the predicted ratio under each of `profiles`, the measured ratio of each session pair)."""
    import numpy as np
    import onnx

    from qcli.analyze.latency import measure, paired, timed_inputs
    from qcli.data import DataFolder, model_inputs
    from qcli.runtime import make_session
    from qcli.target import resolve
    from qcli.target.executed import run
    from qcli.target.predict import priced

    float_model, candidate = onnx.load(original), onnx.load(model)
    specs = model_inputs(float_model)
    feeds, _ = timed_inputs(next(DataFolder(calib, specs).batches(1)), specs, 1)
    predicted, kernels = [], {}  # what onnxruntime runs, read once per thread count (qcli.target.predict)
    for spec in profiles:
        profile, _ = resolve(spec)
        if profile.threads not in kernels:
            kernels[profile.threads] = [run(m, feeds, profile.threads).kernels for m in (float_model, candidate)]
        f, q = kernels[profile.threads]
        predicted.append(priced(q, profile).us / priced(f, profile).us)
    measured = []
    for _ in range(PAIRS):
        a, b = make_session(float_model, timing=True), make_session(candidate, timing=True)
        speed = measure(partial(a.run, None, feeds), partial(b.run, None, feeds), runs=ROUNDS, warmup=5, batch=1,
                        threads=None)
        measured.append(float(paired(speed)))
        del a, b
    return predicted, [float(np.round(r, 4)) for r in measured]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--variants", nargs="+", default=["int8", "default", "ort"], choices=["int8", "default", "ort"])
    parser.add_argument("--profiles", nargs="+", default=["auto"],
                        help="target profiles to price each model under (shipped names or files)")
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)
    from qcli.errors import QcliError

    page = bench_page(args.markdown)
    names = [Path(p).stem if p.endswith(".json") else p for p in args.profiles]
    table = Sheet("predicted vs measured latency ratio (quantized / original file, batch 1)",
                  ["model", "variant", f"measured: median [range of {PAIRS} session pairs]",
                   *(f"{n}: predicted (error)" for n in names)])
    within, wrong_side, total, floor = [0] * len(names), [0] * len(names), 0, 0
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
                    table.add_row(name, variant, said, *[""] * len(names))
                    continue
                try:
                    predicted, pairs = compare(model, out, calib, args.profiles)
                except QcliError as exc:  # onnxruntime's quantize_static writes models it cannot load
                    table.add_row(name, variant, f"does not load: {exc.message[:70]}", *[""] * len(names))
                    continue
                measured = statistics.median(pairs)
                total += 1
                floor += max(pairs) / min(pairs) > 1.2  # no prediction is within 10% of every pair
                cells = []
                for i, p in enumerate(predicted):
                    error = p / measured - 1
                    within[i] += abs(error) <= 0.10
                    wrong = measured > 1.05 and p < 1.0
                    wrong_side[i] += wrong
                    cells.append(f"{p:.3f} ({error:+.1%})" + (" [red]faster, measured slower[/red]" if wrong else
                                                             ("" if abs(error) <= 0.10 else " [yellow]off[/yellow]")))
                page.print(f"  {name} {variant}: measured {measured:.3f} {pairs}, predicted {predicted}")
                table.add_row(name, f"{variant} ({said})", f"{measured:.3f} [{min(pairs):.3f}, {max(pairs):.3f}]",
                              *cells)
            table.add_section()
            page.print(f"{name}: done ({time.strftime('%H:%M:%S')})")
    page.table(table)
    if total:
        for i, n in enumerate(names):
            page.line(f"{n}: within +-10% of the median: {within[i]} of {total} ({within[i] / total:.0%}, "
                      f"target >= 80%); predicted faster while measured > 5% slower: {wrong_side[i]} (target 0)")
        page.line(f"models whose session pairs span more than 1.2x (no figure is within 10% of each): {floor} of "
                  f"{total}; load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
