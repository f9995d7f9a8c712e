"""Recovery steps `seq_mse` and `adaround` (docs/guides/recovery.md): the weights GPTQ rounds
(qcli.gptq.targets: MatMul and Gemm weights on one input, Conv weights per output channel, 8 bits
or fewer) rounded for their layer's output on the calibration data, over the Gram matrices H of
the layers' inputs that GPTQ measures (one pass through the prepared float graph; under k-fold
verification a fold's model on the other folds' samples, as its ranges).

- seq_mse (AIMET's sequential MSE, ModelOpt's): each output channel's scale (each block's, per
  block) is the full range's times the ratio among `candidates` (1, (c−1)/c, ..., 1/c: AIMET's
  20 from 1/20 of the range to all of it) whose output error dᵀ H d, rounded to nearest, is least
  (a block's on its diagonal block of H). Ratio 1 comes first and wins ties: never worse on the
  calibration data than rounding to nearest.
- adaround (qcli.adaround) rounds with seq_mse's scales when both are on (AIMET's order: the
  encodings first), else with the full range's.
- The inputs are the float model's, each layer on its own (AIMET's `symfp`; GPTQ's one pass):
  AIMET's default (`symqt`) feeds the quantized model's, one pass per layer.
- AdaRound's work on a weight is bounded: iterations x 2 G P K² floating-point operations at
  most WORK (about a second here), fewer iterations past it, and below MIN_ITERATIONS the weight keeps
  rounding to nearest, listed in the report (`nearest`). A classifier head of 8210 x 1024 would
  take 8.6 TFLOP at 500 iterations (ddddocr: 330 s of its 340 s of rounding at 1000).
- A weight whose Gram matrix sums fewer than ROWS_PER_INPUT rows of data per input keeps
  rounding to nearest (`nearest` in the report says why): a squeeze-excite or classifier layer
  reads one row per sample, and its 32 rows span a sliver of its inputs. seq_mse's clipped
  scales, best for those rows, took the direction classifier's held-out outputs from 36.8 to
  14.8 dB (weight-only int8); GPTQ's dampening keeps it from that.
- Reported per weight: the layer's output SQNR on H, Σ wᵀHw over Σ dᵀHd, rounded to nearest at
  the full range and as chosen (`Rounding.weight`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qcli import adaround
from qcli.config import Config
from qcli.gptq import Gram, Rounder, _per_value, _reduction_axis, searched
from qcli.gptqconv import output_scales
from qcli.plan import Plan, WeightPlan
from qcli.qweights import Weight, quantized_weight, weight_qparams
from qcli.scheme import PerBlock, integer_range

Sqnr = tuple[float, float, str]  # dB rounded to nearest at the full range, dB as chosen; why nearest ("": not)
WORK = 5e10  # AdaRound's floating-point operations on one weight, at most (iterations x 2 G P K²)
MIN_ITERATIONS = 100  # fewer than this within WORK: the weight keeps rounding to nearest
ROWS_PER_INPUT = 4  # rows of data a Gram matrix sums per input, at least; fewer: rounded to nearest
PAST_BUDGET, FEW_ROWS = "past AdaRound's budget", "too few rows of data"


@dataclass(frozen=True)
class Rounding:
    """How the steps that are on round a weight: seq_mse's candidates (None: the full range's
    scale) and AdaRound's iterations and λ (None: to nearest)."""

    candidates: int | None = None
    iterations: int | None = None
    reg: float = adaround.REG

    @classmethod
    def of(cls, config: Config) -> Rounding | None:
        """The rounding `config`'s recovery steps ask for, None when neither is on."""
        seq, ada = config.recovery.seq_mse, config.recovery.adaround
        if seq is None and ada is None:
            return None
        return cls(seq.candidates if seq else None, ada.iterations if ada else None,
                   ada.reg_param if ada else adaround.REG)

    @property
    def steps(self) -> list[str]:
        return [s for s, on in (("seq_mse", self.candidates), ("adaround", self.iterations)) if on]

    @property
    def ratios(self) -> tuple[float, ...]:
        """seq_mse's clipping ratios, the full range first."""
        c = self.candidates or 1
        return tuple((c - i) / c for i in range(c))

    def rounder(self, into: dict[str, Sqnr]) -> Rounder:
        """qcli.gptq.solve's rounder: `weight`, each weight's SQNRs kept in `into`."""
        def rounded(name: str, values: np.ndarray, wp: WeightPlan, gram: Gram, conv: bool) -> Weight:
            weight, sqnr = self.weight(values, wp, gram, conv)
            if sqnr is not None:
                into[name] = sqnr
            return weight
        return rounded

    def report(self, sqnr: dict[str, Sqnr], plan: Plan) -> dict:
        """What the steps did to the weights `plan` quantizes: how many, each layer's output SQNR
        before (to nearest) and after, in dB, and their means."""
        done = {n: list(sqnr[n][:2]) for n in sorted(plan.weights) if n in sqnr}
        means = [round(float(np.mean([v[i] for v in done.values()])), 2) if done else None for i in (0, 1)]
        report = {"steps": self.steps, "weights": len(done), "mean_sqnr_db": means, "sqnr_db": done}
        nearest = {n: sqnr[n][2] for n in done if sqnr[n][2]}
        if nearest:  # why each was rounded to nearest
            report["nearest"] = nearest
        return report

    def weight(self, values: np.ndarray, wp: WeightPlan, gram: Gram, conv: bool) -> tuple[Weight, Sqnr | None]:
        """`values` quantized under `wp` for its layer's output on `gram` (a Conv's: one matrix
        per group), and the SQNRs; round to nearest (no SQNR) when the matrix does not fit."""
        matrix = gram.matrix
        if gram.rows == 0:
            return quantized_weight(values, wp), None
        h = matrix.astype(np.float64).reshape(-1, *matrix.shape[-2:]) / gram.rows  # [G, K, K]
        layout = _Layout.of(values, wp, conv)
        if conv and values.shape[0] % h.shape[0] == 0:
            layout = layout.grouped(h.shape[0])
        if layout.w.shape[0] != h.shape[0] or layout.w.shape[2] != h.shape[2]:
            return quantized_weight(values, wp), None
        full = weight_qparams(values, wp)  # round to nearest's scale and zero point
        lo, hi = integer_range(wp.scheme.dtype, wp.scheme.symmetric)
        s0, z0 = (layout.per_value(p, wp) for p in full)
        before = _sqnr(layout.w, adaround.nearest(layout.w, s0, z0, lo, hi), s0, z0, h)
        if gram.rows < ROWS_PER_INPUT * h.shape[2]:  # H of low rank: the choice would fit these rows alone
            return quantized_weight(values, wp), (before, before, FEW_ROWS)
        if self.candidates is None:
            scale, zero = full
        elif conv:
            scale, zero = output_scales(values, wp, h, self.ratios)
        else:
            scale, zero = searched(values, wp, _diagonal_blocks(h[0], wp), self.ratios)
        s, z = layout.per_value(scale, wp), layout.per_value(zero, wp)
        iterations = min(self.iterations or 0, int(WORK // (2 * layout.w.size * h.shape[2])))
        learns = self.iterations is not None and iterations >= MIN_ITERATIONS
        ints = (adaround.rounded(layout.w, s, z, h, lo, hi, iterations, self.reg) if learns
                else adaround.nearest(layout.w, s, z, lo, hi))
        weight = layout.back(ints).astype(wp.scheme.dtype.numpy_dtype), scale, zero
        why = PAST_BUDGET if self.iterations is not None and not learns else ""
        return weight, (before, _sqnr(layout.w, ints, s, z, h), why)


@dataclass(frozen=True)
class _Layout:
    """A weight as the [G, P, K] rows its layer multiplies its inputs by: a Conv's groups of
    output channels over their patches, a MatMul's or Gemm's outputs over its reduction axis; in
    float32, so that rounding to nearest divides as QuantizeLinear does (RTN's bytes)."""

    values: np.ndarray
    w: np.ndarray
    axis: int | None  # a MatMul's reduction axis; None: a Conv

    @classmethod
    def of(cls, values: np.ndarray, wp: WeightPlan, conv: bool) -> _Layout:
        if conv:
            return cls(values, values.reshape(values.shape[0], -1).astype(np.float32)[None], None)
        axis = _reduction_axis(values, wp)
        rows = np.moveaxis(values, axis, -1).astype(np.float32)
        return cls(values, rows.reshape(1, -1, rows.shape[-1]), axis)

    def per_value(self, param: np.ndarray, wp: WeightPlan) -> np.ndarray:
        """A scale or zero point repeated to the layout's shape."""
        full = _per_value(np.asarray(param), wp, self.values.shape).astype(np.float32)
        moved = full.reshape(full.shape[0], -1) if self.axis is None else np.moveaxis(full, self.axis, -1)
        return moved.reshape(self.w.shape)

    def back(self, ints: np.ndarray) -> np.ndarray:
        if self.axis is None:
            return ints.reshape(self.values.shape)
        return np.moveaxis(ints.reshape(np.moveaxis(self.values, self.axis, -1).shape), -1, self.axis)

    def grouped(self, groups: int) -> _Layout:
        """The Conv layout split into its `groups`."""
        return _Layout(self.values, self.w.reshape(groups, -1, self.w.shape[2]), self.axis)


def _diagonal_blocks(h: np.ndarray, wp: WeightPlan) -> np.ndarray:
    """H's diagonal blocks [groups, block, block] of a per-block weight (zero-padded past K), or
    H itself [1, K, K] for a per-channel one: what each block's (row's) output error is over."""
    if not isinstance(wp.scheme.granularity, PerBlock):
        return h[None]
    block, k = wp.scheme.granularity.size, h.shape[0]
    groups = -(-k // block)
    padded = np.zeros((groups * block, groups * block))
    padded[:k, :k] = h
    return np.stack([padded[g * block:(g + 1) * block, g * block:(g + 1) * block] for g in range(groups)])


def _sqnr(w: np.ndarray, q: np.ndarray, s: np.ndarray, z: np.ndarray, h: np.ndarray) -> float:
    """The layer's output SQNR (dB) on `h`: Σ wᵀHw over Σ dᵀHd, at most 300 dB."""
    signal = float(np.einsum("gpk,gpk->", np.matmul(w, h), w))
    noise = float(adaround.output_errors(w, q, s, z, h).sum())
    return round(10 * math.log10(max(signal, 1e-30) / max(noise, signal * 1e-30, 1e-30)), 2)
