"""Write a report in the format its file extension names, atomically (temp file, then rename)."""

from __future__ import annotations

import os
from pathlib import Path

from qcli.analyze.report import Report
from qcli.errors import QcliError
from qcli.files import write_text_atomic

FORMATS = (".json", ".md", ".html")


def report_text(report: Report, suffix: str) -> str:
    """The report as the text of a `.json`, `.md` or `.html` file."""
    suffix = suffix.lower()
    if suffix == ".json":
        return report.to_json()
    if suffix == ".md":
        from qcli.analyze.markdown import to_markdown

        return to_markdown(report)
    if suffix == ".html":
        from qcli.analyze.htmlpage import to_html

        return to_html(report)
    raise QcliError(
        f"cannot write a report as {suffix or 'a file without extension'!r}",
        hint="name the report file .json, .md or .html",
    )


def write_report(report: Report, path: str | os.PathLike) -> Path:
    """Write `report` to `path` (.json, .md or .html); a crash never leaves a half-written file."""
    path = Path(path)
    text = report_text(report, path.suffix)
    if path.is_dir():
        raise QcliError(f"{path} is a folder", hint="give the report a file name ending in .json, .md or .html")
    write_text_atomic(path, text)  # an OSError comes out as OutputError, naming the path
    return path
