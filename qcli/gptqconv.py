"""GPTQ for convolutions (qcli.gptq): a Conv's weight [Cout, Cin/G, k...] is G matrices
[Cout/G, K] (K = Cin/G x the kernel's elements) multiplying the input's patches, so each group
is rounded as a MatMul weight on the Gram matrix of its patches, Σ p pᵀ over the output
positions of the calibration samples (im2col).

Decisions:
- A weight is rounded this way when every reader is a Conv reading it as its weight, all on
  one input with the same geometry (kernel, strides, pads, dilations, group), quantized per
  output channel; else RTN (qcli.gptq's note). ConvTranspose keeps RTN (its weight is laid out
  by input channel).
- Each channel's scale is the clipped range (qcli.gptqcore.RATIOS: 1 to 0.7) whose rounding error
  on the layer's output, dᵀ H d over its group's Gram matrix, is least (ratio 1 is RTN's scale);
  then GPTQ rounds with it. Depthwise convolutions (K = the kernel's 9 or 25 elements) get
  their scale chosen by output error and little else.
- Patches are taken one sample at a time, in slices of output rows of at most PATCH_VALUES
  values: the 640 x 640 detector's first layers would otherwise copy its input 9 times over.
- A Gram matrix sums at most about ROWS_PER_WIDTH x K positions over the samples, or
  MIN_POSITIONS when that is more (each sample's an even lattice of its output positions:
  `_lattice`): a sum over every position costs positions x K² per sample,
  where the layout model's 3 x 3 convolutions over 200 x 152 maps took 76 s for 32 pages (GPTQ
  on a language model sums 64 x K rows: 128 chunks of 2048 tokens at K = 4096).
- The input's values are the float model's (GPTQ's choice, qcli.gptq): one pass over the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view

from qcli.gptqcore import RATIOS, SMALL_WIDTH, round_groups, round_rows
from qcli.graph import GraphIndex
from qcli.plan import WeightPlan
from qcli.qweights import Weight, quantized_weight, weight_qparams
from qcli.scheme import PerBlock, integer_range

PATCH_VALUES = 1 << 24  # values of one slice of patches (64 MB in float32)
ROWS_PER_WIDTH = 64  # positions a conv's Gram matrix sums, at most about this many times K
MIN_POSITIONS = 4096  # ... or this many, when more (a depthwise conv's K = 9: 576 positions)


@dataclass(frozen=True)
class Patches:
    """The geometry a Conv reads its input with: what its weight's Gram matrix is over."""

    input: str
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends, as ONNX writes them
    dilations: tuple[int, ...]
    group: int
    channels: int  # Cin / group
    auto_pad: str = "NOTSET"

    @property
    def width(self) -> int:
        """K: the values of one group's patch."""
        return self.channels * int(np.prod(self.kernel))

    @property
    def gram_bytes(self) -> int:
        return self.group * self.width ** 2 * 4


def reader(node: onnx.NodeProto, weight: onnx.TensorProto) -> Patches | None:
    """The geometry `node` (a Conv reading `weight` as its weight) reads its input with; None
    for a weight without spatial axes."""
    dims = tuple(int(d) for d in weight.dims)
    if node.op_type != "Conv" or len(dims) < 3:
        return None
    n = len(dims) - 2
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", dims[2:]))
    if kernel != dims[2:]:
        return None
    auto = attrs.get("auto_pad", b"NOTSET")
    return Patches(node.input[0], kernel, tuple(attrs.get("strides", [1] * n)), tuple(attrs.get("pads", [0] * 2 * n)),
                   tuple(attrs.get("dilations", [1] * n)), int(attrs.get("group", 1)), dims[1],
                   auto.decode() if isinstance(auto, bytes) else str(auto))


