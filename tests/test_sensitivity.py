"""`qcli analyze --sensitivity`: each quantized unit alone and kept float, on a chain of MatMuls
whose middle activation has a trained-like outlier channel (the unit reading it is the sensitive
one); the figures checked against onnxruntime and a hand-built fake-quantized model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from test_report_html import CHROMIUM

from conftest import Cli, parse_model, save, tensor_text, write_npz
from qcli.analyze import read_report
from qcli.config import Config
from qcli.data import DataFolder, model_inputs
from qcli.precision import find_units
from qcli.precision.units import alone
from qcli.quantize import calibrate, prepare_for, quantize

CALIBRATION = 32  # samples the config calibrates on; the next 32 are compared


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    w1, w2, w3 = (rng.normal(0, 0.3, (16, 16)).astype(np.float32) for _ in range(3))
    w2[:, 0] *= 60.0  # the outlier channel of h2 (a trained LayerNorm's scale makes such channels) ...
    w3[0, :] /= 60.0  # ... which the next layer reads with small weights: h2's int8 step crushes the rest
    return {"w1": w1, "w2": w2, "w3": w3}


def chain_text(weights: dict[str, np.ndarray]) -> str:
    inits = ", ".join(tensor_text(name, array) for name, array in weights.items())
    return f"""
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 16] y) <{inits}> {{
    [first] h1 = MatMul (x, w1)
    [relu] r1 = Relu (h1)
    [second] h2 = MatMul (r1, w2)
    [third] y = MatMul (h2, w3)
}}
"""


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The float chain, its data (32 calibration + 32 compared samples) and its all-int8 model."""
    model = save(parse_model(chain_text(_weights())), tmp_path / "chain.onnx")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2 * CALIBRATION):
        write_npz(data / f"{i:03d}.npz", x=rng.normal(0, 1, 16).astype(np.float32))
    (tmp_path / "q.yaml").write_text(f"version: 1\ncalibration: {{samples: {CALIBRATION}}}\n")
    quantized = tmp_path / "chain.int8.onnx"
    Cli()("quantize", model, "-o", quantized, "--data", data, "--no-verify", "--config", tmp_path / "q.yaml")
    return model, data, quantized


def _inputs(data: Path, first: int, count: int) -> np.ndarray:
    return np.stack([np.load(data / f"{i:03d}.npz")["x"] for i in range(first, first + count)])


