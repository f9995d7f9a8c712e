"""Materialize a Plan: the one module that edits the graph.

- Each quantized activation `t` gets `QuantizeLinear(t) -> t_quantized -> DequantizeLinear ->
  t_dequantized`, and every consumer of `t` reads `t_dequantized` (a graph output keeps its name:
  the producer then writes `t_float` and the DequantizeLinear writes `t`). Tensors of one group
  share one scale/zero-point pair of initializers.
- Each weight becomes an integer initializer `w_quantized` (+ `w_scale`, `w_zero_point`, with
  `axis` when per-channel) and a DequantizeLinear writing `w_dequantized`; the float initializer is
  dropped when nothing else reads it, which is where the file shrinks. An 8-bit weight only
  float activations read (weight-only quantization) is Cast, Mul instead (qcli/weightonly.py).
- Each bias becomes int32 with zero point 0, on its node's accumulator grid: scale = input scale x
  weight scale (per channel when the weight's is: one per output channel, along the bias's last
  axis; a grouped ConvTranspose's weight scales repeat once per group). Gemm adds beta x C to
  alpha x A.B, so its bias's scale is alpha / beta times that: the grid of alpha x A.B, and with
  beta 1 exactly the int32 C that onnxruntime's fused QGemm adds to A.B before scaling by alpha
  (input x weight scale would make a fused Gemm with alpha != 1 add alpha x C). Fused or not,
  the model computes the same. A bias stays float with beta 0 (Gemm ignores it) or a negative
  alpha / beta (no positive scale fits). A bias that broadcasts along the channels (Gemm's
  scalar, [1] or [M, 1] C) is spread over them first: DequantizeLinear's axis takes one scale
  per element of that axis. A bias that nodes of different grids share gets one copy per grid
  (`<b>_<k>_quantized` after the first): each fused kernel adds the integers as they are.
- A folded Relu/Clip whose QuantizeLinear clips as much is dropped: its input's producer writes
  its output (qcli/clips.py).
- Dynamic nodes (plan.dynamic) are replaced by what qcli/dynamic.py emits for them.
- A HardSwish/HardSigmoid between a DequantizeLinear and a QuantizeLinear becomes an integer
  Add (and Mul) onnxruntime fuses (qcli/gates.py).
- Node names: `<t>_Q` and `<t>_DQ` for the pair of `t` (and `<w>_DQ` for a weight or bias).
New names derive from the tensor names, nodes are kept in topological order (original order
first), so the output is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.clips import drop_redundant_clips
from qcli.dynamic import dynamic_edits
from qcli.errors import InternalError
from qcli.gates import integer_gates
from qcli.graph import GraphIndex, iter_graphs, names_used_inside, node_subgraphs, toposort
from qcli.lazy import tensor_array
from qcli.model import without_initializers
from qcli.plan import BiasPlan, Group, Plan, WeightPlan
from qcli.plan.context import float_readers
from qcli.qweights import Weight, WeightMemo, weight_of
from qcli.rules import is_kind, rule_for
from qcli.runtime import SharedStore
from qcli.scheme import PerBlock, quantize
from qcli.weightonly import folded_weight, weight_only

CONTRIB = "com.microsoft"

Use = tuple[int, int]  # (node index, input or output index)


def qdq_domain(bits: int, opset: int) -> str:
    """Standard QuantizeLinear/DequantizeLinear take 8 bits from opset 13 and 4/16 bits from
    opset 21; below that onnxruntime's com.microsoft versions take 4 and 16 bits."""
    return "" if bits == 8 or opset >= 21 else CONTRIB


