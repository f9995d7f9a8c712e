"""Op families of compute ops for the fuzzer's graphs: Conv/ConvTranspose (groups, pads,
strides, dilations, auto_pad), MatMul (2-D, batched and 1-D weights, activation x activation),
Gemm (transA/transB, alpha/beta, every bias shape), elementwise ops with broadcasting, the
activations, pooling, ReduceMean and the normalizations. Each computes its output shape."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from onnx import numpy_helper

from fuzz_graphs import Builder, Family, T


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _window(b: Builder, size: int, stride: int, dilation: int, kernel: int) -> tuple[list[int], int]:
    """Begin/end pads (< the dilated kernel) and the output length of a sliding window."""
    span = (kernel - 1) * dilation + 1
    pads = [b.int(0, min(2, span - 1)), b.int(0, min(2, span - 1))]
    if size + sum(pads) < span:
        pads = [span - 1, span - 1] if span - 1 <= 2 else pads
    return pads, (size + sum(pads) - span) // stride + 1


def _conv_geometry(b: Builder, spatial: tuple[int, ...], node: dict) -> list[int]:
    """Kernel, strides, dilations and padding of a Conv (into `node`); its output spatial dims."""
    auto_pad = b.choice(["NOTSET", "NOTSET", "SAME_UPPER", "VALID", "SAME_LOWER"])
    axes = []  # (kernel, stride, dilation, [pad begin, pad end], output size) per spatial axis
    for size in spatial:
        k, s, d, p = b.int(1, 3), b.choice([1, 1, 2]), b.choice([1, 1, 2]), [0, 0]
        if auto_pad == "VALID" and (k - 1) * d + 1 > size:
            k, d = 1, 1
        if auto_pad.startswith("SAME"):  # onnxruntime: no dilations with SAME_*
            d = 1
        if auto_pad == "NOTSET":
            p, n = _window(b, size, s, d, k)
            if n < 1:
                k, d, p, n = 1, 1, [0, 0], (size - 1) // s + 1
        elif auto_pad == "VALID":
            n = (size - (k - 1) * d - 1) // s + 1
        else:
            n = math.ceil(size / s)
        axes.append((k, s, d, p, n))
    node.update(kernel_shape=[a[0] for a in axes], strides=[a[1] for a in axes], dilations=[a[2] for a in axes])
    if auto_pad == "NOTSET":
        node["pads"] = [a[3][0] for a in axes] + [a[3][1] for a in axes]
    else:
        node["auto_pad"] = auto_pad
    return [a[4] for a in axes]


def conv(b: Builder, x: T) -> None:
    channels = x.shape[1]
    group = b.choice(_divisors(channels))
    out_channels = group * b.int(1, 3)
    attrs: dict = {"group": group} if group > 1 or b.rarely() else {}
    spatial = _conv_geometry(b, x.shape[2:], attrs)
    w = b.weight((out_channels, channels // group, *attrs["kernel_shape"]))
    bias = [b.weight((out_channels,))] if b.choice([True, True, False]) else []
    y = b.node("Conv", [x.name, w, *bias], **attrs)[0]
    b.add(y, (x.shape[0], out_channels, *spatial))


def conv_transpose(b: Builder, x: T) -> None:
    channels = x.shape[1]
    group = b.choice(_divisors(channels))
    per_group = b.int(1, 3)
    axes = []  # (kernel, stride, [pad begin, pad end], output padding, output size) per spatial axis
    for size in x.shape[2:]:
        k, s = b.int(1, 3), b.choice([1, 2])
        p, o = [b.int(0, k - 1), b.int(0, k - 1)], b.int(0, s - 1)
        n = s * (size - 1) + o + k - sum(p)
        if n < 1:
            p, n = [0, 0], s * (size - 1) + o + k
        axes.append((k, s, p, o, n))
    kernel = [a[0] for a in axes]
    attrs: dict = {"kernel_shape": kernel, "strides": [a[1] for a in axes],
                   "pads": [a[2][0] for a in axes] + [a[2][1] for a in axes]}
    if group > 1 or b.rarely():
        attrs["group"] = group
    if any(a[3] for a in axes):
        attrs["output_padding"] = [a[3] for a in axes]
    w = b.weight((channels, per_group, *kernel))
    bias = [b.weight((group * per_group,))] if b.choice([True, False]) else []
    y = b.node("ConvTranspose", [x.name, w, *bias], **attrs)[0]
    b.add(y, (x.shape[0], group * per_group, *[a[4] for a in axes]))


def matmul(b: Builder, x: T) -> None:
    k, n = x.shape[-1], b.int(1, 8)
    kind = b.choice(["weight", "weight", "batched", "activations", "vector"])
    if kind == "batched" and x.rank >= 3:
        lead = tuple(b.choice([d, 1]) for d in x.shape[-3:-2])
        w = b.weight((*lead, k, n))
        b.tag(f"MatMul weight rank {len(lead) + 2}")
        out = (*x.shape[:-1], n)
    elif kind == "batched":  # a weight of higher rank than x broadcasts x over its batch
        d = b.int(1, 3)
        w = b.weight((d, k, n))
        b.tag("MatMul weight rank 3")
        out = (d, *x.shape[:-1], n)
    elif kind == "activations":  # x @ x^T, as attention scores
        perm = [*range(x.rank - 2), x.rank - 1, x.rank - 2]
        w = b.node("Transpose", [x.name], perm=perm)[0]
        out = (*x.shape[:-1], x.shape[-2])
    elif kind == "vector" and x.rank >= 3:
        w = b.weight((k,))
        b.tag("MatMul weight rank 1")
        out = x.shape[:-1]
    else:
        w = b.weight((k, n))
        out = (*x.shape[:-1], n)
    y = b.node("MatMul", [x.name, w])[0]
    b.add(y, out)


GEMM_BIAS = ("none", "[N]", "[1, N]", "[M, N]", "[M, 1]", "[1]", "[]")


def gemm(b: Builder, x: T) -> None:
    trans_a, trans_b = b.rarely(), b.choice([True, False])
    m, k = (x.shape[1], x.shape[0]) if trans_a else x.shape
    n = b.int(1, 8)
    w = b.weight((n, k) if trans_b else (k, n))
    bias = b.choice(GEMM_BIAS)
    shape = {"[N]": (n,), "[1, N]": (1, n), "[M, N]": (m, n), "[M, 1]": (m, 1), "[1]": (1,), "[]": ()}.get(bias)
    inputs = [x.name, w] + ([] if shape is None else [b.weight(shape)])
    attrs = {}
    for key, flag in (("transA", trans_a), ("transB", trans_b)):
        if flag or b.rarely():
            attrs[key] = int(flag)
    for key in ("alpha", "beta"):
        if b.rarely():
            attrs[key] = b.choice([0.5, 2.0, -1.0, 0.0])
    b.tag(f"Gemm C={bias}")
    y = b.node("Gemm", inputs, **attrs)[0]
    b.add(y, (m, n))


def _broadcast_shape(b: Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against `shape`: some dims 1, leading dims dropped, a scalar,
    or (rarely) one more leading dim, which grows the result."""
    kind = b.choice(["same", "ones", "suffix", "scalar", "grow"])
    if kind == "ones":
        return tuple(d if b.choice([True, False]) else 1 for d in shape)
    if kind == "suffix":
        return shape[b.int(1, len(shape)):]
    if kind == "scalar":
        return ()
    if kind == "grow":
        return (b.int(2, 3), *shape)
    return shape


