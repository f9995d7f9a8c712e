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
FEATURES = ("call", "mac", "moved", "weights", "fused", "rows", "streamed")  # what a profile's terms are per unit of
# where a class a profile lacks is priced (a measured profile has them all; a rules one may not)
FALLBACK = {"dwconv.f32": "conv.f32", "dwconv.i8": "conv.i8", "nconv.f32": "conv.f32", "nconv.i8": "conv.i8",
            "conv.i8": "conv.f32", "matmul.i8": "matmul.f32",
            "nbits.i4": "matmul.f32", "rnn.i8": "rnn.f32", "rnn.f32": "matmul.f32", "qdq": "memory",
            "qmemory": "memory", "control": "memory"}
CLASSES = ("conv.f32", "conv.i8", "dwconv.f32", "dwconv.i8", "nconv.f32", "nconv.i8", "matmul.f32", "matmul.i8",
           "nbits.i4", "rnn.f32", "rnn.i8", "qdq", "memory", "qmemory", "control")
# the classes only a quantized graph runs: a profile calibrated on a model (qcli.target.calibrated)
# scales these by its `int8` factor and every other class by its `float` one
INTEGER = ("conv.i8", "dwconv.i8", "nconv.i8", "matmul.i8", "nbits.i4", "rnn.i8", "qdq", "qmemory")

# a matrix product of at most this many rows reads each weight byte once or a few times: its
# cost is the weights' stream from memory (a decode step's MatMulNBits, a classifier's last
# Gemm at batch 1), which a micro-model timed on the same small weight, in cache, does not show
STREAM_ROWS = 8
# a convolution with fewer output channels per group is `nconv`: onnxruntime's int8 kernels
# pad them to 16 and walk every tap per output position, at a third of the MAC rate or less
NARROW = 16
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
    last axis: a Softmax or LayerNormalization pays per row), and `streamed`: the constant bytes
    of a matrix product of at most STREAM_ROWS rows (read from memory, not cache). A compute
    kernel's `gemm` is the matrix product it runs, (M, K, N, taps, groups): a convolution's
    output positions, input and output channels per group, kernel taps and groups; a matrix
    product's rows, K, N."""

    node: str
    op: str
    cls: str
    work: float = 0
    moved: float = 0
    weights: float = 0
    fused: float = 0
    rows: float = 0
    gemm: tuple[int, int, int, int, int] | None = None
    streamed: float = 0

    def features(self, pack: tuple[int, int] | None = None) -> tuple[float, ...]:
        """The values of FEATURES; with `pack` (input, output channels), `mac` counts the
        products the target's kernel does with K and N padded to multiples of them (`packed`).

        >>> Kernel("c", "QLinearConv", "conv.i8", work=256, gemm=(1, 1, 1, 256, 1)).features((4, 16))[1]
        16384
        """
        work = self.work if pack is None or self.gemm is None else packed(self.gemm, pack)
        return (1.0, work, self.moved, self.weights, self.fused, self.rows, self.streamed)


