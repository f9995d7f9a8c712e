"""Graph prepare passes: each pass keeps the model's outputs (onnxruntime before/after on
random inputs) and leaves the expected ops; `prepare` on the model-zoo graphs shipped with onnx.

Tolerances: folds that only move data (Constant, ConstantOfShape, If inlining, opset
conversion) must be exact; folds that re-associate float math (BatchNormalization into the
weights) get rtol 1e-4 / atol 1e-5; whole zoo networks (dozens of folded layers, logits up
to 1e31) get rtol 1e-3.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import _values, fused_op_counts, parse_model, save, write_npz
from qcli.errors import ModelError
from qcli.model import max_ir_version
from qcli.prepare import (
    PASSES,
    Options,
    canonicalize,
    fold_batchnorm,
    fold_constants,
    infer_shapes,
    inline_constant_if,
    inline_functions,
    prepare,
    refuse_quantized,
    upgrade_opset,
)
from qcli.prepare._graph import light_copy
from qcli.runtime import make_session, session_options

LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
EXACT = dict(rtol=0, atol=0)
BN_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- helpers

def build(text: str, check: bool = True, **initializers: np.ndarray) -> onnx.ModelProto:
    """A model from ONNX text, plus initializers given as arrays (random weights do not
    fit in the text); IR clamped to what onnxruntime loads."""
    model = onnx.parser.parse_model(text)
    for name, array in initializers.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    model.ir_version = min(model.ir_version, max_ir_version())
    if check:
        onnx.checker.check_model(model)
    return model


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for the inputs a caller feeds (not initializers); free dims are 2."""
    rng = np.random.default_rng(seed)
    constant = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in constant:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor.shape.dim]
        if tensor.elem_type == onnx.TensorProto.BOOL:
            feeds[value.name] = rng.random(shape) > 0.5
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = make_session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_same_outputs(before, after, feeds=None, **tolerance) -> None:
    feeds = feeds if feeds is not None else random_feeds(before)
    expected, actual = outputs(before, feeds), outputs(after, feeds)
    assert list(actual) == list(expected)  # same output names, same order
    for name in expected:
        if expected[name].dtype.kind in "OSU":  # strings
            np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
        else:
            np.testing.assert_allclose(actual[name], expected[name], err_msg=name, **(tolerance or EXACT))


def run_pass(step, model: onnx.ModelProto, **options):
    """Run one pass on a copy (passes edit the model they get) and check the result is valid."""
    result = step(copy(model), Options(**options))
    onnx.checker.check_model(result.model)
    return result


def ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def bn_params(channels: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "gamma": rng.uniform(0.5, 2.0, channels).astype(np.float32),
        "beta": rng.standard_normal(channels).astype(np.float32),
        "mean": rng.standard_normal(channels).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, channels).astype(np.float32),
    }


def weights(*shape: int, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- batchnorm

CONV_BN = """
<ir_version: 8, opset_import: ["" : 13]>
net (float[2, 3, 8, 8] x) => (float[2, 4, 8, 8] y) {
    [conv] c = Conv <pads = [1, 1, 1, 1], group = 1> (x, w, b)
    [bn] y = BatchNormalization <epsilon = 0.001> (c, gamma, beta, mean, var)
}
"""


@pytest.mark.parametrize("groups, channels", [(1, 4), (3, 6)])
def test_conv_bn_folded(groups: int, channels: int) -> None:
    # Conv weight: [C_out, C_in / groups, k, k]; output channels on axis 0 whatever the groups
    text = CONV_BN.replace("group = 1", f"group = {groups}").replace("2, 4, 8, 8", f"2, {channels}, 8, 8")
    w = weights(channels, 3 // groups, 3, 3)
    model = build(text, w=w, b=weights(channels, seed=3), **bn_params(channels))
    result = run_pass(fold_batchnorm, model)
    assert result.modified
    assert result.notes == ["folded 1 BatchNormalization node into Conv"]
    assert ops(result.model) == Counter(Conv=1)
    conv = result.model.graph.node[0]
    assert (conv.name, list(conv.input), list(conv.output)) == ("conv", ["x", "w", "b"], ["y"])
    assert {t.name for t in result.model.graph.initializer} == {"w", "b"}  # BN params removed
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


def test_a_skipped_pass_is_left_out() -> None:
    """`prepare(skip=...)` (the config's `prepare.skip`) runs every pass but the ones named."""
    model = build(CONV_BN, w=weights(4, 3, 3, 3), b=weights(4, seed=3), **bn_params(4))
    assert ops(prepare(model).model) == Counter(Conv=1)
    kept = prepare(model, skip=("fold_batchnorm",))
    assert ops(kept.model) == Counter(Conv=1, BatchNormalization=1)
    assert not any("BatchNormalization" in note for note in kept.notes)


def test_conv_without_bias_gets_one() -> None:
    text = CONV_BN.replace("(x, w, b)", "(x, w)")
    model = build(text, w=weights(4, 3, 3, 3), **bn_params(4))
    result = run_pass(fold_batchnorm, model)
    assert ops(result.model) == Counter(Conv=1)
    assert list(result.model.graph.node[0].input) == ["x", "w", "conv/bias"]
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose_bn_folded(groups: int) -> None:
    # ConvTranspose weight: [C_in, C_out / groups, k, k]; output channels on axis 1, per group
    text = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[1, 4, 5, 5] x) => (float[1, 6, 11, 11] y) {{
        [up] c = ConvTranspose <strides = [2, 2], group = {groups}> (x, w, b)
        [bn] y = BatchNormalization (c, gamma, beta, mean, var)
    }}
    """
    model = build(text, w=weights(4, 6 // groups, 3, 3), b=weights(6, seed=3), **bn_params(6))
    result = run_pass(fold_batchnorm, model)
    assert ops(result.model) == Counter(ConvTranspose=1)
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_bn_folded(trans_b: int, bias: bool) -> None:
    shape = (5, 8) if trans_b else (8, 5)
    inputs = "(x, w, c)" if bias else "(x, w)"
    text = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[3, 8] x) => (float[3, 5] y) {{
        [fc] g = Gemm <transB = {trans_b}, alpha = 1.5, beta = 0.5> {inputs}
        [bn] y = BatchNormalization (g, gamma, beta, mean, var)
    }}
    """
    extra = {"c": weights(1, 5, seed=4)} if bias else {}
    model = build(text, w=weights(*shape), **extra, **bn_params(5))
    result = run_pass(fold_batchnorm, model)
    assert ops(result.model) == Counter(Gemm=1)
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


def test_bn_after_add_not_folded() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 4, 6, 6] x) => (float[2, 4, 6, 6] y) {
        [add] s = Add (x, x)
        [bn] y = BatchNormalization (s, gamma, beta, mean, var)
    }
    """
    model = build(text, **bn_params(4))
    result = run_pass(fold_batchnorm, model)
    assert not result.modified
    assert result.notes == ["BatchNormalization 'bn' not folded: its input comes from Add"]
    assert ops(result.model) == Counter(Add=1, BatchNormalization=1)


def test_bn_not_folded_when_conv_output_is_shared() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3, 6, 6] x) => (float[2, 4, 6, 6] y, float[2, 4, 6, 6] z) {
        [conv] c = Conv (x, w)
        [bn] y = BatchNormalization (c, gamma, beta, mean, var)
        [relu] z = Relu (c)
    }
    """
    model = build(text, w=weights(4, 3, 1, 1), **bn_params(4))
    result = run_pass(fold_batchnorm, model)
    assert result.notes == [
        "BatchNormalization 'bn' not folded: the output of Conv 'conv' also feeds other nodes or is a graph output"
    ]
    assert ops(result.model)["BatchNormalization"] == 1


