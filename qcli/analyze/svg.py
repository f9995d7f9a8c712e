"""Small inline-SVG charts for the HTML report: no JavaScript, no external fonts or files.

Each function returns one `<svg>` element (viewBox-scaled to the page width) with axes, tick
labels and a legend; `<title>` children give the exact values as hover tooltips.
"""

from __future__ import annotations

import math
from html import escape

from qcli.analyze.report import LayerError, ModelSize, Sensitivity, Speed

FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif"
MONO = "font-family:ui-monospace,'SFMono-Regular','DejaVu Sans Mono',Menlo,Consolas,monospace"
FLOAT_COLOR = "#8a94a6"
QUANT_COLOR = "#2563eb"
GOOD, FAIR, POOR = "#16a34a", "#f59e0b", "#dc2626"
GRID = "#e5e7eb"
AXIS = "#374151"
MUTED = "#6b7280"


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten).

    >>> nice_ticks(0, 37)
    [0.0, 10.0, 20.0, 30.0, 40.0]
    """
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 10))
        value += step
    return [float(t) for t in ticks]


def _fmt(value: float) -> str:
    return f"{value:g}" if abs(value) >= 0.01 or value == 0 else f"{value:.1e}"


def _shorten(text: str, limit: int) -> str:
    """Cut the middle of long names: the start (module path) and end (op) say the most."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep // 2] + "…" + text[-(keep - keep // 2):]


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (
        f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(label)}" '
        f'style="{FONT};max-width:{width}px;display:block">\n' + "\n".join(body) + "\n</svg>"
    )


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12, fill: str = AXIS,
          weight: str = "normal", style: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{fill}" '
            f'font-weight="{weight}"{f" style={chr(34)}{style}{chr(34)}" if style else ""}>{escape(text)}</text>')


def _x_axis(body: list[str], ticks: list[float], scale, top: float, bottom: float, label: str,
            left: float, right: float) -> None:
    for t in ticks:
        x = scale(t)
        body.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{GRID}"/>')
        body.append(_text(x, bottom + 16, _fmt(t), anchor="middle", size=11, fill=MUTED))
    body.append(f'<line x1="{left:.1f}" y1="{bottom:.1f}" x2="{right:.1f}" y2="{bottom:.1f}" stroke="{AXIS}"/>')
    body.append(_text((left + right) / 2, bottom + 36, label, anchor="middle", size=12, fill=AXIS))


