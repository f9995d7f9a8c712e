"""Decide how every tensor of a (prepared) model is quantized: the plan `qdq.py` materializes.

Two steps. `make_plan(model, config)` decides the structure from the op rules (rules.py) and
the config alone: which nodes are quantized (and why others stay float), which activations get
a Q/DQ pair, which activations share one scale (groups, by union-find over tensors joined by
`shares` ops, as pt2e's SharedQuantizationSpec), which initializers are weights and biases, and
each group's and weight's scheme after the YAML overrides. `assign_ranges(plan, model, table)`
then gives each group its range and turns it into scale and zero point. Calibration observes
exactly `plan.calibrated_tensors`.

Decisions (README "What gets quantized" and "Configuration" say the same for users):
- A compute node is quantized when its rule says so, its activation inputs and outputs are
  float32 tensors, its weight (Conv, ConvTranspose) is an initializer, and the config does not
  exclude it or any of its tensors.
- Relu/Clip right after a quantized producer are folded: the producer's output gets no Q/DQ,
  the clipped output does (onnxruntime then drops the Relu into the int8 kernel).
- The output of a Gemm or MatMul (`float_output` in rules.py) gets a Q/DQ pair only when a
  quantized node reads it (or an override names it): otherwise onnxruntime's int8 kernel writes
  it in float (QGemm, MatMulIntegerToFloat), e.g. a classifier's logits.
- Data-movement ops (`shares`) are quantized when a neighbouring tensor is, sharing its scale,
  so onnxruntime runs them on int8 or drops their Q/DQ pair.
- A node whose weight control flow (If/Loop/Scan) or the graph's outputs also read stays
  float unless an override names it: the weight would be stored twice (`_float_readers`).
- Int8 pays off in the kernels of Conv, ConvTranspose, MatMul and Gemm ("anchors"). A group of
  connected quantizable nodes without an anchor (say a lone Add between float ops) stays float:
  its Q/DQ pairs would cost more time than its int8 kernel saves.
- Overrides apply in order, later wins. A rule's `match` selects nodes (by `nodes` name patterns
  AND `op_types` when both are given) and tensors (by `tensors`); settings for a node apply to
  its quantized activations (inputs and outputs) and its weights. When the members of one
  shared group are given different activation dtypes, the widest wins (16 over 8 bits; on a
  tie, the later rule), and a note says so.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from qcli.calibrate.table import CalibrationTable, RangeSettings
from qcli.config import Activations, Config, Match, Weights
from qcli.errors import CalibrationError
from qcli.info import iter_graphs, node_subgraphs
from qcli.rules import OUTPUT_RANGES, activation_inputs, block_axis, rule_for, weight_axis
from qcli.scheme import PerBlock, PerChannel, PerTensor, QuantScheme, choose_qparams

ANCHORS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}


@dataclass
class Group:
    """Activations that share one scale and zero point."""

    tensors: list[str]
    scheme: QuantScheme
    constant: str | None = None  # an initializer member (embedding table) fixes the params
    fixed_range: tuple[float, float] | None = None  # known without calibration, or set by YAML
    settings: dict | None = None  # per-group calibration override fields (method, percentile)
    range: tuple[float, float] | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None


@dataclass(frozen=True)
class WeightPlan:
    name: str  # initializer
    scheme: QuantScheme
    axis: int | None  # per-channel (or per-block) axis, None for per-tensor


@dataclass(frozen=True)
class BiasPlan:
    name: str  # initializer
    input: str  # the activation whose scale multiplies the weight's
    weight: str


@dataclass(frozen=True)
class NodeDecision:
    index: int
    name: str
    op_type: str
    quantized: bool
    reason: str = ""  # why it stays float (or "folded into <producer>")


@dataclass
class Plan:
    groups: list[Group] = field(default_factory=list)
    weights: dict[str, WeightPlan] = field(default_factory=dict)
    biases: dict[str, BiasPlan] = field(default_factory=dict)
    nodes: list[NodeDecision] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # config rules that matched nothing
    keep_float: set[int] = field(default_factory=set)  # nodes excluded by config: read float inputs
    notes: list[str] = field(default_factory=list)  # conflicts resolved, and the like

    @property
    def activations(self) -> list[str]:
        """Every tensor that gets a Q/DQ pair, in group order."""
        return [t for g in self.groups for t in g.tensors if t != g.constant]

    @property
    def calibrated_tensors(self) -> list[str]:
        """Tensors whose range must come from calibration."""
        return [t for g in self.groups if g.constant is None and g.fixed_range is None for t in g.tensors]


def node_names(model: onnx.ModelProto) -> list[str]:
    """Display names of the graph's nodes: their own, or `<op_type>_<index>` when unnamed."""
    return [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)]


