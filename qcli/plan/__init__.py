"""Decide how every tensor of a (prepared) model is quantized: the plan `qdq.py` materializes.

Two steps. `make_plan(model, config)` decides the structure from the op rules (rules.py) and
the config alone, as a list of phases that each take and return data: which nodes are
quantized (and why others stay float), which activations get a Q/DQ pair, which activations
share one scale (groups, by union-find over tensors joined by `shares` ops, as pt2e's
SharedQuantizationSpec), which initializers are weights and biases, and each group's and
weight's scheme after the YAML overrides. `assign_ranges(plan, model, table)` then gives each
group its range and turns it into scale and zero point. Calibration observes exactly
`plan.calibrated_tensors`.

Decisions (docs/guides/quantization.md and configuration.md say the same for users):
- A node in dynamic mode (`activations.mode: dynamic`, an override's `precision: dynamic`) is
  quantized dynamically when its op has a dynamic form (plan/dynamic.py), else stays float; it
  takes no part in the static plan (no Q/DQ, no calibration of its tensors).
- A compute node is quantized when its rule says so, its activation inputs and outputs are
  float32 tensors, its weight (Conv, ConvTranspose) is an initializer, and the config does not
  exclude it or any of its tensors (`nodes.why_not_candidate`).
- Relu/Clip right after a quantized producer are folded: the producer's output gets no Q/DQ,
  the clipped output does (onnxruntime then drops the Relu into the int8 kernel).
- The output of a Gemm or MatMul (`float_output` in rules.py) gets a Q/DQ pair only when a
  quantized node reads it (or an override names it): otherwise onnxruntime's int8 kernel writes
  it in float (QGemm, MatMulIntegerToFloat), e.g. a classifier's logits.
- Data-movement ops (`shares`) are quantized when a neighbouring tensor is, sharing its scale,
  so onnxruntime runs them on int8 or drops their Q/DQ pair.
- A node whose weight control flow (If/Loop/Scan) or the graph's outputs also read stays
  float unless an override names it: the weight would be stored twice (`context.float_readers`).
- Int8 pays off in the kernels of Conv, ConvTranspose, MatMul and Gemm (`anchor` in rules.py).
  A group of connected quantizable nodes without an anchor (say a lone Add between float ops)
  stays float: its Q/DQ pairs would cost more time than its int8 kernel saves.
- Overrides apply in order, later wins. A rule's `match` selects nodes (by `nodes` name patterns
  AND `op_types` when both are given) and tensors (by `tensors`); settings for a node apply to
  its quantized activations (inputs and outputs) and its weights. When the members of one
  shared group are given different activation dtypes, the widest wins (16 over 8 bits; on a
  tie, the later rule), and a note says so.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import onnx

from qcli.config import Config
from qcli.graph import GraphIndex, element_types, node_names
from qcli.plan.context import Context
from qcli.plan.controlflow import control_flow_weights
from qcli.plan.dynamic import Dynamic, embedding_tables, plan_dynamic
from qcli.plan.groups import assign_ranges, groups_of, requests_of
from qcli.plan.match import Selection, pattern, select
from qcli.plan.nodes import Candidates, feeding_excluded, screen, weights_read_in_float, without_anchor
from qcli.plan.result import BiasPlan, DynamicNode, Group, NodeDecision, Plan, WeightPlan
from qcli.plan.tensors import quantize_tensors, share_scales
from qcli.plan.weights import (
    blocks_beside_quantized_activations,
    overridden_weights,
    plan_weights,
    two_bits_on_matmuls,
)


def make_plan(model: onnx.ModelProto, config: Config, *, index: GraphIndex | None = None) -> Plan:
    """The structure of the quantization (no ranges yet); see the module docstring. `index`:
    the model's `GraphIndex` when the caller has it already."""
    ctx = Context.of(model, config, index)
    dynamic = plan_dynamic(ctx)
    screened = screen(ctx)
    candidates = screened.candidates.without({i: dynamic.reasons.get(i, "") for i in ctx.selections.dynamic})
    candidates = candidates.without(weights_read_in_float(ctx, candidates.nodes))
    candidates = candidates.without(without_anchor(ctx, candidates.nodes))
    candidates = candidates.without(feeding_excluded(ctx, candidates.nodes, screened.keep_float))
    shared = share_scales(ctx, candidates.nodes, quantize_tensors(ctx, candidates.nodes))
    candidates = candidates.without(shared.rejected)
    weighted = plan_weights(ctx, candidates.nodes)
    groups, notes = groups_of(ctx, shared, requests_of(ctx, shared))
    constants = {g.constant for g in groups}  # quantized with their group's params instead
    weights = {name: w for name, w in overridden_weights(ctx, weighted).items() if name not in constants}
    activations = {t for g in groups for t in g.tensors if t != g.constant}
    weights, block_notes = blocks_beside_quantized_activations(ctx, weights, weighted.readers, activations)
    weights, two_bit_notes = two_bits_on_matmuls(ctx, weights, weighted.readers, activations)
    block_notes += two_bit_notes
    biases = {key: b for key, b in weighted.biases.items() if b.weight in weights and b.name not in constants}
    static = set(weights) | {c for c in constants if c} | {b.name for b in biases.values()}
    dynamic = without_static_weights(embedding_tables(ctx, candidates.nodes, dynamic, activations), static)
    flows = control_flow_weights(ctx, static | {w.name for d in dynamic.nodes.values() for w in d.weights})
    weights.update((name, w) for found in flows.values() for name, w in found.items())
    return Plan(
        groups=groups,
        weights=weights,
        biases=biases,
        nodes=decisions(ctx, candidates, shared.quantized.folded, dynamic, flows.keys()),
        unmatched=ctx.selections.unmatched(config, ctx.names, ctx.index),
        keep_float=set(screened.keep_float),
        notes=notes + block_notes,
        dynamic=dynamic.nodes,
        half=sorted(ctx.selections.half),
        half_tensors=half_activations(ctx),
        control_flow={i: list(found) for i, found in flows.items()},
    )


