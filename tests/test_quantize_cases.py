"""The hard cases of real exported models: each quantizes with the default config, loads in
onnxruntime, and stays close to the float model (cosine of the outputs on random data)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import SAMPLE_MODELS
from qcli.config import Config, parse_config
from qcli.data import DataFolder, model_inputs
from qcli.model import check_model, clamp_ir_version, load_model, save_model
from qcli.plan import make_plan
from qcli.quantize import calibrate, quantize
from qcli.runtime import make_session

RNG = np.random.default_rng(0)


def weight(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def make(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return clamp_ir_version(model)


def quantize_and_compare(model: onnx.ModelProto, tmp_path: Path, batches: list[dict], min_cosine: float = 0.99):
    """Calibrate on `batches` (written as .npz samples), quantize, check, and compare outputs."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for i, batch in enumerate(batches):
        np.savez(data / f"{i:03d}.npz", **batch)
    table = calibrate(model, DataFolder(data, model_inputs(model)), Config())
    result = quantize(model, Config(), table)
    path = save_model(result.model, tmp_path / "q.onnx")
    check_model(path)
    # compare on inputs drawn like the calibration data (the first few batches)
    float_session, quant_session = make_session(model), make_session(path)
    for test in batches[:4]:
        ref, got = float_session.run(None, test), quant_session.run(None, test)
        for r, g in zip(ref, got, strict=True):
            cosine = float((r * g).sum() / (np.linalg.norm(r) * np.linalg.norm(g) + 1e-12))
            assert cosine >= min_cosine, cosine
    return result, path


def ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_decomposed_layernorm_keeps_cosine(tmp_path: Path) -> None:
    """ReduceMean/Sub/Pow/Sqrt/Div stay float by default; the MatMuls around them are int8."""
    d = 16
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/fc1/MatMul"),
        helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1], name="/ln/ReduceMean"),
        helper.make_node("Sub", ["h", "mu"], ["c"], name="/ln/Sub"),
        helper.make_node("Pow", ["c", "two"], ["sq"], name="/ln/Pow"),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], name="/ln/ReduceMean_1"),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="/ln/Add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="/ln/Sqrt"),
        helper.make_node("Div", ["c", "sd"], ["n"], name="/ln/Div"),
        helper.make_node("Mul", ["n", "gamma"], ["g"], name="/ln/Mul"),
        helper.make_node("Add", ["g", "beta"], ["ln"], name="/ln/Add_1"),
        helper.make_node("MatMul", ["ln", "w2"], ["y"], name="/fc2/MatMul"),
    ]
    inits = {
        "w1": weight(d, d), "two": np.float32([2.0]), "eps": np.float32([1e-5]),
        "gamma": (1 + weight(d, scale=0.1)), "beta": weight(d, scale=0.1), "w2": weight(d, 4),
    }
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 4])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((1, 7, d)).astype(np.float32)} for _ in range(24)]
    result, path = quantize_and_compare(model, tmp_path, batches)
    floats = {d.name for d in result.plan.nodes if not d.quantized}
    assert {"/ln/ReduceMean", "/ln/Sub", "/ln/Pow", "/ln/Sqrt", "/ln/Div"} <= floats
    assert {d.name for d in result.plan.nodes if d.quantized} >= {"/fc1/MatMul", "/fc2/MatMul"}