# --------------------------------------------------------------------------- matching


def pattern(text: str):
    """A name test: `re:<regex>` (full match) or a glob (`*`, `?`, `[...]`)."""
    if text.startswith("re:"):
        regex = re.compile(text[3:])  # compiled once already by the config schema
        return lambda name: regex.fullmatch(name) is not None
    return lambda name: fnmatch.fnmatchcase(name, text)


@dataclass
class Selection:
    """What one `match:` selects in a graph: node indices and tensor names."""

    where: str
    nodes: set[int]
    tensors: set[str]

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.tensors


def select(match: Match, where: str, names: list[str], graph: onnx.GraphProto, tensors: set[str]) -> Selection:
    node_tests = [pattern(p) for p in match.nodes]
    tensor_tests = [pattern(p) for p in match.tensors]
    nodes: set[int] = set()
    if match.nodes or match.op_types:
        for i, node in enumerate(graph.node):
            if (not node_tests or any(t(names[i]) for t in node_tests)) and (
                not match.op_types or node.op_type in match.op_types
            ):
                nodes.add(i)
    chosen = {t for t in tensors if any(test(t) for test in tensor_tests)}
    return Selection(where, nodes, chosen)


# --------------------------------------------------------------------------- planning


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every typed tensor of the main graph (value_info from shape inference)."""
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def _activation_scheme(a: Activations) -> QuantScheme | None:
    """None for `dtype: float` (weight-only quantization: activations keep no Q/DQ)."""
    return None if a.dtype == "float" else QuantScheme.of(a.dtype, "per_tensor", a.symmetric)


def _bits(scheme: QuantScheme | None) -> int:
    return 32 if scheme is None else scheme.dtype.bits


def _weight_scheme(w: Weights) -> QuantScheme:
    return QuantScheme.of(w.dtype, w.granularity, w.symmetric, w.block_size if w.granularity == "per_block" else 0)


@dataclass
class _Requests:
    """What the overrides ask for, per tensor and per weight (later rules overwrite)."""

    activation: dict[str, tuple[QuantScheme, int]] = field(default_factory=dict)  # scheme, rule index
    weight: dict[str, QuantScheme] = field(default_factory=dict)
    settings: dict[str, dict] = field(default_factory=dict)  # tensor -> calibration override fields
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)


def make_plan(model: onnx.ModelProto, config: Config) -> Plan:
    """The structure of the quantization (no ranges yet); see the module docstring."""
    graph = model.graph
    names = node_names(model)
    types = tensor_types(model)
    inits = {t.name: t for t in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    all_tensors = set(types) | set(producer) | {i.name for i in graph.input}

    def is_float(name: str) -> bool:  # int8 kernels take and give float32 around their Q/DQ
        return types.get(name) == onnx.TensorProto.FLOAT

    # Every rule's selection, up front (also tells which rules match nothing).
    exclude = select(config.exclude, "exclude", names, graph, all_tensors)
    overrides = [
        (k, o, select(o.match, f"overrides[{k}].match", names, graph, all_tensors))
        for k, o in enumerate(config.overrides)
    ]
    off = [exclude] + [sel for _, o, sel in overrides if o.precision == "float"]
    off_nodes = set().union(*(s.nodes for s in off))
    off_tensors = set().union(*(s.tensors for s in off))

    default_act = _activation_scheme(config.activations)
    default_weight = _weight_scheme(config.weights)

    def asked_for(i: int) -> bool:
        """Whether an override selects node `i` with a quantized precision."""
        return any(i in sel.nodes and o.precision not in (None, "float") for _, o, sel in overrides)

    # 1. Which nodes could be quantized.
    keep_float = set(off_nodes)  # excluded by the config: they read their inputs unquantized
    reasons: dict[int, str] = {}
    candidates: set[int] = set()
    for i, node in enumerate(graph.node):
        rule = rule_for(node)
        if rule is None:
            reasons[i] = "no int8 kernel for this op" if node.domain in ("", "ai.onnx") else f"custom domain {node.domain}"
            continue
        if i in off_nodes:
            reasons[i] = "excluded by config"
            continue
        if rule.default_float and not asked_for(i):
            reasons[i] = rule.reason
            continue
        if rule.kind == "fold":
            reasons[i] = "not after a quantized node"
            continue
        acts = [node.input[k] for k in activation_inputs(node, rule) if node.input[k] not in inits]
        touched = acts + [o for o in node.output if o]
        if any(t in off_tensors for t in touched):
            reasons[i] = "a tensor of it is excluded by config"
            keep_float.add(i)
            continue
        if not all(is_float(t) for t in touched):
            other = {types.get(t) for t in touched if not is_float(t)} & _OTHER_FLOATS.keys()
            if other:  # a float16 (or float64) model: its float32 export is what quantizes
                reasons[i] = f"{_OTHER_FLOATS[min(other)]}, not float32: quantize the model's float32 export"
            else:
                reasons[i] = "not float32" if rule.kind == "compute" else "moves non-float data"
            continue
        if rule.kind == "compute":
            weights = [node.input[k] for k in rule.weights if k < len(node.input) and node.input[k]]
            if node.op_type in ("Conv", "ConvTranspose") and not all(w in inits for w in weights):
                reasons[i] = "its weight is not a constant"
                continue
            if any(w in inits and not is_float(w) for w in weights):
                reasons[i] = "its weight is not float32"
                continue
        candidates.add(i)

    # 1b. A weight that control flow or the graph's outputs also read stays float for them: its
    # quantized readers would store it a second time (`_float_readers`). They stay float too,
    # unless an override asks for them.
    float_reads = _float_readers(graph)
    for i in sorted(candidates):
        node, rule = graph.node[i], rule_for(graph.node[i])
        shared = [node.input[k] for k in rule.weights if k < len(node.input) and node.input[k] in float_reads]
        if shared and not asked_for(i):
            candidates.discard(i)
            reasons[i] = f"its weight is also read in float (by {float_reads[shared[0]]}): int8 would store it twice"

    # 2. Keep only connected groups of candidates that contain an anchor.
    def source(name: str) -> int | None:
        """The node producing `name`, looking through Relu/Clip (they fold into it)."""
        j = producer.get(name)
        while j is not None and (r := rule_for(graph.node[j])) is not None and r.kind == "fold":
            j = producer.get(graph.node[j].input[0])
        return j

    components = _UnionFind()
    for i in candidates:
        components.find(str(i))
        for name in graph.node[i].input:
            j = source(name)
            if j in candidates:
                components.union(str(i), str(j))
    anchored = {components.find(str(i)) for i in candidates if graph.node[i].op_type in ANCHORS}
    for i in sorted(candidates):
        if components.find(str(i)) not in anchored:
            candidates.discard(i)
            reasons[i] = "no Conv/MatMul/Gemm next to it: int8 would be slower here"

    def writes_float(node: onnx.NodeProto) -> bool:
        """Whether onnxruntime can fuse the node into an int8 kernel that writes float outputs:
        a `float_output` op, unless a lone Relu/Clip follows an output (onnxruntime's QDQ
        selector then takes the Relu/Clip into the group and wants a QuantizeLinear after it)."""
        if not rule_for(node).float_output:
            return False
        for name in node.output:
            users = consumers.get(name, [])
            if len(users) == 1 and graph.node[users[0]].op_type in ("Relu", "Clip"):
                clipped = graph.node[users[0]].output[0]
                if len(consumers.get(clipped, [])) == 1 and clipped not in graph_outputs:
                    return False
        return True

    # 2b. A compute node whose outputs only feed excluded nodes cannot be fused (nothing would
    # read its quantized output): it stays float too, unless its int8 kernel writes float.
    def readers(name: str) -> list[int]:
        """Consumers of `name`, looking through the Relu/Clip that would fold into its producer."""
        out = []
        for u in consumers.get(name, []):
            r = rule_for(graph.node[u])
            out += readers(graph.node[u].output[0]) if r is not None and r.kind == "fold" else [u]
        return out

    for i in sorted(candidates):
        outs = [o for o in graph.node[i].output if o]
        if rule_for(graph.node[i]).kind == "compute" and not writes_float(graph.node[i]) and keep_float and all(
            o not in graph_outputs and readers(o) and all(u in keep_float for u in readers(o)) for o in outs
        ):
            candidates.discard(i)
            reasons[i] = "its output only feeds nodes excluded by config"

    # 3. Tensors of compute nodes, weights, biases, folded Relu/Clip.
    asked = set().union(*(sel.tensors for _, o, sel in overrides if o.precision != "float"))

    def read_quantized(name: str) -> bool:
        """Whether a quantized compute node reads `name` as an activation (looking through the
        Relu/Clip that would fold into its producer), or an override names it."""
        if name in asked:
            return True
        for u in consumers.get(name, []):
            node, r = graph.node[u], rule_for(graph.node[u])
            if r is not None and r.kind == "fold":
                if read_quantized(node.output[0]):
                    return True
            elif u in candidates and r.kind == "compute" and name in [node.input[k] for k in activation_inputs(node, r)]:
                return True
        return False

    plan = Plan(keep_float=keep_float)
    quantized: set[str] = set()
    folded: dict[int, str] = {}
    node_tensors: dict[int, set[str]] = {}  # quantized activations each node touches
    weight_users: dict[str, list[int]] = {}
    for i in sorted(candidates):
        node, rule = graph.node[i], rule_for(graph.node[i])
        if rule.kind != "compute":
            continue
        mine = node_tensors.setdefault(i, set())
        acts = set(activation_inputs(node, rule))
        for k in sorted(acts | {k for k in rule.weights if k < len(node.input) and node.input[k]}):
            name = node.input[k]
            if name not in inits:
                quantized.add(name)
                mine.add(name)
                continue
            weight_users.setdefault(name, []).append(i)
            if k in rule.weights:
                plan.weights.setdefault(name, _weight_plan(name, default_weight, node, len(inits[name].dims)))
            elif default_act is not None:  # a constant operand of Add/Mul: quantized like an activation
                plan.weights.setdefault(name, WeightPlan(name, default_act, None))
        if rule.bias is not None and rule.bias < len(node.input) and node.input[rule.bias] in inits:
            weight = node.input[rule.weights[0]]
            if weight in plan.weights and is_float(node.input[rule.bias]):
                plan.biases[node.input[rule.bias]] = BiasPlan(node.input[rule.bias], node.input[0], weight)
        for out in node.output:
            if writes_float(node) and not read_quantized(out):
                continue  # the int8 kernel writes it in float (see rules.py)
            users = consumers.get(out, [])
            fold = (
                users
                and out not in graph_outputs
                and all(
                    (r := rule_for(graph.node[u])) is not None
                    and r.kind == "fold"
                    and u not in off_nodes
                    and _static_clip(graph.node[u], inits)
                    and graph.node[u].output[0] not in off_tensors
                    for u in users
                )
            )
            if fold:
                for u in users:
                    folded[u] = names[i]
                    quantized.add(graph.node[u].output[0])
                    mine.add(graph.node[u].output[0])
            else:
                quantized.add(out)
                mine.add(out)

    # 4. Data movement shares its neighbours' scale; iterate until nothing changes.
    groups = _UnionFind()
    shares = [i for i in sorted(candidates) if rule_for(graph.node[i]).kind == "shares"]
    active: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i in shares:
            if i in active:
                continue
            node, rule = graph.node[i], rule_for(graph.node[i])
            members = [node.input[k] for k in activation_inputs(node, rule)] + [o for o in node.output if o]
            if any(t in quantized for t in members):
                active.add(i)
                changed = True
                quantized.update(t for t in members if t not in inits)
                node_tensors[i] = set(members)
                for t in members[1:]:
                    groups.union(members[0], t)
    for i in shares:
        if i not in active:
            candidates.discard(i)
            reasons[i] = "no quantized neighbour"

    # 5. What the overrides ask for, applied in order.
    requests = _Requests()
    for k, o, sel in overrides:
        if o.precision == "float":
            continue
        act = None
        if o.activations is not None:
            act = _activation_scheme(o.activations)
        elif o.precision is not None:
            act = QuantScheme.of(o.precision, "per_tensor", config.activations.symmetric)
        has_act = o.activations is not None or o.precision is not None
        targets = set(sel.tensors)
        for i in sel.nodes:
            targets |= node_tensors.get(i, set())
        for t in targets:
            if has_act:
                requests.activation[t] = (act, k)
            if o.calibration is not None:
                requests.settings.setdefault(t, {}).update(o.calibration.model_dump(exclude_none=True))
            if o.range is not None:
                requests.ranges[t] = o.range
        if o.weights is not None:
            for name, users in weight_users.items():
                if name in plan.weights and (name in sel.tensors or any(u in sel.nodes for u in users)):
                    node = graph.node[users[0]]
                    plan.weights[name] = _weight_plan(name, _weight_scheme(o.weights), node, len(inits[name].dims))

    # 6. Groups, in graph order of their first tensor.
    order = [i.name for i in graph.input] + [o for n in graph.node for o in n.output]
    position = {name: k for k, name in enumerate(order)}
    constants = {t for i in active for t in _data_consts(graph.node[i], inits)}
    members: dict[str, list[str]] = {}
    for t in sorted(quantized | constants, key=lambda t: (position.get(t, -1), t)):
        members.setdefault(groups.find(t), []).append(t)
    for tensors in members.values():
        constant = next((t for t in tensors if t in inits), None)
        fixed = _known_range(tensors, graph, producer, active)
        scheme = default_act
        asked = [(requests.activation[t], t) for t in tensors if t in requests.activation]
        if asked:
            (scheme, _), _ = max(asked, key=lambda a: (_bits(a[0][0]), a[0][1]))
            if len({a[0][0] for a in asked}) > 1 or (len(asked) < len(tensors) and scheme != default_act):
                plan.notes.append(
                    f"tensors {', '.join(tensors)} share one scale: all get "
                    f"{scheme.dtype.name if scheme else 'float'} (the widest any override asked for)"
                )
        if scheme is None:  # weight-only: these activations keep no Q/DQ
            continue
        group = Group(tensors, scheme, constant, fixed)
        for t in tensors:
            if t in requests.ranges:
                group.fixed_range = requests.ranges[t]
            if t in requests.settings:
                group.settings = requests.settings[t]  # fields; resolved in assign_ranges
        if constant is not None:
            plan.weights.pop(constant, None)  # quantized with the group's params instead
        plan.groups.append(group)

    for i, node in enumerate(graph.node):
        if i in folded:
            plan.nodes.append(NodeDecision(i, names[i], node.op_type, True, f"folded into {folded[i]}"))
        elif i in candidates:
            plan.nodes.append(NodeDecision(i, names[i], node.op_type, True))
        else:
            plan.nodes.append(NodeDecision(i, names[i], node.op_type, False, reasons.get(i, "")))
    rules = [(config.exclude, exclude)] + [(o.match, sel) for _, o, sel in overrides]
    for match, sel in rules:
        if sel.empty and (match.nodes or match.op_types or match.tensors):
            plan.unmatched.append(_unmatched(match, sel.where, names, graph, all_tensors))
    return plan


def _unmatched(match: Match, where: str, names: list[str], graph: onnx.GraphProto, tensors: set[str]) -> str:
    """'<where> matched nothing', with the closest names the model does have."""
    import difflib

    def close(patterns: list[str], pool: list[str]) -> list[str]:
        found: list[str] = []
        for p in patterns:
            bare = p[3:] if p.startswith("re:") else p.replace("*", "").replace("?", "")
            found += difflib.get_close_matches(bare, pool, n=3, cutoff=0.5)
        return sorted(set(found))[:5]

    hints = close(match.nodes, names) + close(match.op_types, sorted({n.op_type for n in graph.node}))
    hints += close(match.tensors, sorted(tensors))
    return f"{where} matched nothing" + (f" (close: {', '.join(hints)})" if hints else "")


_OTHER_FLOATS = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.DOUBLE: "float64",
                 onnx.TensorProto.BFLOAT16: "bfloat16"}


def _float_readers(graph: onnx.GraphProto) -> dict[str, str]:
    """Tensors that stay float whatever is quantized, and who reads them: inputs of If/Loop/Scan
    nodes and names their bodies read ("a Loop", "a Loop body"), and graph outputs.

    A weight among them would be held twice if a quantized node read it (float for them, int8
    for it), and the model would grow: piper's nakdimon, whose Keras LSTMs pass their weights to
    a Loop and to a first-step MatMul, was 20.3 MiB float and 24.8 MiB with those MatMuls
    quantized. Other float readers in the main graph do not count: a tied embedding's Gather
    (float when no anchor is near) shares its table with the output projection, and that
    projection's int8 kernel is worth a second copy of a quarter of the table's size."""
    reads: dict[str, str] = {}
    for node in graph.node:
        for body in node_subgraphs(node):  # outer-scope names read at any depth stay float
            reads.update((name, f"a {node.op_type} body") for _, g in iter_graphs(body) for n in g.node
                         for name in n.input)
    for node in graph.node:
        if any(True for _ in node_subgraphs(node)):
            reads.update((name, f"a {node.op_type}") for name in node.input if name)
    reads.update((name, "a graph output") for name in (o.name for o in graph.output))
    return reads


def _weight_plan(name: str, scheme: QuantScheme, node: onnx.NodeProto, rank: int) -> WeightPlan:
    """The scheme's axis for this weight; per-tensor where the op has no such axis."""
    axis = None
    if isinstance(scheme.granularity, PerChannel):
        axis = weight_axis(node, rule_for(node), rank)
    elif isinstance(scheme.granularity, PerBlock):
        axis = block_axis(node, rank)
    if axis is None:
        scheme = replace(scheme, granularity=PerTensor())
    return WeightPlan(name, scheme, axis)