def materialize(model: onnx.ModelProto, plan: Plan, index: GraphIndex | None = None,
                memo: WeightMemo | None = None, lean: bool = False) -> onnx.ModelProto:
    """A new model with the plan's Q/DQ nodes, quantized weights and biases. `index`: the
    model's GraphIndex when the caller has it (its positions hold in the copy edited here).
    `memo`: what earlier calls on `model` left (`WeightMemo`: its quantized weights, the graph
    without its initializers), which this call adds to (one per float graph, never shared).
    `lean` (with `memo`): the float initializers kept are references to the memo's
    `SharedStore`: a model for onnxruntime sessions only (qcli.runtime.make_session).

    The steps: what each weight, group and bias adds (initializers, nodes, rewired inputs),
    read off the float graph; the rewiring applied; redundant Relu/Clips dropped; float
    initializers nothing reads any more (or a new node writes) dropped; the nodes put in topological order; the
    quantized HardSwish/HardSigmoid nodes rewritten (qcli/gates.py)."""
    out = _copy_to_edit(model, memo)
    graph = out.graph
    source = _Source.of(out, plan, index if index is not None else GraphIndex.of(model), memo)
    weights, weight_scales = _weight_edits(source, plan)
    groups, group_scales = _group_edits(source, plan)
    edits = _Edits.joined(weights, groups, _bias_edits(source, plan, group_scales, weight_scales))
    # qcli/dynamic.py: replaces its nodes
    dynamic = dynamic_edits(source.index, plan, edits.inputs, edits.outputs, memo)
    edits.add(_Edits(inits=dynamic.inits, nodes=dynamic.nodes))
    _rewire(graph, edits)
    dropped = drop_redundant_clips(graph, plan, source.producer, source.inits) | dynamic.replaced
    old_nodes = [n for i, n in enumerate(graph.node) if i not in dropped]
    shared = None
    if memo is not None and lean:
        shared = memo.shared = memo.shared or SharedStore()
    _drop_unread_initializers(graph, source.inits, old_nodes, edits, shared=shared)
    _import_contrib_domain(out, edits.nodes)
    nodes = toposort([*old_nodes, *edits.nodes], {i.name for i in graph.input} | {t.name for t in graph.initializer})
    del graph.node[:]
    graph.node.extend(nodes)
    integer_gates(graph, {t for g in plan.groups if g.scheme.symmetric for t in g.tensors})
    return out


def _copy_to_edit(model: onnx.ModelProto, memo: WeightMemo | None) -> onnx.ModelProto:
    """A copy of `model` to edit, without its initializers (the ones still read are added back
    at the end, `_drop_unread_initializers`): a build then copies no float weight it quantizes
    (the encoder's 69 MB: ~23 ms a build), and the copy's protobuf arena never holds them
    (`without_initializers`). With `memo`, that copy is made once and kept there."""
    if memo is None:
        return without_initializers(model)
    if memo.shell is None:
        memo.shell = without_initializers(model)
    out = onnx.ModelProto()
    out.CopyFrom(memo.shell)
    return out


@dataclass(frozen=True)
class _Source:
    """The float graph as the edits read it, before any of them is applied: its initializers,
    where each tensor is read and written, and which nodes are quantized or kept float."""

    index: GraphIndex
    quantized: set[int]
    keep_float: set[int]
    opset: int
    memo: WeightMemo | None = None

    @classmethod
    def of(cls, model: onnx.ModelProto, plan: Plan, index: GraphIndex, memo: WeightMemo | None = None) -> _Source:
        return cls(
            index=index,
            quantized={d.index for d in plan.nodes if d.quantized},
            keep_float=plan.keep_float,
            opset=next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13),
            memo=memo,
        )

    @property
    def inits(self) -> Mapping[str, onnx.TensorProto]:
        return self.index.initializers

    @cached_property
    def float_reads(self) -> Mapping[str, str]:
        """What control flow and the graph outputs read (plan.context.float_readers): asked by
        weight-only weights only, so a static build does not walk the graph for it."""
        return float_readers(self.index.graph)

    @property
    def producer(self) -> Mapping[str, Use]:  # name -> (node, output index)
        return self.index.written_at

    @property
    def outputs(self) -> frozenset[str]:  # graph outputs
        return self.index.outputs

    def uses(self, name: str, only_quantized: bool) -> list[Use]:
        """Where `name` is read: by quantized nodes only, or by every node the config did not
        exclude (excluded nodes read the unquantized tensor)."""
        return [(i, k) for i, k in self.index.read_at.get(name, ())
                if (i in self.quantized if only_quantized else i not in self.keep_float)]

    def moves_float(self, use: Use) -> bool:
        """Data movement left float reads the float tensor, not its DequantizeLinear: onnxruntime
        (1.32) moves such a DequantizeLinear past it and then fails (a QuantizeLinear whose zero
        point type is not its output type; an abort when an If body reads the result)."""
        rule = rule_for(self.index.graph.node[use[0]])
        return use[0] not in self.quantized and rule is not None and rule.kind == "shares"

    def reads_shape_only(self, use: Use) -> bool:
        """Shape and Size read only the shape, which the integer tensor has too."""
        return is_kind(self.index.graph.node[use[0]], "shape")

    def values(self, name: str) -> np.ndarray:
        return tensor_array(self.inits[name])

    def weight(self, plan: WeightPlan) -> Weight:
        """The weight quantized under `plan` (remembered in `memo`)."""
        return weight_of(self.memo, ("qdq", plan), lambda: self.values(plan.name).astype(np.float32, copy=False), plan)