def conv_reader(model: onnx.ModelProto, index: GraphIndex, name: str, wp: WeightPlan) -> Patches | None:
    """The one geometry every reader of weight `name` reads its input with, when all are Convs
    reading it as their weight and it is quantized per output channel; else None."""
    tensor = index.initializers.get(name)
    uses = index.read_at.get(name, ())
    if tensor is None or not uses or wp.axis != 0 or isinstance(wp.scheme.granularity, PerBlock):
        return None
    found = {reader(model.graph.node[i], tensor) if position == 1 else None for i, position in uses}
    return found.pop() if len(found) == 1 and None not in found else None


def add_patches(gram: np.ndarray, x: np.ndarray, p: Patches, cap: int | None = None) -> int:
    """Σ patch patchᵀ over the output positions of `x` [N, C, spatial...] added to `gram`
    [G, K, K] (float32): every position, or with `cap` at most that many of each sample's, on
    an even lattice (`_lattice`); returns how many positions."""
    n = len(p.kernel)
    pads = _pads(x.shape[2:], p)
    x = np.asarray(x, np.float32)
    pointwise = all(k == 1 for k in p.kernel) and not any(pads) and all(s == 1 for s in p.strides)
    if pointwise and (cap is None or int(np.prod(x.shape[2:])) <= cap):  # the patches are x itself
        cols = x.reshape(x.shape[0], p.group, p.channels, -1).transpose(1, 0, 3, 2).reshape(p.group, -1, p.channels)
        gram += np.matmul(cols.transpose(0, 2, 1), cols)
        return cols.shape[1]
    rows = 0
    for sample in x:
        padded = np.pad(sample, [(0, 0)] + [(pads[i], pads[i + n]) for i in range(n)])
        span = tuple((p.kernel[i] - 1) * p.dilations[i] + 1 for i in range(n))
        view = sliding_window_view(padded, span, axis=tuple(range(1, 1 + n)))
        view = view[(slice(None),) + tuple(slice(None, None, s) for s in p.strides)
                    + tuple(slice(None, None, d) for d in p.dilations)]  # [C, out..., kernel...]
        outs = view.shape[1:1 + n]
        picked = _lattice(outs, cap)
        if picked is not None:  # a lattice of the positions: gathered, at most `cap`
            where: tuple = (slice(None), *np.unravel_index(picked, outs))
            part = view[where]  # [C, count, kernel...]
            cols = part.reshape(p.group, p.channels, len(picked), -1).transpose(0, 2, 1, 3).reshape(
                p.group, len(picked), p.width)
            gram += np.matmul(cols.transpose(0, 2, 1), cols)
            rows += len(picked)
            continue
        per_row = int(np.prod(outs[1:])) * p.group * p.width
        step = max(1, PATCH_VALUES // max(per_row, 1))
        for start in range(0, outs[0], step):
            part = view[:, start: start + step]
            count = int(np.prod(part.shape[1:1 + n]))
            cols = part.reshape(p.group, p.channels, count, -1).transpose(0, 2, 1, 3).reshape(p.group, count, p.width)
            gram += np.matmul(cols.transpose(0, 2, 1), cols)
            rows += count
    return rows


def _lattice(outs: tuple[int, ...], cap: int | None) -> np.ndarray | None:
    """At most `cap` of the output positions (flat indices), every k-th of them with k coprime
    to the last axis, so that every row and every column is sampled alike; None: all of them.
    Each axis stepped alike left a 2 x 96 map (a text line's) its first row alone, whose kernel
    taps over the second row then read as unused (the direction classifier's clipped scales: 37
    -> 15 dB held-out); the longest axis thinned first instead cost the recognizer's lines.

    >>> _lattice((2, 96), 18)[:4], len(_lattice((2, 96), 18)), _lattice((20, 15), 4096)
    (array([ 0, 11, 22, 33]), 18, None)
    >>> sorted({int(i) // 96 for i in _lattice((2, 96), 18)})
    [0, 1]
    """
    total = int(np.prod(outs))
    if cap is None or total <= cap:
        return None
    k = -(-total // max(cap, 1))
    while np.gcd(k, outs[-1]) != 1:
        k += 1
    return np.arange(0, total, k)


def _pads(spatial: tuple[int, ...], p: Patches) -> tuple[int, ...]:
    """The pads (begins, ends) of an input of `spatial` size: auto_pad's SAME_* computed as
    ONNX defines them, VALID none, else the node's."""
    n = len(p.kernel)
    if p.auto_pad == "VALID":
        return (0,) * 2 * n
    if not p.auto_pad.startswith("SAME"):
        return p.pads
    begins, ends = [], []
    for size, k, s, d in zip(spatial, p.kernel, p.strides, p.dilations, strict=True):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begins.append(small if p.auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return (*begins, *ends)


def rounded(values: np.ndarray, wp: WeightPlan, gram: np.ndarray, rows: int) -> Weight:
    """`values` [Cout, Cin/G, k...] quantized per output channel under `wp` by GPTQ on each
    group's Gram matrix (`gram` [G, K, K] summed over `rows` positions), each channel's scale
    clipped to the ratio whose output error is least (module docstring)."""
    groups, cout = gram.shape[0], values.shape[0]
    w = values.reshape(cout, -1).astype(np.float64)
    if rows == 0 or cout % groups or gram.shape[1:] != (w.shape[1], w.shape[1]):
        return quantized_weight(values, wp)
    h = gram.astype(np.float64) / rows
    chosen, zero = output_scales(values, wp, h, RATIOS)
    z = np.asarray(zero, np.float64).reshape(cout, 1)
    lo, hi = integer_range(wp.scheme.dtype, wp.scheme.symmetric)
    per = cout // groups
    s = np.broadcast_to(chosen.reshape(cout, 1).astype(np.float64), w.shape)
    zz = np.broadcast_to(z, w.shape)
    if w.shape[1] <= SMALL_WIDTH:  # depthwise and small groups: all groups at once
        grouped = [a.reshape(groups, per, -1) for a in (w, s, zz)]
        ints = round_groups(grouped[0], grouped[1], grouped[2], h, lo, hi).reshape(w.shape)
    else:
        ints = np.empty(w.shape, np.float32)
        for g in range(groups):
            part = slice(g * per, (g + 1) * per)
            ints[part] = round_rows(w[part], h[g], s[part], zz[part], lo, hi)
    return ints.reshape(values.shape).astype(wp.scheme.dtype.numpy_dtype), chosen, np.asarray(zero)


def output_scales(values: np.ndarray, wp: WeightPlan, h: np.ndarray, ratios: Sequence[float]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each output channel's scale (shaped as `weight_qparams` gives it), the full range's clipped
    by the ratio among `ratios` whose output error dᵀ H d, rounded to nearest, is least on its
    group's Gram matrix of `h` [G, K, K] (normalised); and the zero points."""
    groups, cout = h.shape[0], values.shape[0]
    w = values.reshape(cout, -1).astype(np.float64)
    scale, zero = weight_qparams(values, wp)
    s0 = np.asarray(scale, np.float64).reshape(cout, 1)
    z = np.asarray(zero, np.float64).reshape(cout, 1)
    lo, hi = integer_range(wp.scheme.dtype, wp.scheme.symmetric)
    per = cout // groups
    best, pick = np.full(cout, np.inf), np.ones(cout)
    for ratio in ratios:
        step = s0 * ratio
        d = (w - (np.clip(np.rint(w / step) + z, lo, hi) - z) * step).reshape(groups, per, -1)
        err = np.einsum("gpk,gpk->gp", np.matmul(d, h), d).reshape(cout)  # dᵀ H d, each channel on its group's
        better = err < best
        best, pick = np.where(better, err, best), np.where(better, ratio, pick)
    chosen = (s0[:, 0] * pick).astype(np.asarray(scale).dtype)
    return chosen.reshape(np.shape(scale)), np.asarray(zero)