def _legend(body: list[str], x: float, y: float, items: list[tuple[str, str]]) -> None:
    for color, label in items:
        body.append(f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="12" height="12" rx="2" fill="{color}"/>')
        body.append(_text(x + 17, y, label, size=12))
        x += 30 + 7 * len(label)


def band(sqnr: float | None) -> str:
    """Bar colour: >= 30 dB good, 20-30 dB fair, < 20 dB poor (exact counts as good)."""
    if sqnr is None or sqnr >= 30:
        return GOOD
    return FAIR if sqnr >= 20 else POOR


def sqnr_chart(layers: list[LayerError], worst: list[str]) -> str:
    """Horizontal bars, one per quantized activation in graph order; `worst` (worst first) get
    their rank written after the value."""
    width, row, label_w, op_w = 960, 20, 330, 130
    left, right = label_w + op_w + 10, width - 90
    top = 62
    bottom = top + row * len(layers)
    values = [t.sqnr_db for t in layers if t.sqnr_db is not None]
    ticks = nice_ticks(min([0.0, *values]), max([40.0, *values]))
    lo, hi = ticks[0], ticks[-1]
    rank = {name: i for i, name in enumerate(worst, start=1)}

    def scale(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (right - left)

    body = [_text(0, 16, "SQNR of each quantized activation (graph order; higher is better)", size=14, weight="600")]
    _legend(body, 0, 36, [(GOOD, ">= 30 dB"), (FAIR, "20-30 dB"), (POOR, "< 20 dB")])
    body.append(_text(label_w, top - 6, "tensor", anchor="end", size=11, fill=MUTED, weight="600"))
    body.append(_text(label_w + 10, top - 6, "op type", size=11, fill=MUTED, weight="600"))
    _x_axis(body, ticks, scale, top, bottom, "SQNR (dB)", left, right)
    zero = scale(max(lo, 0.0))
    for i, t in enumerate(layers):
        y = top + i * row
        if i % 2:
            body.append(f'<rect x="0" y="{y:.1f}" width="{left}" height="{row}" fill="#f9fafb"/>')
        value = hi if t.sqnr_db is None else t.sqnr_db
        x0, x1 = sorted((zero, scale(value)))
        tip = (f"{t.tensor}\nnode {t.node or '(graph input)'} ({t.op_type}), {t.dtype}\n"
               f"SQNR {'exact' if t.sqnr_db is None else f'{t.sqnr_db:.2f} dB'}, max abs error {t.max_abs_error:.4g}")
        ranked = t.tensor in rank
        body.append(f"<g><title>{escape(tip)}</title>")
        body.append(_text(label_w, y + 14, _shorten(t.tensor, 48), anchor="end", size=11,
                          weight="600" if ranked else "normal", style=MONO))
        body.append(_text(label_w + 10, y + 14, _shorten(t.op_type, 20), size=11, fill=MUTED))
        body.append(f'<rect x="{x0:.1f}" y="{y + 3:.1f}" width="{max(x1 - x0, 1):.1f}" height="{row - 6}" rx="2" '
                    f'fill="{band(t.sqnr_db)}"/>')
        label = "exact" if t.sqnr_db is None else f"{t.sqnr_db:.1f}"
        body.append(_text(x1 + 4, y + 14, label, size=11, fill=MUTED))
        if ranked:
            body.append(_text(x1 + 8 + 6.5 * len(label), y + 14, f"#{rank[t.tensor]}", size=11, fill=POOR,
                              weight="600"))
        body.append("</g>")
    body.append(f'<line x1="{zero:.1f}" y1="{top}" x2="{zero:.1f}" y2="{bottom}" stroke="{AXIS}"/>')
    body.append(_text(right, bottom + 36, "#k: k-th worst", anchor="end", size=11, fill=POOR))
    return _svg(width, bottom + 46, body, "per-layer SQNR bar chart")


def _clip(speed: Speed) -> float:
    """Upper end of the latency axes: 1.6x the larger p90, so a few slow outliers do not squash
    the distributions (runs beyond it are drawn at the edge and counted)."""
    longest = max(max(speed.float.runs_ms), max(speed.quantized.runs_ms))
    return min(longest, 1.6 * max(speed.float.p90_ms, speed.quantized.p90_ms)) or 1.0


def latency_chart(speed: Speed) -> str:
    """Every timed run as a dot, with a box (25th-75th percentile), the median (thick line) and
    the 90th percentile (tick), one row per model on a shared millisecond axis from zero."""
    import numpy as np

    width, left, right = 960, 110, 930
    top, row = 44, 70
    bottom = top + 2 * row
    ticks = nice_ticks(0.0, _clip(speed))
    hi = ticks[-1]

    def scale(v: float) -> float:
        return left + min(v, hi) / hi * (right - left)

    body = [_text(0, 16, f"Latency of every timed run (batch {speed.batch}; lower is better)", size=14, weight="600")]
    _legend(body, 0, 36, [(FLOAT_COLOR, "float"), (QUANT_COLOR, "quantized")])
    _x_axis(body, ticks, scale, top, bottom, "milliseconds per run", left, right)
    models = (("float", speed.float, FLOAT_COLOR), ("quantized", speed.quantized, QUANT_COLOR))
    for k, (label, lat, color) in enumerate(models):
        mid = top + k * row + row / 2
        runs = np.asarray(lat.runs_ms)
        q25, q75 = np.percentile(runs, [25, 75])
        body.append(_text(left - 10, mid + 4, label, anchor="end", size=13, weight="600"))
        body.append(f'<line x1="{scale(runs.min()):.1f}" y1="{mid:.1f}" x2="{scale(runs.max()):.1f}" y2="{mid:.1f}" '
                    f'stroke="{color}" stroke-width="1.5"/>')
        body.append(f'<rect x="{scale(q25):.1f}" y="{mid - 16:.1f}" width="{max(scale(q75) - scale(q25), 1.5):.1f}" '
                    f'height="32" fill="{color}" fill-opacity="0.18" stroke="{color}"/>')
        for i, v in enumerate(lat.runs_ms):
            jitter = ((i * 0.6180339887) % 1.0 - 0.5) * 24
            outside = v > hi
            body.append(f'<circle cx="{scale(v):.1f}" cy="{mid + jitter:.1f}" r="2.6" fill="{color}" '
                        f'fill-opacity="{0.9 if outside else 0.55}"><title>run {i + 1}: {v:.3f} ms</title></circle>')
        body.append(f'<g><title>{label}: median {lat.median_ms:.3f} ms</title>'
                    f'<line x1="{scale(lat.median_ms):.1f}" y1="{mid - 20:.1f}" x2="{scale(lat.median_ms):.1f}" '
                    f'y2="{mid + 20:.1f}" stroke="{color}" stroke-width="3.5"/></g>')
        body.append(f'<g><title>{label}: p90 {lat.p90_ms:.3f} ms</title>'
                    f'<line x1="{scale(lat.p90_ms):.1f}" y1="{mid - 12:.1f}" x2="{scale(lat.p90_ms):.1f}" '
                    f'y2="{mid + 12:.1f}" stroke="{color}" stroke-width="1.5" stroke-dasharray="3 2"/></g>')
        note = f"median {lat.median_ms:.3f} ms · p90 {lat.p90_ms:.3f} ms"
        beyond = int((runs > hi).sum())
        if beyond:
            note += f" · {beyond} run{'s' if beyond > 1 else ''} beyond {hi:g} ms (drawn at the edge)"
        body.append(_text(left, mid - 22, note, size=11, fill=MUTED))
    return _svg(width, bottom + 46, body, "latency distribution of both models")


def run_sequence_chart(speed: Speed) -> str:
    """Latency in run order, both models: shows drift, and that A/B alternation spread it evenly."""
    width, left, right = 960, 60, 930
    top, bottom = 44, 254
    runs = speed.runs
    ticks = nice_ticks(0.0, _clip(speed), 5)
    hi = ticks[-1]
    xticks = [t for t in nice_ticks(1, max(runs, 2), 8) if 1 <= t <= runs] or [1.0]

    def sx(i: float) -> float:
        return left + (i - 1) / max(runs - 1, 1) * (right - left)

    def sy(v: float) -> float:
        return bottom - min(v, hi) / hi * (bottom - top)

    body = [_text(0, 16, "Latency in run order (the two models alternate A B B A)", size=14, weight="600")]
    _legend(body, 0, 36, [(FLOAT_COLOR, "float"), (QUANT_COLOR, "quantized")])
    for t in ticks:
        body.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{right}" y2="{sy(t):.1f}" stroke="{GRID}"/>')
        body.append(_text(left - 6, sy(t) + 4, _fmt(t), anchor="end", size=11, fill=MUTED))
    for t in xticks:
        body.append(_text(sx(t), bottom + 16, f"{t:g}", anchor="middle", size=11, fill=MUTED))
    body.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="{AXIS}"/>')
    body.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="{AXIS}"/>')
    body.append(_text((left + right) / 2, bottom + 36, "timed run", anchor="middle"))
    body.append(f'<text x="14" y="{(top + bottom) / 2:.1f}" font-size="12" fill="{AXIS}" text-anchor="middle" '
                f'transform="rotate(-90 14 {(top + bottom) / 2:.1f})">ms</text>')
    for lat, color in ((speed.float, FLOAT_COLOR), (speed.quantized, QUANT_COLOR)):
        points = " ".join(f"{sx(i + 1):.1f},{sy(v):.1f}" for i, v in enumerate(lat.runs_ms))
        body.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.2" '
                    'stroke-opacity="0.6"/>')
        for i, v in enumerate(lat.runs_ms):
            body.append(f'<circle cx="{sx(i + 1):.1f}" cy="{sy(v):.1f}" r="2.2" fill="{color}">'
                        f"<title>run {i + 1}: {v:.3f} ms</title></circle>")
    return _svg(width, bottom + 46, body, "latency per run")


DTYPE_COLORS = {
    "float32": "#8a94a6", "float64": "#64748b", "float16": "#a5b4fc", "bfloat16": "#c4b5fd",
    "int8": "#2563eb", "uint8": "#60a5fa", "int16": "#0891b2", "uint16": "#22d3ee",
    "int32": "#7c3aed", "int64": "#a855f7", "int4": "#1e3a8a", "uint4": "#3b82f6",
}
OTHER_COLORS = ["#f472b6", "#fb923c", "#84cc16", "#14b8a6", "#e879f9"]


def size_chart(float_size: ModelSize, quantized_size: ModelSize) -> str:
    """File size of each model as a stacked bar: weight bytes by dtype, then the rest (graph)."""
    from qcli.render import human_bytes

    width, left, right = 960, 110, 840
    top, row = 58, 44
    bottom = top + 2 * row
    hi = max(float_size.file_bytes, quantized_size.file_bytes, 1)
    dtypes = sorted(set(float_size.weights) | set(quantized_size.weights), key=lambda d: -max(
        float_size.weights[d].bytes if d in float_size.weights else 0,
        quantized_size.weights[d].bytes if d in quantized_size.weights else 0))
    colors = {d: DTYPE_COLORS.get(d) or OTHER_COLORS[i % len(OTHER_COLORS)] for i, d in enumerate(dtypes)}

    def scale(v: float) -> float:
        return left + v / hi * (right - left)

    body = [_text(0, 16, "File size, split into weights by type and the rest of the file", size=14, weight="600")]
    _legend(body, 0, 38, [(colors[d], d) for d in dtypes] + [("#e5e7eb", "graph and other")])
    for k, (label, size) in enumerate((("float", float_size), ("quantized", quantized_size))):
        y = top + k * row
        body.append(_text(left - 10, y + 22, label, anchor="end", size=13, weight="600"))
        x: float = left
        for d in dtypes:
            if d not in size.weights or not size.weights[d].bytes:
                continue
            w = size.weights[d].bytes / hi * (right - left)
            body.append(f'<rect x="{x:.1f}" y="{y + 6}" width="{max(w, 0.5):.1f}" height="26" fill="{colors[d]}">'
                        f"<title>{escape(d)}: {size.weights[d].count:,} values, "
                        f"{human_bytes(size.weights[d].bytes)}</title></rect>")
            x += w
        rest = max(size.file_bytes - size.weight_bytes, 0)
        if rest:
            w = rest / hi * (right - left)
            body.append(f'<rect x="{x:.1f}" y="{y + 6}" width="{max(w, 0.5):.1f}" height="26" fill="#e5e7eb">'
                        f'<title>graph and other: {human_bytes(rest)}</title></rect>')
            x += w
        body.append(_text(x + 8, y + 24, human_bytes(size.file_bytes), size=12, weight="600"))
    body.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="{AXIS}"/>')
    return _svg(width, bottom + 8, body, "model file sizes")


HEAT = (220, 38, 38)  # the hottest cell (POOR); zero is white
NO_COST = "#f3f4f6"  # a measure at or below zero: costs nothing (or helps)
NOT_MEASURED = "#e5e7eb"


def heat(value: float | None, top: float) -> str:
    """Cell colour: white to red as `value` goes from 0 to `top` (square root, so small costs
    show); grey at or below 0, darker grey when not measured.

    >>> heat(1.0, 1.0), heat(0.0, 1.0), heat(None, 1.0)
    ('#dc2626', '#f3f4f6', '#e5e7eb')
    """
    if value is None:
        return NOT_MEASURED
    if value <= 0 or top <= 0:
        return NO_COST
    t = math.sqrt(min(value / top, 1.0))
    return "#" + "".join(f"{round(255 + t * (c - 255)):02x}" for c in HEAT)


def sensitivity_heatmap(sens: Sensitivity, measures: tuple[tuple[str, str], ...]) -> str:
    """Units (rows, by rank) x measures (columns, `(title, field)`): each cell coloured by its
    value against its column's largest, with the value written in it and the exact figures
    as a tooltip."""
    from qcli.analyze.summary import measure_text

    width, row, label_w, op_w = 960, 20, 330, 90
    left = label_w + op_w + 10
    cell = (width - left) // len(measures)
    top = 62
    bottom = top + row * len(sens.units)
    tops = {f: max([getattr(u, f) or 0.0 for u in sens.units] + [0.0]) for _, f in measures}
    body = [_text(0, 16, "Sensitivity of each unit (by rank; redder costs more)", size=14, weight="600")]
    _legend(body, 0, 36, [(heat(1.0, 1.0), "the column's largest"), (heat(0.1, 1.0), "a tenth of it"),
                          (NO_COST, "none (or it helps)"), (NOT_MEASURED, "not measured")])
    body.append(_text(label_w, top - 6, "unit", anchor="end", size=11, fill=MUTED, weight="600"))
    for k, (title, _) in enumerate(measures):
        body.append(_text(left + k * cell + cell / 2, top - 6, title, anchor="middle", size=11, fill=MUTED,
                          weight="600"))
    for i, u in enumerate(sens.units):
        y = top + i * row
        rank = f"#{u.rank}" if u.rank else "–"
        body.append(_text(label_w, y + 14, f"{rank} {_shorten(u.node, 44)}", anchor="end", size=11, style=MONO))
        body.append(_text(label_w + 10, y + 14, _shorten(u.op_type, 14), size=11, fill=MUTED))
        for k, (title, f) in enumerate(measures):
            value = getattr(u, f)
            x = left + k * cell
            tip = f"{u.node} ({u.op_type}, {u.precision})\n{title}: {measure_text(f, value)}"
            body.append(f"<g><title>{escape(tip)}</title>"
                        f'<rect x="{x + 1}" y="{y + 1}" width="{cell - 2}" height="{row - 2}" '
                        f'fill="{heat(value, tops[f])}"/>')
            dark = value is not None and tops[f] > 0 and value / tops[f] > 0.45
            body.append(_text(x + cell / 2, y + 14, measure_text(f, value), anchor="middle", size=11,
                              fill="#ffffff" if dark else AXIS) + "</g>")
    return _svg(width, bottom + 10, body, "per-unit sensitivity heat-map")
