"""Text from the whole of Unicode for the files the fuzzer writes (configs, pipeline files,
calibration files, labels.csv), issue 50: `strings` of any code point (C0 and C1 controls,
NUL, noncharacters, lone surrogates, byte order marks, line and paragraph separators), and
`garbled`, a file's text changed at the text level (such a string at any place, CRLF line
ends, tabs in the indentation, a UTF-8 or UTF-16 byte order mark, a very long line).

`refusal` is the oracle: from the bytes alone, where qcli must refuse the file (file:line:col:
the first bytes that are not UTF-8, else the first character YAML 1.1 refuses, by PyYAML's
own test), for every kind of text file alike."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import strategies as st

from fuzz_stats import STATS

# What editors, Windows-1252 pastes and binary files put in text, beside the random code points.
ODD = ("\x00", "\x01", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x80", "\x85", "\x99", "\x9f", "\xa0", "\u2028",
       "\ufeff", "\ufffe", "\uffff", "\ud800", "\udfff", "\U0010ffff", "\t", "\r", "\r\n", "\n", "é", "™")
CHANGES = ("odd string", "crlf", "tab indent", "utf-8 bom", "utf-16", "nul byte", "long line")


def strings(max_size: int = 6) -> st.SearchStrategy[str]:
    """Strings of any code point (surrogates too), often the ones in ODD."""
    anything = st.characters(exclude_categories=())
    return st.lists(st.one_of(anything, st.sampled_from(ODD)), min_size=1, max_size=max_size).map("".join)


def encode(text: str) -> bytes:
    """UTF-8, lone surrogates kept as the bytes they would be (not UTF-8: qcli must refuse them)."""
    return text.encode("utf-8", "surrogatepass")


@dataclass
class Garbled:
    """A file's bytes after `garbled`, and which of CHANGES made them."""

    data: bytes
    change: str


@st.composite
def garbled(draw, text: str) -> Garbled:
    """`text` changed one way (CHANGES) at the text level, as bytes."""
    change = draw(st.sampled_from(("odd string", "odd string", *CHANGES)))  # odd strings 3 in 9
    at = draw(st.integers(0, len(text)))
    if change == "odd string":
        text = text[:at] + draw(strings()) + text[at:]
    elif change == "crlf":
        text = text.replace("\n", "\r\n")
    elif change == "tab indent":
        text = re.sub(r"(?m)^(  )+", lambda m: "\t" * (len(m.group()) // 2), text)
    elif change == "nul byte":
        text = text[:at] + "\x00" + text[at:]
    elif change == "long line":
        text = text[:at] + draw(st.sampled_from("x #-é")) * draw(st.sampled_from([5_000, 150_000])) + text[at:]
    if change == "utf-8 bom":
        return Garbled(b"\xef\xbb\xbf" + encode(text), change)
    return Garbled(text.encode("utf-16") if change == "utf-16" else encode(text), change)


def decoded(data: bytes) -> str | None:
    """The text qcli reads from `data` (UTF-8, its byte order mark skipped), or None."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def refusal(data: bytes) -> tuple[str, str] | None:
    """Where (":line:col: ") and what ("U+0099", "UTF-16", "not UTF-8") qcli must refuse in a
    text file holding `data`, or None when it holds text qcli reads."""
    if data[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        return ":1:1: ", "UTF-32"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return ":1:1: ", "UTF-16"
    body = data.removeprefix(b"\xef\xbb\xbf")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = body[:exc.start].decode("utf-8")
        return _where(before, len(before)), f"byte 0x{body[exc.start]:02X} is not UTF-8"
    bad = yaml.reader.Reader.NON_PRINTABLE.search(text)
    return None if bad is None else (_where(text, bad.start()), f"U+{ord(bad.group()):04X}")


def _where(text: str, index: int) -> str:
    return f":{text.count(chr(10), 0, index) + 1}:{index - text.rfind(chr(10), 0, index)}: "


def refusal_problem(error: str | None, exit_code: int, path: Path, data: bytes) -> str | None:
    """Why a run on a text file holding `data` (at `path`) breaks the issue-50 property, or None:
    a file qcli must refuse exits 2 with an error naming path:line:col and the character."""
    expected = refusal(data)
    if expected is None:
        return None
    STATS.counts["refused texts"] += 1
    where, what = expected
    if exit_code != 2:
        return f"exit {exit_code} on a text file holding {what.split(' is')[0]} (expected exit 2)"
    if error is None or f"{path}{where}" not in error or what not in error:
        return f"a refused text file's error does not name <file>{where}{what}"
    return None


def shown(data: bytes) -> str:
    """`data` for a reproducer: line ends kept, every other unprintable character escaped."""
    text = data.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() or c == "\n" else ascii(c)[1:-1] for c in text)
