"""Scale-out benchmark: calibration wall time with one and two workers, in this process, in a
local process pool, and on a local Ray instance, on the sample CNN with 512 samples.

    .venv/bin/python benchmarks/scale.py               # what `make bench` runs (~1-2 min)
    .venv/bin/python benchmarks/scale.py --reps 5 --samples 1024
    .venv/bin/python benchmarks/scale.py --markdown     # the table also in benchmarks/results/scale.md

Configurations (each in a fresh child process, repetitions interleaved, medians shown):

* ``serial``: `qcli.quantize.calibrate` without an executor: one process, its pass a
  three-thread pipeline (read, infer, observe) with onnxruntime's default threads; the
  figure every speedup is relative to (what `qcli calibrate` does by default).
* ``local xN``: `LocalExecutor(N)`: N spawned worker processes, one shard of the data
  each, `cores // N` onnxruntime threads per worker; ``local x1`` is the pool's overhead
  alone (one worker process doing the whole pass).
* ``ray xN``: `RayExecutor(N)` on a local Ray instance the child starts (`num_cpus` = the
  cores here). Starting Ray is timed apart ("start") and not counted in "wall": on an
  existing cluster it is not paid; "wall + start" is what a run starting its own instance
  pays. Skipped with a message when Ray is not installed (`pip install 'qcli[ray]'`).

Timed: from loading the model to the calibration table (all four methods solved), after
imports, as benchmarks/calibration.py times qcli. The calibration files of every
configuration are compared: they must be byte-identical to the serial one (reported).
Data: `sample_models/cnn/calib` then `eval/` copied as 512 numbered files into a temporary
directory (removed at the end), batch size 8. Figures are reported, not asserted.
"""

from __future__ import annotations

import argparse
import hashlib
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
CONFIGS = (("serial", 1), ("local", 1), ("local", 2), ("ray", 1), ("ray", 2))
BATCH_SIZE = 8


def _child(kind: str, workers: int, model_path: str, data: str, samples: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from qcli.config import load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.executor import LocalExecutor, RayExecutor, cores
    from qcli.model import load_model
    from qcli.quantize import calibrate

    result: dict = {}
    executor = None
    if kind == "ray":
        try:
            import ray
        except ImportError:
            return {"skipped": "Ray is not installed (pip install 'qcli[ray]')"}
        t = time.perf_counter()
        ray.init(num_cpus=cores(), include_dashboard=False, configure_logging=False, log_to_driver=False)
        executor = RayExecutor(workers)
        result["start"] = time.perf_counter() - t
    elif kind == "local":
        executor = LocalExecutor(workers)
    config = load_config(None).merged(calibration={"samples": samples, "batch_size": BATCH_SIZE})
    start = time.perf_counter()
    model = load_model(model_path)
    folder = DataFolder(data, model_inputs(model), samples=samples)
    table = calibrate(model, folder, config, executor=executor)
    result["seconds"] = time.perf_counter() - start
    if executor is not None:
        result["threads"] = executor.threads
        executor.close()
    if kind == "ray":
        ray.shutdown()
    result["digest"] = hashlib.sha256(table.to_json().encode()).hexdigest()
    result["samples"] = table.samples
    return result


def run_child(kind: str, workers: int, model: Path, data: Path, samples: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="qcli-bench-scale-") as work:
        out = Path(work) / "result.json"
        cmd = [sys.executable, __file__, "--child", kind, "--workers", str(workers), "--model", str(model),
               "--data", str(data), "--n", str(samples), "--result", str(out)]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timeout after {timeout:g} s"}
        if proc.returncode != 0 or not out.is_file():
            lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each configuration (median)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a child is killed")
    p.add_argument("--child", choices=("serial", "local", "ray"), help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    add_markdown_option(p, __file__)
    args = p.parse_args(argv)
    if args.child:
        result = _child(args.child, args.workers, args.model, args.data, args.n)
        Path(args.result).write_text(json.dumps(result))
        return 0

    from calibration import make_data  # benchmarks/calibration.py

    page = bench_page(args.markdown, f"sample CNN, {args.samples} samples, batch size {BATCH_SIZE}, {args.reps} "
                      "repetition(s) (median)", width=120, threads=None)
    cnn = ROOT / "sample_models" / "cnn"
    runs: dict[tuple[str, int], list[dict]] = {c: [] for c in CONFIGS}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qcli-bench-") as tmp:
        data = Path(tmp) / "cnn"
        make_data(cnn, data, args.samples)
        for _ in range(args.reps):
            for config in CONFIGS:
                if runs[config] and ("skipped" in runs[config][-1] or "error" in runs[config][-1]):
                    continue
                runs[config].append(run_child(*config, cnn / "model.onnx", data, args.samples, args.timeout))

    table = Sheet(f"calibration wall time, sample CNN, {args.samples} samples",
                  ["executor", *((col, "right") for col in ("workers", "threads each", "wall", "speedup", "start",
                                                            "wall + start", "same file"))])
    serial = statistics.median(r["seconds"] for r in runs[("serial", 1)] if "seconds" in r)
    reference = runs[("serial", 1)][0].get("digest")
    for (kind, workers), results in runs.items():
        bad = next((r for r in results if "skipped" in r or "error" in r), None)
        if bad is not None:
            table.add_row(kind, str(workers), "", "skipped" if "skipped" in bad else "failed", "", "", "", "")
            table.notes.append(f"{kind} x{workers}: {bad.get('skipped') or bad['error']}")
            continue
        wall = statistics.median(r["seconds"] for r in results)
        start = statistics.median(r["start"] for r in results) if "start" in results[0] else None
        table.add_row(
            kind, str(workers), str(results[0].get("threads", "default")), f"{wall:.2f} s", f"{serial / wall:.2f}x",
            "" if start is None else f"{start:.2f} s", "" if start is None else f"{wall + start:.2f} s",
            "yes" if all(r["digest"] == reference for r in results) else "NO",
        )
    page.table(table)
    page.line("speedup = serial wall / wall (> 1: faster than one process); start = ray.init, not in wall")
    page.line(f"benchmark took {time.perf_counter() - t0:.0f} s")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
