"""The report as rows of text, shared by the Markdown, HTML and terminal renderings (so the three
say the same thing in the same words)."""

from __future__ import annotations

from pathlib import PurePath

from qcli.analyze.report import Decode, Fidelity, LayerError, Report, Sensitivity, Speed
from qcli.render import human_bytes, num, size_change


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def points(x: float | None) -> str:
    """A drop as signed points of accuracy: 0.0025 -> "-0.25 pts" (a drop is a minus)."""
    if x is None:
        return "–"
    value = -100 * x
    return f"{value:+.2f} pts" if abs(value) >= 0.005 else "±0.00 pts"


def db(x: float | None) -> str:
    return "exact" if x is None else f"{x:.1f} dB"


def ms(x: float) -> str:
    return f"{x:.3f} ms" if x < 100 else f"{x:.1f} ms"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def faster(speedup: float) -> str:
    """A speedup as people say it: "1.5x faster", "1.25x slower"."""
    return f"{ratio(speedup)} faster" if speedup >= 1 else f"{ratio(1 / speedup)} slower"


def name(path: str) -> str:
    return PurePath(path).name or path


def verdict(report: Report) -> str:
    if not report.gates:
        return "no gates set"
    failed = [g for g in report.gates if not g.passed]
    if not failed:
        return f"all {len(report.gates)} gate{'s' if len(report.gates) > 1 else ''} passed"
    return f"{len(failed)} of {len(report.gates)} gate{'s' if len(report.gates) > 1 else ''} failed"


def headline(report: Report) -> str:
    """The accuracy part in one line, e.g. for `qcli quantize --eval-data`:
    "top-1 99.50% -> 99.25% (-0.25 pts) on 400 labelled samples; top-1 agreement 99.75% on logits"."""
    parts = []
    acc = report.accuracy
    if acc is not None:
        parts.append(f"top-1 {pct(acc.float.top1)} -> {pct(acc.quantized.top1)} ({points(acc.top1_drop)}) "
                     f"on {acc.samples} labelled samples")
    for f in report.fidelity:
        if f.kind == "top1" and f.top1_agreement is not None:
            parts.append(f"top-1 agreement {pct(f.top1_agreement)} on {f.output}")
        elif f.kind == "sequence" and f.sequence_agreement is not None:
            parts.append(f"sequence agreement {pct(f.sequence_agreement)} (positions {pct(f.position_agreement)}) "
                         f"on {f.output}")
        elif f.kind == "mask" and f.mask_iou is not None:
            parts.append(f"mask IoU {pct(f.mask_iou)} ({pct(f.mask_agreement)} of elements agree), "
                         f"cosine {f.cosine:.5f} on {f.output}")
        elif f.kind == "cosine" and f.cosine is not None:
            parts.append(f"cosine {f.cosine:.5f}, SQNR {db(f.sqnr_db)} on {f.output}")
        elif f.kind == "map" and f.map_iou is not None:
            parts.append(f"top-region IoU {pct(f.map_iou)}, PSNR {db(f.psnr_db)} on {f.output}")
        elif f.kind == "boxes" and f.box_f1 is not None:
            parts.append(f"boxes matched {pct(f.box_f1)} (F1 at IoU 0.5, {f.boxes} float detections) on {f.output}")
        elif f.kind == "regression" and f.relative_error is not None:
            parts.append(f"relative error {f.relative_error:.4f} of the spread, max abs error "
                         f"{num(f.max_abs_error or 0.0)} on {f.output}")
        elif f.kind == "tokens" and f.perplexity is not None:
            parts.append(f"perplexity {f.float_perplexity:.3f} -> {f.perplexity:.3f} "
                         f"({f.perplexity_increase:+.2%}), next token unchanged at {pct(f.token_agreement)} of "
                         f"positions on {f.output}")
    parts += [g.message for g in report.gates if g.name == "max_accuracy_drop"]
    return "; ".join(parts) if parts else f"{report.data.samples} samples compared"


