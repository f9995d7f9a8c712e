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


def test_a_latency_batch_the_model_cannot_run_is_bad_input(cli, tmp_path: Path) -> None:
    """A model whose graph fixes its batch (a Reshape to the export-time shape) runs its samples
    but not --latency-batch 3: exit 2 naming the batch and what to give, before any timing."""
    from conftest import normal_folder, parse_model, save

    model = save(parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        fixed (float[N, 3, 3] x) => (float[3, 3] y) <int64[2] shape = {3, 3}> { y = Reshape (x, shape) }
    """), tmp_path / "model.onnx")
    data = normal_folder(tmp_path / "data", 1, x=(1, 3, 3))  # more would batch: the model runs one at a time
    out = tmp_path / "q.onnx"
    assert cli("quantize", model, "-o", out, "--data", data).exit_code == 0
    result = cli("analyze", model, out, "--data", data, "--latency-batch", "3")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: the float model cannot run at latency batch 3 (analyze.latency_batch, --latency-batch): "
        "onnxruntime: [ONNXRuntimeError]"), result.stderr
    assert ("hint: it fails as given, before any change by qcli: it may fix its batch size inside the graph (a "
            "Reshape to the export-time shape); time both at the batch the samples come in: --latency-batch 1"
            ) in result.stderr
    assert cli("analyze", model, out, "--data", data, "--latency-batch", "1").exit_code == 0
