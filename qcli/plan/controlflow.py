"""Weights only control flow reads, stored weight-only (docs/guides/quantization.md).

A main-graph initializer that an If, Loop or Scan body reads from the outer scope at a weight
input of a node with a weight rule (the LSTM in Silero VAD's If branches:
`rules.weight_only_rule`), directly or through data movement (`MOVES`), is stored as 8- or
16-bit integers too, under static int8 as under weight-only (the body computes in float
either way; until 2026-12 only weight-only configs stored them, so a static model kept them
float and came out 1.16x smaller, not 1.79x: Silero VAD):
its folded value (Cast, Mul, folded at load) takes the weight's own name (qcli/qdq.py), so the
body computes in float from it as before. The control-flow node owns those weights: an override
selecting it sets their scheme (`precision: float` keeps them float), and auto-precision weighs
it as one unit. A weight that a quantized node of the main graph reads too is planned with that
node. Only schemes that fold at load (8 or 16 bits, per channel or per tensor) apply.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from onnx import NodeProto

from qcli.config import NO_QDQ, Weights
from qcli.graph import iter_graphs, node_subgraphs
from qcli.plan.context import Context
from qcli.plan.result import WeightPlan
from qcli.plan.weights import weight_plan, weight_scheme
from qcli.rules import OpRule, weight_only_rule
from qcli.scheme import PerChannel, PerTensor, QuantScheme


def control_flow_weights(ctx: Context, planned: Collection[str]) -> dict[int, dict[str, WeightPlan]]:
    """Control-flow node -> the weights only its bodies read (not in `planned`), with their plans."""
    out: dict[int, dict[str, WeightPlan]] = {}
    seen = set(planned)
    for i, node in enumerate(ctx.index.graph.node):
        if not any(True for _ in node_subgraphs(node)) or (section := _section(ctx, i)) is None:
            continue
        found = {}
        for body in node_subgraphs(node):
            graphs = [g for _, g in iter_graphs(body)]
            local = {t.name for g in graphs for t in g.initializer}
            constants = ctx.index.initializers.keys() | local
            producers = {o: n for g in graphs for n in g.node for o in n.output}
            for n in (n for g in graphs for n in g.node):
                rule = weight_only_rule(n, constants)
                if rule is None or rule.kind != "compute":
                    continue
                for k in rule.weights:
                    read = n.input[k] if k < len(n.input) else ""
                    for name in _moved_from(read, producers):
                        if name in seen or name in local or not _float_weight(ctx, name):
                            continue
                        seen.add(name)
                        found[name] = _plan(ctx, name, weight_scheme(section), n, rule, name == read)
        if found:
            out[i] = found
    return out


#: Data movement a body may put between an outer weight and the node reading it (PyTorch's LSTM
#: export slices its weight_ih/weight_hh into gates, reorders them with Concat and Unsqueezes
#: them: Silero VAD), and the inputs each moves values from (all: -1).
MOVES: dict[str, int] = {"Slice": 0, "Concat": -1, "Unsqueeze": 0, "Squeeze": 0, "Reshape": 0, "Transpose": 0,
                         "Identity": 0, "Flatten": 0, "Split": 0, "Gather": 0}


def _moved_from(name: str, producers: dict[str, NodeProto], depth: int = 8) -> list[str]:
    """`name`, or the names its values are moved from through MOVES nodes (at most `depth` deep)."""
    node = producers.get(name)
    if node is None or node.op_type not in MOVES or depth == 0:
        return [name] if name else []
    k = MOVES[node.op_type]
    sources = node.input if k < 0 else node.input[k: k + 1]
    return [s for source in sources for s in _moved_from(source, producers, depth - 1)]


def _plan(ctx: Context, name: str, scheme: QuantScheme, reader: NodeProto, rule: OpRule, direct: bool) -> WeightPlan:
    """The reader's per-channel axis when it reads the weight as it is; else (moved on the way)
    rows, axis 0, for a matrix or more (PyTorch's [out, in] layout), per tensor for a vector."""
    rank = len(ctx.index.initializers[name].dims)
    if direct:
        return weight_plan(name, scheme, reader, rank, rule)
    if isinstance(scheme.granularity, PerChannel) and rank >= 2:
        return WeightPlan(name, scheme, 0)
    return WeightPlan(name, replace(scheme, granularity=PerTensor()), None)


def _section(ctx: Context, i: int) -> Weights | None:
    """The `weights:` section for control-flow node `i` (the last override selecting it with
    one, else the config's), None when it stays float or its scheme would not fold at load."""
    if i in ctx.selections.off_nodes:
        return None
    chosen = ctx.config.weights
    for _, o, sel in ctx.selections.overrides:
        if i in sel.nodes and o.precision in NO_QDQ:
            return None
        if i in sel.nodes and o.weights is not None:
            chosen = o.weights
    folds = chosen.dtype in ("int8", "uint8", "int16") and chosen.granularity != "per_block"
    return chosen if folds else None


def _float_weight(ctx: Context, name: str) -> bool:
    index = ctx.index
    return bool(name) and name in index.initializers and index.is_float(name) and 0 not in index.initializers[name].dims