def test_a_static_config_runs_an_lstm_as_dynamic_int8(tmp_path: Path) -> None:
    """onnxruntime's only int8 LSTM is DynamicQuantizeLSTM (rules.DYNAMIC_ONLY): a static
    config quantizes it so, beside the static MatMul after it, within cosine 0.99 of float;
    `precision: int8` on it (static) keeps it float."""
    hidden, d = 8, 6
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=hidden, name="/lstm/LSTM"),
        helper.make_node("Squeeze", ["Yh", "axes"], ["h"], name="/Squeeze"),
        helper.make_node("MatMul", ["h", "wo"], ["y"], name="/head/MatMul"),
    ]
    inits = {
        "W": weight(1, 4 * hidden, d), "R": weight(1, 4 * hidden, hidden), "B": weight(1, 8 * hidden, scale=0.1),
        "axes": np.int64([0]), "wo": weight(hidden, 3),
    }
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", "N", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((5, 1, d)).astype(np.float32)} for _ in range(16)]
    result, path = quantize_and_compare(model, tmp_path, batches)
    decision = {d.name: d for d in result.plan.nodes}
    assert decision["/lstm/LSTM"].dynamic
    assert decision["/head/MatMul"].quantized and not decision["/head/MatMul"].dynamic
    assert ops(path)["DynamicQuantizeLSTM"] == 1 and ops(path)["LSTM"] == 0
    static = parse_config({"overrides": [{"match": {"op_types": ["LSTM"]}, "precision": "int8"}]})
    plan = make_plan(model, static)
    assert [(d.quantized, d.reason) for d in plan.nodes if d.name == "/lstm/LSTM"] == [(False, "no int8 kernel for this op")]


