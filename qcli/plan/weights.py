"""Which initializers are quantized as weights and as int32 biases, and their schemes: the
config's, then the overrides' in order (later wins)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx

from qcli.config import Activations, Weights
from qcli.plan.context import Context
from qcli.plan.result import BiasPlan, WeightPlan
from qcli.plan.tensors import operands
from qcli.rules import bias_scale_factor, block_axis, channel_repeats, rule_for, weight_axis
from qcli.scheme import PerBlock, PerChannel, PerTensor, QuantScheme, quant_dtype


def activation_scheme(a: Activations) -> QuantScheme | None:
    """None for `dtype: float` (weight-only quantization: activations keep no Q/DQ)."""
    return None if a.dtype == "float" else QuantScheme(quant_dtype(a.dtype), PerTensor(), a.symmetric)


def weight_scheme(w: Weights) -> QuantScheme:
    """The core's typed scheme for the config's weights section (the YAML spelling stops here)."""
    return QuantScheme.of(w.dtype, w.granularity, w.symmetric, w.block_size)


def weight_plan(name: str, scheme: QuantScheme, node: onnx.NodeProto, rank: int) -> WeightPlan:
    """The scheme's axis for this weight; per-tensor where the op has no such axis."""
    axis = None
    if isinstance(scheme.granularity, PerChannel):
        rule = rule_for(node)
        axis = weight_axis(node, rule, rank) if rule is not None else None
    elif isinstance(scheme.granularity, PerBlock):
        axis = block_axis(node, rank)
    if axis is None:
        scheme = replace(scheme, granularity=PerTensor())
    return WeightPlan(name, scheme, axis)


@dataclass(frozen=True)
class Weighted:
    """The initializers the quantized compute nodes read, with the config's schemes."""

    weights: dict[str, WeightPlan]  # weights, and constant operands (of Add, Mul) as activations
    biases: dict[str, BiasPlan]
    users: dict[str, list[int]]  # initializer -> the compute nodes reading it


def plan_weights(ctx: Context, candidates: frozenset[int]) -> Weighted:
    """Each compute candidate's constant weight (per channel or per block along the op's axis),
    constant operand (an activation's scheme, per tensor) and float32 bias (int32, when its
    weight is quantized)."""
    inits = ctx.index.initializers
    default_weight = weight_scheme(ctx.config.weights)
    default_act = activation_scheme(ctx.config.activations)
    weights: dict[str, WeightPlan] = {}
    users: dict[str, list[int]] = {}
    for i in sorted(candidates):
        if not ctx.is_kind(i, "compute"):
            continue
        node, rule = ctx.node(i), ctx.rule(i)
        for k in operands(ctx, i):
            name = node.input[k]
            if name not in inits:
                continue
            users.setdefault(name, []).append(i)
            if k in rule.weights:
                weights.setdefault(name, weight_plan(name, default_weight, node, len(inits[name].dims)))
            elif default_act is not None:  # a constant operand of Add/Mul: quantized like an activation
                weights.setdefault(name, WeightPlan(name, default_act, None))
    return Weighted(weights, plan_biases(ctx, candidates, weights), users)


def plan_biases(ctx: Context, candidates: frozenset[int], weights: dict[str, WeightPlan]) -> dict[str, BiasPlan]:
    """The candidates' biases as int32 (`bias_grid`), keyed by the int32 copy's name: the bias's
    own, then `<bias>_<k>` for each further grid of a bias that nodes of different grids share
    (each fused kernel adds the integers to its own accumulator as they are)."""
    grids: dict[str, dict[BiasPlan, list[int]]] = {}  # bias -> each grid's nodes, in order
    for i in sorted(candidates):
        grid = bias_grid(ctx, i, weights)
        if grid is not None:
            grids.setdefault(grid.name, {}).setdefault(grid, []).append(i)
    return {
        f"{name}_{k}" if k else name: replace(grid, nodes=tuple(nodes))
        for name, plans in grids.items() for k, (grid, nodes) in enumerate(plans.items())
    }


def bias_grid(ctx: Context, i: int, weights: dict[str, WeightPlan]) -> BiasPlan | None:
    """Compute node `i`'s float32 bias on its accumulator grid (rules.bias_scale_factor,
    rules.channel_repeats) when its weight is quantized. None: no such bias, or it stays float
    (its factor is not positive; it is also read as a weight or operand, its one quantized form)."""
    if not ctx.is_kind(i, "compute"):
        return None
    node, rule = ctx.node(i), ctx.rule(i)
    name = node.input[rule.bias] if rule.bias is not None and rule.bias < len(node.input) else ""
    factor = bias_scale_factor(node)
    if name not in ctx.index.initializers or name in weights or not ctx.index.is_float(name) or factor is None:
        return None
    weight = node.input[rule.weights[0]]
    return BiasPlan(name, node.input[0], weight, factor, channel_repeats(node)) if weight in weights else None


def overridden_weights(ctx: Context, weighted: Weighted) -> dict[str, WeightPlan]:
    """The weights with each override's `weights:` applied, in order: to the weights it names
    and to those of the nodes it selects."""
    weights = dict(weighted.weights)
    for _, o, sel in ctx.selections.overrides:
        if o.precision == "float" or o.weights is None:
            continue
        for name, users in weighted.users.items():
            if name in weights and (name in sel.tensors or any(u in sel.nodes for u in users)):
                rank = len(ctx.index.initializers[name].dims)
                weights[name] = weight_plan(name, weight_scheme(o.weights), ctx.node(users[0]), rank)
    return weights
