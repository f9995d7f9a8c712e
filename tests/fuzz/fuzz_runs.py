"""The qcli commands the fuzzer runs on a case: `graph_commands` (calibrate, quantize with
and without verification, a calibration file, --eval-data, auto-precision; a generated
config, a preset or none; flags over it), `pipeline_file` (a `qcli run` file, sometimes
broken, its text sometimes changed) and `bad_input` (one valid command with one input made invalid)."""

from __future__ import annotations

import copy
import csv
import functools
import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.parser
import yaml
from hypothesis import strategies as st
from pydantic import ValidationError

from fuzz_configs import PRESETS, Names, bounded, config_files, documents
from fuzz_stats import LONG, STATS
from fuzz_text import decoded, encode, garbled, refusal
from qcli.analyze.options import AnalyzeOptions
from qcli.model import clamp_ir_version
from qcli.pipeline import Pipeline, PipelineGates


@dataclass
class Command:
    """One qcli command line; `valid` as in fuzz_check.Expect; `output` the model it writes."""

    args: list[Any]
    valid: bool | None = True
    output: Path | None = None
    config: Any = None
    tags: set[str] = field(default_factory=set)


def names_of(model: onnx.ModelProto) -> Names:
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    tensors = [i.name for i in model.graph.input] + [o for n in nodes for o in n.output] + [
        i.name for i in model.graph.initializer]
    return Names(tuple(n.name for n in nodes), tuple(sorted({n.op_type for n in nodes})), tuple(tensors))


def _config(data, model: onnx.ModelProto, root: Path, source: str) -> tuple[list[Any], Any, bool]:
    """`--config` arguments for a generated file, a preset or nothing; the document; whether
    the schema accepts it (a drawn config may break a validator: a block size, a crop)."""
    if source == "generated":
        case = data.draw(config_files(names_of(model), fast=not LONG, invalid=False), label="config")
        path = root / "config.yaml"
        path.write_bytes(case.data)
        STATS.counts["configs"] += 1
        STATS.counts["configs valid"] += case.valid
        return ["--config", path], case.doc, case.valid
    if source == "preset":
        preset = data.draw(st.sampled_from(PRESETS), label="preset")
        return ["--config", preset], {"preset": preset}, True
    return [], None, True


def _calibration_flags(data) -> list[Any]:
    flags: list[Any] = []
    if data.draw(st.integers(0, 3)) == 3:
        flags += ["--method", data.draw(st.sampled_from(["minmax", "percentile", "kl", "mse"]))]
    if data.draw(st.integers(0, 4)) == 4:
        flags += ["--percentile", data.draw(st.sampled_from([99.9, 100.0, 60.0]))]
    if data.draw(st.integers(0, 4)) == 4:
        flags += ["--samples", data.draw(st.integers(1, 30))]
    if data.draw(st.integers(0, 4)) == 4:
        flags += ["--batch-size", data.draw(st.integers(1, 12))]
    return flags


def graph_commands(data, model: onnx.ModelProto, root: Path, folder: Path, eval_folder: Path) -> list[Command]:
    """One or two commands on a graph: see the module docstring."""
    source = data.draw(st.sampled_from(["generated", "none", "generated", "preset"]), label="config source")
    config, doc, valid = _config(data, model, root, source)
    flags = config + _calibration_flags(data)
    rescue = ["--no-rescue"] if source != "generated" else []  # the default rescue may try 64 models
    mode = data.draw(st.sampled_from(["data", "calib", "no-verify", "eval", "auto", "data"]), label="mode")
    out = root / "out" / "model.q.onnx"
    extra = [data.draw(st.sampled_from(["--json", "-q"]))] if data.draw(st.integers(0, 3)) == 3 else []
    if data.draw(st.integers(0, 7)) == 7:
        extra.append("--strict")
    if mode == "calib":
        calib = root / "model.calib.json"
        first = Command(["calibrate", root / "model.onnx", "--data", folder, "-o", calib, *flags], valid, config=doc)
        second = ["quantize", root / "model.onnx", "--calib", calib, "-o", out, *config, *rescue, *extra]
        second += ["--no-verify"] if data.draw(st.booleans()) else []
        return [first, Command(second, valid, out, doc)]
    args = ["quantize", root / "model.onnx", "--data", folder, "-o", out, *flags, *rescue, *extra]
    if mode == "no-verify":
        args.append("--no-verify")
    elif mode == "eval":
        args += ["--eval-data", eval_folder]
    elif mode == "auto":
        args += ["--auto-precision", "--max-trials", data.draw(st.integers(1, 3)), "--time-budget", 5]
        args += ["--eval-data", eval_folder] if data.draw(st.booleans()) else []
        args += ["--criteria", data.draw(st.sampled_from(["balanced", "accuracy", "performance"]))]
        if data.draw(st.booleans()):
            args += ["--max-accuracy-drop", data.draw(st.sampled_from([0.0, 0.05, 1.0]))]
    return [Command(args, valid, out, doc)]


