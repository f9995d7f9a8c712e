"""Op families with state or subgraphs for the fuzzer's graphs: LSTM and GRU (directions,
layouts, initial states, which outputs are read), If (a constant or computed condition,
branches that read the outer graph and hold weights of their own) and Loop (a trip count, a
loop-carried tensor and a scan output)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

import fuzz_ops
from fuzz_graphs import BOOL, FLOAT, INT64, Builder, Family, T


def recurrent(b: Builder, x: T) -> None:
    op = b.choice(["LSTM", "GRU"])
    gates = 4 if op == "LSTM" else 3
    layout = 1 if b.opset >= 14 and b.rarely() else 0
    seq, batch, width = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    hidden = b.int(1, 4)
    direction = b.choice(["forward", "bidirectional", "reverse"])
    dirs = 2 if direction == "bidirectional" else 1
    inputs = [x.name, b.weight((dirs, gates * hidden, width), 0.3), b.weight((dirs, gates * hidden, hidden), 0.3)]
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if b.choice([True, True, False]):
        inputs.append(b.weight((dirs, 2 * gates * hidden), 0.3))
    if b.rarely():
        inputs += [""] * (5 - len(inputs)) + [b.weight(state, 0.3)]  # after B and sequence_lens
    attrs: dict = {"hidden_size": hidden}
    if direction != "forward" or b.rarely():
        attrs["direction"] = direction
    if layout:
        attrs["layout"] = 1
    if op == "GRU" and b.rarely():
        attrs["linear_before_reset"] = 1
    wanted = b.choice(["Y", "Y_h", "both"])
    count = 2 if op == "GRU" else 3
    names = [b.name(op.lower()) if (k == 0 and wanted != "Y_h") or (k == 1 and wanted != "Y") else ""
             for k in range(count)]
    while not names[-1]:
        names.pop()
    outs = b.node(op, inputs, names, **attrs)
    b.tag(f"{op} outputs={wanted}")
    if outs[0]:
        b.add(outs[0], (batch, seq, dirs, hidden) if layout else (seq, dirs, batch, hidden))
    if len(outs) > 1 and outs[1]:
        b.add(outs[1], state)


def _same_shape_step(b: Builder, x: T) -> T:
    """One node group that keeps x's shape, for subgraph bodies whose outputs must agree."""
    kind = b.choice(["activation", "scale", "matmul", "conv", "if"])
    if kind == "matmul" and x.rank >= 2:
        y = b.node("MatMul", [x.name, b.weight((x.shape[-1], x.shape[-1]))])[0]
    elif kind == "conv" and x.rank == 4:
        c = x.shape[1]
        y = b.node("Conv", [x.name, b.weight((c, c, 3, 3)), b.weight((c,))], pads=[1, 1, 1, 1])[0]
    elif kind == "scale":
        shape = tuple(d if b.choice([True, False]) else 1 for d in x.shape)
        y = b.node(b.choice(["Mul", "Add"]), [x.name, b.weight(shape)])[0]
    elif kind == "if" and b.depth < 2:
        return if_(b, x)
    else:
        before = len(b.live)
        fuzz_ops.activation(b, x)
        return b.live[before]
    return b.add(y, x.shape)


def _body(b: Builder, x: T, inputs: list[helper.ValueInfoProto], outputs: int = 1) -> tuple[object, list[str]]:
    """A subgraph: 1-2 same-shape steps from x per output (x: an outer tensor or a body input)."""
    sub = b.child()
    results = []
    for _ in range(outputs):
        t = x
        for _ in range(b.int(1, 2)):
            t = _same_shape_step(sub, t)
        results.append(t.name)
    if sub.inits:
        b.tag("subgraph initializers")
    outs = [helper.make_tensor_value_info(name, FLOAT, None) for name in results]
    return helper.make_graph(sub.nodes, b.name("body"), inputs, outs, sub.inits), results


def if_(b: Builder, x: T) -> T:
    if b.choice([True, False]):
        value = numpy_helper.from_array(np.asarray(b.choice([True, False])), b.name("cond"))
        cond = b.node("Constant", [], value=value)[0]
        b.tag("If cond=constant")
    else:
        mean = b.node("ReduceMean", [x.name], keepdims=0)[0]
        cond = b.node("Greater", [mean, fuzz_ops._scalar(b, 0.0)])[0]
        b.tag("If cond=computed")
    count = b.choice([1, 1, 2])
    then_branch, _ = _body(b, x, [], count)
    else_branch, _ = _body(b, x, [], count)
    outs = b.node("If", [cond], count, then_branch=then_branch, else_branch=else_branch)
    added = [b.add(name, x.shape) for name in outs]
    return added[0]


def loop(b: Builder, x: T) -> None:
    trips = b.int(1, 3)
    carried = b.name("v")
    inputs = [
        helper.make_tensor_value_info(b.name("i"), INT64, []),
        helper.make_tensor_value_info(b.name("cond_in"), BOOL, []),
        helper.make_tensor_value_info(carried, FLOAT, None),
    ]
    body, results = _body(b, T(carried, x.shape), inputs)
    cond_out = b.name("cond_out")
    body.node.append(helper.make_node("Identity", [inputs[1].name], [cond_out]))
    body.output.insert(0, helper.make_tensor_value_info(cond_out, BOOL, []))
    scan = b.choice([False, True])
    if scan:
        copy = b.name("scan")
        body.node.append(helper.make_node("Identity", [results[0]], [copy]))
        body.output.append(helper.make_tensor_value_info(copy, FLOAT, None))
    cond = ""
    if b.choice([True, False]):
        cond = b.node("Constant", [], value=numpy_helper.from_array(np.asarray(True), b.name("true")))[0]
    outs = b.node("Loop", [b.scalar_ints(trips), cond, x.name], 1 + scan, body=body)
    b.tag(f"Loop scan={scan}")
    b.add(outs[0], x.shape)
    if scan:
        b.add(outs[1], (trips, *x.shape))


FAMILIES = [
    Family("recurrent", lambda t: t.rank == 3, recurrent),
    Family("if", lambda t: True, if_),
    Family("loop", lambda t: True, loop),
]
