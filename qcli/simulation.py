"""The simulation: one float graph in which every quantization the search switches is emulated
behind a switch, loaded in one onnxruntime session; a trial feeds switches and scales and runs
(no model built, no session loaded). docs/guides/mixed-precision.md says the same for users.

Built once per search from the prepared graph and its all-int8 plan (`Simulation.of`):
- each reader of an activation the plan quantizes reads it through a chain: y = clip(round(t /
  s), lo, hi) x s, what a QuantizeLinear/DequantizeLinear pair computes in float (lo and hi: the
  integer range less the zero point), its s, lo and hi fed (`qsim.scale`, `qsim.low`,
  `qsim.high`: one row per chain), so any candidate's ranges (every fold's) and 8- or 16-bit
  types fit. A reader that reads the tensor unquantized gets the identity row (s = 2**-60, no
  bounds: x / s and y x s are exact, and x / s is whole for |x| >= 2**-37; below that y is within
  2**-61 of x). One chain per reader: a node promoted to float reads its inputs unquantized
  while the other readers of the same tensor read them quantized, as in the real model. (A
  switch selecting the pair's output, Where, cost more than the whole chain.) The input of a
  Relu/Clip folded into its producer gets chains too: promoting the producer unfolds it. An
  embedding table quantized with its group's scale (`Group.constant`) is read through chains
  alike;
- each weight (and an int8 embedding table's, the `gather` form) is held as its quantized
  values, dequantized (the very values the build writes), and each reader reads it or the float
  one by a switch (`qsim.on`); each int32 bias alike, on the grid of its input's fed scale.
`feeds(plan)` turns a candidate's plan (its ranges assigned) into those inputs, or None when
the candidate uses what the simulation does not emulate, and is then measured on its real
model: dynamic forms other than `gather`, float16/bfloat16, per-block (int4) or fp8 choices,
weights control flow reads, a tensor quantized that the all-int8 plan leaves float.
So it computes what the real model's Q/DQ graph computes, unfused, to the bit
(tests/test_simulation.py), but for two things: a Relu/Clip that a Q/DQ pair makes redundant
stays (the same values), HardSwish/HardSigmoid between Q/DQ pairs stay float (qcli/gates.py
writes them in integers). And onnxruntime's fused kernels (QLinearConv, QGemm, ...) accumulate
in int32 and requantize once, where the simulation computes the dequantized product in float: a
value within float rounding of a rounding boundary can land one step apart.
benchmarks/simulation.py measures how well it ranks candidates against real models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.graph import GraphIndex, toposort
from qcli.lazy import tensor_array
from qcli.plan import BiasPlan, Group, Plan, WeightPlan
from qcli.plan.context import float_readers
from qcli.qweights import WeightMemo, weight_of
from qcli.rules import rule_for
from qcli.scheme import PerBlock, dequantize, integer_range

SWITCHES, SCALES, LOW, HIGH = "qsim.on", "qsim.scale", "qsim.low", "qsim.high"
OUTPUT = -1  # the reader index of a graph output
FLAT = "qsim.flat"  # the shape [-1]
INT32_TOP = 2**31 - 1  # an int32 bias's largest magnitude (qcli/qdq.py)
IDENTITY = (2.0**-60, -np.finfo(np.float32).max, np.finfo(np.float32).max)  # a row that changes nothing

Reader = tuple[str, int, int]  # (tensor, node index or OUTPUT, input position)


@dataclass(frozen=True)
class Simulation:
    model: onnx.ModelProto
    rows: Mapping[Reader, int]  # a reader of an activation (or a group's table) -> its chain's row
    switches: Mapping[Reader, int]  # a reader of a weight or bias ("bias <key>") -> its switch
    weights: Mapping[str, WeightPlan]  # weight -> the plan its held values were quantized with
    tables: Mapping[int, WeightPlan]  # Gather node -> its int8 table's plan (the `gather` form)
    biases: Mapping[str, BiasPlan]  # "bias <key>" -> the int32 copy of a bias it emulates
    shares: frozenset[int]  # readers whose op moves data (float when not quantized: `qdq.moves_float`)

    @classmethod
    def of(cls, work: onnx.ModelProto, plan: Plan, memo: WeightMemo | None = None) -> Simulation:
        """The simulation of `work` (the prepared float graph) built on its all-int8 `plan`;
        `memo`: the weights its builds quantized (the same values, not quantized again)."""
        b = _Builder.of(work, memo)
        weights, tables = _weights(b.index, plan), _tables(plan)
        for t in _points(b.index, plan):
            b.point(t)
        for w, wp in weights.items():
            b.weight(w, wp, ("qdq", wp), b.index.read_at.get(w, ()))
        for i, wp in tables.items():
            b.weight(_table_name(wp, i), wp, ("dynamic", wp), [(i, 0)], source=wp.name)
        biases = {f"bias {key}": bp for key, bp in plan.biases.items() if bp.weight in weights}
        for key, bp in biases.items():
            b.bias(key, bp, weights[bp.weight])
        shares = frozenset(i for i, node in enumerate(work.graph.node)
                           if (rule := rule_for(node)) is not None and rule.kind == "shares")
        return cls(b.finish(), b.rows, b.switches, weights, tables, biases, shares)

    def feeds(self, plan: Plan) -> dict[str, np.ndarray] | None:
        """The inputs that make the simulation compute the model `plan` (its ranges assigned)
        builds; None when it uses what the simulation does not emulate (module docstring)."""
        tables = {i: d.weights[0] for i, d in plan.dynamic.items() if d.form == "gather"}
        if len(tables) < len(plan.dynamic) or plan.half or plan.control_flow:
            return None
        if any(self.tables.get(i) != wp for i, wp in tables.items()):
            return None
        if any(self.weights.get(w) != wp for w, wp in plan.weights.items()):
            return None
        groups = {t: g for g in plan.groups for t in g.tensors}
        if any(g.scheme.dtype.is_float or g.scale is None or g.zero_point is None for g in groups.values()):
            return None
        biases = {f"bias {key}": bp for key, bp in plan.biases.items() if bp.input in groups}
        if any(self.biases.get(key) != bp for key, bp in biases.items()):
            return None
        nodes = {d.index for d in plan.nodes if d.quantized}
        rows = np.tile(np.array(IDENTITY, np.float32), (len(self.rows), 1))
        chained = set()
        for (t, i, _), row in self.rows.items():
            g = groups.get(t)
            chained.add(t)
            if g is not None and self._reads_quantized(t, i, g, plan, nodes):
                rows[row] = _row(g, constant=t == g.constant)
        if not chained.issuperset(groups):  # a tensor quantized that no chain emulates
            return None
        on = np.zeros(len(self.switches), bool)
        for (name, i, _), k in self.switches.items():
            if i in tables and name == _table_name(tables[i], i):  # the Gather's int8 table
                on[k] = True
            elif name in biases:
                on[k] = i in nodes and i in biases[name].nodes
            else:
                on[k] = i in nodes and name in plan.weights
        return {SWITCHES: on, SCALES: rows[:, 0].copy(), LOW: rows[:, 1].copy(), HIGH: rows[:, 2].copy()}

    def _reads_quantized(self, t: str, i: int, g: Group, plan: Plan, nodes: set[int]) -> bool:
        """Whether reader `i` of the quantized tensor `t` reads its Q/DQ pair's output, as
        qcli/qdq.py rewires it: a table's quantized readers; an activation's every reader but
        the excluded ones and data movement left float."""
        if t == g.constant:
            return i in nodes
        return i == OUTPUT or (i not in plan.keep_float and (i in nodes or i not in self.shares))


def _row(g: Group, constant: bool) -> tuple[float, float, float]:
    """The chain row of group `g`: its scale, and its integer range less its zero point (a table
    is quantized in the range of its scheme, an activation in its type's: qcli.scheme)."""
    dtype, zero = g.scheme.dtype, float(np.asarray(g.zero_point).reshape(-1)[0])
    lo, hi = integer_range(dtype, g.scheme.symmetric) if constant else (dtype.qmin, dtype.qmax)
    return float(np.asarray(g.scale).reshape(-1)[0]), lo - zero, hi - zero


@dataclass(frozen=True)
class Simulated:
    """A candidate as the simulation runs it: its session, and the inputs of each fold's
    candidate (`Simulation.feeds` of the plan built with that fold's ranges)."""

    session: Any
    feeds: Callable[[int], dict[str, np.ndarray]]


@dataclass
class _Builder:
    """The simulation's graph as it is written: a copy of the float graph, the nodes added, a
    row per chain and a switch per reader of a weight or bias."""

    index: GraphIndex
    model: onnx.ModelProto
    memo: WeightMemo | None
    new: list[onnx.NodeProto] = field(default_factory=list)
    rows: dict[Reader, int] = field(default_factory=dict)
    switches: dict[Reader, int] = field(default_factory=dict)
    constants: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, work: onnx.ModelProto, memo: WeightMemo | None) -> _Builder:
        model = onnx.ModelProto()
        model.CopyFrom(work)
        return cls(GraphIndex.of(work), model, memo)

    def point(self, t: str) -> None:
        """A chain for each reader of `t` (a graph output too: its producer then writes
        `<t>.qsim_float` and the chain writes `t`)."""
        source = t
        if t in self.index.outputs and t in self.index.written_at:
            i, k = self.index.written_at[t]
            source = self.model.graph.node[i].output[k] = f"{t}.qsim_float"
            self._chain(t, source, (OUTPUT, 0), t)
        for i, k in self.index.read_at.get(t, ()):
            self._chain(t, source, (i, k), f"{t}.qsim{i}_{k}")
            self.model.graph.node[i].input[k] = f"{t}.qsim{i}_{k}"

    def weight(self, name: str, wp: WeightPlan, key: tuple, uses, source: str | None = None) -> None:
        """Weight `wp.name` held dequantized as `<name>.qsim` (quantized under `key` in the
        memo, as the build does); each of `uses` reads it or the float one by a switch."""
        q, scale, zero = weight_of(self.memo, key, lambda: tensor_array(self.index.initializers[wp.name]), wp)
        values = dequantize(q, scale, zero, wp.axis)
        self.model.graph.initializer.append(numpy_helper.from_array(values, f"{name}.qsim"))
        self._switch(name, f"{name}.qsim", source or name, uses)

    def bias(self, key: str, bp: BiasPlan, wp: WeightPlan) -> None:
        """The int32 copy `key` of bias `bp.name` on the grid of the scale its node's input chain
        is fed; the nodes reading that copy switched."""
        w_scale = weight_of(self.memo, ("qdq", wp), lambda: tensor_array(self.index.initializers[wp.name]), wp)[1]
        grid = np.tile(w_scale.astype(np.float64), bp.repeats if w_scale.ndim else 1)
        for i, k in self.index.read_at.get(bp.name, ()):
            position = next((kk for n, kk in self.index.read_at.get(bp.input, ()) if n == i), None)
            if i not in bp.nodes or (bp.input, i, position) not in self.rows:  # its input has no chain
                continue
            emulated = f"{key}.qsim{i}"
            self.model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float64), f"{emulated}.{n}")
                                                for n, v in (("grid", grid), ("factor", bp.factor),
                                                             ("low", -INT32_TOP), ("high", INT32_TOP)))
            self.new.extend(_bias_quant(bp.name, emulated, f"{bp.input}.qsim{i}_{position}.s"))
            self._switch(key, emulated, bp.name, [(i, k)])

    def finish(self) -> onnx.ModelProto:
        """The model: the switch and row inputs declared, the nodes in topological order."""
        graph = self.model.graph
        graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), FLAT))
        graph.input.extend([
            helper.make_tensor_value_info(SWITCHES, onnx.TensorProto.BOOL, [len(self.switches)]),
            *(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [len(self.rows)]) for n in (SCALES, LOW, HIGH)),
        ])
        available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        nodes = toposort([*graph.node, *self.new], available)
        del graph.node[:]
        graph.node.extend(nodes)
        return self.model

    def _chain(self, t: str, source: str, reader: tuple[int, int], into: str) -> None:
        row = self.rows.setdefault((t, *reader), len(self.rows))
        self.new.extend(_fake_quant(source, into, self._const(row)))

    def _switch(self, name: str, emulated: str, source: str, uses) -> None:
        """Each use (node, input) of `source` reads `emulated` or it, by its own switch."""
        for i, k in uses:
            k_on = self.switches.setdefault((name, i, k), len(self.switches))
            into = f"{emulated}{i}_{k}"
            self.new.extend([helper.make_node("Gather", [SWITCHES, self._const(k_on)], [f"{into}.on"]),
                             helper.make_node("Where", [f"{into}.on", emulated, source], [into])])
            self.model.graph.node[i].input[k] = into

    def _const(self, k: int) -> str:
        """The name of an int64 scalar initializer holding `k` (one per value)."""
        if k not in self.constants:
            self.constants[k] = f"qsim.i{k}"
            self.model.graph.initializer.append(numpy_helper.from_array(np.array(k, np.int64), self.constants[k]))
        return self.constants[k]


