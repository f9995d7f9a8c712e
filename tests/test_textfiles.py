"""Issue 50: every text file qcli reads (config, pipeline file, calibration file, labels.csv,
report) refuses a control character, a noncharacter or bytes that are not UTF-8 with exit 2
and a message naming file:line:col, the code point and what to do (qcli/textfile.py); a UTF-8
byte order mark, CRLF line ends and long lines read; tabs in YAML indentation say so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import SAMPLE_MODELS
from qcli.analyze import read_report
from qcli.errors import QcliError

MLP = SAMPLE_MODELS / "mlp"
EDITOR = "hint: an editor that shows invisible characters finds it"
TAB = "hint: YAML indents and separates with spaces, not tabs: replace the tab with spaces"
C1 = f"{EDITOR}; text pasted from Windows-1252 carries these (U+0099 was '™' there)\n"


def write(tmp_path: Path, data: str | bytes, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return path


def refused(result) -> str:
    """The stderr of a run that exited 2 without a traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "bug in qcli" not in result.stderr
    return result.stderr


def test_a_config_with_a_control_character(cli, tmp_path: Path) -> None:
    path = write(tmp_path, 'version: 1\nexclude:\n  nodes: ["a\x01b"]\n')
    assert refused(cli("config", "validate", path)) == (
        f"error: {path}:3:13: remove the control character U+0001: a config file cannot hold it\n{EDITOR}\n")


def test_a_c1_control_character_in_a_config_given_to_quantize_auto_precision(cli, tmp_path: Path) -> None:
    path = write(tmp_path, "version: 1\nexclude:\n  nodes: [a\x99b]\n")
    result = cli("quantize", MLP / "model.onnx", "--data", MLP / "calib", "-o", tmp_path / "q.onnx",
                 "--auto-precision", "--config", path)
    assert refused(result) == f"error: {path}:3:12: remove the control character U+0099: a config file cannot hold it\n{C1}"


@pytest.mark.parametrize(("data", "message"), [
    ("a: 1\nb: [\x00]\n", ":2:5: remove the control character U+0000: a config file cannot hold it\n"
     f"{EDITOR}; NUL bytes come from binary files and UTF-16 or UTF-32 text: save it as UTF-8\n"),
    ("a: 1\n# \ufffe\n", f":2:3: remove the noncharacter U+FFFE: a config file cannot hold it\n{EDITOR}\n"),
    ("a: 1\r\nb: \x7f\r\n", f":2:4: remove the control character U+007F: a config file cannot hold it\n{EDITOR}\n"),
    (b"a: 1\nb: caf\xe9\n", ":2:7: byte 0xE9 is not UTF-8 text (invalid continuation byte)\n"
     "hint: save the config file as UTF-8 (from Windows-1252: iconv -f WINDOWS-1252 -t UTF-8), or retype that "
     "character\n"),
    ("a: '\ud800'\n", ":1:5: byte 0xED is not UTF-8 text (invalid continuation byte)\n"
     "hint: save the config file as UTF-8 (from Windows-1252: iconv -f WINDOWS-1252 -t UTF-8), or retype that "
     "character\n"),
    ("version: 1\n".encode("utf-16"), ":1:1: the config file is UTF-16 text (byte order mark FF FE), not UTF-8\n"
     "hint: save it as UTF-8 (iconv -f UTF-16 -t UTF-8)\n"),
    ("calibration:\n\tmethod: kl\n", ":2:1: YAML syntax error: found character '\\t' that cannot start any token\n"
     f"{TAB}\n"),
    ("exclude: {nodes: [a,\tb]}\n", f":1:21: YAML syntax error: found character '\\t' that cannot start any token\n{TAB}\n"),
])
def test_what_a_config_cannot_hold(cli, tmp_path: Path, data: str | bytes, message: str) -> None:
    path = write(tmp_path, data)
    assert refused(cli("config", "validate", path)) == f"error: {path}{message}"


