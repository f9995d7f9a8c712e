"""Which nodes are quantized dynamically (docs/guides/formats.md): those whose mode is
dynamic (`activations.mode: dynamic`, or an override's `precision: dynamic`) and whose op has a
dynamic form (rules.DYNAMIC) over float32 tensors and constant float32 weights. Their weights
are 8-bit (the config's `weights:`, per channel along the output channels); their activations
get no Q/DQ and no calibration: onnxruntime's kernels quantize them at run time. The other
nodes in dynamic mode stay float, each with its reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from qcli.config import Weights
from qcli.plan.context import Context
from qcli.plan.result import DynamicNode, WeightPlan
from qcli.plan.weights import weight_scheme
from qcli.rules import RULES, dynamic_rule, weight_axis
from qcli.scheme import PerChannel, PerTensor


@dataclass(frozen=True)
class Dynamic:
    nodes: dict[int, DynamicNode] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)  # nodes in dynamic mode that stay float, and why


def plan_dynamic(ctx: Context) -> Dynamic:
    """The dynamic nodes with their weights' plans, and why the other nodes in dynamic mode stay float."""
    out = Dynamic()
    reads = ctx.float_reads
    for i in sorted(ctx.selections.dynamic):
        reason = why_not_dynamic(ctx, i, reads)
        if reason is not None:
            out.reasons[i] = reason
            continue
        rule, _ = dynamic_rule(ctx.node(i))
        assert rule is not None and rule.form is not None  # why_not_dynamic checked it
        scheme = weights_of(ctx, i)
        plans = tuple(dynamic_weight(ctx, i, ctx.node(i).input[k], scheme) for k in rule.weights)
        out.nodes[i] = DynamicNode(i, rule.form, plans)
    return out


def why_not_dynamic(ctx: Context, i: int, reads: Mapping[str, str]) -> str | None:
    """Why node `i`, in dynamic mode, stays float (None: it is quantized dynamically)."""
    node, index = ctx.node(i), ctx.index
    if i in ctx.selections.off_nodes:
        return "excluded by config"
    rule, reason = dynamic_rule(node)
    if rule is None:
        return reason
    if rule.form == "gather" and ctx.config.weights.embeddings == "float":
        return "weights.embeddings: float keeps embedding tables float"
    weights = [node.input[k] if k < len(node.input) else "" for k in rule.weights]
    if not all(w in index.initializers for w in weights):
        return "its weight is not a constant"
    if not all(index.is_float(w) for w in weights):
        return "its weight is not float32"
    if any(0 in index.initializers[w].dims for w in weights):
        return "its weight is empty (a zero dimension): nothing to quantize"
    touched = [node.input[0]] + [o for o in node.output if o]
    if not all(index.is_float(t) for t in touched):
        return "not float32"
    shared = [w for w in weights if w in reads]
    if shared and i not in ctx.selections.asked_dynamic:
        return f"its weight is also read in float (by {reads[shared[0]]}): int8 would store it twice"
    return None


def weights_of(ctx: Context, i: int) -> Weights:
    """The `weights:` section for node `i`: the last override selecting it that has one, else the
    config's (the schema keeps dynamic weights 8-bit; an override's 4-bit or per-block weights
    for a node that only its mode makes dynamic fall back to int8 per channel; an LSTM's are
    int8 symmetric, the only weights its kernel takes)."""
    chosen = ctx.config.weights
    for _, o, sel in ctx.selections.overrides:
        if o.weights is not None and i in sel.nodes:
            chosen = o.weights
    if chosen.dtype not in ("int8", "uint8") or chosen.granularity == "per_block":
        chosen = Weights()
    if ctx.node(i).op_type == "LSTM" and (chosen.dtype != "int8" or not chosen.symmetric):
        # DynamicQuantizeLSTM takes int8 weights with zero points of 0 only (onnxruntime
        # refuses others when it runs): its weights are int8 symmetric whatever the section
        chosen = chosen.model_copy(update={"dtype": "int8", "symmetric": True})
    return chosen


def dynamic_weight(ctx: Context, i: int, name: str, section: Weights) -> WeightPlan:
    """The plan of a dynamic node's weight, per channel along its output channels (MatMul: N;
    Gemm: N, by transB; LSTM: the 4 x hidden rows of each direction; Gather: a table's
    columns), else per tensor."""
    node, rank = ctx.node(i), len(ctx.index.initializers[name].dims)
    scheme = weight_scheme(section)
    axis = None
    if isinstance(scheme.granularity, PerChannel) and node.op_type == "Gather":
        axis = rank - 1 if rank >= 2 else None  # a table's columns: the gathered rows keep that axis last
    elif isinstance(scheme.granularity, PerChannel):
        static = RULES.get(node.op_type)
        axis = weight_axis(node, static, rank) if static is not None else (1 if rank == 3 else None)
    if axis is None:
        scheme = replace(scheme, granularity=PerTensor())
    return WeightPlan(name, scheme, axis)


EMBEDDING_MIN = 1024  # values in a Gather table worth an int8 copy (smaller ones stay float)


def embedding_tables(ctx: Context, static: frozenset[int], planned: Dynamic, activations: set[str]) -> Dynamic:
    """`planned` plus the float Gathers of large constant tables (embeddings) that the static
    plan leaves float: their tables int8 per column, the rows read dequantized after the Gather
    (the `gather` form: no activation is quantized, so it costs no Q/DQ pair), as onnxruntime's
    quantize_dynamic stores them. A 30k-word table is most of a small encoder's file.
    `weights.embeddings`: `auto` skips the Gathers the static plan takes (a weight-only config's:
    they stay float), `int8` only those whose output it quantizes (in `activations`), `float` all."""
    mode = ctx.config.weights.embeddings
    if mode == "float":
        return planned
    reads = ctx.float_reads
    readers = Counter(name for node in ctx.index.graph.node for name in node.input)
    found = dict(planned.nodes)
    for i, node in enumerate(ctx.index.graph.node):
        if node.op_type != "Gather" or i in found or i in planned.reasons:
            continue
        if i in static and (mode == "auto" or node.output[0] in activations):
            continue
        table = ctx.index.initializers.get(node.input[0])
        if table is None or len(table.dims) != 2 or table.dims[0] * table.dims[1] < EMBEDDING_MIN:
            continue
        if readers[node.input[0]] != 1:  # a tied table (read by a projection too): one copy, as planned
            continue
        if why_not_dynamic(ctx, i, reads) is None and node.input[0] not in reads:
            found[i] = DynamicNode(i, "gather", (dynamic_weight(ctx, i, node.input[0], weights_of(ctx, i)),))
    return Dynamic(found, planned.reasons)
