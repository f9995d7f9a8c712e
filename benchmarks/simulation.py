"""How well the simulation (qcli/simulation.py) stands in for real candidate models: on each
exported model of `make real-models`, the same candidates measured both ways on the same
samples, side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/simulation.py                      # every model (~10 min)
    PYTHONPATH=. .venv/bin/python benchmarks/simulation.py --models ocr-det magika --markdown

Per model (default config, calibrated on its 32 real calibration samples, benchmarks/heldout.py):
the candidates are the all-int8 model, each unit promoted to float alone (at most `--units`,
spread over the graph), the first units in int16, and three random mixes of float units. Each
candidate's output noise (noise power / signal power against the float model, what the
search ranks by) is measured on the first 8 samples (the quick probe's size) on its real model
(built, loaded in a fresh onnxruntime session with its fused int8 kernels, run) and on the
simulation (its plan turned into the inputs of the one session). Reported: how many candidates
the simulation emulates; Spearman's rank correlation of the two noises over them; the largest
relative difference; and the median time of one trial each way (build + session + run against
plan + run), with the simulation's one-off build.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (benchmarks/heldout.py)
from sheet import Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

from qcli.analyze.probe import Probe  # noqa: E402
from qcli.config import load_config  # noqa: E402
from qcli.data import DataFolder, model_inputs  # noqa: E402
from qcli.errors import CalibrationError  # noqa: E402
from qcli.model import load_model  # noqa: E402
from qcli.plan import make_plan  # noqa: E402
from qcli.precision.units import find_units, promoted_config  # noqa: E402
from qcli.quantize import calibrate, plan_for, prepare_for, quantize  # noqa: E402
from qcli.runtime import make_session  # noqa: E402
from qcli.simulation import Simulated, Simulation  # noqa: E402

SAMPLES = 8  # the quick probe's samples (qcli.precision: QUICK_SAMPLES on a 32-sample folder's first fold)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (ties take their mean rank).

    >>> spearman([1, 2, 3], [10, 30, 20])
    0.5
    """
    def ranks(v: list[float]) -> np.ndarray:
        x = np.asarray(v, np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for value in np.unique(x):
            r[x == value] = r[x == value].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1]) if ra.std() and rb.std() else 1.0


def candidates(units: list, limit: int) -> list[dict]:
    """All int8, each of up to `limit` units (spread over the graph) float, the first three in
    int16, three random mixes (a fixed seed)."""
    step = max(1, len(units) // limit)
    chosen = units[::step][:limit]
    rng = np.random.default_rng(0)
    mixes = [{u.node: "float" for u in units if rng.random() < 0.25} for _ in range(3)]
    wide = [{u.node: "int16"} for u in units if not (u.table or u.half)][:3]
    return [{}, *({u.node: "float"} for u in chosen), *wide, *(m for m in mixes if m)]


def measure(name: str, limit: int) -> dict:
    model = load_model(heldout.MODELS[name].path)
    folders = heldout.MODELS[name].write(Path("/tmp/qcli-bench-inputs") / name)
    config = load_config(None)
    prepared = prepare_for(model, config)
    inputs = model_inputs(model)
    folder = DataFolder(folders["calib"], inputs, reading=config.data.reading)
    table = calibrate(model, folder, config, prepared=prepared, methods=(config.calibration.method,))
    probe_folder = DataFolder(folders["calib"], inputs, reading=config.data.reading, samples=SAMPLES)
    probe = Probe(model, list(probe_folder.batches(SAMPLES)), inputs, verify=config.verify)
    work = prepared.model
    units = find_units(work, make_plan(work, config))
    int8 = quantize(model, config, table, prepared=prepared)
    start = time.perf_counter()
    simulation = Simulation.of(work, int8.plan, prepared.quantized)
    session = make_session(simulation.model, pass_only=True)
    built = time.perf_counter() - start
    real_noise, sim_noise, real_s, sim_s, missed = [], [], [], [], 0
    for choices in candidates(units, limit):
        cfg = promoted_config(config, choices, units)
        start = time.perf_counter()
        try:
            feeds = simulation.feeds(plan_for(work, cfg, table))
        except CalibrationError:  # the calibration cannot build it (a search counts no trial either)
            continue
        if feeds is None:
            missed += 1
            continue
        sim_noise.append(probe.measure(Simulated(session, lambda k, f=feeds: f)).noise)
        sim_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        real_noise.append(probe.measure(quantize(model, cfg, table, prepared=prepared).model).noise)
        real_s.append(time.perf_counter() - start)
    diff = max((abs(s - r) / max(r, 1e-12) for s, r in zip(sim_noise, real_noise, strict=True)), default=0.0)
    return {"candidates": len(sim_noise) + missed, "emulated": len(sim_noise), "units": len(units),
            "spearman": spearman(real_noise, sim_noise) if len(sim_noise) > 2 else None, "diff": diff,
            "real": statistics.median(real_s) if real_s else None, "sim": statistics.median(sim_s) if sim_s else None,
            "build": built}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(heldout.MODELS), choices=list(heldout.MODELS))
    parser.add_argument("--units", type=int, default=16, help="units promoted alone, at most (default 16)")
    add_markdown_option(parser, __file__)
    args = parser.parse_args()
    page = bench_page(args.markdown, f"{SAMPLES} samples per trial")
    sheet = Sheet("simulation vs real candidate models (output noise, default config)",
                  ["model", ("units", "right"), ("emulated", "right"), ("rank corr.", "right"),
                   ("max noise diff", "right"), ("real trial", "right"), ("simulated trial", "right"),
                   ("ratio", "right"), ("simulation built", "right")])
    for name in args.models:
        if heldout.missing(name):
            continue
        r = measure(name, args.units)
        ratio = f"{r['sim'] / r['real']:.2f}x" if r["real"] and r["sim"] else "-"
        sheet.add_row(name, str(r["units"]), f"{r['emulated']} of {r['candidates']}",
                      "-" if r["spearman"] is None else f"{r['spearman']:.3f}", f"{r['diff']:.1%}",
                      f"{r['real']:.2f} s" if r["real"] else "-", f"{r['sim']:.2f} s" if r["sim"] else "-", ratio,
                      f"{r['build']:.2f} s")
        print(name, r, flush=True)
    page.table(sheet)
    page.write()


if __name__ == "__main__":
    main()
