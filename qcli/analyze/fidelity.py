"""What a comparison with the float model finds: per output, the figures of its kind
(`OutputFidelity`, from its accumulator: `output_fidelity`), and over the outputs (`Fidelity`):
the agreement and cosine the floors read, and the drop in the metric's units. The result type
of `Probe.measure` (qcli.analyze.probe), judged by qcli.analyze.verdict."""

from __future__ import annotations

from dataclasses import dataclass

from qcli.analyze.kinds import Kind, OutputKind
from qcli.analyze.metrics import FidelityAccumulator
from qcli.analyze.plugin import CustomScore
from qcli.analyze.report import rounded_pair

AGREEMENT = {Kind.TOP1: "top-1 agreement", Kind.SEQUENCE: "sequence agreement", Kind.MASK: "mask IoU",
             Kind.BOXES: "boxes matched", Kind.MAP: "top-region IoU", Kind.PER_ELEMENT: "element agreement"}


@dataclass(frozen=True)
class OutputFidelity:
    name: str
    class_scores: bool
    top1_agreement: float | None
    cosine: float | None
    sqnr_db: float | None
    # Integer/bool outputs (class ids, masks, a tagger's ids): the fraction of their elements
    # equal. Per element, not per sample: one pixel of a mask or one token of a sentence that
    # differs does not count as a wrong sample (a piper diacritizer at int8: 96.6% of tokens
    # equal, 34% of sentences identical).
    agreement: float | None = None
    kind: Kind = Kind.COSINE
    reason: str = ""
    sequence_agreement: float | None = None  # sequence: whole (collapsed) sequences unchanged
    position_agreement: float | None = None  # sequence: positions whose argmax is unchanged (detail)
    predicted_agreement: float | None = None  # top-1, sequence: what unseen samples would keep (analyze.margins)
    mask_agreement: float | None = None  # mask: elements on the same side of the threshold (detail)
    mask_iou: float | None = None  # mask: mean per-sample IoU of the thresholded masks (gated)
    samples: int = 0  # the samples compared
    changed: int | None = None  # top-1, sequence: the samples whose decision changed
    agreement_interval: tuple[float, float] | None = None  # ~95% interval of the gated agreement
    cosine_interval: tuple[float, float] | None = None  # ~95% interval of the mean cosine
    relative_error: float | None = None  # regression: RMS error over the float values' spread (gated)
    box_f1: float | None = None  # boxes: mean per-sample F1 of the two models' detections (gated)
    boxes: int | None = None  # boxes: the float model's detections on the compared samples
    top5_agreement: float | None = None  # top1 (5 classes or more): float's top-1 in the quantized top 5
    map_iou: float | None = None  # map: mean per-sample IoU of the two models' top regions (gated)
    psnr_db: float | None = None  # map: mean per-sample PSNR over the float sample's range (detail)
    error_interval: tuple[float, float] | None = None  # its interval
    perplexity: float | None = None  # tokens: the quantized model's perplexity on the text's next tokens
    float_perplexity: float | None = None  # tokens: the float model's
    perplexity_increase: float | None = None  # tokens: quantized / float - 1 (gated)
    perplexity_interval: tuple[float, float] | None = None  # its interval
    token_agreement: float | None = None  # tokens: positions whose next-token argmax agrees (detail)
    kl: float | None = None  # tokens: mean KL of the quantized next-token distribution from float's, nats
    spatial: bool = False  # a map or a detector's boxes: gated on verify.min_spatial_agreement

    @property
    def gated_agreement(self) -> float | None:
        """The agreement this output is gated on (its kind's), None for cosine and ignore."""
        return {Kind.TOP1: self.top1_agreement, Kind.SEQUENCE: self.sequence_agreement,
                Kind.MASK: self.mask_iou, Kind.BOXES: self.box_f1, Kind.MAP: self.map_iou,
                Kind.PER_ELEMENT: self.agreement}.get(self.kind)

    @property
    def gated_cosine(self) -> float | None:
        """The cosine this output is gated on: cosine outputs only (a mask's is reported)."""
        return self.cosine if self.kind is Kind.COSINE else None

    @property
    def gated_error(self) -> float | None:
        """The relative error this output is gated on: regression outputs only."""
        return self.relative_error if self.kind is Kind.REGRESSION else None

    @property
    def gated_perplexity(self) -> float | None:
        """The perplexity increase this output is gated on: a language model's logits only."""
        return self.perplexity_increase if self.kind is Kind.TOKENS else None

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind.value, "reason": self.reason,
                "top1_agreement": self.top1_agreement, "cosine": self.cosine, "sqnr_db": self.sqnr_db,
                "agreement": self.agreement, "sequence_agreement": self.sequence_agreement,
                "position_agreement": self.position_agreement, "predicted_agreement": self.predicted_agreement,
                "mask_agreement": self.mask_agreement,
                "mask_iou": self.mask_iou, "samples": self.samples,
                "agreement_interval": rounded_pair(self.agreement_interval),
                "cosine_interval": rounded_pair(self.cosine_interval),
                "relative_error": self.relative_error, "error_interval": rounded_pair(self.error_interval),
                "top5_agreement": self.top5_agreement, "box_f1": self.box_f1, "boxes": self.boxes,
                "map_iou": self.map_iou, "psnr_db": self.psnr_db, "perplexity": self.perplexity,
                "float_perplexity": self.float_perplexity, "perplexity_increase": self.perplexity_increase,
                "perplexity_interval": rounded_pair(self.perplexity_interval),
                "token_agreement": self.token_agreement, "kl": self.kl}


