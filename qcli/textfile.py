"""Reading the text files qcli is given (configs, pipeline files, calibration files, reports,
labels.csv), one way for all: UTF-8 (a UTF-8 byte order mark is skipped) holding only the
characters YAML 1.1 allows, the set PyYAML accepts (tab, line ends, printable Unicode). A
control character, a noncharacter or bytes that are not UTF-8 are refused before any parser
sees them, as the caller's QcliError (exit 2) naming file:line:col, the code point and what to
do: a parser's own exception for them would be reported as a bug in qcli (exit 3)."""

from __future__ import annotations

import re
from pathlib import Path

from qcli.errors import ConfigError, QcliError

# What YAML 1.1 refuses (PyYAML's Reader.NON_PRINTABLE): all but tab, LF, CR, printable ASCII,
# NEL (U+0085) and the printable rest of Unicode (no surrogates, no U+FFFE or U+FFFF).
REFUSED = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
UTF8_BOM = b"\xef\xbb\xbf"
OTHER_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
              b"\xfe\xff": "UTF-16"}  # UTF-32 first: its little-endian mark starts as UTF-16's


def read_text(path: Path, what: str, error: type[QcliError] = ConfigError) -> str:
    """The text of the file at `path` (a `what`: "config file"), refused as `error` when it
    cannot be read, is not UTF-8 or holds a character REFUSED matches (see the module)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    text = decode(data, path, what, error)
    bad = REFUSED.search(text)
    if bad is not None:
        raise refusal(path, text, bad.start(), what, error)
    return text


def decode(data: bytes, path: Path, what: str, error: type[QcliError] = ConfigError) -> str:
    """`data` decoded as UTF-8 without its byte order mark; other encodings refused."""
    for bom, encoding in OTHER_BOMS.items():
        if data.startswith(bom):
            raise error(f"{path}:1:1: the {what} is {encoding} text (byte order mark {bom.hex(' ').upper()}), "
                        "not UTF-8", hint=f"save it as UTF-8 (iconv -f {encoding} -t UTF-8)")
    body = data.removeprefix(UTF8_BOM)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = body.rfind(b"\n", 0, exc.start) + 1
        line, col = body.count(b"\n", 0, exc.start) + 1, len(body[start:exc.start].decode("utf-8")) + 1
        raise error(f"{path}:{line}:{col}: byte 0x{body[exc.start]:02X} is not UTF-8 text ({exc.reason})",
                    hint=f"save the {what} as UTF-8 (from Windows-1252: iconv -f WINDOWS-1252 -t UTF-8), "
                         "or retype that character") from None


def refusal(path: Path | str, text: str, index: int, what: str, error: type[QcliError] = ConfigError) -> QcliError:
    """The error for the character REFUSED found at `index` of `text`: where, which, what to do."""
    code = ord(text[index])
    control = code < 0x20 or 0x7F <= code < 0xA0
    kind = "control character" if control else "noncharacter" if code in (0xFFFE, 0xFFFF) else "character"
    line, col = text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1
    hint = "an editor that shows invisible characters finds it"
    if 0x80 <= code < 0xA0:
        hint += "; text pasted from Windows-1252 carries these" + _cp1252(code)
    elif code == 0:
        hint += "; NUL bytes come from binary files and UTF-16 or UTF-32 text: save it as UTF-8"
    return error(f"{path}:{line}:{col}: remove the {kind} U+{code:04X}: a {what} cannot hold it", hint=hint)


def _cp1252(code: int) -> str:
    """What a C1 control character meant in Windows-1252, e.g. " (U+0099 was '™' there)"."""
    try:
        return f" (U+{code:04X} was {bytes([code]).decode('cp1252')!r} there)"
    except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D mean nothing there
        return ""
