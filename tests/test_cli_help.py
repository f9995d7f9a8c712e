"""`--help` names parameters as click does: flags take no value, arguments by name (MODEL)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from qcli.cli import app


def help_text(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_quantize_help_shows_flags_without_a_value_and_the_argument_by_name() -> None:
    text = help_text("quantize")
    assert re.search(r"Usage: .*quantize \[OPTIONS\] MODEL\s*$", text, re.MULTILINE)
    assert "{model}" not in text and "<bool>" not in text
    assert re.search(r"\bMODEL\s+<path>\s+Float ONNX model file", text)
    for flag in ("--json", "--force", "--no-verify", "--auto-precision"):
        line = next(row for row in text.splitlines() if f" {flag} " in row)
        assert re.search(rf"{flag}\s{{2,}}[A-Z]", line), line  # straight on to its help text
    assert re.search(r"--output\s+-o\s+<path>", text)  # an option that takes a value still says so


def test_group_and_subgroup_help() -> None:
    assert "<bool>" not in help_text()  # --version, --help
    assert re.search(r"Usage: .*validate \[OPTIONS\] FILE\s*$", help_text("config", "validate"), re.MULTILINE)
    assert re.search(r"Usage: .*analyze \[OPTIONS\] MODEL QUANTIZED\s*$", help_text("analyze"), re.MULTILINE)
