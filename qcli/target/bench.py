"""The micro-models `qcli target measure` times: one or a few nodes each, in float and in the
QDQ form qcli writes (which onnxruntime fuses into QLinearConv, QGemm, MatMulNBits, ...), at
shapes spanning what exported vision, speech and text models run at batch 1."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
F, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8

CONVS = [  # (cin, cout, size, kernel, group, stride)
    (3, 16, 112, 3, 1, 2), (16, 16, 56, 3, 1, 1), (32, 32, 56, 3, 1, 1), (64, 64, 28, 3, 1, 1),
    (128, 128, 14, 3, 1, 1), (256, 256, 7, 3, 1, 1), (32, 64, 112, 3, 1, 2), (64, 128, 56, 3, 1, 1),
    (8, 8, 32, 3, 1, 1), (16, 64, 56, 1, 1, 1), (64, 256, 28, 1, 1, 1), (256, 64, 28, 1, 1, 1),
    (512, 512, 7, 1, 1, 1), (96, 24, 56, 1, 1, 1), (8, 16, 16, 1, 1, 1), (32, 64, 80, 1, 1, 1),
    (128, 256, 20, 1, 1, 1), (48, 96, 40, 3, 1, 2), (3, 8, 320, 3, 1, 2), (256, 512, 14, 3, 1, 2),
    (16, 16, 112, 3, 16, 1), (64, 64, 56, 3, 64, 1), (128, 128, 28, 3, 128, 1), (256, 256, 14, 3, 256, 1),
    (512, 512, 7, 3, 512, 1), (32, 32, 16, 3, 32, 1), (96, 96, 56, 5, 96, 1), (64, 64, 56, 3, 64, 2),
    (256, 256, 28, 5, 256, 2), (32, 32, 160, 3, 32, 1), (8, 8, 48, 1, 1, 1), (8, 16, 48, 3, 1, 1),
    (16, 16, 24, 1, 1, 1), (8, 8, 96, 3, 8, 1), (3, 8, 96, 3, 1, 2), (16, 32, 24, 1, 1, 1), (24, 24, 48, 1, 1, 1),
    (16, 16, 48, 3, 16, 2), (48, 48, 12, 5, 48, 1), (4, 4, 64, 3, 1, 1),
    # large ones, as a spectrogram CNN or a 640x640 detector runs them: the MAC rate keeps rising
    (64, 128, 112, 3, 1, 1), (128, 64, 128, 3, 1, 1), (64, 64, 160, 3, 1, 1), (32, 32, 224, 3, 1, 1),
    (256, 256, 28, 3, 1, 1), (16, 32, 320, 3, 1, 2),
]
# convolutions with few or odd channels and long or flat kernels, as audio front ends (a CQT's
# 1x256 filters) and detector heads (one output channel) run them:
# (cin, cout, (h, w), (kh, kw), (sh, sw))
ODD_CONVS = [
    (1, 1, (1, 8192), (1, 256), (1, 2)), (1, 36, (1, 8192), (1, 256), (1, 64)), (8, 8, (32, 264), (3, 39), (1, 1)),
    (8, 1, (64, 128), (5, 5), (1, 1)), (32, 1, (64, 96), (7, 3), (1, 1)), (1, 32, (64, 192), (7, 7), (1, 3)),
    (3, 24, (64, 64), (3, 3), (1, 1)), (1, 8, (64, 64), (3, 3), (1, 1)), (33, 1, (64, 64), (3, 3), (1, 1)),
    (8, 24, (48, 48), (3, 3), (1, 1)), (20, 40, (32, 32), (3, 3), (1, 1)), (16, 1, (96, 96), (1, 1), (1, 1)),
    (64, 2, (40, 40), (3, 3), (1, 1)), (32, 4, (80, 80), (1, 1), (1, 1)), (16, 8, (56, 56), (3, 3), (2, 2)),
    (8, 8, (20, 400), (3, 9), (1, 1)), (1, 4, (1, 16000), (1, 64), (1, 4)), (24, 12, (28, 28), (5, 5), (1, 1)),
    (128, 1, (20, 20), (3, 3), (1, 1)), (2, 8, (128, 128), (3, 3), (2, 2)),
    # 2-D with input channels NCHWc does not block (plain Conv kernels, as narrow ones run), and
    # 1-D (a VAD's or speech model's Conv1d, which NCHWc never takes): (cin, cout, (l,), (k,), (s,))
    (33, 2, (32, 32), (3, 3), (1, 1)), (65, 1, (16, 16), (1, 1), (1, 1)), (128, 1, (1,), (1,), (1,)),
    (128, 1, (128,), (1,), (1,)), (64, 1, (256,), (3,), (1,)), (32, 2, (1000,), (5,), (1,)),
    (257, 4, (64,), (1,), (1,)), (16, 8, (4000,), (9,), (2,)), (129, 128, (4,), (3,), (1,)),
    (64, 64, (500,), (3,), (1,)),
]
ACTIVATIONS = (None, "HardSwish", "Relu")  # a float Conv's, fused into it by onnxruntime
MATMULS = [(1, 64, 64), (1, 256, 256), (1, 768, 768), (1, 1024, 4096), (8, 512, 512), (16, 768, 768),
           (64, 256, 1024), (128, 768, 768), (128, 768, 3072), (32, 128, 32), (4, 32, 16), (32768, 4, 4),
           (4096, 16, 16), (1024, 64, 64), (2048, 32, 128), (256, 256, 64), (64, 64, 64), (512, 128, 512),
           (8192, 8, 32), (16, 96, 96), (50, 512, 256), (256, 512, 1), (64, 128, 8), (1, 512, 2)]
# products of few rows on weights too many to stay in cache, as a decoder's decode step runs them:
# (rows, K, N), a chain of distinct weights [K, N], [N, K], ... of STREAM_BYTES in all
STREAMS = [(1, 1024, 1024), (1, 1024, 4096), (1, 4096, 1024), (4, 2048, 2048), (8, 1024, 1024), (1, 512, 2048)]
STREAM_BYTES = 256 << 20
RNNS = [(16, 32, 32), (50, 64, 64), (100, 128, 128), (30, 256, 256), (200, 64, 128), (10, 512, 256),
        (75, 256, 128), (120, 32, 64)]  # (steps, input, hidden)
ELEMENTS = [64, 1024, 16_384, 262_144, 2_097_152]
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Softmax", "Transpose", "Identity", "Sqrt", "Neg",
         "ReduceMean", "LayerNormalization", "MaxPool", "GlobalAveragePool", "Concat", "Resize"]
ROW_WISE = ("Softmax", "LayerNormalization", "ReduceMean")  # also timed on rows of 4 (a per-row cost)
UNARY_ATTRS: dict[str, dict[str, Any]] = {"Transpose": {"perm": [0, 2, 1]}, "Softmax": {"axis": -1},
                                          "MaxPool": {"kernel_shape": [2]},
               "LayerNormalization": {"axis": -1}, "Concat": {"axis": 1}, "ReduceMean": {"keepdims": 1}}
BINARY = ["Add", "Mul", "Div", "Sub"]


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


def _t(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _qdq(name: str, out: str, scale: float = 0.02) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`name` quantized to uint8 and back: a Q/DQ pair on an activation."""
    inits = [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.array(128, np.uint8), f"{name}_z")]
    return [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"),
            helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [out],
                             name=f"{name}_DQ")], inits


