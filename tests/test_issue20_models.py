"""Valid models and configs that ended in an internal error or an untrue message (issue 20):
each through the CLI, with the exit code and a model that runs or a true message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import SAMPLE_MODELS, parse_model, save, write_npz
from qcli.prepare import BLOCK_OPSET, prepare


def values(array: np.ndarray) -> str:
    return ", ".join(f"{v:.3g}" for v in array.ravel())


# Weights a multiple of 0.1 in -0.7..0.7, every column and every block of 32 holding both extremes:
# int4 (symmetric, scale max/7) stores them exactly, so the checks pass as in float.
EXACT = (np.arange(64 * 8) % 15 - 7).reshape(64, 8) / 10
NOISY = np.random.default_rng(0).normal(0, 0.3, (64, 8))

MATMUL_REDUCEMEAN = f"""
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 64] x) => (float[N, 1] y) <float[64, 8] w = {{{values(EXACT)}}}> {{
    [fc] h = MatMul (x, w)
    [mean] y = ReduceMean <axes = [1]> (h)
}}
"""

# int4 weights add noise to both MatMuls: the default floors are missed, the search promotes.
NOISY_TWO_MATMULS = f"""
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 64] x) => (float[N, 1] y) <float[64, 8] w1 = {{{values(NOISY)}}}, float[8, 8] w2 = {{{values(NOISY[:8])}}}> {{
    [fc1] h = MatMul (x, w1)
    [relu] r = Relu (h)
    [fc2] m = MatMul (r, w2)
    [mean] y = ReduceMean <axes = [1]> (m)
}}
"""

# Input channel 0 is ~300 and w ignores it; the channels that matter are ~0.02: one 8-bit scale
# for x rounds them to zero, so int8 misses any floor and only promoting `fc` helps.
OUTLIERS = f"""
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 64] x) => (float[N, 8] y) <float[64, 8] w = {{{values(np.vstack([np.zeros((1, 8)), EXACT[1:]]))}}}> {{
    [fc] y = MatMul (x, w)
}}
"""


def data(folder: Path, n: int = 40, outliers: bool = False, width: int = 64) -> Path:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, width)).astype(np.float32)
    if outliers:
        x *= 0.02
        x[:, 0] = rng.uniform(250, 350, n)
    folder.mkdir()
    write_npz(folder / "x.npz", x=x)
    return folder


def runs(path: Path, **feeds: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def quantize_doc(cli, *args: object) -> tuple[int, dict, str]:
    """Exit code, the JSON summary (printed before a gate's error) and stderr of `qcli quantize`."""
    result = cli("quantize", *args, "--json")
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


# --------------------------------------------------------------------------- 4: per-block weights


def test_per_block_weights_below_opset_21_on_a_graph_with_reducemean(cli, tmp_path: Path) -> None:
    """The converter to opset 21 turns ReduceMean's `axes` into a Constant input: upgraded after
    preparation, the plan indexed a graph with one node more than the one verification read
    (IndexError in find_units). The upgrade is a preparation step now: one graph throughout."""
    model = save(parse_model(MATMUL_REDUCEMEAN), tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    code, doc, err = quantize_doc(cli, model, "-o", out, "--data", data(tmp_path / "d"), "--config", "weights-int4")
    assert code == 0, err
    assert doc["notes"][0] == "upgraded opset 17 -> 21 for per-block weights"
    assert doc["quantized"] == {"MatMul": 1} and doc["verification"]["passed"]
    q = onnx.load(str(out))
    assert [o.version for o in q.opset_import if o.domain == ""] == [BLOCK_OPSET]
    assert not any(n.op_type == "Constant" for n in q.graph.node)  # the converter's axes: folded
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(runs(out, x=x)[0], runs(model, x=x)[0], rtol=1e-5)


def test_per_block_weights_prepare_the_graph_once_for_the_search(cli, tmp_path: Path) -> None:
    """Rescue on the same graph: the units, every trial (on two workers, which prepare the model
    again) and the precision config written read the opset-21 graph; the config reproduces it."""
    model = save(parse_model(NOISY_TWO_MATMULS), tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    folder = data(tmp_path / "d", 160)
    code, doc, err = quantize_doc(cli, model, "-o", out, "--data", folder, "--config", "weights-int4",
                                  "--workers", "2")
    assert code == 0, err
    assert list(doc["precision"]["promoted"]) == ["fc1"]  # the floors needed a promotion: trials ran
    again = tmp_path / "again.onnx"
    code, _, err = quantize_doc(cli, model, "-o", again, "--data", folder, "--config", out.with_suffix(".precision.yaml"))
    assert code == 0, err
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize(("opset", "target"), [(11, None), (17, BLOCK_OPSET)])
def test_the_opset_upgrade_keeps_the_initializers_in_order(opset: int, target: int | None) -> None:
    """The upgrade hands the converter a copy without the big weights and puts them back: in the
    model's order (they went after the small ones), so a per-block model written is the same
    whether the upgrade runs first in prepare or, as before, last."""
    ones, twos, halves = (", ".join([v] * n) for v, n in (("1", 128), ("2", 128), ("0.5", 128 * 128)))
    model = parse_model(f"""
    <ir_version: 6, opset_import: ["" : {opset}]>
    net (float[N, 128] x) => (float[N, 128] y)
        <float[128] a = {{{ones}}}, float[128, 128] w = {{{halves}}}, float[128] b = {{{twos}}}> {{
        s = Add (x, a)
        m = MatMul (s, w)
        y = Add (m, b)
    }}
    """)
    prepared = (prepare(model, opset=target) if target else prepare(model)).model
    assert [o.version for o in prepared.opset_import if o.domain == ""] == [target or 13]
    assert [t.name for t in prepared.graph.initializer] == ["a", "w", "b"]


# --------------------------------------------------------------------------- 5: auto-precision candidates


@pytest.mark.parametrize("candidates", ["[]", "[int8]"])
def test_candidates_without_a_promotion_miss_the_goal_and_say_why(cli, tmp_path: Path, candidates: str) -> None:
    """No promotion among the candidates: the search has nothing to try. It stops at the int8
    model (no ranking of zero units: a zero step once) and says why the goal stays missed."""
    model = save(parse_model(OUTLIERS), tmp_path / "m.onnx")
    config = tmp_path / "c.yaml"
    config.write_text(f"auto_precision: {{enabled: true, candidates: {candidates}, max_trials: 1}}\n")
    code, doc, err = quantize_doc(cli, model, "-o", tmp_path / "q.onnx", "--data",
                                  data(tmp_path / "d", 160, outliers=True), "--config", config)
    assert code == 1
    assert err.startswith("error: verification failed: ")
    assert (f"no unit can be promoted with auto_precision.candidates {candidates}: they hold neither dynamic, int16 "
            "nor float") in " ".join(doc["notes"])
    assert [s["action"] for s in doc["precision"]["steps"]] == ["all int8"]
    assert doc["precision"]["stopped"] is None  # not the budget: "raise --max-trials" would not help


def test_uint16_among_the_candidates_is_the_16_bit_promotion(cli, tmp_path: Path) -> None:
    """The schema takes `uint16` (and `uint8`) as candidates; the search knew only `int16`, so
    `[uint16]` promoted nothing. A 16-bit promotion takes the activations' signedness anyway."""
    model = save(parse_model(OUTLIERS), tmp_path / "m.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("auto_precision: {enabled: true, candidates: [uint8, uint16]}\n")
    code, doc, err = quantize_doc(cli, model, "-o", tmp_path / "q.onnx", "--data",
                                  data(tmp_path / "d", 160, outliers=True), "--config", config)
    assert code == 1, err  # 16 bits are not enough here: the floors stay missed
    assert {n: p["precision"] for n, p in doc["precision"]["promoted"].items()} == {"fc": "int16"}
    q = onnx.load(str(tmp_path / "q.onnx"))
    zero_points = {t.name: t.data_type for t in q.graph.initializer if t.name.endswith("_zero_point")}
    assert zero_points["x_zero_point"] == onnx.TensorProto.UINT16


def test_weight_only_config_searches_with_16_bit_weights_not_activations(cli, tmp_path: Path) -> None:
    """With activations float (weights-int4), int16 cannot widen activations the calibration
    never measured (it failed with "the calibration has no statistics", exit 2, though --data
    was given): it means 16-bit weights there, which hold the goal."""
    model = save(parse_model(NOISY_TWO_MATMULS), tmp_path / "m.onnx")
    folder = data(tmp_path / "d", 160)
    code, doc, err = quantize_doc(cli, model, "-o", tmp_path / "q.onnx", "--data", folder, "--config", "weights-int4",
                                  "--auto-precision")
    assert code == 0, err
    # dynamic int8 is tried before float (it needs no calibration either) and meets the goal
    assert {n: p["precision"] for n, p in doc["precision"]["promoted"].items()} == {"fc1": "dynamic"}
    config = tmp_path / "c.yaml"
    config.write_text("activations: {dtype: float}\nweights: {dtype: int4, granularity: per_block}\n"
                      "auto_precision: {enabled: true, candidates: [int8, int16]}\n")
    code, doc, err = quantize_doc(cli, model, "-o", tmp_path / "q2.onnx", "--data", folder, "--config", config)
    assert code == 0, err
    assert {n: p["precision"] for n, p in doc["precision"]["promoted"].items()} == {"fc1": "int16"}
    assert doc["precisions"]["MatMul"] == {"float act, int16 weights": 1, "float act, int4 weights": 1}


def test_int4_alone_among_the_candidates_shrinks_the_weights(cli, tmp_path: Path) -> None:
    """`candidates: [int4]`: no promotion, but int4 weights where they keep the goal. The int4
    step drew its nodes from the promotable ones only, so it never ran without int16/float."""
    model = save(parse_model(MATMUL_REDUCEMEAN), tmp_path / "m.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("auto_precision: {enabled: true, candidates: [int4]}\n")
    code, doc, err = quantize_doc(cli, model, "-o", tmp_path / "q.onnx", "--data", data(tmp_path / "d"),
                                  "--config", config)
    assert code == 0, err
    assert {n: p["precision"] for n, p in doc["precision"]["promoted"].items()} == {"fc": "int4"}


# --------------------------------------------------------------------------- 8: no inputs


NO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
net () => (float[2, 2] y) {
    y = Constant <value = float[2, 2] {1, 2, 3, 4}> ()
}
"""


@pytest.mark.parametrize("command", ["quantize", "calibrate"])
def test_a_model_with_no_inputs_is_refused_with_the_reason(cli, tmp_path: Path, command: str) -> None:
    """A model with no inputs computes the same outputs on every run: there is nothing to feed,
    calibrate or compare. It was read as samples without a batch ("generator raised
    StopIteration", exit 3)."""
    model = save(parse_model(NO_INPUTS), tmp_path / "m.onnx")
    folder = tmp_path / "d"
    folder.mkdir()
    np.savez(folder / "0.npz")
    result = cli(command, model, "-o", tmp_path / "out", "--data", folder)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: the model has no inputs: every run computes the same outputs")
    assert "hint: qcli quantizes models that take inputs" in result.stderr


# --------------------------------------------------------------------------- 9: graph outputs


CONSTANT_OUTPUTS = {
    "a Constant node": """
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x) => (float[N, 4] y, float[2] c) {
            y = Relu (x)
            c = Constant <value = float[2] {1, 2}> ()
        }
    """,
    "an initializer": """
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x) => (float[N, 4] y, float[2] c) <float[2] c = {1, 2}> {
            y = Relu (x)
        }
    """,
    "an If with a constant condition": """
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x) => (float[N, 4] y, float[2] c) {
            y = Relu (x)
            k = Constant <value = bool {1}> ()
            c = If (k) <then_branch = g1 () => (float[2] a) { a = Constant <value = float[2] {1, 2}> () },
                        else_branch = g2 () => (float[2] b) { b = Constant <value = float[2] {3, 4}> () }>
        }
    """,
}


@pytest.mark.parametrize("case", CONSTANT_OUTPUTS)
def test_a_constant_graph_output_beside_an_activation(cli, tmp_path: Path, case: str) -> None:
    """A graph output holding a constant (prepare makes it an initializer, as the model may have
    it already): materialize dropped it as read by no node, and onnxruntime refused the model
    ("Graph output (c) does not exist"), blamed on the user's model (exit 2)."""
    model = save(parse_model(CONSTANT_OUTPUTS[case]), tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    code, _, err = quantize_doc(cli, model, "-o", out, "--data", data(tmp_path / "d", width=4))
    assert code == 0, err
    x = np.ones((2, 4), np.float32)
    assert [a.tolist() for a in runs(out, x=x)] == [a.tolist() for a in runs(model, x=x)]


def test_a_model_without_nodes_is_analyzed(cli, tmp_path: Path) -> None:
    """Inputs passed through and a Constant output: quantize folds the Constant, writing a graph
    with no node, which analyze (and `run`) refused as "not a valid ONNX model" (the fuzzer)."""
    model = save(parse_model("""
        <ir_version: 8, opset_import: ["" : 19]>
        net (float[N, 4] x) => (float[N, 4] x, float[2] c) {
            c = Constant <value = float[2] {1, 2}> ()
        }
    """), tmp_path / "m.onnx")
    out, folder = tmp_path / "q.onnx", data(tmp_path / "d", n=8, width=4)
    assert cli("quantize", model, "-o", out, "--data", folder).exit_code == 0
    assert not onnx.load(str(out)).graph.node
    result = cli("analyze", model, out, "--data", folder, "--json")
    assert result.exit_code == 0, result.stderr
    assert [f["output"] for f in json.loads(result.stdout)["fidelity"]] == ["x", "c"]


def test_a_model_qcli_built_that_onnxruntime_refuses_is_a_qcli_bug(cli, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's model loaded (the probe ran it): a candidate qcli built failing to load is
    qcli's bug (exit 3), not "check that the model runs in onnxruntime on its own" (exit 2)."""
    import qcli.quantize

    real = qcli.quantize.materialize

    def broken(*args, **kwargs) -> onnx.ModelProto:
        out = real(*args, **kwargs)
        out.graph.node[0].op_type = "NoSuchOp"
        return out

    monkeypatch.setattr(qcli.quantize, "materialize", broken)
    model = save(parse_model(MATMUL_REDUCEMEAN), tmp_path / "m.onnx")
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data(tmp_path / "d"))
    assert result.exit_code == 3
    assert result.stderr.startswith("internal error: InternalError: onnxruntime refuses a model qcli built: ")


RUN_IN_CHILD = """
import sys, numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
print([o.shape for o in session.run(None, {"x": np.ones((1, 2, 4, 4), np.float32)})])
"""


def test_an_empty_weight_stays_float(cli, tmp_path: Path) -> None:
    """A Conv whose weight has zero output channels (valid: it writes an empty tensor) was
    quantized, and onnxruntime's fused int8 Conv crashed the process running it (SIGSEGV); an
    empty MatMul weight was an internal error in the qparams (min of nothing)."""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[N, 2, 4, 4] x) => (float[N, 0, 4, 4] c, float[N, 2, 4, 4] y) <float[0, 2, 1, 1] w = {}> {
        [conv] c = Conv (x, w)
        [relu] y = Relu (x)
    }
    """)
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(8):
        np.save(folder / f"{i:02d}.npy", np.random.default_rng(i).normal(size=(1, 2, 4, 4)).astype(np.float32))
    out = tmp_path / "out.onnx"
    doc = cli.json("quantize", save(model, tmp_path / "model.onnx"), "-o", out, "--data", folder, "--no-verify")
    assert {"op_type": "Conv", "reason": "its weight is empty (a zero dimension): nothing to quantize", "count": 1} in doc["float"]
    child = subprocess.run([sys.executable, "-c", RUN_IN_CHILD, str(out)], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[(1, 0, 4, 4), (1, 2, 4, 4)]"


def test_an_input_with_a_fixed_first_dimension_is_run_whole(cli, tmp_path: Path) -> None:
    """x[2, 8] has no batch axis: calibration ran its first sample in slices of one row, which
    onnxruntime refused, and the hint blamed the model ("fails on this sample as given")."""
    weights = np.random.default_rng(0).normal(size=32)
    model = parse_model(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 8] x) => (float[2, 4] y) <float[8, 4] w = {{{values(weights)}}}> {{
        [fc] y = MatMul (x, w)
    }}
    """)
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(12):
        np.save(folder / f"{i:02d}.npy", np.random.default_rng(i).normal(size=(2, 8)).astype(np.float32))
    out = tmp_path / "out.onnx"
    doc = cli.json("quantize", save(model, tmp_path / "model.onnx"), "-o", out, "--data", folder)
    assert doc["verification"]["passed"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((2, 8), np.float32)})[0].shape == (2, 4)
    report = cli.json("analyze", tmp_path / "model.onnx", out, "--data", folder, "--runs", "2", "--warmup", "0")
    assert report["speed"]["batch"] == 2


@pytest.mark.parametrize("files", [1, 3])
def test_a_file_for_an_input_with_a_fixed_first_dimension_is_one_sample(cli, tmp_path: Path, files: int) -> None:
    """x[2, 3, 8] files counted as two samples each: a holdout or `samples: 1` cut one in half,
    which onnxruntime refused, blamed on the model (the fuzzer)."""
    model = save(parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3, 8] x) => (float[2, 3, 4] y) {
        [pool] y = MaxPool <kernel_shape = [2], strides = [2]> (x)
    }
    """), tmp_path / "model.onnx")
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(files):
        np.save(folder / f"{i:02d}.npy", np.random.default_rng(i).normal(size=(2, 3, 8)).astype(np.float32))
    config = tmp_path / "c.yaml"
    config.write_text("calibration: {samples: 1}\nverify: {samples: 1}\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", folder, "--config", config)
    assert doc["verification"]["passed"]
    result = cli("analyze", model, tmp_path / "q.onnx", "--data", folder, "--samples", "1", "--runs", "0")
    assert result.exit_code == 0, result.stderr


def test_a_weight_only_config_with_an_int8_override(cli, tmp_path: Path) -> None:
    """`activations: {dtype: float}` with an override asking int8 for the Gemms: the table's
    own ranges were solved for the config's activation type, 'float' ("unknown quantized dtype
    'float'", exit 2, on a valid config)."""
    config = tmp_path / "c.yaml"
    config.write_text("activations: {dtype: float}\noverrides:\n  - match: {op_types: [Gemm]}\n    precision: int8\n")
    mlp = SAMPLE_MODELS / "mlp"
    out = tmp_path / "out.onnx"
    doc = cli.json("quantize", mlp / "model.onnx", "-o", out, "--data", mlp / "calib", "--samples", "32",
                   "--config", config, "--no-verify")
    assert doc["quantized"] == {"Gemm": 3}
    types = [n.op_type for n in onnx.load(out).graph.node]
    assert types.count("QuantizeLinear") == 3


def test_a_calibration_file_nested_too_deep_is_bad_input(cli, tmp_path: Path) -> None:
    """JSON nested past Python's recursion limit raised RecursionError from json (exit 3)."""
    calib = tmp_path / "deep.calib.json"
    calib.write_text("[" * 100_000 + "]" * 100_000)
    mlp = SAMPLE_MODELS / "mlp"
    result = cli("quantize", mlp / "model.onnx", "-o", tmp_path / "out.onnx", "--calib", calib)
    assert result.exit_code == 2
    assert f"{calib} is not a readable calibration file: maximum recursion depth exceeded" in result.stderr
