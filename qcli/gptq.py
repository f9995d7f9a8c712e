"""GPTQ (Frantar et al., 2023): MatMul and Gemm weights rounded one input row at a time, each
row's rounding error spread onto the rows not yet rounded through the inverse Gram matrix of the
layer's inputs, so that the layer's outputs on the calibration data move least
(`weights.algorithm: gptq`; `rtn`, the default, rounds every value to its nearest).

Decisions:
- The Gram matrix X^T X of a quantized MatMul's (or Gemm's) input, over every row of it (each
  token of each calibration sample), comes from an extra pass over the calibration samples
  (`measure_parts`) through the prepared float graph, summed in float32 (GPTQ's own precision): one
  K x K matrix per input tensor (q, k and v read one); one pass a group of PASS_BYTES of
  matrices, each pass a session of the part of the graph that computes its group's tensors
  (`qcli.calibrate.collect.values_by_folder`: a 368M-parameter decoder's 97 inputs were 0.7 GB a batch of
  8 x 128 tokens as outputs of one session), each group's moved to a temporary folder once
  summed when there are several (`passes`). They live on the calibration
  table for the run only, as bias correction's shifts do: with `--calib FILE` the run is
  refused (`needs_data`).
- The inputs are the float model's (the weights before them are not rounded yet): one pass,
  where the original GPTQ feeds each layer the quantized layers' outputs before it.
- Rows in decreasing order of the Gram diagonal (GPTQ's act-order: the inputs that carry the
  most energy are rounded first, while the most rows are left to absorb their error), with
  static groups: each block's scale and zero point are set before any row is rounded, from the
  float weights, so the blocks stay contiguous along the reduction axis as DequantizeLinear and
  MatMulNBits read them. Each block's range is clipped by the ratio (1 to 0.7) whose rounding
  error, weighted by the Gram diagonal, is least (`searched`; GPTQ's `mse` option, made
  activation-aware): ratio 1 is RTN's scale, so no block rounds worse than RTN's would.
- Dampening: 1% of the mean diagonal added to it (GPTQ's percdamp 0.01); an input that is 0 on
  every calibration row gets a diagonal of 1: its weights are rounded to nearest and kept (GPTQ
  zeroes them; unseen data may use them).
- Conv weights: each group on the Gram matrix of its input's patches (qcli.gptqconv). Other
  weights (ConvTranspose, a MatMul whose weight is its first input, a weight several inputs
  read) keep RTN, said in a note.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from qcli.calibrate.collect import values_by_folder
from qcli.data import DataFolder
from qcli.errors import QcliError
from qcli.gptqconv import MIN_POSITIONS, ROWS_PER_WIDTH, Patches, add_patches, conv_reader
from qcli.gptqconv import rounded as conv_rounded
from qcli.gptqcore import RATIOS, round_rows
from qcli.graph import GraphIndex
from qcli.lazy import tensor_array
from qcli.plan import Plan, WeightPlan
from qcli.qweights import Weight, quantized_weight, weight_qparams
from qcli.scheme import PerBlock, integer_range

PASS_BYTES = 256 << 20  # Gram matrices one pass over the data sums at most (`passes`)


@dataclass
class Gram:
    """Σ x xᵀ over the rows of one tensor (float32, K x K) and how many rows it summed; held in
    memory, or in a file of a temporary folder (`stored`) read back when asked for."""

    held: np.ndarray | None
    rows: int = 0
    stored: Path | None = None
    folder: _Folder | None = field(default=None, repr=False)  # kept while a Gram refers to it

    @property
    def matrix(self) -> np.ndarray:
        if self.held is not None:
            return self.held
        assert self.stored is not None
        return np.load(self.stored)

    def store(self, folder: _Folder) -> None:
        """Move the matrix to a new file of `folder`."""
        assert self.held is not None
        self.stored, self.folder = folder.path / f"{folder.files}.npy", folder
        folder.files += 1
        np.save(self.stored, self.held, allow_pickle=False)
        self.held = None


def needs_data(step: str | None = None) -> QcliError:
    """The error of GPTQ (or the recovery `step` that rounds on its matrices) without samples."""
    return QcliError(
        f"{f'recovery step {step!r}' if step else 'weights.algorithm gptq'} needs --data DIR: it reads the Gram "
        "matrices of the layers' inputs on the calibration samples, which a calibration file does not hold",
        hint="give --data DIR instead of --calib FILE, or " + (
            f"drop {step} from recovery:" if step else "set weights.algorithm: rtn"))


Source = str | Patches  # what a weight's Gram matrix is over: a MatMul's input tensor, a Conv's patches


def targets(model: onnx.ModelProto, plan: Plan, index: GraphIndex | None = None) -> dict[str, Source]:
    """weight -> what GPTQ rounds it by the Gram matrix of: integer weights that only MatMul (as
    its second input) or Gemm (as B) nodes read, all on one input tensor (that tensor), and
    Conv weights (their patches, qcli.gptqconv)."""
    index = index or GraphIndex.of(model)
    found: dict[str, Source] = {}
    for name, wp in plan.weights.items():
        tensor = index.initializers.get(name)
        if wp.scheme.dtype.is_float or wp.scheme.dtype.bits > 8 or wp.axis is None or tensor is None:
            continue  # 16-bit weights: a step 256x finer than int8's leaves GPTQ nothing to gain
        if (patches := conv_reader(model, index, name, wp)) is not None:
            found[name] = patches
            continue
        if len(tensor.dims) != 2:
            continue
        uses = index.read_at.get(name, ())
        readers = [model.graph.node[i] for i, position in uses if position == 1]
        inputs = {n.input[0] for n in readers if n.op_type in ("MatMul", "Gemm") and not _transposed_a(n)}
        if uses and len(readers) == len(uses) and len(inputs) == 1 and all(n.op_type in ("MatMul", "Gemm")
                                                                          for n in readers):
            found[name] = inputs.pop()
    return found


def _transposed_a(node: onnx.NodeProto) -> bool:
    """A Gemm reading its input transposed (its rows are not the input's last axis)."""
    return any(a.name == "transA" and a.i for a in node.attribute)


def passes(model: onnx.ModelProto, tensors: Iterable[Source]) -> list[list[Source]]:
    """`tensors` in groups whose Gram matrices hold at most PASS_BYTES together (one a group
    past it): one pass over the data each, so memory holds one group's, not all (a 368M-parameter
    decoder's 97 matrices: 3.8 GB)."""
    index = GraphIndex.of(model)
    sizes = {n: n.gram_bytes if isinstance(n, Patches) else _width(index, n) ** 2 * 4
             for n in sorted(set(tensors), key=_order)}
    groups: list[list[Source]] = []
    held = 0
    for name, size in sizes.items():
        if not groups or held + size > PASS_BYTES:
            groups.append([])
            held = 0
        groups[-1].append(name)
        held += size
    return groups


def _width(index: GraphIndex, name: str) -> int:
    """K, the last axis of tensor `name` (from the weight it multiplies: MatMul's B rows, Gemm's)."""
    for i in index.consumers(name):
        node = index.graph.node[i]
        weight = index.initializers.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type in ("MatMul", "Gemm") and node.input[0] == name and weight is not None:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            return int(weight.dims[-1] if trans_b else weight.dims[0])
    return 0


def _order(source: Source) -> tuple:
    return (source, "") if isinstance(source, str) else (source.input, repr(source))


def _input(source: Source) -> str:
    """The tensor a source's Gram matrix is over the values of."""
    return source if isinstance(source, str) else source.input


def measure_parts(model: onnx.ModelProto, tensors: Iterable[Source], parts: Sequence[Sequence[DataFolder]],
                  batch_size: int, progress: Callable[[int], None] | None = None) -> list[dict[Source, Gram]]:
    """The Gram matrix of each of `tensors` (a tensor's last axis: K x K; a Conv's patches: one
    per group, qcli.gptqconv) over each part of the samples (k-fold verification's folds: a
    fold's model rounds on the sum of the other folds', `summed`), one pass of every part a
    group of them (`passes`); with several groups, each group's stored in a temporary folder
    once summed (it goes with the last Gram that refers to it)."""
    groups = passes(model, tensors)
    grams: list[dict[Source, Gram]] = [{} for _ in parts]
    if not groups:
        return grams
    folders = [folder for part in parts for folder in part]
    which = [k for k, part in enumerate(parts) for _ in part]
    samples = max(1, sum(len(f) for f in folders))
    folder = _Folder() if len(groups) > 1 else None
    for sources in groups:  # each pass's session ends with it: two would hold the weights twice
        inputs = list(dict.fromkeys(_input(s) for s in sources))
        for k, name, x in values_by_folder(model, inputs, folders, batch_size, progress):
            for source in (s for s in sources if _input(s) == name):
                _add(grams[which[k]], source, x, samples)
        if folder is not None:
            for part in grams:
                for source in sources:
                    if source in part:
                        part[source].store(folder)
    return grams


def summed(parts: Sequence[dict[Source, Gram]], leave_out: int | None = None) -> dict[Source, Gram]:
    """The Gram matrices of the parts but `leave_out` together, each summed when it is read
    (`Summed`: the k folds' sums would otherwise hold k + 1 more copies of every matrix)."""
    kept = [part for k, part in enumerate(parts) if k != leave_out]
    if len(kept) == 1:  # nothing to add up
        return dict(kept[0])
    return {source: Summed(None, sum(p[source].rows for p in kept), parts=[p[source] for p in kept])
            for source in (kept[0] if kept else {})}


@dataclass
class Summed(Gram):
    """A Gram matrix that is the sum of others', added up each time it is read."""

    parts: list[Gram] = field(default_factory=list)

    @property
    def matrix(self) -> np.ndarray:
        total = np.array(self.parts[0].matrix, np.float32)
        for part in self.parts[1:]:
            total += part.matrix
        return total


def _add(grams: dict[Source, Gram], source: Source, x: np.ndarray, samples: int) -> None:
    """One batch of values `x` added to `source`'s Gram matrix (a Conv's: about ROWS_PER_WIDTH x K
    positions over the `samples`, qcli.gptqconv)."""
    if isinstance(source, Patches):
        gram = grams.setdefault(source, Gram(np.zeros((source.group, source.width, source.width), np.float32)))
        assert gram.held is not None
        cap = max(ROWS_PER_WIDTH * source.width, MIN_POSITIONS)
        gram.rows += add_patches(gram.held, x, source, -(-cap // samples))
        return
    rows = x.reshape(-1, x.shape[-1])
    gram = grams.setdefault(source, Gram(np.zeros((rows.shape[1], rows.shape[1]), np.float32)))
    assert gram.held is not None
    gram.held += rows.T @ rows
    gram.rows += rows.shape[0]


class _Folder:
    """A temporary folder (TMPDIR) for stored Gram matrices, removed with the last Gram that
    refers to it."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="qcli-gram-")
        self.path = Path(self._tmp.name)
        self.files = 0


def rounded(values: np.ndarray, wp: WeightPlan, gram: Gram) -> Weight:
    """`values` quantized under `wp` by GPTQ on `gram` (module docstring): integers, scale and
    zero point shaped as `quantized_weight` gives them, the scales `searched`."""
    reduce_axis = _reduction_axis(values, wp)
    w = np.moveaxis(values, reduce_axis, -1).reshape(-1, values.shape[reduce_axis])  # [N, K]
    k = w.shape[1]
    matrix = gram.matrix
    if matrix.shape != (k, k) or gram.rows == 0:
        return quantized_weight(values, wp)
    h = matrix.astype(np.float64) / gram.rows
    scale, zero = searched(values, wp, np.diag(h))
    s, z = (np.moveaxis(_per_value(p, wp, values.shape), reduce_axis, -1).reshape(w.shape).astype(np.float64)
            for p in (scale, zero))
    lo, hi = integer_range(wp.scheme.dtype, wp.scheme.symmetric)
    ints = round_rows(w, h, s, z, lo, hi)
    shaped = np.moveaxis(ints.reshape(np.moveaxis(values, reduce_axis, -1).shape), -1, reduce_axis)
    return shaped.astype(wp.scheme.dtype.numpy_dtype), scale, zero


def searched(values: np.ndarray, wp: WeightPlan, energy: np.ndarray, ratios: Sequence[float] = RATIOS
             ) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point per block (or channel) from the range clipped by the ratio of
    `ratios` (RATIOS; the first wins ties) whose rounding error, weighted by each input's
    `energy` (the Gram diagonal: a weight on an input that is often large costs more), is
    least: the outliers of a 32-value block otherwise set a step too coarse for the other 31.
    `energy` may instead be the Gram matrix's diagonal blocks [groups, block, block] (qcli.awq):
    each block's error is then its output error on the data, dᵀ H d, AWQ's clip objective. A
    clipped range's scale is the ratio times the full range's, its zero point the same (float32
    throughout: a 32000 x 1024 head in 2 s)."""
    axis = _reduction_axis(values, wp)
    w = np.moveaxis(values.astype(np.float32), axis, -1).reshape(-1, values.shape[axis])  # [N, K]
    scale, zero = weight_qparams(values, wp)
    s, z = (np.moveaxis(_per_value(p, wp, values.shape), axis, -1).reshape(w.shape).astype(np.float32)
            for p in (scale, zero))
    block = wp.scheme.granularity.size if isinstance(wp.scheme.granularity, PerBlock) else w.shape[1]
    groups = -(-w.shape[1] // block)
    lo, hi = integer_range(wp.scheme.dtype, wp.scheme.symmetric)
    weight = energy.astype(np.float32)
    best = np.full((w.shape[0], groups), np.inf, np.float32)
    pick = np.zeros((w.shape[0], groups), np.int64)
    for i, ratio in enumerate(ratios):
        step = s * np.float32(ratio)
        q = np.clip(np.rint(w / step) + z, lo, hi)
        err = _block_errors(w - (q - z) * step, weight, groups, block)
        better = err < best
        best, pick = np.where(better, err, best), np.where(better, i, pick)
    picked = np.asarray(ratios, np.float32)[pick]  # [N, groups]
    blocked = isinstance(wp.scheme.granularity, PerBlock)
    clipped = _layout(scale, axis, w.shape[0], groups, blocked).astype(np.float32) * picked
    return _unlayout(clipped, scale, axis, blocked).astype(scale.dtype), zero


def _block_errors(d: np.ndarray, weight: np.ndarray, groups: int, block: int) -> np.ndarray:
    """Each block's error [N, groups] from the rounding errors `d` [N, K]: Σ weight·d² with the
    Gram diagonal [K], dᵀ H d with its diagonal blocks [groups, block, block]."""
    if weight.ndim == 1:
        d = weight * np.square(d)
        return np.pad(d, [(0, 0), (0, groups * block - d.shape[1])]).reshape(d.shape[0], groups, block).sum(-1)
    d = np.pad(d, [(0, 0), (0, groups * block - d.shape[1])]).reshape(d.shape[0], groups, block).transpose(1, 0, 2)
    return np.einsum("gnb,gnb->ng", np.matmul(d, weight), d)


def _layout(param: np.ndarray, axis: int, n: int, groups: int, blocked: bool) -> np.ndarray:
    """A block's (or channel's) parameter in the [N, groups] layout of `searched`."""
    if blocked:
        return np.moveaxis(np.asarray(param, np.float64), axis, -1).reshape(n, groups)
    return np.asarray(param, np.float64).reshape(n, 1)


def _unlayout(chosen: np.ndarray, like: np.ndarray, axis: int, blocked: bool) -> np.ndarray:
    """`chosen` [N, groups] back in the shape of the parameter `like`."""
    if blocked:
        return np.moveaxis(chosen.reshape(np.moveaxis(like, axis, -1).shape), -1, axis)
    return chosen.reshape(like.shape)


def _reduction_axis(values: np.ndarray, wp: WeightPlan) -> int:
    """The weight's axis its layer sums over: the per-block axis, or the one a per-channel
    axis is not (a MatMul [K, N] quantized per column N: K)."""
    assert wp.axis is not None
    if isinstance(wp.scheme.granularity, PerBlock) or values.ndim != 2:
        return wp.axis
    return 1 - wp.axis


def _per_value(param: np.ndarray, wp: WeightPlan, shape: tuple[int, ...]) -> np.ndarray:
    """A scale or zero point repeated to the weight's shape."""
    assert wp.axis is not None
    if isinstance(wp.scheme.granularity, PerBlock):
        block = wp.scheme.granularity.size
        return np.take(np.repeat(param, block, axis=wp.axis), np.arange(shape[wp.axis]), axis=wp.axis)
    view = [1] * len(shape)
    view[wp.axis] = -1
    return np.broadcast_to(np.asarray(param).reshape(view), shape)


Rounder = Callable[[str, np.ndarray, WeightPlan, Gram, bool], Weight]  # name, values, plan, Gram, a Conv's


def solve(model: onnx.ModelProto, plan: Plan, grams: Mapping[Source, Gram], names: Iterable[str],
          rounder: Rounder | None = None) -> Iterator[tuple[str, Weight]]:
    """The weights among `names` that GPTQ rounds (`targets` with a Gram matrix), rounded one by
    one, in the graph's order: by GPTQ, or by `rounder` (the recovery steps that round on the
    same matrices, qcli.recovery.rounding)."""
    found = targets(model, plan)
    wanted = {n for n in names if n in found and found[n] in grams}
    for t in model.graph.initializer:
        if t.name in wanted:
            values, gram, wp = tensor_array(t).astype(np.float32), grams[found[t.name]], plan.weights[t.name]
            conv = isinstance(found[t.name], Patches)
            if rounder is not None:
                yield t.name, rounder(t.name, values, wp, gram, conv)
            else:
                yield t.name, conv_rounded(values, wp, gram.matrix, gram.rows) if conv else rounded(values, wp, gram)


def notes(model: onnx.ModelProto, plan: Plan, by: str = "gptq") -> list[str]:
    """How many weights GPTQ (or the recovery steps `by`) rounds, and which integer weights it
    leaves to round to nearest."""
    found = targets(model, plan)
    rest = sorted(n for n, w in plan.weights.items()
                  if n not in found and not w.scheme.dtype.is_float and w.scheme.dtype.bits <= 8)
    said = [f"{by}: {len(found)} weight(s) rounded by the Gram matrices of their layers' inputs"]
    if rest:
        said.append(f"{by}: {len(rest)} weight(s) rounded to nearest (not a MatMul, Gemm or Conv weight on one "
                    "input): "
                    + ", ".join(rest[:5]) + (", ..." if len(rest) > 5 else ""))
    return said