def _run(model: Path | onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _noise(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.sum((got.astype(np.float64) - ref) ** 2) / np.sum(ref.astype(np.float64) ** 2))


def _loss(ref: np.ndarray, got: np.ndarray) -> float:
    """1 - mean per-sample cosine: the loss of a `cosine` output."""
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    return float(1.0 - cos.mean())


def test_the_unit_reading_the_outlier_channel_ranks_first(cli: Cli, chain) -> None:
    model, data, quantized = chain
    doc = cli.json("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0")
    sens = doc["sensitivity"]
    assert sens["rebuilt"] is True  # calibrated on the same 32 samples: QUANTIZED exactly
    assert sens["samples"] == CALIBRATION and "samples 33-64" in sens["source"]
    assert [u["node"] for u in sens["units"]][0] == "third"
    third = sens["units"][0]
    assert third["float_noise"] > 0.9  # keeping it float takes h2's Q/DQ out: most of the noise goes
    # Alone, the outlier tensor costs both its writer and its reader: "alone" counts a shared
    # tensor for each unit, which is why the ranking goes by what keeping a unit float gains.
    by_node = {u["node"]: u for u in sens["units"]}
    assert by_node["second"]["alone_noise"] > 0.5 and third["alone_noise"] > 0.5
    assert by_node["first"]["alone_noise"] < 0.1
    assert by_node["second"]["float_noise"] < 0.1  # float, its output is still quantized for "third"


def test_measures_match_onnxruntime_and_a_hand_built_model(cli: Cli, chain, tmp_path: Path) -> None:
    """The quantized model's noise, "third" kept float (qcli quantize with an override, run by
    onnxruntime) and "third" alone (fake quantization with QUANTIZED's own scales and int8 weight,
    in numpy), against the float model run by onnxruntime on the compared samples."""
    model, data, quantized = chain
    (tmp_path / "cosine.yaml").write_text("version: 1\nverify: {outputs: {y: cosine}}\n")  # continuous losses
    sens = cli.json("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0",
                    "--config", tmp_path / "cosine.yaml")["sensitivity"]
    assert sens["metric"] == "cosine (y)"
    third = next(u for u in sens["units"] if u["node"] == "third")
    x = _inputs(data, CALIBRATION, CALIBRATION)
    reference, int8 = _run(model, x), _run(quantized, x)
    base = _noise(reference, int8)
    assert sens["noise"] == pytest.approx(base, rel=1e-3)
    assert sens["loss"] == pytest.approx(_loss(reference, int8), rel=1e-3)

    (tmp_path / "third.yaml").write_text(f"version: 1\ncalibration: {{samples: {CALIBRATION}}}\n"
                                         "overrides: [{match: {nodes: [third]}, precision: float}]\n")
    kept = tmp_path / "third-float.onnx"
    cli("quantize", model, "-o", kept, "--data", data, "--no-verify", "--config", tmp_path / "third.yaml")
    kept_out = _run(kept, x)
    assert third["float_noise"] == pytest.approx((base - _noise(reference, kept_out)) / base, rel=1e-3)
    assert third["float_gain"] == pytest.approx(_loss(reference, int8) - _loss(reference, kept_out), rel=1e-3)

    q = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(quantized)).graph.initializer}
    scale, zero = q["h2_scale"].astype(np.float32), q["h2_zero_point"].astype(np.float32)
    w = _weights()
    h2 = np.maximum(x @ w["w1"], 0) @ w["w2"]
    h2q = (np.clip(np.rint(h2 / scale) + zero, 0, 255) - zero) * scale
    w3 = q["w3_quantized"].astype(np.float32) * q["w3_scale"].astype(np.float32)  # per column
    alone_out = h2q @ w3
    assert third["alone_noise"] == pytest.approx(_noise(reference, alone_out) / base, rel=1e-2)
    assert third["alone_loss"] == pytest.approx(_loss(reference, alone_out), rel=1e-2)


def test_alone_keeps_only_the_units_qdq_pairs_and_weights(chain) -> None:
    model_path, data, _ = chain
    model, config = onnx.load(str(model_path)), Config()
    prepared = prepare_for(model, config)
    table = calibrate(model, DataFolder(data, model_inputs(model), samples=CALIBRATION), config, prepared=prepared)
    whole = quantize(model, config, table, prepared=prepared)
    units = {u.node: u for u in find_units(whole.planned or prepared.model, whole.plan)}
    assert sorted(units) == ["first", "second", "third"]
    assert sorted(n.input[0] for n in whole.model.graph.node if n.op_type == "QuantizeLinear") == ["h2", "r1", "x"]
    one = quantize(model, config, table, prepared=prepared,
                   restrict=lambda plan, graph: alone(plan, graph, units["second"]))
    graph = one.model.graph
    # what "second" reads and writes, with the whole model's scales; nothing else
    assert sorted(n.input[0] for n in graph.node if n.op_type == "QuantizeLinear") == ["h2", "r1"]
    scales = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith("_scale")}
    assert scales["h2_scale"] == {t.name: numpy_helper.to_array(t) for t in whole.model.graph.initializer}["h2_scale"]
    assert [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w")] == [
        "w2_quantized"]
    assert {t.name for t in graph.initializer} >= {"w1", "w3"}  # the others' weights stay float


def test_json_shape(cli: Cli, chain) -> None:
    model, data, quantized = chain
    doc = cli.json("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0")
    sens = doc["sensitivity"]
    assert list(sens) == ["metric", "source", "samples", "loss", "noise", "rebuilt", "trials", "stopped", "units",
                          "notes"]
    # the int8 model, each unit alone, each unit float; "second" float takes "first" along (below),
    # which is "third" alone's model: measured once
    assert sens["trials"] == 1 + 2 * 3 - 1 and sens["stopped"] is None and sens["notes"] == []
    assert sens["metric"] == "top-1 agreement (y)"  # the output's kind (a [N, C] MatMul: class scores)
    assert list(sens["units"][0]) == ["node", "op_type", "nodes", "precision", "rank", "alone_loss", "alone_noise",
                                      "float_gain", "float_noise", "float_units"]
    assert [u["rank"] for u in sens["units"]] == [1, 2, 3]
    assert all(u["op_type"] == "MatMul" for u in sens["units"])
    # "second" float takes "first" along: its Relu'd output would feed only float nodes
    assert {u["node"]: u["float_units"] for u in sens["units"]} == {"first": 1, "second": 2, "third": 1}
    assert {u["node"]: u["precision"] for u in sens["units"]}["third"] == "uint8 act, int8 weights"
    # without --sensitivity the key is there, empty
    assert cli.json("analyze", model, quantized, "--data", data, "--runs", "0")["sensitivity"] is None


