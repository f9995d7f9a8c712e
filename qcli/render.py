"""Rich renderings of the reports the library returns (dicts), for people at a terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qcli.phases import peak_phase


def plain(doc: Any) -> Any:
    """`doc` with every string (dict keys too) escaped for rich markup.

    The reports hold names from models and data (shapes such as "[batch, seq]", tensor and
    node names, paths, messages) that rich would otherwise read as markup tags: swallowed,
    or a MarkupError for one such as "[/x]". Each renderer escapes its whole document once,
    so its own markup is the only markup printed.
    """
    if isinstance(doc, str):
        return escape(doc)
    if isinstance(doc, dict):
        return {plain(k): plain(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return type(doc)(plain(v) for v in doc)
    return doc


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def size_change(compression: float) -> str:
    """A size change from `compression` (bytes before / bytes after), in words: a file that grew
    is "larger", never "0.87x smaller".

    >>> size_change(3.2), size_change(0.87)
    ('3.20x smaller', '1.15x larger')
    """
    if 0 < compression < 1:
        return f"{1 / compression:.2f}x larger"
    return f"{compression:.2f}x smaller"


def _shape(dims: list) -> str:
    """A shape for a rich cell, e.g. [batch, 3]: the opening bracket escaped (the dims come
    escaped from `plain`)."""
    return "\\[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def model_info(console: Console, info: dict) -> None:
    info = plain(info)
    console.print(f"[bold]{info['path']}[/bold]  {human_bytes(info['file_bytes'])}")
    opsets = ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
    console.print(f"IR {info['ir_version']} · opset {opsets} · producer {info['producer'] or '-'}")
    console.print(f"fingerprint {info['fingerprint']}")

    io = Table(title="Inputs and outputs", title_justify="left")
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind in ("inputs", "outputs"):
        for v in info[kind]:
            io.add_row(kind[:-1], v["name"], v["dtype"], "–" if v["shape"] is None else _shape(v["shape"]))
    console.print(io)

    ops = Table(title=f"Op types ({info['nodes']} nodes)", title_justify="left")
    ops.add_column("op type")
    ops.add_column("count", justify="right")
    for op, count in info["op_types"].items():
        ops.add_row(op, str(count))
    console.print(ops)

    w = info["weights"]
    console.print(
        f"weights: {w['parameters']:,} parameters, {human_bytes(w['bytes'])} in "
        f"{w['initializers']} initializers, {w['constant_nodes']} Constant and "
        f"{w['constant_of_shape_nodes']} ConstantOfShape nodes"
    )
    weights = Table()
    for col in ("dtype", "parameters", "bytes"):
        weights.add_column(col, justify="left" if col == "dtype" else "right")
    for dtype, row in w["by_dtype"].items():
        weights.add_row(dtype, f"{row['parameters']:,}", human_bytes(row["bytes"]))
    console.print(weights)

    for e in info["external_data"]:
        console.print(f"external data: {e['file']} ({human_bytes(e['bytes'])})")
    for s in info["subgraphs"]:
        console.print(f"subgraph: {s['owner']} ({s['nodes']} nodes)")


def data_info(console: Console, data: dict) -> None:
    data = plain(data)
    labels = f"{data['labelled']} labelled" if data["labelled"] else "no labels"
    console.print(
        f"data {data['path']}: {data['samples']} samples in {data['files']} "
        f"{data['layout']} file(s), {labels}, all valid for the model"
    )
    table = Table(title="Sample shapes (after the batch axis)", title_justify="left")
    table.add_column("inputs")
    table.add_column("samples", justify="right")
    for shape, count in data["shapes"].items():
        table.add_row(shape, str(count))
    console.print(table)
    if data["classes"]:
        names = data["class_names"]
        console.print(
            "classes: "
            + ", ".join(
                f"{names[int(k)] if k.isdigit() and int(k) < len(names) else k}={v}"
                for k, v in data["classes"].items()
            )
        )


def _speed_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Speed(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed:.1f} {task.fields.get('unit', 'samples')}/s" if task.speed else "")

    return Speed()


class progress_bar:
    """A rich progress bar on stderr (samples, samples/s, ETA); a no-op when quiet.

    >>> with progress_bar("calibrating", total=512) as advance: advance(8)
    """

    def __init__(self, description: str, total: int | None, quiet: bool = False, unit: str = "samples"):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        self.quiet = quiet or not console.is_terminal  # no bar in logs and pipes
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _speed_column(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=self.quiet,
        )
        self.description, self.total, self.unit = description, total, unit

    def __enter__(self):
        self.progress.start()
        task = self.progress.add_task(self.description, total=self.total, unit=self.unit)
        return lambda n: self.progress.advance(task, n)

    def __exit__(self, *exc) -> None:
        self.progress.stop()


def num(x: float) -> str:
    """Compact number: 3 significant digits, exponent only when far from 1."""
    if x == 0:
        return "0"
    return f"{x:.3g}" if 0.01 <= abs(x) < 1000 else f"{x:.2e}"


def calibration(console: Console, doc: dict, rows: int = 30) -> None:
    from rich import box

    doc = plain(doc)
    method = doc["method"]
    console.print(
        f"Calibration: {doc['tensors']} tensors over {doc['samples']} samples; ranges for "
        f"{doc['activations']} activations ({method} is selected)"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("tensor", overflow="fold", min_width=16)
    ranges = list(doc["ranges"].items())
    solved = [m for m in ("minmax", "percentile", "kl", "mse") if ranges and m in ranges[0][1]]
    for m in solved:
        table.add_column(m + ("*" if m == method else ""), justify="right")
    table.add_column("clip*", justify="right")
    for name, t in ranges[:rows]:
        table.add_row(name, *(f"{num(t[m][0])}…{num(t[m][1])}" for m in solved), f"{100 * t['clipped']:.3f}%")
    console.print(table)
    if len(doc["ranges"]) > rows:
        console.print(f"... {len(doc['ranges']) - rows} more tensors in {doc['calibration_file']} (all with --json)")
    for warning in doc["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    rate = doc["samples"] / max(doc["seconds"], 1e-9)
    console.print(f"wrote {doc['calibration_file']} ({doc['seconds']:.1f} s, {rate:.0f} samples/s)")
    if doc.get("trt_cache"):
        console.print(f"wrote {doc['trt_cache']} (TensorRT calibration cache, {doc['tensors']} tensors)")


def _counts(counts: dict[str, int]) -> str:
    """`{"uint8": 40, "int16": 2}` -> "uint8 x40, int16 x2"."""
    return ", ".join(f"{k} x{n}" for k, n in counts.items())


def quantization(console: Console, doc: dict) -> None:
    from rich import box

    doc = plain(doc)
    for note in doc["notes"]:  # what preparation changed, plan notes, warnings, verification notes
        console.print(note)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Nodes", title_justify="left")
    table.add_column("op type")
    table.add_column("count", justify="right")
    table.add_column("precision")
    table.add_column("why float", overflow="fold")
    for op, n in doc["quantized"].items():
        for precision, count in (doc.get("precisions", {}).get(op) or {"int8": n}).items():
            table.add_row(op, str(count), precision, "")
    for op, n in doc["folded"].items():
        table.add_row(op, str(n), "folded", "")
    for op, n in doc.get("half", {}).get("nodes", {}).items():
        table.add_row(op, str(n), doc["half"]["type"], "")
    for row in doc["float"]:
        table.add_row(row["op_type"], str(row["count"]), "float", row["reason"])
    console.print(table)
    smoothquant(console, doc.get("recovery", {}).get("smoothquant", []))
    awq(console, doc.get("recovery", {}).get("awq", []))
    rounding(console, doc.get("recovery", {}).get("adaround") or doc.get("recovery", {}).get("seq_mse"))
    half = doc.get("half", {}).get("type", "float")
    console.print(
        f"activations: {_counts(doc['activations']) or half}; weights: {_counts(doc['weights']) or half}; "
        f"ranges by {doc['method']}"
    )
    left = doc.get("float_weights") or {}
    if left.get("bytes"):
        console.print(f"weights left float: {human_bytes(left['bytes'])} ({left['share']:.0%} of the weights): "
                      + "; ".join(f"{w['tensors']} read by {w['reason']}" if not w["reason"].startswith("inside")
                                  else f"{w['tensors']} {w['reason']}" for w in left["why"][:3])
                      + ("; ..." if len(left["why"]) > 3 else ""))
    console.print(
        f"wrote {doc['output']}: {human_bytes(doc['bytes_before'])} -> {human_bytes(doc['bytes_after'])} "
        f"({size_change(doc['compression'])})"
    )
    if doc.get("phases"):
        console.print(f"time: {phase_line(doc['phases'])} (all phases with --json)")


def phase_line(phases: dict[str, dict]) -> str:
    """The outermost phases, their total and the peak memory and where it was reached, e.g.
    "calibrate 1.2 s, verify 3.0 s; 4.2 s in all, peak 512 MB (verify)".

    >>> phase_line({"calibrate": {"seconds": 1.24, "calls": 1, "peak_mb": 300.0},
    ...             "calibrate/solve": {"seconds": 1.0, "calls": 1, "peak_mb": 300.0},
    ...             "verify": {"seconds": 3.0, "calls": 1, "peak_mb": 512.4}})
    'calibrate 1.2 s, verify 3.0 s; 4.2 s in all, peak 512 MB (verify)'
    """
    top = {p: v["seconds"] for p, v in phases.items() if "/" not in p}
    line = ", ".join(f"{p} {s:.1f} s" for p, s in top.items()) + f"; {sum(top.values()):.1f} s in all"
    peak = peak_phase({p: v for p, v in phases.items() if "/" not in p})
    if peak is not None:
        line += f", peak {peak[1]:.0f} MB ({peak[0]})"
    return line


SMOOTHED_ROWS = 12


def smoothquant(console: Console, layers: list[dict]) -> None:
    """SmoothQuant's targets: the activation, its readers, alpha, where 1/s went, and the
    readers' output SQNR before/after on the calibration rows it measured."""
    _scaled(console, "SmoothQuant", layers, "SQNR dB before -> after", lambda layer: (
        "" if layer["sqnr_before"] is None else f"{layer['sqnr_before']:.1f} -> {layer['sqnr_after']:.1f}"))


