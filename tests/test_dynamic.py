"""Dynamic quantization (`activations.mode: dynamic`, `precision: dynamic`, the `dynamic`
preset): the graph onnxruntime fuses, numerics against onnxruntime's own `quantize_dynamic`,
the CLI without calibration data, mixed static and dynamic nodes, and config errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import quantize_dynamic

from conftest import fused_op_counts, normal_folder, parse_model, save, write_npz

logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's "consider pre-processing" warning


def _floats(shape: tuple[int, ...], seed: int, scale: float = 0.3) -> str:
    rng = np.random.default_rng(seed)
    return "{" + ", ".join(f"{v:.5f}" for v in rng.normal(0, scale, int(np.prod(shape)))) + "}"


MATMUL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 8] y) <float[16, 8] w = {W}> {
    y = MatMul (x, w)
}
""".replace("{W}", _floats((16, 8), 1))

SHARED_INPUT = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 8] q, float[N, 8] k) <float[16, 8] wq = {WQ}, float[16, 8] wk = {WK}> {
    q = MatMul (x, wq)
    k = MatMul (x, wk)
}
""".replace("{WQ}", _floats((16, 8), 2)).replace("{WK}", _floats((16, 8), 3))

GEMM = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 8] y) <float[8, 16] w = {W}, float[8] c = {C}> {
    y = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (x, w, c)
}
""".replace("{W}", _floats((8, 16), 4)).replace("{C}", _floats((8,), 5))

# The same function as GEMM as MatMul + Add (onnxruntime's quantize_dynamic leaves Gemm float)
GEMM_AS_MATMUL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 8] y) <float[16, 8] w = {W}, float[8] c = {C}> {
    m = MatMul (x, w)
    y = Add (m, c)
}
"""

BLOCK = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4, 16] x) => (float[N, 4, 16] y)
    <float[16, 32] w1 = {W1}, float[32] b1 = {B1}, float[32, 16] w2 = {W2}, float[1] half = {0.5},
     float[1] one = {1.0}, float[1] root2 = {1.41421356}> {
    h = MatMul (x, w1)
    hb = Add (h, b1)
    d = Div (hb, root2)
    e = Erf (d)
    e1 = Add (e, one)
    g0 = Mul (hb, e1)
    g = Mul (g0, half)
    y = MatMul (g, w2)
}
""".replace("{W1}", _floats((16, 32), 6)).replace("{B1}", _floats((32,), 7)).replace("{W2}", _floats((32, 16), 8))

LSTM = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[T, N, 8] x) => (float[T, 2, N, 6] y, float[2, N, 6] h) <float[2, 24, 8] w = {W}, float[2, 24, 6] r = {R},
     float[2, 48] b = {B}> {
    y, h = LSTM <hidden_size = 6, direction = "bidirectional"> (x, w, r, b)
}
""".replace("{W}", _floats((2, 24, 8), 9)).replace("{R}", _floats((2, 24, 6), 10)).replace("{B}", _floats((2, 48), 11))

CONV_GEMM = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4, 8, 8] x) => (float[N, 5] y) <float[8, 4, 3, 3] w1 = {W1}, float[5, 8] wf = {WF}, float[5] bf = {BF}> {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
    r1 = Relu (c1)
    p = GlobalAveragePool (r1)
    f = Flatten (p)
    y = Gemm <transB = 1> (f, wf, bf)
}
""".replace("{W1}", _floats((8, 4, 3, 3), 12)).replace("{WF}", _floats((5, 8), 13)).replace("{BF}", _floats((5,), 14))


def _model(tmp_path: Path, text: str, name: str) -> Path:
    return save(parse_model(text), tmp_path / f"{name}.onnx")


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _qcli_dynamic(cli, model: Path, out: Path, *extra: object) -> dict:
    return cli.json("quantize", model, "-o", out, "--config", "dynamic", *extra)