@dataclass
class _Edits:
    """What materialize adds (initializers, nodes, in the order they are written) and rewires:
    (node index, input or output index) -> the tensor name it takes instead."""

    inits: list[onnx.TensorProto] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: dict[Use, str] = field(default_factory=dict)
    outputs: dict[Use, str] = field(default_factory=dict)
    inside: dict[int, dict[str, str]] = field(default_factory=dict)  # node index -> its bodies' renames

    def add(self, other: _Edits) -> None:
        self.inits += other.inits
        self.nodes += other.nodes
        self.inputs.update(other.inputs)
        self.outputs.update(other.outputs)
        for i, renames in other.inside.items():
            self.inside.setdefault(i, {}).update(renames)

    @classmethod
    def joined(cls, *parts: _Edits) -> _Edits:
        whole = cls()
        for part in parts:
            whole.add(part)
        return whole


# --------------------------------------------------------------------------- weights


def _weight_edits(source: _Source, plan: Plan) -> tuple[_Edits, dict[str, np.ndarray]]:
    """Each weight as integer initializers and a DequantizeLinear (a weight only float
    activations read: Cast and Mul, qcli/weightonly.py); and each weight's scale, which its
    bias's scale derives from."""
    edits, scales = _Edits(), {}
    quantized = {t for g in plan.groups for t in g.tensors}
    for wp in plan.weights.values():
        q, scale, zero = source.weight(wp)
        scales[wp.name] = scale
        dtype = wp.scheme.dtype
        readers = {i for i, _ in source.uses(wp.name, only_quantized=True)}
        if weight_only(wp, readers, source.index.graph, plan.dynamic, quantized):
            # read by control flow too (or a graph output), where it would stay float: the folded
            # value takes the weight's own name, so that it is stored once and every reader reads it
            elsewhere = wp.name in source.float_reads
            inits, nodes = folded_weight(wp, q, scale, zero, wp.name if elsewhere else None)
            edits.add(_Edits(inits=inits, nodes=nodes))
            if elsewhere:  # its readers read it by its name: nothing to rewire
                continue
        else:
            # The zero point stays even when all zeros: onnxruntime fuses Gemm only with one. Per block
            # (MatMulNBits, which takes none) an all-zero one is left out: 1% of an int4 model's bytes.
            zero_point = None if isinstance(wp.scheme.granularity, PerBlock) and not np.any(zero) else (
                f"{wp.name}_zero_point")
            edits.inits += [
                _tensor(q, f"{wp.name}_quantized", dtype.onnx_type),
                numpy_helper.from_array(scale, f"{wp.name}_scale"),
                *([_tensor(zero, zero_point, dtype.onnx_type)] if zero_point else []),
            ]
            edits.nodes.append(_dequantize_node(
                f"{wp.name}_quantized", f"{wp.name}_scale", zero_point, f"{wp.name}_dequantized",
                axis=wp.axis, domain=qdq_domain(dtype.bits, source.opset), block=_block_size(wp),
            ))
        for use in source.uses(wp.name, only_quantized=True):
            edits.inputs[use] = f"{wp.name}_dequantized"
        for use in source.uses(wp.name, only_quantized=False):
            if source.reads_shape_only(use) and not dtype.is_float:  # the integer copy has the shape
                edits.inputs[use] = f"{wp.name}_quantized"
    return edits, scales


