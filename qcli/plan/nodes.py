"""Which nodes are quantized: a screen of each node on its own, then phases that each reject
some of the remaining candidates, every rejection with its reason (docs/guides/quantization.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from qcli.plan.context import Context, UnionFind

#: The reason of a node a config rule keeps float by naming one of its tensors.
TENSOR_EXCLUDED = "a tensor of it is excluded by config"

_OTHER_FLOATS: dict[int, str] = {
    onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.BFLOAT16: "bfloat16",
}


@dataclass(frozen=True)
class Candidates:
    """Nodes that may still be quantized, and why each other node stays float."""

    nodes: frozenset[int]
    reasons: Mapping[int, str] = field(default_factory=dict)

    def without(self, rejected: Mapping[int, str]) -> Candidates:
        """These candidates less the `rejected` ones (node -> reason)."""
        return Candidates(self.nodes - rejected.keys(), {**self.reasons, **rejected})


@dataclass(frozen=True)
class Screened:
    candidates: Candidates
    keep_float: frozenset[int]  # nodes the config keeps float: they read their inputs unquantized


def screen(ctx: Context) -> Screened:
    """Every node judged on its own (`why_not_candidate`). The nodes the config excludes, and
    those it keeps float by excluding a tensor of theirs, read their inputs unquantized."""
    nodes: set[int] = set()
    reasons: dict[int, str] = {}
    keep_float = set(ctx.selections.off_nodes)
    for i in range(len(ctx.index.graph.node)):
        reason = why_not_candidate(ctx, i)
        if reason is None:
            nodes.add(i)
            continue
        reasons[i] = reason
        if reason == TENSOR_EXCLUDED:
            keep_float.add(i)
    return Screened(Candidates(frozenset(nodes), reasons), frozenset(keep_float))


def why_not_candidate(ctx: Context, i: int) -> str | None:
    """Why node `i` cannot be quantized, whatever its neighbours (None: it may be). A node may
    be when its rule says so, its activation inputs and outputs are float32 tensors, its weight
    is a float32 constant where its kernel needs one, and the config excludes none of it."""
    node, rule, index, sel = ctx.node(i), ctx.rules[i], ctx.index, ctx.selections
    if i in sel.half:
        return f"{ctx.config.half} asked for"
    if rule is None or rule.kind == "shape":
        return "no int8 kernel for this op" if node.domain in ("", "ai.onnx") else f"custom domain {node.domain}"
    if i in sel.off_nodes:
        return "excluded by config"
    if rule.default_float and not sel.asked_for(i):
        return rule.reason
    if rule.kind == "fold":
        return "not after a quantized node"  # `quantize_tensors` folds those that are
    acts = [name for name in ctx.activations(i) if name not in index.initializers]
    touched = acts + [o for o in node.output if o]
    if any(t in sel.off_tensors for t in touched):
        return TENSOR_EXCLUDED
    if not all(index.is_float(t) for t in touched):
        other = {index.types.get(t, 0) for t in touched if not index.is_float(t)} & _OTHER_FLOATS.keys()
        if other:  # a float16 (or float64) model: its float32 export is what quantizes
            return f"{_OTHER_FLOATS[min(other)]}, not float32: quantize the model's float32 export"
        return "not float32" if rule.kind == "compute" else "moves non-float data"
    if rule.kind == "compute":
        weights = [node.input[k] for k in rule.weights if k < len(node.input) and node.input[k]]
        if rule.constant_weight and not all(w in index.initializers for w in weights):
            return "its weight is not a constant"
        if any(w in index.initializers and not index.is_float(w) for w in weights):
            return "its weight is not float32"
        if any(w in index.initializers and 0 in index.initializers[w].dims for w in weights):
            return "its weight is empty (a zero dimension): nothing to quantize"
    return None


def weights_read_in_float(ctx: Context, candidates: frozenset[int]) -> dict[int, str]:
    """Candidates whose weight control flow or the graph's outputs also read: the weight stays
    float for those readers, and quantized readers would store it a second time
    (`float_readers`). They stay float too, unless an override asks for them. A weight-only
    node's weight is stored once all the same: its folded float value takes the weight's name,
    and every reader reads it (qcli/qdq.py)."""
    float_reads = ctx.float_reads
    rejected = {}
    for i in sorted(candidates):
        node = ctx.node(i)
        if _weight_only(ctx, i):
            continue
        shared = [node.input[k] for k in ctx.rule(i).weights if k < len(node.input) and node.input[k] in float_reads]
        if shared and not ctx.selections.asked_for(i):
            rejected[i] = f"its weight is also read in float (by {float_reads[shared[0]]}): int8 would store it twice"
    return rejected


def without_anchor(ctx: Context, candidates: frozenset[int]) -> dict[int, str]:
    """Candidates in a connected group without an `anchor` (Conv, MatMul...): their Q/DQ pairs
    would cost more time than their int8 kernels save (say a lone Add between float ops)."""
    components: UnionFind[int] = UnionFind()
    for i in candidates:
        components.find(i)
        for name in ctx.node(i).input:
            j = _source(ctx, name)
            if j in candidates:
                components.union(i, j)
    anchored = {components.find(i) for i in candidates if ctx.rule(i).anchor}
    return {
        i: "no Conv/MatMul/Gemm next to it: int8 would be slower here"
        for i in sorted(candidates)
        if components.find(i) not in anchored
    }


def feeding_excluded(ctx: Context, candidates: frozenset[int], keep_float: frozenset[int]) -> dict[int, str]:
    """Compute candidates whose outputs only feed nodes the config keeps float (its rules, or the
    precision search's promotions, which are config overrides too): nothing would
    read their quantized output, so they cannot be fused (unless their kernel writes float).
    A weight-only node (float activations) writes float whoever reads it: it stays."""
    if not keep_float:
        return {}
    rejected = {}
    for i in sorted(candidates):
        if not ctx.is_kind(i, "compute") or writes_float(ctx, i) or _weight_only(ctx, i):
            continue
        outputs = [o for o in ctx.node(i).output if o]
        if all(o not in ctx.index.outputs and _only_read_by(ctx, o, keep_float) for o in outputs):
            rejected[i] = "its output only feeds nodes kept float"
    return rejected


def _weight_only(ctx: Context, i: int) -> bool:
    """Whether node `i` keeps float activations: the config's are float and no override gives
    it quantized ones."""
    if ctx.config.activations.dtype != "float" or i in ctx.selections.asked_nodes:
        return False
    return not any(o.activations is not None and o.activations.dtype != "float" and i in sel.nodes
                   for _, o, sel in ctx.selections.overrides)


def _only_read_by(ctx: Context, name: str, nodes: frozenset[int]) -> bool:
    """Whether `name` is read, and only by `nodes` (looking through Relu/Clip)."""
    users = readers_past_folds(ctx, name)
    return bool(users) and all(u in nodes for u in users)


def writes_float(ctx: Context, i: int) -> bool:
    """Whether onnxruntime can fuse node `i` into an int8 kernel that writes float outputs: a
    `float_output` op, unless a lone Relu/Clip follows an output (onnxruntime's QDQ selector
    then takes the Relu/Clip into the group and wants a QuantizeLinear after it)."""
    if not ctx.rule(i).float_output:
        return False
    for name in ctx.node(i).output:
        users = ctx.index.consumers(name)
        if len(users) == 1 and ctx.is_kind(users[0], "fold"):
            clipped = ctx.node(users[0]).output[0]
            if len(ctx.index.consumers(clipped)) == 1 and clipped not in ctx.index.outputs:
                return False
    return True


def readers_past_folds(ctx: Context, name: str) -> list[int]:
    """Consumers of `name`, looking through the Relu/Clip that would fold into its producer."""
    out = []
    for u in ctx.index.consumers(name):
        out += readers_past_folds(ctx, ctx.node(u).output[0]) if ctx.is_kind(u, "fold") else [u]
    return out


def _source(ctx: Context, name: str) -> int | None:
    """The node producing `name`, looking through Relu/Clip (they fold into it)."""
    j = ctx.index.producer(name)
    while j is not None and ctx.is_kind(j, "fold"):
        j = ctx.index.producer(ctx.node(j).input[0])
    return j
