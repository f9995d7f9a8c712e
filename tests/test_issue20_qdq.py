"""Issue 20: weights and biases whose layout their scales did not fit. Each model, written in ONNX
text, quantizes to a model that onnxruntime runs like the float one (output names, shapes, dtypes
and values), both with its nodes fused and with graph optimizations off: a DequantizeLinear that
is invalid on its own only works when onnxruntime happens to fuse it away."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import Cli, parse_model, save
from qcli.config import Config, load_config
from qcli.data import DataFolder, model_inputs
from qcli.plan import Plan, make_plan
from qcli.quantize import calibrate, quantize
from qcli.scheme import PerTensor

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
LEVELS = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)

# Bug 3: a MatMul's weight of another rank than 2.
MATMUL = {
    "matmul-batched-weight": """g (float[N, 2, 3, 8] x) => (float[N, 2, 3, 4] y) <float[2, 8, 4] W = {R64}> {
        y = MatMul (x, W) }""",
    "matmul-batched-weight-broadcast": """g (float[1, 3, 8] x) => (float[2, 3, 4] y) <float[2, 8, 4] W = {R64}> {
        y = MatMul (x, W) }""",
    "matmul-4d-weight": """g (float[N, 3, 2, 3, 8] x) => (float[N, 3, 2, 3, 4] y) <float[3, 2, 8, 4] W = {R192}> {
        y = MatMul (x, W) }""",
    "matmul-batched-chain": """g (float[N, 2, 3, 8] x) => (float[N, 2, 3, 4] y)
            <float[2, 8, 8] W = {R128}, float[2, 8, 4] V = {R64}> {
        h = MatMul (x, W)
        r = Relu (h)
        y = MatMul (r, V) }""",
    "matmul-vector-weight": """g (float[N, 8] x) => (float[N] y) <float[8] W = {R8}> {
        y = MatMul (x, W) }""",
    "matmul-vector-input": """g (float[1, 8] x) => (float[4] y) <float[8, 4] W = {R32}, int64[1] a = {0}> {
        v = Squeeze (x, a)
        y = MatMul (v, W) }""",
}

def filled(text: str, seed: int = 0) -> onnx.ModelProto:
    """The model of an ONNX-text graph whose `{Rn}` initializers hold n seeded random values."""
    rng = np.random.default_rng(seed)
    values = re.sub(r"\{R(\d+)\}", lambda m: "{" + ", ".join(f"{v:.4f}" for v in rng.normal(0, 0.5, int(m[1]))) + "}",
                    text)
    return parse_model(HEADER + values)


def write_samples(model: onnx.ModelProto, folder: Path, count: int = 16) -> list[dict[str, np.ndarray]]:
    """`count` random samples of the model's inputs (a free batch axis as 1), saved as .npz."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    samples = []
    for i in range(count):
        sample = {s.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in s.shape]).astype(s.dtype)
                  for s in model_inputs(model)}
        np.savez(folder / f"{i:03d}.npz", **sample)
        samples.append(sample)
    return samples


def quantized(model: onnx.ModelProto, tmp_path: Path, config: Config | None = None) -> tuple[onnx.ModelProto, list]:
    """The quantized model (calibrated on random samples) and those samples."""
    config = config or Config()
    samples = write_samples(model, tmp_path / "data")
    table = calibrate(model, DataFolder(tmp_path / "data", model_inputs(model)), config)
    return quantize(model, config, table).model, samples


def assert_runs_like_float(
    model: onnx.ModelProto, quantized: onnx.ModelProto | Path, samples: list, tolerance: float = 0.1
) -> None:
    """The quantized model runs, fused and unfused, with the float model's outputs (names, shapes,
    dtypes), each within `tolerance` of the float output's largest value over the samples."""
    source = quantized if isinstance(quantized, Path) else quantized.SerializeToString()
    float_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wants = [float_session.run(None, sample) for sample in samples]
    for level in LEVELS:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        assert [o.name for o in session.get_outputs()] == [o.name for o in float_session.get_outputs()]
        gots = [session.run(None, sample) for sample in samples]
        for k in range(len(wants[0])):
            want, got = np.stack([w[k] for w in wants]), np.stack([g[k] for g in gots])
            assert got.shape == want.shape and got.dtype == want.dtype
            error = np.abs(got - want).max() / np.abs(want).max()
            assert error <= tolerance, (level, k, error)


def plan_of(text: str) -> Plan:
    return make_plan(onnx.shape_inference.infer_shapes(filled(text)), Config())


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def dequantize_node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == f"{name}_quantized")


def axis_of(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "axis"), None)


@pytest.mark.parametrize("text", list(MATMUL.values()), ids=list(MATMUL))
def test_quantizes_to_a_model_that_runs_like_the_float_one(text: str, tmp_path: Path) -> None:
    model = filled(text)
    q, samples = quantized(model, tmp_path)
    onnx.checker.check_model(q)
    assert_runs_like_float(model, q, samples)


@pytest.mark.parametrize("name", ["matmul-batched-weight", "matmul-vector-weight"])
def test_weight_only_int4_runs_like_the_float_one(name: str, tmp_path: Path) -> None:
    model = filled(MATMUL[name])
    q, samples = quantized(model, tmp_path, load_config("weights-int4"))
    assert_runs_like_float(model, q, samples, tolerance=0.25)  # a handful of int4 values per column


# --------------------------------------------------------------------------- bug 3: MatMul's weight


@pytest.mark.parametrize(("name", "axis"), [
    ("matmul-vector-input", 1), ("matmul-vector-weight", None), ("matmul-batched-weight", None),
    ("matmul-4d-weight", None),
])
def test_matmul_weight_is_per_channel_only_as_a_matrix(name: str, axis: int | None) -> None:
    """MatMulInteger takes a batched weight's per-column params only as [..., 1, N]."""
    weight = plan_of(MATMUL[name]).weights["W"]
    assert weight.axis == axis
    assert (weight.scheme.granularity == PerTensor()) == (axis is None)


# --------------------------------------------------------------------------- the issue's models, through the CLI


@pytest.mark.parametrize("name", ["matmul-batched-weight"])
@pytest.mark.parametrize("verify", [True, False], ids=["verified", "no-verify"])
def test_cli_quantizes_the_issue_s_models_to_models_that_run(name: str, verify: bool, cli: Cli, tmp_path: Path) -> None:
    model = filled(MATMUL[name])
    path = save(model, tmp_path / "model.onnx")
    samples = write_samples(model, tmp_path / "data", count=40)
    result = cli("quantize", path, "-o", tmp_path / "q.onnx", "--data", tmp_path / "data",
                 *([] if verify else ["--no-verify"]))
    assert result.exit_code == 0, result.stderr
    assert_runs_like_float(model, tmp_path / "q.onnx", samples)
