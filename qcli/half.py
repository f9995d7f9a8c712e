"""float16 / bfloat16: run chosen nodes of a model in a 16-bit float type
(docs/guides/formats.md, "float16 and bfloat16").

`to_half(model, wanted, kind, table)` converts the nodes named in `wanted` (a written model: Q/DQ
nodes and all) and says which of them stay float32, and why. Decisions:
- Graph inputs and outputs keep their float32 type: a Cast where a half node reads or writes one.
- Casts sit on tensors, not nodes: one per tensor and direction, shared by every reader, so a
  connected half region costs one Cast where it starts and one where it ends. A constant read
  only by half nodes is stored in the half type (where the file gets ~2x smaller); a Cast node
  asked for converts to the half type itself instead of gaining a second Cast.
- Which inputs change type comes from the op's schema at the model's opset: every type variable
  bound to float32 there flips, when the schema allows the half type for it (bfloat16 Conv needs
  opset 22: before it, Conv stays float32 and says so). Inputs typed `tensor(float)` outright
  (Resize's scales) stay float32.
- A node stays float32, with its reason, when: its op is in `rules.FLOAT32_IN_HALF` (Exp, Log,
  Pow, normalisation statistics, Q/DQ); it holds a subgraph, or a subgraph reads its output (the
  subgraph is not converted: loop-carried types must match; but the float constants only such a
  node and converted nodes read are stored in the half type, one Cast to float32 outside the
  loop); an attribute sets its output type (RandomNormal's dtype); a value it reads or writes
  reached a quarter of the type's largest value in calibration
  (float16: 16376 of 65504; a quarter leaves two bits of headroom for inputs calibration never saw);
  a constant it reads holds values the type cannot (beyond its largest; or values it rounds to
  zero, when that is all of its non-zero values, like a LayerNorm epsilon of 1e-12, or over 1% of
  them: a trained weight's few tiny values are lost harmlessly); it reduces more elements than its mantissa
  can add exactly (2**(mantissa + 1): float16 2048, bfloat16 256) or a number of them not known;
  it only moves or clips values (a data-movement op) and no input of it is written in the type
  (its producers are float32: converting it would only round their values at its Cast).
Without a calibration table, the value rules are not applied (the summary says so).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qcli.calibrate.table import CalibrationTable
from qcli.graph import GraphIndex, node_names, opset_version
from qcli.lazy import tensor_array
from qcli.rules import FLOAT32_IN_HALF, HALF_REDUCTIONS, rule_for


@dataclass(frozen=True)
class HalfType:
    """A 16-bit float type: its ONNX enum, numpy type, largest finite and smallest positive value,
    and mantissa bits."""

    name: str
    onnx_type: int
    numpy_dtype: type
    largest: float
    smallest: float
    mantissa: int

    @property
    def limit(self) -> float:
        """The calibrated magnitude beyond which a node stays float32 (a quarter of `largest`)."""
        return self.largest / 4

    @property
    def reduction(self) -> int:
        """The longest reduction that stays in the type."""
        return 1 << (self.mantissa + 1)


HALF_TYPES = {
    "float16": HalfType("float16", TensorProto.FLOAT16, np.float16, 65504.0, 2.0**-24, 10),
    "bfloat16": HalfType("bfloat16", TensorProto.BFLOAT16, ml_dtypes.bfloat16,
                         float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-133, 7),
}
BFLOAT16_OPSET = 22  # Conv, Gemm, pooling and most activations allow bfloat16 from opset 22
_TYPED_BY_ATTRIBUTE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                                 "EyeLike", "Multinomial", "Bernoulli"})
_FLOAT = TensorProto.FLOAT


@dataclass
class HalfResult:
    """The converted model and what happened to the nodes asked for."""

    model: onnx.ModelProto
    kind: str
    converted: list[str] = field(default_factory=list)  # node names, graph order
    kept: dict[str, str] = field(default_factory=dict)  # node name -> why it stays float32
    casts: int = 0
    ranges_checked: bool = True

    def notes(self) -> list[str]:
        """The summary's lines: how many nodes converted, and each kept float32 with its reason."""
        lines = [f"{self.kind}: {len(self.converted)} nodes, {self.casts} Casts; "
                 f"{len(self.kept)} kept float32" + ("" if self.ranges_checked else
                                                     " (ranges not checked: no calibration data)")]
        return lines + [f"{self.kind}: {name} stays float32: {why}" for name, why in self.kept.items()]

    def to_dict(self) -> dict:
        return {"type": self.kind, "converted": len(self.converted), "casts": self.casts,
                "kept_float32": self.kept, "ranges_checked": self.ranges_checked}


