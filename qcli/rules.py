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

`float_output` marks compute ops whose int8 kernel can also write float directly (QGemm without
an output scale, MatMulIntegerToFloat): their output gets a Q/DQ pair only when a quantized node
reads it. A classifier's logits then come out of the int8 kernel in float: one QuantizeLinear /
DequantizeLinear pair less to run and store, and no rounding of the output. Other compute ops
(QLinearConv, QLinearAdd, ...) fuse only with a QuantizeLinear after them.

Ops not in the table stay float. `default_float` marks ops that have a rule (so a YAML
override can quantize them) but whose 8-bit form hurts accuracy or speed by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx


@dataclass(frozen=True)
class OpRule:
    kind: str  # compute | shares | fold
    activations: tuple[int, ...] = (0,)  # input indices quantized as activations (-1: all)
    weights: tuple[int, ...] = ()  # input indices quantized as weights when they are constant
    bias: int | None = None  # input index of an int32 bias (scale = s_input * s_weight)
    channel_axis: int | None = None  # per-channel axis of the weight (see `weight_axis`)
    default_float: bool = False
    reason: str = ""  # why default_float
    float_output: bool = False  # the fused int8 kernel can write float (see the module docstring)


ALL_INPUTS = (-1,)

RULES: dict[str, OpRule] = {
    # compute: onnxruntime has an int8 kernel for the fused Q/DQ pattern
    "Conv": OpRule("compute", (0,), weights=(1,), bias=2, channel_axis=0),
    "ConvTranspose": OpRule("compute", (0,), weights=(1,), bias=2, channel_axis=1),
    "MatMul": OpRule("compute", (0, 1), weights=(1,), channel_axis=-1, float_output=True),
    "Gemm": OpRule("compute", (0, 1), weights=(1,), bias=2, channel_axis=0, float_output=True),  # axis: transB
    "Add": OpRule("compute", (0, 1)),
    "Mul": OpRule("compute", (0, 1)),
    "AveragePool": OpRule("compute"),
    "GlobalAveragePool": OpRule("compute"),
    "Sigmoid": OpRule("compute"),
    "LeakyRelu": OpRule("compute"),
    "Gather": OpRule("shares", (0,), weights=(0,), channel_axis=None),  # embedding tables
    # shares: pure data movement, one scale for input and output
    "Concat": OpRule("shares", ALL_INPUTS),
    "Reshape": OpRule("shares"),
    "Transpose": OpRule("shares"),
    "Flatten": OpRule("shares"),
    "Squeeze": OpRule("shares"),
    "Unsqueeze": OpRule("shares"),
    "MaxPool": OpRule("shares"),
    "GlobalMaxPool": OpRule("shares"),
    "Slice": OpRule("shares"),
    "Split": OpRule("shares"),
    "Resize": OpRule("shares"),
    "Expand": OpRule("shares"),
    "Tile": OpRule("shares"),
    "DepthToSpace": OpRule("shares"),
    "SpaceToDepth": OpRule("shares"),
    "Identity": OpRule("shares"),
    # fold: clipping activations absorbed into the producer's output range
    "Relu": OpRule("fold"),
    "Clip": OpRule("fold"),
    # quantizable on request, float by default
    "Softmax": OpRule(
        "compute", default_float=True,
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

#: Mul of a tensor by itself: x**2 as JAX/TensorFlow exports spell it (the E[x**2] of a
#: LayerNorm that computes the variance as E[x**2] - E[x]**2, where 8 bits on the square cancel
#: away the variance; GELU's x**3). Pow's rule, not Mul's. Measured on magika's jax2tf model:
#: all-int8 top-1 agreement 92% with the squares quantized.
SQUARE = OpRule("compute", (0, 1), default_float=True, reason="a square (Mul of x by x): variance chains need more than 8 bits")


# Outputs whose range is known without calibration. Softmax's also must not be narrower: when
# onnxruntime fuses DequantizeLinear -> Softmax -> QuantizeLinear into QLinearSoftmax, an output
# scale below 1/256 makes the int8 kernel wrap large probabilities around to 0 (measured with
# onnxruntime 1.31), so Softmax outputs always use the full [0, 1].
OUTPUT_RANGES: dict[str, tuple[float, float]] = {
    "Softmax": (0.0, 1.0),
    "Sigmoid": (0.0, 1.0),
}


def rule_for(node: onnx.NodeProto) -> OpRule | None:
    """The rule of a node of the default ONNX domain, or None (the node stays float)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return SQUARE
    return RULES.get(node.op_type)


def activation_inputs(node: onnx.NodeProto, rule: OpRule) -> list[int]:
    """Indices of the node's inputs quantized as activations (present inputs only)."""
    if rule.activations == ALL_INPUTS:
        return [i for i, name in enumerate(node.input) if name]
    return [i for i in rule.activations if i < len(node.input) and node.input[i]]


def weight_axis(node: onnx.NodeProto, rule: OpRule, weight_rank: int) -> int | None:
    """Per-channel axis of a node's weight: Conv out-channels (0), ConvTranspose (1),
    MatMul's last axis, Gemm's N axis (0 with transB=1, else 1)."""
    if rule.channel_axis is None:
        return None
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    axis = rule.channel_axis
    return axis % weight_rank if weight_rank else None


def block_axis(node: onnx.NodeProto, weight_rank: int) -> int | None:
    """Axis of a weight along which per-block scales run: the reduction axis (MatMul's K, the
    second-to-last; Gemm's K, 1 with transB=1 else 0; Conv's input channels)."""
    if node.op_type == "MatMul" and weight_rank >= 2:
        return weight_rank - 2
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 1 if trans_b else 0
    if node.op_type in ("Conv", "ConvTranspose") and weight_rank >= 2:
        return 1 if node.op_type == "Conv" else 0
    return None