def test_shared_weight_is_copied_not_overwritten() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3, 6, 6] x) => (float[2, 3, 6, 6] y, float[2, 3, 6, 6] z) {
        [conv1] c = Conv (x, w)
        [bn] y = BatchNormalization (c, gamma, beta, mean, var)
        [conv2] z = Conv (x, w)
    }
    """
    model = build(text, w=weights(3, 3, 1, 1), **bn_params(3))
    result = run_pass(fold_batchnorm, model)
    assert [list(n.input)[1] for n in result.model.graph.node] == ["w/folded", "w"]
    np.testing.assert_array_equal(initializer(result.model, "w"), initializer(model, "w"))
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


# ---------------------------------------------------------------- constants

def test_constant_node_weights_at_opset_11() -> None:
    text = """
    <ir_version: 6, opset_import: ["" : 11]>
    net (float[2, 4] x) => (float[2, 3] y) {
        w = Constant <value = float[4, 3] {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}> ()
        b = Constant <value = float[3] {0.5, -1.0, 2.0}> ()
        [fc] g = Gemm (x, w, b)
        y = Relu (g)
    }
    """
    model = build(text)
    result = prepare(model)
    assert result.notes[:2] == ["upgraded opset 11 -> 13", "raised the IR version 6 -> 7 (opset 13 needs it)"]
    assert "turned 2 Constant nodes into initializers" in result.notes
    assert ops(result.model) == Counter(Gemm=1, Relu=1)
    assert {t.name for t in result.model.graph.initializer} == {"w", "b"}
    assert_same_outputs(model, result.model)


def test_every_constant_form_becomes_an_initializer() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[3] x) => (float[3] y, int64[2] n, string[2] s) {
        a = Constant <value_float = 2.0> ()
        k = Constant <value_ints = [4, 5]> ()
        one = Constant <value_int = 1> ()
        s = Constant <value_strings = ["p", "q"]> ()
        t = Mul (x, a)
        y = Add (t, t)
        n = Add (k, one)
    }
    """
    model = build(text)
    result = run_pass(fold_constants, model)
    # `n` is a graph output: its node stays (only its Constant inputs became initializers)
    assert ops(result.model) == Counter(Mul=1, Add=2)
    assert initializer(result.model, "a").shape == ()
    assert initializer(result.model, "s").tolist() == ["p", "q"]
    assert result.notes[0] == "turned 4 Constant nodes into initializers"
    assert_same_outputs(model, result.model)


def test_cast_int8_times_scale_is_folded() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 4] x) => (float[2, 3] y) {
        wf = Cast <to = 1> (wq)
        w = Mul (wf, scale)
        [mm] y = MatMul (x, w)
    }
    """
    wq = np.random.default_rng(5).integers(-128, 127, (4, 3)).astype(np.int8)
    model = build(text, wq=wq, scale=np.array([0.1, 0.02, 0.5], np.float32))
    result = run_pass(fold_constants, model)
    assert ops(result.model) == Counter(MatMul=1)
    assert [t.name for t in result.model.graph.initializer] == ["w"]
    assert initializer(result.model, "w").dtype == np.float32
    assert "folded 2 constant nodes into initializers (Cast 1, Mul 1)" in result.notes
    assert "removed 2 unused initializers" in result.notes
    assert_same_outputs(model, result.model)


def test_constant_of_shape_transpose_reshape_folded_but_not_shape_of_activation() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 6] x) => (float[2, 4] y) {
        shape = Constant <value = int64[2] {4, 6}> ()
        w0 = ConstantOfShape <value = float[1] {0.25}> (shape)
        wt = Transpose <perm = [1, 0]> (w0)
        flat = Constant <value = int64[2] {6, 4}> ()
        w = Reshape (wt, flat)
        h = MatMul (x, w)
        hs = Shape (h)
        ones = Constant <value = int64[2] {1, 1}> ()
        target = Mul (hs, ones)
        y = Expand (h, target)
    }
    """
    model = build(text)
    result = run_pass(fold_constants, model)
    assert ops(result.model) == Counter(MatMul=1, Shape=1, Mul=1, Expand=1)  # Shape(h) chain stays
    assert result.notes == [
        "turned 3 Constant nodes into initializers",
        "folded 3 constant nodes into initializers (ConstantOfShape 1, Reshape 1, Transpose 1)",
        "removed 2 unused initializers",
    ]
    w = initializer(result.model, "w")
    assert w.shape == (6, 4) and np.all(w == 0.25)
    assert_same_outputs(model, result.model)


def _sorted(text: str) -> str:
    """Let the test text list nodes in any order: sort them topologically (stable)."""
    model = onnx.parser.parse_model(text)
    produced = {o for n in model.graph.node for o in n.output}
    ready = {i for n in model.graph.node for i in n.input if i not in produced} | {""}
    pending, order = list(model.graph.node), []
    while pending:
        node = next(n for n in pending if all(i in ready for i in n.input))
        pending.remove(node)
        order.append(node)
        ready.update(node.output)
    del model.graph.node[:]
    model.graph.node.extend(order)
    return onnx.printer.to_text(model)


def test_initializer_inputs_of_old_models_become_constants() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3] x, float[3, 3] w) => (float[2, 3] y) {
        y = MatMul (x, w)
    }
    """
    model = build(text, w=weights(3, 3))
    result = run_pass(fold_constants, model)
    assert [v.name for v in result.model.graph.input] == ["x"]
    assert result.notes == [
        "treated 1 initializer that was also a graph input as a constant (removed it from the inputs)"
    ]
    assert_same_outputs(model, result.model, feeds={"x": weights(2, 3)})


# ---------------------------------------------------------------- canonicalize

def names_of(model: onnx.ModelProto) -> list[tuple[str, str, list[str], list[str]]]:
    return [(n.op_type, n.name, list(n.input), list(n.output)) for n in model.graph.node]


def test_sum_of_two_becomes_add() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3] x, float[3] y) => (float[2, 3] z) {
        [res] s = Sum (x, y)
        [act] z = Relu (s)
    }
    """
    model = build(text)
    result = run_pass(canonicalize, model)
    assert result.modified and result.notes == ["replaced 1 Sum node of 2 inputs with Add"]
    assert names_of(result.model) == [("Add", "res", ["x", "y"], ["s"]), ("Relu", "act", ["s"], ["z"])]
    assert_same_outputs(model, result.model)