def elementwise(b: Builder, x: T) -> None:
    op = b.choice(["Add", "Mul", "Add", "Sub", "Div", "Mul"])
    other_kind = b.choice(["constant", "activation", "self"])
    partners = [t for t in b.live if t != x and _broadcasts(t.shape, x.shape)]
    if other_kind == "self" and op != "Div":
        other, shape = x.name, x.shape
        b.tag(f"{op}(x, x)")
    elif other_kind == "activation" and partners and op != "Div":
        partner = b.choice(partners)
        other, shape = partner.name, partner.shape
    else:
        shape = _broadcast_shape(b, x.shape)
        other = b.weight(shape, away_from_zero=op == "Div")
    inputs = [x.name, other] if op == "Div" or b.choice([True, True, False]) else [other, x.name]
    y = b.node(op, inputs)[0]
    b.add(y, np.broadcast_shapes(x.shape, shape))


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def activation(b: Builder, x: T) -> None:
    op = b.choice(["Relu", "Sigmoid", "Clip", "Relu", "Tanh", "LeakyRelu", "Clip", "Exp", "Erf", "Sqrt", "HardSigmoid"])
    inputs, attrs = [x.name], {}
    if op == "Clip":
        low, high = b.choice([(0.0, 6.0), (-1.0, 1.0), (None, 1.0), (0.0, None), (None, None)])
        if low is None and b.rarely():  # a bound computed from the data: the Clip cannot fold
            inputs.append(b.node("ReduceMin", [x.name], keepdims=0)[0])
            b.tag("Clip computed bound")
        else:
            inputs.append(_scalar(b, low))
        inputs.append(_scalar(b, high))
        while inputs and not inputs[-1]:
            inputs.pop()
        inputs = inputs or [x.name]
    elif op == "LeakyRelu" and b.rarely():
        attrs["alpha"] = b.choice([0.1, 0.2])
    elif op == "Sqrt":  # of |x|
        inputs = [b.node("Abs", [x.name])[0]]
    elif op == "Exp":  # of x clipped: no overflow
        inputs = [b.node("Tanh", [x.name])[0]]
    y = b.node(op, inputs, **attrs)[0]
    b.add(y, x.shape)


