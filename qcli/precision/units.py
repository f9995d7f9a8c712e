"""Units: the compute nodes auto-precision decides on, and the config that writes the choices.

A unit is one compute node the plan quantizes (Conv, MatMul, Gemm, Add, Mul, ...: the nodes
onnxruntime fuses into an int8 kernel); data-movement nodes follow their neighbours through the
shared-qparams groups; an embedding table stored int8 (the `gather` form, or a static Gather
sharing its table's scale) is a unit too, whose only promotion is float (its Gather computes
nothing), and so is a node the config runs in float16/bfloat16 that computes (`half`: promoted,
it runs in float32; data movement and clipping are exact in any float type, and the ops
qcli.half keeps float32 by rule are float32 already).
Nodes that read one constant weight (an unrolled decoder's steps sharing a cell's weights) are one
unit, so that the weight is stored once, in one precision. A unit stays int8 (the config's
default) or is promoted (`dynamic`: int8 weights, activations quantized at run time, for ops with
a dynamic form; `int16` activations, A16W8, or under a weight-only config (activations float)
int16 weights; `float16`/`bfloat16`, the node in that type; or `float`), or gets `int4` weights
(per channel). Every choice is an ordinary override on the nodes' names, appended after the
user's, so the choices are a config that `qcli quantize --config` reproduces exactly. `alone` cuts
a plan down to one unit: what it costs on its own (the sensitivity report,
qcli.precision.sensitivity).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

import onnx

from qcli.config import HALF_PRECISIONS, ActivationDtype, Activations, Config, Match, Override, Weights
from qcli.graph import iter_graphs
from qcli.half import moves_only, subgraph_reads
from qcli.info import element_count
from qcli.plan import Plan
from qcli.rules import FLOAT32_IN_HALF, dynamic_rule, rule_for, weight_only_rule

# run-time int8 activations; 16-bit ones (int8 weights); the node in float16/bfloat16; float
Promotion = Literal["dynamic", "int16", "float16", "bfloat16", "float"]
Choice = Literal["dynamic", "int16", "float16", "bfloat16", "float", "int4"]  # a promotion, or int4 weights
PROMOTIONS: tuple[Promotion, ...] = ("dynamic", "int16", "float16", "bfloat16", "float")
CHOICES: tuple[Choice, ...] = ("int4", *PROMOTIONS)  # the order of their overrides
Choices = dict[str, Choice]  # unit (node name) -> its precision; a unit not in it stays int8
Costs = dict[str, tuple[Promotion, float]]  # unit -> its cheapest promotion, and its cost in µs per run


@dataclass(frozen=True)
class Unit:
    node: str  # display name: what `overrides[].match.nodes` matches
    op_type: str
    index: int
    tensors: frozenset[str]  # what it reads and writes (for attributing Q/DQ kernel time)
    weighted: bool = False  # has a constant weight (a candidate for int4 weights)
    dynamic: bool = False  # statically quantized and its op has a dynamic form (a `dynamic` candidate)
    mates: tuple[str, ...] = ()  # the other nodes reading its weight: they take its precision
    table: bool = False  # an int8 embedding table (a Gather): float is its only promotion
    half: bool = False  # runs in float16/bfloat16: float (float32) is its only promotion
    params: int = 0  # elements of its constant weights (what int4 stores in half a byte each instead of one)

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.mates)


def find_units(model: onnx.ModelProto, plan: Plan) -> list[Unit]:
    """The plan's quantized compute nodes, in graph order; nodes reading one constant weight are
    one unit (the first of them, with the others as its mates)."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    folded: dict[str, list[int]] = {}  # node -> the nodes folded into it (their outputs are its own)
    for d in plan.nodes:
        if d.folded_into is not None:
            folded.setdefault(d.folded_into, []).append(d.index)
    units: list[Unit] = []
    owner: dict[str, int] = {}  # weight -> the position in `units` of the first unit reading it
    half = set(plan.half)
    float_constants = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    tables = {g.constant for g in plan.groups if g.constant is not None}
    # every graph's initializers (a Loop body's weights too): a unit's `params`
    elements = {t.name: element_count(t.dims) for _, g in iter_graphs(graph) for t in g.initializer}
    for d in plan.nodes:
        node = graph.node[d.index]
        rule = rule_for(node)
        # an int8 embedding table: the dynamic config's gather form, or a static Gather sharing its
        # constant table's scale (a group holding the table)
        table = (plan.dynamic[d.index].form == "gather" if d.dynamic else
                 d.quantized and not d.reason and node.op_type == "Gather" and node.input[0] in tables)
        if table:
            units.append(Unit(d.name, d.op_type, d.index, frozenset(t for t in node.output if t), table=True))
            continue
        if d.index in plan.control_flow:  # weights only its bodies read (qcli.plan.controlflow)
            weights = plan.control_flow[d.index]
            units.append(Unit(d.name, d.op_type, d.index, frozenset([*weights, *(t for t in node.output if t)]), True,
                              params=sum(elements.get(w, 0) for w in weights)))
            continue
        if d.index in half:
            if _rounds_in_half(node, float_constants):
                units.append(Unit(d.name, d.op_type, d.index, frozenset(t for t in node.output if t), half=True))
            continue
        # which inputs are weights: the dynamic form's (an LSTM has no static rule), else the op's
        # (a recurrent cell the plan quantized statically: weight-only, rules.WEIGHT_ONLY)
        rule = rule or (weight_only_rule(node, inits) if d.quantized and not d.dynamic else None)
        form = dynamic_rule(node)[0] if d.dynamic else rule if rule is not None and rule.kind == "compute" else None
        if not d.quantized or d.reason or form is None:
            continue
        tensors = set(node.input) | set(node.output)
        for j in folded.get(d.name, []):
            tensors |= set(graph.node[j].output)
        weights = [node.input[k] for k in form.weights if k < len(node.input) and node.input[k] in inits]
        unit = Unit(d.name, d.op_type, d.index, frozenset(t for t in tensors if t), bool(weights),
                    not d.dynamic and _has_dynamic_form(node, inits), params=sum(elements.get(w, 0) for w in weights))
        shared = next((owner[w] for w in weights if w in owner), None)
        if shared is None:
            owner.update(dict.fromkeys(weights, len(units)))
            units.append(unit)
        else:  # its weight is read by an earlier unit: it moves with that one
            first = units[shared]
            units[shared] = replace(first, tensors=first.tensors | unit.tensors, mates=(*first.mates, unit.node),
                                    dynamic=first.dynamic and unit.dynamic)
            owner.update(dict.fromkeys(weights, shared))
    return units