# --------------------------------------------------------------------------- pipelines

PIPELINE_BREAKS = ("unknown key", "missing key", "report suffix", "reports without eval_data", "bad analyze value",
                   "missing model", "bad inline config")


def pipeline_file(data, model: onnx.ModelProto, root: Path) -> tuple[Path, bool | None, dict]:
    """A pipeline file beside model.onnx, data/ and eval/ in `root`: its path, whether it is
    valid (None: its text was changed into another document's), and its document (outputs go
    to root/out/). Its text is sometimes changed (fuzz_text.garbled: any code point, CRLF, ...)."""
    doc: dict[str, Any] = {"model": "model.onnx", "output": "out/model.q.onnx", "calibration_data": "data"}
    if data.draw(st.booleans()):
        doc["eval_data"] = data.draw(st.sampled_from(["eval", "data"]))
        reports = data.draw(st.lists(st.sampled_from(["out/r.json", "out/r.md", "out/r.html"]), unique=True))
        if reports:
            doc["reports"] = reports
        doc["gates"] = data.draw(documents(PipelineGates, "gates", Names()))
    if data.draw(st.booleans()):
        doc["calibration_file"] = "out/model.calib.json"
    doc["analyze"] = data.draw(documents(AnalyzeOptions, "analyze", Names()))
    source = data.draw(st.sampled_from(["inline", "inline", "file", "preset", "none"] if LONG else ["inline", "file"]))
    valid = True
    if source in ("inline", "file"):
        case = data.draw(config_files(names_of(model), fast=not LONG, invalid=False))
        config, valid = bounded(case.doc, not LONG), case.valid  # the schema's own rules (a reversed range)
        if source == "file":
            (root / "config.yaml").write_text(yaml.safe_dump(config))
        doc["config"] = config if source == "inline" else "config.yaml"
    elif source == "preset":
        doc["config"] = data.draw(st.sampled_from(PRESETS))
    if data.draw(st.integers(0, 3)) == 3:
        doc, broken_valid = _break_pipeline(doc, data.draw(st.sampled_from(PIPELINE_BREAKS)))
        valid = valid and broken_valid
    text = yaml.safe_dump(doc, sort_keys=False)
    content = encode(text)
    if data.draw(st.integers(0, 2)) == 2:
        content = data.draw(garbled(text), label="pipeline text").data
        valid = _reads_as(content, doc, valid)
    path = root / "pipeline.yaml"
    path.write_bytes(content)
    return path, valid, doc


def _reads_as(content: bytes, doc: dict, valid: bool) -> bool | None:
    """Whether a changed pipeline file is valid: False when qcli must refuse its text or it is
    no YAML, `valid` when it still reads as `doc`, None (cannot tell) when as another document."""
    text = decoded(content)
    if text is None or refusal(content) is not None:
        return False
    try:
        return valid if yaml.safe_load(text) == doc else None
    except yaml.YAMLError:
        return False