def test_sum_of_many_becomes_a_chain_of_adds() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3] a, float[2, 3] b, float[3] c, float[2, 1] d) => (float[2, 3] z) {
        [total] s = Sum (a, b, c, d)
        z = Relu (s)
    }
    """
    model = build(text)
    result = run_pass(canonicalize, model)
    assert result.notes == ["replaced 1 Sum node of more than 2 inputs with chains of Add (3 Add nodes)"]
    assert names_of(result.model)[:3] == [
        ("Add", "total/add_1", ["a", "b"], ["s/add_1"]),
        ("Add", "total/add_2", ["s/add_1", "c"], ["s/add_2"]),
        ("Add", "total", ["s/add_2", "d"], ["s"]),
    ]
    # onnxruntime's Sum may add in another order: allow float rounding
    assert_same_outputs(model, result.model, rtol=1e-6, atol=1e-6)


def test_sum_of_one_is_removed() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3] x) => (float[2, 3] z) {
        r = Relu (x)
        s = Sum (r)
        z = Neg (s)
    }
    """
    model = build(text)
    result = run_pass(canonicalize, model)
    assert result.notes == ["removed 1 Sum node of a single input"]
    assert ops(result.model) == Counter(Relu=1, Neg=1)
    assert list(result.model.graph.node[1].input) == ["r"]
    assert_same_outputs(model, result.model)


DROPOUT = """
<ir_version: 8, opset_import: ["" : 13]>
net (float[2, 4] x, bool flag) => (float[2, 4] y) {
    [fc] h = MatMul (x, w)
    [drop] d, mask = Dropout (h, ratio, TRAINING)
    [act] y = Relu (d)
}
"""


@pytest.mark.parametrize("training", ["", "off"])
def test_dropout_removed(training: str) -> None:
    text = DROPOUT.replace(", TRAINING", f", {training}" if training else "")
    extra = {"off": np.array(False)} if training else {}
    model = build(text, w=weights(4, 4), ratio=np.array(0.3, np.float32), **extra)
    feeds = {"x": weights(2, 4, seed=7), "flag": np.array(True)}
    result = run_pass(canonicalize, model)
    assert result.notes == ["removed 1 Dropout node (no-ops at inference)"]
    assert names_of(result.model) == [("MatMul", "fc", ["x", "w"], ["h"]), ("Relu", "act", ["h"], ["y"])]
    assert {t.name for t in result.model.graph.initializer} == {"w"}  # ratio, training flag gone
    assert_same_outputs(model, result.model, feeds=feeds)


def test_dropout_kept_when_it_may_train_or_its_mask_is_read() -> None:
    for flag, extra in (("flag", {}), ("on", {"on": np.array(True)})):  # run-time, constant true
        model = build(DROPOUT.replace("TRAINING", flag), w=weights(4, 4), ratio=np.array(0.3, np.float32), **extra)
        result = run_pass(canonicalize, model)
        assert not result.modified
        assert result.notes == ["Dropout 'drop' kept: its training_mode input is not a constant false"]

    text = DROPOUT.replace(", TRAINING", "").replace("=> (float[2, 4] y)", "=> (float[2, 4] y, bool[2, 4] mask)")
    result = run_pass(canonicalize, build(text, w=weights(4, 4), ratio=np.array(0.3, np.float32)))
    assert result.notes == ["Dropout 'drop' kept: its mask output is used"]
    assert ops(result.model)["Dropout"] == 1


def test_identity_removed_and_graph_output_names_kept() -> None:
    # i1, i2: a chain in the middle; i3: into a graph output, so Neg writes `y` itself;
    # i4: graph input -> graph output and i5: graph output -> graph output must stay;
    # i6: read inside an If branch (an outer-scope reference)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3] x, bool c) => (float[2, 3] y, float[2, 3] passthrough, float[2, 3] copy, float[2, 3] z) {
        [relu] r = Relu (x)
        [i1] a = Identity (r)
        [i2] b = Identity (a)
        [neg] n = Neg (b)
        [i3] y = Identity (n)
        [i4] passthrough = Identity (x)
        [i5] copy = Identity (y)
        [i6] e = Identity (r)
        [choose] z = If (c) <
            then_branch = t () => (float[2, 3] t_out) { t_out = Abs (e) },
            else_branch = f () => (float[2, 3] f_out) { f_out = Identity (e) }
        >
    }
    """
    model = build(text)
    result = run_pass(canonicalize, model)
    assert result.notes == ["removed 4 Identity nodes"]
    nodes = {n.name: n for n in result.model.graph.node}
    assert list(nodes) == ["relu", "neg", "i4", "i5", "choose"]
    assert (list(nodes["neg"].input), list(nodes["neg"].output)) == (["r"], ["y"])
    assert list(nodes["i5"].input) == ["y"]
    branches = {a.name: a.g for a in nodes["choose"].attribute}
    assert list(branches["then_branch"].node[0].input) == ["r"]
    assert list(branches["else_branch"].node[0].input) == ["r"]  # inside subgraphs: left alone but rewired
    assert [o.name for o in result.model.graph.output] == ["y", "passthrough", "copy", "z"]
    for c in (True, False):
        assert_same_outputs(model, result.model, feeds={"x": weights(2, 3), "c": np.array(c)})


CONV_AFFINE = """
<ir_version: 8, opset_import: ["" : 13]>
net (float[2, 3, 8, 8] x) => (float[2, 4, 8, 8] y) {
    [conv] c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    [scale] m = Mul (c, s)
    [shift] a = Add (t, m)
    [act] y = Relu (a)
}
"""


@pytest.mark.parametrize(
    "scale_shape, shift_shape", [((4, 1, 1), (1, 4, 1, 1)), ((), (4, 1, 1)), ((1, 4, 1, 1), (1,))]
)
@pytest.mark.parametrize("bias", [True, False])
def test_per_channel_mul_add_folded_into_conv(scale_shape, shift_shape, bias: bool) -> None:
    text = CONV_AFFINE if bias else CONV_AFFINE.replace("(x, w, b)", "(x, w)")
    extra = {"b": weights(4, seed=3)} if bias else {}
    scale, shift = weights(*scale_shape, seed=4), weights(*shift_shape, seed=5)
    model = build(text, w=weights(4, 3, 3, 3), s=scale, t=shift, **extra)
    result = run_pass(canonicalize, model)
    assert result.notes == ["folded 1 Mul node and 1 Add node with per-channel constants into Conv"]
    assert names_of(result.model) == [
        ("Conv", "conv", ["x", "w", "b" if bias else "conv/bias"], ["a"]),
        ("Relu", "act", ["a"], ["y"]),
    ]
    assert {t.name for t in result.model.graph.initializer} == {"w", "b" if bias else "conv/bias"}
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


def test_mul_only_adds_no_bias_and_shared_weight_is_copied() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[1, 3, 5, 5] x) => (float[1, 4, 5, 5] y, float[1, 4, 5, 5] z) {
        [conv1] c = Conv (x, w)
        [scale] y = Mul (s, c)
        [conv2] z = Conv (x, w)
    }
    """
    model = build(text, w=weights(4, 3, 1, 1), s=weights(4, 1, 1, seed=4))
    result = run_pass(canonicalize, model)
    assert names_of(result.model) == [("Conv", "conv1", ["x", "w/folded"], ["y"]), ("Conv", "conv2", ["x", "w"], ["z"])]
    np.testing.assert_array_equal(initializer(result.model, "w"), initializer(model, "w"))
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


