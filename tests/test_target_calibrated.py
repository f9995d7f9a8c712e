"""A target profile calibrated on the user's model (`qcli target measure --model`, issue 44): the
file and its all-int8 model timed once on the target, two factors on the base profile's float and
integer kernel classes; decisions then read the file, never the clock."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_target import conv_models, near_parity_data

from conftest import normal_folder, parse_model, save
from qcli.target import load_profile, predict, priced
from qcli.target.kernels import Kernel
from qcli.target.profile import Calibration, Cost, Profile


def calibrated(factors: dict[str, float]) -> Profile:
    base = Profile(name="t", kind="rules", run_us=10, kernels={
        "memory": Cost(terms={"call": 1}), "conv.i8": Cost(terms={"call": 4}), "conv.f32": Cost(terms={"call": 8})})
    return base.model_copy(update={"calibration": Calibration(
        model="m.onnx", sha256="sha256:0", factors=factors, base="t", measured_ms={"float": 1, "int8": 1},
        predicted_ms={"float": 1, "int8": 1})})


def test_the_factors_scale_the_integer_classes_and_everything_else_apart() -> None:
    p = calibrated({"float": 2.0, "int8": 0.5})
    assert p.price(Kernel("a", "QLinearConv", "conv.i8")) == 2.0
    assert p.price(Kernel("b", "DequantizeLinear", "qdq")) == 0.5  # qdq -> memory's price, an integer class
    assert p.price(Kernel("c", "Conv", "conv.f32")) == 16.0
    assert p.price(Kernel("d", "Transpose", "memory")) == 2.0
    assert priced([Kernel("c", "Conv", "conv.f32")], p).us == 20.0 + 16.0  # run_us scaled as a float call


def test_a_calibration_with_a_factor_not_above_zero_is_refused_naming_the_key(tmp_path: Path) -> None:
    doc = json.loads(calibrated({"float": 1.0, "int8": 1.0}).model_dump_json())
    doc["calibration"]["factors"]["int8"] = 0
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    from qcli.errors import ConfigError

    with pytest.raises(ConfigError, match=r"p.json: calibration.factors.int8: Input should be greater than 0"):
        load_profile(path)


def test_the_calibrated_profile_predicts_what_was_timed(monkeypatch) -> None:
    """Whatever the base profile says, the calibrated one predicts the file's timed µs and the
    all-int8 model's timed ratio (the base is generic: no speed for int8)."""
    from qcli.target import calibrated as cal
    from qcli.target.profile import resolve

    float_model, qdq, feeds = conv_models()
    base, _ = resolve("generic")
    timed = 1.5 * predict(float_model, feeds, base).us
    monkeypatch.setattr(cal, "timed", lambda *a: (timed, 0.7))
    p = cal.calibrate(base, float_model, qdq, feeds, "mine", "conv.onnx", lambda n: None)
    f, q = predict(float_model, feeds, p).us, predict(qdq, feeds, p).us
    assert f == pytest.approx(timed, rel=1e-5) and q / f == pytest.approx(0.7, rel=1e-4)
    assert predict(qdq, feeds, base).us / predict(float_model, feeds, base).us > 1.05  # what generic said
    assert p.calibration is not None and p.calibration.note == ""
    assert p.calibration.measured_ms["int8"] == pytest.approx(0.7 * timed / 1e3, abs=1e-4)


def test_target_measure_model_writes_a_calibrated_profile_that_quantize_reads(cli, tmp_path: Path) -> None:
    """End to end, timed for real: the profile predicts the file at its measured time, and a
    verified run says what the profile was calibrated on; on another model it says so."""
    model, data = near_parity_data(tmp_path)
    out = tmp_path / "mine.json"
    doc = cli.json("target", "measure", "--model", model, "--data", data, "--from", "generic", "-o", out)
    assert doc["path"] == str(out) and doc["base"] == "generic" and doc["model"] == model.name
    profile = load_profile(out)
    c = profile.calibration
    assert c is not None and profile.kind == "measured" and c.measured_ms["float"] > 0
    if not c.note:  # no factor held at its bound: the file's prediction is its timing
        first = dict(np.load(next(iter(sorted(data.iterdir())))))
        assert predict(onnx.load(model), first, profile).ms == pytest.approx(c.measured_ms["float"], rel=1e-3)
    shown = cli("target", "show", out)
    assert shown.exit_code == 0 and f"calibrated on {model.name} at batch 1 from generic: float kernels x" in shown.stdout
    config = tmp_path / "c.yaml"
    config.write_text(f"target: {out}\n")
    q = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--config", config)
    assert f"(file, calibrated on {model.name} at batch 1)" in q["verification"]["target"]
    assert not any("calibrated on another model" in n for n in q["notes"])
    other = save(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[1, 32, 40, 40] x) => (float[1, 32, 40, 40] y) { y = Relu (x) }
    """), tmp_path / "other.onnx")
    q = cli.json("quantize", other, "-o", tmp_path / "o.onnx", "--data", data, "--config", config)
    said = f"target generic+{model.stem} was calibrated on another model ({model.name}): its factors fit that model's"
    assert any(n.startswith(said) for n in q["notes"]), q["notes"]


def test_target_measure_model_without_data_is_refused(cli, tmp_path: Path) -> None:
    model, _ = near_parity_data(tmp_path)
    result = cli("target", "measure", "--model", model, "-o", tmp_path / "p.json")
    assert result.exit_code == 2
    assert ("error: --model needs --data DIR: the int8 model is calibrated on it and its first sample timed"
            in result.stderr)
    assert not (tmp_path / "p.json").exists()


def test_a_folder_without_samples_for_the_model_is_a_clear_error(cli, tmp_path: Path) -> None:
    model, _ = near_parity_data(tmp_path)
    wrong = normal_folder(tmp_path / "wrong", 2, z=(1, 3))
    result = cli("target", "measure", "--model", model, "--data", wrong, "-o", tmp_path / "p.json")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