def awq(console: Console, layers: list[dict]) -> None:
    """AWQ's targets: the activation, its readers, alpha, where 1/s went, and how much less the
    readers' rounding error at their outputs is than round-to-nearest's."""
    _scaled(console, "AWQ", layers, "error vs RTN", lambda layer: (
        "" if layer["gain_db"] is None else f"-{layer['gain_db']:.2f} dB"))


def rounding(console: Console, done: dict | None) -> None:
    """seq_mse's and AdaRound's weights (qcli.recovery.rounding): the SMOOTHED_ROWS with the
    lowest output SQNR after, each before -> after, and the means."""
    from rich import box

    if not done or not done["weights"]:
        return
    title = " + ".join({"seq_mse": "seq_mse", "adaround": "AdaRound"}[s] for s in done["steps"])
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    table.add_column("weight", overflow="fold")
    table.add_column("layer output SQNR dB, nearest -> chosen", justify="right")
    worst = sorted(done["sqnr_db"].items(), key=lambda item: (item[1][1], item[0]))
    for name, (before, after) in worst[:SMOOTHED_ROWS]:
        why = done.get("nearest", {}).get(name)
        table.add_row(name + (f" (nearest: {why})" if why else ""),
                      f"{before:.1f} -> {after:.1f}")
    console.print(table)
    before, after = done["mean_sqnr_db"]
    more = len(worst) - SMOOTHED_ROWS
    console.print(f"{done['weights']} weight(s), mean SQNR {before:.1f} -> {after:.1f} dB on the calibration data"
                  + (f"; ... {more} more (all with --json)" if more > 0 else ""))


