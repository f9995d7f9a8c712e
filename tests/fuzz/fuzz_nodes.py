"""Op families of the fuzzer's graphs that move data or carry state: Reshape (static and from
Shape), Transpose, Flatten, Concat, Slice, Squeeze/Unsqueeze, Split, Expand, Tile, Pad, Resize,
DepthToSpace/SpaceToDepth, Gather (on activations and as an embedding of an int64 input),
LSTM/GRU, and If/Loop with bodies that read the outer graph. Inputs that moved from attributes
to inputs across opsets 11-21 (axes, split, Clip bounds) are spelled as the drawn opset wants."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from onnx import numpy_helper

from fuzz_graphs import INT64, Builder, Family, Input, T

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


def _axes(b: Builder, axes: list[int], op: str, inputs: list[str], since: int, **attrs) -> str:
    """A node whose `axes` became an input at opset `since` (Squeeze, Unsqueeze: 13)."""
    if b.opset >= since:
        return b.node(op, [*inputs, b.ints(axes)], **attrs)[0]
    return b.node(op, inputs, axes=axes, **attrs)[0]


def _factor(b: Builder, total: int, rank: int) -> list[int]:
    dims = []
    for _ in range(rank - 1):
        d = b.choice([d for d in range(1, total + 1) if total % d == 0])
        dims.append(d)
        total //= d
    return [*dims, total]


def reshape(b: Builder, x: T) -> None:
    total = math.prod(x.shape)
    if b.choice([True, False]) and x.rank >= 2:  # keep the batch dim: 0 copies it
        dims = _factor(b, total // x.shape[0], b.int(1, 3))
        target, shape = [0, *dims], [x.shape[0], *dims]
    else:
        shape = _factor(b, total, b.int(1, 4))
        target = list(shape)
    if b.choice([True, False]):
        target[b.int(0, len(target) - 1)] = -1
    y = b.node("Reshape", [x.name, b.ints(target)])[0]
    b.add(y, shape)


def reshape_from_shape(b: Builder, x: T) -> None:
    """`Reshape(x, Concat(Shape(x)[:1], [-1]))`: PyTorch's flatten, batch-agnostic."""
    shape = b.node("Shape", [x.name])[0]
    if b.choice([True, False]):
        head = b.node("Slice", [shape, b.ints([0]), b.ints([1])])[0]
    else:
        index = b.node("Gather", [shape, b.scalar_ints(0)], axis=0)[0]
        head = _axes(b, [0], "Unsqueeze", [index], since=13)
    target = b.node("Concat", [head, b.ints([-1])], axis=0)[0]
    y = b.node("Reshape", [x.name, target])[0]
    b.add(y, (x.shape[0], math.prod(x.shape[1:])))


def transpose(b: Builder, x: T) -> None:
    if b.rarely():
        y = b.node("Transpose", [x.name])[0]
        b.add(y, x.shape[::-1])
        return
    perm = b.draw(st.permutations(range(x.rank)))
    y = b.node("Transpose", [x.name], perm=list(perm))[0]
    b.add(y, [x.shape[p] for p in perm])


def flatten(b: Builder, x: T) -> None:
    axis = b.int(-x.rank, x.rank)
    attrs = {} if axis == 1 and b.rarely() else {"axis": axis}
    y = b.node("Flatten", [x.name], **attrs)[0]
    cut = axis % x.rank if axis < 0 else axis
    b.add(y, (math.prod(x.shape[:cut]), math.prod(x.shape[cut:])))


def concat(b: Builder, x: T) -> None:
    axis = b.int(0, x.rank - 1)
    parts, size = [x.name], x.shape[axis]
    for _ in range(b.int(1, 2)):
        same = [t for t in b.live if t.rank == x.rank and all(
            d == e for i, (d, e) in enumerate(zip(t.shape, x.shape, strict=True)) if i != axis)]
        kind = b.choice(["self", "constant", "activation"])
        if kind == "activation" and same:
            t = b.choice(same)
            parts.append(t.name)
            size += t.shape[axis]
        elif kind == "constant":
            n = b.int(1, 3)
            parts.append(b.weight((*x.shape[:axis], n, *x.shape[axis + 1:])))
            size += n
        else:
            parts.append(x.name)
            size += x.shape[axis]
    y = b.node("Concat", parts, axis=axis - x.rank if b.rarely() else axis)[0]
    b.add(y, (*x.shape[:axis], size, *x.shape[axis + 1:]))


