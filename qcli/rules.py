"""Op rules as data: for each ONNX op type, which inputs are activations, weights and bias, how
its output relates to its inputs, and whether it is quantized by default.

Kinds:
- `compute`: an int8 kernel exists in onnxruntime for the Q/DQ pattern around this op
  (QLinearConv, QLinearMatMul/MatMulInteger, QGemm, QLinearAdd/Mul, QLinearAveragePool, ...):
  its activation inputs and its output get their own Q/DQ.
- `shares`: data movement (Reshape, Transpose, MaxPool, Concat, ...): its output is its input
  rearranged, so input and output share one scale (a shared-qparams group), which lets
  onnxruntime drop the Q/DQ pair or run the op on int8 directly.
- `fold`: Relu/Clip right after a quantized producer: no Q/DQ of its own; the producer's output
  range is the clipped one (onnxruntime folds the pair into the producer's requantization).
  A Clip folds only when its `bounds` are constants.
- `shape`: reads only its input's shape (Shape, Size): never quantized; where it reads a
  quantized tensor, it reads the integer copy (same shape), which spares a DequantizeLinear.

`anchor` marks the ops whose int8 kernel pays for the Q/DQ pairs around it (Conv,
ConvTranspose, MatMul, Gemm): a connected group of quantizable nodes without one stays float.
`constant_weight`: the int8 kernel needs the weight as a constant (QLinearConv); MatMul and
Gemm also multiply two activations. `rearranges`: the output holds exactly the first input's
values, reordered (Reshape, Transpose...), so its statistics are the input's. `output_range`:
the output's range is known without calibration (Sigmoid, Softmax: [0, 1]). `clip_range`: what
a `fold` op clips its input to (Relu: [0, inf)) before its constant `bounds` narrow it (Clip).

Weights are quantized per channel along their output channels (`weight_axis`), biases on their
node's accumulator grid (`channel_repeats`, `bias_scale_factor`; qdq.py says how).

`float_output` marks compute ops whose int8 kernel can also write float directly (QGemm without
an output scale, MatMulIntegerToFloat): their output gets a Q/DQ pair only when a quantized node
reads it. A classifier's logits then come out of the int8 kernel in float: one QuantizeLinear /
DequantizeLinear pair less to run and store, and no rounding of the output. Other compute ops
(QLinearConv, QLinearAdd, ...) fuse only with a QuantizeLinear after them.

Ops not in the table stay float. `default_float` marks ops that have a rule (so a YAML
override can quantize them) but whose 8-bit form hurts accuracy or speed by default.

`DYNAMIC` is the second table: the ops with a dynamic form (activations quantized at run time,
`activations.mode: dynamic`, `precision: dynamic`), which constant inputs are its int8 weights,
and the `form` qcli/dynamic.py emits: `matmul` (DynamicQuantizeLinear + MatMulInteger + Cast +
Mul, which onnxruntime fuses into DynamicQuantizeMatMul or MatMulIntegerToFloat), `lstm`
(com.microsoft DynamicQuantizeLSTM) or `gather` (an int8 embedding table: Gather, then
DequantizeLinear of the rows read). Entries with a `reason` are measured and not offered.
"""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass
from typing import Literal

import onnx

Kind = Literal["compute", "shares", "fold", "shape"]


@dataclass(frozen=True)
class OpRule:
    kind: Kind
    activations: tuple[int, ...] = (0,)  # input indices quantized as activations (-1: all)
    weights: tuple[int, ...] = ()  # input indices quantized as weights when they are constant
    bias: int | None = None  # input index of an int32 bias (scale: see bias_scale_factor)
    channel_axis: int | None = None  # per-channel axis of the weight (see `weight_axis`)
    default_float: bool = False
    reason: str = ""  # why default_float
    float_output: bool = False  # the fused int8 kernel can write float (see the module docstring)
    anchor: bool = False  # an int8 kernel worth its Q/DQ pairs (see the module docstring)
    constant_weight: bool = False  # quantized only when its weight is a constant
    bounds: tuple[int, ...] = ()  # `fold`: input indices that must be constants (Clip's min, max)
    rearranges: bool = False  # the output is the first input's values, reordered
    output_range: tuple[float, float] | None = None  # known without calibration (see the Softmax rule)
    clip_range: tuple[float, float] | None = None  # `fold`: what it clips to, before its `bounds` narrow it


ALL_INPUTS = (-1,)

