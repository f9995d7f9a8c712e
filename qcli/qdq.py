"""Materialize a Plan: the one module that edits the graph.

- Each quantized activation `t` gets `QuantizeLinear(t) -> t_quantized -> DequantizeLinear ->
  t_dequantized`, and every consumer of `t` reads `t_dequantized` (a graph output keeps its name:
  the producer then writes `t_float` and the DequantizeLinear writes `t`). Tensors of one group
  share one scale/zero-point pair of initializers.
- Each weight becomes an integer initializer `w_quantized` (+ `w_scale`, `w_zero_point`, with
  `axis` when per-channel) and a DequantizeLinear writing `w_dequantized`; the float initializer is
  dropped when nothing else reads it, which is where the file shrinks.
- Each bias becomes int32 with scale = input scale x weight scale and zero point 0.
- A folded Relu/Clip whose QuantizeLinear clips as much is dropped: its input's producer writes
  its output (`_drop_redundant_clips`).
- Node names: `<t>_Q` and `<t>_DQ` for the pair of `t` (and `<w>_DQ` for a weight or bias).
New names derive from the tensor names, nodes are kept in topological order (original order
first), so the output is deterministic.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.info import names_used_inside
from qcli.plan import Plan
from qcli.scheme import choose_qparams, quantize
from qcli.errors import ModelError


CONTRIB = "com.microsoft"


def _weight_qparams(values: np.ndarray, plan) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point of a weight: one, one per channel along `axis`, or one per block of
    `block_size` values along `axis` (then shaped like the weight with that axis shortened)."""
    scheme = plan.scheme
    if plan.axis is None:
        return choose_qparams(values.min(), values.max(), scheme.dtype, scheme.symmetric)
    if scheme.granularity == "per_block":
        moved = np.moveaxis(values, plan.axis, 0)
        size, block = moved.shape[0], scheme.block_size
        count = -(-size // block)
        padded = np.pad(moved, [(0, count * block - size)] + [(0, 0)] * (moved.ndim - 1))
        blocks = padded.reshape(count, block, *moved.shape[1:])
        scale, zero = choose_qparams(blocks.min(axis=1), blocks.max(axis=1), scheme.dtype, scheme.symmetric)
        return np.moveaxis(scale, 0, plan.axis), np.moveaxis(zero, 0, plan.axis)
    other = tuple(a for a in range(values.ndim) if a != plan.axis)
    return choose_qparams(values.min(axis=other), values.max(axis=other), scheme.dtype, scheme.symmetric)


def _expand_blocks(param: np.ndarray, plan, size: int) -> np.ndarray:
    """Per-block params repeated to the weight's shape (for quantizing the values)."""
    return np.take(np.repeat(param, plan.scheme.block_size, axis=plan.axis), np.arange(size), axis=plan.axis)


def qdq_domain(bits: int, opset: int) -> str:
    """Standard QuantizeLinear/DequantizeLinear take 8 bits from opset 13 and 4/16 bits from
    opset 21; below that onnxruntime's com.microsoft versions take 4 and 16 bits."""
    return "" if bits == 8 or opset >= 21 else CONTRIB


def materialize(model: onnx.ModelProto, plan: Plan) -> onnx.ModelProto:
    """A new model with the plan's Q/DQ nodes, quantized weights and biases."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    quantized_nodes = {d.index for d in plan.nodes if d.quantized}
    new_inits: list[onnx.TensorProto] = []
    new_nodes: list[onnx.NodeProto] = []
    renames: dict[tuple[int, int], str] = {}  # (node index, input index) -> new input name

    reads: dict[str, list[tuple[int, int]]] = {}  # name -> (node index, input index), in graph order
    for i, node in enumerate(graph.node):
        for k, inp in enumerate(node.input):
            reads.setdefault(inp, []).append((i, k))

    def uses(name: str, only_quantized: bool) -> list[tuple[int, int]]:
        """Where `name` is read: by quantized nodes only, or by every node the config did not
        exclude (excluded nodes read the unquantized tensor)."""
        return [(i, k) for i, k in reads.get(name, ())
                if (i in quantized_nodes if only_quantized else i not in plan.keep_float)]

    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 13)
    domains: set[str] = set()

    def dequantize_node(
        q_name: str, scale: str, zero: str | None, output: str, axis: int | None, bits: int = 8, block: int = 0
    ) -> onnx.NodeProto:
        """DequantizeLinear of `<t>_quantized`, named `<t>_DQ` (as its QuantizeLinear is `<t>_Q`);
        `zero` None omits the zero point (all zeros: int32 bias)."""
        inputs = [q_name, scale] + ([zero] if zero else [])
        domain = qdq_domain(bits, opset)
        domains.add(domain)
        name = q_name.removesuffix("_quantized") + "_DQ"
        node = helper.make_node("DequantizeLinear", inputs, [output], name=name, domain=domain)
        if axis is not None:
            node.attribute.append(helper.make_attribute("axis", axis))
        if block:
            node.attribute.append(helper.make_attribute("block_size", block))
        return node

    # weights
    weight_params: dict[str, np.ndarray] = {}
    for wp in plan.weights.values():
        values = numpy_helper.to_array(inits[wp.name]).astype(np.float32)
        scale, zero = _weight_qparams(values, wp)
        weight_params[wp.name] = scale
        if wp.scheme.granularity == "per_block":
            size = values.shape[wp.axis]
            q = quantize(values, _expand_blocks(scale, wp, size), _expand_blocks(zero, wp, size),
                         wp.scheme.dtype, None, wp.scheme.symmetric)
        else:
            q = quantize(values, scale, zero, wp.scheme.dtype, wp.axis, wp.scheme.symmetric)
        new_inits += [
            _tensor(q, f"{wp.name}_quantized", wp.scheme.dtype.onnx_type),
            numpy_helper.from_array(scale, f"{wp.name}_scale"),
        ]
        # The zero point stays even when all zeros: onnxruntime fuses Gemm only with one.
        new_inits.append(_tensor(zero, f"{wp.name}_zero_point", wp.scheme.dtype.onnx_type))
        new_nodes.append(
            dequantize_node(
                f"{wp.name}_quantized", f"{wp.name}_scale", f"{wp.name}_zero_point", f"{wp.name}_dequantized",
                wp.axis, wp.scheme.dtype.bits, wp.scheme.block_size,
            )
        )
        for use in uses(wp.name, only_quantized=True):
            renames[use] = f"{wp.name}_dequantized"
        for use in uses(wp.name, only_quantized=False):  # shape readers: the int8 copy has it
            if graph.node[use[0]].op_type in ("Shape", "Size"):
                renames[use] = f"{wp.name}_quantized"

    # activations (and embedding tables quantized with their group's params)
    graph_outputs = {o.name for o in graph.output}
    producer = {o: (i, k) for i, n in enumerate(graph.node) for k, o in enumerate(n.output)}
    output_renames: dict[tuple[int, int], str] = {}
    group_scale: dict[str, np.ndarray] = {}
    for group in plan.groups:
        if group.scale is None:
            raise ModelError(f"internal: group {group.tensors[0]!r} has no qparams (assign_ranges first)")
        base = group.tensors[0]
        scale_name, zero_name = f"{base}_scale", f"{base}_zero_point"
        onnx_type = group.scheme.dtype.onnx_type
        new_inits += [numpy_helper.from_array(np.float32(group.scale), scale_name), _tensor(group.zero_point, zero_name, onnx_type)]
        for t in group.tensors:
            group_scale[t] = group.scale
            if t == group.constant:
                values = numpy_helper.to_array(inits[t]).astype(np.float32)
                q = quantize(values, group.scale, group.zero_point, group.scheme.dtype, None, group.scheme.symmetric)
                new_inits.append(_tensor(q, f"{t}_quantized", onnx_type))
                new_nodes.append(
                    dequantize_node(f"{t}_quantized", scale_name, zero_name, f"{t}_dequantized", None, group.scheme.dtype.bits)
                )
                for use in uses(t, only_quantized=True):
                    renames[use] = f"{t}_dequantized"
                continue
            if t in graph_outputs and t in producer:
                source = f"{t}_float"
                output_renames[producer[t]] = source
                target = t
            else:
                source, target = t, f"{t}_dequantized"
                for use in uses(t, only_quantized=False):
                    # Shape and Size read only the shape: the integer tensor has the same, and
                    # reading it spares a DequantizeLinear that nothing else needs.
                    shape_only = graph.node[use[0]].op_type in ("Shape", "Size")
                    renames[use] = f"{t}_quantized" if shape_only else target
            new_nodes.append(
                helper.make_node(
                    "QuantizeLinear", [source, scale_name, zero_name], [f"{t}_quantized"], name=f"{t}_Q",
                    domain=qdq_domain(group.scheme.dtype.bits, opset),
                )
            )
            new_nodes.append(
                dequantize_node(f"{t}_quantized", scale_name, zero_name, target, None, group.scheme.dtype.bits)
            )

    # biases: int32, scale = s_input * s_weight
    for bp in plan.biases.values():
        if bp.input not in group_scale or plan.weights[bp.weight].scheme.granularity == "per_block":
            continue  # no scale to derive it from: the bias stays float
        values = numpy_helper.to_array(inits[bp.name]).astype(np.float64)
        scale = (np.float64(group_scale[bp.input]) * weight_params[bp.weight].astype(np.float64)).astype(np.float32)
        scale = np.broadcast_to(scale, values.shape).copy() if scale.ndim else scale
        q = np.clip(np.rint(values / scale), -(2**31) + 1, 2**31 - 1).astype(np.int32)
        axis = 0 if scale.ndim else None
        new_inits += [
            numpy_helper.from_array(q, f"{bp.name}_quantized"),
            numpy_helper.from_array(scale, f"{bp.name}_scale"),
        ]
        new_nodes.append(
            dequantize_node(f"{bp.name}_quantized", f"{bp.name}_scale", None, f"{bp.name}_dequantized", axis)
        )
        for use in uses(bp.name, only_quantized=True):
            renames[use] = f"{bp.name}_dequantized"

    for (i, k), name in renames.items():
        graph.node[i].input[k] = name
    for (i, k), name in output_renames.items():
        graph.node[i].output[k] = name
    dropped = _drop_redundant_clips(graph, plan, producer, inits)
    old_nodes = [n for i, n in enumerate(graph.node) if i not in dropped]

    # Drop float initializers nothing reads any more.
    read = {name for node in [*old_nodes, *new_nodes] for name in node.input}
    read |= {name for node in old_nodes for name in names_used_inside(node)}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept + new_inits)
    inputs = [i for i in graph.input if i.name not in inits or i.name in read]
    del graph.input[:]
    graph.input.extend(inputs)

    if CONTRIB in domains and not any(o.domain == CONTRIB for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(CONTRIB, 1))

    nodes = _toposort([*old_nodes, *new_nodes], {i.name for i in graph.input} | {t.name for t in graph.initializer})
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _drop_redundant_clips(
    graph: onnx.GraphProto, plan: Plan, producer: dict[str, tuple[int, int]], inits: dict[str, onnx.TensorProto]
) -> set[int]:
    """Indices of the folded Relu/Clip nodes that change nothing before their QuantizeLinear,
    rewired so that their input's producer writes their output directly.

    Q(Clip(x)) == Q(x) when the clip bounds quantize to the type's limits or beyond: for Relu,
    when the zero point is the type's minimum (negative x saturate to it, as 0 does). This is
    what onnxruntime does with them when it fuses the group; dropping them here also leaves the
    file one node (and one tensor) smaller. Kept: a Relu/Clip whose input or output something
    else reads (a graph output, an excluded node that reads the float value, another reader).
    """
    folded = {d.index for d in plan.nodes if d.quantized and d.op_type in ("Relu", "Clip")}
    graph_outputs = {o.name for o in graph.output}
    reads: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
    excluded_reads = {name for i in plan.keep_float for name in graph.node[i].input}
    dropped: set[int] = set()
    for group in plan.groups:
        for t in group.tensors:
            i = producer.get(t, (None,))[0]
            if i not in folded or t in graph_outputs or t in excluded_reads:
                continue
            node = graph.node[i]
            source = node.input[0]
            if source in graph_outputs or source not in producer or reads.get(source) != 1:
                continue
            lo, hi = (0.0, np.inf) if node.op_type == "Relu" else _clip_bounds(node, inits)
            q = np.rint(np.float64([lo, hi]) / np.float64(group.scale)) + np.float64(group.zero_point)
            if q[0] > group.scheme.dtype.qmin or q[1] < group.scheme.dtype.qmax:
                continue
            j, k = producer[source]
            graph.node[j].output[k] = t
            dropped.add(i)
            stale = [v for v in graph.value_info if v.name == source]
            for v in stale:
                graph.value_info.remove(v)
    return dropped


def _clip_bounds(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> tuple[float, float]:
    """Clip's (min, max) from its constant inputs; a missing one is unbounded (opset >= 11)."""
    bounds = [-np.inf, np.inf]
    for k in (1, 2):
        if k < len(node.input) and node.input[k]:
            bounds[k - 1] = float(numpy_helper.to_array(inits[node.input[k]]))
    return bounds[0], bounds[1]


def _tensor(values: np.ndarray, name: str, onnx_type: int) -> onnx.TensorProto:
    """An initializer of `onnx_type` (int4/uint4 are packed two per byte by onnx's helper)."""
    values = np.asarray(values)
    if onnx_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return helper.make_tensor(name, onnx_type, values.shape, values.flatten().tolist())
    return numpy_helper.from_array(values, name)


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order: among ready nodes, the earliest in `nodes` goes first."""
    import heapq

    produced = {o for n in nodes for o in n.output}
    needs: list[set[str]] = []
    waiting: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        inputs = {n for n in node.input if n} | set(names_used_inside(node))
        missing = {n for n in inputs if n in produced and n not in available}
        needs.append(missing)
        for n in missing:
            waiting.setdefault(n, []).append(i)
    ready = [i for i, m in enumerate(needs) if not m]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for out in nodes[i].output:
            for j in waiting.pop(out, []):
                needs[j].discard(out)
                if not needs[j]:
                    heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ModelError("internal: the quantized graph has a cycle")
    return order