def _known_range(tensors: list[str], graph: onnx.GraphProto, producer: dict[str, int],
                 moving: set[int]) -> tuple[float, float] | None:
    """The range a group holds without calibration: when every member that does not come out
    of the group's own data movement (`moving`: Reshape, Concat, ... whose values are their
    inputs') is the output of an op with a known range (Sigmoid, Softmax: [0, 1]), the union
    of those ranges; else None (calibrate). One member of known range does not fix the group:
    a detector's head concatenates raw box offsets with Sigmoid scores, and [0, 1] for all of
    them would clip every box offset."""
    ranges = []
    for t in tensors:
        j = producer.get(t)
        if j in moving:
            continue
        op = graph.node[j].op_type if j is not None else None
        if op not in OUTPUT_RANGES:
            return None
        ranges.append(OUTPUT_RANGES[op])
    if not ranges:
        return None
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _static_clip(node: onnx.NodeProto, inits: dict) -> bool:
    """Relu always folds; Clip folds when its bounds are attributes or constants."""
    return node.op_type == "Relu" or all(name in inits or not name for name in node.input[1:])


def _data_consts(node: onnx.NodeProto, inits: dict) -> list[str]:
    rule = rule_for(node)
    return [node.input[k] for k in activation_inputs(node, rule) if node.input[k] in inits]


def assign_ranges(plan: Plan, model: onnx.ModelProto, table: CalibrationTable, settings: RangeSettings) -> Plan:
    """Give every group its range (union of its members' calibrated ranges) and qparams."""
    inits = {t.name: t for t in model.graph.initializer}
    for group in plan.groups:
        if group.fixed_range is not None:
            lo, hi = group.fixed_range
        elif group.constant is not None:
            values = onnx.numpy_helper.to_array(inits[group.constant])
            lo, hi = float(values.min()), float(values.max())
        else:
            mine = replace(
                settings,
                dtype=group.scheme.dtype.name,
                symmetric=group.scheme.symmetric,
                **(group.settings or {}),
            )
            ranges = [table.range(t, mine) for t in group.tensors if t in table.observers]
            if not ranges:
                raise CalibrationError(
                    f"the calibration has no statistics for tensor {group.tensors[0]!r}",
                    hint="calibrate with the same model and --config as quantize (or use --data)",
                )
            lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        group.range = (lo, hi)
        group.scale, group.zero_point = choose_qparams(lo, hi, group.scheme.dtype, group.scheme.symmetric)
    return plan
