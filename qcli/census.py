"""What a quantized model runs in, counted for the summary of `qcli quantize` (and `--json`):
quantized and float nodes by op type with the reasons, the precision each quantized node runs
in as read from the model written (its DequantizeLinear inputs), and the plan's activation and
weight schemes.
"""

from __future__ import annotations

from collections import Counter

import onnx

from qcli.graph import iter_graphs, node_names
from qcli.half import HalfResult
from qcli.info import element_count, tensor_bytes
from qcli.plan import DynamicNode, Plan
from qcli.prepare.hoist import HOIST_MIN  # elements from which a float constant is a weight (not a bias or a shape)
from qcli.quantize import QuantizeResult
from qcli.scheme import PerBlock, PerChannel, QuantScheme
from qcli.weightonly import folded_integers


def summary(result: QuantizeResult) -> dict:
    """Counts by op type of quantized and float nodes, with the reasons nodes stayed float, the
    precisions the quantized nodes run in (from the model written), and the activation dtypes
    and weight schemes the plan chose (overrides and fallbacks included, not the config's)."""
    plan = result.plan
    labels = precision_labels(result)
    bare = _without_integers(result, labels)
    quantized = Counter(d.op_type for d in plan.nodes if d.quantized and not d.reason and d.name not in bare)
    folded = Counter(d.op_type for d in plan.nodes if d.quantized and d.reason)
    half = result.half
    converted = set(half.converted) if half else set()
    kept_float = _float_nodes(result, bare, half, converted)
    floats: Counter[tuple[str, str]] = Counter((d.op_type, why) for d, why in kept_float)
    precisions: dict[str, Counter[str]] = {}
    for d in plan.nodes:
        if d.quantized and not d.reason and d.name not in bare:
            precisions.setdefault(d.op_type, Counter())[labels.get(d.name, "int8")] += 1
    by_group = {t: g.scheme.dtype.name for g in plan.groups for t in g.tensors if t != g.constant}
    activations = Counter(by_group.values())
    if plan.at_run_time:
        activations["uint8 dynamic"] = len(dynamic_activations(result.model))
    weights = [*plan.weights.values(), *{w.name: w for d in plan.dynamic.values() for w in d.weights}.values()]
    return {
        "quantized": dict(sorted(quantized.items(), key=lambda kv: (-kv[1], kv[0]))),
        "precisions": {op: dict(sorted(c.items())) for op, c in sorted(precisions.items())},
        "float": [
            {"op_type": op, "reason": reason, "count": n}
            for (op, reason), n in sorted(floats.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "folded": dict(sorted(folded.items())),
        **({"half": {"nodes": dict(sorted(Counter(
            d.op_type for d in plan.nodes if d.name in converted).items())), **half.to_dict()}} if half else {}),
        "quantized_tensors": len(plan.activations),
        "activations": dict(sorted(activations.items())),
        "groups": len(plan.groups),
        "weight_tensors": len(weights),
        "weights": dict(sorted(Counter(_scheme_text(w.scheme) for w in weights).items())),
        "float_weights": float_weights(result.model, {d.name: f"{d.op_type}: {why}" for d, why in kept_float},
                                       result.planned or result.model),
        "notes": result.notes,
        **({"recovery": result.recovery} if result.recovery else {}),
    }


def _float_nodes(result: QuantizeResult, bare: dict[str, str], half: HalfResult | None,
                 converted: set[str]) -> list[tuple]:
    """The nodes that stay float (not those converted to float16/bfloat16), each with why."""
    return [(d, bare.get(d.name) or _float_reason(d.name, d.reason, half)) for d in result.plan.nodes
            if (not d.quantized or d.name in bare) and d.name not in converted]


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def float_weights(model: onnx.ModelProto, reasons: dict[str, str], planned: onnx.ModelProto) -> dict:
    """The float constants of `model` (initializers of every graph, and Constant nodes of the
    bodies) of HOIST_MIN elements or more: how many, their bytes and share of all the
    weights' bytes, and why, grouped: a reader's op type and reason for staying float (`reasons`,
    by node name in `planned`, the graph the plan names), or the body that holds it (qcli stores
    only the main graph's constants smaller)."""
    names = node_names(planned)
    readers: dict[str, list[str]] = {}
    for i, node in enumerate(planned.graph.node):
        for t in node.input:
            readers.setdefault(t, []).append(names[i])
    total, kept, why, count = 0, 0, Counter[str](), Counter[str]()
    for owner, graph in iter_graphs(model.graph):
        tensors = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant" and owner
                                         for a in n.attribute if a.name == "value")]
        for t in tensors:
            size = tensor_bytes(t.data_type, element_count(t.dims))
            total += size
            if t.data_type not in _FLOAT_TYPES or element_count(t.dims) < HOIST_MIN:
                continue
            kept += size
            read = [r for r in readers.get(t.name, []) if r in reasons] if not owner else []
            reason = (f"inside {owner.rsplit('.', 1)[0]}'s body" if owner else reasons[read[0]] if read
                      else "not read as a weight")
            why[reason] += size
            count[reason] += 1
    return {"bytes": kept, "share": round(kept / total, 4) if total else 0.0,
            "why": [{"reason": r, "tensors": count[r], "bytes": b}
                    for r, b in sorted(why.items(), key=lambda kv: (-kv[1], kv[0]))]}


