"""Folded Relu/Clip nodes that change nothing before their QuantizeLinear, taken out of the
quantized graph (a step of qcli/qdq.py's materialize)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from qcli.errors import InternalError
from qcli.graph import names_used_inside
from qcli.lazy import tensor_array
from qcli.plan import Plan
from qcli.rules import rule_for


def drop_redundant_clips(
    graph: onnx.GraphProto, plan: Plan, producer: Mapping[str, tuple[int, int]], inits: Mapping[str, onnx.TensorProto]
) -> set[int]:
    """Indices of the folded Relu/Clip nodes that change nothing before their QuantizeLinear,
    rewired so that their input's producer writes their output directly.

    Q(Clip(x)) == Q(x) when the clip bounds quantize to the type's limits or beyond: for Relu,
    when the zero point is the type's minimum (negative x saturate to it, as 0 does). This is
    what onnxruntime does with them when it fuses the group; dropping them here also leaves the
    file one node (and one tensor) smaller. Kept: a Relu/Clip whose input or output something
    else reads (a graph output, an excluded node or data movement left float that reads the
    float value, an excluded control-flow node's body reading it by name, another reader): a
    body that read a dropped Relu's name got it unclipped (Silero VAD's If bodies: output noise
    14.5 x the signal). The bodies of control flow that is not excluded read the quantized
    value's DequantizeLinear instead (qcli/qdq.py), so such a Relu still folds.
    `graph` is the rewired one (its readers are counted as they are now), `producer` the float
    graph's.
    """
    folded = {d.index for d in plan.nodes if d.folded_into is not None}
    graph_outputs = {o.name for o in graph.output}
    reads: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
    # what still reads a quantized tensor by its float name once the readers are rewired: excluded
    # nodes, data movement left float, and control-flow bodies (by outer-scope name): they read
    # the Relu/Clip's own output, which dropping it would leave unclipped
    float_reads = set(reads) | {name for node in graph.node for name in names_used_inside(node)}
    dropped: set[int] = set()
    for group in plan.groups:
        for t in group.tensors:
            i = producer[t][0] if t in producer else None
            if i not in folded or t in graph_outputs or t in float_reads:
                continue
            node = graph.node[i]
            source = node.input[0]
            if source in graph_outputs or source not in producer or reads.get(source) != 1:
                continue
            lo, hi = clip_bounds(node, inits)
            q = np.rint(np.array([lo, hi], dtype=np.float64) / np.float64(group.scale)) + np.float64(group.zero_point)
            if q[0] > group.scheme.dtype.qmin or q[1] < group.scheme.dtype.qmax:
                continue
            j, k = producer[source]
            graph.node[j].output[k] = t
            dropped.add(i)
            stale = [v for v in graph.value_info if v.name == source]
            for v in stale:
                graph.value_info.remove(v)
    return dropped


def clip_bounds(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> tuple[float, float]:
    """What a folded Relu/Clip clips to: its rule's `clip_range`, narrowed by its constant
    `bounds` inputs (Clip's min and max; a missing one is unbounded, opset >= 11)."""
    rule = rule_for(node)
    if rule is None or rule.clip_range is None:
        raise InternalError(f"node {node.name!r} ({node.op_type}) was folded but clips to nothing")
    bounds = list(rule.clip_range)
    for j, k in enumerate(rule.bounds):
        if k < len(node.input) and node.input[k]:
            bounds[j] = float(tensor_array(inits[node.input[k]]))
    return bounds[0], bounds[1]
