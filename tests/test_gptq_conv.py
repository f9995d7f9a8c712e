"""GPTQ for convolutions (qcli.gptqconv): each group's weight rounded by the Gram matrix of its
input's patches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from conftest import SAMPLE_MODELS
from qcli.gptqconv import Patches, add_patches, reader, rounded
from qcli.plan import WeightPlan
from qcli.qweights import quantized_weight
from qcli.scheme import QuantScheme, dequantize

INT8 = QuantScheme.of("int8", "per_channel", True)


def conv_model(weight: np.ndarray, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    spatial = ["H", "W", "D"][: weight.ndim - 2]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", "C", *spatial])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


CASES = [  # (weight shape [Cout, Cin/G, k...], attributes, input shape)
    ((6, 2, 3, 3), {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [2, 1], "group": 2}, (3, 4, 11, 9)),
    ((4, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (2, 3, 9, 8)),
    ((5, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 5}, (2, 5, 12, 12)),  # depthwise
    ((7, 6, 1, 1), {}, (2, 6, 5, 4)),  # pointwise: the input itself
    ((3, 4, 3), {"strides": [3], "pads": [1, 1]}, (2, 4, 20)),  # 1-D
]


@pytest.mark.parametrize(("shape", "attrs", "size"), CASES)
def test_the_patch_gram_gives_the_energy_onnxruntime_s_conv_outputs(shape, attrs, size) -> None:
    """Σ over positions of each output channel's square is wᵀ H w over its group's Gram matrix:
    the patches are the ones onnxruntime's Conv reads (strides, pads, dilations, auto_pad, groups)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=shape).astype(np.float32)
    model = conv_model(w, **attrs)
    p = reader(model.graph.node[0], model.graph.initializer[0])
    assert p is not None and p.width == int(np.prod(shape[1:]))
    x = rng.normal(size=size).astype(np.float32)
    gram = np.zeros((p.group, p.width, p.width), np.float32)
    rows = add_patches(gram, x, p)
    y = run(model, x)
    assert rows == y.shape[0] * int(np.prod(y.shape[2:]))
    per = shape[0] // p.group
    rows_w = w.reshape(shape[0], -1).astype(np.float64)
    expected = [rows_w[c] @ gram[c // per].astype(np.float64) @ rows_w[c] for c in range(shape[0])]
    energy = (y.astype(np.float64) ** 2).sum(axis=tuple(i for i in range(y.ndim) if i != 1))
    np.testing.assert_allclose(expected, energy, rtol=1e-4)


def test_gptq_moves_a_conv_s_output_less_than_rounding_to_nearest() -> None:
    """Per-channel int8 on a 3x3 conv over smooth (correlated) inputs: the output error on
    inputs the Gram matrix never saw, through onnxruntime, at most half of RTN's; the scales
    RTN's or clipped below them."""
    rng = np.random.default_rng(1)
    w = (rng.normal(size=(8, 4, 3, 3)) * np.linspace(0.2, 2.0, 8)[:, None, None, None]).astype(np.float32)
    model = conv_model(w, pads=[1, 1, 1, 1])
    p = reader(model.graph.node[0], model.graph.initializer[0])
    assert p is not None

    def smooth(n: int) -> np.ndarray:
        noise = rng.normal(size=(n, 4, 20, 20))
        return np.cumsum(np.cumsum(noise, axis=2), axis=3).astype(np.float32) / 10  # neighbours alike

    gram = np.zeros((1, p.width, p.width), np.float32)
    rows = add_patches(gram, smooth(16), p)
    wp = WeightPlan("w", INT8, 0)
    rtn, gptq = quantized_weight(w, wp), rounded(w, wp, gram, rows)
    assert gptq[0].dtype == np.int8 and gptq[0].shape == w.shape
    assert np.all(np.abs(gptq[1]) <= np.abs(rtn[1]) + 1e-12)
    held_out = smooth(8)
    y = run(model, held_out)

    def error(weight) -> float:
        deq = dequantize(weight[0], weight[1].reshape(-1, 1, 1, 1), weight[2].reshape(-1, 1, 1, 1))
        return float(np.mean((run(conv_model(deq.astype(np.float32), pads=[1, 1, 1, 1]), held_out) - y) ** 2))

    assert error(gptq) < 0.5 * error(rtn)


def test_a_conv_read_by_two_geometries_or_transposed_keeps_rtn() -> None:
    w = np.ones((2, 2, 3, 3), np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"])
    assert reader(node, numpy_helper.from_array(w, "w")) is None
    assert Patches("x", (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1, 2).gram_bytes == 18 * 18 * 4


def test_weight_only_gptq_on_the_sample_cnn_rounds_every_conv_and_beats_rtn(cli, tmp_path: Path) -> None:
    """`weights.algorithm: gptq` with float activations on a trained CNN: every Conv weight (and
    the Gemm's) rounded by GPTQ, said in the notes; held-out output noise below RTN's."""
    cnn = SAMPLE_MODELS / "cnn"
    noise = {}
    for algorithm in ("rtn", "gptq"):
        config = tmp_path / f"{algorithm}.yaml"
        config.write_text(f"activations: {{dtype: float}}\nweights: {{algorithm: {algorithm}}}\n")
        out = tmp_path / f"{algorithm}.onnx"
        result = cli("quantize", cnn / "model.onnx", "-o", out, "--data", cnn / "calib", "--config", config,
                     "--no-verify", "--json")
        assert result.exit_code == 0, result.stderr
        if algorithm == "gptq":
            assert "gptq: 10 weight(s) rounded by the Gram matrices of their layers' inputs" in json.loads(
                result.stdout)["notes"]
        report = cli("analyze", cnn / "model.onnx", out, "--data", cnn / "eval", "--json")
        noise[algorithm] = json.loads(report.stdout)["fidelity"][0]["sqnr_db"]
    assert noise["gptq"] > noise["rtn"] + 3.0  # dB


def smooth_folder(folder: Path, n: int, seed: int) -> Path:
    """`n` samples of smooth maps [1, 4, 16, 16] (neighbouring values alike, as images are)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(n):
        x = np.cumsum(np.cumsum(rng.normal(size=(1, 4, 16, 16)), axis=2), axis=3) / 10
        np.savez(folder / f"{i:03d}.npz", x=x.astype(np.float32))
    return folder


def two_convs(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    w1 = (rng.normal(size=(8, 4, 3, 3)) * np.linspace(0.2, 2.0, 8)[:, None, None, None]).astype(np.float32)
    w2 = (rng.normal(size=(8, 8, 3, 3)) / 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4, 16, 16])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 8, 16, 16])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    path = tmp_path / "two_convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_the_rescue_s_weight_only_model_takes_gptq_s_int8_weights_where_rtn_needs_16_bits(cli, tmp_path: Path) -> None:
    """A cosine floor between the errors of int8 weights rounded to nearest and by GPTQ (each
    measured first, weight-only, on held-out samples). The default rescue's weight-only model
    misses it with int8 weights and writes 16-bit ones; with `weights: {algorithm: gptq}` it
    writes int8 weights rounded by GPTQ (each fold's model on the other folds' Gram matrices,
    measured in one pass), said in the note and reproduced by the precision config."""
    model, calib, held = two_convs(tmp_path), smooth_folder(tmp_path / "calib", 48, 0), smooth_folder(
        tmp_path / "held", 32, 1)
    error = {}
    for algorithm in ("rtn", "gptq"):
        config = tmp_path / f"{algorithm}.yaml"
        config.write_text(f"activations: {{dtype: float}}\nweights: {{algorithm: {algorithm}}}\n")
        assert cli("quantize", model, "-o", tmp_path / f"{algorithm}.onnx", "--data", calib, "--config", config,
                   "--no-verify").exit_code == 0
        report = json.loads(cli("analyze", model, tmp_path / f"{algorithm}.onnx", "--data", held, "--json").stdout)
        error[algorithm] = 1.0 - report["fidelity"][0]["cosine"]
    assert error["gptq"] < 0.5 * error["rtn"]
    floors = f"verify: {{min_cosine: {1.0 - (error['gptq'] * error['rtn']) ** 0.5:.8f}, outputs: {{y: cosine}}}}\n"
    written = {}
    for algorithm in ("rtn", "gptq"):
        (tmp_path / "floors.yaml").write_text(floors + f"weights: {{algorithm: {algorithm}}}\n")
        result = cli("quantize", model, "-o", tmp_path / f"q_{algorithm}.onnx", "--data", calib, "--config",
                     tmp_path / "floors.yaml", "--json")
        assert result.exit_code == 0, result.stderr
        written[algorithm] = next(n for n in json.loads(result.stdout)["notes"] if n.startswith("weight-only:"))
        weights = {t.name: t.data_type for t in onnx.load(str(tmp_path / f"q_{algorithm}.onnx")).graph.initializer
                   if t.name.endswith("_quantized")}
        wanted = onnx.TensorProto.INT8 if algorithm == "gptq" else onnx.TensorProto.INT16
        assert sorted(weights.values()) == [wanted] * 2, weights
    assert "the model with int16 weights and float activations" in written["rtn"]
    assert "the model with int8 weights rounded by GPTQ and float activations" in written["gptq"]
    assert (tmp_path / "q_gptq.precision.yaml").read_text().count("algorithm: gptq") == 1