def test_affine_not_folded_when_not_per_channel_or_output_shared() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3, 4, 4] x) => (float[2, 4, 4, 4] y, float[2, 4, 4, 4] z, float[2, 4, 4, 4] v) {
        [conv1] c1 = Conv <pads = [1, 1, 1, 1]> (x, w)
        [spatial] y = Mul (c1, full)
        [conv2] c2 = Conv <pads = [1, 1, 1, 1]> (x, w)
        [shift] z = Add (c2, t)
        [other] v = Relu (c2)
    }
    """
    model = build(text, w=weights(4, 3, 3, 3), full=weights(1, 4, 4, 4, seed=4), t=weights(4, 1, 1, seed=5))
    result = run_pass(canonicalize, model)
    assert not result.modified
    assert result.notes == [
        "Add 'shift' not folded into Conv 'conv2': its input also feeds other nodes or is a graph output"
    ]
    assert ops(result.model) == Counter(Conv=2, Mul=1, Add=1, Relu=1)


def test_per_column_mul_folded_into_gemm_and_conv_transpose() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[3, 8] x, float[1, 4, 5, 5] u) => (float[3, 5] y, float[1, 6, 11, 11] v) {
        [fc] g = Gemm <transB = 1, beta = 0.5> (x, wg, cg)
        [scale] y = Mul (g, s)
        [up] d = ConvTranspose <strides = [2, 2], group = 2> (u, wt)
        [shift] v = Add (d, t)
    }
    """
    model = build(text, wg=weights(5, 8), cg=weights(5, seed=3), s=weights(1, 5, seed=4),
                  wt=weights(4, 3, 3, 3, seed=5), t=weights(6, 1, 1, seed=6))
    result = run_pass(canonicalize, model)
    assert result.notes == [
        "folded 1 Mul node and 1 Add node with per-channel constants into ConvTranspose (1), Gemm (1)"
    ]
    assert ops(result.model) == Counter(Gemm=1, ConvTranspose=1)
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


def test_batchnorm_second_half_folded_then_batchnorm_into_conv() -> None:
    # the caffe2 export of densenet121 / inception_v2: BN with unit gamma, then Mul and Add
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3, 6, 6] x) => (float[2, 4, 6, 6] y, float[2, 3, 6, 6] z) {
        [conv] c = Conv (x, w)
        [bn] n = BatchNormalization (c, gamma, beta, mean, var)
        [scale] m = Mul (n, s)
        [shift] y = Add (m, t)
        [add] p = Add (x, x)
        [bn2] q = BatchNormalization (p, gamma3, beta3, mean3, var3)
        [shift2] z = Add (q, t3)
    }
    """
    three = {f"{k}3": v for k, v in bn_params(3, seed=8).items()}
    model = build(text, w=weights(4, 3, 1, 1), s=weights(4, 1, 1, seed=4), t=weights(4, 1, 1, seed=5),
                  t3=weights(1, 3, 1, 1, seed=6), **bn_params(4), **three)
    result = run_pass(canonicalize, model)
    assert result.notes == ["folded 1 Mul node and 2 Add nodes with per-channel constants into BatchNormalization"]
    assert_same_outputs(model, result.model, **BN_TOLERANCE)
    full = prepare(model)
    assert ops(full.model) == Counter(Conv=1, Add=1, BatchNormalization=1)  # bn2 follows an Add
    assert names_of(full.model)[0] == ("Conv", "conv", ["x", "w", "conv/bias"], ["y"])
    assert_same_outputs(model, full.model, **BN_TOLERANCE)


def test_dropout_between_conv_and_batchnorm_no_longer_blocks_folding() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 3, 6, 6] x) => (float[2, 4, 6, 6] y) {
        [conv] c = Conv (x, w, b)
        [drop] d = Dropout (c)
        [id] i = Identity (d)
        [bn] y = BatchNormalization (i, gamma, beta, mean, var)
    }
    """
    model = build(text, w=weights(4, 3, 3, 3), b=weights(4, seed=3), **bn_params(4))
    result = prepare(model)
    assert ops(result.model) == Counter(Conv=1)
    for note in ("removed 1 Dropout node (no-ops at inference)", "removed 1 Identity node",
                 "folded 1 BatchNormalization node into Conv"):
        assert note in result.notes
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


# ---------------------------------------------------------------- If subgraphs

