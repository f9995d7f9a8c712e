"""Rewrite what exporters write in odd but equivalent ways into the forms the quantizer (and
onnxruntime's int8 kernels) know, main graph only:

    Sum(a) -> a                          (as an Identity, then removed as below)
    Sum(a, b) -> Add(a, b)
    Sum(a, b, c, ...) -> Add(...Add(Add(a, b), c)..., last)
    Dropout(x) -> x                      (mask output unused; training_mode absent or constant false)
    Identity(x) -> x
    Mul(P(...), c) -> P'(...)            c per-channel: [C,1,1], [1,C,1,1], [C], scalar...
    Add(P(...), c) -> P'(...)              P = Conv, ConvTranspose, Gemm or BatchNormalization
    Conv(Mul(x, c)), Conv(Div(x, c)), Conv(Add(x, c)) -> Conv'(x)   forward (qcli/prepare/forward.py)
    ReduceMean(x, axes=[2..r-1]) -> GlobalAveragePool(x)   (keepdims=0: then Squeeze)
    Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) -> Mul(x, HardSigmoid(x))   a decomposed HardSwish

The affine fold rewrites the producer's weight and bias (`batchnorm.scale_and_shift`):
`Conv(X, W, b) * c -> Conv(X, W * c, b * c)`, `Conv(X, W, b) + c -> Conv(X, W, b + c)`,
`BatchNormalization(X, g, b, m, v) * c + d -> BatchNormalization(X, g * c, b * c + d, m, v)`.
Old caffe2 exports (densenet121, inception_v2) write the second half of every BatchNorm that
way; folded, the BatchNormalization itself then folds into its Conv. Mul/Add order does not
matter (`Mul(c, P(...))` too), and chains fold one after the other.

Why: onnxruntime has an int8 Add but no int8 Sum, so residual Sums stayed float and split
the int8 graph; Dropout/Identity between two ops hide patterns (Conv -> BatchNormalization,
Conv -> Relu) and cost a Q/DQ pair each; a per-channel Mul/Add after a Conv is two extra
int8 ops (or float ops between Q/DQ pairs) where the Conv's own weights can absorb it; a
ReduceMean over all spatial axes of an NC... tensor is a global average pool as exporters
(torch.export, Keras) spell it, and onnxruntime has an int8 kernel for GlobalAveragePool but
none for ReduceMean (which qcli keeps float, for the variance chains of normalizations); a
HardSwish written out (PaddleOCR's exports) quantizes to an integer Add (the Clip folded) and
Mul but leaves its `/ 6` a float Div between Q/DQ pairs, where a HardSigmoid between Q/DQ pairs
becomes an integer Add (qcli/gates.py).

Names: a rewritten node keeps its node name and output names (a Sum's last Add writes the
Sum's output under the Sum's node name; the Adds before it are `<node>/add_1`, `<node>/add_2`
... writing `<output>/add_1`...). A removed Dropout/Identity's readers read its input instead;
when its output is a graph output, the node producing its input writes the graph output name
instead (so graph output names never change). It stays when its input is a graph input, an
initializer or another graph output (a graph output name cannot be given to two tensors). A
folded Mul/Add's producer writes the Mul/Add's output name, as BatchNormalization folding does.

Not done (and said in a note): Dropout whose mask is used or that may run in training mode;
an affine fold whose producer's output also feeds other nodes. Mul/Add with a constant that
is not per-channel (it would change the output's shape or mix channels) are left alone
silently, as are Sub and Div. The pass expects opset >= 7 (`prepare` upgrades to 13 first)
and does nothing below it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from qcli.graph import iter_graphs
from qcli.lazy import tensor_array
from qcli.prepare._graph import (
    DEFAULT_DOMAINS,
    NameAllocator,
    Options,
    PassResult,
    is_default_domain,
    label,
    light_copy,
    node_names,
    plural,
    prune_value_info,
    remove_nodes,
    remove_unused_initializers,
    tensor_names,
    use_counts,
)
from qcli.prepare.batchnorm import output_channels, per_channel, scale_and_shift
from qcli.prepare.forward import fold_forward

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
AFFINE_PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "BatchNormalization")


def canonicalize(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0)
    if opset < 7:
        return PassResult(model, False, [])
    graph = model.graph
    notes: list[str] = []
    rewritten, single_sums = _rewrite_sums(graph, notes)
    removed, gone = _remove_noops(graph, notes)
    # Sums of one input became Identity nodes: count them with the Sums, not the Identities
    from_sums = len(single_sums & gone)
    if from_sums:
        notes.append(f"removed {plural(from_sums, 'Sum node')} of a single input")
    if removed["Dropout"]:
        notes.append(f"removed {plural(removed['Dropout'], 'Dropout node')} (no-ops at inference)")
    if removed["Identity"] - from_sums:
        notes.append(f"removed {plural(removed['Identity'] - from_sums, 'Identity node')}")
    folded = _fold_affine(model, notes)
    forward = fold_forward(graph, notes)
    pools = _pool_means(model, notes)
    gates = _hard_sigmoids(graph, notes)  # last: a `/ 6` the next Conv absorbs is folded already
    modified = bool(rewritten or removed or folded or forward or pools or gates)
    if modified:
        remove_unused_initializers(graph)
        prune_value_info(graph)
    return PassResult(model, modified, notes)


# ---------------------------------------------------------------- decomposed HardSwish

def _hard_sigmoids(graph: onnx.GraphProto, notes: list[str]) -> int:
    """Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) (or the Mul by 1/6) -> Mul(x, HardSigmoid(x))
    with alpha 1/6 and beta 1/2, the final Mul under the Div's node and output names, the
    HardSigmoid writing `<output>/hard_sigmoid`; only when the Add, Clip and Mul outputs feed
    nothing else. Either operand order of the Add and Mul."""
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: node for node in graph.node for o in node.output if o}
    uses = use_counts(graph)
    tensors = NameAllocator(tensor_names(graph))
    replaced: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    position = {id(node): i for i, node in enumerate(graph.node)}
    for node in graph.node:
        found = _decomposed_hard_swish(node, producers, initializers, uses)
        if found is None:
            continue
        x, parts = found
        gate = tensors.fresh(f"{node.output[0]}/hard_sigmoid")
        replaced[position[id(parts[0])]] = onnx.helper.make_node(
            "HardSigmoid", [x], [gate], name=f"{node.name or node.output[0]}/hard_sigmoid", alpha=1 / 6, beta=0.5)
        replaced[position[id(node)]] = onnx.helper.make_node("Mul", [x, gate], [node.output[0]], name=node.name)
        dropped.update(position[id(p)] for p in parts[1:])
    count = len(replaced) // 2  # two nodes for each
    if count:
        out = [replaced.get(i, n) for i, n in enumerate(graph.node) if i not in dropped]
        del graph.node[:]
        graph.node.extend(out)
        notes.append(f"rewrote {count} HardSwish written out as x * Clip(x + 3, 0, 6) / 6 to x * HardSigmoid(x) "
                     "(an integer Add and Mul once quantized)")
    return count


def _decomposed_hard_swish(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto],
                           initializers: dict[str, onnx.TensorProto], uses: Counter[str]
                           ) -> tuple[str, list[onnx.NodeProto]] | None:
    """(x, [the Add, Clip, Mul]) when `node` ends a decomposed HardSwish of x, else None."""
    if not is_default_domain(node) or len(node.input) != 2:
        return None
    if not ((node.op_type == "Div" and _scalar(node.input[1], initializers) == 6.0)
            or (node.op_type == "Mul" and _close(_scalar(node.input[1], initializers), 1 / 6))):
        return None
    mul = producers.get(node.input[0])
    if mul is None or mul.op_type != "Mul" or not is_default_domain(mul) or uses[mul.output[0]] != 1:
        return None
    for x, gated in (mul.input, mul.input[::-1]):
        clip = producers.get(gated)
        if clip is None or clip.op_type != "Clip" or uses[clip.output[0]] != 1 or len(clip.input) != 3:
            continue
        if _scalar(clip.input[1], initializers) != 0.0 or _scalar(clip.input[2], initializers) != 6.0:
            continue
        add = producers.get(clip.input[0])
        if add is None or add.op_type != "Add" or uses[add.output[0]] != 1 or x not in add.input:
            continue
        other = add.input[1] if add.input[0] == x else add.input[0]
        if _scalar(other, initializers) == 3.0:
            return x, [add, clip, mul]
    return None


def _scalar(name: str, initializers: dict[str, onnx.TensorProto]) -> float | None:
    """The value of a one-element float constant, else None."""
    tensor = initializers.get(name)
    if tensor is None or tensor.data_type not in FLOAT_TYPES:
        return None
    array = tensor_array(tensor)
    return float(array.reshape(-1)[0]) if array.size == 1 else None


def _close(value: float | None, target: float) -> bool:
    return value is not None and abs(value - target) <= 1e-6 * target


# ---------------------------------------------------------------- Sum


def _rewrite_sums(graph: onnx.GraphProto, notes: list[str]) -> tuple[int, set[str]]:
    """Sum -> Add (2 inputs), a chain of Adds (more), Identity (1; removed later). Returns how
    many Sums were rewritten and the outputs of those that became Identity nodes."""
    tensors = NameAllocator(tensor_names(graph))
    nodes = NameAllocator(node_names(graph))
    single: set[str] = set()
    pairs = 0
    chains: list[tuple[int, list[onnx.NodeProto]]] = []
    for index, node in enumerate(graph.node):
        if node.op_type != "Sum" or not is_default_domain(node) or not node.input or not all(node.input):
            continue
        if len(node.input) == 1:
            node.op_type = "Identity"
            single.add(node.output[0])
        elif len(node.input) == 2:
            node.op_type = "Add"
            pairs += 1
        else:
            chains.append((index, _add_chain(node, tensors, nodes)))
    for index, before in reversed(chains):  # last first: earlier indices stay valid
        for offset, new in enumerate(before):
            graph.node.insert(index + offset, new)
    if pairs:
        notes.append(f"replaced {plural(pairs, 'Sum node')} of 2 inputs with Add")
    if chains:
        adds = sum(len(before) + 1 for _, before in chains)
        notes.append(
            f"replaced {plural(len(chains), 'Sum node')} of more than 2 inputs with chains of Add ({adds} Add nodes)"
        )
    return len(single) + pairs + len(chains), single


def _add_chain(node: onnx.NodeProto, tensors: NameAllocator, nodes: NameAllocator) -> list[onnx.NodeProto]:
    """Turn `node` (a Sum of n > 2 inputs) into the last Add of a left-to-right chain; return
    the n - 2 Adds to insert before it."""
    inputs, output = list(node.input), node.output[0]
    base = node.name or output
    before = []
    partial = inputs[0]
    for step, name in enumerate(inputs[1:-1], start=1):
        out = tensors.fresh(f"{output}/add_{step}")
        before.append(onnx.helper.make_node("Add", [partial, name], [out], name=nodes.fresh(f"{base}/add_{step}")))
        partial = out
    node.op_type = "Add"
    del node.input[:]
    node.input.extend([partial, inputs[-1]])
    return before


# ---------------------------------------------------------------- Dropout, Identity


def _remove_noops(graph: onnx.GraphProto, notes: list[str]) -> tuple[Counter[str], set[str]]:
    """Remove Identity and inference-mode Dropout nodes; returns how many of each, and the
    (first) outputs of the removed nodes."""
    uses = use_counts(graph)
    outputs = {o.name for o in graph.output}
    inputs = {v.name for v in graph.input}
    constants = {t.name: t for t in graph.initializer}
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    alias: dict[str, str] = {}  # a removed tensor name -> the name that now carries its value

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    removed: Counter = Counter()
    gone: set[str] = set()
    doomed: list[int] = []
    for index, node in enumerate(graph.node):
        if node.op_type not in ("Identity", "Dropout") or not is_default_domain(node):
            continue
        if not node.input or not node.input[0] or not node.output or not node.output[0]:
            continue
        if node.op_type == "Dropout":
            reason = _dropout_kept(node, uses, constants)
            if reason is not None:
                notes.append(f"{label(node)} kept: {reason}")
                continue
        source, target = resolve(node.input[0]), node.output[0]
        if target not in outputs:
            alias[target] = source
        elif source in outputs or source in inputs or source in constants or source not in producer:
            continue  # the graph output needs its own tensor: keep this node
        else:  # the producer writes the graph output's name itself
            writer = graph.node[producer[source]]
            for position, name in enumerate(writer.output):
                if name == source:
                    writer.output[position] = target
            producer[target] = producer.pop(source)
            alias[source] = target
        doomed.append(index)
        removed[node.op_type] += 1
        gone.add(target)
    if doomed:
        for _, sub in iter_graphs(graph):  # readers at any depth (outer-scope references)
            for node in sub.node:
                for position, name in enumerate(node.input):
                    if name in alias:
                        node.input[position] = resolve(name)
        remove_nodes(graph, doomed)
    return removed, gone


def _dropout_kept(node: onnx.NodeProto, uses: Counter[str], constants: dict[str, onnx.TensorProto]) -> str | None:
    """Why this Dropout must stay (None: it is a no-op at inference)."""
    if len(node.output) > 1 and node.output[1] and uses[node.output[1]]:
        return "its mask output is used"
    if len(node.input) > 2 and node.input[2]:
        flag = constants.get(node.input[2])
        if flag is None or np.any(tensor_array(flag)):
            return "its training_mode input is not a constant false"
    return None


# ---------------------------------------------------------------- per-channel Mul/Add


def _fold_affine(model: onnx.ModelProto, notes: list[str]) -> int:
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: node for node in graph.node for o in node.output if o}
    uses = use_counts(graph)
    names = NameAllocator(tensor_names(graph))
    # ranks of BatchNormalization inputs (its parameters do not tell), inferred before editing
    has_bn = any(n.op_type == "BatchNormalization" for n in graph.node)
    ranks = _ranks(model) if has_bn else {}
    kept: list[str] = []
    into: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    doomed: list[int] = []
    for index, node in enumerate(graph.node):
        if node.op_type not in ("Mul", "Add") or not is_default_domain(node) or len(node.input) != 2:
            continue
        a, b = node.input
        if b in initializers and a not in initializers:
            source, constant = a, initializers[b]
        elif a in initializers and b not in initializers:
            source, constant = b, initializers[a]
        else:
            continue
        producer = producers.get(source)
        if producer is None or producer.op_type not in AFFINE_PRODUCERS or not is_default_domain(producer):
            continue
        if _producer_blocker(producer, initializers) or constant.data_type not in FLOAT_TYPES:
            continue
        channels = output_channels(producer, initializers)
        if channels is None:
            continue
        if producer.op_type == "BatchNormalization":
            rank = ranks.get(producer.input[0])
        elif producer.op_type == "Gemm":
            rank = 2
        else:
            rank = len(initializers[producer.input[1]].dims)
        values = per_channel(constant, channels, rank)
        if values is None:
            continue
        if uses[source] > 1:
            kept.append(f"{label(node)} not folded into {label(producer)}: "
                        "its input also feeds other nodes or is a graph output")
            continue
        if node.op_type == "Mul":
            scale, shift = values, np.zeros(channels)
        else:
            scale, shift = np.ones(channels), values
        reason = scale_and_shift(producer, scale, shift, initializers, uses, names, graph)
        if reason is not None:
            kept.append(f"{label(node)} not folded into {label(producer)}: {reason}")
            continue
        producer.output[0] = node.output[0]
        producers[node.output[0]] = producer
        uses[constant.name] -= 1
        into[producer.op_type] += 1
        kinds[node.op_type] += 1
        doomed.append(index)
    remove_nodes(graph, doomed)
    if doomed:
        what = " and ".join(plural(kinds[op], f"{op} node") for op in ("Mul", "Add") if kinds[op])
        where = ", ".join(f"{op} ({n})" for op, n in sorted(into.items())) if len(into) > 1 else next(iter(into))
        notes.append(f"folded {what} with per-channel constants into {where}")
    notes.extend(kept)
    return len(doomed)


def _producer_blocker(producer: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """True when the producer's constants cannot be rewritten (not initializers, not float,
    or a BatchNormalization in training mode)."""
    if producer.op_type == "BatchNormalization":
        if len([o for o in producer.output if o]) != 1:
            return True  # training outputs (running mean/var)
        if any(a.name == "training_mode" and a.i for a in producer.attribute):
            return True
        params = producer.input[1:5]
        return len(params) < 4 or any(not _float_constant(n, initializers) for n in params)
    if len(producer.input) < 2:
        return True
    weight_and_bias = [name for name in producer.input[1:3] if name]
    return not all(_float_constant(name, initializers) for name in weight_and_bias)


def _float_constant(name: str, initializers: dict[str, onnx.TensorProto]) -> bool:
    return name in initializers and initializers[name].data_type in FLOAT_TYPES


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of every tensor shape inference can tell (on a light copy: no weights)."""
    light = light_copy(model).model
    try:
        light = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
    except Exception:  # unknown ranks: the BatchNormalization folds are skipped
        pass
    graph = light.graph
    ranks = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            ranks[value.name] = len(tensor.shape.dim)
    return ranks