def _block_size(plan: WeightPlan) -> int:
    """DequantizeLinear's `block_size` attribute for the weight: 0 (none) unless per block."""
    granularity = plan.scheme.granularity
    return granularity.size if isinstance(granularity, PerBlock) else 0


# --------------------------------------------------------------------------- activations


def _group_edits(source: _Source, plan: Plan) -> tuple[_Edits, dict[str, np.ndarray]]:
    """Each group's scale and zero point, and a Q/DQ pair per member (an embedding table
    member: its integer values and a DequantizeLinear); and the scale of every member."""
    edits, scales = _Edits(), {}
    for group in plan.groups:
        if group.scale is None or group.zero_point is None:
            raise InternalError(f"group {group.tensors[0]!r} has no qparams (assign_ranges first)")
        base = group.tensors[0]
        scale = np.asarray(group.scale, dtype=np.float32).reshape(())
        edits.inits += [
            numpy_helper.from_array(scale, f"{base}_scale"),
            _tensor(group.zero_point, f"{base}_zero_point", group.scheme.dtype.onnx_type),
        ]
        for t in group.tensors:
            scales[t] = group.scale
            member = _constant_member if t == group.constant else _activation_member
            edits.add(member(source, group, t))
    return edits, scales


def _constant_member(source: _Source, group: Group, t: str) -> _Edits:
    """An initializer of a group (an embedding table) quantized with the group's params."""
    base, dtype = group.tensors[0], group.scheme.dtype
    values = source.values(t).astype(np.float32)
    q = quantize(values, group.scale, group.zero_point, dtype, None, group.scheme.symmetric)
    edits = _Edits(inits=[_tensor(q, f"{t}_quantized", dtype.onnx_type)])
    edits.nodes.append(_dequantize_node(
        f"{t}_quantized", f"{base}_scale", f"{base}_zero_point", f"{t}_dequantized",
        domain=qdq_domain(dtype.bits, source.opset),
    ))
    for use in source.uses(t, only_quantized=True):
        edits.inputs[use] = f"{t}_dequantized"
    return edits


def _activation_member(source: _Source, group: Group, t: str) -> _Edits:
    """The Q/DQ pair of activation `t`, and its readers rewired to the pair's output. A graph
    output keeps its name on the DequantizeLinear: its producer writes `t_float` instead."""
    base, domain = group.tensors[0], qdq_domain(group.scheme.dtype.bits, source.opset)
    scale, zero = f"{base}_scale", f"{base}_zero_point"
    edits = _Edits()
    if t in source.outputs and t in source.producer:
        edits.outputs[source.producer[t]] = f"{t}_float"
        read, target = f"{t}_float", t
        for use in source.uses(t, only_quantized=False):
            if source.moves_float(use):
                edits.inputs[use] = read
    else:
        read, target = t, f"{t}_dequantized"
        for use in source.uses(t, only_quantized=False):
            # Shape and Size read only the shape: the integer tensor has the same, and
            # reading it spares a DequantizeLinear that nothing else needs.
            # (onnxruntime's Shape has no float8 kernel: those read the float copy.)
            if not source.moves_float(use):
                integer = source.reads_shape_only(use) and not group.scheme.dtype.is_float
                edits.inputs[use] = f"{t}_quantized" if integer else target
        # control-flow bodies read it by name from the outer scope: they read the pair's output
        # too, so the float name has no reader left and its Relu can fold into the fused kernel
        # (Silero VAD's If bodies read its encoder's last Relu: that Conv ran float, its int8
        # weight dequantized each run, until they did)
        for i in source.index.read_inside.get(t, ()):
            if i not in source.keep_float:
                edits.inside.setdefault(i, {})[t] = target
    edits.nodes += [
        helper.make_node("QuantizeLinear", [read, scale, zero], [f"{t}_quantized"], name=f"{t}_Q", domain=domain),
        _dequantize_node(f"{t}_quantized", scale, zero, target, domain=domain),
    ]
    return edits