IF_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
net (float[2, 3] x, bool c2) => (float[2, 3] y) {
    cond = Constant <value = bool {COND}> ()
    [choose] r = If (cond) <
        then_branch = then_graph () => (float[2, 3] then_out) {
            k = Constant <value = float {2.0}> ()
            t = Mul (x, k)
            then_out = Add (t, x)
        },
        else_branch = else_graph () => (float[2, 3] else_out) {
            else_out = Neg (x)
        }
    >
    [other] r2 = If (c2) <
        then_branch = a () => (float[2, 3] t) { t = Relu (x) },
        else_branch = b () => (float[2, 3] u) { u = Sigmoid (x) }
    >
    y = Add (r, r2)
}
"""


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_constant_condition_is_inlined(cond: bool) -> None:
    # both If nodes' then branches define `t`: once one is inlined, the other's would shadow
    # it, so the inlined one is renamed
    model = build(IF_MODEL.replace("COND", str(int(cond))))
    before = copy(model)
    model = fold_constants(model).model  # the condition becomes an initializer first
    result = run_pass(inline_constant_if, model)
    branch = "then_branch" if cond else "else_branch"
    assert result.notes[0] == f"inlined the {branch} of If 'choose' (its condition is constant {cond})"
    assert ops(result.model)["If"] == 1  # `other` has a run-time condition
    assert "If 'other' has a run-time condition: its branches stay float" in result.notes
    produced = [o for n in result.model.graph.node for o in n.output]
    assert "r" in produced and "t" not in produced
    if cond:
        assert "choose/t" in produced
        assert {t.name for t in result.model.graph.initializer} == {"k"}
    for c2 in (True, False):
        assert_same_outputs(before, result.model, feeds={"x": weights(2, 3), "c2": np.array(c2)})


def test_if_with_run_time_condition_is_left_alone() -> None:
    text = IF_MODEL.replace("cond = Constant <value = bool {COND}> ()", "").replace(
        "net (float[2, 3] x,", "net (float[2, 3] x, bool cond,"
    )
    model = build(text)
    result = prepare(model)
    assert "If 'choose' has a run-time condition: its branches stay float" in result.notes
    assert ops(result.model)["If"] == 2
    for cond in (True, False):
        feeds = {"x": weights(2, 3), "cond": np.array(cond), "c2": np.array(not cond)}
        assert_same_outputs(model, result.model, feeds=feeds)


def test_prepare_folds_inside_inlined_branches() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[1, 3, 6, 6] x) => (float[1, 4, 6, 6] y) {
        cond = Constant <value = bool {1}> ()
        [cond_if] y = If (cond) <
            then_branch = a () => (float[1, 4, 6, 6] ya) {
                [conv] c = Conv (x, w)
                [bn] ya = BatchNormalization (c, gamma, beta, mean, var)
            },
            else_branch = b () => (float[1, 4, 6, 6] yb) {
                [conv_else] yb = Conv (x, w)
            }
        >
    }
    """
    model = build(text, w=weights(4, 3, 1, 1), **bn_params(4))
    result = prepare(model)
    assert ops(result.model) == Counter(Conv=1)
    assert "folded 1 BatchNormalization node into Conv" in result.notes
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


# ---------------------------------------------------------------- guard

QDQ_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
net (float[2, 4] x) => (float[2, 4] y) {
    [q] q = QuantizeLinear (x, s, z)
    [dq] d = DequantizeLinear (q, s, z)
    y = Relu (d)
}
"""


def test_quantized_model_is_refused() -> None:
    model = build(QDQ_MODEL, s=np.array(0.1, np.float32), z=np.array(0, np.uint8))
    with pytest.raises(ModelError) as err:
        prepare(model)
    assert str(err.value) == (
        "the model is already quantized: it contains 1 DequantizeLinear and 1 QuantizeLinear nodes (first: 'q')"
    )
    assert err.value.hint == "pass the float model; --force quantizes it anyway"


def test_quantized_model_accepted_with_force() -> None:
    model = build(QDQ_MODEL, s=np.array(0.1, np.float32), z=np.array(0, np.uint8))
    result = prepare(model, force=True)
    assert result.notes[0] == (
        "the model is already quantized (1 DequantizeLinear and 1 QuantizeLinear nodes); going on because of --force"
    )
    assert ops(result.model) == Counter(QuantizeLinear=1, DequantizeLinear=1, Relu=1)
    assert_same_outputs(model, result.model)


def test_guard_finds_quantized_ops_in_subgraphs() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
    net (float[2, 4] x, bool c) => (float[2, 4] y) {
        y = If (c) <
            then_branch = a () => (float[2, 4] ya) { ya = Relu (x) },
            else_branch = b () => (float[2, 4] yb) { [qg] yb = com.microsoft.QGemm (x) }
        >
    }
    """
    model = build(text, check=False)
    with pytest.raises(ModelError, match=r"contains 1 QGemm node \(first: 'qg'\)"):
        refuse_quantized(model)
    assert refuse_quantized(model, Options(force=True)).notes == [
        "the model is already quantized (1 QGemm node); going on because of --force"
    ]


# ---------------------------------------------------------------- opset

OLD_OPSET_MODELS = {
    "opset 9: Upsample, BatchNormalization, Dropout": ("""
        <ir_version: 4, opset_import: ["" : 9]>
        net (float[1, 3, 5, 7] x) => (float[1, 3, 20, 28] y) {
            s = Constant <value = float[4] {1, 1, 2, 2}> ()
            u = Upsample <mode = "linear"> (x, s)
            d = Dropout <ratio = 0.3> (u)
            b = BatchNormalization (d, gamma, beta, mean, var)
            y = Upsample <mode = "nearest"> (b, s)
        }
        """, bn_params(3)),
    "opset 9: Scatter (ScatterElements at 11)": ("""
        <ir_version: 4, opset_import: ["" : 9]>
        net (float[2, 5] x) => (float[2, 5] y) {
            u = Slice <starts = [0], ends = [1], axes = [1]> (x)
            y = Scatter <axis = 1> (x, idx, u)
        }
        """, {"idx": np.array([[3], [1]], np.int64)}),
    "opset 10: Resize linear/nearest (up and down), Clip with min/max attributes": ("""
        <ir_version: 5, opset_import: ["" : 10]>
        net (float[1, 2, 6, 9] x) => (float[1, 2, 9, 13] up, float[1, 2, 2, 5] down) {
            c = Clip <min = -0.5, max = 0.8> (x)
            su = Constant <value = float[4] {1, 1, 1.5, 1.5}> ()
            up = Resize <mode = "nearest"> (c, su)
            sd = Constant <value = float[4] {1, 1, 0.6, 0.7}> ()
            r = Resize <mode = "linear"> (c, sd)
            down = Resize <mode = "nearest"> (r, su2)
            su2 = Constant <value = float[4] {1, 1, 0.9, 0.9}> ()
        }
        """, {}),
    "opset 11: Hardmax on a middle axis, Softmax, Dropout, Clip with inputs": ("""
        <ir_version: 6, opset_import: ["" : 11]>
        net (float[2, 3, 4] x) => (float[2, 3, 4] h, float[2, 3, 4] s) {
            lo = Constant <value = float {-0.2}> ()
            c = Clip (x, lo)
            d = Dropout (c)
            h = Hardmax <axis = 1> (d)
            s = Softmax <axis = 1> (d)
        }
        """, {}),
    "opset 12: Dropout with ratio input, Squeeze/Unsqueeze/ReduceSum axes": ("""
        <ir_version: 7, opset_import: ["" : 12]>
        net (float[2, 3, 4] x) => (float[2, 1, 3] y) {
            ratio = Constant <value = float {0.1}> ()
            d = Dropout (x, ratio)
            r = ReduceSum <axes = [2], keepdims = 1> (d)
            q = Squeeze <axes = [2]> (r)
            y = Unsqueeze <axes = [1]> (q)
        }
        """, {}),
}