def _ort_dynamic(model: Path, out: Path) -> Path:
    quantize_dynamic(str(model), str(out), per_channel=True)
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(
    "text, feeds, fused",
    [
        (MATMUL, {"x": (3, 16)}, {"DynamicQuantizeMatMul": 1}),
        (SHARED_INPUT, {"x": (3, 16)}, {"DynamicQuantizeLinear": 1, "MatMulIntegerToFloat": 2}),
        (BLOCK, {"x": (2, 4, 16)}, {"DynamicQuantizeMatMul": 2}),
        (LSTM, {"x": (5, 2, 8)}, {"DynamicQuantizeLSTM": 1}),
    ],
    ids=["matmul", "shared-input", "matmul-add-gelu", "lstm"],
)
def test_same_as_onnxruntime_quantize_dynamic(cli, tmp_path: Path, text: str, feeds: dict, fused: dict) -> None:
    model = _model(tmp_path, text, "m")
    ours = tmp_path / "ours.onnx"
    doc = _qcli_dynamic(cli, model, ours)
    theirs = _ort_dynamic(model, tmp_path / "theirs.onnx")
    rng = np.random.default_rng(0)
    inputs = {k: rng.normal(0, 1, shape).astype(np.float32) for k, shape in feeds.items()}
    for a, b, f in zip(_run(ours, inputs), _run(theirs, inputs), _run(model, inputs), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)  # the same math: the same numbers
        assert _cosine(a, f) > 0.99
    counts = fused_op_counts(ours, tmp_path)
    assert {op: counts[op] for op in fused} == fused
    assert not {"MatMul", "LSTM", "MatMulInteger"} & set(counts)
    assert "verification skipped: a dynamic model needs no calibration data; give --eval-data to verify" in doc["notes"]
    assert doc["groups"] == 0 and doc["verification"] is None  # nothing static, nothing calibrated


def test_gemm_with_alpha_beta_and_transposed_weight(cli, tmp_path: Path) -> None:
    """Gemm (which quantize_dynamic leaves float) computes what the same MatMul + Add does
    under onnxruntime's quantize_dynamic, and fuses with its bias."""
    model = _model(tmp_path, GEMM, "gemm")
    g = onnx.load(str(model))
    w = onnx.numpy_helper.to_array(g.graph.initializer[0])
    c = onnx.numpy_helper.to_array(g.graph.initializer[1])
    text = GEMM_AS_MATMUL.replace("{W}", "{" + ", ".join(f"{v:.8f}" for v in (0.5 * w.T).ravel()) + "}")
    as_matmul = _model(tmp_path, text.replace("{C}", "{" + ", ".join(f"{v:.8f}" for v in 2 * c) + "}"), "mm")
    ours = tmp_path / "ours.onnx"
    doc = _qcli_dynamic(cli, model, ours)
    x = {"x": np.random.default_rng(1).normal(0, 1, (4, 16)).astype(np.float32)}
    np.testing.assert_allclose(_run(ours, x)[0], _run(_ort_dynamic(as_matmul, tmp_path / "t.onnx"), x)[0], atol=1e-5)
    assert doc["precisions"] == {"Gemm": {"dynamic uint8 act, int8 weights": 1}}
    counts = fused_op_counts(ours, tmp_path)
    assert counts["DynamicQuantizeMatMul"] == 1 and "Gemm" not in counts and "Add" not in counts


def test_eval_data_verifies(cli, tmp_path: Path) -> None:
    model = _model(tmp_path, BLOCK, "block")
    data = tmp_path / "eval"
    data.mkdir()
    rng = np.random.default_rng(2)
    for i in range(20):
        write_npz(data / f"{i:02d}.npz", x=rng.normal(0, 1, (4, 16)).astype(np.float32))
    doc = _qcli_dynamic(cli, model, tmp_path / "q.onnx", "--eval-data", data)
    v = doc["verification"]
    assert v["passed"] and v["samples"] == 20 and v["checks"][0]["name"] == "cosine"
    assert v["checks"][0]["value"] > 0.99
    floats = {(r["op_type"], r["reason"]) for r in doc["float"]}
    assert ("Erf", "no dynamic int8 kernel for this op (dynamic: MatMul, Gemm, LSTM, Gather of a table)") in floats
    assert doc["quantized"] == {"MatMul": 2} and doc["method"] == "run time (dynamic)"