RULES: dict[str, OpRule] = {
    # compute: onnxruntime has an int8 kernel for the fused Q/DQ pattern
    "Conv": OpRule("compute", (0,), weights=(1,), bias=2, channel_axis=0, anchor=True, constant_weight=True),
    "ConvTranspose": OpRule(
        "compute", (0,), weights=(1,), bias=2, channel_axis=1, anchor=True, constant_weight=True
    ),
    "MatMul": OpRule(  # channel_axis: see weight_axis (a matrix only)
        "compute", (0, 1), weights=(1,), channel_axis=1, float_output=True, anchor=True
    ),
    "Gemm": OpRule(  # channel_axis: see weight_axis (transB)
        "compute", (0, 1), weights=(1,), bias=2, channel_axis=0, float_output=True, anchor=True
    ),
    "Add": OpRule("compute", (0, 1)),
    "Mul": OpRule("compute", (0, 1)),
    "AveragePool": OpRule("compute"),
    "GlobalAveragePool": OpRule("compute"),
    "Sigmoid": OpRule("compute", output_range=(0.0, 1.0)),
    "LeakyRelu": OpRule("compute"),
    "Gather": OpRule("shares", (0,), weights=(0,), channel_axis=None),  # embedding tables
    # shares: pure data movement, one scale for input and output
    "Concat": OpRule("shares", ALL_INPUTS),
    "Reshape": OpRule("shares", rearranges=True),
    "Transpose": OpRule("shares", rearranges=True),
    "Flatten": OpRule("shares", rearranges=True),
    "Squeeze": OpRule("shares", rearranges=True),
    "Unsqueeze": OpRule("shares", rearranges=True),
    "MaxPool": OpRule("shares"),
    "GlobalMaxPool": OpRule("shares"),
    "Slice": OpRule("shares"),
    "Split": OpRule("shares"),
    "Resize": OpRule("shares"),
    "Expand": OpRule("shares"),
    "Tile": OpRule("shares"),
    "DepthToSpace": OpRule("shares", rearranges=True),
    "SpaceToDepth": OpRule("shares", rearranges=True),
    "Identity": OpRule("shares", rearranges=True),
    # fold: clipping activations absorbed into the producer's output range
    "Relu": OpRule("fold", clip_range=(0.0, math.inf)),
    "Clip": OpRule("fold", bounds=(1, 2), clip_range=(-math.inf, math.inf)),
    # shape: reads only the shape
    "Shape": OpRule("shape", activations=()),
    "Size": OpRule("shape", activations=()),
    # quantizable on request, float by default
    # Softmax's known output range also must not be narrower: when onnxruntime fuses
    # DequantizeLinear -> Softmax -> QuantizeLinear into QLinearSoftmax, an output scale below
    # 1/256 makes the int8 kernel wrap large probabilities around to 0 (seen with onnxruntime
    # 1.31), so Softmax outputs always use the full [0, 1].
    "Softmax": OpRule(
        "compute", default_float=True, output_range=(0.0, 1.0),
        reason="8-bit Softmax inputs (attention logits) lose the large-logit range",
    ),
    "LayerNormalization": OpRule(
        "compute", default_float=True,
        reason="normalisation needs more than 8 bits; onnxruntime has no int8 kernel for it",
    ),
    "InstanceNormalization": OpRule("compute", default_float=True, reason="normalisation needs more than 8 bits"),
    "Sub": OpRule("compute", (0, 1), default_float=True, reason="part of decomposed normalisation; no int8 kernel"),
    "Div": OpRule("compute", (0, 1), default_float=True, reason="variance chains need more than 8 bits"),
    "Pow": OpRule("compute", (0,), default_float=True, reason="variance chains need more than 8 bits"),
    "Sqrt": OpRule("compute", default_float=True, reason="variance chains need more than 8 bits"),
    "ReduceMean": OpRule("compute", default_float=True, reason="variance chains need more than 8 bits"),
    "Exp": OpRule("compute", default_float=True, reason="exponent amplifies 8-bit error"),
    "Log": OpRule("compute", default_float=True, reason="logarithm amplifies 8-bit error near 0"),
    "Erf": OpRule("compute", default_float=True, reason="no int8 kernel; GELU is cheap in float"),
    "Tanh": OpRule("compute", default_float=True, reason="no int8 kernel"),
}

