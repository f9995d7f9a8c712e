"""Decide how every tensor of a (prepared) model is quantized: the plan `qdq.py` materializes.

Two steps. `make_plan(model, config)` decides the structure from the op rules (rules.py) and
the config alone: which nodes are quantized (and why others stay float), which activations get
a Q/DQ pair, which activations share one scale (groups, by union-find over tensors joined by
`shares` ops, as pt2e's SharedQuantizationSpec), which initializers are weights and biases.
`assign_ranges(plan, table)` then gives each group its range from the calibration table and
turns it into scale and zero point. Calibration observes exactly `plan.calibrated_tensors`.

Decisions (README "What gets quantized" says the same):
- A compute node is quantized when its rule says so, its activation inputs and outputs are
  float tensors, its weight (Conv, ConvTranspose) is an initializer, and the config does not
  exclude it or any of its tensors.
- Relu/Clip right after a quantized producer are folded: the producer's output gets no Q/DQ,
  the clipped output does (onnxruntime then drops the Relu into the int8 kernel).
- Data-movement ops (`shares`) are quantized when a neighbouring tensor is, sharing its scale,
  so onnxruntime runs them on int8 or drops their Q/DQ pair.
- Int8 pays off in the kernels of Conv, ConvTranspose, MatMul and Gemm ("anchors"). A group of
  connected quantizable nodes without an anchor (say a lone Add between float ops) stays float:
  its Q/DQ pairs would cost more time than its int8 kernel saves.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import numpy as np
import onnx

from qcli.calibrate.table import CalibrationTable, RangeSettings
from qcli.config import Config, Match
from qcli.errors import CalibrationError, ConfigError
from qcli.rules import OUTPUT_RANGES, activation_inputs, rule_for, weight_axis
from qcli.scheme import QuantScheme, choose_qparams

ANCHORS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


@dataclass
class Group:
    """Activations that share one scale and zero point."""

    tensors: list[str]
    scheme: QuantScheme
    constant: str | None = None  # an initializer member (embedding table) fixes the params
    fixed_range: tuple[float, float] | None = None  # known without calibration (rules.OUTPUT_RANGES)
    range: tuple[float, float] | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None


@dataclass(frozen=True)
class WeightPlan:
    name: str  # initializer
    scheme: QuantScheme
    axis: int | None  # per-channel axis, None for per-tensor


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

    def group_of(self, tensor: str) -> Group | None:
        return self._index().get(tensor)

    def _index(self) -> dict[str, Group]:
        return {t: g for g in self.groups for t in g.tensors}

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


def _pattern(text: str, where: str):
    if text.startswith("re:"):
        try:
            regex = re.compile(text[3:])
        except re.error as exc:
            raise ConfigError(f"{where}: regular expression {text[3:]!r} does not compile: {exc}") from None
        return lambda name: regex.fullmatch(name) is not None
    return lambda name: fnmatch.fnmatchcase(name, text)


@dataclass
class _Matcher:
    """One exclude/override `match:`: nodes by name (glob or re:), op types, tensors."""

    where: str
    match: Match
    hits: int = 0

    def __post_init__(self) -> None:
        self.node_tests = [_pattern(p, f"{self.where}.nodes") for p in self.match.nodes]
        self.tensor_tests = [_pattern(p, f"{self.where}.tensors") for p in self.match.tensors]

    def node(self, name: str, op_type: str) -> bool:
        if not (self.match.nodes or self.match.op_types):
            return False
        ok = (not self.match.nodes or any(t(name) for t in self.node_tests)) and (
            not self.match.op_types or op_type in self.match.op_types
        )
        self.hits += ok
        return ok

    def tensor(self, name: str) -> bool:
        ok = bool(self.tensor_tests) and any(t(name) for t in self.tensor_tests)
        self.hits += ok
        return ok


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


def _types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def make_plan(model: onnx.ModelProto, config: Config) -> Plan:
    """The structure of the quantization (no ranges yet); see the module docstring."""
    graph = model.graph
    names = node_names(model)
    types = _types(model)
    inits = {t.name: t for t in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(i)

    def is_float(name: str) -> bool:
        return types.get(name) in FLOAT_TYPES

    excludes = [_Matcher("exclude", config.exclude)]
    float_overrides = [
        _Matcher(f"overrides[{k}].match", o.match) for k, o in enumerate(config.overrides) if o.precision == "float"
    ]
    rules_off = excludes + float_overrides
    excluded_tensors = {
        t for t in {*types, *(o for n in graph.node for o in n.output)} if any(m.tensor(t) for m in rules_off)
    }

    act = QuantScheme.of(config.activations.dtype, "per_tensor", config.activations.symmetric)
    w_cfg = config.weights
    weight_scheme = QuantScheme.of(w_cfg.dtype, w_cfg.granularity, w_cfg.symmetric, w_cfg.block_size)

    reasons: dict[int, str] = {}
    candidates: set[int] = set()
    for i, node in enumerate(graph.node):
        rule = rule_for(node)
        if rule is None:
            reasons[i] = "no int8 kernel for this op" if node.domain in ("", "ai.onnx") else f"custom domain {node.domain}"
            continue
        if any(m.node(names[i], node.op_type) for m in rules_off):
            reasons[i] = "excluded by config"
            continue
        if rule.default_float:
            reasons[i] = rule.reason
            continue
        if rule.kind == "fold":
            reasons[i] = "not after a quantized node"
            continue
        acts = [node.input[k] for k in activation_inputs(node, rule) if node.input[k] not in inits]
        touched = acts + [o for o in node.output if o]
        if any(t in excluded_tensors for t in touched):
            reasons[i] = "a tensor of it is excluded by config"
            continue
        if not all(is_float(t) for t in touched):
            reasons[i] = "not float" if rule.kind == "compute" else "moves non-float data"
            continue
        if rule.kind == "compute":
            weights = [node.input[k] for k in rule.weights if k < len(node.input) and node.input[k]]
            if node.op_type in ("Conv", "ConvTranspose") and not all(w in inits for w in weights):
                reasons[i] = "its weight is not a constant"
                continue
            if any(w in inits and not is_float(w) for w in weights):
                reasons[i] = "its weight is not float"
                continue
        candidates.add(i)

    # Keep only connected groups of candidates that contain an anchor.
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}

    def source(name: str) -> int | None:
        """The node producing `name`, looking through Relu/Clip (they fold into it)."""
        j = producer.get(name)
        while j is not None and (r := rule_for(graph.node[j])) is not None and r.kind == "fold":
            j = producer.get(graph.node[j].input[0])
        return j

    uf = _UnionFind()
    for i in candidates:
        uf.find(str(i))
        for name in graph.node[i].input:
            j = source(name)
            if j in candidates:
                uf.union(str(i), str(j))
    anchored = {uf.find(str(i)) for i in candidates if graph.node[i].op_type in ANCHORS}
    for i in sorted(candidates):
        if uf.find(str(i)) not in anchored:
            candidates.discard(i)
            reasons[i] = "no Conv/MatMul/Gemm next to it: int8 would be slower here"

    plan = Plan()
    quantized_tensors: set[str] = set()
    groups = _UnionFind()
    folded: dict[int, str] = {}
    compute = [i for i in sorted(candidates) if rule_for(graph.node[i]).kind == "compute"]
    for i in compute:
        node, rule = graph.node[i], rule_for(graph.node[i])
        acts = set(activation_inputs(node, rule))
        for k in sorted(acts | {k for k in rule.weights if k < len(node.input) and node.input[k]}):
            name = node.input[k]
            if name not in inits:
                quantized_tensors.add(name)
            elif k in rule.weights:
                axis = None
                if weight_scheme.granularity != "per_tensor":
                    axis = weight_axis(node, rule, len(inits[name].dims))
                scheme = weight_scheme if axis is not None else QuantScheme(
                    weight_scheme.dtype, "per_tensor", weight_scheme.symmetric
                )
                plan.weights.setdefault(name, WeightPlan(name, scheme, axis))
            else:  # a constant operand of Add/Mul: quantized like an activation, from its values
                plan.weights.setdefault(name, WeightPlan(name, act, None))
        if rule.bias is not None and rule.bias < len(node.input) and node.input[rule.bias] in inits:
            weight = node.input[rule.weights[0]]
            if weight in plan.weights and is_float(node.input[rule.bias]):
                plan.biases[node.input[rule.bias]] = BiasPlan(node.input[rule.bias], node.input[0], weight)
        for out in node.output:
            users = consumers.get(out, [])
            fold = (
                users
                and out not in graph_outputs
                and all(
                    (r := rule_for(graph.node[u])) is not None
                    and r.kind == "fold"
                    and reasons.get(u) != "excluded by config"
                    and _static_clip(graph.node[u], inits)
                    and graph.node[u].output[0] not in excluded_tensors
                    for u in users
                )
            )
            if fold:
                for u in users:
                    folded[u] = names[i]
                    quantized_tensors.add(graph.node[u].output[0])
            else:
                quantized_tensors.add(out)

    # Data movement shares its neighbours' scale; iterate until nothing changes.
    shares = [i for i in sorted(candidates) if rule_for(graph.node[i]).kind == "shares"]
    active: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i in shares:
            if i in active:
                continue
            node, rule = graph.node[i], rule_for(graph.node[i])
            data = [node.input[k] for k in activation_inputs(node, rule)]
            members = data + [o for o in node.output if o]
            if any(t in quantized_tensors for t in members):
                active.add(i)
                changed = True
                for t in members:
                    if t not in inits:
                        quantized_tensors.add(t)
                for t in members[1:]:
                    groups.union(members[0], t)
    for i in shares:
        if i not in active:
            candidates.discard(i)
            reasons[i] = "no quantized neighbour"

    # Groups, in graph order of their first tensor.
    order = [i.name for i in graph.input] + [o for n in graph.node for o in n.output]
    position = {name: k for k, name in enumerate(order)}
    members: dict[str, list[str]] = {}
    for t in sorted(quantized_tensors | {t for i in active for t in _data_consts(graph.node[i], inits)}, key=lambda t: (position.get(t, -1), t)):
        members.setdefault(groups.find(t), []).append(t)
    for tensors in members.values():
        constant = next((t for t in tensors if t in inits), None)
        fixed = next(
            (OUTPUT_RANGES[graph.node[producer[t]].op_type] for t in tensors
             if t in producer and graph.node[producer[t]].op_type in OUTPUT_RANGES),
            None,
        )
        group = Group(tensors, act, constant, fixed)
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
    plan.unmatched = [m.where for m in rules_off if m.hits == 0 and (m.match.nodes or m.match.op_types or m.match.tensors)]
    return plan


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
            ranges = []
            for t in group.tensors:
                if t in table.observers:
                    ranges.append(table.range(t, settings))
            if not ranges:
                raise CalibrationError(
                    f"the calibration has no statistics for tensor {group.tensors[0]!r}",
                    hint="calibrate with the same model and --config as quantize (or use --data)",
                )
            lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        group.range = (lo, hi)
        group.scale, group.zero_point = choose_qparams(lo, hi, group.scheme.dtype, group.scheme.symmetric)
    return plan