def _slice_length(d: int, start: int, end: int, step: int) -> int:
    start, end = start + d if start < 0 else start, end + d if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), d), min(max(end, 0), d)
        return max(0, math.ceil((end - start) / step))
    start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
    return max(0, math.ceil((start - end) / -step))


def slice_(b: Builder, x: T) -> None:
    axes = sorted(b.draw(st.sets(st.integers(0, x.rank - 1), min_size=1, max_size=2)))
    starts, ends, steps, shape = [], [], [], list(x.shape)
    for a in axes:
        d = x.shape[a]
        step = b.choice([1, 1, 2, -1])
        start = b.int(-d, d - 1)
        end = b.choice([b.int(-d, d), INT64_MAX if step > 0 else INT64_MIN])
        n = _slice_length(d, start, end, step)
        if n < 1:
            start, end, step, n = 0, d, 1, d
        starts.append(start)
        ends.append(end)
        steps.append(step)
        shape[a] = n
    inputs = [x.name, b.ints(starts), b.ints(ends)]
    if axes != list(range(len(axes))) or any(s != 1 for s in steps) or b.rarely():
        inputs.append(b.ints([a - x.rank if b.rarely() else a for a in axes]))
        if any(s != 1 for s in steps) or b.rarely():
            inputs.append(b.ints(steps))
    y = b.node("Slice", inputs)[0]
    b.add(y, shape)


def squeeze_unsqueeze(b: Builder, x: T) -> None:
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    if ones and x.rank > 1 and b.choice([True, False]):
        axes = ones[: b.int(1, min(len(ones), x.rank - 1))]
        y = _axes(b, axes, "Squeeze", [x.name], since=13)
        b.add(y, [d for i, d in enumerate(x.shape) if i not in axes])
        return
    axes = sorted(b.draw(st.sets(st.integers(0, x.rank), min_size=1, max_size=min(2, 5 - x.rank))))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    y = _axes(b, axes, "Unsqueeze", [x.name], since=13)
    b.add(y, shape)


def split(b: Builder, x: T) -> None:
    axis = b.choice([a for a, d in enumerate(x.shape) if d >= 2])
    d = x.shape[axis]
    parts = b.choice([k for k in range(2, min(d, 3) + 1) if d % k == 0] or [0])
    if parts and b.choice([True, False]):
        sizes = [d // parts] * parts
        attrs = {"num_outputs": parts} if b.opset >= 18 else {}
        outs = b.node("Split", [x.name], parts, axis=axis, **attrs)
    else:
        first = b.int(1, d - 1)
        sizes = [first, d - first]
        if b.opset >= 13:
            outs = b.node("Split", [x.name, b.ints(sizes)], 2, axis=axis)
        else:
            outs = b.node("Split", [x.name], 2, axis=axis, split=sizes)
    for name, size in zip(outs, sizes, strict=True):
        b.add(name, (*x.shape[:axis], size, *x.shape[axis + 1:]))


def expand_tile(b: Builder, x: T) -> None:
    if b.choice([True, False]):
        target = [b.int(1, 3) if d == 1 else d for d in x.shape]
        if b.rarely():
            target.insert(0, 2)
        y = b.node("Expand", [x.name, b.ints(target)])[0]
        b.add(y, np.broadcast_shapes(x.shape, tuple(target)))
        return
    repeats = [b.choice([1, 1, 2]) for _ in x.shape]
    y = b.node("Tile", [x.name, b.ints(repeats)])[0]
    b.add(y, [d * r for d, r in zip(x.shape, repeats, strict=True)])


def pad_resize(b: Builder, x: T) -> None:
    if b.choice([True, False]):
        mode = b.choice(["constant", "reflect", "edge"])
        pads = [0, 0] + [b.int(0, 1 if mode != "reflect" else min(1, d - 1)) for d in x.shape[2:]]
        pads = pads + [0, 0] + [b.int(0, 1 if mode != "reflect" else min(1, d - 1)) for d in x.shape[2:]]
        y = b.node("Pad", [x.name, b.ints(pads)], mode=mode)[0]
        b.add(y, [d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape)])
        return
    scales = np.asarray([1, 1] + [b.choice([2.0, 1.0]) for _ in x.shape[2:]], np.float32)
    name = b.name("scales")
    b.inits.append(numpy_helper.from_array(scales, name))
    roi = ""
    if b.opset < 13:
        roi = b.name("roi")
        b.inits.append(numpy_helper.from_array(np.zeros(0, np.float32), roi))
    mode = b.choice(["nearest", "linear"])
    y = b.node("Resize", [x.name, roi, name], mode=mode)[0]
    b.add(y, [int(d * s) for d, s in zip(x.shape, scales, strict=True)])


