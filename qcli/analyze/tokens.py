"""A language model's logits judged as people judge language models: perplexity on the text.

For logits `[N, T, V]` of a decoder fed `input_ids` `[N, T]` (qcli.analyze.kinds, kind `tokens`),
position t predicts token t + 1 of the text. Per sample (one chunk of text):
- each model's negative log-likelihood of the actual next tokens, its mean over the chunk's
  T - 1 predictions; perplexity = exp(the mean over every prediction seen), float's and the
  quantized model's;
- the perplexity increase, quantized / float - 1 (gated: `verify.max_perplexity_increase`), and
  its interval from the per-sample differences of mean log-likelihood (each chunk one sample:
  the tokens of a chunk are not independent);
- next-token agreement: the share of positions whose argmax (greedy decoding's choice) is the
  same; and the mean KL divergence of the quantized model's next-token distribution from the
  float model's, in nats (reported).
Computed in float64 one sample at a time: a [T, V] slice, never the batch's probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from qcli.analyze.intervals import Z95, Mean


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64.

    >>> np.round(np.exp(log_softmax(np.array([[0.0, np.log(3.0)]]))), 3).tolist()
    [[0.25, 0.75]]
    """
    x = np.asarray(x, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass
class TokenAccumulator:
    """Perplexity of both models, agreement and KL over the samples seen (module docstring).

    >>> f = np.log(np.array([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]]]))
    >>> acc = TokenAccumulator(); acc.update(f, f[:, :, ::-1], np.array([[0, 0, 1]]))
    >>> round(acc.float_perplexity, 3), round(acc.perplexity, 3), round(acc.increase, 3), round(acc.agreement, 3)
    (1.336, 3.536, 1.646, 0.333)
    """

    z: float = Z95
    float_nll: float = 0.0  # Σ over predictions of -log p(next token), float model
    nll: float = 0.0  # the same, quantized model
    predictions: int = 0
    differences: Mean = field(default_factory=Mean)  # per sample: mean NLL quantized - float
    same: Mean = field(default_factory=Mean)  # per sample: share of positions whose argmax agrees
    kl: Mean = field(default_factory=Mean)  # per position: KL(float || quantized), nats

    def update(self, reference: np.ndarray, value: np.ndarray, ids: np.ndarray | None) -> None:
        """One batch: logits `[N, T, V]` of each model and the tokens fed, `[N, T]` (None: not
        known, so agreement and KL only)."""
        if reference.ndim != 3:
            raise ValueError(f"token logits are [batch, positions, vocabulary], got {list(reference.shape)}")
        if ids is not None and tuple(ids.shape) != reference.shape[:2]:
            raise ValueError(f"{list(ids.shape)} input_ids for logits {list(reference.shape)}")
        for i in range(reference.shape[0]):
            f, q = log_softmax(reference[i]), log_softmax(value[i])
            self.same.add(np.array([np.mean(f.argmax(axis=-1) == q.argmax(axis=-1))]))
            self.kl.add(np.sum(np.exp(f) * (f - q), axis=-1))
            if ids is not None and ids.shape[1] >= 2:
                nxt = np.asarray(ids[i, 1:], np.int64)
                rows = np.arange(nxt.size)
                nf, nq = -f[rows, nxt], -q[rows, nxt]
                self.float_nll += float(nf.sum())
                self.nll += float(nq.sum())
                self.predictions += nxt.size
                self.differences.add(np.array([float(np.mean(nq - nf))]))

    @property
    def samples(self) -> int:
        return self.same.n

    @property
    def agreement(self) -> float | None:
        return self.same.value

    @property
    def float_perplexity(self) -> float | None:
        return math.exp(self.float_nll / self.predictions) if self.predictions else None

    @property
    def perplexity(self) -> float | None:
        return math.exp(self.nll / self.predictions) if self.predictions else None

    @property
    def increase(self) -> float | None:
        """quantized / float perplexity - 1."""
        return math.exp((self.nll - self.float_nll) / self.predictions) - 1 if self.predictions else None

    def interval(self, z: float | None = None) -> tuple[float, float] | None:
        """The increase's interval, from the per-sample differences of mean log-likelihood."""
        found = self.differences.interval(self.z if z is None else z)
        return None if found is None else (math.expm1(found[0]), math.expm1(found[1]))