#: Ops without an int8 kernel whose constant weights a weight-only config (activations float)
#: still stores as integers: written as Cast, Mul, which onnxruntime folds at load, so the node
#: computes in float as before from a smaller file (qcli/weightonly.py). The recurrent cells' W
#: and R, per channel along their gates x hidden rows (axis 1 of [directions, rows, inputs]); the
#: bias stays float. Only under float activations (`weight_only_rule`): a static 8-bit config
#: quantizes an LSTM dynamically (DYNAMIC_ONLY) and keeps a GRU float.
WEIGHT_ONLY: dict[str, OpRule] = {
    op: OpRule("compute", activations=(), weights=(1, 2), channel_axis=1, anchor=True, constant_weight=True)
    for op in ("LSTM", "GRU", "RNN")
}
#: Under float activations, an Einsum's constant operands (a speech enhancer's projections) are
#: weights too, one scale each (which axis is a channel depends on the equation): `weight_only_rule`
#: makes its rule from which inputs are constants.
WEIGHT_ONLY_OPERANDS = ("Einsum",)

#: Mul of a tensor by itself: x**2 as JAX/TensorFlow exports spell it (the E[x**2] of a
#: LayerNorm that computes the variance as E[x**2] - E[x]**2, where 8 bits on the square cancel
#: away the variance; GELU's x**3). Pow's rule, not Mul's. Measured on magika's jax2tf model:
#: all-int8 top-1 agreement 92% with the squares quantized.
SQUARE = OpRule(
    "compute", (0, 1), default_float=True, reason="a square (Mul of x by x): variance chains need more than 8 bits"
)


#: The explicit Mul by 1/s of SmoothQuant and AWQ (qcli/recovery/smoothquant.py names its
#: constant with this suffix): a per-channel vector whose small factors (the outlier channels')
#: one per-tensor 8-bit scale would round away, so the Mul runs in float (and the scaled tensor
#: after it is quantized for its readers when they read quantized activations).
SMOOTHING_SUFFIX = "_smoothquant_inv_s"
SMOOTHING = OpRule(
    "compute", (0, 1), default_float=True,
    reason="a per-channel 1/s (SmoothQuant, AWQ): 8 bits of one scale would lose the outlier channels' small factors",
)

#: SmoothQuant's readers: the axis of input 0 (the activation) that holds the input channels
#: (Gemm's input is a matrix: its last axis). The weight's is the reduction axis (`block_axis`).
#: A Conv is a reader when it is 1x1 with group 1 (qcli/recovery/smoothquant.py checks).
SMOOTH_ACTIVATION_AXIS: dict[str, int] = {"MatMul": -1, "Gemm": -1, "Conv": 1}

#: Producers that can take the 1/s into their constants when every reader of their output is
#: smoothed with the same s, and which of their inputs are scaled along which axis
#: (None: the constant's last axis, a per-channel Mul/Add broadcast along the channels).
#: MatMul/Gemm/Conv scale their output channels (Gemm's axis depends on transB, see smoothquant.py).
SMOOTH_FOLDS: dict[str, tuple[int, ...]] = {
    "LayerNormalization": (1, 2),  # scale, bias over the last axis
    "Mul": (1,),  # x * c with a constant c per channel (either input): c / s
    "Add": (1,),  # x + c likewise, when x's producer folds too (a MatMul's bias Add): c / s
    "MatMul": (1,),  # weight columns
    "Gemm": (1, 2),  # weight output channels and bias
    "Conv": (1, 2),  # weight output channels (axis 0) and bias
}


#: Outputs whose range is known without calibration, by op type (the rules' `output_range`).
OUTPUT_RANGES: dict[str, tuple[float, float]] = {
    op: rule.output_range for op, rule in RULES.items() if rule.output_range is not None
}


@dataclass(frozen=True)
class DynamicRule:
    form: Literal["matmul", "lstm", "gather"] | None  # None: not offered (see `reason`)
    weights: tuple[int, ...] = (1,)  # constant inputs quantized as int8 weights
    reason: str = ""  # why a node of this op stays float in dynamic mode


DYNAMIC: dict[str, DynamicRule] = {
    "MatMul": DynamicRule("matmul"),
    "Gemm": DynamicRule("matmul"),
    "LSTM": DynamicRule("lstm", weights=(1, 2)),
    # An embedding table: int8 per column, gathered as int8 and dequantized after (only the
    # rows read), as onnxruntime's quantize_dynamic does; no activation to quantize.
    "Gather": DynamicRule("gather", weights=(0,)),
    # Measured (docs/guides/formats.md): stacks of 4 Conv+Relu quantized by onnxruntime's
    # quantize_dynamic (DynamicQuantizeLinear + ConvInteger + Cast + Mul, unfused) ran 3.4-4.5x
    # the float latency (3x3 at 64 and 128 channels, 1x1 at 256); onnxruntime has no dynamic GRU.
    "Conv": DynamicRule(None, (1,), reason="dynamic Conv (ConvInteger) runs 3-4x slower than float here: "
                        "quantize it statically"),
    "GRU": DynamicRule(None, (1, 2), reason="onnxruntime has no dynamic int8 GRU kernel"),
}

