"""Does qcli's verdict hold on data it never saw? For each trained model with real inputs, a
32-sample calibration folder and >= 200 held-out samples: `qcli quantize MODEL -o OUT --data
calib/` as a new user runs it (default config), its exit code and verdict, next to the
held-out fidelity of the model it wrote, per output, judged by qcli's own kinds, floors and
verdict rule (qcli.analyze.verdict) on the held-out samples.

    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py                    # every model (~10 min, 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --models magika ocr-rec
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --recovery bias_correction   # qcli with recovery steps
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --markdown   # the table also in benchmarks/results/heldout.md

Models: those of benchmarks/recovery.py (their input writers, other split sizes; Silero VAD's
speech is spoken by the espeak-ng program when on PATH, else by the espeak-ng library of
piper's wheel through ctypes), magika (the first and last 1,024 bytes of Python's
standard-library files; the files of the two splits are different), PaddleOCR's text detector
(pages of text, 448 x 320), NudeNet's YOLOv8 detector (crops of the photos, 320 x 320) and
piper's diacritizers, nakdimon (Hebrew) and tashkeel (Arabic), on the Hebrew and Arabic
messages of this machine's gettext catalogues (/usr/share/locale/{he,ar}), encoded as piper
encodes text (the messages of the two splits are different). The recognizer's strings are compared
stripped of leading and trailing spaces (`verify.sequence_trim: [6624]`, in qcli's run and in
the judge: `VERIFY`), as an OCR pipeline compares text. Columns: what qcli compared on
and its checks (value, 95% interval, samples); the held-out figure of every gated output
(value, interval, samples) and whether it meets the floor there: "holds" when the held-out
value reaches the floor, "holds by the rule" when the verdict rule (interval or cosine
tie-break) says met as well. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inputs  # noqa: E402  (benchmarks/inputs.py)
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
MAGIKA = inputs.REAL / "magika" / "models" / "standard_v3_3" / "model.onnx"
PADDLE = inputs.REAL / "rapidocr_onnxruntime" / "models"
CALIB, HELD_OUT = 32, 208


def write_files(out: Path, sizes: dict[str, int]) -> dict[str, Path]:
    """magika's input per file (`inputs.magika_tokens`) from Python's standard library, each
    split its own files (a fixed shuffle)."""
    files = inputs.stdlib_files()
    order = np.random.default_rng(5).permutation(len(files))
    folders, start = {}, 0
    for split, n in sizes.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, k in enumerate(order[start:start + n]):
            np.save(folder / f"{i:04d}.npy", inputs.magika_tokens(files[k]))
        start += n
    return folders


# name -> (model, writer of {"calib": ..., "holdout": ...}, a program the writer needs: `lacking`)
MODELS: dict[str, tuple[Path, Callable[[Path], dict[str, Path]], str | None]] = {
    "encoder": (inputs.ENCODER, partial(inputs.write_encoder, sizes={"calib": CALIB, "holdout": 256}), None),
    "cnn-pages": (inputs.CNN, partial(inputs.write_pages, pages={"calib": CALIB // 4, "holdout": HELD_OUT // 4}),
                  None),
    "cnn-photos": (inputs.CNN, partial(inputs.write_photos, splits={k: inputs.PHOTO_SPLITS[k]
                                                                    for k in ("calib", "holdout")}), None),
    "ocr-rec": (PADDLE / "ch_PP-OCRv4_rec_infer.onnx",
                partial(inputs.write_lines, lines={"calib": CALIB, "holdout": HELD_OUT}), None),
    "ocr-cls": (PADDLE / "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                partial(inputs.write_lines, lines={"calib": CALIB, "holdout": HELD_OUT}, width=192, flip=True), None),
    "ddddocr": (inputs.REAL / "ddddocr" / "common.onnx",
                partial(inputs.write_captchas, splits={"calib": CALIB, "holdout": 256}), None),
    "magika": (MAGIKA, partial(write_files, sizes={"calib": CALIB, "holdout": 256}), None),
    "ocr-det": (PADDLE / "ch_PP-OCRv4_det_infer.onnx",
                partial(inputs.write_det_pages, pages={"calib": CALIB, "holdout": HELD_OUT}), None),
    "nudenet": (inputs.REAL / "nudenet" / "320n.onnx",
                partial(inputs.write_detector_photos, splits={k: inputs.PHOTO_SPLITS[k] for k in ("calib", "holdout")}),
                None),
    "silero-vad": (inputs.VAD, partial(inputs.write_speech, splits={"calib": 6, "holdout": 12},
                                       samples={"calib": CALIB}), "espeak-ng"),
    "nakdimon": (inputs.NAKDIMON, partial(inputs.write_nakdimon, sizes={"calib": CALIB, "holdout": 256}), None),
    "tashkeel": (inputs.TASHKEEL, partial(inputs.write_tashkeel, sizes={"calib": CALIB, "holdout": 256}), None),
}


# verify settings a user of the model gives (qcli's run and the held-out judge alike): an OCR
# pipeline compares its text stripped of leading and trailing spaces (6624: the recognizer's space)
VERIFY: dict[str, dict] = {"ocr-rec": {"sequence_trim": [6624]}}


def lacking(needs: str | None) -> list[str]:
    """What a writer needs and this machine lacks: espeak-ng is met by the program on PATH or by
    piper's espeak-ng library (`inputs.can_speak`)."""
    if needs is None or (inputs.can_speak() if needs == "espeak-ng" else shutil.which(needs)):
        return []
    return [needs]