def _scaled(console: Console, title: str, layers: list[dict], last: str, cell: Callable[[dict], str]) -> None:
    """A table of the activations a step scaled (SmoothQuant's, AWQ's), the first SMOOTHED_ROWS."""
    from rich import box

    if not layers:
        return
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for column in ("activation", "readers", "alpha", "1/s into", last):
        table.add_column(column, overflow="fold")
    for layer in layers[:SMOOTHED_ROWS]:
        table.add_row(layer["tensor"], ", ".join(layer["readers"]),
                      "off" if layer["alpha"] is None else f"{layer['alpha']:g}", layer["into"], cell(layer))
    console.print(table)
    if len(layers) > SMOOTHED_ROWS:
        console.print(f"... {len(layers) - SMOOTHED_ROWS} more scaled activations (all with --json)")


PROMOTED_ROWS = 12


def verification(console: Console, doc: dict) -> None:
    """The verification checks and what the precision search promoted, if anything."""
    from rich import box

    doc = plain(doc)
    v, p = doc.get("verification"), doc.get("precision")
    if p is not None:
        console.print(f"precision search: {p['trials']} trials, goal {'met' if p['goal_met'] else 'NOT met'}"
                      + (f" ({p['stopped']})" if p["stopped"] else ""))
        if p["promoted"]:
            table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Promoted", title_justify="left")
            table.add_column("node", overflow="fold")
            table.add_column("precision")
            table.add_column("why", overflow="fold")
            shown = list(p["promoted"].items())
            for node, info in shown[:PROMOTED_ROWS]:
                table.add_row(node, info["precision"], info["reason"])
            if len(shown) > PROMOTED_ROWS:
                table.add_row(f"... {len(shown) - PROMOTED_ROWS} more (--json lists all)", "", "")
            console.print(table)
        else:
            console.print("nothing promoted: every unit stays int8")
        if p["file"]:
            console.print(f"wrote {p['file']} (reproduces this model with --config, without searching)")
    if v is None:
        return
    console.print(f"verified against the float model on {v['samples']} samples: {v['data']}")
    output_kinds(console, v["outputs"])
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("check")
    table.add_column("output", overflow="fold")
    table.add_column("value", justify="right")
    table.add_column(f"{2 * v.get('confidence', 0.975) - 1:.0%} interval (samples)", justify="right")
    table.add_column("floor", justify="right")
    table.add_column("")
    for c in v["checks"]:
        sign = ">=" if c["kind"] == "at_least" else "<="
        within = f"{c['interval'][0]:.4f}-{c['interval'][1]:.4f} ({c['samples']})" if c.get("interval") else ""
        table.add_row(c["name"], c.get("output") or "", f"{c['value']:.4f}", within, f"{sign} {c['floor']:g}",
                      "[green]ok[/green]" if c["passed"] else "[bold red]missed[/bold red]")
    console.print(table)
    for c in v["checks"]:
        if c.get("interval") and c["interval"][0] < c["floor"] <= c["interval"][1] and c["value"] >= c["floor"]:
            console.print(f"{c['name']} of {c['output']}: {c['how']}")
        if (shows := c.get("shows")) and (shows["samples_needed"] or 0) > shows["samples"]:
            console.print(f"{c['name']} of {c['output']}: {shows['words']}")
    for note in v["notes"]:
        console.print(note)
    if v.get("target"):
        console.print(v["target"])
    if (m := v.get("measured_latency")) is not None:
        console.print(f"measured on this machine: latency ratio {m['ratio']:.3f} [{m['low']:.3f}, {m['high']:.3f}] "
                      f"over {m['rounds']} A/B rounds (reported, never decides)")


