"""Shared test helpers: tiny models written in ONNX text, and a CLI runner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from typer.testing import CliRunner

from qcli.cli import app
from qcli.model import clamp_ir_version

REPO = Path(__file__).resolve().parents[1]
SAMPLE_MODELS = REPO / "sample_models"
LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def parse_model(text: str) -> onnx.ModelProto:
    """An ONNX-text model with an IR version the installed onnxruntime loads."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return clamp_ir_version(model)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


IMAGE_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 1, 4, 4] image) => (float[N, 3] logits) {
    flat = Flatten <axis = 1> (image)
    w = Constant <value = float[16, 3] {0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.3,1.4,1.5,1.6,
        0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.3,1.4,1.5,1.6,
        0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.3,1.4,1.5,1.6}> ()
    logits = MatMul (flat, w)
}
"""

TWO_INPUT_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, S, 8] x, int64[N, S] ids) => (float[N, S, 8] y) <int64[1] axes = {2}> {
    idsf = Cast <to = 1> (ids)
    e = Unsqueeze (idsf, axes)
    y = Add (x, e)
}
"""


@pytest.fixture
def image_model(tmp_path: Path) -> Path:
    return save(parse_model(IMAGE_MODEL), tmp_path / "image.onnx")


@pytest.fixture
def two_input_model(tmp_path: Path) -> Path:
    return save(parse_model(TWO_INPUT_MODEL), tmp_path / "two.onnx")


class Cli:
    """Invoke the qcli app in-process; stdout and stderr kept apart."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: object):
        return self.runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    def json(self, *args: object) -> dict:
        result = self(*args, "--json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def cli() -> Cli:
    return Cli()


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path