def packed(gemm: tuple[int, int, int, int, int], pack: tuple[int, int]) -> int:
    """The MACs of a product (M, K, N, taps, groups) whose kernel packs the weights in blocks
    of `pack` = (input channels, output channels) per tap: onnxruntime's int8 convolution on
    AVX-512 VNNI pads each tap's input channels to 4 and the outputs to 16, so a 1-channel
    convolution costs as a 4-in, 16-out one.

    >>> packed((10, 1, 8, 9, 1), (4, 16)), packed((10, 8, 32, 1, 2), (4, 16))
    (5760, 5120)
    """
    m, k, n, taps, groups = gemm
    return m * groups * taps * -(-k // pack[0]) * pack[0] * -(-n // pack[1]) * pack[1]


def kernel(node: str, op: str, inputs: list[Operand], outputs: list[Operand], attrs: dict[str, int],
           activation: bool = False) -> Kernel:
    """The class and features of one executed node (`activation`: it applies a fused one).

    >>> x, w = Operand("float", (1, 8, 10, 10)), Operand("float", (16, 8, 3, 3), True)
    >>> kernel("c", "Conv", [x, w], [Operand("float", (1, 16, 10, 10))], {}, activation=True)  # doctest: +ELLIPSIS
    Kernel(node='c', op='Conv', cls='conv.f32', work=115200, moved=9600, ..., gemm=(100, 8, 16, 9, 1), streamed=0)
    >>> a, b = Operand("uint8", (1, 4, 32)), Operand("int8", (32, 64), True)
    >>> kernel("m", "MatMulInteger", [a, b], [Operand("int32", (1, 4, 64))], {}).work
    8192
    >>> kernel("r", "Relu", [Operand("float", (1, 100))], [Operand("float", (1, 100))], {})
    Kernel(node='r', op='Relu', cls='memory', work=0, moved=800, weights=0, fused=0, rows=1, gemm=None, streamed=0)
    >>> kernel("q", "MatMulNBits", [Operand("float", (1, 1, 64)), Operand("uint8", (32, 2, 16), True)],
    ...        [Operand("float", (1, 1, 32))], {"K": 64, "N": 32}).streamed
    1024
    """
    family, int8 = OPS.get(op, ("qmemory" if op.startswith("QLinear") else "memory", False))
    moved = sum(i.bytes for i in inputs if not i.constant) + sum(o.bytes for o in outputs)
    weights = sum(i.bytes for i in inputs if i.constant)
    if family in ("qdq", "memory", "qmemory", "control"):
        return Kernel(node, op, family, 0, moved, weights, rows=_rows(op, inputs, outputs, attrs))
    out = outputs[0].elements if outputs else 0
    weight = inputs[WEIGHT_INPUT.get(op, 1)].shape if len(inputs) > WEIGHT_INPUT.get(op, 1) else ()
    cls, work = _compute(family, int8, inputs, weight, out, attrs)
    positions = out // weight[0] if family == "conv" and weight and weight[0] else 0
    gemm = _gemm(family, out, positions, weight, attrs, work)
    if family == "rnn":  # a recurrence runs its steps one after another
        rows = inputs[0].shape[0] if inputs and inputs[0].shape else 0
    else:  # a convolution's output positions; a product's rows (each requantized or scaled)
        rows = positions or (gemm[0] if gemm is not None else 0)
    streamed = weights if family in ("matmul", "gemm", "nbits") and gemm is not None and gemm[0] <= STREAM_ROWS else 0
    return Kernel(node, op, cls, work, moved, weights, out if activation else 0, rows, gemm, streamed)


def _rows(op: str, inputs: list[Operand], outputs: list[Operand], attrs: dict[str, int]) -> int:
    """A memory op's rows: the runs it loops over. One input: elements over the last axis (a
    Softmax's, a LayerNormalization's rows). Several (an elementwise op): the output's
    elements over its innermost run of axes that every input either spans or broadcasts the
    same way, as onnxruntime's broadcasting loops: [1, 172, 309, 1] + [1] is 53148 runs of one
    element (the size-1 axis ends the run), [1, 28, 28, 64] + [1] one run. A Concat: the
    blocks it copies.

    >>> x, one = Operand("uint8", (1, 172, 309, 1)), Operand("uint8", (1,))
    >>> _rows("QLinearAdd", [x, Operand("float", ()), one], [x], {}), _rows("Add", [x, x], [x], {})
    (53148, 1)
    >>> y = Operand("uint8", (1, 28, 28, 64))
    >>> _rows("QLinearAdd", [y, one], [y], {}), _rows("Add", [y, Operand("float", (64,))], [y], {})
    (1, 784)
    >>> _rows("Concat", [x, x], [Operand("uint8", (1, 172, 309, 2))], {"axis": -1})
    106296
    """
    if not outputs:
        return 0
    out = outputs[0].shape
    tensors = [i.shape for i in inputs if i.shape]
    if op.endswith("Concat"):
        axis = attrs.get("axis", 0) % max(len(out), 1)
        return math.prod(out[:axis]) * sum(len(t) == len(out) for t in tensors)
    if len(tensors) < 2 or not out:
        return outputs[0].elements // (out[-1] if out and out[-1] else 1)
    aligned = [(1,) * (len(out) - len(t)) + tuple(t[-len(out):]) for t in tensors]
    pattern = [tuple(t[d] == 1 and out[d] != 1 for t in aligned) for d in range(len(out))]
    run = 1
    for d in reversed(range(len(out))):
        if pattern[d] != pattern[-1]:
            break
        run *= out[d]
    return outputs[0].elements // max(run, 1)


def _gemm(family: str, out: int, rows: int, weight: Shape, attrs: dict[str, int], work: int,
          ) -> tuple[int, int, int, int, int] | None:
    """A convolution's or matrix product's (M, K, N, taps, groups) (Kernel), if its weight's
    dims say it; for a product, K is its MACs over its outputs and N the weight's columns."""
    group = attrs.get("group", 1)
    if family == "conv" and len(weight) > 2 and weight[0] and group and weight[0] % group == 0:
        return rows, weight[1], weight[0] // group, math.prod(weight[2:]), group
    if family == "nbits" and attrs.get("N") and out % attrs["N"] == 0:
        return out // attrs["N"], attrs.get("K", 0), attrs["N"], 1, 1
    if family in ("matmul", "gemm") and out and weight:
        n = weight[0] if family == "gemm" and attrs.get("transB", 0) and len(weight) > 1 else weight[-1]
        if n and out % n == 0:
            return out // n, work // out, n, 1, 1
    return None


def _compute(family: str, int8: bool, inputs: list[Operand], weight: Shape, out: int, attrs: dict[str, int],
             ) -> tuple[str, int]:
    """A compute kernel's class and multiply-accumulates (`weight`: its weight's dims)."""
    dtype = ".i8" if int8 else ".f32"
    if family == "conv":
        group = attrs.get("group", 1)
        depthwise = group > 1 and len(weight) > 2 and weight[1] == 1
        narrow = not depthwise and bool(weight) and weight[0] // max(group, 1) < NARROW
        return ("dwconv" if depthwise else "nconv" if narrow else "conv") + dtype, out * math.prod(weight[1:])
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