def runtime_if(then_node: onnx.NodeProto, else_node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Nodes computing z = then_node's t_out if sum(x) > 0 else else_node's e_out (a run-time
    condition: the If stays)."""
    then_graph = helper.make_graph([then_node], "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([else_node], "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    return [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="/ReduceSum"),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="/Greater"),
        helper.make_node("If", ["cond"], ["z"], then_branch=then_graph, else_branch=else_graph, name="/If"),
    ]


def test_if_with_runtime_condition_left_float_inside(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/fc1/MatMul"),
        *runtime_if(helper.make_node("Mul", ["h", "two"], ["t_out"], name="/then/Mul"),
                    helper.make_node("Neg", ["h"], ["e_out"], name="/else/Neg")),
        helper.make_node("MatMul", ["z", "w2"], ["y"], name="/fc2/MatMul"),
    ]
    inits = {"w1": weight(6, 6), "w2": weight(6, 2), "zero": np.float32(0.0), "two": np.float32([2.0])}
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((1, 6)).astype(np.float32)} for _ in range(20)]
    result, path = quantize_and_compare(model, tmp_path, batches, min_cosine=0.98)
    assert "If '/If' has a run-time condition: its branches stay float" in result.notes
    for x in (np.ones((1, 6), np.float32), -np.ones((1, 6), np.float32)):  # both branches run
        ref = make_session(model).run(None, {"x": x})[0]
        got = make_session(path).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref, rtol=0.1, atol=0.1 * np.abs(ref).max())


def test_dynamic_axes_and_int64_second_input(tmp_path: Path) -> None:
    """Token ids (int64) and a float mask, dynamic batch and sequence: Gather embedding table
    quantized as a weight, attention-like MatMuls int8."""
    vocab, d = 20, 8
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="/embed/Gather"),
        helper.make_node("Unsqueeze", ["mask", "axes"], ["m"], name="/Unsqueeze"),
        helper.make_node("Mul", ["e", "m"], ["em"], name="/Mul"),
        helper.make_node("MatMul", ["em", "wq"], ["q"], name="/q/MatMul"),
        helper.make_node("Transpose", ["em"], ["et"], perm=[0, 2, 1], name="/Transpose"),
        helper.make_node("MatMul", ["q", "et"], ["scores"], name="/scores/MatMul"),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1, name="/Softmax"),
        helper.make_node("MatMul", ["p", "em"], ["y"], name="/ctx/MatMul"),
    ]
    inits = {"table": weight(vocab, d), "axes": np.int64([-1]), "wq": weight(d, d)}
    model = make(
        nodes,
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "S"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", "S"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", d])],
        inits,
    )
    batches = []
    for i in range(24):
        s = 4 + i % 3  # varying sequence lengths
        batches.append({"ids": RNG.integers(0, vocab, (1, s)).astype(np.int64), "mask": np.ones((1, s), np.float32)})
    result, path = quantize_and_compare(model, tmp_path, batches, min_cosine=0.98)
    decided = {d.name: d for d in result.plan.nodes}
    assert decided["/q/MatMul"].quantized and decided["/scores/MatMul"].quantized
    assert not decided["/Softmax"].quantized
    assert "table" not in {t.name for t in onnx.load(str(path)).graph.initializer}  # int8 table only


def test_weight_written_as_int8_times_scale(tmp_path: Path) -> None:
    """Some exporters store a weight as Mul(Cast(int8), scale): folded, then quantized."""
    nodes = [
        helper.make_node("Cast", ["w_int8"], ["w_f"], to=TensorProto.FLOAT, name="/Cast"),
        helper.make_node("Mul", ["w_f", "w_scale"], ["w"], name="/MulScale"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="/fc/MatMul"),
    ]
    inits = {"w_int8": RNG.integers(-127, 128, (8, 4)).astype(np.int8), "w_scale": np.float32([0.01])}
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((1, 8)).astype(np.float32)} for _ in range(16)]
    result, path = quantize_and_compare(model, tmp_path, batches)
    assert ops(path)["Cast"] == 0 and ops(path)["MatMul"] == 1
    assert "w" in result.plan.weights


def test_external_data_round_trip(tmp_path: Path) -> None:
    d = 64
    model = make(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="/a"), helper.make_node("MatMul", ["h", "w2"], ["y"], name="/b")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", d])],
        {"w": weight(d, d), "w2": weight(d, d)},
    )
    src = tmp_path / "ext.onnx"
    onnx.save_model(model, str(src), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    loaded = load_model(src)
    batches = [{"x": RNG.standard_normal((1, d)).astype(np.float32)} for _ in range(16)]
    quantize_and_compare(loaded, tmp_path, batches)


def test_sample_mlp_with_constant_node_weights_opset11(tmp_path: Path) -> None:
    mlp = SAMPLE_MODELS / "mlp"
    model = load_model(mlp / "model.onnx")
    assert any(n.op_type == "Constant" for n in model.graph.node)
    table = calibrate(model, DataFolder(mlp / "calib", model_inputs(model)), Config())
    result = quantize(model, Config(), table)
    path = save_model(result.model, tmp_path / "mlp.onnx")
    check_model(path)
    assert "upgraded opset 11 -> 13" in result.notes
    assert Counter(d.op_type for d in result.plan.nodes if d.quantized and not d.reason) == {"Gemm": 3}
    assert all(w.axis == 0 for w in result.plan.weights.values())  # per-channel, after the upgrade
    # 3.01x measured: int8 weights plus per-channel scales and zero points (the zero points must
    # be there: onnxruntime fuses Gemm only with one), int32 biases and their per-channel scales
    assert (mlp / "model.onnx").stat().st_size / path.stat().st_size >= 3.0


def _fused_ops(path: Path) -> Counter:
    """Op types onnxruntime runs after its graph optimizations."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(path.with_suffix(".optimized.onnx"))
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return ops(path.with_suffix(".optimized.onnx"))


def _opset11_mlp(relu: bool = True) -> onnx.ModelProto:
    """Gemm -> Relu -> Gemm -> logits at opset 11, weights in Constant nodes (as torch exports)."""
    consts = {"w1": weight(16, 8), "b1": weight(16, scale=0.1), "w2": weight(4, 16), "b2": weight(4, scale=0.1)}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k)) for k, v in consts.items()]
    nodes += [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="/fc1/Gemm"),
        helper.make_node("Relu" if relu else "Identity", ["h"], ["r"], name="/relu/Relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1, name="/fc2/Gemm"),
    ]
    return make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        {},
        opset=11,
    )


