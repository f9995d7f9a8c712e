"""`qcli calibrate` end to end: tensors observed, ranges, the calibration file, bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import parse_model, save, write_npz
from qcli.calibrate.collect import session_with_outputs
from qcli.calibrate.table import build_table, load_table
from qcli.config import Config
from qcli.errors import CalibrationError
from qcli.model import fingerprint, load_model
from qcli.plan import make_plan
from qcli.prepare import prepare

_W = ", ".join(f"{v:.2f}" for v in np.linspace(-0.9, 0.9, 72) * np.tile([1, -1, 1], 24))
CONV_MODEL = f"""
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 2, 6, 6] x) => (float[N, 4] y)
    <float[4, 2, 3, 3] w = {{{_W}}}, float[4] b = {{0.1, -0.1, 0.2, 0.0}}, float[1] huge = {{1e20}}> {{
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    r = Relu (c)
    p = GlobalAveragePool (r)
    f = Flatten (p)
    big = Mul (f, huge)
    y = Mul (big, huge)
}}
"""


@pytest.fixture
def conv_model(tmp_path: Path) -> Path:
    return save(parse_model(CONV_MODEL), tmp_path / "conv.onnx")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(20):
        write_npz(folder / f"{i:03d}.npz", x=rng.standard_normal((2, 6, 6)).astype(np.float32))
    return folder


def test_observes_what_quantization_needs(conv_model: Path) -> None:
    # Conv's output feeds only Relu: the clipped output is observed instead.
    prepared = prepare(load_model(conv_model)).model
    assert make_plan(prepared, Config()).calibrated_tensors == ["x", "r", "p", "f", "big", "y"]


def test_calibrate_writes_the_file_in_the_working_directory(
    cli, conv_model: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    doc = cli.json("calibrate", conv_model, "--data", data, "--samples", "12", "--batch-size", "5")
    assert doc["calibration_file"] == str(work / "conv.calib.json")
    assert doc["samples"] == 12 and doc["tensors"] == 6

    # minmax ranges equal an independent computation with onnxruntime over the same samples
    model = load_model(conv_model)
    session = session_with_outputs(model, ["x", "r"])
    xs = np.concatenate([np.load(p)["x"][None] for p in sorted(data.glob("*.npz"))[:12]])
    x_out, r_out = session.run(["x", "r"], {"x": xs})
    assert doc["ranges"]["x"]["minmax"] == pytest.approx([float(x_out.min()), float(x_out.max())])
    assert doc["ranges"]["r"]["minmax"] == pytest.approx([0.0, float(r_out.max())])

    table = load_table(work / "conv.calib.json", fingerprint(model))
    assert table.samples == 12
    assert table.observers["r"].count == r_out.size
    # solved now: minmax and the selected method; another one from the file's histograms, as
    # a calibration solving it at once would have
    assert set(doc["ranges"]["x"]) == {"min", "max", "minmax", "mse", "clipped"} and set(table.ranges) == {"minmax", "mse"}
    assert table.ranges["mse"]["x"] == tuple(doc["ranges"]["x"]["mse"])
    every = build_table(table.observers, table.fingerprint, table.samples, table.settings)
    for method in ("percentile", "kl"):
        assert table.range("x", replace(table.settings, method=method)) == every.ranges[method]["x"]


def test_nonfinite_and_constant_tensors_warn(cli, conv_model: Path, data: Path, tmp_path: Path) -> None:
    for method in ("minmax", "percentile", "kl", "mse"):
        doc = cli.json("calibrate", conv_model, "--data", data, "-o", tmp_path / "c.json", "--method", method)
        # y = f * 1e20 * 1e20 overflows float32 to +-Inf: defined range from the finite values
        assert any(w.startswith("tensor 'y': ") and "NaN/Inf value(s) ignored" in w for w in doc["warnings"])
        lo, hi = doc["ranges"]["y"][method]
        assert np.isfinite(lo) and np.isfinite(hi) and lo <= 0 <= hi


def test_constant_tensor_warns(cli, tmp_path: Path, data: Path) -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 2, 6, 6] x) => (float[N, 2, 6, 6] y)
            <float[2, 2, 1, 1] w = {1.0, 0.0, 0.0, 1.0}, float[1] zero = {0.0}> {
            c = Conv (x, w)
            y = Mul (c, zero)
        }
        """
    )
    path = save(model, tmp_path / "zero.onnx")
    doc = cli.json("calibrate", path, "--data", data, "-o", tmp_path / "z.json", "--method", "kl")
    assert "tensor 'y' is constant (0) over the calibration data" in doc["warnings"]
    assert doc["ranges"]["y"]["kl"] == [0.0, 0.0]


def test_deterministic_file(cli, conv_model: Path, data: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert cli("calibrate", conv_model, "--data", data, "-o", a, "-q").exit_code == 0
    assert cli("calibrate", conv_model, "--data", data, "-o", b, "-q").exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(a.read_text())
    assert doc["format"] == "qcli-calibration/1"
    assert doc["fingerprint"] == fingerprint(load_model(conv_model))


def test_human_output(cli, conv_model: Path, data: Path, tmp_path: Path) -> None:
    result = cli("calibrate", conv_model, "--data", data, "-o", tmp_path / "c.json", "--method", "kl")
    assert result.exit_code == 0, result.stderr
    assert "Calibration: 6 tensors over 20 samples" in result.stdout
    assert "kl*" in result.stdout


def test_stale_and_damaged_calibration_files(cli, conv_model: Path, data: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cli("calibrate", conv_model, "--data", data, "-o", path, "-q")
    with pytest.raises(CalibrationError, match="was made for another model"):
        load_table(path, "sha256:" + "0" * 64)
    path.write_text(path.read_text()[:500])
    with pytest.raises(CalibrationError, match="is not a readable calibration file"):
        load_table(path)
    path.write_text('{"format": "something-else"}')
    with pytest.raises(CalibrationError, match="is not a qcli calibration file"):
        load_table(path)


def test_bad_method(cli, conv_model: Path, data: Path) -> None:
    result = cli("calibrate", conv_model, "--data", data, "--method", "entropy")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: command line: calibration.method: Input should be")


def test_data_that_does_not_fit(cli, conv_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    write_npz(folder / "0.npz", x=np.zeros((3, 6, 6), np.float32))
    result = cli("calibrate", conv_model, "--data", folder)
    assert result.exit_code == 2
    assert f"error: {folder / '0.npz'}: input 'x' has shape [1, 3, 6, 6]" in result.stderr
