"""The report as one self-contained HTML page: inline CSS and SVG charts, no script, no network,
no external fonts (the system's sans-serif and monospace)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from html import escape

from qcli.analyze import summary as s
from qcli.analyze import svg
from qcli.analyze.report import Fidelity, Report
from qcli.render import human_bytes

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f3f4f6; color: #111827;
  font: 15px/1.5 system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif; }
main { max-width: 1040px; margin: 0 auto; padding: 28px 24px 48px; }
header h1 { font-size: 26px; margin: 0 0 4px; }
header .models { color: #374151; font-size: 15px; margin: 0 0 2px; }
header .data { color: #6b7280; font-size: 13px; margin: 0; }
code, .mono { font-family: ui-monospace, 'SFMono-Regular', 'DejaVu Sans Mono', Menlo, Consolas, monospace;
  font-size: 0.9em; }
.verdict { display: inline-block; margin: 14px 0 0; padding: 6px 14px; border-radius: 999px; font-weight: 600; }
.verdict.pass { background: #dcfce7; color: #166534; }
.verdict.fail { background: #fee2e2; color: #991b1b; }
.verdict.none { background: #e5e7eb; color: #374151; }
.cards { display: grid; grid-template-columns: repeat(4, 1fr); gap: 14px; margin: 22px 0 8px; }
.card { background: #fff; border-radius: 10px; padding: 14px 16px; box-shadow: 0 1px 2px rgba(0,0,0,.06); }
.card .label { color: #6b7280; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 26px; font-weight: 700; margin: 2px 0; }
.card .detail { color: #4b5563; font-size: 13px; }
.card.bad .value { color: #b91c1c; }
.card.good .value { color: #15803d; }
section { background: #fff; border-radius: 10px; padding: 18px 20px 20px; margin: 18px 0;
  box-shadow: 0 1px 2px rgba(0,0,0,.06); }
section h2 { font-size: 19px; margin: 0 0 12px; }
section h3 { font-size: 15px; margin: 18px 0 8px; color: #374151; }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th { text-align: left; color: #4b5563; font-weight: 600; border-bottom: 2px solid #e5e7eb; padding: 6px 10px; }
td { border-bottom: 1px solid #f0f1f3; padding: 5px 10px; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.pass, .fail { white-space: nowrap; }
td.name { overflow-wrap: anywhere; }
.pass { color: #15803d; font-weight: 600; }
.fail { color: #b91c1c; font-weight: 600; }
.chart { margin: 8px 0 14px; }
.muted { color: #6b7280; font-size: 13px; }
ul.notes { margin: 6px 0 0; padding-left: 20px; color: #374151; font-size: 14px; }
footer { color: #9ca3af; font-size: 12px; text-align: center; margin-top: 26px; }
"""


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: Collection[int],
           names: Collection[int] = frozenset(), raw: Collection[int] = frozenset()) -> str:
    out = ["<table><thead><tr>"]
    out += [f'<th class="{"num" if i in right else ""}">{escape(h)}</th>' for i, h in enumerate(header)]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = "num" if i in right else "name mono" if i in names else ""
            cells.append(f'<td class="{cls}">{c if i in raw else escape(c)}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


Card = tuple[str, str, str, bool | None]  # label, value, detail, good (None: neither good nor bad)


def _fidelity_card(fidelity: list[Fidelity]) -> Card | None:
    """Without labels: the agreement of the first output judged by one (its kind's), else
    cosine similarity."""
    for f in fidelity:
        if f.kind == "top1" and f.top1_agreement is not None:
            return ("Top-1 agreement", s.pct(f.top1_agreement), f"with the float model on {f.output}",
                    f.top1_agreement >= 0.99)
        if f.kind == "sequence" and f.sequence_agreement is not None:
            return ("Sequences unchanged", s.pct(f.sequence_agreement), f"with the float model on {f.output}",
                    f.sequence_agreement >= 0.99)
        if f.kind == "mask" and f.mask_iou is not None:
            return ("Mask IoU", s.pct(f.mask_iou), f"{s.pct(f.mask_agreement)} of elements agree on {f.output}",
                    f.mask_iou >= 0.99)
    for f in fidelity:
        if f.kind == "cosine" and f.cosine is not None:
            return ("Cosine similarity", f"{f.cosine:.4f}", f"to the float model on {f.output}", f.cosine >= 0.99)
    return None


def _cards(report: Report) -> str:
    cards: list[Card] = []
    acc = report.accuracy
    if acc is not None:
        cards.append(("Top-1 accuracy", s.pct(acc.quantized.top1),
                      f"float {s.pct(acc.float.top1)} · {s.points(acc.top1_drop)}", acc.top1_drop <= 0.01))
    elif (card := _fidelity_card(report.fidelity)) is not None:
        cards.append(card)
    if report.speed is not None:
        sp = report.speed
        cards.append(("Speedup", s.ratio(sp.speedup),
                      f"{s.ms(sp.float.median_ms)} → {s.ms(sp.quantized.median_ms)} median", sp.speedup >= 1))
    else:
        cards.append(("Speedup", "–", "latency not measured", None))
    cards.append(("Compression", s.ratio(report.size.compression),
                  f"{human_bytes(report.size.float.file_bytes)} → {human_bytes(report.size.quantized.file_bytes)}",
                  report.size.compression >= 1))
    if report.gates:
        failed = sum(not g.passed for g in report.gates)
        cards.append(("Gates", f"{len(report.gates) - failed} / {len(report.gates)}",
                      "passed" if not failed else f"{failed} failed", not failed))
    elif report.layers is not None and report.layers.tensors:
        worst = report.layers.worst(1)[0]
        cards.append(("Worst layer", s.db(worst.sqnr_db), worst.op_type + " " + svg._shorten(worst.tensor, 28),
                      worst.sqnr_db is None or worst.sqnr_db >= 20))
    out = ['<div class="cards">']
    for label, value, detail, good in cards:
        cls = "" if good is None else "good" if good else "bad"
        out.append(f'<div class="card {cls}"><div class="label">{escape(label)}</div>'
                   f'<div class="value">{escape(value)}</div><div class="detail">{escape(detail)}</div></div>')
    out.append("</div>")
    return "".join(out)


def _header(report: Report) -> list[str]:
    f_name, q_name = s.name(report.float_model.path), s.name(report.quantized_model.path)
    d = report.data
    verdict = s.verdict(report)
    klass = "none" if not report.gates else "pass" if report.passed else "fail"
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>qcli analysis: {escape(f_name)} vs {escape(q_name)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        "<header><h1>Quantization report</h1>",
        f'<p class="models"><code>{escape(f_name)}</code> (float) → <code>{escape(q_name)}</code> (quantized)</p>',
        f'<p class="data">{d.samples} samples from <code>{escape(d.path)}</code>'
        + (f", {d.labelled} labelled" if d.labelled else ", no labels")
        + (", with reference outputs" if d.reference_outputs else "") + "</p>",
        f'<div class="verdict {klass}">{"✓ " if klass == "pass" else "✗ " if klass == "fail" else ""}'
        f"{escape(verdict[0].upper() + verdict[1:])}</div></header>",
        _cards(report),
    ]


def _summary(report: Report) -> list[str]:
    rows = [tuple(c.replace("`", "") for c in r) for r in s.summary_rows(report)]
    return ["<section><h2>Summary</h2>", _table(("", "float", "quantized", "change"), rows, {1, 2, 3}), "</section>"]


def _gates(report: Report) -> list[str]:
    if not report.gates:
        return []
    rows = []
    for row, g in zip(s.gate_rows(report), report.gates, strict=True):
        result = f'<span class="{"pass" if g.passed else "fail"}">{"✓ pass" if g.passed else "✗ FAIL"}</span>'
        rows.append((*map(escape, row[:4]), result, escape(g.message)))
    return ["<section><h2>Gates</h2>", _table((*s.GATE_HEADER, "detail"), rows, {2, 3}, raw={0, 1, 2, 3, 4, 5}),
            "</section>"]


def _fidelity(report: Report) -> list[str]:
    """Accuracy against the float model and, when the data hold them, against reference outputs."""
    parts = ["<section><h2>Fidelity to the float model</h2>"]
    parts.append(_table(s.FIDELITY_HEADER, [s.fidelity_row(f) for f in report.fidelity], {2, 3, 4, 5, 6}, names={0}))
    parts.append('<p class="muted">Top-1 agreement: share of samples whose highest-scoring class is the same in '
                 "both models. Cosine: per-sample cosine similarity of the outputs. SQNR: float output power over "
                 "the power of the difference, in dB.</p>")
    if report.reference:
        parts.append("<h3>Against the reference outputs stored with the data</h3>")
        rows = []
        for ref in report.reference:
            for model, fid in (("float", ref.float), ("quantized", ref.quantized)):
                r = s.fidelity_row(fid)
                rows.append((r[0], model, *r[1:]))
        parts.append(_table(("output", "model", *s.FIDELITY_HEADER[1:]), rows, {3, 4, 5, 6, 7}, names={0}))
    parts.append("</section>")
    return parts


def _layers(report: Report) -> list[str]:
    layers = report.layers
    if layers is None or not layers.tensors:
        return []
    worst = report.worst_layers()
    parts = [f"<section><h2>Per-layer error ({len(layers.tensors)} quantized activations)</h2>"]
    parts.append('<p class="muted">SQNR between the float model\'s activation and the quantized model\'s '
                 "dequantized one, over all samples. Hover a bar for details.</p>")
    parts.append(f'<div class="chart">{svg.sqnr_chart(layers.tensors, [t.tensor for t in worst])}</div>')
    parts.append(f"<h3>Worst {len(worst)} layers</h3>")
    parts.append(_table(s.LAYER_HEADER, s.layer_rows(worst), {0, 5, 6}, names={1, 2}))
    if layers.skipped:
        items = "".join(f"<li>not measured: {escape(x)}</li>" for x in layers.skipped)
        parts.append(f'<ul class="notes">{items}</ul>')
    parts.append("</section>")
    return parts


def _sensitivity(report: Report) -> list[str]:
    sens = report.sensitivity
    if sens is None:
        return []
    parts = [f"<section><h2>Sensitivity per unit ({len(sens.units)} quantized units)</h2>",
             f'<p class="muted">{escape(s.sensitivity_text(sens))}. Alone: the loss and noise of the float model '
             "with only this unit quantized. Float: what keeping this unit float removes from the quantized "
             "model's loss and noise. Hover a cell for details.</p>"]
    if sens.units:
        parts.append(f'<div class="chart">{svg.sensitivity_heatmap(sens, s.SENSITIVITY_MEASURES)}</div>')
        rows = [(*r[:3], u.precision, *r[3:]) for r, u in zip(s.sensitivity_rows(sens), sens.units, strict=True)]
        parts.append(_table((*s.SENSITIVITY_HEADER[:3], "runs as", *s.SENSITIVITY_HEADER[3:]), rows,
                            {0, 4, 5, 6, 7, 8}, names={1}))
    if sens.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in sens.notes) + "</ul>")
    parts.append("</section>")
    return parts


