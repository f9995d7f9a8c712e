"""`qcli --version`, `qcli inspect` and the CLI's error boundary, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import LIGHT_MODELS, SAMPLE_MODELS, write_npz
from qcli import __version__


def test_version(cli) -> None:
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"qcli {__version__}\n"


def test_inspect_json_is_the_only_stdout(image_model: Path) -> None:
    # A real subprocess through the console script: nothing but one JSON document on stdout.
    result = subprocess.run(
        [sys.executable, "-m", "qcli.cli", "inspect", str(image_model), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(result.stdout)
    assert info["format"] == "qcli-inspect/1"
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["N", 1, 4, 4]}]
    assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["N", 3]}]
    assert info["op_types"] == {"Constant": 1, "Flatten": 1, "MatMul": 1}
    assert info["weights"]["parameters"] == 48
    assert info["weights"]["constant_nodes"] == 1
    assert info["opsets"] == {"ai.onnx": 17}


def test_inspect_human_output(cli, image_model: Path) -> None:
    result = cli("inspect", image_model)
    assert result.exit_code == 0
    assert "Op types (3 nodes)" in result.stdout
    assert "MatMul" in result.stdout


@pytest.mark.parametrize("name", sorted(p.name for p in LIGHT_MODELS.glob("*.onnx")))
def test_inspect_model_zoo_graphs(cli, name: str) -> None:
    info = cli.json("inspect", LIGHT_MODELS / name)
    assert info["opsets"] == {"ai.onnx": 9}
    assert info["weights"]["constant_of_shape_nodes"] > 0
    assert info["weights"]["parameters"] > 1_000_000


@pytest.mark.parametrize("name", ["cnn", "transformer", "mlp"])
def test_inspect_sample_models(cli, name: str) -> None:
    model = SAMPLE_MODELS / name / "model.onnx"
    info = cli.json("inspect", model, "--data", model.parent / "eval")
    assert info["data"]["samples"] >= 300
    assert info["data"]["labelled"] == info["data"]["samples"]


def test_inspect_cnn_image_folder(cli) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    info = cli.json(
        "inspect", cnn / "model.onnx", "--data", cnn / "eval_images", "--config", cnn / "preprocess.yaml"
    )
    assert info["data"]["layout"] == "image-folders"
    assert info["data"]["class_names"] == [str(i) for i in range(10)]
    assert info["data"]["samples"] >= 300


# ---- bad input: exit 2, `error: ...` on stderr, no traceback


def _fails(result, message: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_missing_model(cli, tmp_path: Path) -> None:
    _fails(cli("inspect", tmp_path / "none.onnx"), f"model file not found: {tmp_path / 'none.onnx'}")


def test_not_onnx(cli, tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("these are notes")
    result = cli("inspect", path, "--json")
    _fails(result, f"{path} is not a valid ONNX model (the file is empty, truncated or of another format)")
    assert "hint: re-export the model" in result.stderr


def test_truncated_model(cli, tmp_path: Path) -> None:
    data = (LIGHT_MODELS / "light_resnet50.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[:1000])
    _fails(cli("inspect", path), f"{path} is not a valid ONNX model")


def test_bad_data_names_file_and_input(cli, image_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_npz(data / "0.npz", image=np.zeros((1, 4, 4), np.float32))
    write_npz(data / "1.npz", image=np.zeros((1, 4, 5), np.float32))
    _fails(
        cli("inspect", image_model, "--data", data),
        f"{data / '1.npz'}: input 'image' has shape [1, 1, 4, 5], "
        "the model expects [N, 1, 4, 4] (axis 3 must be 4)",
    )


def test_empty_data_folder(cli, image_model: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(cli("inspect", image_model, "--data", empty), f"no samples found in {empty}")


def test_bad_yaml(cli, image_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  preprocess: {scale: 255\n")
    data = tmp_path / "d"
    data.mkdir()
    write_npz(data / "0.npz", image=np.zeros((1, 4, 4), np.float32))
    result = cli("inspect", image_model, "--data", data, "--config", config)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {config}:3:1: YAML syntax error")


def test_debug_shows_the_traceback(cli, tmp_path: Path) -> None:
    """--debug shows the traceback and keeps the error's exit code (it used to let the
    exception escape: Python's exit 1, issue 20)."""
    result = cli("inspect", tmp_path / "none.onnx", "--debug")
    assert result.exit_code == 2
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert f"qcli.errors.ModelError: model file not found: {tmp_path / 'none.onnx'}\n" in result.stderr


def test_usage_error_exits_2(cli) -> None:
    assert cli("inspect").exit_code == 2


# Exporters name dynamic axes in lower case ("batch", "unk__214"): "[batch, seq]" is a rich
# markup tag unless escaped, and was printed as nothing.
NAMED_DIMS_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[batch, 3] x) => (float[batch, 3] y) {
    y = Relu (x)
}
"""


def test_inspect_prints_named_dims(cli, tmp_path: Path) -> None:
    import onnx

    model = tmp_path / "named.onnx"
    onnx.save(onnx.parser.parse_model(NAMED_DIMS_MODEL), str(model))
    result = cli("inspect", model)
    assert result.exit_code == 0
    assert result.stdout.count("[batch, 3]") == 2


def test_error_messages_keep_their_brackets(cli, tmp_path: Path) -> None:
    import onnx

    model = tmp_path / "named.onnx"
    onnx.save(onnx.parser.parse_model(NAMED_DIMS_MODEL), str(model))
    data = tmp_path / "[bold]data"  # a folder name rich read as a style tag
    data.mkdir()
    write_npz(data / "0.npz", x=np.zeros((1, 4), np.float32))
    _fails(
        cli("inspect", model, "--data", data),
        f"{data / '0.npz'}: input 'x' has shape [1, 4], the model expects [batch, 3] (axis 1 must be 3)",
    )


def test_a_failing_run_is_reported_once(tmp_path: Path) -> None:
    """onnxruntime's own log line of a run error (red, before qcli's message, same text) is off:
    the error reaches the user once, as qcli's message naming the file (a real subprocess:
    onnxruntime logs to file descriptor 2, which CliRunner does not capture)."""
    import onnx

    model = tmp_path / "bad.onnx"
    onnx.save(onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x) => (float[3, M] y) {
            w = Constant <value = float[4, 4] {1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1}> ()
            h = MatMul (x, w)
            shape = Constant <value = int64[2] {3, -1}> ()
            y = Reshape (h, shape)
        }"""), str(model))
    data = tmp_path / "data"
    data.mkdir()
    write_npz(data / "0.npz", x=np.ones((1, 4), np.float32))
    result = subprocess.run([sys.executable, "-m", "qcli.cli", "calibrate", str(model), "--data", str(data),
                             "-o", str(tmp_path / "c.json")], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: onnxruntime failed on {data / '0.npz'}: "), result.stderr
    assert "[E:onnxruntime" not in result.stderr
    assert "\nhint: the model fails on this sample as given, before any change by qcli" in result.stderr
