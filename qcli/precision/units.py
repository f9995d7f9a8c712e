"""Units: the compute nodes auto-precision decides on, and the config that writes the choices.

A unit is one compute node the plan quantizes (Conv, MatMul, Gemm, Add, Mul, ...: the nodes
onnxruntime fuses into an int8 kernel); data-movement nodes follow their neighbours through the
shared-qparams groups. A unit stays int8 (the config's default) or is promoted (`int16`
activations, A16W8, or `float`), or gets `int4` weights. Every choice is an ordinary override on
the node's name, appended after the user's, so the choices are a config that `qcli quantize
--config` reproduces exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import onnx

from qcli.config import ActivationDtype, Activations, Config, Match, Override, Weights
from qcli.plan import Plan
from qcli.rules import rule_for

Promotion = Literal["int16", "float"]  # 16-bit activations around the node (int8 weights), or float
Choice = Literal["int16", "float", "int4"]  # a unit's precision other than int8: a promotion, or int4 weights
PROMOTIONS: tuple[Promotion, ...] = ("int16", "float")
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


def find_units(model: onnx.ModelProto, plan: Plan) -> list[Unit]:
    """The plan's quantized compute nodes, in graph order."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    folded: dict[str, list[int]] = {}  # node -> the nodes folded into it (their outputs are its own)
    for d in plan.nodes:
        if d.folded_into is not None:
            folded.setdefault(d.folded_into, []).append(d.index)
    units = []
    for d in plan.nodes:
        node = graph.node[d.index]
        rule = rule_for(node)
        if not d.quantized or d.reason or rule is None or rule.kind != "compute":
            continue
        tensors = set(node.input) | set(node.output)
        for j in folded.get(d.name, []):
            tensors |= set(graph.node[j].output)
        weighted = any(k < len(node.input) and node.input[k] in inits for k in rule.weights)
        units.append(Unit(d.name, d.op_type, d.index, frozenset(t for t in tensors if t), weighted))
    return units


def _exact(name: str) -> str:
    """A `nodes:` pattern matching exactly `name` (a regex when the name has glob characters)."""
    return f"re:{re.escape(name)}" if any(c in name for c in "*?[") else name


def promoted_config(config: Config, choices: Choices, units: list[Unit]) -> Config:
    """`config` plus one override per chosen precision (nodes in graph order), search off."""
    order = {u.node: u.index for u in units}
    overrides = list(config.overrides)
    for precision in CHOICES:
        nodes = sorted((n for n, p in choices.items() if p == precision), key=lambda n: order.get(n, 0))
        if nodes:
            overrides.append(_override(config, precision, Match(nodes=[_exact(n) for n in nodes])))
    return config.model_copy(update={
        "overrides": overrides,
        "auto_precision": config.auto_precision.model_copy(update={"enabled": False}),
    })


def _override(config: Config, precision: Choice, match: Match) -> Override:
    """The override giving the matched nodes `precision`."""
    if precision == "int4":
        return Override(match=match, weights=Weights(dtype="int4", symmetric=True, granularity="per_channel"))
    if precision == "float":
        return Override(match=match, precision="float")
    wide: ActivationDtype = "uint16" if config.activations.dtype in ("uint8", "uint16") else "int16"
    return Override(match=match, activations=Activations(dtype=wide, symmetric=config.activations.symmetric))
