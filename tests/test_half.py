"""float16 / bfloat16 (qcli/half.py): the conversion, the nodes kept float32 and why, the Casts,
the float32 twin CPU measures, and the presets and per-node overrides end to end (config
errors: test_config.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import SAMPLE_MODELS, normal_folder, parse_model, save
from qcli.half import to_half
from qcli.twin import emulated

CHAIN = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 3] y, float[2, 3] z)
    <float[4, 3] w = {0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1},
     float[3] eps = {1e-12, 1e-12, 1e-12}> {
    m = MatMul (x, w)
    r = Relu (m)
    e = Exp (r)
    s = Softmax (r)
    a = Add (s, e)
    y = Mul (a, r)
    t = Tanh (r)
    u = Sigmoid (r)
    v = Add (t, u)
    z = Add (v, eps)
}
"""


def _run(model: onnx.ModelProto, **feeds: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _chain() -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(parse_model(CHAIN))


def test_every_node_asked_for_converts_but_those_float16_breaks() -> None:
    model = _chain()
    result = to_half(model, {n.output[0] for n in model.graph.node}, "float16")
    assert result.converted == ["MatMul_0", "Relu_1", "Softmax_3", "Add_4", "Mul_5", "Tanh_6", "Sigmoid_7", "Add_8"]
    assert result.kept == {
        "Exp_2": "Exp overflows float16 above 11 and loses its small values",
        "Add_9": "constant 'eps' holds 1e-12, which float16 rounds to 0",
    }
    graph = result.model.graph
    types = {t.name: t.data_type for t in graph.initializer}
    assert types == {"w": onnx.TensorProto.FLOAT16, "eps": onnx.TensorProto.FLOAT}
    assert [v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)] == [onnx.TensorProto.FLOAT] * 3
    # one Cast per tensor and direction: x in; r out to Exp (and nothing else: Add_9 reads v, a
    # float16 tensor, through the one Cast of v); e back in; y out; v out
    casts = [(n.input[0], n.attribute[0].i) for n in graph.node if n.op_type == "Cast"]
    assert sorted(casts) == [("e", 10), ("r", 1), ("v", 1), ("x", 10), ("y/float16", 1)]
    assert result.casts == 5
    onnx.checker.check_model(result.model, full_check=True)


def test_the_twin_rounds_each_value_as_float16_stores_it() -> None:
    """The twin's outputs equal numpy's float16 arithmetic step by step (each op in float32,
    each written value rounded), where onnxruntime's own run of the float16 model does not
    round at all (its CPU optimizer drops the Casts it puts around float16 nodes)."""
    model = _chain()
    half = to_half(model, {n.output[0] for n in model.graph.node if n.op_type != "Softmax"}, "float16").model
    x = np.random.default_rng(0).normal(0, 1, (2, 4)).astype(np.float32)
    w = np.array([0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1], np.float32).reshape(4, 3)

    def r16(a):
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

    r = r16(np.maximum(r16(r16(x) @ w), 0))
    v = r16(r16(np.tanh(r)) + r16(1 / (1 + np.exp(-r))))
    twin = emulated(half)
    assert twin is not None and emulated(model) is None
    z = _run(twin, x=x)[1]
    np.testing.assert_allclose(z, v + np.float32(1e-12), rtol=0, atol=1e-6)
    plain = _run(half, x=x)[1]
    assert np.abs(plain - z).max() > 1e-4  # the float16 model itself runs as float32 on CPU