def _points(index: GraphIndex, plan: Plan) -> list[str]:
    """The tensors read through chains: the plan's quantized float32 activations and tables,
    and the inputs of the Relu/Clips it folds into their producers, in the plan's order."""
    graph = index.graph
    folded = [graph.node[d.index].input[0] for d in plan.nodes if d.folded_into is not None]
    seen: dict[str, None] = {}
    for t in [*(t for g in plan.groups for t in g.tensors), *folded]:
        if index.types.get(t) == onnx.TensorProto.FLOAT:
            seen.setdefault(t, None)
    return list(seen)


def _weights(index: GraphIndex, plan: Plan) -> dict[str, WeightPlan]:
    """The weights emulated: 8- or 16-bit integer ones, per tensor or channel, that no control
    flow or graph output reads (those are read folded by every reader: qcli/qdq.py)."""
    elsewhere = float_readers(index.graph)
    return {w: wp for w, wp in plan.weights.items()
            if not wp.scheme.dtype.is_float and wp.scheme.dtype.bits in (8, 16)
            and not isinstance(wp.scheme.granularity, PerBlock) and w not in elsewhere}


def _tables(plan: Plan) -> dict[int, WeightPlan]:
    """The int8 embedding tables of the plan's `gather` nodes (qcli/dynamic.py)."""
    return {i: d.weights[0] for i, d in plan.dynamic.items() if d.form == "gather"}