# --------------------------------------------------------------------------- biases


def _bias_edits(
    source: _Source, plan: Plan, group_scales: dict[str, np.ndarray], weight_scales: dict[str, np.ndarray]
) -> _Edits:
    """Each bias as int32 on its node's accumulator grid and no zero point (see the module
    docstring). A bias whose input has no scale, or whose weight is per block, stays float."""
    edits = _Edits()
    for key, bp in plan.biases.items():
        if bp.input not in group_scales or isinstance(plan.weights[bp.weight].scheme.granularity, PerBlock):
            continue
        scale = _bias_scale(bp, group_scales[bp.input], weight_scales[bp.weight])
        q = _quantize_bias(source.values(bp.name), scale)
        edits.inits += [
            numpy_helper.from_array(q, f"{key}_quantized"),
            numpy_helper.from_array(scale, f"{key}_scale"),
        ]
        edits.nodes.append(_dequantize_node(
            f"{key}_quantized", f"{key}_scale", None, f"{key}_dequantized", axis=q.ndim - 1 if scale.ndim else None,
        ))
        for use in source.uses(bp.name, only_quantized=True):
            if use[0] in bp.nodes:
                edits.inputs[use] = f"{key}_dequantized"
    return edits


def _bias_scale(bp: BiasPlan, input_scale: np.ndarray, weight_scale: np.ndarray) -> np.ndarray:
    """The bias's scale: factor x input scale x weight scale; one, or one per output channel
    (the weight's scales repeated `bp.repeats` times: a grouped ConvTranspose).

    >>> bp = BiasPlan("c", "x", "w", factor=0.5, repeats=2)
    >>> _bias_scale(bp, np.float32(0.5), np.array([1.0, 2.0], np.float32)).tolist()
    [0.25, 0.5, 0.25, 0.5]
    """
    scale = (np.float64(input_scale) * weight_scale.astype(np.float64) * np.float64(bp.factor)).astype(np.float32)
    return np.tile(scale, bp.repeats) if scale.ndim else scale