@pytest.mark.parametrize("case", list(OLD_OPSET_MODELS))
def test_opset_upgrade_keeps_numerics(case: str) -> None:
    text, params = OLD_OPSET_MODELS[case]
    model = build(_sorted(text), **params)
    for i, node in enumerate(model.graph.node):
        node.name = f"node{i}"
    old = model.opset_import[0].version
    result = run_pass(upgrade_opset, model)
    assert result.modified and result.notes[0] == f"upgraded opset {old} -> 13"
    assert [(o.domain, o.version) for o in result.model.opset_import] == [("", 13)]
    assert 7 <= result.model.ir_version <= max_ir_version()
    assert "Upsample" not in ops(result.model)
    # node and tensor names survive (calibration and overrides refer to them)
    names = {n.name for n in result.model.graph.node}
    assert {n.name for n in model.graph.node} <= names
    produced = {o for n in result.model.graph.node for o in n.output}
    assert {o for n in model.graph.node for o in n.output} <= produced
    assert_same_outputs(model, result.model, rtol=1e-6, atol=1e-6)
    full = prepare(model)
    assert_same_outputs(model, full.model, **BN_TOLERANCE)


def test_resize_note_and_attributes() -> None:
    text, params = OLD_OPSET_MODELS["opset 10: Resize linear/nearest (up and down), Clip with min/max attributes"]
    result = run_pass(upgrade_opset, build(_sorted(text), **params))
    assert "kept the opset-10 meaning of 3 Resize/Upsample nodes (asymmetric coordinates, floor rounding), " \
        "which onnx's version converter drops" in result.notes
    modes = {
        n.output[0]: {a.name: a.s.decode() for a in n.attribute if a.type == onnx.AttributeProto.STRING}
        for n in result.model.graph.node if n.op_type == "Resize"
    }
    assert modes["up"]["nearest_mode"] == "floor" and modes["down"]["nearest_mode"] == "ceil"
    assert modes["r"]["coordinate_transformation_mode"] == "asymmetric"


def test_opset_13_and_newer_left_alone() -> None:
    model = build(CONV_BN, w=weights(4, 3, 3, 3), b=weights(4, seed=3), **bn_params(4))
    result = upgrade_opset(copy(model))
    assert not result.modified and result.notes == []
    assert result.model.SerializeToString() == model.SerializeToString()


def test_unknown_op_names_the_node() -> None:
    text = """
    <ir_version: 6, opset_import: ["" : 11]>
    net (float[2, 3] x) => (float[2, 3] y) {
        [ln] y = LayerNormalization (x)
    }
    """
    model = build(text, check=False)
    with pytest.raises(ModelError) as err:
        upgrade_opset(model)
    assert str(err.value) == (
        "cannot upgrade opset 11 -> 13: LayerNormalization 'ln' uses 'LayerNormalization', which is "
        "not a standard ONNX op at opset 11"
    )
    assert "re-export the model at opset 13 or newer" in err.value.hint


def test_converter_failure_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(model, version):
        raise RuntimeError(
            "/project/onnx/version_converter/convert.cc:101: convert_graph: Assertion `false` "
            "failed: No Adapter For Upsample from opset 9"
        )

    monkeypatch.setattr(onnx.version_converter, "convert_version", broken)
    text, params = OLD_OPSET_MODELS["opset 9: Upsample, BatchNormalization, Dropout"]
    with pytest.raises(ModelError) as err:
        upgrade_opset(build(_sorted(text), **params))
    assert str(err.value) == (
        "onnx's version converter failed on Upsample upgrading opset 9 -> 13: "
        "Assertion `false` failed: No Adapter For Upsample from opset 9"
    )
    assert err.value.hint.startswith("re-export the model at opset 13 or newer")


# ---------------------------------------------------------------- shapes