def _table_name(wp: WeightPlan, i: int) -> str:
    """The name the int8 table of Gather node `i` is switched under (its weight's is its own)."""
    return f"{wp.name}.gather{i}"


def _bias_quant(b: str, y: str, input_scale: str) -> list[onnx.NodeProto]:
    """y: bias `b` as its int32 copy dequantizes, on the grid g = input scale x the weight's
    scales (`<y>.grid`) x the node's factor (`<y>.factor`), worked out in float64 as
    qcli/qdq.py does: g to float32, q = round(b / g) clipped to int32, y = q x g."""
    double, single = onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT
    return [
        helper.make_node("Cast", [input_scale], [f"{y}.s64"], to=double),
        helper.make_node("Mul", [f"{y}.s64", f"{y}.grid"], [f"{y}.sw"]),
        helper.make_node("Mul", [f"{y}.sw", f"{y}.factor"], [f"{y}.g64"]),
        helper.make_node("Cast", [f"{y}.g64"], [f"{y}.g"], to=single),
        helper.make_node("Cast", [f"{y}.g"], [f"{y}.g_64"], to=double),
        helper.make_node("Cast", [b], [f"{y}.b64"], to=double),
        helper.make_node("Div", [f"{y}.b64", f"{y}.g_64"], [f"{y}.div"]),
        helper.make_node("Round", [f"{y}.div"], [f"{y}.round"]),
        helper.make_node("Clip", [f"{y}.round", f"{y}.low", f"{y}.high"], [f"{y}.q"]),
        helper.make_node("Cast", [f"{y}.q"], [f"{y}.q32"], to=single),
        helper.make_node("Mul", [f"{y}.q32", f"{y}.g"], [y]),
    ]