def _rounds_in_half(node: onnx.NodeProto, float_constants: set[str]) -> bool:
    """Whether a node run in float16/bfloat16 rounds anything float32 would not: it does more than
    move values (`qcli.half.moves_only`) and is not an op qcli.half keeps float32 by rule; control
    flow rounds the float constants its subgraphs read (stored in the type; they compute in float32)."""
    if node.op_type in FLOAT32_IN_HALF:
        return False
    reads = subgraph_reads(node)
    if reads:
        return not reads.isdisjoint(float_constants)
    return not moves_only(node, float_constants)


def alone(plan: Plan, model: onnx.ModelProto, unit: Unit) -> Plan:
    """`plan` (of `model`, ranges assigned) cut down to `unit`: what the unit costs on its own.
    A half unit alone is the float model with that node in float16/bfloat16. Otherwise kept: the
    Q/DQ pairs of the tensors the unit reads and writes, with the scales the whole plan gave them
    (a tensor it shares with other units, say an input three projections read, counts for each
    of them), its weights, biases and dynamic form; nothing else. Other nodes reading its inputs
    read them in float; readers of its outputs read them quantized, as in the whole model."""
    mine = {d.index for d in plan.nodes if d.name in unit.nodes or d.folded_into in unit.nodes}
    graph = model.graph
    if unit.half:
        touched = {t for i in mine for t in (*graph.node[i].input, *graph.node[i].output)}
        return replace(plan, groups=[], weights={}, biases={}, dynamic={}, half=sorted(mine),
                       half_tensors=[t for t in plan.half_tensors if t in touched])
    reads = {t for i in mine for t in graph.node[i].input if t}
    writes = unit.tensors - reads
    groups = [replace(g, tensors=kept, constant=g.constant if g.constant in kept else None)
              for g in plan.groups if (kept := [t for t in g.tensors if t in unit.tensors])]
    weights = {w: p for w, p in plan.weights.items() if w in unit.tensors}
    float_readers = {j for j, node in enumerate(graph.node)
                     if j not in mine and reads.intersection(node.input) and not writes.intersection(node.input)}
    return replace(
        plan, groups=groups, weights=weights,
        biases={k: b for k, b in plan.biases.items() if b.name in unit.tensors and b.weight in weights},
        dynamic={i: d for i, d in plan.dynamic.items() if i in mine},
        keep_float=plan.keep_float | float_readers,
        half=[], half_tensors=[],  # float16/bfloat16 nodes are not units: float32 in a one-unit model
    )


def _has_dynamic_form(node: onnx.NodeProto, inits: set[str]) -> bool:
    rule, _ = dynamic_rule(node)
    return rule is not None and all(k < len(node.input) and node.input[k] in inits for k in rule.weights)


def _exact(name: str) -> str:
    """A `nodes:` pattern matching exactly `name` (a regex when the name has glob characters)."""
    return f"re:{re.escape(name)}" if any(c in name for c in "*?[") else name


def promoted_config(config: Config, choices: Choices, units: list[Unit]) -> Config:
    """`config` plus one override per chosen precision (nodes in graph order), search off."""
    order = {u.node: u.index for u in units}
    mates = {u.node: u.nodes for u in units}
    overrides = list(config.overrides)
    for precision in CHOICES:
        nodes = sorted((n for n, p in choices.items() if p == precision), key=lambda n: order.get(n, 0))
        if nodes:
            names = [m for n in nodes for m in mates.get(n, (n,))]
            overrides.append(_override(config, precision, Match(nodes=[_exact(m) for m in names])))
    return config.model_copy(update={
        "overrides": overrides,
        "auto_precision": config.auto_precision.model_copy(update={"enabled": False}),
    })


def _override(config: Config, precision: Choice, match: Match) -> Override:
    """The override giving the matched nodes `precision`."""
    if precision == "int4":
        return Override(match=match, weights=Weights(dtype="int4", symmetric=True, granularity="per_channel"))
    if precision in ("float", "dynamic", *HALF_PRECISIONS):
        return Override(match=match, precision=precision)
    if config.activations.dtype == "float":  # weight-only: 16 bits where the weights widen
        return Override(match=match, weights=Weights(dtype="int16", symmetric=True, granularity="per_channel"))
    wide: ActivationDtype = "uint16" if config.activations.dtype in ("uint8", "uint16") else "int16"
    return Override(match=match, activations=Activations(dtype=wide, symmetric=config.activations.symmetric))