def test_shape_inference_fills_value_info() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[N, 3, 8, 8] x) => (float y) {
        c = Conv <pads = [1, 1, 1, 1]> (x, w)
        r = Relu (c)
        y = ReduceMean <keepdims = 0> (r)
    }
    """
    model = build(text, w=weights(4, 3, 3, 3))
    result = run_pass(infer_shapes, model)
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in result.model.graph.value_info
    }
    assert shapes == {"c": ["N", 4, 8, 8], "r": ["N", 4, 8, 8]}
    assert result.notes == ["shape inference typed 2 more tensors"]


def test_shape_inference_failure_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] something odd\nmore")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", broken)
    model = build(CONV_BN, w=weights(4, 3, 3, 3), b=weights(4, seed=3), **bn_params(4))
    result = infer_shapes(copy(model))
    assert not result.modified
    assert result.notes == [
        "shape inference failed ([ShapeInferenceError] something odd): later stages see fewer tensor types"
    ]
    assert result.model.SerializeToString() == model.SerializeToString()


# ---------------------------------------------------------------- prepare as a whole

def test_passes_are_listed_in_order() -> None:
    assert [p.__name__ for p in PASSES] == [
        "refuse_quantized", "inline_functions", "upgrade_opset", "fold_constants", "canonicalize", "fold_batchnorm",
        "inline_constant_if", "hoist_body_weights", "infer_shapes",
    ]


def test_caller_model_untouched_and_output_deterministic() -> None:
    model = build(IF_MODEL.replace("COND", "1"))
    model.opset_import[0].version = 11  # exercise the opset pass too
    model.ir_version = 6
    original = model.SerializeToString(deterministic=True)
    first = prepare(model).model.SerializeToString(deterministic=True)
    assert model.SerializeToString(deterministic=True) == original
    assert prepare(model).model.SerializeToString(deterministic=True) == first


def test_light_copy_leaves_big_weights_out() -> None:
    model = build(CONV_BN, w=weights(64, 3, 3, 3), b=weights(64, seed=3), **bn_params(64))
    light = light_copy(model, threshold=1024)
    assert light.left_out == ["w"] and light.added_inputs == ["w"]
    assert [t.name for t in light.model.graph.initializer] == ["b", "gamma", "beta", "mean", "var"]


# ---------------------------------------------------------------- model-zoo graphs

ZOO = sorted(p.stem for p in LIGHT_MODELS.glob("light_*.onnx"))


def _with_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """Expose the Softmax input too: with the zoo's constant weights every class gets 0.001,
    so the logits are what shows a numerical change."""
    last = model.graph.node[-1]
    if last.op_type == "Softmax":
        model.graph.output.append(onnx.ValueInfoProto(name=last.input[0]))
    return model


# Folded, these three hold 230-580 MB of weights: serialising, checking and loading them
# takes seconds each, and the float original needs its own session on top. Measured on 2
# cores, all nine with output comparison took 40-47 s, so these three are prepared, checked
# and loaded in onnxruntime only; the six others (up to 100 MB) also compare outputs.
LOAD_CHECK_ONLY = {"light_bvlc_alexnet", "light_zfnet512", "light_vgg19"}


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model(name: str) -> None:
    model = _with_logits(onnx.load(LIGHT_MODELS / f"{name}.onnx"))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 9)]
    result = prepare(model)
    out = result.model
    assert result.notes[0] == "upgraded opset 9 -> 13"
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert "ConstantOfShape" not in ops(out) and "Constant" not in ops(out)
    assert "BatchNormalization" not in ops(out) or name == "light_densenet121"  # BN after Concat
    assert not {"Sum", "Dropout", "Identity", "Mul"} & set(ops(out))  # canonicalized
    data = out.SerializeToString()
    onnx.checker.check_model(data)
    if name in LOAD_CHECK_ONLY:
        ort.InferenceSession(data, session_options(), providers=["CPUExecutionProvider"])
    else:
        assert_same_outputs(model, out, rtol=1e-3, atol=1e-6)


def test_zoo_prepare_is_deterministic() -> None:
    model = onnx.load(LIGHT_MODELS / "light_shufflenet.onnx")  # opset, folding, 49 BN folds
    first = prepare(model).model.SerializeToString(deterministic=True)
    assert prepare(model).model.SerializeToString(deterministic=True) == first


# ---------------------------------------------------------------- local functions

FUNCTIONS = """
<ir_version: 8, opset_import: ["" : 17, "mods" : 1]>
net (float[N, 8] x) => (float[N, 8] y) {
    [l1] a = mods.LinearLeaky <alpha = 0.1> (x, w)
    [l2] b = mods.LinearLeaky <alpha = 0.3> (a, w)
    [head] y = MatMul (b, w)
}
<domain: "mods", opset_import: ["" : 17]>
LinearLeaky <alpha> (x, w) => (y) {
    h = MatMul (x, w)
    y = LeakyRelu <alpha: float = @alpha> (h)
}
"""


def test_local_functions_are_inlined_with_names_from_their_calls() -> None:
    """Exported modules as local functions (export_modules_as_functions): calls of a custom
    domain that the quantizer would leave float whole. Inlined, each attribute reference takes
    its call's value, and the nodes are named after the call."""
    model = build(FUNCTIONS, w=weights(8, 8))
    result = run_pass(inline_functions, model)
    assert result.notes == ["inlined 2 calls of local functions (LinearLeaky x2)"]
    assert not result.model.functions
    names = [(n.op_type, n.name) for n in result.model.graph.node]
    assert names == [("MatMul", "l1/MatMul"), ("LeakyRelu", "l1/LeakyRelu"), ("MatMul", "l2/MatMul"),
                     ("LeakyRelu", "l2/LeakyRelu"), ("MatMul", "head")]
    alphas = [n.attribute[0].f for n in result.model.graph.node if n.op_type == "LeakyRelu"]
    assert alphas == pytest.approx([0.1, 0.3])
    assert_same_outputs(model, result.model)
    assert not run_pass(inline_functions, result.model).modified  # nothing left to do
    from qcli.config import Config
    from qcli.plan import make_plan

    plan = make_plan(prepare(model).model, Config())
    assert {d.name for d in plan.nodes if d.quantized} >= {"l1/MatMul", "l2/MatMul", "head"}


def test_a_malformed_function_call_is_a_clear_error() -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "mods" : 1]>
        net (float[N, 8] x) => (float[N, 8] y) {
            y = mods.F (x, x, x)
        }
        <domain: "mods", opset_import: ["" : 17]>
        F (a, b) => (y) {
            y = Add (a, b)
        }
    """)
    with pytest.raises(ModelError) as err:
        inline_functions(copy(model))
    assert err.value.message == ("cannot inline the model's local functions (F): Number of actual parameters "
                                 "cannot exceed number of formal parameters")


@pytest.mark.parametrize(
    "opset, reduce, expected",
    [
        (17, "ReduceMean <axes = [2, 3], keepdims = 0> (c)", {"GlobalAveragePool": 1, "Squeeze": 1}),
        (17, "ReduceMean <axes = [-1, -2]> (c)", {"GlobalAveragePool": 1}),
        (18, "ReduceMean <keepdims = 0> (c, axes)", {"GlobalAveragePool": 1, "Squeeze": 1}),
        (17, "ReduceMean <axes = [1, 2, 3]> (c)", {"ReduceMean": 1}),  # over channels too: a mean, not a pool
        (17, "ReduceMean <axes = [3]> (c)", {"ReduceMean": 1}),
        (17, "ReduceMean <axes = [2, 3]> (c)\n            d = Sub (c, m)", {"ReduceMean": 1, "Sub": 1}),  # a norm's mean
    ],
)
def test_a_reduce_mean_over_the_spatial_axes_is_a_global_average_pool(opset: int, reduce: str, expected: dict) -> None:
    """torch.export and Keras write a global average pool as ReduceMean over H, W: onnxruntime has
    an int8 GlobalAveragePool, and qcli keeps ReduceMean float (variance chains)."""
    axes = ", int64[2] axes = {2, 3}" if opset >= 18 else ""
    model = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[N, 3, 8, 8] x) => (float[N, ?] y) <float[4, 3, 3, 3] w = {{{", ".join(["0.1"] * 108)}}}{axes}> {{
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            [pool] m = {reduce}
            y = Flatten (m)
        }}
    """)
    if "Sub" in expected:
        model.graph.output.append(onnx.helper.make_tensor_value_info("d", onnx.TensorProto.FLOAT, ["N", 4, 8, 8]))
    result = run_pass(canonicalize, model)
    assert {op: n for op, n in ops(result.model).items() if op not in ("Conv", "Flatten")} == expected
    assert result.notes == [] or "GlobalAveragePool" in expected
    if "GlobalAveragePool" in expected:
        assert result.notes == ["rewrote 1 ReduceMean node over the spatial axes as GlobalAveragePool (onnxruntime's "
                                "int8 kernel)"]
        assert next(n.name for n in result.model.graph.node if n.op_type == "GlobalAveragePool") == "pool"
    assert_same_outputs(model, result.model, rtol=1e-6, atol=1e-6)


