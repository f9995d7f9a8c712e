"""The report as GitHub-flavoured Markdown, sized for a pull-request comment: verdict, summary
table, gates, fidelity, worst layers; settings and notes folded away."""

from __future__ import annotations

from qcli.analyze import summary as s
from qcli.analyze.report import Report


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text and "`" not in text else _cell(text)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| " + " | ".join("---:" if i in right else "---" for i in range(len(header))) + " |")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def to_markdown(report: Report) -> str:
    f_name, q_name = s.name(report.float_model.path), s.name(report.quantized_model.path)
    mark = "✅" if report.passed else "❌"
    out = [f"## qcli analysis: `{f_name}` → `{q_name}`", ""]
    verdict = s.verdict(report)
    failed = [g.message for g in report.gates if not g.passed]
    out.append(f"{mark} **{verdict[0].upper() + verdict[1:]}**" + (": " + "; ".join(failed) if failed else ""))
    out.append("")
    d = report.data
    labels = f"{d.labelled} labelled" if d.labelled else "no labels"
    out.append(f"Data: `{s.name(d.path)}`, {d.samples} samples ({labels}"
               + (", with reference outputs" if d.reference_outputs else "") + ").")
    out.append("")
    out += _table(("", "float", "quantized", "change"), s.summary_rows(report), {1, 2, 3})

    if report.gates:
        out += ["### Gates", ""]
        rows = [(*r[:4], ("✅ pass" if r[4] == "pass" else "❌ FAIL")) for r in s.gate_rows(report)]
        out += _table(s.GATE_HEADER, rows, {2, 3})

    out += ["### Fidelity to the float model", ""]
    rows = [(_code(r[0]), *r[1:]) for r in map(s.fidelity_row, report.fidelity)]
    out += _table(s.FIDELITY_HEADER, rows, {2, 3, 4, 5, 6})
    if report.reference:
        out += ["### Against the reference outputs", ""]
        rows = []
        for ref in report.reference:
            for model, fid in (("float", ref.float), ("quantized", ref.quantized)):
                r = s.fidelity_row(fid)
                rows.append((_code(r[0]), model, *r[1:]))
        out += _table(("output", "model", *s.FIDELITY_HEADER[1:]), rows, {3, 4, 5, 6, 7})

    layers = report.layers
    if layers is not None and layers.tensors:
        worst = report.worst_layers()
        out += [f"### Worst layers ({len(worst)} of {len(layers.tensors)} quantized activations, by SQNR)", ""]
        rows = [(r[0], _code(r[1]), _code(r[2]), *r[3:]) for r in s.layer_rows(worst)]
        out += _table(s.LAYER_HEADER, rows, {0, 5, 6})
        if layers.skipped:
            out += [f"Not measured: {len(layers.skipped)} tensor(s) ({'; '.join(layers.skipped[:3])}"
                    + (", ..." if len(layers.skipped) > 3 else "") + ").", ""]

    sens = report.sensitivity
    if sens is not None:
        shown = sens.units[: report.settings.worst]
        out += [f"### Sensitivity ({len(shown)} of {len(sens.units)} units, most sensitive first)", "",
                s.sensitivity_text(sens) + ".", ""]
        rows = [(r[0], _code(r[1]), *r[2:]) for r in s.sensitivity_rows(sens)[: len(shown)]]
        out += _table(s.SENSITIVITY_HEADER, rows, {0, 3, 4, 5, 6, 7})
        out += [f"Note: {n}" for n in sens.notes] + ([""] if sens.notes else [])

    out += ["<details><summary>Settings and notes</summary>", ""]
    out.append(f"- float model: `{report.float_model.path}` ({report.float_model.fingerprint[:19]}…)")
    out.append(f"- quantized model: `{report.quantized_model.path}` ({report.quantized_model.fingerprint[:19]}…)")
    out.append(f"- data: `{d.path}`" + (f", labels from `{d.labels_file}`" if d.labels_file else ""))
    out.append(f"- {s.settings_text(report)}")
    out += [f"- note: {n}" for n in report.notes]
    out += ["", f"qcli {report.qcli_version} · `{report.format}`", "", "</details>", ""]
    return "\n".join(out)
