"""The report at a terminal: rich tables for the summary, gates, fidelity and the worst layers."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qcli.analyze import summary as s
from qcli.analyze.report import Report


def _table(title: str, header: tuple[str, ...], right: set[int]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(header):
        table.add_column(col, justify="right" if i in right else "left", overflow="fold")
    return table


def render(console: Console, report: Report) -> None:
    """Print `report` to `console` (the CLI's; quiet consoles print nothing)."""
    d = report.data
    labels = f"{d.labelled} labelled" if d.labelled else "no labels"
    console.print(
        f"[bold]{escape(s.name(report.float_model.path))}[/bold] → "
        f"[bold]{escape(s.name(report.quantized_model.path))}[/bold] on {escape(d.path)}: {d.samples} samples ({labels}"
        + (", reference outputs" if d.reference_outputs else "") + ")"
    )
    summary = _table("Summary", ("", "float", "quantized", "change"), {1, 2, 3})
    for row in s.summary_rows(report):
        summary.add_row(*(escape(c.replace("`", "")) for c in row))
    console.print(summary)

    fidelity = _table("Fidelity to the float model", s.FIDELITY_HEADER, {2, 3, 4, 5, 6})
    for f in report.fidelity:
        fidelity.add_row(*map(escape, s.fidelity_row(f)))
    for ref in report.reference:
        for model, fid in (("float", ref.float), ("quantized", ref.quantized)):
            row = s.fidelity_row(fid)
            fidelity.add_row(*map(escape, (f"{row[0]} ({model} vs reference)", *row[1:])))
    console.print(fidelity)
    for f in report.fidelity:
        predicted = (f"; predicted agreement on unseen samples {f.predicted_agreement:.4f}"
                     if f.predicted_agreement is not None else "")
        console.print(escape(f"output {f.output!r}: {f.kind}, {f.reason}{predicted}"))

    layers = report.layers
    if layers is not None and layers.tensors:
        worst = report.worst_layers()
        # Narrow terminals: the node goes under its tensor, and only when the tensor's name does
        # not already say it (exporters name outputs "<node>_output_0"); dtype only when mixed.
        mixed = len({t.dtype for t in worst}) > 1
        header = ("#", "tensor", "op type", *(("dtype",) if mixed else ()), "SQNR", "max abs err")
        table = _table(f"Worst layers ({len(worst)} of {len(layers.tensors)}, by SQNR)", header,
                       {0, len(header) - 2, len(header) - 1})
        table.columns[1].min_width = 26
        for t, row in zip(worst, s.layer_rows(worst), strict=True):
            name = escape(t.tensor)
            if t.node and not t.tensor.startswith(t.node):
                name += f"\n[dim]node {escape(t.node)}[/dim]"
            table.add_row(row[0], name, escape(t.op_type), *((t.dtype,) if mixed else ()), row[5], row[6])
        console.print(table)
        for skipped in layers.skipped:
            console.print(f"[yellow]not measured:[/yellow] {escape(skipped)}", markup=True, highlight=False)

    if report.sensitivity is not None:
        _sensitivity(console, report)

    if report.gates:
        gates = _table("Gates", s.GATE_HEADER, {2, 3})
        for row, g in zip(s.gate_rows(report), report.gates, strict=True):
            gates.add_row(*map(escape, row[:4]), "[green]pass[/green]" if g.passed else "[bold red]FAIL[/bold red]")
        console.print(gates)
        for g in report.gates:
            style = "green" if g.passed else "bold red"
            console.print(f"[{style}]{'✓' if g.passed else '✗'}[/{style}] {escape(g.message)}", highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    if report.speed:
        console.print(f"[dim]{escape(s.settings_text(report))}[/dim]", highlight=False)


def _sensitivity(console: Console, report: Report) -> None:
    """The units by rank, what each costs alone and gains kept float; what was measured, and notes."""
    sens = report.sensitivity
    assert sens is not None
    # Narrow terminals: the op type goes under the unit's name.
    header = (s.SENSITIVITY_HEADER[0], "unit (op type)", *(h.replace(" ", "\n", 1) for h in s.SENSITIVITY_HEADER[3:]))
    table = _table("Sensitivity per unit (most sensitive first)", header, {0, 2, 3, 4, 5, 6})
    table.columns[1].min_width = 20
    for row in s.sensitivity_rows(sens):
        table.add_row(row[0], f"{escape(row[1])}\n[dim]{escape(row[2])}[/dim]", *map(escape, row[3:]))
    console.print(table)
    console.print(f"[dim]{escape(s.sensitivity_text(sens))}[/dim]", highlight=False)
    for note in sens.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