def test_per_node_dynamic_in_a_static_config(cli, tmp_path: Path) -> None:
    """The Conv is static (QLinearConv, calibrated on --data), the Gemm dynamic."""
    model = _model(tmp_path, CONV_GEMM, "cg")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(3)
    for i in range(24):
        write_npz(data / f"{i:02d}.npz", x=rng.normal(0, 1, (4, 8, 8)).astype(np.float32))
    config = tmp_path / "mixed.yaml"
    config.write_text("overrides:\n  - match: {op_types: [Gemm]}\n    precision: dynamic\n")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", data, "--config", config)
    assert doc["precisions"]["Gemm"] == {"dynamic uint8 act, int8 weights": 1}
    assert doc["quantized"]["Conv"] == 1 and doc["activations"]["uint8 dynamic"] == 1
    counts = fused_op_counts(out, tmp_path)
    assert counts["QLinearConv"] == 1 and counts["DynamicQuantizeMatMul"] == 1
    # a mixed config still needs calibration data
    result = cli("quantize", model, "-o", tmp_path / "n.onnx", "--config", config)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: give exactly one of --data DIR (calibrate now) or --calib FILE")


def test_a_dynamic_node_whose_output_is_a_static_graph_output(cli, tmp_path: Path) -> None:
    """The Gemm is dynamic; its output is a graph output that the static MatMul reads, so the
    static edits give it a Q/DQ pair and rename the producer's output to `y_float`: the dynamic
    replacement writes that name (it wrote `y` twice, and onnxruntime refused the model)."""
    model = _model(tmp_path, """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y, float[N] z) <float[4, 4] w = {W}, float[4] b = {0.1, -0.2, 0.3, 0.1}> {
            y = Gemm (x, w, b)
            z = MatMul (y, b)
        }
    """.replace("{W}", _floats((4, 4), 21)), "gb")
    data = normal_folder(tmp_path / "data", 8, x=(4, 4))
    config = tmp_path / "c.yaml"
    config.write_text("overrides:\n  - match: {op_types: [Gemm]}\n    precision: dynamic\n")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", data, "--config", config, "--no-verify")
    assert doc["precisions"]["Gemm"] == {"dynamic uint8 act, int8 weights": 1}
    x = np.random.default_rng(9).normal(0, 1, (3, 4)).astype(np.float32)
    for got, want in zip(_run(out, {"x": x}), _run(model, {"x": x}), strict=True):
        assert got.shape == want.shape and _cosine(got, want) > 0.99


def test_an_embedding_table_is_stored_int8_and_only_the_rows_read_dequantized(cli, tmp_path: Path) -> None:
    """Gather of a constant table in dynamic mode: the table int8 per column (4x smaller), the
    int8 rows gathered, then DequantizeLinear; rows match float to a column's step."""
    table = np.random.default_rng(5).normal(0, 0.5, (64, 16)).astype(np.float32)
    table[:, 3] *= 20  # an outlier column: its own scale keeps the others fine
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[N, T] ids) => (float[N, T, 16] y) <float[64, 16] table = {V}> {
            y = Gather (table, ids)
        }
    """.replace("{V}", "{" + ", ".join(f"{v:.6f}" for v in table.ravel()) + "}")
    model = _model(tmp_path, text, "emb")
    out = tmp_path / "q.onnx"
    doc = _qcli_dynamic(cli, model, out, "--no-verify")
    assert doc["weights"] == {"int8 per_channel": 1}
    q = onnx.load(out)
    assert [n.op_type for n in q.graph.node] == ["Gather", "DequantizeLinear"]
    assert [t.data_type for t in q.graph.initializer if t.name.endswith("_quantized")] == [onnx.TensorProto.INT8]
    ids = np.array([[0, 5, 63], [7, 7, 1]], np.int64)
    got, want = _run(out, {"ids": ids})[0], table[ids]
    step = np.abs(table).max(axis=0) / 127
    assert np.all(np.abs(got - want) <= step / 2 + 1e-6)


def test_a_static_config_stores_a_float_embedding_table_int8(cli, tmp_path: Path) -> None:
    """The default (static) config: an embedding Gather with no int8 kernel near it stays float
    as an op, but its table goes int8 per column (the `gather` form); a table that another node
    reads too (tied to a projection) stays as it is: one copy."""
    table = np.random.default_rng(6).normal(0, 0.5, (64, 16)).astype(np.float32)
    values = "{" + ", ".join(f"{v:.6f}" for v in table.ravel()) + "}"
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[N, T] ids) => (float[N, T, 16] y{TIED_OUT}) <float[64, 16] table = {V}, float[16] b = {B}> {
            e = Gather (table, ids)
            y = Add (e, b){TIED}
        }
    """.replace("{V}", values).replace("{B}", _floats((16,), 7))
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        write_npz(data / f"{i}.npz", ids=np.random.default_rng(i).integers(0, 64, (2, 5)))
    plain = _model(tmp_path, text.replace("{TIED_OUT}", "").replace("{TIED}", ""), "emb")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", plain, "-o", out, "--data", data, "--no-verify")
    assert doc["precisions"]["Gather"] == {"int8 table": 1}
    assert [n.op_type for n in onnx.load(out).graph.node][:2] == ["Gather", "DequantizeLinear"]
    assert out.stat().st_size < plain.stat().st_size / 2
    tied = _model(tmp_path, text.replace("{TIED_OUT}", ", float[16, 64] t").replace(
        "{TIED}", "\n            t = Transpose (table)"), "tied")
    doc = cli.json("quantize", tied, "-o", tmp_path / "t.onnx", "--data", data, "--no-verify")
    assert "Gather" not in doc["precisions"]


