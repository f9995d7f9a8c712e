"""Each unit's own noise in a candidate, from one sample: the relative squared error at the
unit's output less that at its input, the candidate against the prepared float model.

A first guess, not a measurement of what promoting a unit removes (the ranking measures that:
qcli.precision.ranking). The ranking uses it for one question only: does the goal need more
than half of the units? The noisiest half promoted, one trial, answers it before any block
or unit is measured (on the quick probe before blocks; on all samples before one trial per
unit, where the quick probe flatters it: magika); when that half misses the goal, the
rescue's weight-only model is tried at once (the blocks' first level, 8 trials, asked the
same question of the half with the largest measured gains: PP-LCNet photos, ddddocr and the
recognizer answered the same way). When it holds, the units are ranked as before. One
sample, the tensors in groups of at most GROUP_BYTES (shape inference's sizes), each group on
a session of its own made for it: onnxruntime holds every graph output of a run, fetched or
not, so one session returning all the tensors held them all on every run (the layout
detector's 324 tensors: 1.69 GB peak where calibration's was 0.98 GB; 21 groups of 16, each a
whole run of both models: 5.7 s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import onnx

from qcli.analyze.probe import Probe
from qcli.graph import node_names
from qcli.precision.units import Choices
from qcli.prepare import PrepareResult
from qcli.prepare.shapes import tensor_sizes

GROUP_BYTES = 64 << 20  # the tensors one run returns, at most (but one tensor)


class Candidates(Protocol):
    """What `unit_noise` reads of `qcli.precision.trials.Trials`."""

    probe: Probe
    quick_probe: Probe | None
    prepared: PrepareResult

    def measured(self, choices: Any, probe: Probe) -> tuple[onnx.ModelProto | Callable[[int], onnx.ModelProto],
                                                             Any, bytes]: ...


def unit_noise(trials: Candidates, nodes: list[str], choices: Choices) -> dict[str, float] | None:
    """Unit -> the noise it adds (0 at least) in the candidate `choices` on the quick probe's
    first sample; units whose output or input the candidate does not keep are left out. None
    when none is left, or onnxruntime cannot run the sample so (the caller goes on without the
    guess)."""
    from qcli.calibrate.collect import session_with_outputs

    probe = trials.quick_probe or trials.probe
    float_model = trials.prepared.model
    models, _, _ = trials.measured(choices, probe)
    model = models(probe.folds[0] if probe.folds else 0) if callable(models) else models
    kept = _made(model) & _made(float_model)
    position = {name: i for i, name in enumerate(node_names(float_model))}
    ends: dict[str, tuple[str, str]] = {}  # unit -> (its input, its output)
    for name in nodes:
        node = float_model.graph.node[position[name]] if name in position else None
        if node is not None and node.input and node.input[0] in kept and node.output[0] in kept:
            ends[name] = (node.input[0], node.output[0])
    if not ends:  # nothing to tell the units apart by
        return None
    tensors = sorted({t for pair in ends.values() for t in pair})
    first = probe.batches[0]
    feeds = first.sample(first.inputs, 0)
    sizes = tensor_sizes(float_model, {name: array.shape for name, array in feeds.items()})
    noise: dict[str, float] = {}
    for group in _groups(tensors, sizes):
        try:
            outputs = [session_with_outputs(m, group).run(group, feeds) for m in (model, float_model)]
        except Exception:  # noqa: BLE001 - onnxruntime's Fail / InvalidArgument: no guess, not a failed run
            return None
        for name, q, f in zip(group, *outputs, strict=True):
            noise[name] = _relative_error(np.asarray(q), np.asarray(f))
        del outputs
    return {n: max(noise[o] - noise[i], 0.0) for n, (i, o) in ends.items()}


def _groups(tensors: list[str], sizes: dict[str, int]) -> list[list[str]]:
    """`tensors` in consecutive groups of at most GROUP_BYTES (shape inference's `sizes`; one
    tensor past it alone; an unsized one counts 0).

    >>> _groups(["a", "b", "c", "d"], {"a": 40 << 20, "b": 20 << 20, "c": 100 << 20})
    [['a', 'b'], ['c'], ['d']]
    """
    groups: list[list[str]] = [[]]
    total = 0
    for name in tensors:
        size = sizes.get(name, 0)
        if groups[-1] and total + size > GROUP_BYTES:
            groups.append([])
            total = 0
        groups[-1].append(name)
        total += size
    return [g for g in groups if g]


def _made(model: onnx.ModelProto) -> set[str]:
    """The tensors the model's main graph computes or takes as inputs."""
    return {o for node in model.graph.node for o in node.output if o} | {i.name for i in model.graph.input}


def _relative_error(q: np.ndarray, f: np.ndarray) -> float:
    """|q - f|^2 / |f|^2 (0 for a float tensor of zeros, or one that is not float); 1 where `q`
    is not shaped as `f` (a decoding Loop that stopped at another step): as far off as zeros.

    >>> _relative_error(np.array([1.0, 2.0]), np.array([1.0, 1.0]))
    0.5
    >>> _relative_error(np.ones(3), np.ones(2))
    1.0
    """
    if f.dtype.kind != "f":
        return 0.0
    if q.shape != f.shape:
        return 1.0
    f64 = f.ravel().astype(np.float64)
    d = q.ravel().astype(np.float64) - f64
    signal = float(np.dot(f64, f64))
    return float(np.dot(d, d)) / signal if signal > 0 else 0.0