def to_half(model: onnx.ModelProto, wanted: Collection[str], kind: str,
            table: CalibrationTable | None = None) -> HalfResult:
    """`model` with the nodes whose first output is in `wanted` run in `kind` ('float16' or
    'bfloat16') where they can (see the module docstring); `model` is not changed."""
    half = HALF_TYPES[kind]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    index = GraphIndex.of(out)
    names = node_names(out)
    asked = [i for i, n in enumerate(out.graph.node) if n.output and n.output[0] in wanted]
    inner = {i: reads for i, n in enumerate(out.graph.node) if (reads := subgraph_reads(n))}
    in_subgraphs = set().union(*inner.values())
    kept = {i: why for i in asked if (why := _why_float32(out, index, i, half, table, in_subgraphs))}
    kept.update(_moving_float32(out, index, asked, kept))
    flips = _flips(out, index, [i for i in asked if i not in kept], half, kept)
    result = HalfResult(out, kind, ranges_checked=table is not None)
    result.casts = _rewrite(out, index, flips, half, inner, inner.keys() & asked)
    result.converted = [names[i] for i in sorted(flips) if flips[i]]
    result.kept = {names[i]: why for i, why in sorted(kept.items())}
    return result


def _why_float32(model: onnx.ModelProto, index: GraphIndex, i: int, half: HalfType,
                 table: CalibrationTable | None, in_subgraphs: set[str]) -> str:
    """Why node `i` must stay float32 ('' when it may convert), by the module docstring's rules;
    `in_subgraphs`: the names the main graph's subgraphs read."""
    node = model.graph.node[i]
    if node.op_type in FLOAT32_IN_HALF:
        return FLOAT32_IN_HALF[node.op_type]
    if node.domain not in ("", "ai.onnx"):
        return f"{node.domain} op"
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return f"control flow: its subgraphs compute in float32 (constants only they read: stored in {half.name})"
    if node.op_type in _TYPED_BY_ATTRIBUTE:
        return "an attribute sets its output type"
    if set(node.output) & in_subgraphs:
        return "a subgraph reads its output"
    for name in node.input:
        init = index.initializers.get(name)
        if init is not None and init.data_type == _FLOAT and (why := _unrepresentable(init, half)):
            return f"constant {name!r} {why}"
    if table is not None:
        looked = [t for t in (*node.output, *node.input) if t and t not in index.initializers]
        for name in looked:
            peak = _peak(table, name)
            if peak is not None and peak > half.limit:
                return f"{name!r} reaches {peak:.4g} in calibration ({half.name} keeps float32 above {half.limit:.6g})"
    if node.op_type in HALF_REDUCTIONS:
        length = _reduced_length(model, index, node, table)
        if length is None:
            return f"a reduction over a length not known ({half.name} adds {half.reduction} values exactly)"
        if length > half.reduction:
            return f"a reduction over {length} values ({half.name} adds {half.reduction} exactly)"
    return ""


MOVES_FLOAT32 = "moves float32 values (no input written in the half type): converting would only round them"


def moves_only(node: onnx.NodeProto, float_constants: Container[str]) -> bool:
    """Whether `node` only moves or clips values (a data-movement, clipping or shape-reading op)
    and reads no float constant but a clip bound: exact in any float type."""
    rule = rule_for(node)
    if rule is None or rule.kind == "compute":
        return False
    return not any(t in float_constants for k, t in enumerate(node.input) if k not in rule.bounds)


