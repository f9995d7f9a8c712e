"""The plan's decisions, one rule at a time, on tiny models written in ONNX text: which nodes are
quantized and why the others stay float, what folds, which tensors share one scale, and what the
overrides change. Each model has the nodes the rule needs and nothing else."""

from __future__ import annotations

import math

import onnx
import pytest

from conftest import parse_model
from qcli.config import Config
from qcli.graph import GraphIndex
from qcli.plan import Plan, make_plan
from qcli.plan.nodes import TENSOR_EXCLUDED
from qcli.rules import RULES, SQUARE, is_kind, rearranges
from qcli.scheme import PerChannel

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
CONV_WEIGHTS = "float[2,2,1,1] w = {1.0, 0.5, -0.5, 1.0}, float[2] b = {0.1, -0.1}"
CONV_WEIGHTS_2 = "float[2,2,1,1] w2 = {0.5, 1.0, 1.0, -0.5}"


def plan_of(text: str, **config) -> Plan:
    """The plan of an ONNX-text graph (typed by shape inference, as `prepare` does)."""
    model = onnx.shape_inference.infer_shapes(parse_model(HEADER + text), strict_mode=True)
    return make_plan(model, Config.model_validate(config))


def conv_then(line: str, **config) -> Plan:
    """The plan of `c = Conv(x)` followed by `line`, which writes the graph's output `y`."""
    return plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}> {{
        [conv] c = Conv(x, w, b)
        {line}
    }}""", **config)


def decided(plan: Plan, name: str) -> tuple[bool, str]:
    """(quantized, reason) of the node called `name`."""
    d = next(d for d in plan.nodes if d.name == name)
    return d.quantized, d.reason


def group_of(plan: Plan, tensor: str) -> list[str]:
    return next(g.tensors for g in plan.groups if tensor in g.tensors)


# --------------------------------------------------------------------------- nodes


def test_conv_is_quantized_with_its_weight_per_channel_and_its_bias_int32() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}> {{
        [conv] y = Conv(x, w, b)
    }}""")
    assert decided(plan, "conv") == (True, "")
    assert plan.activations == ["x", "y"]
    assert plan.weights["w"].axis == 0 and plan.weights["w"].scheme.granularity == PerChannel()
    assert plan.biases["b"].input == "x" and plan.biases["b"].weight == "w"


def test_an_op_without_a_rule_stays_float_and_says_so() -> None:
    plan = conv_then("[neg] y = Neg(c)")
    assert decided(plan, "neg") == (False, "no int8 kernel for this op")


def test_softmax_stays_float_by_default_with_its_rule_s_reason() -> None:
    text = """g (float[2,4] x) => (float[2,4] y) <float[4,4] w = {1.0,0.0,0.0,0.0, 0.0,1.0,0.0,0.0,
                                                       0.0,0.0,1.0,0.0, 0.0,0.0,0.0,1.0}> {
        [mm] m = MatMul(x, w)
        [softmax] y = Softmax(m)
    }"""
    assert decided(plan_of(text), "softmax") == (False, RULES["Softmax"].reason)
    asked = plan_of(text, overrides=[{"match": {"nodes": ["softmax"]}, "precision": "int8"}])
    assert decided(asked, "softmax") == (True, "")


def test_a_square_is_float_by_default_where_a_product_is_not() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z)
            <{CONV_WEIGHTS}, {CONV_WEIGHTS_2}> {{
        [conv] c = Conv(x, w, b)
        [square] s = Mul(c, c)
        [conv2] y = Conv(s, w2)
        [product] p = Mul(c, x)
        [conv3] z = Conv(p, w2)
    }}""")
    assert decided(plan, "square") == (False, SQUARE.reason)
    assert decided(plan, "product") == (True, "")


def test_a_conv_whose_weight_is_computed_stays_float_but_a_matmul_of_two_activations_does_not() -> None:
    plan = plan_of("""g (float[1,2,4,4] x, float[2,2,1,1] w, float[2,4] a, float[4,2] bb)
            => (float[1,2,4,4] y, float[2,2] z) {
        [conv] y = Conv(x, w)
        [mm] z = MatMul(a, bb)
    }""")
    assert decided(plan, "conv") == (False, "its weight is not a constant")
    assert decided(plan, "mm") == (True, "")


def test_a_float64_model_stays_float_and_says_to_quantize_its_float32_export() -> None:
    plan = plan_of("""g (double[2,4] x) => (double[2,2] y) <double[4,2] w = {1.0,0.0,0.0,1.0,1.0,0.0,0.0,1.0}> {
        [mm] y = MatMul(x, w)
    }""")
    assert decided(plan, "mm") == (False, "float64, not float32: quantize the model's float32 export")


def test_an_add_with_no_conv_or_matmul_next_to_it_stays_float() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x, float[1,2,4,4] x2) => (float[1,2,4,4] y, float[1,2,4,4] z)
            <{CONV_WEIGHTS}> {{
        [lone] a = Add(x, x2)
        [neg] y = Neg(a)
        [conv] c = Conv(x, w, b)
        [near] z = Add(c, x2)
    }}""")
    assert decided(plan, "lone") == (False, "no Conv/MatMul/Gemm next to it: int8 would be slower here")
    assert decided(plan, "near") == (True, "")