def test_a_value_beyond_float16_keeps_its_nodes_float32_and_says_so(cli, tmp_path: Path) -> None:
    """Activations of 1e5 (float16 holds 65504): the nodes that read or write them stay float32,
    the summary says so, and the written model gives no inf on the data."""
    model = save(parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) <float[8, 8] w = {W}, float scale = {1e5}, float back = {1e-5}> {
    h = MatMul (x, w)
    big = Mul (h, scale)
    r = Relu (big)
    small = Mul (r, back)
    y = Tanh (small)
}""".replace("{W}", "{" + ", ".join(f"{v:.4f}" for v in np.random.default_rng(1).normal(0, 0.5, 64)) + "}")),
                 tmp_path / "big.onnx")
    data = normal_folder(tmp_path / "data", 64, x=(8,))
    out = tmp_path / "big16.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", data, "--config", "float16")
    kept = doc["half"]["kept_float32"]
    assert set(kept) == {"Mul_1", "Relu_2", "Mul_3"}
    assert kept["Relu_2"].startswith("'r' reaches ") and kept["Relu_2"].endswith(
        " in calibration (float16 keeps float32 above 16376)")
    assert doc["half"]["converted"] == 2 and doc["verification"]["passed"]
    x = np.random.default_rng(7).normal(0, 1, (16, 8)).astype(np.float32)
    got = _run(emulated(onnx.load(str(out))), x=x)[0]
    want = _run(onnx.load(str(model)), x=x)[0]
    assert np.isfinite(got).all() and np.abs(got - want).max() < 0.01


def test_float16_preset_without_data_skips_the_range_rule(cli, tmp_path: Path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    doc = cli.json("quantize", cnn / "model.onnx", "-o", tmp_path / "c.onnx", "--config", "float16")
    assert doc["half"]["ranges_checked"] is False
    assert "float16: 24 nodes, 2 Casts; 0 kept float32 (ranges not checked: no calibration data)" in doc["notes"]


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
def test_presets_on_the_sample_transformer(cli, tmp_path: Path, kind: str) -> None:
    """The whole model in the type: verified, about half the file, onnx's full type check
    passes; bfloat16 runs at opset 22 (Gemm, Relu... take it there), which onnxruntime's CPU
    provider cannot load but its twin can."""
    t = SAMPLE_MODELS / "transformer"
    out = tmp_path / f"{kind}.onnx"
    doc = cli.json("quantize", t / "model.onnx", "-o", out, "--data", t / "calib", "--config", kind)
    assert doc["verification"]["passed"]
    assert doc["bytes_before"] / doc["bytes_after"] > 1.85
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    code = onnx.TensorProto.FLOAT16 if kind == "float16" else onnx.TensorProto.BFLOAT16
    weights = Counter(t.data_type for t in written.graph.initializer if len(t.dims) == 2)
    assert set(weights) == {code}
    # the attention mask's fill (-3.4e38) exists in neither type: its Where and the Softmax
    # reading it stay float32
    reasons = " ".join(doc["half"]["kept_float32"].values())
    assert "holds 3.403e+38, beyond" in reasons
    casts = sum(1 for n in written.graph.node if n.op_type == "Cast")
    assert casts == doc["half"]["casts"] + sum(1 for n in onnx.load(str(t / "model.onnx")).graph.node
                                               if n.op_type == "Cast")


def test_the_classifier_head_in_float16_while_the_body_is_int8(cli, tmp_path: Path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    (tmp_path / "mixed.yaml").write_text(
        "version: 1\noverrides:\n  - match: {op_types: [Gemm]}\n    precision: float16\n")
    out = tmp_path / "mixed.onnx"
    doc = cli.json("quantize", cnn / "model.onnx", "-o", out, "--data", cnn / "calib", "--config", tmp_path / "mixed.yaml")
    assert doc["verification"]["passed"] and doc["half"]["nodes"] == {"Gemm": 1} and doc["quantized"]["Conv"] == 9
    written = onnx.load(str(out))
    assert {t.name for t in written.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16} == {"fc.weight", "fc.bias"}
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    fused = Counter(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
    assert fused["QLinearConv"] == 9  # the body still runs int8 kernels


def test_the_rescue_keeps_float32_the_nodes_float16_breaks(cli, tmp_path: Path) -> None:
    """(x + 2048) - 2048 in float16 keeps x to a step of 2 (cosine ~0.6): verification misses
    its floor, and the rescue promotes the half nodes to float32 one unit at a time until it
    holds; the Mul after them stays float16."""
    model = save(parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) <float big = {2048}, float half = {0.5}> {
    up = Add (x, big)
    down = Sub (up, big)
    y = Mul (down, half)
}"""), tmp_path / "cancel.onnx")
    data = normal_folder(tmp_path / "data", 64, x=(8,))
    out = tmp_path / "cancel16.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", data, "--config", "float16")
    assert doc["verification"]["passed"], doc["notes"]
    promoted = {n: p["precision"] for n, p in doc["precision"]["promoted"].items()}
    assert promoted == {"Add_0": "float", "Sub_1": "float"}
    actions = [step["action"] for step in doc["precision"]["steps"]]
    assert actions[0] == "as configured (16-bit float)"
    assert "back to 16-bit float" in actions and "back to int8" not in actions  # the prune
    assert doc["half"]["nodes"] == {"Mul": 1}
    assert {r["op_type"]: r["reason"] for r in doc["float"]} == {
        "Add": "promoted (precision search)", "Sub": "promoted (precision search)"}
    x = np.random.default_rng(7).normal(0, 1, (16, 8)).astype(np.float32)
    got = _run(emulated(onnx.load(str(out))), x=x)[0]
    assert np.abs(got - 0.5 * x).max() < 1e-3


