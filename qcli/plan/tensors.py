"""Which activations get a Q/DQ pair: those the quantized compute nodes read and write (a
Relu/Clip after one folds into it), then those of the data movement next to them, which
shares their scale."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qcli.plan.context import Context, UnionFind
from qcli.plan.nodes import writes_float
from qcli.rules import activation_inputs, folds_statically, rule_for


@dataclass(frozen=True)
class Quantized:
    """Activations that get a Q/DQ pair."""

    tensors: frozenset[str]
    touched: Mapping[int, frozenset[str]]  # node -> the quantized tensors it reads or writes
    folded: Mapping[int, int]  # Relu/Clip -> the node it folds into


def quantize_tensors(ctx: Context, candidates: frozenset[int]) -> Quantized:
    """The activations of the compute candidates. A Relu/Clip right after one folds into it
    (`folding`): its output gets the Q/DQ pair, the producer's does not (onnxruntime drops the
    Relu into the int8 kernel). The output of a `float_output` op (Gemm, MatMul) gets one only
    when a quantized node reads it: its int8 kernel can write float (a classifier's logits)."""
    tensors: set[str] = set()
    touched: dict[int, frozenset[str]] = {}
    folded: dict[int, int] = {}
    for i in sorted(candidates):
        if not ctx.is_kind(i, "compute"):
            continue
        node = ctx.node(i)
        mine = {node.input[k] for k in operands(ctx, i) if node.input[k] not in ctx.index.initializers}
        for out in node.output:
            if writes_float(ctx, i) and not read_quantized(ctx, candidates, out):
                continue  # the int8 kernel writes it in float (see rules.py)
            clips = folding(ctx, out)
            for u in clips:
                folded[u] = i
                mine.add(ctx.node(u).output[0])
            if not clips:
                mine.add(out)
        tensors |= mine
        touched[i] = frozenset(mine)
    return Quantized(frozenset(tensors), touched, folded)


def operands(ctx: Context, i: int) -> list[int]:
    """Input positions compute node `i` reads as activations or weights, in order."""
    node, rule = ctx.node(i), ctx.rule(i)
    weights = {k for k in rule.weights if k < len(node.input) and node.input[k]}
    return sorted(set(activation_inputs(node, rule)) | weights)


def folding(ctx: Context, name: str) -> list[int]:
    """The Relu/Clip nodes that fold into the producer of `name`: its readers, when all of them
    are Relu or Clip with constant bounds, none of them or their outputs excluded by config and
    `name` is not a graph output; else none."""
    users = ctx.index.consumers(name)
    sel = ctx.selections
    if not users or name in ctx.index.outputs:
        return []
    for u in users:
        node = ctx.node(u)
        if not ctx.is_kind(u, "fold") or u in sel.off_nodes or node.output[0] in sel.off_tensors:
            return []
        if not folds_statically(node, ctx.index.initializers):
            return []
    return users


def read_quantized(ctx: Context, candidates: frozenset[int], name: str) -> bool:
    """Whether a quantized compute node reads `name` as an activation (looking through the
    Relu/Clip that would fold into its producer), or an override names it."""
    if name in ctx.selections.asked_tensors:
        return True
    for u in ctx.index.consumers(name):
        if ctx.is_kind(u, "fold"):
            if read_quantized(ctx, candidates, ctx.node(u).output[0]):
                return True
        elif u in candidates and ctx.is_kind(u, "compute") and name in ctx.activations(u):
            return True
    return False


def mixes_ranges(ctx: Context, i: int) -> str | None:
    """Why a Concat that writes a graph output may not share one scale among its inputs: it joins
    the outputs of ops of a known range (Sigmoid, Softmax: probabilities) with values of another
    range. A YOLOv8 head concatenates boxes in pixels (0-320) with class probabilities: one
    uint8 scale of 1.25 rounded every probability under 0.62 to 0, and no detection was left;
    a graph output's Q/DQ buys no speed (its reader is the caller, in float). Inside the graph
    such a Concat shares (a YOLOX head's raw offsets, -1 to 2, with its scores: the ranges
    are alike there, and the int8 kernels around it pay)."""
    node = ctx.node(i)
    if node.op_type != "Concat" or not any(o in ctx.index.outputs for o in node.output):
        return None
    ranges = [_range_of(ctx, t) for t in node.input]
    known = {r for r in ranges if r is not None}
    if known and (None in ranges or len(known) > 1):
        return ("it writes a graph output joining probabilities with values of another range: one scale would round "
                "the probabilities away")
    return None


def _range_of(ctx: Context, name: str) -> tuple[float, float] | None:
    """The known range of `name`'s producer, looking through data movement of one input
    (Reshape, Transpose, Slice...); None when not known."""
    seen: set[str] = set()
    while name not in seen:
        seen.add(name)
        j = ctx.index.producer(name)
        if j is None:
            return None
        node, rule = ctx.node(j), rule_for(ctx.node(j))
        if rule is None or rule.kind != "shares" or node.op_type == "Concat" or not node.input:
            return rule.output_range if rule is not None else None
        name = node.input[0]
    return None


@dataclass(frozen=True)
class Shared:
    """The data movement quantized with its neighbours, and the tensors that share one scale."""

    quantized: Quantized  # the compute nodes' activations and theirs
    active: frozenset[int]  # data-movement nodes quantized (sharing their neighbours' scale)
    groups: UnionFind[str]  # tensors joined by an active node: one scale each
    rejected: Mapping[int, str]  # the other data-movement candidates, and why


def share_scales(ctx: Context, candidates: frozenset[int], quantized: Quantized) -> Shared:
    """Data movement (`shares`: Reshape, Concat, MaxPool...) is quantized when a neighbouring
    tensor is, sharing its scale (onnxruntime then runs it on int8 or drops its Q/DQ pair); its
    tensors are then quantized, which may activate its neighbours in turn, until nothing changes.
    An initializer among them (an embedding table) joins the group as its constant."""
    tensors = set(quantized.tensors)
    touched = dict(quantized.touched)
    groups: UnionFind[str] = UnionFind()
    mixing = {i: why for i in sorted(candidates) if ctx.is_kind(i, "shares") and (why := mixes_ranges(ctx, i))}
    shares = [i for i in sorted(candidates) if ctx.is_kind(i, "shares") and i not in mixing]
    active: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i in shares:
            if i in active:
                continue
            members = ctx.activations(i) + [o for o in ctx.node(i).output if o]
            if any(t in tensors for t in members):
                active.add(i)
                changed = True
                tensors.update(t for t in members if t not in ctx.index.initializers)
                touched[i] = frozenset(members)
                for t in members[1:]:
                    groups.union(members[0], t)
    rejected = {**{i: "no quantized neighbour" for i in shares if i not in active}, **mixing}
    return Shared(Quantized(frozenset(tensors), touched, quantized.folded), frozenset(active), groups, rejected)
