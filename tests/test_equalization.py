"""Cross-layer equalization (`recovery: [equalization]`): the scales against a numpy reference,
the float model unchanged, depthwise pairs, what is left alone and why, and the int8 error it
saves where per-tensor weights meet very unequal channel ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qcli.config import Config
from qcli.quantize import prepare_for
from qcli.recovery.equalize import equalize, find_pairs
from tests.conftest import fused_op_counts, parse_model, quantize_with, save, sqnr_db, tensor_text, write_npz


def _model(body: str, weights: dict[str, np.ndarray], out_channels: int, in_channels: int = 3) -> onnx.ModelProto:
    inits = ",\n     ".join(tensor_text(k, v) for k, v in weights.items())
    return parse_model(f"""
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, {in_channels}, 8, 8] x) => (float[N, {out_channels}, 8, 8] y)
    <{inits}> {{
{body}
}}
""")


def _unequal_pair(act: str = "Relu") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv(3 -> 6) -> act -> Conv(6 -> 4), the first Conv's channel ranges 1e-2 .. 30 apart and
    the second's inputs compensating: the float function of a balanced net, hard on per-tensor
    weights."""
    rng = np.random.default_rng(7)
    spread = np.array([30.0, 0.01, 1.0, 0.05, 8.0, 0.3])
    w1 = rng.normal(0, 0.3, (6, 3, 3, 3)) * spread[:, None, None, None]
    b1 = rng.normal(0, 0.1, 6) * spread
    w2 = rng.normal(0, 0.3, (4, 6, 3, 3)) / spread[None, :, None, None]
    b2 = rng.normal(0, 0.1, 4)
    weights = {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "lo": np.array(0.0), "hi": np.array(6.0),
               "slope": rng.uniform(0.05, 0.3, (6, 1, 1))}
    between = {"": "", "Clip": "a = Clip (c1, lo, hi)", "PRelu": "a = PRelu (c1, slope)"}.get(act, f"a = {act} (c1)")
    body = (f"    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)\n    {between}\n"
            f"    y = Conv <pads = [1, 1, 1, 1]> ({'c1' if not act else 'a'}, w2, b2)")
    return _model(body, weights, 4), weights


def _depthwise_chain() -> onnx.ModelProto:
    """Conv 1x1 (3 -> 4) -> Relu -> depthwise 3x3 (group 4) -> Relu -> Conv 1x1 (4 -> 5)."""
    rng = np.random.default_rng(3)
    spread = np.array([20.0, 0.02, 1.0, 0.2])
    weights = {
        "w1": rng.normal(0, 0.5, (4, 3, 1, 1)) * spread[:, None, None, None],
        "w2": rng.normal(0, 0.5, (4, 1, 3, 3)) / spread[:, None, None, None],
        "b2": rng.normal(0, 0.1, 4),
        "w3": rng.normal(0, 0.5, (5, 4, 1, 1)),
    }
    body = """    c1 = Conv (x, w1)
    r1 = Relu (c1)
    c2 = Conv <group = 4, pads = [1, 1, 1, 1]> (r1, w2, b2)
    r2 = Relu (c2)
    y = Conv (r2, w3)"""
    return _model(body, weights, 5)


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


X = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)


