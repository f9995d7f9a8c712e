"""AdaRound (Nagel et al., 2020; AIMET's and Quark's `adaround`), recovery step `adaround`: each
value of a weight rounded down or up, the choice learned so that the layer's output on the
calibration data moves least, not each value's own error.

The objective, per weight, over the Gram matrix H = XᵀX / n of its layer's inputs (qcli.gptq
measures them; a Conv's over its sampled patches, qcli.gptqconv):

    Σ_rows dᵀ H d  +  λ Σ_values 1 − |2 h(V) − 1|^β,   d = s (⌊w / s⌋ + h(V)) − w

Decisions:
- H, not the data: an iteration costs G x P x K² (one matmul), whatever the data's size, and
  every row of the data is in every step (AIMET draws batches of it instead).
- AIMET's defaults: h the rectified sigmoid (ζ 1.1, γ −0.1), V set so that h(V) is the value's
  fractional part (the soft form of rounding to nearest), λ 0.01, β falling linearly from 20 to
  2 after a warm start of 20% of the iterations without the regulariser, Adam at 0.01.
  `iterations` is the config's knob: 500 by default (on a 64 x 288 layer, 96% of 1000's gain
  over nearest), where AIMET's 10000 draw batches.
- A value whose floor or ceiling is outside the integer range is clipped as nearest rounding
  clips it, not learned.
- The inputs are the float model's (qcli.gptq's choice, AIMET's `symfp`): one pass, and each layer
  independent of the others.
- The result is the hard choice, h(V) ≥ ½ (V ≥ 0), kept for an output channel only where its
  output error on H is below rounding to nearest's: never worse on the calibration data.
- float32 throughout (GPTQ's precision), in a fixed order: the same bytes every run.
"""

from __future__ import annotations

import numpy as np

ZETA, GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch
REG = 0.01  # λ
BETA = (20.0, 2.0)  # the regulariser's exponent, from start to end
WARM = 0.2  # share of the iterations before the regulariser starts
LR = 0.01
ADAM = (0.9, 0.999, 1e-8)


def output_errors(w: np.ndarray, q: np.ndarray, s: np.ndarray, z: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each row's output error dᵀ H d [G, P], of integers `q` with scales and zero points `s`,
    `z` for `w` [G, P, K], on each group's Gram matrix `h` [G, K, K]."""
    d = ((q - z) * s - w).astype(np.float32)
    return np.einsum("gpk,gpk->gp", np.matmul(d, h.astype(np.float32)), d)


def nearest(w: np.ndarray, s: np.ndarray, z: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Round to nearest, clipped to [lo, hi]."""
    return np.clip(np.rint(w / s) + z, lo, hi)


def rounded(w: np.ndarray, s: np.ndarray, z: np.ndarray, h: np.ndarray, lo: int, hi: int,
            iterations: int, reg: float = REG) -> np.ndarray:
    """Integers for `w` [G, P, K] with scales and zero points `s`, `z` (per value) on each group's
    Gram matrix `h` [G, K, K] (normalised by its rows), by AdaRound (module docstring); each
    row rounded to nearest where that is no worse."""
    w32, s32, z32, h32 = (np.ascontiguousarray(a, np.float32) for a in (w, s, z, h))
    floor = np.floor(w32 / s32) + z32
    free = (floor >= lo) & (floor + 1 <= hi)  # both choices inside the range: learned
    base = np.clip(floor, lo, hi - 1)
    fraction = np.clip(w32 / s32 + z32 - floor, 0.0, 1.0)
    v = -np.log((ZETA - GAMMA) / (np.clip(fraction, 1e-4, 1 - 1e-4) - GAMMA) - 1).astype(np.float32)
    v = np.where(free, v, 0).astype(np.float32)
    fixed = np.where(free, 0, nearest(w32, s32, z32, lo, hi) - base).astype(np.float32)
    moments = [np.zeros_like(v), np.zeros_like(v)]
    warm = int(WARM * iterations)
    for step in range(iterations):
        sig = 1 / (1 + np.exp(-v))
        soft = np.clip(sig * (ZETA - GAMMA) + GAMMA, 0, 1)
        d = (base + np.where(free, soft, fixed) - z32) * s32 - w32
        grad = 2 * np.matmul(d, h32) * s32  # d/dh of Σ dᵀ H d
        if step >= warm:
            beta = BETA[1] + (BETA[0] - BETA[1]) * (1 - (step - warm) / max(1, iterations - warm))
            centred = 2 * soft - 1
            grad -= reg * beta * 2 * np.sign(centred) * np.abs(centred) ** (beta - 1)
        inside = (soft > 0) & (soft < 1) & free
        grad = np.where(inside, grad * sig * (1 - sig) * (ZETA - GAMMA), 0).astype(np.float32)
        v -= _adam(grad, moments, step + 1)
    learned = base + np.where(free, (v >= 0).astype(np.float32), fixed)
    plain = nearest(w32, s32, z32, lo, hi)
    better = output_errors(w32, learned, s32, z32, h32) < output_errors(w32, plain, s32, z32, h32)
    return np.where(better[:, :, None], learned, plain)


def _adam(grad: np.ndarray, moments: list[np.ndarray], t: int) -> np.ndarray:
    """Adam's step for `grad` (its moments updated in place)."""
    b1, b2, eps = ADAM
    moments[0] = b1 * moments[0] + (1 - b1) * grad
    moments[1] = b2 * moments[1] + (1 - b2) * grad * grad
    m = moments[0] / (1 - b1 ** t)
    u = moments[1] / (1 - b2 ** t)
    return (LR * m / (np.sqrt(u) + eps)).astype(np.float32)