def test_a_bom_crlf_tabs_in_quotes_and_long_lines_read(cli, tmp_path: Path) -> None:
    text = f"# {'x' * 300_000}\r\ncalibration:\r\n  method: kl\r\nexclude: {{nodes: ['a\tb', {'n' * 100_000}]}}\r\n"
    path = write(tmp_path, b"\xef\xbb\xbf" + text.encode())
    assert cli("config", "validate", path).exit_code == 0
    shown = cli("config", "show", "--config", path).stdout
    assert "method: kl" in shown and "- \"a\\tb\"" in shown


def test_a_yaml_reader_error_is_exit_2_even_past_the_scan(cli, tmp_path: Path, monkeypatch) -> None:
    """The last line of defence: PyYAML's own ReaderError, were a character to pass the scan."""
    monkeypatch.setattr("qcli.yamlfile.read_text", lambda path, what: path.read_text(encoding="utf-8"))
    path = write(tmp_path, 'version: 1\nexclude:\n  nodes: ["a\x01b"]\n')
    assert refused(cli("config", "validate", path)) == (
        f"error: {path}:3:13: remove the control character U+0001: a config file cannot hold it\n{EDITOR}\n")


def test_a_pipeline_file_with_a_control_character(cli, tmp_path: Path) -> None:
    path = write(tmp_path, f"model: {MLP / 'model.onnx'}\noutput: q.onnx\x1b\ncalibration_data: {MLP / 'calib'}\n",
                 "pipeline.yaml")
    assert refused(cli("run", path)) == (
        f"error: {path}:2:15: remove the control character U+001B: a pipeline file cannot hold it\n{EDITOR}\n")


def test_a_calibration_file_with_a_control_character(cli, tmp_path: Path) -> None:
    path = write(tmp_path, '{\n "format": "qcli-calibration/1",\n "fingerprint": "\x85\x9b"\n}\n', "c.json")
    result = cli("quantize", MLP / "model.onnx", "--calib", path, "-o", tmp_path / "q.onnx")
    assert refused(result) == (f"error: {path}:3:19: remove the control character U+009B: a calibration file cannot "
                               f"hold it\n{EDITOR}; text pasted from Windows-1252 carries these (U+009B was '›' there)\n")


def _data(tmp_path: Path, labels: str | bytes) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("00000.npz", "00001.npz"):
        shutil.copy(MLP / "calib" / name, folder / name)
    write(folder, labels, "labels.csv")
    return folder


def test_a_labels_csv_with_a_control_character(cli, tmp_path: Path) -> None:
    folder = _data(tmp_path, "file,label\r\n00000.npz,1\r\n00001.npz,\x0c2\r\n")
    result = cli("calibrate", MLP / "model.onnx", "--data", folder, "-o", tmp_path / "c.json")
    assert refused(result) == (f"error: {folder / 'labels.csv'}:3:11: remove the control character U+000C: a labels "
                               f"file cannot hold it\n{EDITOR}\n")


def test_a_labels_csv_with_a_field_too_long_for_csv(cli, tmp_path: Path) -> None:
    folder = _data(tmp_path, f"file,label\n00000.npz,1\n{'x' * 200_000},2\n")
    result = cli("calibrate", MLP / "model.onnx", "--data", folder, "-o", tmp_path / "c.json")
    assert refused(result) == (f"error: {folder / 'labels.csv'}:3: cannot read the CSV: field larger than field "
                               "limit (131072)\n")


def test_a_labels_csv_in_utf16_given_to_analyze_labels(cli, tmp_path: Path) -> None:
    folder = _data(tmp_path, "")
    labels = write(tmp_path, b"\xfe\xff" + "00000.npz,1\n".encode("utf-16-be"), "labels.csv")
    result = cli("analyze", MLP / "model.onnx", MLP / "model.onnx", "--data", folder, "--labels", labels)
    assert refused(result) == (f"error: {labels}:1:1: the labels file is UTF-16 text (byte order mark FE FF), not "
                               "UTF-8\nhint: save it as UTF-8 (iconv -f UTF-16 -t UTF-8)\n")


def test_a_report_with_a_control_character(tmp_path: Path) -> None:
    path = write(tmp_path, '{"format": "qcli-analysis/1",\n"notes": ["\x9f"]}\n', "r.json")
    with pytest.raises(QcliError) as error:
        read_report(path)
    assert error.value.message == f"{path}:2:12: remove the control character U+009F: a report cannot hold it"