def test_scales_match_a_numpy_reference() -> None:
    model, _ = _unequal_pair()
    w = _weights(model)  # as stored (float32)
    done = equalize(model)
    assert done.pairs == ["Conv (output 'c1') -> Conv (output 'y')"]
    r1 = np.abs(w["w1"]).max(axis=(1, 2, 3))
    r2 = np.abs(w["w2"]).max(axis=(0, 2, 3))
    s = np.sqrt(r1 * r2) / r2  # Nagel et al. eq. 9; AIMET's scale factor
    got = _weights(model)
    np.testing.assert_allclose(got["w1"], w["w1"] / s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(got["b1"], w["b1"] / s, rtol=1e-6)
    np.testing.assert_allclose(got["w2"], w["w2"] * s[None, :, None, None], rtol=1e-6)
    np.testing.assert_allclose(got["b2"], w["b2"], rtol=1e-6)
    # both sides of every channel now have the same range
    np.testing.assert_allclose(np.abs(got["w1"]).max(axis=(1, 2, 3)), np.abs(got["w2"]).max(axis=(0, 2, 3)), rtol=1e-5)


@pytest.mark.parametrize("act", ["Relu", "LeakyRelu", "PRelu", ""])
def test_float_outputs_are_unchanged(act: str) -> None:
    model, _ = _unequal_pair(act)
    before = _run(model, X)
    assert equalize(model).pairs
    np.testing.assert_allclose(_run(model, X), before, rtol=1e-4, atol=1e-5 * np.abs(before).max())


def test_depthwise_chain_balances_both_pairs_and_converges() -> None:
    model = _depthwise_chain()
    before = _run(model, X)
    once = _depthwise_chain()
    equalize(once, 1)
    done = equalize(model, 20)
    assert len(done.pairs) == 2
    np.testing.assert_allclose(_run(model, X), before, rtol=1e-4, atol=1e-5 * np.abs(before).max())
    w = _weights(model)

    def imbalance(w: dict[str, np.ndarray]) -> float:
        first = np.abs(np.log(np.abs(w["w1"]).max(axis=(1, 2, 3)) / np.abs(w["w2"]).max(axis=(1, 2, 3))))
        second = np.abs(np.log(np.abs(w["w2"]).max(axis=(1, 2, 3)) / np.abs(w["w3"]).max(axis=(0, 2, 3))))
        return float(first.max() + second.max())

    assert imbalance(w) < 0.01  # iterated: each depthwise channel balanced against both neighbours
    assert imbalance(_weights(once)) > 10 * imbalance(w)


@pytest.mark.parametrize(
    "act, why",
    [
        ("Clip", "a Clip between them is not positive-homogeneous"),
        ("HardSwish", "a HardSwish between them is not positive-homogeneous"),
    ],
)
def test_non_homogeneous_activations_are_left_alone(act: str, why: str) -> None:
    model, _ = _unequal_pair(act)
    w = _weights(model)
    done = equalize(model)
    assert done.pairs == [] and dict(done.skipped) == {why: 1}
    assert done.notes == ["equalization: no Conv pair to balance", f"equalization: 1 Conv pair(s) left alone: {why}"]
    np.testing.assert_array_equal(_weights(model)["w1"], w["w1"])


def test_a_first_conv_read_elsewhere_is_left_alone() -> None:
    model, _ = _unequal_pair()
    model.graph.output.append(onnx.helper.make_tensor_value_info("c1", onnx.TensorProto.FLOAT, None))
    pairs, report = find_pairs(model.graph)
    assert pairs == [] and dict(report.skipped) == {"the first Conv's output is read elsewhere": 1}


def test_prepare_for_equalizes_after_batchnorm_folding() -> None:
    model, _ = _unequal_pair()
    config = Config.model_validate({"recovery": ["equalization"]})
    prepared = prepare_for(model, config)
    assert prepared.recovery == {"equalization": {"pairs": ["Conv (output 'c1') -> Conv (output 'y')"], "skipped": {}}}
    assert "equalization: balanced 1 Conv pair(s)" in prepared.notes
    assert prepare_for(model, Config()).recovery == {}
    np.testing.assert_allclose(_run(prepared.model, X), _run(model, X), rtol=1e-4, atol=1e-4)




@pytest.fixture
def unequal(tmp_path: Path) -> tuple[Path, Path, Path]:
    model = save(_unequal_pair()[0], tmp_path / "pair.onnx")
    rng = np.random.default_rng(1)
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(32):
        write_npz(folder / f"{i:03d}.npz", x=rng.standard_normal((3, 8, 8)).astype(np.float32))
    held = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "held.npy", held)
    return model, folder, tmp_path / "held.npy"




def test_equalization_cuts_per_tensor_int8_error_end_to_end(cli, tmp_path: Path, unequal) -> None:
    model, data, held = unequal
    x = np.load(held)
    ref = _run(model, x)
    per_tensor = "weights: {granularity: per_tensor}\n"
    plain, _ = quantize_with(cli, tmp_path, model, data, "plain", per_tensor)
    equal, doc = quantize_with(cli, tmp_path, model, data, "equal", per_tensor + "recovery: [equalization]\n")
    assert doc["recovery"]["equalization"]["pairs"] == ["Conv (output 'c1') -> Conv (output 'y')"]
    assert "equalization: balanced 1 Conv pair(s)" in doc["notes"]
    before, after = sqnr_db(ref, _run(plain, x)), sqnr_db(ref, _run(equal, x))
    assert after > before + 10, (before, after)  # measured: 0.1 dB -> 34.5 dB
    assert fused_op_counts(equal, tmp_path) == fused_op_counts(plain, tmp_path)
    assert fused_op_counts(equal, tmp_path)["QLinearConv"] == 2
    meta = {p.key: p.value for p in onnx.load(str(equal)).metadata_props}
    assert '"recovery":{"equalization":{"iterations":1}}' in meta["qcli.config"]


def test_equalized_model_is_deterministic(cli, tmp_path: Path, unequal) -> None:
    model, data, _ = unequal
    config = "recovery: [{equalization: {iterations: 3}}]\n"
    a, _ = quantize_with(cli, tmp_path, model, data, "a", config)
    b, _ = quantize_with(cli, tmp_path, model, data, "b", config)
    assert a.read_bytes() == b.read_bytes()


def test_a_calibration_of_the_graph_before_equalization_is_refused(cli, tmp_path: Path, unequal) -> None:
    model, data, _ = unequal
    (tmp_path / "eq.yaml").write_text("recovery: [equalization]\n")
    plain, equal = tmp_path / "plain.json", tmp_path / "equal.json"
    assert cli("calibrate", model, "--data", data, "-o", plain).exit_code == 0
    assert cli("calibrate", model, "--data", data, "-o", equal, "--config", tmp_path / "eq.yaml").exit_code == 0
    out = tmp_path / "q.onnx"
    result = cli("quantize", model, "-o", out, "--calib", plain, "--config", tmp_path / "eq.yaml")
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(
        "error: the calibration was made without recovery steps, and this config runs with equalization: its ranges "
        "are those of another graph\nhint: calibrate again with the same --config as quantize"), result.stderr
    assert cli("quantize", model, "-o", out, "--calib", equal, "--config", tmp_path / "eq.yaml").exit_code == 0
    assert cli("quantize", model, "-o", out, "--calib", equal).exit_code == 2