# --------------------------------------------------------------------------- folding


def test_relu_after_a_conv_folds_into_it() -> None:
    plan = conv_then("[relu] y = Relu(c)")
    assert decided(plan, "relu") == (True, "folded into conv")
    assert next(d for d in plan.nodes if d.name == "relu").folded_into == "conv"
    assert plan.activations == ["x", "y"]  # the Conv's own output gets no Q/DQ


def test_a_clip_folds_only_when_its_bounds_are_constants() -> None:
    text = f"""g (float[1,2,4,4] x, float lo) => (float[1,2,4,4] y) <{CONV_WEIGHTS}, float hi = {{6.0}}> {{
        [conv] c = Conv(x, w, b)
        [clip] y = Clip(c, LO, hi)
    }}"""
    fixed = plan_of(text.replace("LO", "zero").replace("float hi", "float zero = {0.0}, float hi"))
    assert decided(fixed, "clip") == (True, "folded into conv")
    computed = plan_of(text.replace("LO", "lo"))
    assert decided(computed, "clip") == (False, "not after a quantized node")
    assert "c" in computed.activations


def test_a_relu_the_config_excludes_does_not_fold() -> None:
    plan = conv_then("[relu] y = Relu(c)", exclude={"nodes": ["relu"]})
    assert decided(plan, "relu") == (False, "excluded by config")
    assert plan.activations == ["x", "c"]


def test_a_matmul_writes_its_unread_output_in_float_unless_a_lone_relu_follows() -> None:
    text = """g (float[2,4] x) => (float[2,2] y) <float[4,2] w = {1.0,0.0,0.0,1.0,1.0,0.0,0.0,1.0}> {
        [mm] y = MatMul(x, w)
    }"""
    assert plan_of(text).activations == ["x"]
    relu = plan_of(text.replace("[mm] y = MatMul(x, w)", "[mm] m = MatMul(x, w)\n[relu] r = Relu(m)\n[neg] y = Neg(r)"))
    assert relu.activations == ["x", "r"]  # onnxruntime fuses MatMul+Relu only with a QuantizeLinear after
    named = plan_of(text, overrides=[{"match": {"tensors": ["y"]}, "activations": {"dtype": "uint8"}}])
    assert named.activations == ["x", "y"]


# --------------------------------------------------------------------------- shared scales


def test_reshape_and_concat_share_one_scale_with_their_neighbours() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,64] y)
            <{CONV_WEIGHTS}, {CONV_WEIGHTS_2}, int64[2] shape = {{1, 32}}> {{
        [conv] c = Conv(x, w, b)
        [conv2] d = Conv(x, w2)
        [flat] r = Reshape(c, shape)
        [flat2] s = Reshape(d, shape)
        [cat] y = Concat <axis = 1> (r, s)
    }}""")
    assert group_of(plan, "c") == ["c", "d", "r", "s", "y"]
    assert all(decided(plan, n) == (True, "") for n in ("flat", "flat2", "cat"))


def test_data_movement_without_a_quantized_neighbour_stays_float() -> None:
    plan = plan_of("""g (float[2,4] x) => (float[1,4] y) <float[4,2] w = {1.0,0.0,0.0,1.0,1.0,0.0,0.0,1.0},
                                                      int64[2] shape = {1, 4}> {
        [mm] m = MatMul(x, w)
        [flat] y = Reshape(m, shape)
    }""")
    assert decided(plan, "flat") == (False, "no quantized neighbour")
    assert plan.activations == ["x"]


def test_sigmoid_fixes_a_group_s_range_and_probabilities_never_share_a_scale_with_other_values() -> None:
    """A Concat of a Sigmoid's probabilities and a Conv's values into a graph output (a YOLOv8
    head: boxes in pixels and class scores) stays float: one scale for both rounded every score
    to 0; each input keeps its own scale. Two Sigmoids' outputs share theirs, [0, 1] without
    calibration."""
    text = f"""g (float[1,2,4,4] x) => (float[1,4,4,4] y) <{CONV_WEIGHTS}, {CONV_WEIGHTS_2}> {{
        [conv] c = Conv(x, w, b)
        [sigmoid] s = Sigmoid(c)
        [conv2] d = Conv(x, w2)
        [cat] y = Concat <axis = 1> (s, OTHER)
    }}"""
    mixed = plan_of(text.replace("OTHER", "d"))
    assert decided(mixed, "cat") == (False, "it writes a graph output joining probabilities with values of another "
                                            "range: one scale would round the probabilities away")
    alone = next(g for g in mixed.groups if "s" in g.tensors)
    assert alone.tensors == ["s"] and alone.fixed_range == (0.0, 1.0)
    both = plan_of(text.replace("OTHER", "t").replace("[cat]", "[sigmoid2] t = Sigmoid(d)\n[cat]"))
    group = next(g for g in both.groups if "s" in g.tensors)
    assert group.tensors == ["s", "t", "y"] and group.fixed_range == (0.0, 1.0)
    assert "s" not in both.calibrated_tensors


# --------------------------------------------------------------------------- config


def test_a_node_whose_tensor_is_excluded_stays_float_and_reads_float() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}, {CONV_WEIGHTS_2}> {{
        [conv] c = Conv(x, w, b)
        [conv2] y = Conv(c, w2)
    }}""", exclude={"tensors": ["y"]})
    assert decided(plan, "conv2") == (False, TENSOR_EXCLUDED)
    index = next(d.index for d in plan.nodes if d.name == "conv2")
    assert plan.keep_float == {index}