def test_the_rescue_can_keep_an_embedding_table_float(cli, tmp_path: Path) -> None:
    """An int8 table is a unit the search can promote (to float, its only promotion): here one
    outlier row sets every column's step, the rows read round to zero, and verification keeps
    the table float rather than ship them (piper's diacritizer: a sequence changed 1 time in 16)."""
    table = np.random.default_rng(8).normal(0, 0.5, (64, 16)).astype(np.float32)
    table[0] = 300.0  # never read below, but it sets each column's scale
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[N, T] ids) => (float[N, T, 16] y) <float[64, 16] table = {V}> {
            y = Gather (table, ids)
        }
    """.replace("{V}", "{" + ", ".join(f"{v:.6f}" for v in table.ravel()) + "}")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        write_npz(data / f"{i}.npz", ids=np.random.default_rng(i).integers(1, 64, (2, 5)))
    model = _model(tmp_path, text, "emb")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", data)
    assert doc["verification"]["passed"]
    assert {n: p["precision"] for n, p in doc["precision"]["promoted"].items()} == {"Gather_0": "float"}
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Gather"]


def test_a_static_table_read_by_a_quantized_node_is_a_unit_too(cli, tmp_path: Path) -> None:
    """A Gather whose output a quantized MatMul reads shares its table's scale (a static group,
    not the gather form): the table is a unit as well, whose promotion is float. Before, the
    search promoted every other unit and still shipped the int8 table ("best reachable: all
    promoted", exit 1: piper's tashkeel)."""
    rng = np.random.default_rng(8)
    table = rng.normal(0, 0.5, (64, 16)).astype(np.float32)
    table[0] = 300.0  # never read below, but it sets the table's one scale
    w = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[N, T] ids) => (float[N, T, 8] y) <float[64, 16] table = {V}, float[16, 8] w = {W}> {
            e = Gather (table, ids)
            y = MatMul (e, w)
        }
    """.replace("{V}", "{" + ", ".join(f"{v:.6f}" for v in table.ravel()) + "}").replace(
        "{W}", "{" + ", ".join(f"{v:.6f}" for v in w.ravel()) + "}")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        write_npz(data / f"{i}.npz", ids=np.random.default_rng(i).integers(1, 64, (2, 5)))
    model = _model(tmp_path, text, "emb")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data)
    assert doc["verification"]["passed"]
    assert doc["precision"]["promoted"]["Gather_0"]["precision"] == "float"
    assert "Gather" not in doc["quantized"]


@pytest.mark.parametrize("weights", ["{symmetric: false}", "{dtype: uint8}", "{granularity: per_tensor}",
                                     "{dtype: uint8, granularity: per_tensor}"])
def test_a_dynamic_lstm_runs_whatever_the_weights_section(cli, tmp_path: Path, weights: str) -> None:
    """DynamicQuantizeLSTM takes int8 weights with zero points of 0, per direction and row or
    one per direction: an LSTM's weights are int8 symmetric whatever the section asks, and per
    tensor is written once per direction ([2] here). Found by the fuzzer: asymmetric or
    per-tensor LSTM weights wrote a model onnxruntime refused to run (its run checks them)."""
    model = _model(tmp_path, LSTM, "lstm")
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\nactivations: {{mode: dynamic}}\nweights: {weights}\n")
    out = tmp_path / "q.onnx"
    cli.json("quantize", model, "-o", out, "--config", config)
    x = {"x": np.random.default_rng(0).normal(0, 1, (5, 2, 8)).astype(np.float32)}
    for a, f in zip(_run(out, x), _run(model, x), strict=True):
        assert _cosine(a, f) > 0.99
    zeros = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer
             if t.name.endswith("_transposed_zero_point")}
    per_tensor = "per_tensor" in weights
    assert {z.shape for z in zeros.values()} == {(2,) if per_tensor else (2, 24)}
    assert all(z.dtype == np.int8 and not z.any() for z in zeros.values())


def test_conv_stays_float_in_dynamic_mode(cli, tmp_path: Path) -> None:
    model = _model(tmp_path, CONV_GEMM, "cg")
    doc = _qcli_dynamic(cli, model, tmp_path / "q.onnx")
    assert doc["quantized"] == {"Gemm": 1}
    reasons = {r["op_type"]: r["reason"] for r in doc["float"]}
    assert reasons["Conv"].startswith("dynamic Conv (ConvInteger) runs 3-4x slower than float here")


def test_deterministic(cli, tmp_path: Path) -> None:
    model = _model(tmp_path, LSTM, "lstm")
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    _qcli_dynamic(cli, model, a)
    _qcli_dynamic(cli, model, b)
    assert a.read_bytes() == b.read_bytes()
    meta = {p.key: p.value for p in onnx.load(str(a)).metadata_props}
    assert json.loads(meta["qcli.config"])["activations"]["mode"] == "dynamic"


@pytest.mark.parametrize(
    "text, message",
    [
        ("activations: {dtype: int16, mode: dynamic}\n",
         ":1: activations.mode: Value error, dynamic quantizes activations to uint8 asymmetric at run time "
         "(onnxruntime's DynamicQuantizeLinear): not with dtype int16 (got 'dynamic')"),
        ("activations: {mode: dynamc}\n", ":1: activations.mode: Input should be 'static' or 'dynamic' (got 'dynamc')"),
        ("activations: {mode: dynamic}\nweights: {dtype: int4, granularity: per_block}\n",
         ":2: weights: Value error, dynamic quantization takes 8-bit weights per channel or per tensor, not int4 "
         "per_block (activations.mode is dynamic)"),
        ("overrides:\n  - match: {tensors: [y]}\n    precision: dynamic\n",
         ":2: overrides[0]: Value error, precision dynamic applies to nodes: give match.nodes or match.op_types"),
    ],
)
def test_bad_dynamic_configs(cli, tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    result = cli("quantize", _model(tmp_path, MATMUL, "m"), "-o", tmp_path / "q.onnx", "--config", config)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {config}{message}"), result.stderr


def test_a_dynamic_lstm_is_a_unit_the_search_can_return_to_float() -> None:
    """An LSTM has no static rule, only a dynamic form: quantized dynamically (dynamic mode, or
    a static config on its own: rules.DYNAMIC_ONLY) it is still one unit with its two weights,
    so the rescue and auto-precision can promote it to float."""
    from qcli.config import Config, parse_config
    from qcli.plan import make_plan
    from qcli.precision import find_units

    model = parse_model(LSTM)
    for config in (Config(), parse_config({"activations": {"mode": "dynamic"}})):
        plan = make_plan(model, config)
        assert [d.dynamic for d in plan.nodes] == [True]
        [unit] = find_units(model, plan)
        assert (unit.op_type, unit.weighted, unit.dynamic) == ("LSTM", True, False)  # weighted; no form to go to