def _float_reason(name: str, reason: str, half: HalfResult | None) -> str:
    """Why a node stays float: the plan's reason, or why a node asked to run in float16 stays float32."""
    if half is None or not reason.endswith(" asked for"):
        return reason
    return f"float32: {half.kept[name]}" if name in half.kept else f"no float values to run in {half.kind}"


def dynamic_precisions(plan: Plan) -> dict[str, str]:
    """Node name -> "dynamic uint8 act, int8 weights" for the plan's dynamic nodes ("int8 table"
    for a Gather's: its activation is not quantized)."""
    names = {d.index: d.name for d in plan.nodes}

    def label(d: DynamicNode) -> str:
        dtypes = "/".join(sorted({w.scheme.dtype.name for w in d.weights}))
        return f"{dtypes} table" if d.form == "gather" else f"dynamic uint8 act, {dtypes} weights"
    return {names[i]: label(d) for i, d in plan.dynamic.items()}


def dynamic_activations(model: onnx.ModelProto) -> list[str]:
    """The activations quantized at run time: the inputs of the model's DynamicQuantizeLinear
    nodes, and those DynamicQuantizeLSTM quantizes itself."""
    kernels = ("DynamicQuantizeLinear", "DynamicQuantizeLSTM")
    return sorted({n.input[0] for n in model.graph.node if n.op_type in kernels})


def _scheme_text(scheme: QuantScheme) -> str:
    g = scheme.granularity
    return scheme.dtype.name + (" per_block " + str(g.size) if isinstance(g, PerBlock) else
                                " per_channel" if isinstance(g, PerChannel) else " per_tensor")


def _without_integers(result: QuantizeResult, labels: dict[str, str]) -> dict[str, str]:
    """The plan's quantized nodes that read and write only float in the model written (under
    float activations, the nodes without a weight of their own), and why."""
    planned, plan = result.planned or result.model, result.plan
    grouped = {t for g in plan.groups for t in g.tensors}
    nodes = planned.graph.node
    return {d.name: "weight-only: no weight of its own" for d in plan.nodes
            if d.quantized and not d.reason and d.name not in labels and d.index < len(nodes)
            and not any(t in grouped for t in (*nodes[d.index].input, *nodes[d.index].output))}


def precision_labels(result: QuantizeResult) -> dict[str, str]:
    """Display name (the plan's) -> what the node runs in, for the nodes `node_precisions` and
    `dynamic_precisions` label; an unnamed node is found by its first output (or, when a
    Relu/Clip folded into it, by the output it took over)."""
    labels, plan = node_precisions(result.model), result.plan
    planned = result.planned or result.model
    nodes, names = planned.graph.node, node_names(planned)
    keys = {name: [n.name or n.output[0]] for name, n in zip(names, nodes, strict=True)}
    for d in plan.nodes:
        if d.folded_into in keys:
            keys[d.folded_into].append(nodes[d.index].output[0])
    found = {name: labels[k] for name, ks in keys.items() for k in ks[::-1] if k in labels}
    flows = {names[i]: f"float act, {'/'.join(sorted(dtypes))} weights" for i, ws in plan.control_flow.items()
             if (dtypes := {plan.weights[w].scheme.dtype.name for w in ws if w in plan.weights})}
    return {**found, **flows, **dynamic_precisions(plan)}


def _table_rows(dq: onnx.NodeProto, producers: dict[str, onnx.NodeProto], types: dict[str, int]) -> bool:
    """Whether `dq` dequantizes the rows a Gather read from an integer table (an embedding's
    `gather` form: float values for the readers, as a float table's rows would be)."""
    source = producers.get(dq.input[0])
    return source is not None and source.op_type == "Gather" and source.input[0] in types


def node_precisions(model: onnx.ModelProto) -> dict[str, str]:
    """Node name (an unnamed node's first output) -> the integer types it reads ("uint8 act,
    int8 weights"; "float act, int4 weights" for weight-only), from the DequantizeLinear nodes
    feeding it in the model written (and the Cast, Mul of a weight-only weight)."""
    graph = model.graph
    types = {t.name: t.data_type for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    out = {}
    for node in graph.node:
        acts: set[str] = set()
        weights: set[str] = set()
        for name in node.input:
            dq = producers.get(name)
            folded = folded_integers(dq, producers, types)
            if folded is not None:  # a weight-only weight (qcli/weightonly.py)
                weights.add(onnx.TensorProto.DataType.Name(types[folded]).lower())
                continue
            if dq is None or dq.op_type != "DequantizeLinear" or _table_rows(dq, producers, types):
                continue
            # the zero point's type, else (a per-block weight's left out) the integers'
            typed = dq.input[2] if len(dq.input) > 2 and dq.input[2] in types else dq.input[0]
            if typed not in types:
                continue
            dtype = onnx.TensorProto.DataType.Name(types[typed]).lower()
            if dtype != "int32":  # a bias: its type follows the others
                (weights if dq.input[0] in types else acts).add(dtype)
        if acts or weights:
            out[node.name or node.output[0]] = f"{'/'.join(sorted(acts)) or 'float'} act" + (
                f", {'/'.join(sorted(weights))} weights" if weights else "")
    return out