@dataclass(frozen=True)
class Fidelity:
    """How closely a candidate follows the float model on the probe's samples."""

    outputs: tuple[OutputFidelity, ...]
    noise: float  # Σ over gated float outputs of noise power / signal power
    accuracy: float | None = None  # top-1 vs labels (candidate)
    float_accuracy: float | None = None  # top-1 vs labels (float model)
    custom: CustomScore | None = None  # verify.metric's score and floor

    @property
    def top1_agreement(self) -> float | None:
        """The lowest agreement over the outputs gated on one (top-1, sequence, mask or element
        agreement, each output by its kind), the floor `min_top1_agreement` applies to; None:
        there are none."""
        values = [o.gated_agreement for o in self.outputs if o.gated_agreement is not None]
        return min(values) if values else None

    @property
    def cosine(self) -> float | None:
        """The lowest mean cosine over the outputs gated on it (cosine outputs)."""
        values = [o.gated_cosine for o in self.outputs if o.gated_cosine is not None]
        return min(values) if values else None

    def _losses(self) -> list[tuple[float, str]]:
        """(loss, metric name) per gated figure, in the metric's units."""
        losses = [(1.0 - a, f"{AGREEMENT[o.kind]} ({o.name})") for o in self.outputs
                  if (a := o.gated_agreement) is not None]
        losses += [(1.0 - c, f"cosine ({o.name})") for o in self.outputs if (c := o.gated_cosine) is not None]
        # a regression's loss: the share of float's variance the error leaves (relative error squared,
        # 1 - R²), as 1 - cosine is a vector's: a budget of 0.01 is verify.max_relative_error's 0.1
        losses += [(e * e, f"unexplained variance ({o.name})") for o in self.outputs
                   if (e := o.gated_error) is not None]
        losses += [(max(p, 0.0), f"perplexity increase ({o.name})") for o in self.outputs
                   if (p := o.gated_perplexity) is not None]
        if self.custom is not None:
            losses.append((max(0.0, self.custom.floor - self.custom.score), self.custom.name))
        return losses

    @property
    def drop(self) -> float:
        """The loss in the metric's units: top-1 accuracy points lost (as a fraction) with labels,
        else the largest loss over the gated outputs, each by its kind (1 - its agreement, 1 -
        its cosine) and the plug-in's shortfall below its floor (0 when there is nothing to
        compare)."""
        if self.accuracy is not None and self.float_accuracy is not None:
            return self.float_accuracy - self.accuracy
        return max((loss for loss, _ in self._losses()), default=0.0)

    @property
    def metric(self) -> str:
        """What `drop` measures, naming the output it comes from."""
        if self.accuracy is not None and self.float_accuracy is not None:
            return "top-1 accuracy"
        losses = self._losses()
        return max(losses, key=lambda p: p[0])[1] if losses else "cosine"


def output_fidelity(name: str, acc: FidelityAccumulator) -> OutputFidelity:
    """One output's figures, by its kind."""
    kind = acc.kind or OutputKind(Kind.COSINE, "")
    seq, mask, tokens = acc.sequence, acc.mask, acc.tokens
    return OutputFidelity(
        name, acc.class_scores, acc.top1_agreement, acc.cosine, acc.sqnr.db, acc.element_agreement,
        kind=kind.kind, reason=kind.reason,
        sequence_agreement=seq.agreement if seq else None, position_agreement=seq.position_agreement if seq else None,
        predicted_agreement=acc.predicted_agreement,
        mask_agreement=mask.agreement if mask else None, mask_iou=mask.iou if mask else None,
        samples=acc.samples, agreement_interval=acc.agreement_interval, cosine_interval=acc.cosine_interval,
        changed=acc.changed(), relative_error=acc.relative_error, error_interval=acc.error_interval,
        box_f1=acc.boxes.f1 if acc.boxes else None, boxes=acc.boxes.boxes if acc.boxes else None,
        top5_agreement=acc.top5_agreement, map_iou=acc.map.iou if acc.map else None,
        psnr_db=acc.map.psnr.value if acc.map else None,
        perplexity=tokens.perplexity if tokens else None, float_perplexity=tokens.float_perplexity if tokens else None,
        perplexity_increase=tokens.increase if tokens else None,
        perplexity_interval=tokens.interval() if tokens else None,
        token_agreement=tokens.agreement if tokens else None, kl=tokens.kl.value if tokens else None,
        spatial=acc.spatial,
    )
