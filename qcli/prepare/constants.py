"""Make every constant a plain initializer, so the quantizer sees weights as weights:

    Constant() -> initializer of the same name                  (every graph, all value_* forms)
    op(constant inputs...) -> initializers of its output names  (main graph, deterministic ops)

which turns `ConstantOfShape(shape)`, `Mul(Cast(int8 W), scale)`, `Transpose(W)`,
`Reshape(W, shape)`... into stored tensors. Folded values are computed by onnxruntime on a
tiny model of just the constant nodes (onnx's ReferenceEvaluator where onnxruntime cannot).

Not folded: random ops and Dropout, ops with subgraphs, ops outside the default domain,
sequence/optional producers, nodes writing a graph output, and anything reading a run-time
tensor (so `Shape(activation)` chains stay). Nodes inside subgraphs are not folded (only
their Constant nodes become that subgraph's initializers). Initializers nothing reads any
more are removed.

Initializers listed as graph inputs (IR < 4 required it; some exporters still do it) are
treated as constants and dropped from the inputs: the data loader never feeds them (see
`qcli.data`), and a quantized weight is baked into the model anyway.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.graph import iter_graphs, names_used_inside, node_subgraphs
from qcli.lazy import tensor_array
from qcli.model import tensor_from_attribute
from qcli.prepare._graph import (
    Options,
    PassResult,
    add_initializer,
    is_default_domain,
    label,
    plural,
    prune_value_info,
    remove_nodes,
    remove_unused_initializers,
)

NOT_FOLDED = frozenset({
    # random: a new value every run
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "Dropout",
    # outputs that cannot be initializers (sequences, optionals)
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceMap",
    "SplitToSequence", "Optional",
})


def fold_constants(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    """Constant nodes -> initializers, then constant folding of the main graph."""
    notes = []
    graph = model.graph
    count = constants_to_initializers(model)
    if count:
        into = "an initializer" if count == 1 else "initializers"
        notes.append(f"turned {plural(count, 'Constant node')} into {into}")
    dropped = _drop_initializer_inputs(model)
    if dropped == 1:
        notes.append("treated 1 initializer that was also a graph input as a constant (removed it from the inputs)")
    elif dropped:
        notes.append(
            f"treated {dropped} initializers that were also graph inputs as constants (removed them from the inputs)"
        )
    folded, failures = _fold(model)
    if folded:
        kinds = ", ".join(f"{op} {n}" for op, n in sorted(folded.items(), key=lambda kv: (-kv[1], kv[0])))
        notes.append(f"folded {plural(sum(folded.values()), 'constant node')} into initializers ({kinds})")
    notes.extend(failures)
    removed = remove_unused_initializers(graph)
    if removed:
        notes.append(f"removed {plural(len(removed), 'unused initializer')}")
    prune_value_info(graph)
    modified = bool(count or dropped or folded or removed)
    return PassResult(model, modified, notes)


def constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The dense tensor a Constant node holds, named after its output (None: unknown form)."""
    tensor = None
    for attr in node.attribute:
        if attr.name == "sparse_value":
            tensor = numpy_helper.from_array(_densify(attr.sparse_tensor))
        elif attr.name in ("value_string", "value_strings"):
            tensor = numpy_helper.from_array(np.array(helper.get_attribute_value(attr), dtype=object))
    if tensor is None:
        found = tensor_from_attribute(node)
        if found is None:
            return None
        tensor = onnx.TensorProto()
        tensor.CopyFrom(found)
    tensor.name = node.output[0]
    return tensor


