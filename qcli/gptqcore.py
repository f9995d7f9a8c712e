"""GPTQ's rounding loop (Frantar et al., 2023), shared by MatMul/Gemm weights (qcli.gptq) and
convolutions (qcli.gptqconv): the integers of a weight [N, K] on the Gram matrix [K, K] of its
inputs, each input row rounded in turn and its error spread onto the rows not yet rounded."""

from __future__ import annotations

import numpy as np

DAMP = 0.01  # of the Gram diagonal's mean, added to it
RATIOS = tuple(1.0 - 0.025 * i for i in range(13))  # the clipped ranges `searched` tries: 1.0 .. 0.7
BLOCK_ROWS = 128  # rows rounded between two updates of the rest (GPTQ's lazy batch)


def round_rows(w: np.ndarray, h: np.ndarray, s: np.ndarray, z: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Integers for `w` [N, K] with scales and zero points `s`, `z` (per value) on Gram `h` [K, K].
    Worked on as [K, N] in float32 (GPTQ's own precision), so that each input row is contiguous:
    over a column of [N, K] a 4096 x 1024 weight took 8 s, over a row 1 s."""
    h = damped(h)
    order = np.argsort(-np.diag(h), kind="stable")
    rows = np.ascontiguousarray(w[:, order].T, np.float32)  # [K, N], rows in act-order
    scale = np.ascontiguousarray(s[:, order].T, np.float32)
    zero = np.ascontiguousarray(z[:, order].T, np.float32)
    hinv = upper_cholesky_of_inverse(h[np.ix_(order, order)]).astype(np.float32)
    k = rows.shape[0]
    ints = np.zeros_like(rows)
    for start in range(0, k, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, k)
        errors = np.zeros((stop - start, rows.shape[1]), np.float32)
        for j in range(start, stop):
            q = np.clip(np.rint(rows[j] / scale[j]) + zero[j], lo, hi)
            ints[j] = q
            err = (rows[j] - (q - zero[j]) * scale[j]) / hinv[j, j]
            rows[j + 1:stop] -= np.outer(hinv[j, j + 1:stop], err)
            errors[j - start] = err
        rows[stop:] -= hinv[start:stop, stop:].T @ errors
    out = np.empty_like(ints.T)
    out[:, order] = ints.T
    return out


def damped(h: np.ndarray) -> np.ndarray:
    """A copy of the Gram matrix `h` [..., K, K] with GPTQ's dampening: a diagonal of 1 where it
    is 0 (an input 0 on every calibration row: rounded to nearest), then DAMP x the diagonal's
    mean added to it."""
    h = h.copy()
    diag = np.einsum("...kk->...k", h)  # a view: writes go to h
    diag[diag == 0] = 1.0
    diag += DAMP * diag.mean(axis=-1, keepdims=True)
    return h


def upper_cholesky_of_inverse(h: np.ndarray) -> np.ndarray:
    """U with Uᵀ U = H⁻¹ (GPTQ's Hinv), more dampening until H is positive definite (float64:
    float32 measured no faster here)."""
    damp = DAMP * float(np.mean(np.diag(h)))
    for _ in range(8):
        try:
            inverse = np.linalg.inv(h)
            return np.linalg.cholesky(inverse).T
        except np.linalg.LinAlgError:
            h = h + np.asarray(damp * np.eye(h.shape[0]), h.dtype)
            damp *= 10
    raise np.linalg.LinAlgError("the Gram matrix stays singular after dampening")


SMALL_WIDTH = 64  # K up to which a conv's groups are rounded together (`round_groups`)


def round_groups(w: np.ndarray, s: np.ndarray, z: np.ndarray, h: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """qcli.gptq's rounding (act-order, dampening, the upper Cholesky factor of H⁻¹) of every
    group at once: `w`, `s`, `z` [G, P, K] on `h` [G, K, K], one input row at a time over all
    groups (a depthwise conv's 512 groups of 9 rows, one by one, took a second)."""
    groups, k = h.shape[0], h.shape[1]
    h = damped(h)
    order = np.argsort(-np.einsum("gkk->gk", h), axis=1, kind="stable")  # [G, K]
    take = np.arange(groups)[:, None]
    ordered = h[take[:, :, None], order[:, :, None], order[:, None, :]]
    try:
        inverse = np.linalg.inv(ordered)
        u = np.swapaxes(np.linalg.cholesky(inverse), 1, 2).astype(np.float32)
    except np.linalg.LinAlgError:  # more dampening, group by group
        u = np.stack([upper_cholesky_of_inverse(m) for m in ordered]).astype(np.float32)
    rows = np.take_along_axis(w, order[:, None, :], axis=2).astype(np.float32)  # [G, P, K] in act-order
    step = np.take_along_axis(s, order[:, None, :], axis=2).astype(np.float32)
    zero = np.take_along_axis(z, order[:, None, :], axis=2).astype(np.float32)
    ints = np.zeros_like(rows)
    for j in range(k):
        q = np.clip(np.rint(rows[:, :, j] / step[:, :, j]) + zero[:, :, j], lo, hi)
        ints[:, :, j] = q
        err = (rows[:, :, j] - (q - zero[:, :, j]) * step[:, :, j]) / u[:, j, j][:, None]  # [G, P]
        rows[:, :, j + 1:] -= err[:, :, None] * u[:, None, j, j + 1:]
    out = np.empty_like(ints)
    np.put_along_axis(out, np.broadcast_to(order[:, None, :], ints.shape), ints, axis=2)
    return out