def _moving_float32(model: onnx.ModelProto, index: GraphIndex, asked: list[int], kept: Mapping[int, str]
                    ) -> dict[int, str]:
    """The nodes among `asked` (graph order) that only move values (`moves_only`) and read no
    value a converted node writes: in the type they would compute nothing, only round float32
    values at their Cast (a region's float32 neighbours promoted, say)."""
    float_constants = {name for name, t in index.initializers.items() if t.data_type == _FLOAT}
    written: set[str] = set()  # tensors the converted nodes write
    found: dict[int, str] = {}
    for i in asked:
        node = model.graph.node[i]
        if i in kept:
            continue
        if moves_only(node, float_constants) and not written.intersection(node.input):
            found[i] = MOVES_FLOAT32
            continue
        written.update(t for t in node.output if t)
    return found


def _unrepresentable(init: onnx.TensorProto, half: HalfType) -> str:
    values = np.abs(tensor_array(init).astype(np.float32))
    finite = values[np.isfinite(values)]
    if finite.size and finite.max() > half.largest:
        return f"holds {finite.max():.4g}, beyond {half.name}'s {half.largest:.6g}"
    nonzero = finite[finite > 0]
    lost = nonzero[nonzero < half.smallest / 2]
    if lost.size and (lost.size == nonzero.size or lost.size > nonzero.size / 100):
        return f"holds {lost.max():.3g}, which {half.name} rounds to 0"
    return ""


def _peak(table: CalibrationTable, name: str) -> float | None:
    observer = table.observers.get(name)
    if observer is None or not observer.count:
        return None
    return max(abs(observer.min), abs(observer.max))


def _reduced_length(model: onnx.ModelProto, index: GraphIndex, node: onnx.NodeProto,
                    table: CalibrationTable | None) -> int | None:
    """How many values one output element of a reduction adds up: the product of the reduced
    axes' sizes, from the input's inferred or calibrated shape; None where a size is unknown."""
    shape = _shape(model, node.input[0], table)
    if shape is None:
        return None
    if node.op_type == "Softmax":
        axes = [int_attr(node, "axis", -1 if opset_version(model) >= 13 else 1)]
        if opset_version(model) < 13:
            axes = list(range(axes[0] % len(shape), len(shape)))
    else:
        reduced = _reduce_axes(node, index, len(shape))
        if reduced is None:
            return None
        axes = reduced
    length = 1
    for a in axes:
        size = shape[a % len(shape)] if shape else 1
        if size is None:
            return None
        length *= size
    return length


def _reduce_axes(node: onnx.NodeProto, index: GraphIndex, rank: int) -> list[int] | None:
    axes: list[int] | None = None
    for a in node.attribute:
        if a.name == "axes":
            axes = list(a.ints)
    if axes is None and len(node.input) > 1 and node.input[1]:
        init = index.initializers.get(node.input[1])
        if init is None:
            return None
        axes = [int(v) for v in tensor_array(init).ravel()]
    if not axes:
        return [] if int_attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return axes