def _break_pipeline(doc: dict, kind: str) -> tuple[dict, bool]:
    doc = copy.deepcopy(doc)
    if kind == "unknown key":
        doc["gate"] = {}
    elif kind == "missing key":
        del doc["calibration_data"]
    elif kind == "report suffix":
        doc["reports"] = ["out/r.txt"]
    elif kind == "reports without eval_data":
        doc.pop("eval_data", None)
        doc["reports"] = ["out/r.json"]
    elif kind == "bad analyze value":
        doc["analyze"] = {"runs": -1}
    elif kind == "missing model":
        doc["model"] = "nothing.onnx"
    elif kind == "bad inline config":
        doc["config"] = {"calibration": {"method": "median"}}
    try:
        Pipeline.model_validate(doc)
    except ValidationError:
        return doc, False
    return doc, kind not in ("reports without eval_data", "missing model", "bad inline config")


# --------------------------------------------------------------------------- data text files

TEXT_FILES = ("labels.csv", "calibration file")


def text_file(data, kind: str, root: Path, model: Path, folder: Path) -> tuple[Command, Path, bytes]:
    """A labels.csv in `folder` (read by calibrate) or a calibration file of the small model
    (read by quantize --calib), its text changed (fuzz_text.garbled): the command, whether it
    is valid (as in `_reads_as`), the file and its bytes."""
    output = None
    if kind == "labels.csv":
        names = sorted(p.name for p in folder.iterdir())
        rows = [["file", "label"]] + [[n, str(data.draw(st.integers(0, 2)))]
                                      for n in data.draw(st.lists(st.sampled_from(names), unique=True))]
        text = "".join(f"{name},{label}\n" for name, label in rows)
        path, args = folder / "labels.csv", ["calibrate", model, "--data", folder, "-o", root / "c.json"]
        parse, want = _csv_rows, rows
    else:
        text = _calibration_text()
        path, output = root / "c.json", root / "q.onnx"
        args = ["quantize", model, "--calib", path, "-o", output, "--no-verify"]
        parse, want = _json, json.loads(text)
    content = data.draw(garbled(text), label=kind).data
    path.write_bytes(content)
    text = decoded(content)
    found = None if text is None or refusal(content) else parse(text)
    valid = False if found is None else True if found == want else None
    return Command(args, valid, output if valid else None), path, content


def _csv_rows(text: str) -> list[list[str]] | None:
    try:
        return [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    except csv.Error:
        return None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


@functools.cache
def _calibration_text() -> str:
    """The calibration file `qcli calibrate` writes for the small model."""
    from fuzz_check import qcli

    with tempfile.TemporaryDirectory(prefix="qcli-fuzz-") as tmp:
        model, folder = write_small(Path(tmp))
        qcli("calibrate", model, "--data", folder, "-o", Path(tmp) / "c.json")
        return (Path(tmp) / "c.json").read_text()


# --------------------------------------------------------------------------- bad inputs

SMALL = """
<ir_version: 8, opset_import: ["" : 17]>
small (float[N, 2, 4, 4] x) => (float[N, 3] y)
    <float[3, 2, 3, 3] w = {W}, float[3] b = {0.1, -0.2, 0.3},
     float[3, 3] f = {0.5, -0.1, 0.2, 0.3, 0.9, -0.4, 0.2, 0.1, -0.7}> {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    r = Relu (c)
    p = GlobalAveragePool (r)
    v = Flatten (p)
    y = MatMul (v, f)
}
"""


def small_model() -> onnx.ModelProto:
    weights = ", ".join(f"{v:.3f}" for v in np.random.default_rng(0).normal(0, 0.3, 54))
    return clamp_ir_version(onnx.parser.parse_model(SMALL.replace("{W}", "{" + weights + "}")))


def write_small(root: Path, count: int = 12) -> tuple[Path, Path]:
    model = root / "small.onnx"
    model.write_bytes(small_model().SerializeToString())
    folder = root / "data"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(count):
        np.savez(folder / f"{i:03d}.npz", x=rng.standard_normal((2, 4, 4)).astype(np.float32))
    return model, folder