def _speed(report: Report) -> list[str]:
    sp = report.speed
    if sp is None:
        return []
    threads = "onnxruntime's default threads"
    if sp.threads:
        threads = f"{sp.threads} intra-op thread{'s' if sp.threads > 1 else ''}"
    rows = [(label, s.ms(lat.median_ms), s.ms(lat.p90_ms), s.ms(lat.mean_ms), s.ms(lat.min_ms), s.ms(lat.max_ms),
             s.rate(lat.throughput)) for label, lat in (("float", sp.float), ("quantized", sp.quantized))]
    return [
        "<section><h2>Speed</h2>",
        f'<p class="muted">onnxruntime CPU, {threads}, idle spinning off; {sp.warmup} warm-up then '
        f"{sp.runs} timed runs per model on the same input (batch {sp.batch}), {escape(sp.order)}. "
        f"Speedup = float median / quantized median = <b>{s.ratio(sp.speedup)}</b>.</p>",
        f'<div class="chart">{svg.latency_chart(sp)}</div>',
        f'<div class="chart">{svg.run_sequence_chart(sp)}</div>',
        _table(("model", "median", "p90", "mean", "min", "max", "samples/s"), rows, {1, 2, 3, 4, 5, 6}),
        "</section>",
    ]


def _size(report: Report) -> list[str]:
    sz = report.size
    rows = []
    for label, m in (("float", sz.float), ("quantized", sz.quantized)):
        by_type = ", ".join(f"{k} {human_bytes(v.bytes)}" for k, v in m.weights.items()) or "none"
        rows.append((label, f"{m.file_bytes:,}", human_bytes(m.file_bytes), human_bytes(m.weight_bytes), by_type))
    return [
        "<section><h2>Size</h2>",
        f'<div class="chart">{svg.size_chart(sz.float, sz.quantized)}</div>',
        _table(("model", "file bytes", "file", "weights", "weights by type"), rows, {1, 2, 3}),
        '<p class="muted">Compression = float file bytes / quantized file bytes = '
        f"<b>{s.ratio(sz.compression)}</b>"
        " (external data files included).</p>",
        "</section>",
    ]


def _settings(report: Report) -> list[str]:
    """Settings and notes, then the page's end."""
    d = report.data
    items = [
        *(f'{label} model <code>{escape(m.path)}</code> <span class="muted mono">{escape(m.fingerprint)}</span>'
          for label, m in (("float", report.float_model), ("quantized", report.quantized_model))),
        f"data <code>{escape(d.path)}</code> ({escape(d.layout)})"
        + (f", labels from <code>{escape(d.labels_file)}</code>" if d.labels_file else ""),
        escape(s.settings_text(report)),
    ] + [f"note: {escape(n)}" for n in report.notes]
    return [
        "<section><h2>Settings</h2>",
        '<ul class="notes">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>",
        "</section>",
        f"<footer>qcli {escape(report.qcli_version)} · {escape(report.format)}</footer>",
        "</main></body></html>",
    ]


# The page from top to bottom; each part is a list of lines (empty when the report has no such data).
SECTIONS = (_header, _summary, _gates, _fidelity, _layers, _sensitivity, _speed, _size, _settings)


def to_html(report: Report) -> str:
    """The page: the lines of every part in order, joined by newlines."""
    return "\n".join(line for section in SECTIONS for line in section(report)) + "\n"
