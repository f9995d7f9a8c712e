"""What the default `qcli quantize` costs on the exported models, side by side with
onnxruntime's `quantize_static`: wall time and peak RSS of each, qcli's phases, and `qcli
calibrate` against plain fp32 inference over the same samples.

    PYTHONPATH=. .venv/bin/python benchmarks/quantize.py --exported          # every model (~6 min, 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/exported.py --models ocr-det encoder --rounds 2
    PYTHONPATH=. .venv/bin/python benchmarks/exported.py --markdown  # tables also in benchmarks/results/exported.md

Models and inputs: those of benchmarks/heldout.py (`make real-models`), and `ocr-det-640`, its
PP-OCRv4 text detector on 640 x 640 pages (long inputs, beside dnsmos's 9 s clips and layout's
608 x 800 pages), 32 real calibration samples each (rendered text lines and pages, photos,
captchas, files, espeak-ng speech, gettext messages). Each run is its own child process, one
after another, timed from start to exit (Python's start and imports included, the same for all;
qcli's bytecode compiled ahead, as an installed package's is: `installed_env`) with its peak
RSS (the VmHWM it reports at exit: `child`):

* ``qcli``: `qcli quantize MODEL -o OUT --data CALIB --json` (default config: calibration,
  k-fold verification, the rescue when a floor is missed, the model written and checked);
  its phases are the JSON's `phases` (qcli/phases.py).
* ``ort``: `quant_pre_process` then `quantize_static(QDQ, QUInt8 activations, QInt8 weights,
  per_channel=True, MinMax)` over the same samples, 8 per call (benchmarks/ort_quantize.py, as
  benchmarks/quantize.py runs it); a failure is retried as that script does (one sample per
  call with `CalibStridedMinMax`, else per tensor) and said in the table.
* ``fp32``: `qcli.runtime.make_session` and one run of every batch of 8: what any
  calibration pays; ``calibrate``: `qcli calibrate MODEL --data CALIB --method mse`.
* ``eval`` (with `--eval`): `qcli quantize MODEL -o OUT --data CALIB --eval-data HOLDOUT --json`,
  the path the verification guide recommends (verdicts on the first 64 held-out samples, then
  the written model evaluated on all of them, heldout.py's 208 mostly): its own columns, wall
  and RSS against ort's (RSS also against 1 GB for a model under 10 MB); models whose inputs
  have no held-out split (ocr-det-640) are left out of it.

Targets (issue 19), reported and not asserted: qcli wall <= 3x ort's and peak RSS <= 1.2x;
`qcli calibrate` <= 1.5x fp32 inference (the detector; the sample models: calibration.py).
With `--rounds N` each child runs N times, one kind after another, and the median is shown
(the machine's cores are shared with other machines' work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (benchmarks/heldout.py)
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

from qcli.phases import peak_phase  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the long inputs issue 46 asks for beside dnsmos's 9 s clips and layout's 608 x 800 pages: the
# PP-OCRv4 detector on 640 x 640 pages (its held-out table runs 448 x 320)
LONG = {"ocr-det-640": heldout.MODELS["ocr-det"]._replace(
    write=partial(heldout.inputs.write_det_pages, pages={"calib": heldout.CALIB}, size=(640, 640)))}
EXPORTED = {**{name: m for name, m in heldout.MODELS.items() if name != "cnn-pages"}, **LONG}  # one data set per model
MODELS = list(EXPORTED)


def installed_env() -> dict[str, str]:
    """The children's environment: qcli from this checkout, its bytecode compiled ahead (into
    its `__pycache__` folders, as Python does by default and `pip install` does for a package;
    onnxruntime's tools run from theirs), also where the caller's environment says not to
    write bytecode (PYTHONDONTWRITEBYTECODE: then qcli's ~110 modules are compiled again in
    every process, ~0.15 s)."""
    import compileall

    compileall.compile_dir(ROOT / "qcli", quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


@dataclass
class Run:
    """One child process: wall seconds, peak RSS (MB), exit code, and what it printed."""

    seconds: float
    rss_mb: float
    code: int
    out: str = ""


def child(kind: str, model: Path, calib: Path, out: Path, env: dict[str, str]) -> Run:
    """One kind in a child process (this script's `--child`), timed to its exit. Its peak RSS
    is the VmHWM the child reports at exit: the kernel's ru_maxrss of a forked child starts
    from this (large) process's RSS and survives exec."""
    args = [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(model), str(calib), str(out)]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    peak = next((float(line.split()[1]) for line in reversed(lines) if line.startswith(PEAK)), float("nan"))
    return Run(took, peak / 1024, done.returncode, done.stdout)


PEAK = "peak-rss-kb"


def report_peak() -> None:
    """At exit: this process's VmHWM (peak resident set) on stderr, for `child`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            print(PEAK, line.split()[1], file=sys.stderr, flush=True)


def run_child(kind: str, model: Path, calib: Path, out: Path) -> int:
    """Child side: `qcli quantize` / `qcli calibrate` as the CLI runs them, or `ort` / `fp32`."""
    import atexit
    import runpy

    atexit.register(report_peak)
    if kind in ("ort", "fp32"):
        return {"ort": run_ort, "fp32": run_fp32}[kind](model, calib, out)
    command = {"qcli": ["quantize", str(model), "-o", str(out), "--data", str(calib), "--json"],
               "eval": ["quantize", str(model), "-o", str(out), "--data", str(calib), "--eval-data",
                        str(calib.parent / "holdout"), "--json"],
               "calibrate": ["calibrate", str(model), "--data", str(calib), "--method", "mse", "-o", str(out),
                             "--json"]}[kind]
    sys.argv = ["qcli", *command]
    runpy.run_module("qcli.cli", run_name="__main__")  # exits with qcli's code
    return 0


@dataclass
class Row:
    name: str
    runs: dict[str, list[Run]] = field(default_factory=dict)

    def median(self, kind: str, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.runs.get(kind, []) if r.code in (0, 1)]
        return statistics.median(values) if values else None


def run_ort(model: Path, calib: Path, out: Path) -> int:
    """Child side of ``ort``: benchmarks/quantize.py's onnxruntime pipeline, MinMax."""
    from ort_quantize import PER_TENSOR, STRIDED, calibration_reader, error_line, ort_preprocess, run_quantize_static

    source, notes = ort_preprocess(model, out.with_suffix(".pre.onnx"))
    for per_call, options in ((8, {}), (1, STRIDED[1]), (8, PER_TENSOR[1])):
        try:
            run_quantize_static(source, partial(calibration_reader, model, calib, per_call), out, "MinMax", **options)
            print(json.dumps({"notes": notes, "options": str(options or "default")}))
            return 0
        except Exception as exc:  # a failed variant is a result; the next one is tried
            notes.append(f"{options or 'default'}: {error_line(exc)}")
    print(json.dumps({"notes": notes, "options": None}))
    return 1


def run_fp32(model: Path, calib: Path, out: Path) -> int:
    """Child side of ``fp32``: one session, every batch of 8 run once."""
    from qcli.data import DataFolder, model_inputs
    from qcli.model import load_model
    from qcli.runtime import make_session

    loaded = load_model(model)
    session = make_session(loaded)
    for batch in DataFolder(calib, model_inputs(loaded)).batches(8):
        session.run(None, batch.inputs)
    return 0


KINDS = ("qcli", "ort", "fp32", "calibrate")


def measure(name: str, work: Path, rounds: int, env: dict[str, str], kinds: tuple[str, ...] = KINDS) -> Row:
    """Every kind on one model, `rounds` times, one kind after another ("eval" only where the
    inputs have a held-out split)."""
    model, writer = EXPORTED[name].path, EXPORTED[name].write
    splits = writer(work / "inputs")
    calib = splits["calib"]
    row = Row(name)
    for _ in range(rounds):
        for kind in (k for k in kinds if k != "eval" or "holdout" in splits):
            out = work / (f"{kind}.onnx" if kind != "calibrate" else "calib.json")
            row.runs.setdefault(kind, []).append(child(kind, model, calib, out, env))
    return row


def _times(r: Row, kind: str) -> str:
    s, m = r.median(kind, "seconds"), r.median(kind, "rss_mb")
    return "failed" if s is None or m is None else f"{s:.1f} s  {m:.0f} MB"


def _ratio(a: float | None, b: float | None, target: float) -> str:
    if a is None or b is None:
        return "-"
    x = a / b
    return f"{x:.2f}x " + ("[green]ok[/green]" if x <= target else "[red]miss[/red]")


def cost_table(rows: list[Row]) -> Sheet:
    evals = any("eval" in r.runs for r in rows)
    table = Sheet("default `qcli quantize` vs onnxruntime quantize_static (32 samples)",
                  ["model", "qcli exit", "qcli", "ort", "wall (<= 3x)", "RSS (<= 1.2x)", "fp32 inference",
                   "qcli calibrate", "calibrate / fp32 (<= 1.5x)",
                   *(["qcli --eval-data: exit, wall, RSS", "wall (<= 3x)", "RSS (<= 1.2x; <= 1 GB)"] if evals else [])])
    for r in rows:
        codes = ",".join(str(run.code) for run in r.runs["qcli"])
        ort = json.loads(r.runs["ort"][-1].out or "{}").get("options") if r.runs["ort"][-1].code == 0 else None
        table.add_row(
            r.name, codes, _times(r, "qcli"), _times(r, "ort") + ("" if ort in (None, "default") else f" ({ort})"),
            _ratio(r.median("qcli", "seconds"), r.median("ort", "seconds"), 3.0),
            _ratio(r.median("qcli", "rss_mb"), r.median("ort", "rss_mb"), 1.2),
            _times(r, "fp32"), _times(r, "calibrate"),
            _ratio(r.median("calibrate", "seconds"), r.median("fp32", "seconds"), 1.5),
            *(_eval_cells(r) if evals else []),
        )
    return table


def _eval_cells(r: Row) -> list[str]:
    """The ``eval`` kind's cells: its exits and costs, wall and RSS against ort's, and RSS
    against 1 GB for a model under 10 MB (issue 46)."""
    if "eval" not in r.runs:
        return ["no held-out split", "-", "-"]
    rss, small = r.median("eval", "rss_mb"), EXPORTED[r.name].path.stat().st_size < 10 << 20
    cap = "" if rss is None or not small else (" [green]< 1 GB[/green]" if rss <= 1024 else " [red]>= 1 GB[/red]")
    codes = ",".join(str(run.code) for run in r.runs["eval"])
    return [f"{codes}: {_times(r, 'eval')}", _ratio(r.median("eval", "seconds"), r.median("ort", "seconds"), 3.0),
            _ratio(rss, r.median("ort", "rss_mb"), 1.2) + cap]


PHASES = ("load", "prepare", "calibrate", "calibrate/observe", "calibrate/solve", "build", "reference", "verify",
          "verify/measure", "verify/time", "verify/search", "verify/search/build", "verify/search/measure",
          "verify/search/measure/build", "verify/search/noise", "verify/search/profile", "verify/search/time",
          "verify/search/weight-only", "verify/weight-only", "write")


def phase_table(rows: list[Row]) -> Sheet:
    """qcli's phases (seconds, calls when more than one) of its last run on each model."""
    table = Sheet("where qcli's time goes (`--json` phases; seconds, x calls)",
                  ["phase", *((r.name, "right") for r in rows)])
    docs = []
    for r in rows:
        try:
            docs.append(json.loads(r.runs["qcli"][-1].out).get("phases", {}))
        except json.JSONDecodeError:
            docs.append({})
    for phase in PHASES:
        cells = []
        for doc in docs:
            p = doc.get(phase)
            cells.append("" if p is None else f"{p['seconds']:.1f}" + (f" x{p['calls']}" if p["calls"] > 1 else ""))
        table.add_row(phase, *cells)
    table.add_row("peak RSS reached in", *(_peak_phase(doc) for doc in docs))
    return table


def _peak_phase(phases: dict) -> str:
    """The first phase, in the order they ran, whose peak RSS (`peak_mb`) is the run's: where
    qcli's memory peaked, and how much of it was there when calibration ended."""
    peak = peak_phase(phases)
    if peak is None:
        return ""
    return f"{peak[0]} ({peak[1]:.0f} MB; {phases.get('calibrate', {}).get('peak_mb', 0.0):.0f} after calibrate)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each kind (median shown)")
    parser.add_argument("--eval", action="store_true", help="also `qcli quantize --eval-data` on the verify split")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "MODEL", "CALIB", "OUT"), help=argparse.SUPPRESS)
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)
    if args.child:
        kind, *paths = args.child
        return run_child(kind, *map(Path, paths))

    page = bench_page(args.markdown, f"{args.rounds} round(s)")
    start, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="qcli-bench-exported-") as tmp:
        env = installed_env()
        for name in args.models:
            if lacks := heldout.missing(name, EXPORTED):
                page.line(f"[yellow]skipped {name}: {', '.join(lacks)} not found (`make real-models`)[/yellow]")
                continue
            began = time.perf_counter()
            rows.append(measure(name, Path(tmp) / name, args.rounds, env, (*KINDS, "eval") if args.eval else KINDS))
            page.print(f"{name}: {time.perf_counter() - began:.0f} s")
    if rows:
        page.table(cost_table(rows))
        page.table(phase_table(rows))
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