def depth_space(b: Builder, x: T) -> None:
    c, h, w = x.shape[1:]
    if c % 4 == 0 and (b.choice([True, False]) or h % 2 or w % 2):
        y = b.node("DepthToSpace", [x.name], blocksize=2, mode=b.choice(["DCR", "CRD"]))[0]
        b.add(y, (x.shape[0], c // 4, h * 2, w * 2))
    else:
        y = b.node("SpaceToDepth", [x.name], blocksize=2)[0]
        b.add(y, (x.shape[0], c * 4, h // 2, w // 2))


def gather(b: Builder, x: T) -> None:
    axis = b.int(0, x.rank - 1)
    d = x.shape[axis]
    if x.rank >= 2 and b.choice([True, False]):
        indices = np.asarray(b.int(-d, d - 1), np.int64)
    else:
        indices = np.asarray([b.int(-d, d - 1) for _ in range(b.int(1, 3))], np.int64)
    name = b.name("indices")
    b.inits.append(numpy_helper.from_array(indices, name))
    y = b.node("Gather", [x.name, name], axis=axis)[0]
    b.add(y, (*x.shape[:axis], *indices.shape, *x.shape[axis + 1:]))


def embedding(b: Builder, x: T) -> None:
    """A table Gathered by a new int64 input [batch, S]: the input qcli must feed integers."""
    batch = b.inputs[0].shape[0] if b.inputs else x.shape[0]
    vocab, width, seq = b.int(2, 12), b.int(1, 8), b.int(1, 4)
    ids = f"ids{len(b.inputs)}"
    b.inputs.append(Input(ids, (batch, seq), INT64, high=vocab))
    y = b.node("Gather", [b.weight((vocab, width)), ids], axis=0)[0]
    b.tag("embedding input")
    b.add(y, (batch, seq, width))


def constant(b: Builder, x: T) -> None:
    """A Constant or ConstantOfShape the graph computes with like an activation (or returns):
    constant folding's input, and a graph output that is a constant."""
    shape = x.shape if b.choice([True, False]) else tuple(b.int(1, 4) for _ in range(b.int(1, 3)))
    if b.choice([True, False]):
        value = numpy_helper.from_array(b.values(shape), b.name("value"))
        y = b.node("Constant", [], value=value)[0]
    else:
        fill = numpy_helper.from_array(b.values((1,)))
        y = b.node("ConstantOfShape", [b.ints(shape)], value=fill)[0]
    b.tag("constant activation")
    b.add(y, shape)


FAMILIES = [
    Family("reshape", lambda t: True, reshape),
    Family("reshape_from_shape", lambda t: t.rank >= 2, reshape_from_shape),
    Family("transpose", lambda t: t.rank >= 2, transpose),
    Family("flatten", lambda t: t.rank >= 1, flatten),
    Family("concat", lambda t: t.rank >= 1, concat),
    Family("slice", lambda t: t.rank >= 1, slice_),
    Family("squeeze", lambda t: t.rank <= 4, squeeze_unsqueeze),
    Family("split", lambda t: any(d >= 2 for d in t.shape), split),
    Family("expand_tile", lambda t: t.rank >= 1, expand_tile),
    Family("pad_resize", lambda t: t.rank in (3, 4), pad_resize),
    Family("depth_space", lambda t: t.rank == 4 and (t.shape[1] % 4 == 0 or t.shape[2] % 2 == t.shape[3] % 2 == 0),
           depth_space),
    Family("gather", lambda t: t.rank >= 1, gather),
    Family("embedding", lambda t: True, embedding),
    Family("constant", lambda t: True, constant),
]