def test_auto_precision_tries_float16_before_float(cli, tmp_path: Path) -> None:
    """The sample CNN with int8 symmetric KL activations misses a 0.5-point budget all-int8;
    with float16 among the candidates the units the search promotes run in float16, not float32
    (half the bytes: the file is smaller than with float alone), and the goal is met."""
    cnn = SAMPLE_MODELS / "cnn"
    sizes = {}
    for name, candidates in (("half", "[int8, float16, float]"), ("float", "[int8, float]")):
        (tmp_path / f"{name}.yaml").write_text(
            "version: 1\ncalibration: {method: kl}\nactivations: {dtype: int8, symmetric: true}\n"
            f"verify: {{max_latency_ratio: null}}\nauto_precision: {{enabled: true, candidates: {candidates}, "
            "max_accuracy_drop: 0.005}\n")
        out = tmp_path / f"{name}.onnx"
        doc = cli.json("quantize", cnn / "model.onnx", "-o", out, "--data", cnn / "calib", "--eval-data", cnn / "eval",
                       "--config", tmp_path / f"{name}.yaml")
        assert doc["precision"]["goal_met"] and doc["verification"]["passed"]
        precisions = {p["precision"] for p in doc["precision"]["promoted"].values()}
        assert precisions == ({"float16"} if name == "half" else {"float"})
        sizes[name] = doc["bytes_after"]
    assert sizes["float"] / sizes["half"] > 1.3


def test_a_graph_output_a_float32_node_reads_too_is_read_through_its_own_cast() -> None:
    """`y` is a graph output written by a float16 node and read by a node kept float32 (LayerNorm's
    statistics): that reader reads the output itself, float32 again, not a second Cast's output
    that was never written (the fuzz: the model failed the checker, exit 3)."""
    model = onnx.shape_inference.infer_shapes(parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 3] y, float[2, 3] z)
    <float[4, 3] w = {0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1}, float[3] g = {1, 1, 1},
     float[3] b = {0, 0, 0}> {
    y = MatMul (x, w)
    z = LayerNormalization <axis: int = 1> (y, g, b)
}"""))
    result = to_half(model, {n.output[0] for n in model.graph.node}, "float16")
    assert result.converted == ["MatMul_0"]
    graph = result.model.graph
    assert [(n.op_type, list(n.input), list(n.output)) for n in graph.node] == [
        ("Cast", ["x"], ["x/float16"]), ("MatMul", ["x/float16", "w"], ["y/float16"]), ("Cast", ["y/float16"], ["y"]),
        ("LayerNormalization", ["y", "g", "b"], ["z"])]
    onnx.checker.check_model(result.model, full_check=True)
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    for want, got in zip(_run(model, x=x), _run(result.model, x=x), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3)


def test_data_movement_between_float32_nodes_stays_float32() -> None:
    """A Transpose reading only what a float32 node writes would compute nothing in float16,
    only round its input at a Cast: it stays float32; the MatMul after it converts."""
    model = onnx.shape_inference.infer_shapes(parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[4, 3] y) <float[2, 3] w = {0.5, -1, 2, 0.25, 1.5, -0.75}> {
    e = Exp (x)
    t = Transpose (e)
    y = MatMul (t, w)
}"""))
    result = to_half(model, {n.output[0] for n in model.graph.node}, "float16")
    assert result.converted == ["MatMul_2"]
    assert result.kept == {
        "Exp_0": "Exp overflows float16 above 11 and loses its small values",
        "Transpose_1": "moves float32 values (no input written in the half type): converting would only round them",
    }