def test_same_ranking_with_two_workers(cli: Cli, chain) -> None:
    model, data, quantized = chain
    one = cli.json("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0")["sensitivity"]
    two = cli.json("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0",
                   "--workers", "2")["sensitivity"]
    assert one == two


def test_a_trial_budget_leaves_units_unranked_and_says_so(cli: Cli, chain) -> None:
    model, data, quantized = chain
    sens = cli.json("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0",
                    "--max-trials", "3")["sensitivity"]
    assert sens["trials"] == 3 and sens["stopped"] == "max trials (3) reached"
    assert [u["rank"] for u in sens["units"]] == [1, 2, None]  # the last unit was not measured kept float
    assert all(u["alone_loss"] is None for u in sens["units"])
    assert sens["notes"] == ["budget spent (max trials (3) reached): 2 of 3 units kept float, 0 alone; units not "
                             "measured kept float are not ranked (raise --max-trials / --time-budget)"]


def test_bad_input_is_exit_2(cli: Cli, chain, tmp_path: Path) -> None:
    model, data, quantized = chain
    missing = cli("analyze", model, quantized, "--sensitivity")
    assert missing.exit_code == 2 and "Missing option '--data'" in missing.stderr

    foreign = tmp_path / "foreign.onnx"
    stripped = onnx.load(str(quantized))
    del stripped.metadata_props[:]
    save(stripped, foreign)
    result = cli("analyze", model, foreign, "--data", data, "--sensitivity", "--runs", "0")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"error: {foreign} was not written by qcli (no qcli.config metadata): --sensitivity rebuilds the model "
        "from how qcli made it")
    assert result.stderr.splitlines()[1] == ("hint: quantize the float model with `qcli quantize` (--no-verify keeps "
                                             "every unit int8), or drop --sensitivity")

    weights = _weights()
    weights["w1"] = weights["w1"] * 2
    other = save(parse_model(chain_text(weights)), tmp_path / "other.onnx")
    result = cli("analyze", other, quantized, "--data", data, "--sensitivity", "--runs", "0")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {quantized} was not made from this float model")

    result = cli("analyze", model, quantized, "--data", data, "--max-trials", "5")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == ("error: --max-trials, --time-budget, --executor, --workers and "
                                             "--ray-address go with --sensitivity")


def test_reports_carry_the_table(cli: Cli, chain, tmp_path: Path) -> None:
    model, data, quantized = chain
    report = tmp_path / "report.json"
    result = cli("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0", "--report", report)
    assert result.exit_code == 0, result.stderr
    assert "Sensitivity per unit" in result.stdout and "third" in result.stdout
    back = read_report(report)
    assert back.sensitivity is not None and back.sensitivity.units[0].node == "third"
    assert json.loads(report.read_text())["sensitivity"]["units"][0]["rank"] == 1
    md = tmp_path / "report.md"
    cli("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0", "--report", md)
    assert "### Sensitivity (3 of 3 units, most sensitive first)" in md.read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_heat_map_renders_in_chromium(cli: Cli, chain, tmp_path: Path) -> None:
    from PIL import Image

    model, data, quantized = chain
    page = tmp_path / "report.html"
    cli("analyze", model, quantized, "--data", data, "--sensitivity", "--runs", "0", "--report", page)
    html = page.read_text()
    assert 'aria-label="per-unit sensitivity heat-map"' in html
    png = tmp_path / "report.png"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={png}", "--window-size=1200,3000",
        page.as_uri(),
    ]
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert png.is_file(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 100
    # The hottest cells (#dc2626, the column's largest: "third" in three of the four columns)
    hottest = sum(n for n, (r, g, b) in colours if (r, g, b) == (0xDC, 0x26, 0x26))
    assert hottest > 3 * 150 * 15