def _mlp_data(tmp_path: Path) -> Path:
    """A data folder of 8 random inputs for `_opset11_mlp`."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        np.savez(data / f"{i}.npz", x=RNG.standard_normal((1, 8)).astype(np.float32))
    return data


def test_classifier_gemm_writes_float_logits(tmp_path: Path) -> None:
    """The last Gemm's output is read by nothing quantized: no Q/DQ pair on it, and onnxruntime
    runs every Gemm as QGemm (the last one writing float), with nothing else but the input's
    QuantizeLinear."""
    batches = [{"x": RNG.standard_normal((1, 8)).astype(np.float32)} for _ in range(16)]
    result, path = quantize_and_compare(_opset11_mlp(), tmp_path, batches)
    assert result.plan.activations == ["x", "r"]
    written = ops(path)
    assert written["QuantizeLinear"] == 2 and written["DequantizeLinear"] == 2 + 2 + 2  # acts, weights, biases
    assert written["Relu"] == 0  # r's QuantizeLinear (zero point 0, uint8) clips as much
    assert _fused_ops(path) == Counter({"QGemm": 2, "QuantizeLinear": 1})
    assert {o.name for o in onnx.load(str(path)).graph.output} == {"logits"}


def test_written_gemm_model_holds_only_what_runs(tmp_path: Path) -> None:
    """Besides the int8 weights: their per-channel scales and zero points, the int32 biases and
    their scales, a scale and zero point per quantized activation. No float weight, no Relu
    (its QuantizeLinear clips as much), no logits Q/DQ, no value_info but the model's own."""
    batches = [{"x": RNG.standard_normal((1, 8)).astype(np.float32)} for _ in range(16)]
    model = _opset11_mlp()
    model.graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 16]))
    _, path = quantize_and_compare(model, tmp_path, batches)
    q = onnx.load(str(path))
    assert sorted(t.name for t in q.graph.initializer) == sorted(
        [f"{w}_{part}" for w in ("w1", "w2") for part in ("quantized", "scale", "zero_point")]
        + [f"{b}_{part}" for b in ("b1", "b2") for part in ("quantized", "scale")]
        + [f"{t}_{part}" for t in ("x", "r") for part in ("scale", "zero_point")]
    )
    assert ops(path) == Counter({"DequantizeLinear": 6, "QuantizeLinear": 2, "Gemm": 2})
    assert [v.name for v in q.graph.value_info] == ["r"]  # not h (gone), not those prepare inferred
    assert [p.key for p in q.metadata_props] == ["qcli.version", "qcli.config", "qcli.calibration"]


def test_override_naming_a_gemm_output_keeps_its_qdq(tmp_path: Path) -> None:
    """An override that names the output asks for it quantized: the graph output keeps its name
    (the Gemm writes `logits_float`)."""
    model = _opset11_mlp()
    data = _mlp_data(tmp_path)
    config = Config.model_validate({"overrides": [{"match": {"tensors": ["logits"]}, "activations": {"dtype": "uint8"}}]})
    result = quantize(model, config, calibrate(model, DataFolder(data, model_inputs(model)), config))
    assert result.plan.activations == ["x", "r", "logits"]
    gemm = next(n for n in result.model.graph.node if n.name == "/fc2/Gemm")
    assert list(gemm.output) == ["logits_float"]


def test_matmul_before_a_float_softmax_writes_float(tmp_path: Path) -> None:
    """MatMul -> Softmax (float by default): the MatMul's output gets no Q/DQ and onnxruntime
    runs it as MatMulIntegerToFloat."""
    d = 8
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["s"], name="/scores/MatMul"),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1, name="/Softmax"),
    ]
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", d])],
        {"w": weight(d, d)},
    )
    batches = [{"x": RNG.standard_normal((1, d)).astype(np.float32)} for _ in range(16)]
    result, path = quantize_and_compare(model, tmp_path, batches)
    assert result.plan.activations == ["x"]
    assert _fused_ops(path) == Counter({"MatMulIntegerToFloat": 1, "QuantizeLinear": 1, "Softmax": 1})


