"""The report's records from the accumulators of one pass (qcli.analyze.metrics): accuracy
against labels, fidelity per output, error per quantized layer, each rounded for the report."""

from __future__ import annotations

from qcli.analyze.kinds import Kind, OutputKind
from qcli.analyze.layers import QuantizedTensor
from qcli.analyze.metrics import FidelityAccumulator, SqnrAccumulator, TopKAccumulator
from qcli.analyze.report import Accuracy, ClassAccuracy, Fidelity, LayerError, rounded, rounded_pair
from qcli.analyze.tokens import TokenAccumulator


def accuracy_record(output: str | None, topk: tuple[TopKAccumulator, TopKAccumulator] | None) -> Accuracy | None:
    """Top-1 (and top-5) of both models against the labels; None without a labelled sample."""
    if topk is None:
        return None
    f, q = topk
    f1, q1, f5, q5 = f.top1_rate, q.top1_rate, f.top5_rate, q.top5_rate
    if f1 is None or q1 is None:
        return None
    return Accuracy(
        output=output or "",
        classes=f.classes,
        samples=f.samples,
        float=ClassAccuracy(rounded(f1), rounded(f5)),
        quantized=ClassAccuracy(rounded(q1), rounded(q5)),
        top1_drop=rounded(f1 - q1),
        top5_drop=rounded(f5 - q5) if f5 is not None and q5 is not None else None,
    )


def fidelity_record(name: str, acc: FidelityAccumulator) -> Fidelity:
    """One output's figures, by its kind, with their intervals."""
    kind = acc.kind or OutputKind(Kind.COSINE, "")
    seq, mask = acc.sequence, acc.mask
    return Fidelity(
        output=name,
        kind=kind.kind.value,
        reason=kind.reason,
        sequence_agreement=rounded(seq.agreement) if seq else None,
        position_agreement=rounded(seq.position_agreement) if seq else None,
        predicted_agreement=rounded(acc.predicted_agreement),
        mask_agreement=rounded(mask.agreement) if mask else None,
        mask_iou=rounded(mask.iou) if mask else None,
        samples=acc.samples,
        top1_agreement=rounded(acc.top1_agreement),
        cosine=rounded(acc.cosine),
        cosine_min=rounded(acc.cosine_min) if acc.floating and acc.samples else None,
        sqnr_db=rounded(acc.sqnr.db, 5) if acc.floating else None,
        max_abs_error=rounded(acc.sqnr.max_abs) if acc.floating else None,
        exact_match=rounded(acc.exact / acc.samples) if acc.samples else 0.0,
        nonfinite=acc.sqnr.nonfinite,
        agreement=rounded(acc.element_agreement),
        agreement_interval=rounded_pair(acc.agreement_interval),
        cosine_interval=rounded_pair(acc.cosine_interval),
        relative_error=rounded(acc.relative_error),
        box_f1=rounded(acc.boxes.f1) if acc.boxes else None,
        boxes=acc.boxes.boxes if acc.boxes else None,
        top5_agreement=rounded(acc.top5_agreement),
        map_iou=rounded(acc.map.iou) if acc.map else None,
        psnr_db=rounded(acc.map.psnr.value, 5) if acc.map else None,
        error_interval=rounded_pair(acc.error_interval),
        **_tokens(acc.tokens),
    )


def _tokens(acc: TokenAccumulator | None) -> dict:
    """A language model's figures (qcli.analyze.tokens), rounded; none for other outputs."""
    if acc is None:
        return {}
    return {"perplexity": rounded(acc.perplexity), "float_perplexity": rounded(acc.float_perplexity),
            "perplexity_increase": rounded(acc.increase), "perplexity_interval": rounded_pair(acc.interval()),
            "token_agreement": rounded(acc.agreement), "kl": rounded(acc.kl.value)}


def layer_record(p: QuantizedTensor, acc: SqnrAccumulator) -> LayerError:
    """One quantized tensor's error over the whole data."""
    n = max(acc.elements, 1)
    return LayerError(
        tensor=p.tensor,
        quantized_tensor=p.quantized_tensor,
        node=p.node,
        op_type=p.op_type,
        dtype=p.dtype,
        elements=acc.elements,
        sqnr_db=rounded(acc.db, 5),
        mse=rounded(acc.noise / n),
        signal_power=rounded(acc.signal / n),
        max_abs_error=rounded(acc.max_abs),
        nonfinite=acc.nonfinite,
    )
