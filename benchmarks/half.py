"""float16 and bfloat16 presets on the trained models of `make real-models`, with real inputs:
`qcli quantize MODEL -o OUT --data calib/ --config float16` (or bfloat16) as a user runs it, then
on held-out samples the run never saw: qcli's own kinds and floors (as benchmarks/heldout.py
judges int8), and whether any output is NaN or infinite.

    PYTHONPATH=. .venv/bin/python benchmarks/half.py                       # float16, every model
    PYTHONPATH=. .venv/bin/python benchmarks/half.py --type bfloat16 --models encoder ocr-det
    PYTHONPATH=. .venv/bin/python benchmarks/half.py --markdown   # the table also in benchmarks/results/half.md

The models, their input writers and the 32-sample calibration / held-out splits are
benchmarks/heldout.py's. CPU measures the numbers only (qcli.twin.emulated: each value rounded
to the 16-bit type), not GPU speed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (benchmarks/heldout.py)
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)


def non_finite(quantized: Path, folder: Path) -> int:
    """How many output values of `quantized` are NaN or infinite over `folder` (batch 1)."""
    import onnx

    from qcli.data import DataFolder, model_inputs
    from qcli.runtime import make_session

    model = onnx.load(quantized)
    session = make_session(model)
    bad = 0
    for batch in DataFolder(folder, model_inputs(model)).batches(1):
        bad += sum(int((~np.isfinite(o)).sum()) for o in session.run(None, batch.inputs)
                   if np.issubdtype(np.asarray(o).dtype, np.floating))
    return bad


def _category(why: str) -> str:
    """A kept node's reason without its names and figures."""
    for key, category in (("reaches", "value beyond range"), ("rounds to 0", "constant underflows"),
                          ("holds", "constant beyond range"), ("reduction", "long reduction"),
                          ("form of", "no 16-bit form at this opset")):
        if key in why:
            return category
    return why.split(":")[0][:40]


def row(name: str, kind: str, work: Path) -> tuple[str, ...]:
    model = heldout.MODELS[name].path
    folders = heldout.MODELS[name].write(work / "inputs")
    out = work / f"{name}.{kind}.onnx"
    began = time.perf_counter()
    code, doc, error = heldout.run_qcli(model, folders["calib"], out, Path(kind))
    took = time.perf_counter() - began
    if not out.is_file() or doc is None:
        return name, f"exit {code}", error, "", ""
    half = doc.get("half", {})
    kept = half.get("kept_float32", {})
    reasons = Counter(_category(why) for why in kept.values())
    promoted = len((doc.get("precision") or {}).get("promoted", {}))  # by the rescue, to float32
    found = heldout.held_out(model, out, folders["holdout"])
    figures = "\n".join(heldout.figure(v.metric, v.output, v.value, v.interval, v.samples, v.value >= v.floor)
                        for v in found)
    holds = "holds" if all(v.value >= v.floor for v in found) else "[red]does not hold[/red]"
    bad = non_finite(out, folders["holdout"])
    return (name, f"exit {code}, {took:.0f} s\n{doc['compression']:.2f}x smaller",
            f"{half.get('converted', 0)} nodes, {half.get('casts', 0)} Casts\n{len(kept)} kept float32"
            + (f", {promoted} promoted to float32 by the rescue" if promoted else "")
            + "".join(f"\n  {n} {r}" for r, n in sorted(reasons.items())),
            f"{figures}\n{holds}", f"{bad}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(heldout.MODELS), choices=list(heldout.MODELS))
    parser.add_argument("--type", choices=["float16", "bfloat16"], default="float16")
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)

    page = bench_page(args.markdown)
    table = Sheet(f"--config {args.type} on trained models, judged on held-out inputs",
                  ["model", "qcli", "converted", "held-out (qcli's floors)", "NaN/Inf values"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qcli-bench-half-") as tmp:
        for name in args.models:
            if lacks := heldout.missing(name):
                page.line(f"[yellow]skipped {name}: {', '.join(lacks)} not found[/yellow]")
                continue
            table.add_row(*row(name, args.type, Path(tmp) / name), end_section=True)
    page.table(table)
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
