"""The goal: what a search's result must satisfy, read from the config's criterion and floors.

An accuracy budget (the drop of the fidelity metric at most `max_drop`, or a share of it), the
verification floors (each output judged by its kind: `Fidelity.top1_agreement` is the lowest
agreement of the outputs gated on one, `Fidelity.cosine` the lowest gated cosine, a regression's
relative error under its ceiling, a language model's perplexity increase, next-token agreement and
KL) and the `verify.metric` plug-in's own floor, a ceiling on the latency ratio to the float
model, and a size budget (the written model's bytes). A memory floor is not a goal: promotions
only hold more weights (qcli.checks.memory_check). A Goal only judges measurements; it never
measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from qcli.analyze.fidelity import Fidelity
from qcli.analyze.verdict import meets
from qcli.config import Config, Criterion
from qcli.errors import ConfigError


@dataclass(frozen=True)
class Goal:
    """What the result must satisfy: an accuracy budget and/or floors, and a latency ceiling."""

    criterion: Criterion = "performance"
    max_drop: float | None = None  # Fidelity.drop at most this
    min_top1_agreement: float | None = None  # floors (verification)
    min_cosine: float | None = None
    max_latency_ratio: float | None = None  # quantized / float latency at most this
    max_relative_error: float | None = None  # regression outputs' ceiling (verification)
    max_perplexity_increase: float | None = None  # language models' logits: their ceiling (verification)
    min_token_agreement: float | None = None  # language models: next-token agreement's floor (verification)
    max_token_kl: float | None = None  # language models: the next-token KL's ceiling (verification)
    max_bytes: int | None = None  # the written model's size at most this (auto_precision.max_size_mb)
    min_spatial_agreement: float | None = None  # maps' and boxes' floor (verification; None: min_top1_agreement)

    def accurate(self, f: Fidelity | None, scale: float = 1.0) -> bool:
        """Whether `f` meets the floors (each gated figure by qcli.analyze.verdict's rule, which
        weighs its interval) and `scale` times the accuracy budget."""
        if f is None:
            return False
        if self.max_drop is not None and f.drop > self.max_drop * scale + 1e-12:
            return False
        if not meets(f, self.min_top1_agreement, self.min_cosine, self.max_relative_error,
                     self.max_perplexity_increase, self.min_token_agreement, self.max_token_kl,
                     self.min_spatial_agreement):
            return False
        return f.custom is None or f.custom.passed

    @property
    def stop_below(self) -> float | None:
        """The lowest agreement floor: a trial measured in part stops once an output's agreement
        must end below it (`Trials.fidelity`); a higher floor is then judged on the whole."""
        floors = [f for f in (self.min_top1_agreement, self.min_spatial_agreement) if f is not None]
        return min(floors) if floors else None

    def fast(self, ratio: float | None) -> bool:
        """Whether `ratio` is not measurably above the ceiling: its interval reaches it (a
        `latency.Ratio`; a plain float is its own interval)."""
        return self.max_latency_ratio is None or ratio is None or getattr(ratio, "low", ratio) <= self.max_latency_ratio

    def small(self, size: int | None) -> bool:
        """Whether a model of `size` bytes fits the size budget (None: not measured, no budget)."""
        return self.max_bytes is None or (size is not None and size <= self.max_bytes)


def goal_of(config: Config) -> Goal:
    """The auto-precision goal the config's `auto_precision` section describes."""
    ap = config.auto_precision
    if ap.criteria == "custom" and ap.min_speedup is None:
        raise ConfigError("auto_precision.criteria custom needs auto_precision.min_speedup",
                          hint="or pick performance, balanced or accuracy")
    min_speedup = ap.min_speedup if ap.min_speedup is not None else (1.0 if ap.criteria == "accuracy" else None)
    return Goal(
        criterion=ap.criteria,
        max_drop=None if ap.criteria == "accuracy" else ap.max_accuracy_drop,
        max_latency_ratio=1.0 / min_speedup if min_speedup else None,
        max_bytes=round(ap.max_size_mb * 1e6) if ap.max_size_mb is not None else None,
    )
