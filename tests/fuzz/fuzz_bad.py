"""Bad inputs for the fuzzer: one valid `calibrate`/`quantize`/`run`/`config validate` command
on the small model with exactly one thing wrong (`BAD`: the model file, the data folder, the
output path, the calibration file, the config, a flag, a text file's characters). Each must exit 2 with an `error:`
line, and the same command with `--debug` must exit with the same code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fuzz_runs import Command, small_model

Setup = Callable[[Path, Path, Path], Command]  # (root, model, data folder) -> the command


def _quantize(model: Path, folder: Path, out: Path, *extra: object, tags: set[str] | None = None) -> Command:
    return Command(["quantize", model, "--data", folder, "-o", out, "--no-verify", *extra], False, tags=tags or set())


def _file(path: Path, content: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _folder(root: Path, **arrays: np.ndarray) -> Path:
    folder = root / "bad-data"
    folder.mkdir()
    for i in range(4):
        np.savez(folder / f"{i}.npz", **arrays)
    return folder


def _stale_calibration(root: Path, model: Path, folder: Path) -> Command:
    other = small_model()
    other.graph.initializer[1].float_data[:] = [0.5, 0.5, 0.5]  # another model: another fingerprint
    other_path = _file(root / "other.onnx", other.SerializeToString())
    from fuzz_check import qcli

    qcli("calibrate", other_path, "--data", folder, "-o", root / "other.calib.json")
    return Command(["quantize", model, "--calib", root / "other.calib.json", "-o", root / "q.onnx"], False)


def _labels(folder: Path, text: str) -> Path:
    _file(folder / "labels.csv", text)
    return folder


def _empty(root: Path) -> Path:
    folder = root / "empty"
    folder.mkdir()
    return folder


def _pipeline_unwritable(root: Path, model: Path, folder: Path) -> Command:
    output = _file(root / "f.txt", "x") / OUT
    text = f"model: {model}\noutput: {output}\ncalibration_data: {folder}\nconfig: {{verify: {{enabled: false}}}}\n"
    return Command(["run", _file(root / "p.yaml", text)], False, tags={"output unwritable"})


OUT = "q.onnx"
X = np.zeros((2, 4, 4), np.float32)

BAD: dict[str, Setup] = {
    "model missing": lambda r, m, d: _quantize(r / "nothing.onnx", d, r / OUT),
    "model truncated": lambda r, m, d: _quantize(_file(r / "t.onnx", m.read_bytes()[:200]), d, r / OUT),
    "model empty": lambda r, m, d: _quantize(_file(r / "e.onnx", b""), d, r / OUT),
    "model is text": lambda r, m, d: _quantize(_file(r / "t.onnx", "hello"), d, r / OUT),
    "model is a folder": lambda r, m, d: _quantize(d, d, r / OUT),
    "data missing": lambda r, m, d: _quantize(m, r / "none", r / OUT),
    "data empty": lambda r, m, d: _quantize(m, _empty(r), r / OUT),
    "data float64": lambda r, m, d: _quantize(m, _folder(r, x=X.astype(np.float64)), r / OUT),
    "data wrong shape": lambda r, m, d: _quantize(m, _folder(r, x=np.zeros((3, 4, 4), np.float32)), r / OUT),
    "data NaN": lambda r, m, d: _quantize(m, _folder(r, x=np.full((2, 4, 4), np.nan, np.float32)), r / OUT),
    "data wrong key": lambda r, m, d: _quantize(m, _folder(r, y=X), r / OUT),
    "data garbage npy": lambda r, m, d: _quantize(m, _file(r / "g" / "0.npy", b"\x93NUMPY garbage").parent, r / OUT),
    "output through a file": lambda r, m, d: _quantize(m, d, _file(r / "f.txt", "x") / OUT, tags={"output unwritable"}),
    "output in /proc": lambda r, m, d: _quantize(m, d, Path("/proc/qcli-fuzz") / OUT, tags={"output unwritable"}),
    "calibration output through a file": lambda r, m, d: Command(
        ["calibrate", m, "--data", d, "-o", _file(r / "f.txt", "x") / "c.json"], False, tags={"output unwritable"}),
    "output is the model": lambda r, m, d: _quantize(m, d, m),
    "calibration stale": _stale_calibration,
    "calibration corrupt": lambda r, m, d: Command(["quantize", m, "--calib", _file(r / "c.json", "{"), "-o", r / OUT],
                                                   False),
    "calibration not ours": lambda r, m, d: Command(
        ["quantize", m, "--calib", _file(r / "c.json", json.dumps({"a": 1})), "-o", r / OUT], False),
    "config missing": lambda r, m, d: _quantize(m, d, r / OUT, "--config", r / "none.yaml"),
    "config typo": lambda r, m, d: _quantize(m, d, r / OUT, "--config", _file(r / "c.yaml", "calibraton: {}\n")),
    "preset unknown": lambda r, m, d: _quantize(m, d, r / OUT, "--config", "defualt"),
    "config recursive": lambda r, m, d: Command(
        ["config", "validate", _file(r / "c.yaml", "exclude: {nodes: &a [*a]}\n")], False, tags={"recursive anchor"}),
    "config deep": lambda r, m, d: Command(
        ["config", "validate", _file(r / "c.yaml", "a: " + "[" * 5000 + "]" * 5000)], False, tags={"deep nesting"}),
    "data and calib": lambda r, m, d: _quantize(m, d, r / OUT, "--calib", _file(r / "c.json", "{}")),
    "samples 0": lambda r, m, d: _quantize(m, d, r / OUT, "--samples", 0),
    "percentile 200": lambda r, m, d: _quantize(m, d, r / OUT, "--percentile", 200),
    "method median": lambda r, m, d: _quantize(m, d, r / OUT, "--method", "median"),
    "drop without eval data": lambda r, m, d: _quantize(m, d, r / OUT, "--max-accuracy-drop", 0.01),
    "workers 0": lambda r, m, d: _quantize(m, d, r / OUT, "--workers", 0),
    "executor unknown": lambda r, m, d: _quantize(m, d, r / OUT, "--executor", "slurm"),
    "pipeline missing": lambda r, m, d: Command(["run", r / "none.yaml"], False),
    "pipeline a list": lambda r, m, d: Command(["run", _file(r / "p.yaml", "- 1\n")], False),
    "pipeline output unwritable": lambda r, m, d: _pipeline_unwritable(r, m, d),
    # issue 50: text files holding what YAML refuses (fuzz_text draws them from all of Unicode)
    "pipeline NUL byte": lambda r, m, d: Command(
        ["run", _file(r / "p.yaml", f"model: {m}\noutput: q.onnx\ncalibration_data: {d}\x00\n")], False),
    "labels.csv C1 control": lambda r, m, d: Command(
        ["calibrate", m, "--data", _labels(d, "000.npz,1\x99\n"), "-o", r / "c.json"], False),
    "calibration control character": lambda r, m, d: Command(
        ["quantize", m, "--calib", _file(r / "c.json", '{"format": "\x01"}'), "-o", r / OUT], False),
}
