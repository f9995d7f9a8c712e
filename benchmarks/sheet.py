"""The benchmarks' output: a `Sheet` records a table's title, columns, rows and notes once and
renders it to the rich console and to GitHub-flavoured Markdown; a `Page` prints sheets and
summary lines and, with `--markdown FILE`, writes them to FILE (atomically) under one line
saying what wrote it and where.

    page = bench_page(args.markdown, f"{args.runs} timed runs")
    sheet = Sheet("title", ["model", ("ratio", "right")])
    sheet.add_row("cnn", "[green]0.93x[/green]")   # rich markup: styled on the console, plain in Markdown
    page.table(sheet)
    page.line("1 of 1 within 10%")
    page.write()
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"  # where the docs read each script's Markdown
THREADS = 2  # intra-op threads of the benchmarks' timed sessions, said in the machine line by default

Justify = Literal["left", "center", "right"]
RULES = {"left": "---", "center": ":---:", "right": "---:"}  # Markdown's alignment row


class Column(NamedTuple):
    name: str
    justify: Justify = "left"
    no_wrap: bool = False


class Sheet:
    """A table recorded once (cells may hold rich markup and newlines), shown as a rich Table or
    written as a Markdown table; `notes` are plain lines shown under it."""

    def __init__(self, title: str, columns: Iterable[str | tuple]):
        self.title = title
        self.columns = [Column(c) if isinstance(c, str) else Column(*c) for c in columns]
        self.rows: list[list[str]] = []
        self.section_ends: set[int] = set()  # indexes of the rows a rule follows on the console
        self.notes: list[str] = []

    def add_row(self, *cells: str, end_section: bool = False) -> None:
        if len(cells) > len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns in {self.title!r}")
        self.rows.append([*cells, *[""] * (len(self.columns) - len(cells))])
        if end_section:
            self.add_section()

    def add_section(self) -> None:
        if self.rows:
            self.section_ends.add(len(self.rows) - 1)

    def rich(self):
        from rich.table import Table

        table = Table(title=self.title, title_justify="left")
        for column in self.columns:
            table.add_column(column.name, justify=column.justify, no_wrap=column.no_wrap)
        for i, row in enumerate(self.rows):
            table.add_row(*row, end_section=i in self.section_ends)
        return table

    def markdown(self) -> str:
        """A heading, the table, and the notes as a list.

        >>> sheet = Sheet("speed", ["model", ("ratio", "right")])
        >>> sheet.add_row("cnn | b1", "[red]1.20x[/red]\\n(2 runs)")
        >>> sheet.notes.append("<b> is bold")
        >>> print(sheet.markdown())
        ### speed
        <BLANKLINE>
        | model | ratio |
        | --- | ---: |
        | cnn \\| b1 | 1.20x<br>(2 runs) |
        <BLANKLINE>
        - &lt;b> is bold
        """
        lines = [f"### {plain(self.title)}", ""]
        lines.append("| " + " | ".join(cell(c.name) for c in self.columns) + " |")
        lines.append("| " + " | ".join(RULES[c.justify] for c in self.columns) + " |")
        lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in self.rows]
        if self.notes:
            lines += ["", *(f"- {escape(note)}" for note in self.notes)]
        return "\n".join(lines)


def plain(text: str) -> str:
    """`text` without its rich markup (as it reads on the console); as it is when it is no markup."""
    from rich.errors import MarkupError
    from rich.text import Text

    try:
        return Text.from_markup(text).plain
    except MarkupError:
        return text


def escape(text: str) -> str:
    """Plain text made safe in Markdown: nothing read as an HTML tag (`<=` stays).

    >>> escape("<class 'X'> <= 2")
    "&lt;class 'X'> <= 2"
    """
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def cell(text: str) -> str:
    """A Markdown table cell: plain, pipes escaped, lines joined by <br>."""
    return "<br>".join(escape(line).replace("|", "\\|") for line in plain(text).strip().splitlines())


class Page:
    """What a benchmark shows: progress on the console only (`print`), sheets and summary lines
    on the console and in the Markdown file, if one was asked for (`write`)."""

    def __init__(self, markdown: Path | None, setting: str = "", width: int = 160):
        import onnxruntime
        from rich.console import Console

        onnxruntime.set_default_logger_severity(3)
        self.console = Console(highlight=False, width=max(shutil.get_terminal_size((width, 24)).columns, width))
        self.path = markdown
        self.blocks = [header(setting)]

    def print(self, *objects, **options) -> None:
        """Console only: progress, timings of steps."""
        self.console.print(*objects, **options)

    def table(self, sheet: Sheet) -> None:
        self.console.print(sheet.rich())
        for note in sheet.notes:
            self.console.print("  " + note, markup=False)
        self.blocks.append(sheet.markdown())

    def line(self, text: str) -> None:
        """A summary line (rich markup allowed), on the console and in the Markdown."""
        self.console.print(text)
        self.blocks.append(escape(plain(text)))

    def write(self) -> None:
        """The Markdown file, when `--markdown` gave one; said on the console."""
        if self.path is None:
            return
        from qcli.files import write_text_atomic

        write_text_atomic(self.path, "\n\n".join(self.blocks) + "\n")
        self.console.print(f"wrote {self.path}", markup=False)


def bench_page(markdown: Path | None, setting: str = "", width: int = 160, threads: int | None = THREADS) -> Page:
    """A page on a console at least `width` wide, onnxruntime's logging quieted, after the machine
    line every benchmark starts with (onnxruntime version, CPUs, `threads` unless None, `setting`,
    load average); the Markdown's first line says the same."""
    import onnxruntime

    setting = ", ".join(part for part in (f"{threads} intra-op threads" if threads else "", setting) if part)
    page = Page(markdown, setting, width)
    page.print(f"onnxruntime {onnxruntime.__version__}, {os.cpu_count()} CPUs, "
               + (f"{setting}, " if setting else "") + f"load average {os.getloadavg()[0]:.1f}")
    return page


def header(setting: str = "") -> str:
    """The Markdown file's first line: the command, the day, the machine and the versions."""
    import onnxruntime

    import qcli

    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    command = shlex.join(["python", str(shown), *sys.argv[1:]])
    return (f"Written by `{command}` on {datetime.date.today().isoformat()}, {cpu_model()} ({os.cpu_count()} "
            f"cores), onnxruntime {onnxruntime.__version__}, qcli {qcli.__version__}{commit()}"
            + (f"; {setting}" if setting else "") + f"; load average {os.getloadavg()[0]:.1f} at the start.")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def commit() -> str:
    """` (commit abc1234)`, `+ changes` when the checkout's files differ from it (the results
    folder aside: `make bench` rewrites it as it goes); nothing outside git."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      f":(exclude){RESULTS.relative_to(ROOT)}").stdout.strip()
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return f" (commit {head.stdout.strip()}" + (" + changes" if changed else "") + ")"


def add_markdown_option(parser: argparse.ArgumentParser, script: str) -> None:
    """`--markdown [FILE]`: the tables also as Markdown in FILE (default: benchmarks/results/<script>.md,
    the docs' copy), checked writable before the benchmark runs."""
    name = Path(script).stem

    def writable(value: str) -> Path:
        from qcli.errors import QcliError
        from qcli.files import check_writable

        try:
            return check_writable(value, "the Markdown tables")
        except QcliError as exc:
            raise argparse.ArgumentTypeError(exc.message) from exc

    parser.add_argument("--markdown", nargs="?", type=writable, const=RESULTS / f"{name}.md", metavar="FILE",
                        help=f"also write the tables as GitHub-flavoured Markdown to FILE (default: "
                             f"benchmarks/results/{name}.md)")
