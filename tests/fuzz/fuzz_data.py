"""Data folders for the fuzzer's graphs, and the float model's run that decides whether a
graph is kept: it must load and run in onnxruntime on every sample file (and, with a symbolic
batch dim, on all of them stacked, as qcli batches them) with finite outputs of the shapes
the builder computed. A shape the builder got wrong is a bug of the fuzzer (GeneratorBug)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from fuzz_graphs import FLOAT, GraphCase, Input
from qcli.twin import emulated


class GeneratorBug(AssertionError):
    """The fuzzer built a graph whose shapes are not what it computed."""


@dataclass
class Samples:
    """Sample files as the model's runs see them: `files[i]` maps input names to arrays as
    written; `runs[i]` the same with the batch axis qcli adds to a single sample."""

    files: list[dict[str, np.ndarray]]
    runs: list[dict[str, np.ndarray]]
    npy: bool = False  # one .npy per sample (single-input models)

    def stacked(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate([r[k] for r in self.runs]) for k in self.runs[0]} if self.runs else {}

    def rows(self) -> list[dict[str, np.ndarray]]:
        """Every sample of every run alone (batch 1): qcli may slice a batch that finely."""
        rows = []
        for run in self.runs:
            size = len(next(iter(run.values()))) if run else 0
            rows += [{k: v[i:i + 1] for k, v in run.items()} for i in range(size)]
        return rows

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for i, arrays in enumerate(self.files):
            if self.npy:
                np.save(folder / f"{i:03d}.npy", next(iter(arrays.values())))
            else:
                np.savez(folder / f"{i:03d}.npz", **arrays)
        return folder


def case_of(model: onnx.ModelProto) -> GraphCase:
    """A GraphCase for a model written by hand: its inputs as declared (a symbolic first dim
    is the batch: samples of 1)."""
    inputs, batched = [], False
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        batched = batched or bool(dims and not dims[0].HasField("dim_value"))
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
        inputs.append(Input(value.name, shape, value.type.tensor_type.elem_type, high=2))
    return GraphCase(model, inputs, None, batched=batched)


def _array(spec: Input, shape: tuple[int, ...], rng: np.random.Generator, scale: float) -> np.ndarray:
    if spec.dtype == FLOAT:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return rng.integers(0, spec.high, size=shape, dtype=np.int64)


def make_samples(case: GraphCase, count: int, seed: int, single: bool, scale: float, npy: bool) -> Samples:
    """`count` sample files; with the symbolic model, `single` writes each without its batch axis."""
    rng = np.random.default_rng(seed)
    files, runs = [], []
    for _ in range(max(count, 1)):
        arrays = {i.name: _array(i, i.shape, rng, scale) for i in case.inputs}
        files.append({k: v[0] for k, v in arrays.items()} if case.batched and single else arrays)
        runs.append({k: v[:1] for k, v in arrays.items()} if case.batched and single else arrays)
    return Samples(files, runs, npy and len(case.inputs) == 1)


def session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # refusals are expected: the graph is discarded
    if isinstance(model, Path):  # a float16/bfloat16 model runs as its float32 twin, as qcli runs it
        loaded = onnx.load(str(model))
        twin = emulated(loaded)
        model = model if twin is None else twin
    elif (twin := emulated(model)) is not None:
        model = twin
    data = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def run_all(model: onnx.ModelProto | Path, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]] | None:
    """The outputs on every feed, or None when onnxruntime refuses the model or a feed, or an
    output is not finite."""
    try:
        sess = session(model)
        results = [sess.run(None, feed) for feed in feeds]
    except Exception:  # onnxruntime raises its own types (Fail, InvalidArgument, ...)
        return None
    finite = all(np.all(np.isfinite(o)) for outs in results for o in outs if np.issubdtype(o.dtype, np.floating))
    return results if finite else None


def _checks(model: onnx.ModelProto) -> bool:
    """Whether the ONNX checker accepts the model (shape inference can leave a symbolic model's
    Loop output typed without a shape, which it refuses)."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return False
    return True


def runnable(case: GraphCase, draw_samples) -> Samples | None:
    """The samples to use, after the float model ran on them (see the module docstring); None
    discards the graph. `draw_samples(case)` makes the samples for the model in `case.model`.
    With a symbolic candidate that runs on every sample alone and on all stacked (any batch
    size, as qcli's batching and slicing need), the case switches to it."""
    if not _checks(case.model):
        raise GeneratorBug(f"the float model fails the ONNX checker:\n{case.text}")
    samples = draw_samples(case)
    results = run_all(case.model, samples.runs)
    if results is None:
        return None
    names = [o.name for o in case.model.graph.output]
    got = {n: tuple(a.shape) for n, a in zip(names, results[0], strict=True)}
    if got != {n: case.shapes[n] for n in names}:
        raise GeneratorBug(f"builder shapes {case.shapes} but onnxruntime computed {got}")
    if case.symbolic is not None and _checks(case.symbolic):
        static = case.model
        case.model, case.batched = case.symbolic, True
        batched = draw_samples(case)
        if run_all(case.model, [*batched.rows(), batched.stacked()]) is not None:
            return batched
        case.model, case.batched = static, False
    return samples