def test_gemm_before_an_excluded_node(tmp_path: Path) -> None:
    """A Gemm whose only reader is excluded still fuses (QGemm writes float), so it stays int8;
    not when a lone Relu follows it (onnxruntime's selector then wants a Q after the Relu)."""
    data = _mlp_data(tmp_path)
    config = Config.model_validate({"exclude": {"nodes": ["/fc2/*"]}})
    for relu, fc1_int8 in ((False, True), (True, False)):
        model = _opset11_mlp(relu)
        result = quantize(model, config, calibrate(model, DataFolder(data, model_inputs(model)), config))
        decided = {d.name: d for d in result.plan.nodes}
        assert decided["/fc1/Gemm"].quantized is fc1_int8 and not decided["/fc2/Gemm"].quantized
        assert result.plan.activations == (["x"] if fc1_int8 else [])
        path = save_model(result.model, tmp_path / "q.onnx")
        assert _fused_ops(path)["QGemm"] == int(fc1_int8)


def test_relu_dropped_only_where_its_quantizelinear_clips_as_much(tmp_path: Path) -> None:
    """uint8 asymmetric: r's zero point is 0, the type's minimum, so Q(Relu(h)) == Q(h) and the
    Gemm writes r directly (bit-identical outputs with the Relu put back). int8 symmetric: zero
    point 0 is mid-range, negative h would survive: the Relu stays."""
    import onnxruntime as ort

    def run(m: onnx.ModelProto) -> np.ndarray:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
        return ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]

    model, data = _opset11_mlp(), _mlp_data(tmp_path)
    x = RNG.standard_normal((64, 8)).astype(np.float32) * 3
    for activations, relus in (({"dtype": "uint8", "symmetric": False}, 0), ({"dtype": "int8", "symmetric": True}, 1)):
        config = Config.model_validate({"activations": activations})
        result = quantize(model, config, calibrate(model, DataFolder(data, model_inputs(model)), config))
        assert ops(save_model(result.model, tmp_path / "q.onnx"))["Relu"] == relus
        fc1 = next(n for n in result.model.graph.node if n.name == "/fc1/Gemm")
        assert list(fc1.output) == (["r"] if relus == 0 else ["h"])
    # the uint8 model of the loop's first pass, with the Relu put back
    config = Config()
    dropped = quantize(model, config, calibrate(model, DataFolder(data, model_inputs(model)), config)).model
    restored = onnx.ModelProto()
    restored.CopyFrom(dropped)
    fc1 = next(n for n in restored.graph.node if n.name == "/fc1/Gemm")
    fc1.output[0] = "h"
    restored.graph.node.insert(list(restored.graph.node).index(fc1) + 1, helper.make_node("Relu", ["h"], ["r"]))
    np.testing.assert_array_equal(run(dropped), run(restored))