# The figures shown for each kind of output: (JSON key, label)
_DETAILS = {
    "top1": [("top1_agreement", "top-1 agreement"), ("top5_agreement", "in top 5"),
             ("predicted_agreement", "predicted"), ("cosine", "cosine")],
    "sequence": [("sequence_agreement", "sequences unchanged"), ("position_agreement", "positions"),
                 ("predicted_agreement", "predicted")],
    "mask": [("mask_iou", "mask IoU"), ("mask_agreement", "elements agree"), ("cosine", "cosine")],
    "cosine": [("cosine", "cosine"), ("sqnr_db", "SQNR dB")],
    "regression": [("relative_error", "relative error"), ("sqnr_db", "SQNR dB")],
    "map": [("map_iou", "top-region IoU"), ("psnr_db", "PSNR dB"), ("cosine", "cosine")],
    "boxes": [("box_f1", "boxes matched (F1)"), ("boxes", "float detections"), ("cosine", "cosine")],
    "per_element": [("agreement", "elements equal")],
    "ignore": [("cosine", "cosine"), ("sqnr_db", "SQNR dB")],
    "tokens": [("perplexity_increase", "perplexity increase"), ("float_perplexity", "perplexity float"),
               ("perplexity", "quantized"), ("token_agreement", "next token agrees"), ("kl", "KL nats")],
}


