"""Which initializers are quantized as weights and as int32 biases, and their schemes: the
config's, then the overrides' in order (later wins)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx

from qcli.config import NO_QDQ, Activations, Weights
from qcli.plan.context import Context
from qcli.plan.result import BiasPlan, WeightPlan
from qcli.plan.tensors import operands
from qcli.rules import OpRule, bias_scale_factor, block_axis, channel_repeats, rule_for, weight_axis
from qcli.scheme import PerBlock, PerChannel, PerTensor, QuantScheme, quant_dtype


def activation_scheme(a: Activations) -> QuantScheme | None:
    """None for `dtype: float` (weight-only quantization: activations keep no Q/DQ)."""
    return None if a.dtype == "float" else QuantScheme(quant_dtype(a.dtype), PerTensor(), a.symmetric)


def weight_scheme(w: Weights) -> QuantScheme:
    """The core's typed scheme for the config's weights section (the YAML spelling stops here)."""
    return QuantScheme.of(w.dtype, w.granularity, w.symmetric, w.block_size)


def weight_plan(name: str, scheme: QuantScheme, node: onnx.NodeProto, rank: int, rule: OpRule | None = None
                ) -> WeightPlan:
    """The scheme's axis for this weight (by `rule`, default the op's); per-tensor where the op
    has no such axis."""
    axis = None
    rule = rule or rule_for(node)
    if isinstance(scheme.granularity, PerChannel):
        axis = weight_axis(node, rule, rank) if rule is not None else None
    elif isinstance(scheme.granularity, PerBlock):
        axis = block_axis(node, rank)
    if axis is None:
        scheme = replace(scheme, granularity=PerTensor())
    return WeightPlan(name, scheme, axis)


Reader = tuple[int, int]  # (node, input position)


@dataclass(frozen=True)
class Weighted:
    """The initializers the quantized compute nodes read, with the config's schemes."""

    weights: dict[str, WeightPlan]  # weights, and constant operands (of Add, Mul) as activations
    biases: dict[str, BiasPlan]
    readers: dict[str, list[Reader]]  # initializer -> where the compute nodes read it


def plan_weights(ctx: Context, candidates: frozenset[int]) -> Weighted:
    """Each compute candidate's constant weight (per channel or per block along the op's axis),
    constant operand (an activation's scheme, per tensor) and float32 bias (int32, when its
    weight is quantized)."""
    readers: dict[str, list[Reader]] = {}
    for i in sorted(candidates):
        if ctx.is_kind(i, "compute"):
            for k in operands(ctx, i):
                if (name := ctx.node(i).input[k]) in ctx.index.initializers:
                    readers.setdefault(name, []).append((i, k))
    weight, act = weight_scheme(ctx.config.weights), activation_scheme(ctx.config.activations)
    weights = {name: plan for name, where in readers.items()
               if (plan := agreed_plan(ctx, name, where, weight, act)) is not None}
    return Weighted(weights, plan_biases(ctx, candidates, weights), readers)


def agreed_plan(
    ctx: Context, name: str, readers: list[Reader], weight: QuantScheme, operand: QuantScheme | None
) -> WeightPlan | None:
    """One plan for an initializer, from where the quantized nodes read it: the first reader's
    (`weight` along its op's axis at a weight input, else `operand` per tensor; None: not
    quantized there). Per tensor when two readers would scale it along different axes: one
    node's output channels are another's reduction axis (a matrix that a MatMul and a transB=1
    Gemm share, a MatMul's weight that another reads as its first operand), and one node's
    kernel would take the other's per-channel scales for its own."""
    rank = len(ctx.index.initializers[name].dims)
    plans = []
    for i, k in readers:
        if k in ctx.rule(i).weights:
            plans.append(weight_plan(name, weight, ctx.node(i), rank, ctx.rule(i)))
        elif operand is not None:
            plans.append(WeightPlan(name, replace(operand, granularity=PerTensor()), None))
    if not plans or all(p.axis == plans[0].axis for p in plans):
        return plans[0] if plans else None
    return WeightPlan(name, replace(plans[0].scheme, granularity=PerTensor()), None)


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
    if weight in weights and weights[weight].scheme.dtype.is_float:
        return None  # float8 weights: the bias stays float32, as TensorRT's FP8 recipes keep it
    return BiasPlan(name, node.input[0], weight, factor, channel_repeats(node)) if weight in weights else None


def overridden_weights(ctx: Context, weighted: Weighted) -> dict[str, WeightPlan]:
    """The weights with each override's `weights:` applied, in order: to the weights it names
    and to those of the nodes it selects (operands too, per tensor)."""
    weights = dict(weighted.weights)
    for _, o, sel in ctx.selections.overrides:
        if o.precision in NO_QDQ or o.weights is None:
            continue
        scheme = weight_scheme(o.weights)
        for name, readers in weighted.readers.items():
            if name in weights and (name in sel.tensors or any(i in sel.nodes for i, _ in readers)):
                weights[name] = agreed_plan(ctx, name, readers, scheme, scheme) or weights[name]
    return weights


def blocks_beside_quantized_activations(
    ctx: Context, weights: dict[str, WeightPlan], readers: dict[str, list[Reader]], quantized: set[str]
) -> tuple[dict[str, WeightPlan], list[str]]:
    """8-bit per-block weights of nodes whose activation inputs are quantized, per channel
    instead (with a note): onnxruntime fuses such a node into its int8 kernel (QLinearConv,
    MatMulIntegerToFloat), which takes one scale per output channel and fails on blocks.
    Weight-only nodes and 4-bit blocks keep theirs: nothing fuses them."""
    out, notes = dict(weights), []
    for name, plan in weights.items():
        if not isinstance(plan.scheme.granularity, PerBlock) or plan.scheme.dtype.bits != 8:
            continue
        beside = [i for i, _ in readers.get(name, []) if quantized.intersection(ctx.node(i).input)]
        if beside:
            node = ctx.node(beside[0])
            rank = len(ctx.index.initializers[name].dims)
            out[name] = weight_plan(name, replace(plan.scheme, granularity=PerChannel()), node, rank)
            notes.append(f"weight {name}: {plan.scheme.dtype.name} per_block runs per_channel beside quantized "
                         f"activations (onnxruntime's int8 kernels take one scale per output channel)")
    return out, notes


def two_bits_on_matmuls(
    ctx: Context, weights: dict[str, WeightPlan], readers: dict[str, list[Reader]], quantized: set[str]
) -> tuple[dict[str, WeightPlan], list[str]]:
    """2-bit weights that onnxruntime cannot run as MatMulNBits (a reader other than a MatMul's
    second input, or one whose activations are quantized) in 4 bits of the same sign instead,
    with a note: a 2-bit DequantizeLinear feeding anything else has no kernel that reads it."""
    out, notes = dict(weights), []
    for name, plan in weights.items():
        if plan.scheme.dtype.bits != 2:
            continue
        others = [ctx.node(i) for i, k in readers.get(name, [])
                  if ctx.node(i).op_type != "MatMul" or k != 1 or quantized.intersection(ctx.node(i).input)]
        if others:
            four = quant_dtype("int4" if plan.scheme.dtype.signed else "uint4")
            out[name] = replace(plan, scheme=replace(plan.scheme, dtype=four))
            notes.append(f"weight {name}: {plan.scheme.dtype.name} runs in onnxruntime only as MatMulNBits (a float "
                         f"MatMul's weight); {others[0].op_type} {others[0].name or others[0].output[0]!r} reads it: "
                         f"{four.name} instead")
    return out, notes
