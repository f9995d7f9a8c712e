"""Same model, data and config: the same bytes and exit code under any machine load (issue 44).

    PYTHONPATH=. .venv/bin/python benchmarks/determinism.py                  # every exported model
    PYTHONPATH=. .venv/bin/python benchmarks/determinism.py --models ocr-det
    PYTHONPATH=. .venv/bin/python benchmarks/determinism.py --markdown   # also benchmarks/results/determinism.md

Per model (benchmarks/heldout.py's, `make real-models`; its 32 calibration samples), the
default `qcli quantize MODEL -o OUT --data CALIB` five times: idle, beside two CPU-bound
processes, pinned to one core (`taskset -c 0`), idle again, and with `--executor local
--workers 2`. The table gives each run's exit code and the md5 of the model it wrote; a model
passes with one md5 and one exit code over the five.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (benchmarks/heldout.py)
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

ROOT = Path(__file__).resolve().parents[1]
MODELS = [name for name in heldout.MODELS if name != "cnn-pages"]
CONDITIONS = ("idle", "2 CPU hogs", "taskset -c 0", "idle again", "--workers 2")


def run(condition: str, model: Path, calib: Path, out: Path) -> tuple[int, str, float]:
    """One `qcli quantize` under `condition`: exit code, md5 of the model written, seconds."""
    command = [sys.executable, "-m", "qcli.cli", "quantize", str(model), "-o", str(out), "--data", str(calib), "-q"]
    if condition == "--workers 2":
        command += ["--executor", "local", "--workers", "2"]
    if condition == "taskset -c 0" and shutil.which("taskset"):
        command = ["taskset", "-c", "0", *command]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(2 if "hogs" in condition else 0)]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        for hog in hogs:
            hog.kill()
    digest = hashlib.md5(out.read_bytes()).hexdigest()[:10] if out.is_file() else "none"
    out.unlink(missing_ok=True)
    return done.returncode, digest, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)

    page = bench_page(args.markdown)
    table = Sheet("default qcli quantize, five runs per model", ["model", *CONDITIONS, "same"])
    same = 0
    with tempfile.TemporaryDirectory(prefix="qcli-bench-determinism-") as tmp:
        for name in args.models:
            if lacks := heldout.missing(name):
                page.line(f"[yellow]skipped {name}: {', '.join(lacks)} not found (`make real-models`)[/yellow]")
                continue
            calib = heldout.MODELS[name].write(Path(tmp) / name / "inputs")["calib"]
            runs = [run(c, heldout.MODELS[name].path, calib, Path(tmp) / name / "q.onnx") for c in CONDITIONS]
            ok = len({(code, digest) for code, digest, _ in runs}) == 1
            same += ok
            table.add_row(name, *(f"exit {c} {d} ({s:.0f} s)" for c, d, s in runs), "yes" if ok else "[red]no[/red]")
            page.print(f"{name}: {'same' if ok else 'DIFFERENT'} ({time.strftime('%H:%M:%S')})")
    page.table(table)
    page.line(f"one md5 and one exit code: {same} of {len(table.rows)} models")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