def _quantize_bias(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """A bias's int32 values under `scale` (zero point 0). Per-channel scales run along its last
    axis: a bias that broadcasts there (Gemm's scalar, [1] or [M, 1] C) is spread over the
    channels first, as the node would (its output is the same).

    >>> _quantize_bias(np.array([1.0], np.float32), np.array([0.5, 0.25], np.float32)).tolist()
    [2, 4]
    """
    values = values.astype(np.float64)
    if scale.ndim:
        values = np.broadcast_to(values, np.broadcast_shapes(values.shape, scale.shape))
    return np.clip(np.rint(values / scale), -(2**31) + 1, 2**31 - 1).astype(np.int32)


# --------------------------------------------------------------------------- graph edits


def _dequantize_node(
    q_name: str, scale: str, zero: str | None, output: str, *, axis: int | None = None, domain: str = "", block: int = 0
) -> onnx.NodeProto:
    """DequantizeLinear of `<t>_quantized`, named `<t>_DQ` (as its QuantizeLinear is `<t>_Q`);
    `zero` None omits the zero point (all zeros: int32 bias)."""
    inputs = [q_name, scale] + ([zero] if zero else [])
    name = q_name.removesuffix("_quantized") + "_DQ"
    node = helper.make_node("DequantizeLinear", inputs, [output], name=name, domain=domain)
    if axis is not None:
        node.attribute.append(helper.make_attribute("axis", axis))
    if block:
        node.attribute.append(helper.make_attribute("block_size", block))
    return node


def _rewire(graph: onnx.GraphProto, edits: _Edits) -> None:
    for (i, k), name in edits.inputs.items():
        graph.node[i].input[k] = name
    for (i, k), name in edits.outputs.items():
        graph.node[i].output[k] = name
    for i, renames in edits.inside.items():
        for sub in node_subgraphs(graph.node[i]):
            for _, inner in iter_graphs(sub):
                for node in inner.node:
                    node.input[:] = [renames.get(name, name) for name in node.input]
                for output in inner.output:  # a body that returns the outer value as it is
                    output.name = renames.get(output.name, output.name)


def _drop_unread_initializers(
    graph: onnx.GraphProto, inits: Mapping[str, onnx.TensorProto], old_nodes: list[onnx.NodeProto], edits: _Edits,
    shared: SharedStore | None = None,
) -> None:
    """The float initializers still read added to the graph, copied without them
    (`_copy_to_edit`), from `inits` (as references to `shared` when given), then the new
    ones; the graph inputs of those nothing reads any more dropped (old models list
    initializers as inputs)."""
    read = {name for node in [*old_nodes, *edits.nodes] for name in node.input}
    read |= {name for node in old_nodes for name in names_used_inside(node)}
    read |= {o.name for o in graph.output}  # a graph output reads its initializer too
    read -= {name for node in edits.nodes for name in node.output}  # a folded weight-only weight
    kept = [t for t in inits.values() if t.name in read]
    if shared is not None:
        kept = shared.references(kept)
    graph.initializer.extend(kept + edits.inits)
    inputs = [i for i in graph.input if i.name not in inits or i.name in read]
    del graph.input[:]
    graph.input.extend(inputs)


def _import_contrib_domain(model: onnx.ModelProto, new_nodes: list[onnx.NodeProto]) -> None:
    """com.microsoft in the model's opset imports when a new Q/DQ node is of that domain."""
    if any(n.domain == CONTRIB for n in new_nodes) and not any(o.domain == CONTRIB for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB, 1))


def _tensor(values: np.ndarray, name: str, onnx_type: int) -> onnx.TensorProto:
    """An initializer of `onnx_type`; int4/uint4 packed two per byte into raw data, the first of
    each pair in the low nibble (onnx's helper stores them as int32 varints: 1.4x the bytes, and
    10 bytes per negative pair).

    >>> t = _tensor(np.array([[-7, 3], [2, -1]], np.int8), "w", onnx.TensorProto.INT4)
    >>> t.raw_data.hex(), numpy_helper.to_array(t).tolist()
    ('39f2', [[-7, 3], [2, -1]])
    """
    values = np.asarray(values)
    bits: dict[int, int] = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4, onnx.TensorProto.INT2: 2,
                            onnx.TensorProto.UINT2: 2}
    if onnx_type in bits:
        return helper.make_tensor(name, onnx_type, values.shape, packed(values, bits[onnx_type]), raw=True)
    return numpy_helper.from_array(values, name)


def packed(values: np.ndarray, bits: int) -> bytes:
    """Integers of `bits` (4 or 2) packed into bytes, the first in the lowest bits (ONNX's order).

    >>> packed(np.array([-2, 1, 0, -1, 1], np.int8), 2).hex()
    'c601'
    """
    per = 8 // bits
    low = np.ascontiguousarray(values).astype(np.int8, copy=False).ravel().view(np.uint8)  # two's complement
    if low.size % per:
        low = np.append(low, np.zeros(-low.size % per, np.uint8))
    mask = np.uint8((1 << bits) - 1)
    out = low[0::per] & mask
    for k in range(1, per):
        out |= (low[k::per] & mask) << np.uint8(k * bits)
    return out.tobytes()