def _fake_quant(x: str, y: str, row: str) -> list[onnx.NodeProto]:
    """y = clip(round(x / s), low, high) x s, with s, low and high row `row` of the inputs; on
    `x` flattened: onnxruntime (1.32) runs a binary op with a scalar 20-30x slower on a tensor
    whose last axis is 1 ([N, C, L, 1], a 1-D convolution's) than on the same values in 1-D."""
    s, lo, hi = f"{y}.s", f"{y}.lo", f"{y}.hi"
    return [
        helper.make_node("Gather", [SCALES, row], [s]),
        helper.make_node("Gather", [LOW, row], [lo]),
        helper.make_node("Gather", [HIGH, row], [hi]),
        helper.make_node("Shape", [x], [f"{y}.shape"]),
        helper.make_node("Reshape", [x, FLAT], [f"{y}.flat"]),
        helper.make_node("Div", [f"{y}.flat", s], [f"{y}.div"]),
        helper.make_node("Round", [f"{y}.div"], [f"{y}.round"]),
        helper.make_node("Clip", [f"{y}.round", lo, hi], [f"{y}.clip"]),
        helper.make_node("Mul", [f"{y}.clip", s], [f"{y}.mul"]),
        helper.make_node("Reshape", [f"{y}.mul", f"{y}.shape"], [y]),
    ]