def _scalar(b: Builder, value: float | None) -> str:
    if value is None:
        return ""
    name = b.name("bound")
    b.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return name


def softmax(b: Builder, x: T) -> None:
    axis = b.int(-x.rank, x.rank - 1)
    attrs = {"axis": axis} if b.opset >= 13 or axis != 1 else {}
    op = b.choice(["Softmax", "Softmax", "LogSoftmax"])
    y = b.node(op, [x.name], **attrs)[0]
    b.add(y, x.shape)


def pool(b: Builder, x: T) -> None:
    op = b.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if op.startswith("Global"):
        y = b.node(op, [x.name])[0]
        b.add(y, (*x.shape[:2], *[1] * (x.rank - 2)))
        return
    kernel, strides, pads, spatial = [], [], [], []
    for size in x.shape[2:]:
        k = b.int(1, min(3, size))
        s = b.choice([1, 2, k])
        p = [b.int(0, k - 1), b.int(0, k - 1)] if b.rarely() else [0, 0]
        kernel.append(k)
        strides.append(s)
        pads.append(p)
        spatial.append((size + sum(p) - k) // s + 1)
    attrs: dict = {"kernel_shape": kernel, "strides": strides}
    if any(any(p) for p in pads):
        attrs["pads"] = [p[0] for p in pads] + [p[1] for p in pads]
        if op == "AveragePool" and b.rarely():
            attrs["count_include_pad"] = 1
    y = b.node(op, [x.name], **attrs)[0]
    b.add(y, (*x.shape[:2], *spatial))


def reduce_mean(b: Builder, x: T) -> None:
    axes = sorted(b.draw(st.sets(st.integers(0, x.rank - 1), min_size=1, max_size=x.rank)))
    keep = b.choice([1, 0])
    if not keep and len(axes) == x.rank:
        axes = axes[1:] or [x.rank - 1]
        keep = int(len(axes) == x.rank)
    signed = [a - x.rank if b.rarely() else a for a in axes]
    attrs: dict = {} if keep and b.choice([True, False]) else {"keepdims": keep}
    op = b.choice(["ReduceMean", "ReduceMean", "ReduceMax", "ReduceSum"])
    axes_as_input = b.opset >= 18 if op != "ReduceSum" else b.opset >= 13
    if axes_as_input:
        y = b.node(op, [x.name, b.ints(signed)], **attrs)[0]
    else:
        y = b.node(op, [x.name], axes=signed, **attrs)[0]
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else [
        d for i, d in enumerate(x.shape) if i not in axes]
    b.add(y, shape)


def normalization(b: Builder, x: T) -> None:
    op = b.choice(["BatchNormalization", "BatchNormalization", "InstanceNormalization", "LayerNormalization"])
    channels = x.shape[1]
    if op == "LayerNormalization" and b.opset >= 17:
        axis = b.int(1, x.rank - 1)
        shape = x.shape[axis:]
        inputs = [x.name, b.weight(shape, positive=True), b.weight(shape)]
        y = b.node(op, inputs, axis=axis)[0]
    elif op == "InstanceNormalization" and x.rank >= 3:
        y = b.node(op, [x.name, b.weight((channels,), positive=True), b.weight((channels,))])[0]
    else:
        stats = [b.weight((channels,), positive=True), b.weight((channels,)), b.weight((channels,)),
                 b.weight((channels,), positive=True)]
        y = b.node("BatchNormalization", [x.name, *stats], epsilon=b.choice([1e-5, 1e-3]))[0]
    b.add(y, x.shape)


FAMILIES = [
    Family("conv", lambda t: t.rank in (3, 4), conv),
    Family("conv_transpose", lambda t: t.rank in (3, 4), conv_transpose),
    Family("matmul", lambda t: t.rank >= 2, matmul),
    Family("gemm", lambda t: t.rank == 2, gemm),
    Family("elementwise", lambda t: t.rank >= 1, elementwise),
    Family("activation", lambda t: True, activation),
    Family("softmax", lambda t: t.rank >= 1, softmax),
    Family("pool", lambda t: t.rank in (3, 4), pool),
    Family("reduce", lambda t: t.rank >= 1, reduce_mean),
    Family("normalization", lambda t: t.rank >= 2, normalization),
]