def summary_rows(report: Report) -> list[tuple[str, ...]]:
    """(measure, float, quantized, change) rows: accuracy, latency, throughput, size."""
    rows: list[tuple[str, ...]] = []
    acc = report.accuracy
    if acc is not None:
        rows.append((f"top-1 accuracy ({acc.samples} labelled)", pct(acc.float.top1), pct(acc.quantized.top1),
                     points(acc.top1_drop)))
        if acc.float.top5 is not None:
            rows.append(("top-5 accuracy", pct(acc.float.top5), pct(acc.quantized.top5), points(acc.top5_drop)))
    for f in report.fidelity:
        if f.kind == "tokens" and f.perplexity is not None and f.float_perplexity is not None:
            rows.append((f"perplexity ({f.samples} chunks of text, `{f.output}`)", f"{f.float_perplexity:.3f}",
                         f"{f.perplexity:.3f}", f"{f.perplexity_increase:+.2%}"))
    for ref in report.reference:
        f, q = ref.float, ref.quantized
        if f.top1_agreement is not None:
            rows.append((f"top-1 agreement with reference `{ref.output}`", pct(f.top1_agreement), pct(q.top1_agreement),
                         points((f.top1_agreement or 0) - (q.top1_agreement or 0))))
        elif f.cosine is not None:
            rows.append((f"cosine to reference `{ref.output}`", f"{f.cosine:.5f}", f"{q.cosine:.5f}", ""))
    if (pr := report.predicted) is not None:
        rows.append((f"latency predicted (batch {pr.batch}, {pr.target.split(' (')[0].removeprefix('target ')})",
                     ms(pr.float_ms), ms(pr.quantized_ms), faster(pr.speedup)))
        if pr.decode_speedup is not None and pr.decode_float_ms is not None and pr.decode_quantized_ms is not None:
            rows.append(("decode step predicted", ms(pr.decode_float_ms), ms(pr.decode_quantized_ms),
                         faster(pr.decode_speedup)))
    sp = report.speed
    if sp is not None:
        threads = f", {sp.threads} thread{'s' if sp.threads > 1 else ''}" if sp.threads else ""
        rows.append((f"latency median (batch {sp.batch}{threads})", ms(sp.float.median_ms),
                     ms(sp.quantized.median_ms), faster(sp.speedup)))
        rows.append(("latency p90", ms(sp.float.p90_ms), ms(sp.quantized.p90_ms), ""))
        rows.append(("throughput (samples/s)", rate(sp.float.throughput), rate(sp.quantized.throughput), ""))
        if (dec := report.decode) is not None:
            rows += decode_rows(sp, dec)
    sz = report.size
    rows.append(("file size", human_bytes(sz.float.file_bytes), human_bytes(sz.quantized.file_bytes),
                 size_change(sz.compression)))
    rows.append(("weights", human_bytes(sz.float.weight_bytes), human_bytes(sz.quantized.weight_bytes),
                 size_change(sz.float.weight_bytes / max(sz.quantized.weight_bytes, 1))))
    if (mem := report.memory) is not None:
        rows.append(("weights held by onnxruntime", human_bytes(mem.float_weight_bytes),
                     human_bytes(mem.quantized_weight_bytes), size_change(mem.reduction)))
        if mem.cache_bytes is not None:
            cache = human_bytes(mem.cache_bytes)
            rows.append((f"key/value cache after {mem.cache_tokens} tokens", cache, cache, ""))
    return rows


def decode_rows(sp: Speed, dec: Decode) -> list[tuple[str, ...]]:
    """A decoder's prompt and decode tokens per second, float and quantized (qcli.analyze.decode)."""
    n, length, step = sp.batch, dec.prompt_tokens, dec.step
    return [(f"prompt tokens/s ({length} tokens)", rate(n * length * 1e3 / sp.float.median_ms),
             rate(n * length * 1e3 / sp.quantized.median_ms), ""),
            (f"decode tokens/s (a token after {length})", rate(n * 1e3 / step.float.median_ms),
             rate(n * 1e3 / step.quantized.median_ms), faster(step.speedup))]


FIDELITY_HEADER = ("output", "kind", "agreement [95%]", "cosine (mean [95%] / min)", "SQNR", "max abs error",
                   "samples")


def agreement_text(f: Fidelity) -> str:
    """The agreement of the output's kind, with its ~95% interval and its detail (positions,
    a mask's elements)."""
    within = f" [{pct(f.agreement_interval[0])}, {pct(f.agreement_interval[1])}]" if f.agreement_interval else ""
    if f.kind == "top1":
        top5 = f" ({pct(f.top5_agreement)} in the top 5)" if f.top5_agreement is not None else ""
        return pct(f.top1_agreement) + within + top5
    if f.kind == "sequence":
        return f"{pct(f.sequence_agreement)}{within} of sequences ({pct(f.position_agreement)} of positions)"
    if f.kind == "mask":
        return f"IoU {pct(f.mask_iou)}{within} ({pct(f.mask_agreement)} of elements)"
    if f.kind == "map":
        return f"top-region IoU {pct(f.map_iou)}{within} (PSNR {db(f.psnr_db)})"
    if f.kind == "boxes":
        return f"boxes {pct(f.box_f1)}{within} (F1 at IoU 0.5, {f.boxes} float detections)"
    if f.kind == "regression" and f.relative_error is not None:
        span = f" [{f.error_interval[0]:.4f}, {f.error_interval[1]:.4f}]" if f.error_interval else ""
        return f"relative error {f.relative_error:.4f}{span}"
    if f.kind == "tokens" and f.perplexity_increase is not None:
        span = f" [{f.perplexity_interval[0]:+.2%}, {f.perplexity_interval[1]:+.2%}]" if f.perplexity_interval else ""
        return f"perplexity {f.perplexity_increase:+.2%}{span} (next token {pct(f.token_agreement)}{within})"
    if f.kind == "per_element" or f.agreement is not None:
        return pct(f.agreement) + within if f.agreement is not None else "–"  # of the elements (ids, mask pixels)
    return "–"


