"""Graph passes run before quantization: `prepare(model)` returns an equivalent model the
quantizer can read (local functions inlined, opset >= 13, weights as initializers, exporter
quirks canonicalized (Sum -> Add, no Dropout/Identity, per-channel Mul/Add folded into the Conv
before), BatchNormalization folded, constant Ifs inlined, value_info filled) and one note per
change.

Each pass is a module with one function `model -> PassResult(model, modified, notes)`, usable
and testable alone; `PASSES` lists them in order.

Decisions (and why):
- `prepare` copies the caller's model once; the passes then edit that copy in place (a pass
  may also return a new ModelProto: always use `result.model`). The C++ tools (version
  converter, shape inference) get a light copy without the big weights, so a model's weights
  are copied about once per prepare, whatever their size, and models over 2 GB work.
- Names: graph outputs and every tensor/node that survives keep their names (calibration
  statistics and user overrides refer to them). Names created are derived from existing ones
  (`<weight>/folded`, `<node>/bias`, `<If node>/<branch tensor>`, then `_1`, `_2`... if taken),
  never random. Same input, same bytes out (`SerializeToString(deterministic=True)`).
- Initializers that are also graph inputs (IR < 4 required it; some exporters still do it)
  are constants: they are folded like any weight and dropped from the graph inputs. Feeding
  them at run time is not supported (the data loader never does; quantized weights are baked).
- Opset: upgraded to 13 only when below (never above 13: that is enough for per-channel and
  int8 Q/DQ, and newer is the exporter's call), or to 21 when the caller asks: per-block
  weights (`qcli.quantize.prepare_for` asks when the config does). Upgrading here,
  before the other passes, keeps one prepared graph for every later stage. The IR version is
  raised to what the new opset needs, never above what the installed onnxruntime loads.
  onnx's converter gets Resize/Upsample (< 11) and Hardmax (< 13) wrong; those are put
  right (see `opset`).
- Constant folding evaluates with onnxruntime (one thread, so results are bit-identical run
  to run) and falls back to onnx's ReferenceEvaluator; only main-graph nodes are folded
  (subgraph Constant nodes do become that subgraph's initializers). Shape(activation)
  chains are not constant and stay.
- Canonicalization runs after constant folding (its patterns need constants as initializers)
  and before BatchNormalization folding (removing a Dropout or folding a BatchNormalization's
  exported second half as Mul/Add exposes Conv -> BatchNormalization).
- After an If is inlined, constant folding, canonicalization and BatchNormalization folding
  run again so the inlined branch is treated like the rest of the graph (notes are not
  repeated).
- A Loop/Scan/If body's own float weights (1024 values or more) move to the main graph, which
  the body reads them from (`hoist`): the quantizer stores the weights bodies read from the
  outer scope as integers folded at load, and left a body's own constants float.
- Shape inference never fails the run: on error, the model is kept and a note says so.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import onnx

from qcli.configparts import SKIPPABLE_PASSES as SKIPPABLE  # the passes a run may leave out
from qcli.prepare._graph import BLOCK_OPSET, TARGET_OPSET, Options, PassResult
from qcli.prepare.batchnorm import fold_batchnorm
from qcli.prepare.canonicalize import canonicalize
from qcli.prepare.constants import fold_constants
from qcli.prepare.functions import inline_functions
from qcli.prepare.guard import refuse_quantized
from qcli.prepare.hoist import hoist_body_weights
from qcli.prepare.opset import upgrade_opset
from qcli.prepare.shapes import infer_shapes
from qcli.prepare.subgraphs import inline_constant_if
from qcli.qweights import WeightMemo

Pass = Callable[[onnx.ModelProto, Options], PassResult]

PASSES: list[Pass] = [
    refuse_quantized,  # already-quantized models are refused (unless force)
    inline_functions,  # calls of local functions (exported modules) -> their bodies
    upgrade_opset,  # below 13 -> 13 (or to the opset asked for: 21 for per-block weights)
    fold_constants,  # Constant nodes and constant subgraphs -> initializers
    canonicalize,  # Sum -> Add, Dropout/Identity removed, per-channel Mul/Add -> the Conv before
    fold_batchnorm,  # BatchNormalization -> the Conv/ConvTranspose/Gemm before it
    inline_constant_if,  # If with a constant condition -> the taken branch
    hoist_body_weights,  # a body's own float weights -> main-graph initializers the body reads
    infer_shapes,  # value_info for every tensor
]

# Passes run again on what `inline_constant_if` inlined, before shape inference.
AFTER_INLINING: list[Pass] = [fold_constants, canonicalize, fold_batchnorm]


@dataclass
class PrepareResult:
    model: onnx.ModelProto
    notes: list[str] = field(default_factory=list)  # one human sentence per change made
    recovery: dict = field(default_factory=dict)  # what graph recovery steps changed (qcli.recovery)
    # what the builds made from `model` share (`qcli.qweights.WeightMemo`, `qcli.qdq.materialize`'s
    # memo): the precision search builds hundreds of candidates from one prepared model
    quantized: WeightMemo = field(default_factory=WeightMemo, repr=False, compare=False)


def prepare(model: onnx.ModelProto, *, force: bool = False, opset: int = TARGET_OPSET,
            skip: Collection[str] = ()) -> PrepareResult:
    """Run `PASSES` on a copy of `model` (the caller's ModelProto is never changed), upgrading
    a model below `opset` to it (BLOCK_OPSET for per-block weights), leaving out the passes
    named in `skip` (SKIPPABLE: the config's `prepare.skip`).

    Raises ModelError for an already quantized model (unless `force`) and for a model whose
    opset cannot be upgraded.
    """
    options = Options(force=force, opset=opset)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    notes: list[str] = []
    for step in (p for p in PASSES if p.__name__ not in skip):
        result = step(work, options)
        work = result.model
        _add(notes, result.notes)
        if step is inline_constant_if and result.modified:
            for again in (p for p in AFTER_INLINING if p.__name__ not in skip):
                result = again(work, options)
                work = result.model
                _add(notes, result.notes)
    return PrepareResult(work, notes)


def _add(notes: list[str], new: list[str]) -> None:
    notes.extend(n for n in new if n not in notes)


__all__ = [
    "AFTER_INLINING",
    "BLOCK_OPSET",
    "PASSES",
    "SKIPPABLE",
    "Options",
    "PassResult",
    "PrepareResult",
    "TARGET_OPSET",
    "canonicalize",
    "fold_batchnorm",
    "fold_constants",
    "infer_shapes",
    "inline_constant_if",
    "inline_functions",
    "prepare",
    "refuse_quantized",
    "upgrade_opset",
]