# ---------------------------------------------------------------- ReduceMean as a global pool


NORMALIZING = {"Sub", "Div", "Pow", "Sqrt"}  # readers that make a mean a normalization's statistic


def _pool_means(model: onnx.ModelProto, notes: list[str]) -> int:
    """ReduceMean over exactly the spatial axes (2..r-1 of a rank >= 4 tensor: rank 3 is as often
    [N, T, C] features as [N, C, L]) -> GlobalAveragePool under the ReduceMean's node and output
    names; keepdims=0 adds a Squeeze of those axes. Not when its input or output is read by a
    Sub/Div/Pow/Sqrt: a decomposed instance norm's mean, which stays a float ReduceMean."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    ranks: dict[str, int] | None = None
    tensors, nodes = NameAllocator(tensor_names(graph)), NameAllocator(node_names(graph))
    out: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        if node.op_type != "ReduceMean" or not is_default_domain(node):
            out.append(node)
            continue
        ranks = _ranks(model) if ranks is None else ranks
        rank = ranks.get(node.input[0], 0)
        axes = _reduce_axes(node, initializers)
        normalizing = {r.op_type for r in graph.node if node.input[0] in r.input or node.output[0] in r.input}
        if (rank < 4 or axes is None or sorted(a % rank for a in axes) != list(range(2, rank))
                or normalizing & NORMALIZING):
            out.append(node)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        name, result = node.name or nodes.fresh("ReduceMean"), node.output[0]
        if attrs.get("keepdims", 1):
            out.append(onnx.helper.make_node("GlobalAveragePool", [node.input[0]], [result], name=name))
        else:
            pooled, spatial = tensors.fresh(f"{result}/pool"), tensors.fresh(f"{result}/spatial_axes")
            graph.initializer.append(numpy_helper.from_array(np.arange(2, rank, dtype=np.int64), spatial))
            out += [onnx.helper.make_node("GlobalAveragePool", [node.input[0]], [pooled], name=name),
                    onnx.helper.make_node("Squeeze", [pooled, spatial], [result], name=nodes.fresh(f"{name}/squeeze"))]
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(out)
        notes.append(f"rewrote {plural(count, 'ReduceMean node')} over the spatial axes as GlobalAveragePool "
                     "(onnxruntime's int8 kernel)")
    return count


def _reduce_axes(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> list[int] | None:
    """A ReduceMean's axes when constant (the attribute below opset 18, a constant input from
    18); None when not known or empty (all axes, or none with noop_with_empty_axes)."""
    if len(node.input) > 1 and node.input[1]:
        constant = initializers.get(node.input[1])
        axes = tensor_array(constant).astype(int).tolist() if constant is not None else None
    else:
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    return axes or None
