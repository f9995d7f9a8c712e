"""Refuse a model that is already quantized: Q/DQ pairs, QLinear*/integer kernels, or
onnxruntime's com.microsoft quantized ops, anywhere (subgraphs and functions included).

Quantizing such a model again stacks a second set of Q/DQ nodes on the first, or leaves
integer kernels the plan knows nothing about; `force` goes on anyway (with a note).
"""

from __future__ import annotations

from collections import Counter

import onnx

from qcli.errors import ModelError
from qcli.graph import iter_graphs
from qcli.prepare._graph import Options, PassResult

QUANTIZED_OPS = frozenset({
    # ai.onnx
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul",
    # com.microsoft (onnxruntime contrib ops)
    "QGemm", "QAttention", "QEmbedLayerNormalization", "QMoE",
    "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulIntegerToFloat", "MatMulInteger16",
    "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized", "MulInteger", "ReduceSumInteger",
    "QuantizeWithOrder", "DequantizeWithOrder", "QuantizeBFP", "DequantizeBFP",
})
QUANTIZED_PREFIXES = ("QLinear", "QOrdered")  # QLinearAdd, QLinearSigmoid, QOrderedMatMul, ...
DOMAINS = ("", "ai.onnx", "com.microsoft")


def is_quantized_op(node: onnx.NodeProto) -> bool:
    return node.domain in DOMAINS and (
        node.op_type in QUANTIZED_OPS or node.op_type.startswith(QUANTIZED_PREFIXES)
    )


def refuse_quantized(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    """Raise ModelError if the model holds quantized ops, unless `options.force`."""
    graphs = [g for _, g in iter_graphs(model.graph)]
    nodes = [n for g in graphs for n in g.node] + [n for f in model.functions for n in f.node]
    quantized = [node for node in nodes if is_quantized_op(node)]
    if not quantized:
        return PassResult(model)
    counts = Counter(node.op_type for node in quantized)
    first = quantized[0]
    total = sum(counts.values())
    parts = [f"{n} {op}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    what = f"{listed} {'node' if total == 1 else 'nodes'}"
    first_name = first.name or (first.output[0] if first.output else first.op_type)
    if not options.force:
        raise ModelError(
            f"the model is already quantized: it contains {what} (first: '{first_name}')",
            hint="pass the float model; --force quantizes it anyway",
        )
    return PassResult(model, False, [f"the model is already quantized ({what}); going on because of --force"])