def missing(name: str) -> list[str]:
    """What model `name` needs and this machine lacks: its file (`make real-models`), its writer's program."""
    model, _, needs = MODELS[name]
    return ([str(model)] if not model.is_file() else []) + lacking(needs)


def run_qcli(model: Path, calib: Path, out: Path, config: Path | None = None) -> tuple[int, dict | None, str]:
    """`qcli quantize MODEL -o OUT --data CALIB --json [--config CONFIG]` in its own process: exit
    code, JSON, error line."""
    extra = ["--config", str(config)] if config is not None else []
    done = subprocess.run([sys.executable, "-m", "qcli.cli", "quantize", str(model), "-o", str(out), "--data",
                           str(calib), "--json", *extra], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stderr.strip().splitlines()
    error = next((line for line in lines if line.startswith("error")), lines[-1] if lines else "")
    try:
        return done.returncode, json.loads(done.stdout), error
    except json.JSONDecodeError:
        return done.returncode, None, error


def held_out(model: Path, quantized: Path, folder: Path, verify: dict | None = None) -> list:
    """The verdicts on every gated output of `quantized` against `model` on `folder` (default
    floors; `verify`: settings of the verify section)."""
    import onnx

    from qcli.analyze.probe import Probe
    from qcli.analyze.verdict import verdicts
    from qcli.config import Verify
    from qcli.data import DataFolder, model_inputs

    float_model = onnx.load(model)
    specs = model_inputs(float_model)
    vf = Verify(**(verify or {}))
    probe = Probe(float_model, list(DataFolder(folder, specs).batches(32)), specs, verify=vf)
    return verdicts(probe.measure(onnx.load(quantized)), vf.min_top1_agreement, vf.min_cosine)


def figure(metric: str, output: str | None, value: float, interval, samples, passed: bool | None = None) -> str:
    within = f" [{interval[0]:.4f}, {interval[1]:.4f}] n={samples}" if interval else ""
    mark = "" if passed is None else (" ok" if passed else " [red]missed[/red]")
    return f"{metric} ({output}) {value:.4f}{within}{mark}"


def row(name: str, model: Path, work: Path, folds: int | None, method: str | None,
        recovery: list[str] | None = None) -> tuple[str, str, str, str]:
    folders = MODELS[name][1](work / "inputs")
    counts = ", ".join(f"{split} {len(list(folder.glob('*.np[yz]')))}" for split, folder in folders.items())
    out = work / f"{name}.onnx"
    config = None
    verify = {**VERIFY.get(name, {}), **({"folds": folds} if folds is not None else {})}
    if verify or method is not None or recovery is not None:
        config = work / "config.yaml"
        config.write_text("version: 1\n" + (f"verify: {json.dumps(verify)}\n" if verify else "")
                          + (f"calibration: {{method: {method}}}\n" if method is not None else "")
                          + (f"recovery: [{', '.join(recovery)}]\n" if recovery is not None else ""))
    began = time.perf_counter()
    code, doc, error = run_qcli(model, folders["calib"], out, config)
    took = time.perf_counter() - began
    verification = (doc or {}).get("verification")
    if verification is None:
        said = error or "no verification"
    else:
        said = f"compared on {verification['data']}\n" + "\n".join(
            figure(c["name"], c.get("output"), c["value"], c.get("interval"), c.get("samples"), c["passed"])
            + (f", predicted {m[1]}" if (m := re.search(r"predict (\d\.\d+)", c.get("how", ""))) else "")
            for c in verification["checks"])
    if not out.is_file():
        return f"{name}\n[dim]{counts}[/dim]", f"exit {code}\n{took:.0f} s", said, "[red]no model written[/red]"
    found = held_out(model, out, folders["holdout"], VERIFY.get(name))
    holds = all(v.value >= v.floor for v in found)
    by_rule = all(v.passed for v in found)
    lines = [figure(v.metric, v.output, v.value, v.interval, v.samples, v.value >= v.floor) for v in found]
    verdict = "holds" + (" by the rule" if by_rule else " (not by the rule)") if holds else "[red]does not hold[/red]"
    size = f"\n{doc['compression']:.2f}x smaller" if doc and doc.get("compression") else ""
    return f"{name}\n[dim]{counts}[/dim]", f"exit {code}\n{took:.0f} s{size}", said, "\n".join([*lines, verdict])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--folds", type=int, default=None, help="verify.folds for qcli (default: qcli's)")
    parser.add_argument("--method", choices=["minmax", "percentile", "kl", "mse"], default=None,
                        help="calibration.method for qcli (default: qcli's)")
    parser.add_argument("--recovery", nargs="*", default=None,
                        choices=["bias_correction", "equalization", "smoothquant"],
                        help="recovery steps for qcli (default: qcli's; none given: none)")
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)

    page = bench_page(args.markdown)
    table = Sheet("qcli's verdict (32 calibration samples) beside the held-out truth",
                  ["model (samples)", "qcli", "qcli's checks", "held-out, same floors"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qcli-bench-heldout-") as tmp:
        for name in args.models:
            model = MODELS[name][0]
            if lacks := missing(name):
                page.line(f"[yellow]skipped {name}: {', '.join(lacks)} not found "
                              f"(`make real-models`; Debian: apt-get install espeak-ng)[/yellow]")
                continue
            began = time.perf_counter()
            table.add_row(*row(name, model, Path(tmp) / name, args.folds, args.method, args.recovery), end_section=True)
            page.print(f"{name}: {time.perf_counter() - began:.0f} s")
    page.table(table)
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