def test_a_spatial_reduce_mean_runs_as_int8_global_average_pool(cli, tmp_path: Path) -> None:
    """End to end: the pool between a Conv and a Gemm runs in onnxruntime's int8 kernel."""
    rng = np.random.default_rng(0)
    w, fc = rng.normal(0, 0.3, (8, 3, 3, 3)), rng.normal(0, 0.3, (8, 5))
    model = save(onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3, 8, 8] x) => (float[N, 5] y)
            <float[8, 3, 3, 3] w = {{{", ".join(f"{v:.4f}" for v in w.ravel())}}},
             float[8, 5] fc = {{{", ".join(f"{v:.4f}" for v in fc.ravel())}}}> {{
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            r = Relu (c)
            m = ReduceMean <axes = [2, 3], keepdims = 0> (r)
            y = MatMul (m, fc)
        }}
    """), tmp_path / "m.onnx")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(16):
        write_npz(data / f"{i}.npz", x=rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert cli("quantize", model, "-o", out, "--data", data, "--no-verify").exit_code == 0
    counts = fused_op_counts(out, tmp_path)
    assert counts["QLinearGlobalAveragePool"] == 1 and counts["QLinearConv"] == 1 and "ReduceMean" not in counts


def test_scales_and_shifts_fold_forward_into_the_conv_reading_them() -> None:
    """An activation's `/ 6`, per-channel scale and scalar shift before an unpadded grouped Conv
    fold into its weight and bias (PP-LCNetV3's blocks); a padded Conv takes a scale it reads
    directly (0 * s = 0 at the border) but not a shift, which stays with the scale before it."""
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    net (float[2, 4, 8, 8] x) => (float[2, 6, 8, 8] y, float[2, 4, 8, 8] z, float[2, 2, 8, 8] q) {
        [act] h = Relu (x)
        [div] d = Div (h, six)
        [scale] m = Mul (s, d)
        [shift] a = Add (m, t)
        [pointwise] y = Conv <group = 2> (a, w, b)
        [act2] g = Sigmoid (x)
        [scale2] n = Mul (g, s2)
        [shift2] e = Add (n, t2)
        [depthwise] z = Conv <pads = [1, 1, 1, 1], group = 4> (e, w2, b2)
        [scale3] k = Mul (g, s3)
        [padded] q = Conv <pads = [1, 1, 1, 1]> (k, w3)
    }
    """
    model = build(text, six=np.float32(6), s=weights(1, 4, 1, 1, seed=4), t=np.float32(0.7),
                  w=weights(6, 2, 1, 1), b=weights(6, seed=3), s2=weights(4, 1, 1, seed=5),
                  t2=weights(1, 4, 1, 1, seed=6), w2=weights(4, 1, 3, 3, seed=7), b2=weights(4, seed=8),
                  s3=weights(4, 1, 1, seed=9), w3=weights(2, 4, 3, 3, seed=10))
    result = run_pass(canonicalize, model)
    assert result.notes == ["folded 2 Mul nodes, 1 Div node, 1 Add node with per-channel constants into the Conv "
                            "reading them"]
    assert [(op, name, ins) for op, name, ins, _ in names_of(result.model)] == [
        ("Relu", "act", ["x"]), ("Conv", "pointwise", ["h", "w", "b"]), ("Sigmoid", "act2", ["x"]),
        ("Mul", "scale2", ["g", "s2"]), ("Add", "shift2", ["n", "t2"]), ("Conv", "depthwise", ["e", "w2", "b2"]),
        ("Conv", "padded", ["g", "w3"])]
    assert_same_outputs(model, result.model, **BN_TOLERANCE)


@pytest.mark.parametrize(
    "tail, rewritten",
    [
        ("a = Add (c, three)\n k = Clip (a, zero, six)\n p = Mul (c, k)\n y = Div (p, six)", True),
        ("a = Add (three, c)\n k = Clip (a, zero, six)\n p = Mul (k, c)\n y = Mul (p, sixth)", True),
        ("a = Add (c, three)\n k = Clip (a, zero, six)\n p = Mul (c, k)\n y = Div (p, three)", False),  # not / 6
        ("a = Add (c, six)\n k = Clip (a, zero, six)\n p = Mul (c, k)\n y = Div (p, six)", False),  # not + 3
        ("d = Relu (c)\n a = Add (d, three)\n k = Clip (a, zero, six)\n p = Mul (c, k)\n y = Div (p, six)",
         False),  # x + 3 of another tensor
    ],
)
def test_a_hardswish_written_out_becomes_a_hardsigmoid_gate(tail: str, rewritten: bool) -> None:
    """PaddleOCR's exports write HardSwish as x * Clip(x + 3, 0, 6) / 6: its Div stayed a float op
    between Q/DQ pairs, where x * HardSigmoid(x) quantizes to an integer Add and Mul."""
    model = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y)
            <float[4, 3, 3, 3] w = {{{", ".join(f"{v:.3f}" for v in np.linspace(-1, 1, 108))}}},
             float three = {{3.0}}, float zero = {{0.0}}, float six = {{6.0}}, float sixth = {{0.16666667}}> {{
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            {tail}
        }}
    """)
    result = run_pass(canonicalize, model)
    expected = {"Conv": 1, "HardSigmoid": 1, "Mul": 1} if rewritten else dict(ops(model))
    assert dict(ops(result.model)) == expected
    if rewritten:
        assert ("rewrote 1 HardSwish written out as x * Clip(x + 3, 0, 6) / 6 to x * HardSigmoid(x) (an integer "
                "Add and Mul once quantized)") in result.notes
        final = result.model.graph.node[-1]
        assert (final.op_type, final.output[0]) == ("Mul", "y")  # the graph output keeps its name
    assert_same_outputs(model, result.model, rtol=1e-5, atol=1e-5)


def test_a_body_s_own_weights_move_to_the_main_graph_and_compute_the_same() -> None:
    """qcli.prepare.hoist: a Loop body's Constant weight moves to a main-graph initializer under
    a fresh name the body reads from the outer scope; a small constant (a bias) stays; the
    model computes the same bits."""
    from qcli.prepare.hoist import hoist_body_weights

    model = parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    net (float[2, 32] x, int64 trips, bool cond) => (float[2, 32] z) {
        z = Loop (trips, cond, x) <body = g (int64 i, bool c, float[2, 32] s) => (bool c2, float[2, 32] s2) {
            w = Constant <value = float[32, 32] {W}> ()
            b = Constant <value = float[32] {B}> ()
            c2 = Identity (c)
            h = MatMul (s, w)
            s2 = Add (h, b)
        }>
    }""".replace("{W}", _values(1024, 1)).replace("{B}", _values(32, 2)))
    before = model.SerializeToString()
    result = hoist_body_weights(model)
    assert result.modified and result.notes == [
        "moved 1 weight(s) (0.00 MB) out of Loop/Scan/If bodies into the main graph, which the bodies read them "
        "from (stored like its weights)"]
    assert [t.name for t in model.graph.initializer] == ["w_1"]
    body = model.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node] == ["Constant", "Identity", "MatMul", "Add"]  # the bias stays
    assert body.node[2].input[1] == "w_1"
    onnx.checker.check_model(model)
    feeds = {"x": np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "trips": np.array(3, np.int64),
             "cond": np.array(True)}
    got, want = (ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
                 for m in (model.SerializeToString(), before))
    np.testing.assert_array_equal(got, want)