def test_a_stale_output_shape_does_not_fail_the_bfloat16_check(cli, tmp_path: Path) -> None:
    """The model declares y as [1, 4] where it is [4, N] (an exporter's stale annotation, which
    onnxruntime merges leniently): the bfloat16 model's type check re-infers the shapes instead
    of failing on it (ddddocr: exit 3 before)."""
    model = save(parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[1, 4] y) <float[4, 4] w = {0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1, 1, 1, 1, 1}> {
    m = MatMul (x, w)
    e = Exp (m)
    y = Transpose (e)
}"""), tmp_path / "stale.onnx")
    data = normal_folder(tmp_path / "data", 16, x=(4,))
    config = tmp_path / "bf16.yaml"  # the preset; y is [4, N], not class scores: judged by cosine
    config.write_text("version: 1\ndefault_precision: bfloat16\nverify: {max_latency_ratio: null, outputs: {y: cosine}}\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "bf.onnx", "--data", data, "--config", config)
    assert doc["half"]["converted"] == 1 and doc["verification"]["passed"]


def test_analyze_runs_a_bfloat16_model_onnxruntime_has_no_kernels_for(cli, tmp_path: Path) -> None:
    """onnxruntime's CPU provider has no bfloat16 Resize: `analyze` (and `qcli run` after
    `quantize`) opened the written file as it is and stopped with exit 2 (found by the fuzzer);
    it runs the float32 twin, as verification does."""
    model = save(parse_model("""
<ir_version: 8, opset_import: ["" : 14]>
g (float[N, 3, 2] x) => (float[N, 3, 8] y) <float[3] s = {1, 1, 2}> {
    r = Resize <mode = "nearest"> (x, "", s)
    y = Concat <axis = 2> (r, r)
}"""), tmp_path / "resize.onnx")
    data = normal_folder(tmp_path / "data", 6, x=(3, 2))
    out = tmp_path / "bf.onnx"
    assert cli.json("quantize", model, "-o", out, "--data", data, "--config", "bfloat16")["half"]["converted"] == 2
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    doc = cli.json("analyze", model, out, "--data", data, "--runs", "2")
    assert doc["fidelity"][0]["cosine"] > 0.999


LOOP = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y, float[4, 4] v)
    <float[4, 4] w = {0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1, 1, 0.3, 0.1, 0.7},
     float[4, 4] k = {0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, 0.8, -0.9, 1, 0.1, -0.2, 0.3, 0.4, 0.5, 0.6},
     int64 n = {3}, bool c = {1}> {
    m = MatMul (x, w)
    y, v = Loop (n, c, m, k) <body = step (int64 i, bool cond, float[2, 4] h, float[4, 4] kk)
                                  => (bool more, float[2, 4] hn, float[4, 4] kn) {
        more = Identity (cond)
        p = MatMul (h, w)
        q = MatMul (p, kk)
        hn = Tanh (q)
        kn = Identity (kk)
    }>
}
"""