def fidelity_row(f: Fidelity) -> tuple[str, ...]:
    kind = f.kind + (" (not gated)" if f.kind == "ignore" else "")
    if f.sqnr_db is None and f.max_abs_error is None:  # integer outputs
        return (f.output, kind, agreement_text(f), "–", "–", "–", f"{f.samples} ({pct(f.exact_match)} identical)")
    within = f" [{f.cosine_interval[0]:.5f}, {f.cosine_interval[1]:.5f}]" if f.cosine_interval else ""
    cosine = f"{f.cosine:.5f}{within} / {f.cosine_min:.5f}" if f.cosine is not None else "–"
    return (f.output, kind, agreement_text(f), cosine, db(f.sqnr_db), num(f.max_abs_error or 0.0), str(f.samples))


GATE_HEADER = ("gate", "measure", "value", "threshold", "result")


def gate_rows(report: Report) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for g in report.gates:
        in_points = g.name == "max_accuracy_drop" and not any(m in g.metric for m in ("cosine", "variance"))
        if g.value is None:
            value = "not measured"
        elif in_points:
            value = f"{100 * g.value:.2f} pts"
        elif g.name == "max_accuracy_drop":
            value = f"{g.value:.4g}"
        else:
            value = ratio(g.value)
        if in_points:
            threshold = f"<= {100 * g.threshold:.2f} pts"
        elif g.name == "max_accuracy_drop":
            threshold = f"<= {g.threshold:.4g}"
        else:
            threshold = f">= {ratio(g.threshold)}"
        rows.append((g.name, g.metric, value, threshold, "pass" if g.passed else "FAIL"))
    return rows


LAYER_HEADER = ("#", "tensor", "node", "op type", "dtype", "SQNR", "max abs error")


def layer_rows(layers: list[LayerError]) -> list[tuple[str, ...]]:
    return [
        (str(i), t.tensor, t.node or "(graph input)", t.op_type, t.dtype, db(t.sqnr_db), num(t.max_abs_error))
        for i, t in enumerate(layers, start=1)
    ]


SENSITIVITY_MEASURES = (("alone loss", "alone_loss"), ("alone noise", "alone_noise"),
                        ("float gain", "float_gain"), ("float noise cut", "float_noise"))  # the heat-map's columns
SENSITIVITY_HEADER = ("#", "unit", "op type", *(title for title, _ in SENSITIVITY_MEASURES), "units float")


def measure_text(field: str, value: float | None) -> str:
    """A sensitivity measure: a noise share as a percentage, a loss as a number ("–": not measured)."""
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if field.endswith("noise") else num(value)


def sensitivity_rows(sens: Sensitivity) -> list[tuple[str, ...]]:
    """One row per unit, by rank (SENSITIVITY_HEADER)."""
    return [
        (str(u.rank) if u.rank else "–", u.node, u.op_type,
         *(measure_text(f, getattr(u, f)) for _, f in SENSITIVITY_MEASURES),
         "–" if u.float_units is None else str(u.float_units))
        for u in sens.units
    ]


def sensitivity_text(sens: Sensitivity) -> str:
    """What the sensitivity table measured, in one line."""
    return (f"{len(sens.units)} units, each alone (the float model with only it quantized) and kept float (the "
            f"quantized model with it float); loss: what {sens.metric} lost ({num(sens.loss)} in the quantized "
            f"model); noise: share of the quantized model's output noise; {sens.trials} trials on {sens.samples} "
            f"samples ({sens.source})")


def settings_text(report: Report) -> str:
    s = report.settings
    parts = [f"batch size {s.batch_size}"]
    if s.samples:
        parts.append(f"first {s.samples} samples")
    if report.speed:
        parts.append(f"{s.runs} timed runs after {s.warmup} warm-up, {report.speed.order}")
        parts.append(f"threads {s.threads or 'default'}")
    quant = report.quantized_model.quantization or {}
    config = quant.get("config") or {}
    if config:
        method = (config.get("calibration") or {}).get("method")
        act = (config.get("activations") or {}).get("dtype")
        weights = config.get("weights") or {}
        parts.append(f"quantized by qcli {quant.get('version', '')}: {act} activations, "
                     f"{weights.get('dtype')} {weights.get('granularity')} weights, {method} ranges")
    return "; ".join(parts)
