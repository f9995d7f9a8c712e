"""`qcli analyze` from the command line: reports by extension, gates -> exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SAMPLE_MODELS


@pytest.fixture(scope="module")
def cnn_int8(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from qcli.cli import app

    out = tmp_path_factory.mktemp("q") / "cnn.int8.onnx"
    cnn = SAMPLE_MODELS / "cnn"
    result = CliRunner().invoke(app, ["quantize", str(cnn / "model.onnx"), "-o", str(out), "--data", str(cnn / "calib"), "-q"])
    assert result.exit_code == 0, result.stderr
    return out


def test_gates_pass_and_fail(cli, cnn_int8: Path, tmp_path: Path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    report = tmp_path / "r.json"
    ok = cli("analyze", cnn / "model.onnx", cnn_int8, "--data", cnn / "eval", "--runs", "20",
             "--max-accuracy-drop", "0.01", "--min-compression", "2.5", "--report", report)
    assert ok.exit_code == 0, ok.stderr
    doc = json.loads(report.read_text())
    assert doc["format"] == "qcli-analysis/1" and doc["passed"] is True
    failed = cli("analyze", cnn / "model.onnx", cnn_int8, "--data", cnn / "eval", "--runs", "20",
                 "--min-compression", "10", "--samples", "50")
    assert failed.exit_code == 1
    assert "error: " in failed.stderr and "compression" in failed.stderr
    assert "min_compression" in failed.stdout


def test_report_extension_is_checked(cli, cnn_int8: Path, tmp_path: Path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    result = cli("analyze", cnn / "model.onnx", cnn_int8, "--data", cnn / "eval", "--runs", "0",
                 "--samples", "20", "--report", tmp_path / "r.txt")
    assert result.exit_code == 2
    assert ".txt" in result.stderr


def test_json_is_the_only_stdout(cli, cnn_int8: Path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    doc = cli.json("analyze", cnn / "model.onnx", cnn_int8, "--data", cnn / "eval", "--runs", "0", "--samples", "40")
    assert doc["accuracy"]["samples"] == 40
    assert doc["speed"] is None


def test_harmful_config_trips_the_accuracy_gate(cli, tmp_path: Path) -> None:
    """8 bits on every op, the LayerNorm/Softmax/GELU chains included, wrecks the transformer:
    the gate must say so (exit 1), while the default config passes the same gate."""
    t = SAMPLE_MODELS / "transformer"
    harmful = tmp_path / "harmful.yaml"
    harmful.write_text(
        "calibration: {method: minmax}\n"
        "overrides:\n"
        "  - match: {op_types: [Softmax, LayerNormalization, Erf, Div, Where, Sub, Pow, Sqrt, ReduceMean]}\n"
        "    precision: uint8\n"
    )
    args = ["--data", t / "calib", "--samples", "128", "--eval-data", t / "eval", "--max-accuracy-drop", "0.02"]
    # --no-verify: verification would rescue the harmful config (tests/test_verify.py)
    bad = cli("quantize", t / "model.onnx", "-o", tmp_path / "bad.onnx", "--config", harmful, *args, "--no-verify")
    assert bad.exit_code == 1
    assert "error: quality gate failed: top-1 drop" in bad.stderr
    good = cli("quantize", t / "model.onnx", "-o", tmp_path / "good.onnx", *args)
    assert good.exit_code == 0, good.stderr
