"""`qcli target measure --model`: a profile calibrated on the user's model, on the target.

A profile fitted to micro-models prices whole graphs 11-58% off on this project's exported
models (docs/benchmarks.md#targetpy), in two directions: small graphs of many cheap calls too
slow, large convolution graphs too fast. The profiler it is fitted under slows a graph of many
small int8 calls twice as much as its float one, so no fit to profiled kernel times closes
that gap (qcli.target.measure says what was tried). What does close it is timing the graphs
themselves, once, unprofiled, on the deployment machine: the model as given and the model the
config writes with verification off (all int8), A B B A over PAIRS fresh session pairs of
ROUNDS rounds each. Two factors then scale a base profile (`factors`):
- `float`, on every kernel class a float graph runs and on `run_us`: the base profile's
  prediction of the file becomes its measured time;
- `int8`, on the classes only a quantized graph runs (qcli.target.kernels.INTEGER): the
  all-int8 model's prediction over the file's becomes its measured ratio.
Every mix in between (units promoted, dynamic, weight-only) is priced by the corrected classes.
The clock is read here, once; what decides reads the file written, so decisions stay pure
functions of it. A factor outside BOUNDS (the all-int8 graph's float calls alone already
priced over its measured time) is held at the bound and the file says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial

import numpy as np
import onnx

from qcli.analyze.latency import measure, paired
from qcli.model import fingerprint
from qcli.runtime import make_session
from qcli.target.executed import run
from qcli.target.kernels import INTEGER, Kernel
from qcli.target.profile import Calibration, Profile

PAIRS, ROUNDS, WARMUP = 5, 20, 5
BOUNDS = (0.2, 5.0)  # a factor beyond these says the base profile does not describe this machine


def factors(float_us: float, other_us: float, integer_us: float, measured_us: float, ratio: float,
            ) -> tuple[dict[str, float], str]:
    """The factors on the float and integer classes (module docstring), and a note when one is
    held at BOUNDS. `float_us`: the base profile's prediction of the file; `other_us`,
    `integer_us`: of the all-int8 model's float and integer calls (run cost in `other_us`);
    `measured_us`: the file's measured time; `ratio`: the all-int8 model's measured over it.

    >>> factors(100.0, 30.0, 40.0, 200.0, 0.5)  # float calls 2x; (0.5*200 - 2*30) / 40 = 1
    ({'float': 2.0, 'int8': 1.0}, '')
    >>> print(factors(100.0, 80.0, 40.0, 100.0, 0.5)[1])
    int8 factor -0.75 held at 0.2: the all-int8 model's float calls alone are priced over its measured time
    """
    low, high = BOUNDS
    f = measured_us / float_us
    notes = []
    if not low <= f <= high:
        notes.append(f"float factor {f:.3g} held at {min(max(f, low), high):g}: the base profile is far from this "
                     "machine")
        f = min(max(f, low), high)
    i = (ratio * measured_us - f * other_us) / integer_us if integer_us > 0 else f
    if not low <= i <= high:
        notes.append(f"int8 factor {i:.3g} held at {min(max(i, low), high):g}: the all-int8 model's float calls "
                     "alone are priced over its measured time" if i < low else
                     f"int8 factor {i:.3g} held at {high:g}: its integer calls are far slower than the base prices")
        i = min(max(i, low), high)
    return {"float": round(f, 6), "int8": round(i, 6)}, "; ".join(notes)


def timed(model: onnx.ModelProto, int8: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int | None,
          advance: Callable[[int], object]) -> tuple[float, float]:
    """(the file's median µs, the all-int8 model's median per-round ratio to it): the medians
    over PAIRS fresh session pairs, each timed A B B A for ROUNDS rounds (one pair's ratio can
    sit 10-20% off another's: where the arena and the threads land)."""
    us, ratios = [], []
    for _ in range(PAIRS):
        a, b = make_session(model, threads, timing=True), make_session(int8, threads, timing=True)
        speed = measure(partial(a.run, None, feeds), partial(b.run, None, feeds), runs=ROUNDS, warmup=WARMUP,
                        batch=1, threads=threads)
        us.append(speed.float.median_ms * 1e3)
        ratios.append(float(paired(speed)))
        del a, b
        advance(1)
    return statistics.median(us), statistics.median(ratios)


def _sums(kernels: list[Kernel], base: Profile) -> tuple[float, float]:
    """(the run cost and float calls' µs, the integer calls' µs) under `base`."""
    integer = sum(base.price(k) for k in kernels if k.cls in INTEGER)
    return base.run_cost + sum(base.price(k) for k in kernels if k.cls not in INTEGER), integer


def calibrate(base: Profile, model: onnx.ModelProto, int8: onnx.ModelProto, feeds: dict[str, np.ndarray],
              name: str, file: str, advance: Callable[[int], object], threads: int | None = None,
              batch: int = 1) -> Profile:
    """`base` calibrated on `model` (the file `file`, as given) and `int8` (what the config
    writes from it, all int8), timed on this machine at `feeds` (`batch` samples), named `name`."""
    base = base.model_copy(update={"calibration": None})
    threads = threads if threads is not None else base.threads
    float_other, _ = _sums(run(model, feeds, threads).kernels, base)
    other, integer = _sums(run(int8, feeds, threads).kernels, base)
    measured_us, ratio = timed(model, int8, feeds, threads, advance)
    found, note = factors(float_other, other, integer, measured_us, ratio)
    calibration = Calibration(
        model=file, sha256=fingerprint(model), factors=found, base=base.name, batch=batch, note=note,
        measured_ms={"float": round(measured_us / 1e3, 4), "int8": round(ratio * measured_us / 1e3, 4)},
        predicted_ms={"float": round(float_other / 1e3, 4), "int8": round((other + integer) / 1e3, 4)})
    basis = (f"{base.basis}; calibrated on {file}: its float and all-int8 runs timed unprofiled, "
             f"{PAIRS} session pairs x {ROUNDS} rounds").lstrip("; ")
    return base.model_copy(update={"name": name, "kind": "measured", "calibration": calibration, "threads": threads,
                                   "basis": basis,
                                   "description": f"{base.name} calibrated on {file} (qcli target measure --model)"})
