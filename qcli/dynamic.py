"""Materialize the plan's dynamic nodes (docs/guides/formats.md): each is replaced by the
subgraph onnxruntime runs with int8 kernels, its activations quantized at run time.

- `matmul` (MatMul, Gemm): `DynamicQuantizeLinear(x) -> x_dynamic_quantized, _scale, _zero_point`
  (one per activation, shared by its dynamic readers), `MatMulInteger(xq, w_quantized, xz, wz)`,
  `Cast` to float, `Mul` by `x scale x weight scale` (and Gemm's alpha), then `Add` of Gemm's
  beta x C. onnxruntime fuses it into DynamicQuantizeMatMul (or MatMulIntegerToFloat when one
  DynamicQuantizeLinear feeds several), as it does the output of its own `quantize_dynamic`.
  A Gemm's transB=1 weight is stored transposed ([K, N]: MatMulInteger's layout).
- `gather`: an embedding table int8 per column; Gather of the int8 rows, then DequantizeLinear
  (axis -1) of the rows read, as onnxruntime's `quantize_dynamic` stores tables.
- `lstm`: com.microsoft DynamicQuantizeLSTM, its W and R int8 transposed to [D, I, 4H] with one
  scale per direction and row ([D, 4H]), as onnxruntime's `quantize_dynamic` writes it (per
  tensor: one scale, written per direction, [D]).
Names derive from the tensor and node names: the output is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.graph import GraphIndex
from qcli.lazy import tensor_array
from qcli.plan import DynamicNode, Plan, WeightPlan
from qcli.qweights import WeightMemo, quantized_weight, weight_of

CONTRIB = "com.microsoft"
#: What the nodes replacing dynamic node N are named: N + one of these (kernel times attribute by it).
NODE_SUFFIXES = ("_MatMulInteger", "_Cast", "_scales_Mul", "_Mul", "_Add", "_beta_Mul", "_quant", "_Gather",
                 "_DequantizeLinear")
QUANTIZER_SUFFIX = "_DynamicQuantize"  # the DynamicQuantizeLinear of activation x: x + this

Use = tuple[int, int]


@dataclass
class DynamicEdits:
    """What the dynamic nodes add, and which original nodes they replace."""

    inits: list[onnx.TensorProto] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    replaced: set[int] = field(default_factory=set)
    quantizers: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # activation -> DQL outputs
    names: set[str] = field(default_factory=set)  # initializers added
    memo: WeightMemo | None = None  # the graph's weights quantized by earlier builds (`weight_of`)


def dynamic_edits(index: GraphIndex, plan: Plan, rewired: Mapping[Use, str],
                  renamed: Mapping[Use, str] | None = None, memo: WeightMemo | None = None) -> DynamicEdits:
    """The replacement of every dynamic node. `rewired`: the inputs the static edits redirect
    (a dynamic node reading a statically quantized tensor reads its dequantized copy, so that
    its producer's int8 kernel still fuses); `renamed`: the outputs they rename (a statically
    quantized graph output keeps its name on its DequantizeLinear: its producer writes
    `t_float`). `memo`: as `materialize`'s."""
    edits = DynamicEdits(memo=memo)
    for i, dn in sorted(plan.dynamic.items()):
        node = onnx.NodeProto()
        node.CopyFrom(index.graph.node[i])
        for k in range(len(node.output)):
            node.output[k] = (renamed or {}).get((i, k), node.output[k])
        inputs = [rewired.get((i, k), name) for k, name in enumerate(node.input)]
        FORMS[dn.form](edits, index, node, inputs, dn)
        edits.replaced.add(i)
    return edits


def _float_values(index: GraphIndex, name: str) -> Callable[[], np.ndarray]:
    return lambda: tensor_array(index.initializers[name]).astype(np.float32)