#: Ops whose only int8 kernel in onnxruntime is dynamic (no QLinear form): under static 8-bit
#: activations they are quantized dynamically (DynamicQuantizeLSTM), not kept float. Measured on
#: ddddocr's CNN + LSTM (docs/guides/formats.md): the LSTM alone dynamic keeps 99.2% of
#: 256 held-out captchas' strings, 1.3x smaller, 1.2x faster than float.
DYNAMIC_ONLY = frozenset({"LSTM"})

#: The reason of a node in dynamic mode whose op has no dynamic form.
NO_DYNAMIC_FORM = "no dynamic int8 kernel for this op (dynamic: MatMul, Gemm, LSTM, Gather of a table)"


def dynamic_rule(node: onnx.NodeProto) -> tuple[DynamicRule | None, str]:
    """The dynamic form of a node and, when it has none here, why: its op has none, or the
    attributes its kernel lacks (Gemm's transA; LSTM's layout 1, which DynamicQuantizeLSTM
    does not take)."""
    rule = DYNAMIC.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if rule is None:
        return None, NO_DYNAMIC_FORM
    if rule.form is None:
        return None, rule.reason
    if node.op_type == "Gemm" and _int_attribute(node, "transA", 0):
        return None, "a transposed Gemm input (transA=1) has no dynamic form"
    if node.op_type == "LSTM" and _int_attribute(node, "layout", 0):
        return None, "DynamicQuantizeLSTM takes no batch-first layout (layout=1)"
    if node.op_type == "Gather" and _int_attribute(node, "axis", 0) != 0:
        return None, "a Gather along another axis than the table's rows (axis 0) is kept float"
    return rule, ""


def rule_for(node: onnx.NodeProto) -> OpRule | None:
    """The rule of a node of the default ONNX domain, or None (the node stays float, as does
    a `shape` node)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return SQUARE
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[1].endswith(SMOOTHING_SUFFIX):
        return SMOOTHING
    return RULES.get(node.op_type)


def weight_only_rule(node: onnx.NodeProto, constants: Container[str] = ()) -> OpRule | None:
    """The rule of a node under float activations (weight-only): its own, else `WEIGHT_ONLY`'s,
    or for an op of WEIGHT_ONLY_OPERANDS reading `constants` (initializer names), one whose
    weights are those inputs, per tensor."""
    rule = rule_for(node)
    if rule is not None or node.domain not in ("", "ai.onnx"):
        return rule
    if node.op_type in WEIGHT_ONLY_OPERANDS:
        read = tuple(k for k, name in enumerate(node.input) if name and name in constants)
        return OpRule("compute", activations=(), weights=read, anchor=True, constant_weight=True) if read else None
    return WEIGHT_ONLY.get(node.op_type)


def is_kind(node: onnx.NodeProto, kind: Kind) -> bool:
    """Whether the node has a rule of this kind (`fold`: a Relu or Clip; `shape`: Shape, Size)."""
    rule = rule_for(node)
    return rule is not None and rule.kind == kind


def rearranges(node: onnx.NodeProto) -> bool:
    """Whether the node's output holds exactly its first input's values, reordered."""
    rule = rule_for(node)
    return rule is not None and rule.rearranges


def folds_statically(node: onnx.NodeProto, constants: Container[str]) -> bool:
    """Whether a `fold` node's `bounds` are constants or absent (Relu has none; a Clip whose
    min or max is computed cannot fold into its producer's range)."""
    rule = rule_for(node)
    if rule is None:
        return False
    present = [node.input[k] for k in rule.bounds if k < len(node.input) and node.input[k]]
    return all(name in constants for name in present)


def activation_inputs(node: onnx.NodeProto, rule: OpRule) -> list[int]:
    """Indices of the node's inputs quantized as activations (present inputs only)."""
    if rule.activations == ALL_INPUTS:
        return [i for i, name in enumerate(node.input) if name]
    return [i for i in rule.activations if i < len(node.input) and node.input[i]]