def output_kinds(console: Console, outputs: list[dict]) -> None:
    """Each output: the metric it is judged by, why, and its figures; more than `GROUPED` outputs
    in a row that are not gated for one reason (a decoder's 48 `present.*`) on one line, with
    their lowest figures."""
    for group in _runs(outputs):
        if len(group) > GROUPED:
            lowest = {key: min(o[key] for o in group if o.get(key) is not None) for key in ("cosine", "sqnr_db")
                      if any(o.get(key) is not None for o in group)}
            figures = ", ".join(f"lowest {key.replace('_db', ' dB').replace('sqnr', 'SQNR')} {v:.4f}"
                                for key, v in lowest.items())
            console.print(f"outputs {group[0]['name']!r} to {group[-1]['name']!r} ({len(group)}): ignore (not gated), "
                          f"{group[0]['reason']}" + (f": {figures}" if figures else ""), markup=False)
            continue
        for o in group:
            figures = ", ".join(f"{label} {o[key]}" if isinstance(o[key], int) else f"{label} {o[key]:.4f}"
                                for key, label in _DETAILS.get(o["kind"], []) if o.get(key) is not None)
            gated = " (not gated)" if o["kind"] == "ignore" else ""
            console.print(f"output {o['name']!r}: {o['kind']}{gated}, {o['reason']}"
                          + (f": {figures}" if figures else ""))


GROUPED = 3  # outputs not gated for one reason, in a row, shown one by one; more: on one line


def _runs(outputs: list[dict]) -> list[list[dict]]:
    """`outputs` cut into runs: consecutive ignored outputs of one reason together, others alone.

    >>> [len(r) for r in _runs([{"kind": "tokens", "reason": "a"}] + [{"kind": "ignore", "reason": "b"}] * 4)]
    [1, 4]
    """
    runs: list[list[dict]] = []
    for o in outputs:
        last = runs[-1][-1] if runs else None
        if last is not None and o["kind"] == last["kind"] == "ignore" and last["reason"] == o["reason"]:
            runs[-1].append(o)
        else:
            runs.append([o])
    return runs


def target_profile(console: Console, doc: dict) -> None:
    """A target profile (`qcli target show`): its header, then one row per kernel entry."""
    console.print(f"[bold]{escape(doc['name'])}[/bold] ({doc['kind']}; {escape(doc['chosen'])})")
    for key in ("description", "basis"):
        if doc.get(key):
            console.print(escape(doc[key]))
    threads = doc.get("threads") or "onnxruntime's default"
    if c := doc.get("calibration"):
        console.print(escape(f"calibrated on {c['model']} at batch {c['batch']} from {c['base']}: float kernels "
                             f"x{c['factors']['float']:g}, int8 kernels x{c['factors']['int8']:g} (timed "
                             f"{c['measured_ms']['float']:g} ms and {c['measured_ms']['int8']:g} ms all int8; "
                             f"{c['base']} predicted {c['predicted_ms']['float']:g} and {c['predicted_ms']['int8']:g})"
                             + (f"; {c['note']}" if c.get("note") else "")))
    console.print(f"batch {doc.get('batch', 1)} · threads {threads} · per run {doc['run_us']:g} us · per kernel call "
                  f"{doc['node_us']:g} us"
                  + (f" · onnxruntime {doc['onnxruntime']}" if doc.get("onnxruntime") else "")
                  + (f" · CPU flags {', '.join(doc['cpu_flags'])}" if doc.get("cpu_flags") else ""))
    table = Table(title="us per call = sum of term x feature (qcli.target.kernels)", title_justify="left")
    for col in ("entry", "call", "per MAC", "channels padded to", "per byte moved", "per weight byte",
                "per fused elem", "per row"):
        table.add_column(col, justify="left" if col == "entry" else "right", no_wrap=col == "entry")
    for key, cost in doc["kernels"].items():
        if cost.get("like"):
            table.add_row(escape(key), f"like {escape(cost['like'])} x {cost.get('factor', 1.0):g}")
            continue
        terms = cost.get("terms", {})
        cells = [num(terms[f]) if f in terms else "-" for f in ("call", "mac", "moved", "weights", "fused", "rows")]
        pack = cost.get("pack")
        cells.insert(2, f"{pack[0]} in, {pack[1]} out" if pack else "-")
        table.add_row(escape(key), *cells)
    console.print(table)
    console.print(f"shipped profiles: {', '.join(doc['shipped'])}")
