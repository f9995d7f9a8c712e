"""Verification and automatic mixed precision, measured on the sample models.

    .venv/bin/python benchmarks/precision.py            # ~3 min on a 2-core machine
    .venv/bin/python benchmarks/precision.py --markdown # the tables also in benchmarks/results/precision.md

Every step is a `qcli` command in its own process (what a user runs), with `--json`:

1. Verification cost (issue 9): `qcli quantize sample_models/cnn/model.onnx --data calib/`
   with verification (the default) and with `--no-verify`, alternating, 3 runs each; median wall
   times and their ratio, and what verification promoted (target: nothing, and <= 1.3x).
2. Auto-precision (issue 7) where all-int8 misses a budget: for each case, the all-int8 model
   (`--no-verify`), `--auto-precision` with the budget, and the greedy baseline "exclude every
   op of the type the search promoted most" (a YAML `exclude.op_types`), each checked with
   `qcli analyze --data eval/` (top-1 drop with labels, latency ratio at batch 1):
   - cnn with the `tensorrt` preset (int8 symmetric activations, KL ranges): budget 0.5 points;
   - transformer with the default config: budget 0.0 points (no top-1 loss on eval/), latency
     floor off (`verify.max_latency_ratio: null`: int8 does not pay off for it here, which is
     verification's business, not this measurement's).
Nothing here is asserted: figures are printed for the issue notes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

ROOT = Path(__file__).resolve().parents[1]
QCLI = [sys.executable, "-m", "qcli.cli"]
MODELS = ROOT / "sample_models"


def qcli(*args: object) -> tuple[dict, float, int]:
    start = time.perf_counter()
    done = subprocess.run([*QCLI, *map(str, args), "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"qcli {' '.join(map(str, args))} failed:\n{done.stderr}")
    return json.loads(done.stdout), seconds, done.returncode


def analyze(name: str, quantized: Path) -> dict:
    model = MODELS / name
    doc, _, _ = qcli("analyze", model / "model.onnx", quantized, "--data", model / "eval", "--runs", "100")
    return doc


def verification_cost(tmp: Path) -> Sheet:
    cnn = MODELS / "cnn"
    times: dict[str, list[float]] = {"verify": [], "no-verify": []}
    promoted = None
    for _ in range(3):
        for mode in ("verify", "no-verify"):
            extra = ["--no-verify"] if mode == "no-verify" else []
            doc, seconds, _ = qcli("quantize", cnn / "model.onnx", "-o", tmp / f"cnn.{mode}.onnx",
                                   "--data", cnn / "calib", *extra)
            times[mode].append(seconds)
            if mode == "verify":
                promoted = doc["precision"]["promoted"] if doc["precision"] else {}
                checks = {c["name"]: round(c["value"], 4) for c in doc["verification"]["checks"]}
    v, n = statistics.median(times["verify"]), statistics.median(times["no-verify"])
    table = Sheet("verification cost: qcli quantize sample_models/cnn --data calib (medians of 3, own process each)",
                  ["run", ("wall s", "right"), ("vs --no-verify", "right")])
    table.add_row("with verification", f"{v:.2f}", f"{v / n:.2f}x (target <= 1.30x)")
    table.add_row("--no-verify", f"{n:.2f}", "")
    table.notes.append(f"checks {checks}; promoted: {len(promoted)} nodes {list(promoted)}")
    return table


def auto_precision_case(tmp: Path, name: str, budget: float, config_text: str) -> Sheet:
    model = MODELS / name
    config = tmp / f"{name}.yaml"
    config.write_text(config_text)
    common = ["--data", model / "calib", "--config", config]
    base_out = tmp / f"{name}.int8.onnx"
    qcli("quantize", model / "model.onnx", "-o", base_out, *common, "--no-verify")
    base = analyze(name, base_out)
    auto_out = tmp / f"{name}.auto.onnx"
    doc, seconds, code = qcli("quantize", model / "model.onnx", "-o", auto_out, *common, "--eval-data", model / "eval",
                              "--auto-precision", "--criteria", "performance", "--max-accuracy-drop", budget)
    auto = analyze(name, auto_out)
    p = doc["precision"]
    types: dict[str, int] = {}
    for node in p["promoted"]:
        op = node.rsplit("/", 1)[-1].split("_")[0]
        types[op] = types.get(op, 0) + 1
    table = Sheet(f"auto-precision: {name}, config {config_text.strip()!r}, budget {budget * 100:g} points",
                  ["model", ("top-1 drop (points)", "right"), ("speedup", "right"), "float nodes", "search"])
    table.add_row("all int8", f"{base['accuracy']['top1_drop'] * 100:.2f}", f"{base['speed']['speedup']:.2f}x")
    table.add_row("auto-precision", f"{auto['accuracy']['top1_drop'] * 100:.2f}", f"{auto['speed']['speedup']:.2f}x",
                  f"{len(p['promoted'])} promoted {dict(types)}",
                  f"{p['trials']} trials, {seconds:.1f} s, goal {'met' if p['goal_met'] else 'MISSED'} (exit {code})")
    table.notes += [f"{node}: {info['precision']} ({info['reason']})" for node, info in p["promoted"].items()]
    if types:
        op = max(types, key=types.get)
        baseline_config = tmp / f"{name}.baseline.yaml"
        baseline_config.write_text(config_text + f"exclude: {{op_types: [{op}]}}\n")
        base_line_out = tmp / f"{name}.baseline.onnx"
        bdoc, _, _ = qcli("quantize", model / "model.onnx", "-o", base_line_out, "--data", model / "calib",
                          "--config", baseline_config, "--no-verify")
        line = analyze(name, base_line_out)
        excluded = next(
            (r["count"] for r in bdoc["float"] if r["op_type"] == op and r["reason"] == "excluded by config"), 0
        )
        table.add_row(f"baseline 'exclude every {op}'", f"{line['accuracy']['top1_drop'] * 100:.2f}",
                      f"{line['speed']['speedup']:.2f}x", f"{excluded} excluded")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)
    page = bench_page(args.markdown)
    with tempfile.TemporaryDirectory(prefix="qcli-bench-") as tmp:
        page.table(verification_cost(Path(tmp)))
        page.table(auto_precision_case(Path(tmp), "cnn", 0.005, "calibration: {method: kl}\n"
                                       "activations: {dtype: int8, symmetric: true}\n"
                                       "verify: {max_latency_ratio: null}\n"))
        page.table(auto_precision_case(Path(tmp), "transformer", 0.0, "verify: {max_latency_ratio: null}\n"))
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