def weight_axis(node: onnx.NodeProto, rule: OpRule, weight_rank: int) -> int | None:
    """Per-channel axis of a node's weight: the axis of its output channels. Conv: 0;
    ConvTranspose: 1 (its weight is [C_in, C_out / group, k...]: see `channel_repeats`); Gemm:
    N, 0 with transB=1 else 1; MatMul: 1, for a matrix only. A MatMul weight of another rank is
    per tensor: a vector has no output axis, and onnxruntime's int8 kernels (MatMulInteger,
    MatMulIntegerToFloat) take a batched [..., K, N] weight's per-column params only shaped
    [..., 1, N], which DequantizeLinear's one 1-D axis cannot express.

    >>> matmul = onnx.helper.make_node("MatMul", ["x", "w"], ["y"])
    >>> [weight_axis(matmul, RULES["MatMul"], rank) for rank in (1, 2, 3)]
    [None, 1, None]
    """
    if rule.channel_axis is None:
        return None
    if node.op_type == "Gemm":
        return 0 if _int_attribute(node, "transB", 0) else 1
    if node.op_type == "MatMul" and weight_rank != 2:
        return None
    return rule.channel_axis if rule.channel_axis < weight_rank else None


def channel_repeats(node: onnx.NodeProto) -> int:
    """How many times a weight's per-channel scales repeat along the node's output channels:
    a ConvTranspose's `group` (output channel g x C_out / group + j reads column j of group g's
    rows, all of scale j), else 1."""
    return max(_int_attribute(node, "group", 1), 1) if node.op_type == "ConvTranspose" else 1


def bias_scale_factor(node: onnx.NodeProto) -> float | None:
    """The int32 bias's scale over input scale x weight scale: Gemm's alpha / beta, else 1; None
    when that is not a positive number (the bias stays float; see the module docstring).

    >>> gemm = onnx.helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0)
    >>> ignored = onnx.helper.make_node("Gemm", ["a", "b", "c"], ["y"], beta=0.0)
    >>> bias_scale_factor(gemm), bias_scale_factor(ignored)
    (0.25, None)
    """
    if node.op_type != "Gemm":
        return 1.0
    alpha, beta = _float_attribute(node, "alpha", 1.0), _float_attribute(node, "beta", 1.0)
    factor = alpha / beta if beta else math.inf
    return factor if 0 < factor < math.inf else None


def block_axis(node: onnx.NodeProto, weight_rank: int) -> int | None:
    """Axis of a weight along which per-block scales run: the reduction axis (MatMul's K, the
    second-to-last; Gemm's K, 1 with transB=1 else 0; Conv's input channels)."""
    if node.op_type == "MatMul" and weight_rank >= 2:
        return weight_rank - 2
    if node.op_type == "Gemm":
        return 1 if _int_attribute(node, "transB", 0) else 0
    if node.op_type in ("Conv", "ConvTranspose") and weight_rank >= 2:
        return 1 if node.op_type == "Conv" else 0
    return None


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _float_attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    return next((a.f for a in node.attribute if a.name == name), default)


# --------------------------------------------------------------------------- float16 / bfloat16

# The third table: ops that stay float32 in a float16/bfloat16 model whatever their values
# (qcli/half.py adds the rules that read the calibrated values: range, long reductions).
FLOAT32_IN_HALF: dict[str, str] = {
    "Exp": "Exp overflows float16 above 11 and loses its small values",
    "Log": "Log of values float16 flushes to zero is -inf",
    "Pow": "a power's range grows with its input's",
    "Softplus": "Softplus is an Exp and a Log",
    "LogSoftmax": "a log-probability of a rounded sum",
    "LayerNormalization": "normalisation statistics (mean and variance) need float32",
    "InstanceNormalization": "normalisation statistics (mean and variance) need float32",
    "GroupNormalization": "normalisation statistics (mean and variance) need float32",
    "LpNormalization": "normalisation statistics (a norm over the axis) need float32",
    "ReduceSumSquare": "a sum of squares outgrows the type",
    "ReduceL2": "a sum of squares outgrows the type",
    "ReduceLogSumExp": "an Exp inside a reduction",
    "CumSum": "a running sum over the axis",
    "QuantizeLinear": "qcli's quantized nodes keep float32 scales",
    "DequantizeLinear": "qcli's quantized nodes keep float32 scales",
    "DynamicQuantizeLinear": "qcli's quantized nodes keep float32 scales",
}
# Reductions whose accumulated length qcli checks against the type's precision.
HALF_REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceLogSum", "Softmax"})