def test_a_node_that_only_feeds_excluded_nodes_stays_float() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}, {CONV_WEIGHTS_2}> {{
        [conv] c = Conv(x, w, b)
        [relu] r = Relu(c)
        [conv2] y = Conv(r, w2)
    }}""", exclude={"nodes": ["conv2"]})
    assert decided(plan, "conv") == (False, "its output only feeds nodes kept float")
    assert plan.groups == []


def test_a_weight_also_read_in_float_keeps_its_node_float_unless_an_override_asks() -> None:
    text = """g (float[2,4] x) => (float[2,2] y, float[4,2] w) <float[4,2] w = {1.0,0.0,0.0,1.0,1.0,0.0,0.0,1.0}> {
        [mm] y = MatMul(x, w)
    }"""
    reason = "its weight is also read in float (by a graph output): int8 would store it twice"
    assert decided(plan_of(text), "mm") == (False, reason)
    asked = plan_of(text, overrides=[{"match": {"nodes": ["mm"]}, "precision": "int8"}])
    assert decided(asked, "mm") == (True, "")


def test_an_override_widens_a_node_s_activations_and_the_group_follows() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,4,4,4] y) <{CONV_WEIGHTS}, {CONV_WEIGHTS_2}> {{
        [conv] c = Conv(x, w, b)
        [conv2] d = Conv(x, w2)
        [cat] y = Concat <axis = 1> (c, d)
    }}""", overrides=[{"match": {"nodes": ["conv"]}, "activations": {"dtype": "uint16"}},
                       {"match": {"nodes": ["conv2"]}, "activations": {"dtype": "uint8"}}])
    # x: both ask, the later rule wins; c and d share one scale: the wider wins
    assert [(g.tensors, g.scheme.dtype.name) for g in plan.groups] == [(["x"], "uint8"), (["c", "d", "y"], "uint16")]
    assert plan.notes == ["tensors c, d, y share one scale: all get uint16 (the widest any override asked for)"]


def test_an_override_sets_a_weight_scheme_and_a_fixed_range() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}> {{
        [conv] y = Conv(x, w, b)
    }}""", overrides=[{"match": {"nodes": ["conv"]}, "weights": {"dtype": "int4", "granularity": "per_tensor"},
                       "range": [-1.0, 1.0]}])
    assert plan.weights["w"].scheme.dtype.name == "int4" and plan.weights["w"].axis is None
    assert [g.fixed_range for g in plan.groups] == [(-1.0, 1.0), (-1.0, 1.0)]
    assert plan.calibrated_tensors == []


def test_precision_float_keeps_a_node_float() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}> {{
        [conv] y = Conv(x, w, b)
    }}""", overrides=[{"match": {"op_types": ["Conv"]}, "precision": "float"}])
    assert decided(plan, "conv") == (False, "excluded by config")
    assert plan.groups == [] and plan.weights == {}


def test_a_rule_that_matches_nothing_is_reported_with_close_names() -> None:
    plan = plan_of(f"""g (float[1,2,4,4] x) => (float[1,2,4,4] y) <{CONV_WEIGHTS}> {{
        [conv] y = Conv(x, w, b)
    }}""", exclude={"nodes": ["conv1"]})
    assert plan.unmatched == ["exclude matched nothing (close: conv)"]


# --------------------------------------------------------------------------- rules and index


@pytest.mark.parametrize("op, kind, rearranging, clip_range", [
    ("Reshape", "shares", True, None), ("MaxPool", "shares", False, None), ("Shape", "shape", False, None),
    ("Relu", "fold", False, (0.0, math.inf)), ("Clip", "fold", False, (-math.inf, math.inf)),
])
def test_rule_fields(op: str, kind: str, rearranging: bool, clip_range: tuple[float, float] | None) -> None:
    """What the Q/DQ writer and the calibration pass ask of the rules."""
    node = onnx.helper.make_node(op, ["x"], ["y"])
    assert is_kind(node, kind)
    assert rearranges(node) is rearranging
    assert RULES[op].clip_range == clip_range
    assert not is_kind(onnx.helper.make_node(op, ["x"], ["y"], domain="com.example"), kind)


def test_graph_index_reads_each_input_once_per_position_and_skips_empty_names() -> None:
    model = parse_model(HEADER + """g (float[2] x, float lo) => (float[2] y) {
        s = Mul(x, x)
        y = Clip(s, lo, "")
    }""")
    index = GraphIndex.of(model)
    assert index.consumers("x") == [0, 0] and index.producer("s") == 0
    assert "" not in index.read_at and index.read_at["lo"] == ((1, 1),)
    assert index.producer("x") is None and index.outputs == {"y"}