def half_activations(ctx: Context) -> list[str]:
    """The float32 activations the half nodes read and write, in graph order."""
    graph, index = ctx.index.graph, ctx.index
    names = (t for i in sorted(ctx.selections.half) for t in (*graph.node[i].input, *graph.node[i].output))
    return list(dict.fromkeys(t for t in names if t and index.is_float(t) and t not in index.initializers))


def decisions(ctx: Context, candidates: Candidates, folded: Mapping[int, int], dynamic: Dynamic,
              flows: Collection[int] = ()) -> list[NodeDecision]:
    """One decision per node, in graph order: quantized (statically or dynamically; control
    flow whose bodies' weights are stored weight-only), folded into its producer, or float and why."""
    out = []
    for i, node in enumerate(ctx.index.graph.node):
        name = ctx.names[i]
        if i in dynamic.nodes or i in flows:
            out.append(NodeDecision(i, name, node.op_type, True, dynamic=i in dynamic.nodes))
        elif i in dynamic.reasons:
            out.append(NodeDecision(i, name, node.op_type, False, dynamic.reasons[i]))
        elif i in folded:
            into = ctx.names[folded[i]]
            out.append(NodeDecision(i, name, node.op_type, True, f"folded into {into}", folded_into=into))
        elif i in candidates.nodes:
            out.append(NodeDecision(i, name, node.op_type, True))
        else:
            out.append(NodeDecision(i, name, node.op_type, False, candidates.reasons.get(i, "")))
    return out


def without_static_weights(dynamic: Dynamic, static: set[str]) -> Dynamic:
    """The dynamic nodes less those whose weight a static node quantizes too (float instead: one
    weight, one quantized form)."""
    clash = {i for i, d in dynamic.nodes.items() if any(w.name in static for w in d.weights)}
    if not clash:
        return dynamic
    reason = "its weight is also quantized statically (by another node): it stays float"
    return Dynamic({i: d for i, d in dynamic.nodes.items() if i not in clash},
                   {**dynamic.reasons, **{i: reason for i in clash}})


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every typed tensor of the main graph (value_info from shape inference)."""
    return element_types(model.graph)


__all__ = [
    "BiasPlan", "DynamicNode", "Group", "NodeDecision", "Plan", "Selection", "WeightPlan", "assign_ranges", "make_plan",
    "node_names", "pattern", "select", "tensor_types",
]