def _densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = tensor_array(sparse.values)
    indices = tensor_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(int(np.prod(dims, dtype=np.int64)), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)
    dense[flat] = values
    return dense.reshape(dims)


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Replace the Constant nodes of every graph by initializers of that graph."""
    count = 0
    for graph in [g for _, g in iter_graphs(model.graph)]:
        doomed = []
        for index, node in enumerate(graph.node):
            if node.op_type != "Constant" or not is_default_domain(node) or not node.output:
                continue
            tensor = constant_tensor(node)
            if tensor is None:
                continue
            graph.initializer.append(tensor)
            doomed.append(index)
        remove_nodes(graph, doomed)
        count += len(doomed)
    return count


def _drop_initializer_inputs(model: onnx.ModelProto) -> int:
    if model.ir_version < 4:  # the spec wants them listed there; the opset pass raises the IR
        return 0
    graph = model.graph
    constant = {t.name for t in graph.initializer}
    doomed = [i for i, v in enumerate(graph.input) if v.name in constant]
    for index in reversed(doomed):
        del graph.input[index]
    return len(doomed)


def why_not_foldable(node: onnx.NodeProto) -> str | None:
    if not is_default_domain(node):
        return f"its op is in domain {node.domain}"
    if node.op_type in NOT_FOLDED:
        return f"{node.op_type} is not folded"
    if any(True for _ in node_subgraphs(node)):
        return "it has subgraphs"
    return None


def _plan(graph: onnx.GraphProto, failed: set[int]) -> tuple[list[int], list[str]]:
    """The main-graph nodes computable now (indices, topological) and which of their outputs
    the rest of the graph reads (they become initializers; the others just disappear)."""
    constant = {t.name for t in graph.initializer} | {""}
    outputs = {o.name for o in graph.output}
    foldable: list[int] = []
    for index, node in enumerate(graph.node):
        if (
            index in failed
            or why_not_foldable(node) is not None
            or not all(name in constant for name in node.input)
            or any(name in outputs for name in node.output)
        ):
            continue
        foldable.append(index)
        constant.update(node.output)
    chosen = set(foldable)
    read: dict[str, None] = {}
    for index, node in enumerate(graph.node):
        if index not in chosen:
            read.update(dict.fromkeys(node.input))
            read.update(dict.fromkeys(names_used_inside(node)))
    needed = [o for i in foldable for o in graph.node[i].output if o and o in read]
    return foldable, needed


def _fold(model: onnx.ModelProto) -> tuple[Counter[str], list[str]]:
    graph = model.graph
    failed: dict[int, str] = {}
    while True:
        foldable, needed = _plan(graph, set(failed))
        if not foldable:
            return Counter(), _failure_notes(graph, failed)
        if not needed:  # constant nodes nothing reads: just drop them
            values = {}
            break
        try:
            values = evaluate(model, [graph.node[i] for i in foldable], needed)
            break
        except Exception:  # find the nodes neither runtime can compute, then plan again
            failed.update(_find_failures(model, foldable))
    folded = Counter(graph.node[i].op_type for i in foldable)
    notes = _failure_notes(graph, failed)
    for name in needed:
        add_initializer(graph, values.pop(name), name)
    remove_nodes(graph, foldable)
    return folded, notes


def _failure_notes(graph: onnx.GraphProto, failed: dict[int, str]) -> list[str]:
    return [f"{label(graph.node[i])} not folded: {reason}" for i, reason in sorted(failed.items())]


def _find_failures(model: onnx.ModelProto, foldable: list[int]) -> dict[int, str]:
    """Evaluate the foldable nodes one by one; the ones that fail (and, through `_plan`, all
    they feed) stay in the graph."""
    graph = model.graph
    values: dict[str, np.ndarray] = {}
    failures: dict[int, str] = {}
    initializers = {t.name for t in graph.initializer}
    for index in foldable:
        node = graph.node[index]
        if not all(name in values or name in initializers or not name for name in node.input):
            continue  # fed by a failed node: not constant any more
        try:
            values.update(evaluate(model, [node], [o for o in node.output if o], values))
        except Exception as exc:  # both runtimes refused
            failures[index] = f"neither onnxruntime nor the ONNX reference evaluator computes it ({_first_line(exc)})"
    if not failures:  # the batch failed as a whole but every node works alone: give up folding
        failures = {index: "the constant subgraph it belongs to could not be evaluated" for index in foldable}
    return failures


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def evaluate(
    model: onnx.ModelProto,
    nodes: list[onnx.NodeProto],
    outputs: list[str],
    known: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Run `nodes` (whose inputs are initializers of `model` or arrays in `known`) and return
    the arrays of `outputs`: with onnxruntime, else onnx's ReferenceEvaluator."""
    known = known or {}
    produced = {o for node in nodes for o in node.output}
    wanted = {name for node in nodes for name in node.input if name and name not in produced}
    tensors = [t for t in model.graph.initializer if t.name in wanted and t.name not in known]
    tensors += [numpy_helper.from_array(known[name], name) for name in sorted(wanted) if name in known]
    tiny = helper.make_model(
        helper.make_graph(nodes, "constants", [], [onnx.ValueInfoProto(name=o) for o in outputs], tensors),
        opset_imports=list(model.opset_import),
        ir_version=model.ir_version,
    )
    try:
        arrays = _run_onnxruntime(tiny, outputs)
    except Exception:
        arrays = _run_reference(tiny, outputs)
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):
            raise TypeError(f"'{name}' is not a tensor")
    return arrays


def _run_onnxruntime(tiny: onnx.ModelProto, outputs: list[str]) -> dict[str, np.ndarray]:
    from qcli.runtime import make_session

    # One thread: folded weights must come out bit-identical on every run.
    session = make_session(tiny, threads=1)
    return dict(zip(outputs, session.run(outputs, {}), strict=True))


def _run_reference(tiny: onnx.ModelProto, outputs: list[str]) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return dict(zip(outputs, ReferenceEvaluator(tiny).run(outputs, {}), strict=True))
