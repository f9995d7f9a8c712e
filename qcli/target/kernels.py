"""Which kernel class an executed node is, and how much work it does: the one table of them.

A target profile prices kernels by class (`conv.i8`, `matmul.f32`, `memory`, ...) and op, from
the call's features (`FEATURES`): multiply-accumulates, activation bytes read and written,
constant bytes (weights), the elements of a fused activation (NCHWc and FusedConv apply
HardSwish, Relu, ... to their output), and rows: a convolution's output positions (its
per-pixel cost dominates when channels are few: 8-channel int8 convolutions run at a tenth of
the MAC rate of 64-channel ones), a row-wise op's rows. The node is the
one onnxruntime runs after its fusions (QLinearConv, QGemm, FusedConv, NchwcConv, ...), as
qcli.target.executed reads it, with its input and output shapes and the dims of its weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# op -> (family, int8?): the family says how the work is counted (`work`)
OPS: dict[str, tuple[str, bool]] = {
    "Conv": ("conv", False), "FusedConv": ("conv", False), "NchwcConv": ("conv", False),
    "ConvTranspose": ("convtranspose", False),
    "QLinearConv": ("conv", True), "ConvInteger": ("conv", True),
    "MatMul": ("matmul", False), "FusedMatMul": ("matmul", False),
    "Gemm": ("gemm", False), "FusedGemm": ("gemm", False),
    "QLinearMatMul": ("matmul", True), "MatMulInteger": ("matmul", True),
    "MatMulIntegerToFloat": ("matmul", True), "DynamicQuantizeMatMul": ("matmul", True), "QGemm": ("gemm", True),
    "MatMulNBits": ("nbits", True),
    "LSTM": ("rnn", False), "GRU": ("rnn", False), "RNN": ("rnn", False), "DynamicQuantizeLSTM": ("rnn", True),
    "QuantizeLinear": ("qdq", True), "DequantizeLinear": ("qdq", True), "DynamicQuantizeLinear": ("qdq", True),
    "If": ("control", False), "Loop": ("control", False), "Scan": ("control", False),
}
# the weight inputs of a compute family's ops, by op (default: input 1)
WEIGHT_INPUT = {"QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3}
FEATURES = ("call", "mac", "moved", "weights", "fused", "rows")  # what a profile's terms are per unit of
# where a class a profile lacks is priced (a measured profile has them all; a rules one may not)
FALLBACK = {"dwconv.f32": "conv.f32", "dwconv.i8": "conv.i8", "conv.i8": "conv.f32", "matmul.i8": "matmul.f32",
            "nbits.i4": "matmul.f32", "rnn.i8": "rnn.f32", "rnn.f32": "matmul.f32", "qdq": "memory",
            "qmemory": "memory", "control": "memory"}
CLASSES = ("conv.f32", "conv.i8", "dwconv.f32", "dwconv.i8", "matmul.f32", "matmul.i8", "nbits.i4",
           "rnn.f32", "rnn.i8", "qdq", "memory", "qmemory", "control")

Shape = tuple[int, ...]
DTYPE_BYTES = {"float": 4, "double": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
               "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1}


@dataclass(frozen=True)
class Operand:
    """An input or output of an executed node: its element type, shape, and whether it is a
    constant (an initializer: a weight, a scale)."""

    dtype: str
    shape: Shape
    constant: bool = False

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.elements * DTYPE_BYTES.get(self.dtype, 1)


@dataclass(frozen=True)
class Kernel:
    """One kernel call onnxruntime makes: the node's name, op, class and features: `work`
    (multiply-accumulates; 0 for a memory-bound op), activation bytes `moved` (read and
    written), constant bytes `weights`, `fused` activation elements, and `rows`: a
    convolution's output positions, a recurrence's steps, a memory op's rows (elements / the
    last axis: a Softmax or LayerNormalization pays per row)."""

    node: str
    op: str
    cls: str
    work: float = 0
    moved: float = 0
    weights: float = 0
    fused: float = 0
    rows: float = 0

    def features(self) -> tuple[float, ...]:
        """The values of FEATURES."""
        return (1.0, self.work, self.moved, self.weights, self.fused, self.rows)


def kernel(node: str, op: str, inputs: list[Operand], outputs: list[Operand], attrs: dict[str, int],
           activation: bool = False) -> Kernel:
    """The class and features of one executed node (`activation`: it applies a fused one).

    >>> x, w = Operand("float", (1, 8, 10, 10)), Operand("float", (16, 8, 3, 3), True)
    >>> kernel("c", "Conv", [x, w], [Operand("float", (1, 16, 10, 10))], {}, activation=True)
    Kernel(node='c', op='Conv', cls='conv.f32', work=115200, moved=9600, weights=4608, fused=1600, rows=100)
    >>> a, b = Operand("uint8", (1, 4, 32)), Operand("int8", (32, 64), True)
    >>> kernel("m", "MatMulInteger", [a, b], [Operand("int32", (1, 4, 64))], {}).work
    8192
    >>> kernel("r", "Relu", [Operand("float", (1, 100))], [Operand("float", (1, 100))], {})
    Kernel(node='r', op='Relu', cls='memory', work=0, moved=800, weights=0, fused=0, rows=1)
    """
    family, int8 = OPS.get(op, ("qmemory" if op.startswith("QLinear") else "memory", False))
    moved = sum(i.bytes for i in inputs if not i.constant) + sum(o.bytes for o in outputs)
    weights = sum(i.bytes for i in inputs if i.constant)
    if family in ("qdq", "memory", "qmemory", "control"):
        last = outputs[0].shape[-1] if outputs and outputs[0].shape and outputs[0].shape[-1] else 1
        return Kernel(node, op, family, 0, moved, weights, rows=outputs[0].elements // last if outputs else 0)
    out = outputs[0].elements if outputs else 0
    weight = inputs[WEIGHT_INPUT.get(op, 1)].shape if len(inputs) > WEIGHT_INPUT.get(op, 1) else ()
    cls, work = _compute(family, int8, inputs, weight, out, attrs)
    if family == "rnn":  # a recurrence runs its steps one after another
        rows = inputs[0].shape[0] if inputs and inputs[0].shape else 0
    else:
        rows = out // weight[0] if family == "conv" and weight and weight[0] else 0
    return Kernel(node, op, cls, work, moved, weights, out if activation else 0, rows)


def _compute(family: str, int8: bool, inputs: list[Operand], weight: Shape, out: int, attrs: dict[str, int],
             ) -> tuple[str, int]:
    """A compute kernel's class and multiply-accumulates (`weight`: its weight's dims)."""
    dtype = ".i8" if int8 else ".f32"
    if family == "conv":
        depthwise = attrs.get("group", 1) > 1 and len(weight) > 2 and weight[1] == 1
        return ("dwconv" if depthwise else "conv") + dtype, out * math.prod(weight[1:])
    if family == "convtranspose":
        return "conv" + dtype, inputs[0].elements * math.prod(weight[1:])
    if family == "nbits":
        return "nbits.i4", out * attrs.get("K", 0)
    if family == "rnn":
        steps = math.prod(inputs[0].shape[:2])
        recurrent = inputs[2].shape if len(inputs) > 2 else ()
        return "rnn" + dtype, steps * (math.prod(weight) + math.prod(recurrent))
    return "matmul" + dtype, out * _inner(family, inputs[0].shape, attrs)


def _inner(family: str, a: Shape, attrs: dict[str, int]) -> int:
    """The reduced dimension K of a matrix product whose first operand has shape `a`."""
    if not a:
        return 1
    transposed = attrs.get("transA", 0) if family == "gemm" else 0
    return a[-2] if transposed and len(a) > 1 else a[-1]