def _weight(name: str, w: np.ndarray, quantized: bool, axis: int = 0) -> tuple[list, list]:
    """A float weight, or an int8 per-channel one behind a DequantizeLinear."""
    if not quantized:
        return [], [numpy_helper.from_array(w.astype(np.float32), name)]
    shape = [1] * w.ndim
    shape[axis] = w.shape[axis]
    inits = [numpy_helper.from_array(np.clip(np.round(w * 100), -127, 127).astype(np.int8), f"{name}_i8"),
             numpy_helper.from_array(np.full(w.shape[axis], 0.01, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.zeros(w.shape[axis], np.int8), f"{name}_z")]
    return [helper.make_node("DequantizeLinear", [f"{name}_i8", f"{name}_s", f"{name}_z"], [name], axis=axis,
                             name=f"{name}_DQ")], inits


def _wrapped(core: list, inits: list, x: tuple[str, list[int]], y: tuple[str, list[int]], quantized: bool,
             float_out: bool = False):
    """`core` reading x and writing y, with Q/DQ pairs around both when `quantized` (around x
    alone with `float_out`: a MatMul then runs as MatMulIntegerToFloat)."""
    nodes = list(core)
    if quantized:
        qin, i1 = _qdq("x", "x_dq")
        qout, i2 = ([], []) if float_out else _qdq("y_f", "y")
        for n in nodes:
            n.input[:] = ["x_dq" if i == "x" else i for i in n.input]
            n.output[:] = [o if float_out or o != "y" else "y_f" for o in n.output]
        nodes, inits = qin + nodes + qout, inits + i1 + i2
    return _model(nodes, [_t("x", F, x[1])], [_t("y", F, y[1])], inits)


def suite(rng: np.random.Generator) -> Iterator[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    """(what, model, feeds) for every micro-model."""
    for quantized in (False, True):
        tag = "int8" if quantized else "float"
        squares = [(cin, cout, (size,) * 2, (k,) * 2, (stride,) * 2, group)
                   for cin, cout, size, k, group, stride in CONVS]
        for (cin, cout, size, k, stride, group), act in itertools.product(
                squares + [(*conv, 1) for conv in ODD_CONVS], ACTIVATIONS[:1 if quantized else 3]):
            yield _conv(rng, cin, cout, size, k, stride, group, act, quantized)
        for (m, kk, n), float_out in itertools.product(MATMULS, (False, True) if quantized else (False,)):
            wn, wi = _weight("w", rng.standard_normal((kk, n)).astype(np.float32) * 0.1, quantized, axis=1)
            mm = helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")
            yield (f"MatMul {m}x{kk}x{n} {tag}{' float out' if float_out else ''}",
                   _wrapped(wn + [mm], wi, ("x", [m, kk]), ("y", [m, n]), quantized, float_out), _feeds(rng, [m, kk]))
        yield from _blocks(rng, quantized)
    yield from _gemms(rng)
    yield from _streams(rng)
    yield from _dynamic(rng)
    yield from _rnns(rng)
    yield from _elementwise(rng)


def _conv(rng: np.random.Generator, cin: int, cout: int, size: tuple[int, ...], k: tuple[int, ...],
          stride: tuple[int, ...], group: int, act: str | None, quantized: bool):
    """(what, model, feeds) of one Conv, 2-D or 1-D (and its activation), padded by half its kernel."""
    w = rng.standard_normal((cout, cin // group, *k)).astype(np.float32) * 0.1
    wn, wi = _weight("w", w, quantized)
    pads = [kk // 2 for kk in k] * 2
    x = [1, cin, *size]
    y = [1, cout, *((n + 2 * (kk // 2) - kk) // s + 1 for n, kk, s in zip(size, k, stride, strict=True))]
    nodes = wn + [helper.make_node("Conv", ["x", "w"], ["c" if act else "y"], pads=pads, group=group,
                                   strides=list(stride), name="conv")]
    nodes += [helper.make_node(act, ["c"], ["y"], name="act")] if act else []
    shape = "x".join(map(str, k)) + "/" + "x".join(map(str, stride))
    return (f"Conv {cin}->{cout} {shape} g{group} @{'x'.join(map(str, size))} {act or ''} "
            f"{'int8' if quantized else 'float'}", _wrapped(nodes, wi, ("x", x), ("y", y), quantized), _feeds(rng, x))


BLOCKS = [(8, 96), (16, 56), (24, 40), (32, 28), (64, 14), (128, 7), (48, 24)]  # (channels, size)


def _blocks(rng: np.random.Generator, quantized: bool):
    """Two inverted-residual blocks (1x1 expand + HardSwish, 3x3 depthwise + Relu, 1x1 project,
    residual Add): kernels timed where a network runs them, after and before others (their data
    in cache, their Q/DQ fused with the neighbours'), not alone; in int8 every activation
    behind a Q/DQ pair."""
    for c, size in BLOCKS:
        nodes: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        x = "x"
        for b in range(2):
            shapes = {"e": (2 * c, c, 1, 1), "d": (2 * c, 1, 3, 3), "p": (c, 2 * c, 1, 1)}
            for name, dims in shapes.items():
                wn, wi = _weight(f"w{b}{name}", rng.standard_normal(dims).astype(np.float32) * 0.1, quantized)
                nodes, inits = nodes + wn, inits + wi
            nodes += [helper.make_node("Conv", [x, f"w{b}e"], [f"e{b}"], name=f"b{b}/expand"),
                      helper.make_node("HardSwish", [f"e{b}"], [f"h{b}"], name=f"b{b}/hswish"),
                      helper.make_node("Conv", [f"h{b}", f"w{b}d"], [f"d{b}"], group=2 * c, pads=[1] * 4,
                                       name=f"b{b}/dw"),
                      # a Relu before Q/DQ is folded into the range (as qcli writes it)
                      *([] if quantized else [helper.make_node("Relu", [f"d{b}"], [f"r{b}"], name=f"b{b}/relu")]),
                      helper.make_node("Conv", [f"d{b}" if quantized else f"r{b}", f"w{b}p"], [f"p{b}"],
                                       name=f"b{b}/project"),
                      helper.make_node("Add", [x, f"p{b}"], [f"o{b}" if b == 0 else "y"], name=f"b{b}/add")]
            x = f"o{b}"
        if quantized:
            nodes, inits = _all_qdq(nodes, inits)
        shape = [1, c, size, size]
        yield (f"blocks {c} @{size} {'int8' if quantized else 'float'}",
               _model(nodes, [_t("x", F, shape)], [_t("y", F, shape)], inits), _feeds(rng, shape))


def _all_qdq(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> tuple[list, list]:
    """Every activation (the input and each node's output) behind a Q/DQ pair, as a QDQ model
    quantizing the whole graph has them."""
    out: list[onnx.NodeProto] = []
    pairs, more = _qdq("x", "x_dq")
    out += pairs
    renamed = {"x": "x_dq"}
    for node in nodes:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        out.append(node)
        if node.op_type == "DequantizeLinear":
            continue
        for o in node.output:
            if o != "y":
                pairs, extra = _qdq(o, f"{o}_dq")
                out += pairs
                more += extra
                renamed[o] = f"{o}_dq"
    return out, inits + more


def _dynamic(rng: np.random.Generator):
    for m, kk, n in MATMULS:
        w = numpy_helper.from_array(np.clip(rng.integers(-127, 128, (kk, n)), -127, 127).astype(np.int8), "w")
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="x_quantizer"),
                 helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"], name="matmul"),
                 helper.make_node("Cast", ["acc"], ["accf"], to=F, name="cast"),
                 helper.make_node("Mul", ["accf", "xs"], ["y"], name="scale")]
        yield (f"MatMul {m}x{kk}x{n} dynamic", _model(nodes, [_t("x", F, [m, kk])], [_t("y", F, [m, n])], [w]),
               _feeds(rng, [m, kk]))


def _rnns(rng: np.random.Generator):
    for steps, size, hidden in RNNS:
        for op, gates in (("LSTM", 4), ("GRU", 3)):
            w = numpy_helper.from_array(rng.standard_normal((1, gates * hidden, size)).astype(np.float32) * 0.1, "W")
            r = numpy_helper.from_array(rng.standard_normal((1, gates * hidden, hidden)).astype(np.float32) * 0.1, "R")
            node = helper.make_node(op, ["x", "W", "R"], ["y"], hidden_size=hidden, name="rnn")
            yield (f"{op} {steps}x{size}->{hidden}", _model([node], [_t("x", F, [steps, 1, size])],
                                                            [_t("y", F, [steps, 1, 1, hidden])], [w, r]),
                   _feeds(rng, [steps, 1, size]))
        yield _dynamic_lstm(rng, steps, size, hidden)


def _dynamic_lstm(rng: np.random.Generator, steps: int, size: int, hidden: int):
    """com.microsoft DynamicQuantizeLSTM, as qcli.dynamic writes an LSTM: int8 W [1, I, 4H] and
    R [1, H, 4H], a scale per row."""
    inits = []
    for name, rows in (("W", size), ("R", hidden)):
        values = rng.integers(-127, 128, (1, rows, 4 * hidden)).astype(np.int8)
        inits += [numpy_helper.from_array(values, name),
                  numpy_helper.from_array(np.full((1, 4 * hidden), 0.001, np.float32), f"{name}_s"),
                  numpy_helper.from_array(np.zeros((1, 4 * hidden), np.int8), f"{name}_z")]
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "W", "R", "", "", "", "", "", "W_s", "W_z", "R_s", "R_z"],
                            ["y"], hidden_size=hidden, name="rnn", domain="com.microsoft")
    model = _model([node], [_t("x", F, [steps, 1, size])], [_t("y", F, [steps, 1, 1, hidden])], inits)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return f"DynamicQuantizeLSTM {steps}x{size}->{hidden}", model, _feeds(rng, [steps, 1, size])


def _elementwise(rng: np.random.Generator):
    for count in ELEMENTS:
        shape = [1, 16, count // 16] if count >= 16 else [1, count]
        for op in UNARY:
            for shaped in [shape, *([[1, count // 4, 4]] if op in ROW_WISE and count >= 16 else [])]:
                inputs, inits = _unary_inputs(op, shaped)
                node = helper.make_node(op, inputs, ["y"], name=op.lower(), **UNARY_ATTRS.get(op, {}))
                yield (f"{op} {shaped}", _model([node], [_t("x", F, shaped)], [_t("y", F, None)], inits),
                       _feeds(rng, shaped))
        # same shapes; broadcasting against the last axis, which onnxruntime loops over per row
        for a, b in [(shape, shape), ([1, count, 1], [1]), ([1, max(count // 8, 1), 8], [8])]:
            for op in BINARY:
                node = helper.make_node(op, ["x", "x2"], ["y"], name=op.lower())
                yield (f"{op} {a} {b}", _model([node], [_t("x", F, a), _t("x2", F, b)], [_t("y", F, a)], []),
                       {**_feeds(rng, a), "x2": _feeds(rng, b)["x"] + 2})
            yield from _quantized_binary(rng, a, b)
        qdq, inits = _qdq("x", "y")
        yield f"Q/DQ {count}", _model(qdq, [_t("x", F, shape)], [_t("y", F, shape)], inits), _feeds(rng, shape)
        yield from _quantized_elementwise(rng, count)


def _quantized_binary(rng: np.random.Generator, shape: list[int], other: list[int]):
    """QLinearAdd and QLinearMul (Add and Mul between Q/DQ pairs, which onnxruntime fuses)."""
    for op in ("Add", "Mul"):
        a, i1 = _qdq("x", "a")
        b, i2 = _qdq("x2", "b")
        out, i3 = _qdq("s", "y")
        nodes = a + b + [helper.make_node(op, ["a", "b"], ["s"], name=f"q{op.lower()}")] + out
        yield (f"QLinear{op} {shape} {other}",
               _model(nodes, [_t("x", F, shape), _t("x2", F, other)], [_t("y", F, shape)], i1 + i2 + i3),
               {**_feeds(rng, shape), "x2": _feeds(rng, other)["x"]})


def _quantized_elementwise(rng: np.random.Generator, count: int):
    """The uint8 forms of pooling, Resize and Concat (onnxruntime runs those on uint8
    directly), on a channels-last shape as its NHWC transformer leaves them, a channels-first
    one, and (Concat) rows of one element."""
    if count < 1024:
        return
    side = max(int(np.sqrt(count // 16)), 2)
    for spatial in ([1, 16, side, side], [1, side, side, 16], [1, count // 2, 2, 1]):
        for op in ("MaxPool", "Resize", "Concat") if spatial[-1] != 1 else ("Concat",):
            inputs, inits = _unary_inputs(op, spatial)
            attrs = {"kernel_shape": [2, 2], "strides": [2, 2]} if op == "MaxPool" else UNARY_ATTRS.get(op, {})
            attrs = {"axis": 3} if spatial[-1] == 1 else attrs  # a block per element
            if op == "Resize":
                inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
            q, i1 = _qdq("x", "xd")
            out, i2 = _qdq("o", "y")
            node = helper.make_node(op, ["xd" if i == "x" else i for i in inputs], ["o"], name=f"q{op.lower()}",
                                    **attrs)
            yield (f"uint8 {op} {spatial}", _model(q + [node] + out, [_t("x", F, spatial)], [_t("y", F, None)],
                                                   inits + i1 + i2), _feeds(rng, spatial))


def _unary_inputs(op: str, shape: list[int]) -> tuple[list[str], list[onnx.TensorProto]]:
    """The inputs of a one-input micro-model's node besides x, as constants."""
    if op == "Concat":
        return ["x", "x"], []
    if op == "LayerNormalization":
        return ["x", "g"], [numpy_helper.from_array(np.ones(shape[-1], np.float32), "g")]
    if op == "ReduceMean":
        return ["x", "axes"], [numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    if op == "Resize":
        scales = numpy_helper.from_array(np.array([1, 1, 2], np.float32), "scales")
        return ["x", "", "scales"], [scales]
    return ["x"], []


def _gemms(rng: np.random.Generator):
    """Gemm with a bias (QGemm in int8), and int4 block-wise weights (MatMulNBits)."""
    for m, kk, n in MATMULS:
        for quantized in (False, True):
            wn, wi = _weight("w", rng.standard_normal((n, kk)).astype(np.float32) * 0.1, quantized)
            bias = numpy_helper.from_array(np.zeros(n, np.float32), "b")
            gemm = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="gemm")
            yield (f"Gemm {m}x{kk}x{n} {'int8' if quantized else 'float'}",
                   _wrapped(wn + [gemm], wi + [bias], ("x", [m, kk]), ("y", [m, n]), quantized), _feeds(rng, [m, kk]))
        if kk % 32 == 0:
            w4 = helper.make_tensor("w_i4", TensorProto.INT4, [kk, n], rng.integers(-8, 8, kk * n).tolist())
            scales = numpy_helper.from_array(np.full((kk // 32, n), 0.01, np.float32), "w_s")
            nodes = [helper.make_node("DequantizeLinear", ["w_i4", "w_s"], ["w"], axis=0, block_size=32, name="w_DQ"),
                     helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")]
            yield (f"MatMul {m}x{kk}x{n} int4",
                   _model(nodes, [_t("x", F, [m, kk])], [_t("y", F, [m, n])], [w4, scales]),
                   _feeds(rng, [m, kk]))


def _streams(rng: np.random.Generator):
    """Chains of MatMuls on few rows (STREAMS) whose weights are read from memory each run, not
    cache: float, and int4 and int8 blocks of 32 (MatMulNBits), each STREAM_BYTES of weights."""
    for (m, kk, n), bits in itertools.product(STREAMS, (None, 4, 8)):
        layers = 2 * max(1, STREAM_BYTES * 8 // (2 * (bits or 32) * kk * n))
        nodes, inits, prev = [], [], "x"
        for i in range(layers):
            rows, cols = (kk, n) if i % 2 == 0 else (n, kk)
            out = "y" if i == layers - 1 else f"t{i}"
            if bits is None:
                w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.03
                inits.append(numpy_helper.from_array(w, f"w{i}"))
            else:
                inits += _blocks_of(rng, f"w{i}", rows, cols, bits)
                nodes.append(helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_s"], [f"w{i}"], axis=0,
                                              block_size=32, name=f"w{i}_DQ"))
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"matmul{i}"))
            prev = out
        yield (f"MatMul chain {m}x{kk}x{n} {'float' if bits is None else f'int{bits}'} x{layers}",
               _model(nodes, [_t("x", F, [m, kk])], [_t("y", F, [m, kk])], inits), _feeds(rng, [m, kk]))


def _blocks_of(rng: np.random.Generator, name: str, rows: int, cols: int, bits: int) -> list[onnx.TensorProto]:
    """A weight [rows, cols] of `bits`-bit integers (`name`_q) and its scales per block of 32
    rows (`name`_s)."""
    scales = numpy_helper.from_array(np.full((rows // 32, cols), 0.01, np.float32), f"{name}_s")
    if bits == 8:
        return [numpy_helper.from_array(rng.integers(-127, 128, (rows, cols)).astype(np.int8), f"{name}_q"), scales]
    nibbles = rng.integers(0, 16, rows * cols).astype(np.uint8)
    q = onnx.TensorProto(name=f"{name}_q", data_type=TensorProto.INT4, dims=[rows, cols],
                         raw_data=(nibbles[0::2] | nibbles[1::2] << 4).astype(np.uint8).tobytes())
    return [q, scales]


RECURRENT = ("LSTM", "GRU", "RNN", "DynamicQuantizeLSTM")  # their batch axis is the second


def batched(model: onnx.ModelProto, feeds: dict[str, np.ndarray], batch: int,
            ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A micro-model served at `batch`: the inputs of `x`'s rank `batch` times along the batch
    axis (a recurrence's second, every other op's first; a broadcast operand of lower rank
    stays), the outputs' shapes left to onnxruntime.

    >>> _, model, feeds = next(suite(np.random.default_rng(0)))
    >>> _, fed = batched(model, feeds, 4)
    >>> feeds["x"].shape, fed["x"].shape
    ((1, 3, 112, 112), (4, 3, 112, 112))
    """
    if batch == 1:
        return model, feeds
    model = onnx.ModelProto.FromString(model.SerializeToString())
    axis = 1 if any(n.op_type in RECURRENT for n in model.graph.node) else 0
    rank = feeds["x"].ndim
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if len(dims) == rank:
            dims[axis].dim_param = "batch"
    for value in model.graph.output:
        value.type.tensor_type.ClearField("shape")
    return model, {name: np.repeat(v, batch, axis=axis) if v.ndim == rank else v for name, v in feeds.items()}


def _feeds(rng: np.random.Generator, shape: list[int]) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(shape).astype(np.float32)}