def test_detector_head_concat_of_box_offsets_and_sigmoid_scores_is_calibrated(tmp_path: Path) -> None:
    """A YOLOX-style head (ddddocr's detector, 2026-11-23): Concat(raw box Conv, Sigmoid(obj),
    Sigmoid(cls)) -> Transpose -> output. The Concat shares one scale across its inputs; the
    Sigmoids' known [0, 1] once fixed the whole group's range and clipped every box offset
    (cosine 0.95 there). Now the group is calibrated: its range covers the box offsets."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["f"], pads=[1, 1, 1, 1], name="/stem/Conv"),
        helper.make_node("Relu", ["f"], ["r"], name="/stem/Relu"),
        helper.make_node("Conv", ["r", "wb", "bb"], ["box"], name="/head/box/Conv"),
        helper.make_node("Conv", ["r", "wo", "bo"], ["obj_logit"], name="/head/obj/Conv"),
        helper.make_node("Sigmoid", ["obj_logit"], ["obj"], name="/head/obj/Sigmoid"),
        helper.make_node("Conv", ["r", "wc", "bc"], ["cls_logit"], name="/head/cls/Conv"),
        helper.make_node("Sigmoid", ["cls_logit"], ["cls"], name="/head/cls/Sigmoid"),
        helper.make_node("Concat", ["box", "obj", "cls"], ["head"], axis=1, name="/head/Concat"),
        helper.make_node("Transpose", ["head"], ["y"], perm=[0, 2, 3, 1], name="/head/Transpose"),
    ]
    inits = {
        "w0": weight(8, 3, 3, 3), "b0": weight(8),
        "wb": weight(4, 8, 1, 1, scale=3.0), "bb": np.float32([4, 4, 8, 8]),  # offsets of several pixels
        "wo": weight(1, 8, 1, 1), "bo": weight(1), "wc": weight(2, 8, 1, 1), "bc": weight(2),
    }
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 16, 7])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(16)]
    result, path = quantize_and_compare(model, tmp_path, batches, min_cosine=0.999)
    group = next(g for g in result.plan.groups if "head" in g.tensors)
    assert {"box", "obj", "cls", "head", "y"} <= set(group.tensors)
    assert group.fixed_range is None and group.range[1] > 4  # calibrated: the box offsets fit


def test_a_group_of_sigmoid_values_only_keeps_the_known_range(tmp_path: Path) -> None:
    """Sigmoid -> MaxPool -> Conv: the Sigmoid's output and the MaxPool's (its values) are
    [0, 1] without calibration."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["f"], pads=[1, 1, 1, 1], name="/a/Conv"),
        helper.make_node("Sigmoid", ["f"], ["s"], name="/a/Sigmoid"),
        helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="/pool"),
        helper.make_node("Conv", ["p", "w1", "b1"], ["y"], name="/b/Conv"),
    ]
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 4, 4])],
        {"w0": weight(8, 3, 3, 3), "b0": weight(8), "w1": weight(4, 8, 1, 1), "b1": weight(4)},
    )
    batches = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)]
    result, _ = quantize_and_compare(model, tmp_path, batches)
    group = next(g for g in result.plan.groups if "s" in g.tensors)
    assert set(group.tensors) == {"s", "p"} and group.fixed_range == (0.0, 1.0)


def test_a_square_written_as_mul_stays_float_like_pow(tmp_path: Path) -> None:
    """JAX/TF exports compute a LayerNorm's variance as E[x*x] - E[x]**2 with Mul(x, x): the
    squares stay float like Pow (8 bits on E[x*x] cancel the variance away); other Muls do not."""
    d = 32
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/fc1/MatMul"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="/fc1/Add"),
        helper.make_node("Mul", ["hb", "hb"], ["sq"], name="/ln/Square"),
        helper.make_node("ReduceMean", ["sq"], ["ex2"], axes=[-1], name="/ln/MeanSq"),
        helper.make_node("ReduceMean", ["hb"], ["mu"], axes=[-1], name="/ln/Mean"),
        helper.make_node("Mul", ["mu", "mu"], ["mu2"], name="/ln/Square_1"),
        helper.make_node("Sub", ["ex2", "mu2"], ["var"], name="/ln/Sub"),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="/ln/Add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="/ln/Sqrt"),
        helper.make_node("Sub", ["hb", "mu"], ["c"], name="/ln/Sub_1"),
        helper.make_node("Div", ["c", "sd"], ["n"], name="/ln/Div"),
        helper.make_node("Mul", ["n", "gamma"], ["g"], name="/ln/Mul"),
        helper.make_node("MatMul", ["g", "w2"], ["y"], name="/fc2/MatMul"),
    ]
    inits = {
        "w1": weight(d, d, scale=0.1), "b1": np.full(d, 4.0, np.float32), "eps": np.float32([1e-5]),
        "gamma": (1 + weight(d, scale=0.1)), "w2": weight(d, 4),
    }
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 4])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((1, 7, d)).astype(np.float32)} for _ in range(24)]
    result, path = quantize_and_compare(model, tmp_path, batches, min_cosine=0.999)
    reasons = {d.name: d.reason for d in result.plan.nodes if not d.quantized}
    square = "a square (Mul of x by x): variance chains need more than 8 bits"
    assert reasons["/ln/Square"] == reasons["/ln/Square_1"] == square
    assert "/ln/Mul" not in reasons