def test_the_weights_a_loop_reads_are_stored_in_float16() -> None:
    """The Loop computes in float32, but the constants only it and converted nodes read are
    stored in float16 (nakdimon's LSTM weights, 1.02x smaller before): `w`, read in the body from
    the outer scope and by the MatMul before it, and `k`, a loop-carried input; each reaches the
    Loop through one Cast to float32 in the main graph. A Loop not asked for keeps them float32."""
    model = onnx.shape_inference.infer_shapes(parse_model(LOOP))
    x = np.random.default_rng(0).normal(0, 1, (2, 4)).astype(np.float32)
    result = to_half(model, {n.output[0] for n in model.graph.node}, "float16")
    assert result.converted == ["MatMul_0"]
    assert result.kept == {"Loop_1": "control flow: its subgraphs compute in float32 (constants only they read: "
                                     "stored in float16)"}
    graph = result.model.graph
    assert {t.name: t.data_type for t in graph.initializer if t.name in "wk"} == {
        "w": onnx.TensorProto.FLOAT16, "k": onnx.TensorProto.FLOAT16}
    casts = sorted((n.input[0], n.output[0]) for n in graph.node if n.op_type == "Cast")
    assert casts == [("k", "k/float32"), ("m", "m/float32"), ("w", "w/float32"), ("x", "x/float16")]
    loop = next(n for n in graph.node if n.op_type == "Loop")
    assert loop.input[3] == "k/float32"
    assert [n.input[1] for n in loop.attribute[0].g.node if n.op_type == "MatMul"] == ["w/float32", "kk"]
    onnx.checker.check_model(result.model, full_check=True)
    got, want = _run(result.model, x=x), _run(model, x=x)
    np.testing.assert_allclose(got[0], want[0], atol=5e-3)
    assert not np.array_equal(got[1], want[1])  # k rounded to float16 and widened
    np.testing.assert_array_equal(got[1], want[1].astype(np.float16).astype(np.float32))
    alone = to_half(model, {"m"}, "float16")  # the Loop stays as it is: w and k stay float32
    assert {t.name: t.data_type for t in alone.model.graph.initializer if t.name in "wk"} == {
        "w": onnx.TensorProto.FLOAT, "k": onnx.TensorProto.FLOAT}
    onnx.checker.check_model(alone.model, full_check=True)
    np.testing.assert_allclose(_run(alone.model, x=x)[0], want[0], atol=5e-3)


def test_the_rescue_takes_a_loop_whose_weights_float16_breaks_to_float32(cli, tmp_path: Path) -> None:
    """The body subtracts h from h @ w, w ~ identity + 1e-3: w rounded to float16 loses most of
    the difference, so the Loop (which stores w in float16) is a unit the rescue promotes."""
    model = save(parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y)
    <float[4, 4] w = {1.0004, 0, 0, 0, 0, 1.0008, 0, 0, 0, 0, 1.0012, 0, 0, 0, 0, 1.0016},
     int64 n = {1}, bool c = {1}, float s = {0.5}> {
    m = Mul (x, s)
    y = Loop (n, c, m) <body = step (int64 i, bool cond, float[N, 4] h) => (bool more, float[N, 4] hn) {
        more = Identity (cond)
        p = MatMul (h, w)
        hn = Sub (p, h)
    }>
}"""), tmp_path / "loop.onnx")
    data = normal_folder(tmp_path / "data", 64, x=(4,))
    doc = cli.json("quantize", model, "-o", tmp_path / "loop16.onnx", "--data", data, "--config", "float16")
    assert doc["verification"]["passed"], doc["notes"]
    assert {n: p["precision"] for n, p in doc["precision"]["promoted"].items()} == {"Loop_1": "float"}
    assert doc["half"]["nodes"] == {"Mul": 1}
    types = {t.name: t.data_type for t in onnx.load(str(tmp_path / "loop16.onnx")).graph.initializer}
    assert types["w"] == onnx.TensorProto.FLOAT


def test_an_output_shape_inference_cannot_tell_keeps_the_declared_one_in_the_check(cli, tmp_path: Path) -> None:
    """y comes from an If whose then-branch squeezes axes computed at run time (no shape to
    infer): the bfloat16 model's type check keeps y's declared shape instead of failing without
    one (Silero VAD: exit 3 before)."""
    model = parse_model("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) <float[4, 4] w = {0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1, 1, 1, 1, 1},
                                       float low = {-1000}, int64[1] one = {1}> {
    m = MatMul (x, w)
    top = ReduceMax (x)
    c = Greater (top, low)
    y = If (c) <then_branch = yes () => (float a) { u = Unsqueeze (m, one) ax = Identity (one) a = Squeeze (u, ax) },
                else_branch = no () => (float b) { b = Neg (m) }>
}""")
    for branch in model.graph.node[-1].attribute:
        branch.g.output[0].type.tensor_type.ClearField("shape")  # the text format writes rank 0
    path = save(model, tmp_path / "if.onnx")
    data = normal_folder(tmp_path / "data", 16, x=(4,))
    doc = cli.json("quantize", path, "-o", tmp_path / "bf.onnx", "--data", data, "--config", "bfloat16")
    assert doc["half"]["nodes"] == {"ReduceMax": 1, "Greater": 1} and doc["verification"]["passed"]