def _matmul(edits: DynamicEdits, index: GraphIndex, node: onnx.NodeProto, inputs: list[str], dn: DynamicNode) -> None:
    """DynamicQuantizeLinear + MatMulInteger + Cast + Mul (+ Add for Gemm's C)."""
    name, out = node.name or f"{node.op_type}_{dn.index}", node.output[0]
    plan = dn.weights[0]
    q, scale, zero = weight_of(edits.memo, ("dynamic", plan), _float_values(index, plan.name), plan)
    transposed = node.op_type == "Gemm" and _attribute(node, "transB", 0)
    stored = f"{plan.name}_transposed" if transposed else plan.name
    if transposed:
        q = q.T
    alpha = float(_attribute(node, "alpha", 1.0)) if node.op_type == "Gemm" else 1.0
    w_scale = f"{stored}_scale" if alpha == 1.0 else f"{name}_weight_scale"
    _add_init(edits, q, f"{stored}_quantized")
    _add_init(edits, zero, f"{stored}_zero_point")
    _add_init(edits, (scale * np.float32(alpha)).astype(np.float32), w_scale)
    xq, xs, xz = _quantizer(edits, inputs[0])
    bias = _bias(edits, index, node, inputs, name)
    product = f"{out}_product" if bias else out
    edits.nodes += [
        helper.make_node("MatMulInteger", [xq, f"{stored}_quantized", xz, f"{stored}_zero_point"],
                         [f"{out}_integer"], name=f"{name}_MatMulInteger"),
        helper.make_node("Cast", [f"{out}_integer"], [f"{out}_integer_float"], name=f"{name}_Cast",
                         to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", [xs, w_scale], [f"{out}_scales"], name=f"{name}_scales_Mul"),
        helper.make_node("Mul", [f"{out}_integer_float", f"{out}_scales"], [product], name=f"{name}_Mul"),
    ]
    if bias:
        edits.nodes.append(helper.make_node("Add", [product, bias], [out], name=f"{name}_Add"))


def _bias(edits: DynamicEdits, index: GraphIndex, node: onnx.NodeProto, inputs: list[str], name: str) -> str:
    """Gemm's beta x C as a float tensor ("" when it has none, or beta is 0)."""
    if node.op_type != "Gemm" or len(inputs) < 3 or not inputs[2]:
        return ""
    beta, c = float(_attribute(node, "beta", 1.0)), inputs[2]
    if beta == 0.0:
        return ""
    if beta == 1.0:
        return c
    if c in index.initializers:
        values = tensor_array(index.initializers[c]).astype(np.float64) * beta
        _add_init(edits, values.astype(np.float32), f"{name}_bias")
    else:
        _add_init(edits, np.float32(beta), f"{name}_beta")
        edits.nodes.append(helper.make_node("Mul", [c, f"{name}_beta"], [f"{name}_bias"], name=f"{name}_beta_Mul"))
    return f"{name}_bias"


def _lstm(edits: DynamicEdits, index: GraphIndex, node: onnx.NodeProto, inputs: list[str], dn: DynamicNode) -> None:
    """com.microsoft DynamicQuantizeLSTM with int8 W and R ([D, I, 4H], [D, H, 4H])."""
    extra = []
    for plan in dn.weights:  # W, then R: [D, 4H, I] each, one scale per direction and row
        values = tensor_array(index.initializers[plan.name]).astype(np.float32)
        d, rows, cols = values.shape
        flat = WeightPlan(plan.name, plan.scheme, 0 if plan.axis is not None else None)
        q, scale, zero = quantized_weight(values.reshape(d * rows, cols), flat)
        # per channel [D, 4H]; per tensor one scale, written once per direction ([D]: the
        # kernel refuses a scalar)
        shape = (d, rows) if plan.axis is not None else (d,)
        _add_init(edits, q.reshape(d, rows, cols).transpose(0, 2, 1).copy(), f"{plan.name}_transposed_quantized")
        for values_, suffix in ((scale, "scale"), (zero, "zero_point")):
            laid = values_.reshape(shape) if plan.axis is not None else np.full(shape, values_.reshape(()))
            _add_init(edits, laid, f"{plan.name}_transposed_{suffix}")
        extra += [f"{plan.name}_transposed_scale", f"{plan.name}_transposed_zero_point"]
    padded = inputs + [""] * (8 - len(inputs))
    w, r = (f"{p.name}_transposed_quantized" for p in dn.weights)
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "layout"}
    edits.nodes.append(helper.make_node(
        "DynamicQuantizeLSTM", [padded[0], w, r, *padded[3:8], *extra], list(node.output),
        name=f"{node.name or f'LSTM_{dn.index}'}_quant", domain=CONTRIB, **attributes,
    ))


def _gather(edits: DynamicEdits, index: GraphIndex, node: onnx.NodeProto, inputs: list[str], dn: DynamicNode) -> None:
    """An int8 embedding table (per column: its last axis, which the gathered rows keep):
    Gather of the int8 rows, then DequantizeLinear of just those."""
    name, out, plan = node.name or f"Gather_{dn.index}", node.output[0], dn.weights[0]
    q, scale, zero = weight_of(edits.memo, ("dynamic", plan), _float_values(index, plan.name), plan)
    stored = f"{plan.name}_gather"
    for values_, suffix in ((q, "quantized"), (scale, "scale"), (zero, "zero_point")):
        _add_init(edits, values_, f"{stored}_{suffix}")
    edits.nodes += [
        helper.make_node("Gather", [f"{stored}_quantized", inputs[1]], [f"{out}_quantized"], name=f"{name}_Gather",
                         axis=0),
        helper.make_node("DequantizeLinear", [f"{out}_quantized", f"{stored}_scale", f"{stored}_zero_point"], [out],
                         name=f"{name}_DequantizeLinear"),
    ]
    if plan.axis is not None:  # per column: the gathered rows' last axis
        edits.nodes[-1].attribute.append(helper.make_attribute("axis", -1))


FORMS: dict[str, Callable[[DynamicEdits, GraphIndex, onnx.NodeProto, list[str], DynamicNode], None]] = {
    "matmul": _matmul,
    "lstm": _lstm,
    "gather": _gather,
}


def _quantizer(edits: DynamicEdits, x: str) -> tuple[str, str, str]:
    """The DynamicQuantizeLinear of activation `x` (one, whatever the number of dynamic readers)."""
    if x not in edits.quantizers:
        outputs = (f"{x}_dynamic_quantized", f"{x}_dynamic_scale", f"{x}_dynamic_zero_point")
        edits.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], list(outputs), name=f"{x}{QUANTIZER_SUFFIX}"))
        edits.quantizers[x] = outputs
    return edits.quantizers[x]


def _add_init(edits: DynamicEdits, values: np.ndarray, name: str) -> None:
    """An initializer, once (two dynamic nodes may read one weight)."""
    if name not in edits.names:
        edits.names.add(name)
        edits.inits.append(numpy_helper.from_array(np.asarray(values), name))


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