def test_a_weight_also_read_in_float_is_not_stored_twice(tmp_path: Path) -> None:
    """w1 feeds a MatMul and an If branch (which stays float): quantizing the MatMul would keep
    w1 in float for the branch and add an int8 copy. That MatMul stays float, the rest does
    not; w1 is stored once, in int8, its value folded at load under its own name for both
    readers (qcli/plan/controlflow.py); an override naming the MatMul still quantizes it."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/fc1/MatMul"),
        *runtime_if(helper.make_node("MatMul", ["x", "w1"], ["t_out"], name="/then/MatMul"),
                    helper.make_node("Neg", ["x"], ["e_out"], name="/else/Neg")),
        helper.make_node("Add", ["h", "z"], ["a"], name="/Add"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="/fc2/MatMul"),
        helper.make_node("Shape", ["w2"], ["w2_shape"], name="/Shape"),
    ]
    inits = {"w1": weight(64, 64), "w2": weight(64, 64), "zero": np.float32(0.0)}
    model = make(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("w2_shape", TensorProto.INT64, [2])],
        inits,
    )
    batches = [{"x": RNG.standard_normal((1, 64)).astype(np.float32)} for _ in range(20)]
    result, path = quantize_and_compare(model, tmp_path, batches, min_cosine=0.98)
    reasons = {d.name: d.reason for d in result.plan.nodes if not d.quantized}
    assert reasons["/fc1/MatMul"] == "its weight is also read in float (by a If body): int8 would store it twice"
    assert "/fc2/MatMul" not in reasons  # a Shape reads only w2's shape: it gets the int8 copy
    names = {t.name for t in onnx.load(str(path)).graph.initializer}
    assert "w1" not in names and "w1_quantized" in names and "w2" not in names and "w2_quantized" in names
    assert path.stat().st_size < 64 * 64 * 2 * 1.5  # w1 and w2 int8 (was w1 twice, then w1 float)

    from qcli.config import parse_config

    config = parse_config({"overrides": [{"match": {"nodes": ["/fc1/MatMul"]}, "precision": "int8"}]})
    table = calibrate(model, DataFolder(tmp_path / "data", model_inputs(model)), config)
    forced = quantize(model, config, table)
    assert {d.name for d in forced.plan.nodes if d.quantized} >= {"/fc1/MatMul", "/fc2/MatMul"}


def test_a_float16_model_is_told_to_quantize_its_float32_export() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="/fc/MatMul")]
    model = make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 8])],
                 {"w": weight(8, 8).astype(np.float16)})
    from qcli.plan import make_plan

    decision = make_plan(model, Config()).nodes[0]
    assert not decision.quantized
    assert decision.reason == "float16, not float32: quantize the model's float32 export"


def test_a_tied_embedding_keeps_its_output_projection_int8() -> None:
    """The table E is read by a Gather that stays float (no anchor next to it) and by the output
    projection Gemm(h, E, transB=1): the Gemm stays int8, worth an int8 copy of E."""
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["emb"], name="/embed/Gather"),
        helper.make_node("Gemm", ["x", "E"], ["logits"], transB=1, name="/lm_head/Gemm"),
    ]
    model = make(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 16]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 32])],
        {"E": weight(32, 16)},
    )
    from qcli.plan import make_plan

    decisions = {d.name: d for d in make_plan(model, Config()).nodes}
    assert decisions["/lm_head/Gemm"].quantized
    assert decisions["/embed/Gather"].reason == "no Conv/MatMul/Gemm next to it: int8 would be slower here"
