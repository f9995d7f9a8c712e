"""Shared test helpers: tiny models written in ONNX text, and a CLI runner."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
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


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small decoder with random weights and a text folder (decoders.tiny_folder)."""
    from decoders import tiny_folder

    return tiny_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def cli() -> Cli:
    return Cli()


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def normal_folder(folder: Path, n: int, **shapes: tuple[int, ...]) -> Path:
    """`n` .npz files, sample i holding standard normal float32 arrays of `shapes` (seed i)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        rng = np.random.default_rng(i)
        write_npz(folder / f"{i:03d}.npz", **{k: rng.normal(0, 1, s).astype(np.float32) for k, s in shapes.items()})
    return folder


def op_counts(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def fused_op_counts(path: Path, tmp_path: Path) -> Counter:
    """Op types after onnxruntime's graph optimizations: what really runs."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return op_counts(tmp_path / "optimized.onnx")


RESIDUAL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4, 8, 8] x) => (float[N, 5] y)
    <float[4, 4, 3, 3] w1 = {W1}, float[4] b1 = {0.1, -0.1, 0.05, 0.0},
     float[4, 4, 3, 3] w2 = {W2}, float[5, 4] wf = {WF}, float[5] bf = {0.5, -0.5, 0.25, 0, 0.1}> {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    r1 = Relu (c1)
    c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)
    s = Add (c2, x)
    r2 = Relu (s)
    p = GlobalAveragePool (r2)
    f = Flatten (p)
    y = Gemm <transB = 1> (f, wf, bf)
}
"""


def _values(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "{" + ", ".join(f"{v:.4f}" for v in rng.normal(0, 0.3, n)) + "}"


@pytest.fixture
def residual(tmp_path: Path) -> Path:
    text = RESIDUAL.replace("{W1}", _values(144, 1)).replace("{W2}", _values(144, 2)).replace("{WF}", _values(20, 3))
    return save(parse_model(text), tmp_path / "residual.onnx")


@pytest.fixture
def unfloored(tmp_path: Path) -> Path:
    """A config with no latency floor, for tests of quantization's mechanics on models too small
    for int8 to pay off on every target (whether it does is the profile's call, tested apart)."""
    config = tmp_path / "unfloored.yaml"
    config.write_text("version: 1\nverify: {max_latency_ratio: null}\n")
    return config


@pytest.fixture
def residual_data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):
        write_npz(folder / f"{i:03d}.npz", x=rng.standard_normal((4, 8, 8)).astype(np.float32))
    return folder


def tensor_text(name: str, array: np.ndarray) -> str:
    """An initializer in ONNX text: `float[2, 3] w = {...}` (`float w = {...}` for a scalar)."""
    dims = ", ".join(str(d) for d in array.shape)
    values = ", ".join(f"{v:.6g}" for v in array.reshape(-1))
    return f"float{f'[{dims}]' if dims else ''} {name} = {{{values}}}"


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got).astype(np.float64) ** 2)))


def quantize_with(cli: Cli, tmp_path: Path, model: Path, data: Path, name: str, config: str) -> tuple[Path, dict]:
    """`qcli quantize MODEL --data DATA --no-verify --config <config text> --json` -> (model, document)."""
    (tmp_path / f"{name}.yaml").write_text(config or "version: 1\n")
    out = tmp_path / f"{name}.onnx"
    return out, cli.json("quantize", model, "-o", out, "--data", data, "--no-verify", "--config", tmp_path / f"{name}.yaml")