def _shape(model: onnx.ModelProto, name: str, table: CalibrationTable | None) -> list[int | None] | None:
    for vi in (*model.graph.value_info, *model.graph.input, *model.graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            if all(d is not None for d in dims[1:]) or table is None:
                return dims
    observer = table.observers.get(name) if table is not None else None
    return list(observer.shape) if observer is not None and observer.shape is not None else None


def int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """The names `node`'s subgraphs (nested ones too) read or give as outputs, from the outer
    scope or their own: ONNX names are unique across scopes, so an outer constant read here is
    among them."""
    names: set[str] = set()
    for g in _subgraphs(node):
        names.update(t for n in g.node for t in n.input if t)
        names.update(o.name for o in g.output)
    return names


def _subgraphs(node: onnx.NodeProto):
    """`node`'s subgraphs, and theirs."""
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            yield g
            for inner in g.node:
                yield from _subgraphs(inner)


# --------------------------------------------------------------------------- type variables

Flips = dict[int, frozenset[tuple[bool, int]]]  # node -> the (is_output, position) that change type


def _flips(model: onnx.ModelProto, index: GraphIndex, nodes: list[int], half: HalfType,
           kept: dict[int, str]) -> Flips:
    """For each node to convert, the inputs and outputs whose type becomes the half type, in
    graph order; a node whose schema has no half form goes to `kept`. A node none of whose
    outputs flips (Shape, a comparison) flips only when its float inputs are half already."""
    opset = opset_version(model)
    half_tensors: set[str] = set()
    flips: Flips = {}
    for i in nodes:
        node = model.graph.node[i]
        if node.op_type in ("Cast", "Constant", "ConstantOfShape"):
            float_out = index.types.get(node.output[0]) == _FLOAT
            flips[i] = frozenset({(True, 0)}) if float_out else frozenset()
        else:
            found = _schema_flips(node, index, opset, half)
            if found is None:
                kept[i] = f"no {half.name} form of {node.op_type} at opset {opset}"
                continue
            if not any(is_out for is_out, _ in found):
                ins = [node.input[k] for out, k in found if not out]
                found = found if all(t in half_tensors or t in index.initializers for t in ins) else frozenset()
            flips[i] = found
        half_tensors |= {node.output[k] for is_out, k in flips[i] if is_out}
    return flips


def _schema_flips(node: onnx.NodeProto, index: GraphIndex, opset: int,
                  half: HalfType) -> frozenset[tuple[bool, int]] | None:
    """The positions bound to a type variable that is float32 here and allows the half type;
    None when a float32-bound variable does not allow it."""
    found = type_variables(node, opset)
    if found is None:
        return None
    allowed, places = found
    floats = {var for var, at in places.items() if any(index.types.get(place(node, p)) == _FLOAT for p in at)}
    wanted = f"tensor({half.name})"
    if any(wanted not in allowed[var] for var in floats):
        return None
    return frozenset(p for var in floats for p in places[var])


def type_variables(node: onnx.NodeProto, opset: int
                    ) -> tuple[dict[str, set[str]], dict[str, list[tuple[bool, int]]]] | None:
    """The node's type variables at `opset`: the types each allows, and the (is_output,
    position) each binds here; None for an op without a schema."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    places: dict[str, list[tuple[bool, int]]] = {}
    for is_out, formal, actual in ((False, schema.inputs, node.input), (True, schema.outputs, node.output)):
        for k, name in enumerate(actual):
            if name and formal:
                var = formal[min(k, len(formal) - 1)].type_str
                if var in allowed:
                    places.setdefault(var, []).append((is_out, k))
    return allowed, places


def place(node: onnx.NodeProto, at: tuple[bool, int]) -> str:
    """The tensor at (is_output, position) of `node`."""
    return (node.output if at[0] else node.input)[at[1]]


# --------------------------------------------------------------------------- rewriting

def _rewrite(model: onnx.ModelProto, index: GraphIndex, flips: Flips, half: HalfType,
             subgraphs: Mapping[int, set[str]], control: Container[int]) -> int:
    """Apply `flips`: retype what the converted nodes write, store in the half type the constants
    only they read, and add one Cast per tensor and direction where the types meet (a Cast node
    reads either type as it is); the number of Casts added. `subgraphs`: node -> the names its
    subgraphs read (`subgraph_reads`). The `control` nodes (control flow
    asked for) and their subgraphs compute in float32: a constant only they and converted nodes
    read is stored in the half type too, and they read it through one Cast to float32 in the main
    graph (run once, outside any Loop)."""
    graph = model.graph
    written = {graph.node[i].output[k] for i, places in flips.items() for is_out, k in places if is_out}
    reads = [(i, k, name, (False, k) in flips.get(i, ())) for i, node in enumerate(graph.node)
             if node.op_type != "Cast" for k, name in enumerate(node.input) if name]
    inner = [(i, name) for i, names in subgraphs.items() for name in sorted(names) if name in index.initializers]
    float_reads = ({name for i, _, name, flipped in reads if not flipped and i not in control}
                   | {name for i, name in inner if i not in control} | set(index.outputs))
    flexible = {name for i, _, name, _ in reads if i in control} | {name for i, name in inner if i in control}
    floats = {name for name, t in index.initializers.items() if t.data_type == _FLOAT and name not in index.inputs}
    stored = {name for _, _, name, flipped in reads if flipped and name not in float_reads and name in floats}
    stored |= {name for name in flexible - float_reads if name in floats
               and not _unrepresentable(index.initializers[name], half)}
    for init in graph.initializer:
        if init.name in stored:
            init.CopyFrom(numpy_helper.from_array(
                tensor_array(init).astype(np.float32).astype(half.numpy_dtype), init.name))
    is_half = written | stored
    renamed = {name: f"{name}/{half.name}" for name in index.outputs & written}
    casts: dict[tuple[str, int], str] = {}  # (tensor, type) -> the Cast's output
    for i, k, name, flipped in reads:
        if name in renamed and not flipped:
            continue  # a float32 reader of a graph output reads the output itself: the Cast below writes it
        if flipped != (name in is_half):
            target = half.onnx_type if flipped else _FLOAT
            new = casts.setdefault((name, target), f"{name}/{half.name if flipped else 'float32'}")
            graph.node[i].input[k] = new
        elif name in renamed:
            graph.node[i].input[k] = renamed[name]
    for i, name in inner:
        if name in stored:
            _rename_inside(graph.node[i], name, casts.setdefault((name, _FLOAT), f"{name}/float32"))
    for name in renamed:
        casts[(name, _FLOAT)] = name  # the graph output, float32 again
    _retype(model, flips, half)
    for node in graph.node:
        for k, name in enumerate(node.output):
            node.output[k] = renamed.get(name, name)
    nodes: dict[str, list[onnx.NodeProto]] = {}
    for (name, target), new in casts.items():
        source = renamed.get(name, name)
        nodes.setdefault(name, []).append(helper.make_node("Cast", [source], [new], name=f"{new}/Cast", to=target))
    _insert(graph, index, nodes)
    _retype_value_info(model, written - set(renamed), half)
    return len(casts)


def _rename_inside(node: onnx.NodeProto, old: str, new: str) -> None:
    """Make `node`'s subgraphs (nested ones too) read the outer value `old` as `new`."""
    for g in _subgraphs(node):
        for inner in g.node:
            inner.input[:] = [new if name == old else name for name in inner.input]
        for output in g.output:
            if output.name == old:
                output.name = new


def _retype(model: onnx.ModelProto, flips: Flips, half: HalfType) -> None:
    """The converted Cast, Constant and ConstantOfShape nodes produce the half type."""
    for i, places in flips.items():
        node = model.graph.node[i]
        if not places or node.op_type not in ("Cast", "Constant", "ConstantOfShape"):
            continue
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to":
                a.i = half.onnx_type
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(
                    tensor_array(a.t).astype(half.numpy_dtype), a.t.name))


def _insert(graph: onnx.GraphProto, index: GraphIndex, casts: Mapping[str, list[onnx.NodeProto]]) -> None:
    """Put each tensor's Casts right after the node writing it (first, for inputs and constants);
    `index` holds the positions of the graph before the Casts."""
    after: dict[int, list[onnx.NodeProto]] = {}
    ordered: list[onnx.NodeProto] = []
    for name, nodes in casts.items():
        producer = index.producer(name)
        (ordered if producer is None else after.setdefault(producer, [])).extend(nodes)
    for i, node in enumerate(graph.node):
        ordered += [node, *after.get(i, [])]
    del graph.node[:]
    graph.node.extend(ordered)


def _retype_value_info(model: onnx.ModelProto, names: set[str], half: HalfType) -> None:
    for vi in model.graph.value_info:
        if vi.name in names and vi.type.tensor_type.elem_type == _FLOAT:
            vi.type.tensor_type.elem_type = half.onnx_type
