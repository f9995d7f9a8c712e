"""`qcli.analyze`: accuracy, fidelity, per-layer SQNR, latency, size, gates and the three report
formats, on the sample CNN quantized by qcli itself."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from rich.console import Console

from conftest import IMAGE_MODEL, SAMPLE_MODELS, parse_model, save
from qcli.analyze import (
    Gates,
    Report,
    analyze,
    evaluate,
    headline,
    read_report,
    render,
    sample_count,
    write_report,
)
from qcli.analyze.intervals import wilson
from qcli.analyze.metrics import FidelityAccumulator, SqnrAccumulator, sqnr_db
from qcli.errors import ConfigError, DataError, GateFailed, ModelError, QcliError
from qcli.runtime import make_session

CNN = SAMPLE_MODELS / "cnn"
FLOAT = CNN / "model.onnx"
EVAL = CNN / "eval"
BROKEN_TENSOR = "/stem/stem.2/Relu_output_0"  # everything downstream reads it


def quantize_cnn(out: Path) -> Path:
    """The sample CNN quantized with qcli's defaults (calibrated on its calib/ folder)."""
    from qcli.config import load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.model import load_model, save_model
    from qcli.quantize import calibrate, quantize

    model = load_model(FLOAT)
    config = load_config(None)
    folder = DataFolder(CNN / "calib", model_inputs(model), samples=128)
    table = calibrate(model, folder, config)
    return save_model(quantize(model, config, table).model, out)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    return quantize_cnn(tmp_path_factory.mktemp("cnn") / "cnn.int8.onnx")


GATES = Gates(max_accuracy_drop=1.0, min_speedup=1000.0, min_compression=1.5)


@pytest.fixture(scope="module")
def report(quantized) -> Report:
    return analyze(FLOAT, quantized, EVAL, runs=20, warmup=2, gates=GATES)


def eval_files() -> list[Path]:
    return sorted(EVAL.glob("*.npz"))


# --------------------------------------------------------------------------- accuracy


def independent_top1(model: Path) -> float:
    """Top-1 on eval/, written without the library under test."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs, labels = [], []
    for path in eval_files():
        with np.load(path) as npz:
            inputs.append(npz["input"])
            labels.append(npz["label"])
    logits = session.run(None, {"input": np.concatenate(inputs)})[0]
    return float((logits.argmax(axis=1) == np.concatenate(labels)).mean())


def test_accuracy_matches_an_independent_count(report, quantized):
    acc = report.accuracy
    assert acc is not None and acc.output == "logits" and acc.classes == 10
    assert acc.samples == report.data.samples == report.data.labelled == 400
    assert acc.float.top1 == pytest.approx(independent_top1(FLOAT), abs=1e-9)
    assert acc.quantized.top1 == pytest.approx(independent_top1(quantized), abs=1e-9)
    assert acc.top1_drop == pytest.approx(acc.float.top1 - acc.quantized.top1, abs=1e-9)
    assert acc.float.top5 is not None and acc.float.top5 >= acc.float.top1
    fid = report.fidelity[0]
    assert fid.kind == "top1" and fid.samples == 400
    assert fid.top1_agreement > 0.97 and fid.cosine > 0.99 and fid.sqnr_db > 20


def test_speed_and_size(report):
    sp = report.speed
    assert sp is not None and sp.runs == 20 and sp.batch == 1
    assert len(sp.float.runs_ms) == len(sp.quantized.runs_ms) == 20
    assert sp.speedup > 0 and sp.float.median_ms > 0 and sp.quantized.median_ms > 0
    assert sp.float.p90_ms >= sp.float.median_ms
    assert sp.quantized.throughput == pytest.approx(1000 / sp.quantized.median_ms, rel=1e-3)
    assert sp.speedup == pytest.approx(sp.float.median_ms / sp.quantized.median_ms, rel=1e-3)
    sz = report.size
    assert sz.float.file_bytes == FLOAT.stat().st_size
    assert sz.compression == pytest.approx(sz.float.file_bytes / sz.quantized.file_bytes, rel=1e-3)
    assert sz.compression > 2
    assert set(sz.float.weights) == {"float32"}
    assert sz.quantized.weights["int8"].bytes > sz.quantized.weights["float32"].bytes


def test_gates_pass_and_fail_as_set(report):
    gates = {g.name: g for g in report.gates}
    assert gates["max_accuracy_drop"].passed and gates["min_compression"].passed
    speed = gates["min_speedup"]
    assert not speed.passed and speed.threshold == 1000 and speed.margin < 0
    assert re.fullmatch(r"speedup \d+\.\d\dx < 1000\.00x \(short by \d+\.\d\dx\)", speed.message)
    assert not report.passed
    error = report.gate_error()
    assert isinstance(error, GateFailed) and error.exit_code == 1
    assert "speedup" in error.message and "compression" not in error.message


def test_gates_validate_and_need_runs():
    with pytest.raises(ConfigError, match="fraction"):
        Gates(max_accuracy_drop=5)
    with pytest.raises(QcliError, match="min_speedup gate needs latency runs"):
        analyze(FLOAT, FLOAT, EVAL, runs=0, gates=Gates(min_speedup=1.0))


# --------------------------------------------------------------------------- layers


def test_every_quantized_activation_has_a_finite_sqnr(report, quantized):
    q = onnx.load(str(quantized))
    graph_outputs = {o.name for o in q.graph.output}
    expected = set()
    for node in q.graph.node:
        if node.op_type == "QuantizeLinear":
            name = node.input[0]
            expected.add(name.removesuffix("_float") if name.removesuffix("_float") in graph_outputs else name)
    layers = report.layers
    assert {t.tensor for t in layers.tensors} == expected and not layers.skipped
    for t in layers.tensors:
        assert t.sqnr_db is not None and math.isfinite(t.sqnr_db) and t.sqnr_db > 10, t
        assert t.elements > 0 and t.dtype == "uint8"
    by_name = {t.tensor: t for t in layers.tensors}
    assert by_name["input"].op_type == "input" and by_name["input"].quantized_tensor == "input_dequantized"
    assert "logits" not in by_name  # the classifier's Gemm writes its logits in float (QGemm)
    assert by_name[BROKEN_TENSOR].node == "/stem/stem.2/Relu" and by_name[BROKEN_TENSOR].op_type == "Relu"
    worst = report.worst_layers()
    assert len(worst) == 10 and [t.sqnr_db for t in worst] == sorted(t.sqnr_db for t in worst)


def test_sqnr_matches_a_direct_computation(quantized):
    """The streamed SQNR of one tensor equals the one computed from whole arrays."""
    from qcli.calibrate.collect import session_with_outputs
    from qcli.model import load_model

    files = eval_files()[:24]
    x = np.concatenate([np.load(p)["input"] for p in files])
    name = "/layer1/relu2/Relu_output_0"
    f = session_with_outputs(load_model(FLOAT), [name]).run([name], {"input": x})[0].astype(np.float64)
    q = session_with_outputs(load_model(quantized), [name + "_dequantized"]).run(
        [name + "_dequantized"], {"input": x})[0].astype(np.float64)
    expected = 10 * np.log10((f**2).sum() / ((q - f) ** 2).sum())
    r = analyze(FLOAT, quantized, EVAL, samples=24, batch_size=5, runs=0)
    got = {t.tensor: t for t in r.layers.tensors}[name]
    assert got.sqnr_db == pytest.approx(expected, abs=1e-3)
    assert got.elements == f.size


def test_a_broken_scale_shows_in_its_layer_and_in_accuracy(report, quantized, tmp_path):
    model = onnx.load(str(quantized))
    scale = next(t for t in model.graph.initializer if t.name == BROKEN_TENSOR + "_scale")
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(100), scale.name))
    broken = save(model, tmp_path / "broken.onnx")
    bad = analyze(FLOAT, broken, EVAL, runs=0, gates=Gates(max_accuracy_drop=0.01))
    before = {t.tensor: t.sqnr_db for t in report.layers.tensors}
    after = {t.tensor: t.sqnr_db for t in bad.layers.tensors}
    assert after[BROKEN_TENSOR] < 10 < before[BROKEN_TENSOR] - 20
    assert after["input"] == before["input"]
    # The error then spreads downstream; the broken layer is where SQNR first falls.
    first_bad = next(t.tensor for t in bad.layers.tensors if t.sqnr_db < 20)
    assert first_bad == BROKEN_TENSOR
    assert bad.accuracy.top1_drop > 0.2
    (gate,) = bad.gates
    assert not gate.passed and "top-1 drop" in gate.message and "over by" in gate.message


# --------------------------------------------------------------------------- data variants


def unlabelled_copy(folder: Path, count: int) -> Path:
    folder.mkdir()
    for path in eval_files()[:count]:
        with np.load(path) as npz:
            np.savez(folder / path.name, input=npz["input"])
    return folder


def test_without_labels_reports_fidelity_only(quantized, tmp_path):
    data = unlabelled_copy(tmp_path / "nolabels", 40)
    r = analyze(FLOAT, quantized, data, runs=0, gates=Gates(max_accuracy_drop=0.05))
    assert r.accuracy is None and r.data.labelled == 0 and r.data.samples == 40
    fid = r.fidelity[0]
    assert fid.top1_agreement is not None and fid.cosine > 0.99 and fid.sqnr_db > 20 and fid.max_abs_error > 0
    agree = round(fid.top1_agreement * 40)
    assert fid.agreement_interval == [pytest.approx(v, abs=1e-6) for v in wilson(agree, 40)]  # 40 samples
    assert fid.cosine_interval[0] < fid.cosine <= fid.cosine_interval[1]
    (gate,) = r.gates
    assert gate.metric == "1 - top-1 agreement (logits)" and gate.value == pytest.approx(1 - fid.top1_agreement)
    from qcli.analyze import report_text

    assert "top-1 accuracy" not in report_text(r, ".md")


def test_labels_file_outside_the_data_folder(quantized, tmp_path):
    data = unlabelled_copy(tmp_path / "nolabels", 30)
    labels = tmp_path / "truth.csv"
    rows = ["file,label"] + [f"{p.name},{int(np.load(p)['label'][0])}" for p in eval_files()[:30]]
    labels.write_text("\n".join(rows) + "\n")
    r = evaluate(FLOAT, quantized, data, labels=labels)
    assert r.accuracy is not None and r.accuracy.samples == 30 and r.data.labels_file == str(labels)
    assert r.speed is None and r.layers is None
    labels.write_text("file,label\n00000.npz,1\nmissing.npz,2\n")
    with pytest.raises(DataError) as exc:
        evaluate(FLOAT, quantized, data, labels=labels)
    assert str(labels) in exc.value.message and "missing.npz" in exc.value.message
    with pytest.raises(DataError, match="labels file not found"):
        evaluate(FLOAT, quantized, data, labels=tmp_path / "nope.csv")


def test_reference_outputs_are_used(quantized, tmp_path):
    """ONNX test-data folders: output_0.pb (unnamed here: matched by position) is the reference."""
    session = make_session(FLOAT)
    data = tmp_path / "testdata"
    for i, path in enumerate(eval_files()[:12]):
        folder = data / f"test_data_set_{i}"
        folder.mkdir(parents=True)
        x = np.load(path)["input"]
        ref = session.run(None, {"input": x})[0]
        (folder / "input_0.pb").write_bytes(numpy_helper.from_array(x, "input").SerializeToString())
        (folder / "output_0.pb").write_bytes(numpy_helper.from_array(ref, "").SerializeToString())
    r = analyze(FLOAT, quantized, data, runs=0, batch_size=4)
    assert r.data.reference_outputs and r.data.layout == "onnx-test-data" and r.data.samples == 12
    (ref,) = r.reference
    assert ref.output == "logits"
    assert ref.float.top1_agreement == 1.0 and ref.float.cosine == pytest.approx(1.0, abs=1e-6)
    assert ref.quantized.samples == 12 and ref.quantized.cosine > 0.99
    assert ref.quantized.sqnr_db == pytest.approx(r.fidelity[0].sqnr_db, abs=0.5)


def test_models_with_different_inputs_are_refused(quantized, tmp_path):
    other = save(parse_model(IMAGE_MODEL), tmp_path / "other.onnx")
    with pytest.raises(ModelError) as exc:
        analyze(other, quantized, EVAL, runs=0)
    assert "other.onnx" in exc.value.message and "cnn.int8.onnx" in exc.value.message and exc.value.exit_code == 2


def test_in_memory_models_and_sample_count(quantized):
    from qcli.model import load_model

    assert sample_count(FLOAT, EVAL) == 400 and sample_count(FLOAT, EVAL, samples=50) == 50
    seen = []
    r = evaluate(load_model(FLOAT), load_model(quantized), EVAL, samples=64, batch_size=24, progress=seen.append,
                 max_accuracy_drop=0.05)
    assert seen == [24, 24, 16]
    assert r.quantized_model.path == "<in memory>" and r.accuracy.samples == 64
    assert r.size.compression > 2 and r.speed is None and r.layers is None
    line = headline(r)
    assert line.startswith("top-1 ") and "on 64 labelled samples" in line and "top-1 drop" in line


def test_streaming_accumulators_match_whole_array_math():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 7)).astype(np.float32)
    y = x + rng.normal(scale=0.1, size=x.shape).astype(np.float32)
    acc, fid = SqnrAccumulator(), FidelityAccumulator()
    for start in range(0, 50, 8):
        acc.update(x[start:start + 8], y[start:start + 8])
        fid.update(x[start:start + 8], y[start:start + 8], len(x[start:start + 8]))
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert acc.db == pytest.approx(10 * np.log10((x64**2).sum() / ((y64 - x64) ** 2).sum()), abs=1e-4)
    cos = (x64 * y64).sum(1) / np.linalg.norm(x64, axis=1) / np.linalg.norm(y64, axis=1)
    assert fid.cosine == pytest.approx(cos.mean()) and fid.cosine_min == pytest.approx(cos.min())
    assert fid.top1_agreement == pytest.approx((x.argmax(1) == y.argmax(1)).mean())
    assert sqnr_db(3.0, 0.0) is None


def test_integer_outputs_agree_per_element_not_per_sample():
    """A tagger's or a mask's ids: one token that differs costs one token, not the sample."""
    ref = np.arange(40, dtype=np.int64).reshape(4, 10) % 7
    got = ref.copy()
    got[1, 3] += 1  # one token of one sample
    got[2, 0] += 1
    fid = FidelityAccumulator()
    fid.update(ref[:3], got[:3], 3)
    fid.update(ref[3:], got[3:], 1)
    assert fid.element_agreement == pytest.approx(38 / 40)
    assert fid.exact == 2 and fid.samples == 4 and fid.top1_agreement is None
    floats = FidelityAccumulator()
    floats.update(ref.astype(np.float32), got.astype(np.float32), 4)
    assert floats.element_agreement is None


# --------------------------------------------------------------------------- reports


def masked(doc: dict) -> dict:
    """The document without its timings (the only values that differ between runs)."""
    doc = json.loads(json.dumps(doc))
    doc["speed"] = "<timings>"
    for gate in doc["gates"]:
        if gate["name"] == "min_speedup":
            gate.update(value="<t>", margin="<t>", message="<t>")
    return doc


def test_json_round_trips_and_is_deterministic(report, quantized, tmp_path):
    path = write_report(report, tmp_path / "report.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "qcli-analysis/1" and doc["passed"] is False
    assert list(doc)[:4] == ["format", "qcli_version", "passed", "float_model"]
    assert read_report(path) == report
    (tmp_path / "other.json").write_text('{"format": "qcli-inspect/1"}')
    with pytest.raises(QcliError, match="not a qcli-analysis/1 report"):
        read_report(tmp_path / "other.json")
    assert path.read_text() == report.to_json()
    assert not list(tmp_path.glob(".*.tmp"))
    runs = [analyze(FLOAT, quantized, EVAL, samples=100, runs=3, warmup=1, gates=GATES) for _ in range(2)]
    first, second = (json.dumps(masked(r.to_dict()), indent=2) for r in runs)
    assert first == second


def test_json_escapes_what_read_report_refuses(report, tmp_path):
    """Issue 50: read_report refuses control characters, so a report never holds one raw (a
    model's name may: JSON writes C1 controls and DEL as themselves)."""
    odd = dataclasses.replace(report, notes=[*report.notes, "node a\x99b\x7f"])
    path = write_report(odd, tmp_path / "odd.json")
    assert '"node a\\u0099b\\u007f"' in path.read_text()
    assert read_report(path) == odd


def test_markdown_has_the_tables(report, tmp_path):
    text = write_report(report, tmp_path / "report.md").read_text()
    assert text.startswith("## qcli analysis: `model.onnx` → `cnn.int8.onnx`")
    assert "❌ **1 of 3 gates failed**: speedup" in text
    for needle in ("| top-1 accuracy (400 labelled) | 100.00% |", "| file size |", "| latency median (batch 1) |",
                   "### Gates", "| min_speedup | speedup |", "❌ FAIL", "✅ pass", "### Fidelity to the float model",
                   "### Worst layers (10 of 17", "| 1 | `"):
        assert needle in text, needle


def test_html_is_self_contained(report, tmp_path):
    text = write_report(report, tmp_path / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") == 4
    lowered = text.lower()
    for banned in ("http:", "https:", "src=", "<script", "<link", "@import", "url("):
        assert banned not in lowered, banned
    assert "Per-layer error (17 quantized activations)" in text and "Latency of every timed run" in text


def test_unknown_report_extension_is_a_usage_error(report, tmp_path):
    with pytest.raises(QcliError) as exc:
        write_report(report, tmp_path / "report.txt")
    assert exc.value.exit_code == 2 and "'.txt'" in exc.value.message
    assert not (tmp_path / "report.txt").exists()


def test_terminal_rendering(report):
    console = Console(record=True, width=140, color_system=None)
    render(console, report)
    text = console.export_text()
    for needle in ("Summary", "top-1 accuracy", "Fidelity to the float model", "Worst layers (10 of 17",
                   "Gates", "FAIL", "short by", "file size"):
        assert needle in text, needle


def test_nan_and_inf_are_counted_not_propagated():
    acc, fid = SqnrAccumulator(), FidelityAccumulator()
    x = np.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]], np.float32)
    y = np.array([[1.0, 2.0, np.inf], [1.0, np.nan, 1.1]], np.float32)
    acc.update(x, y)
    fid.update(x, y, 2)
    assert acc.nonfinite == 2 and acc.elements == 4 and math.isfinite(acc.db)
    assert acc.db == pytest.approx(10 * np.log10(7 / 0.01), abs=1e-3)  # kept: 1, 2, 1, 1
    assert fid.sqnr.nonfinite == 2 and fid.cosine is None  # no row is free of NaN/Inf
    big = np.full(4, 3e20, np.float32)  # squares overflow float32
    acc = SqnrAccumulator()
    acc.update(big, big * np.float32(1.001))
    assert acc.nonfinite == 0 and acc.db == pytest.approx(60, abs=0.01)


def test_the_layer_pass_runs_large_outputs_in_parts(report, quantized, monkeypatch) -> None:
    """Every quantized activation of both models per run: a batch whose layer outputs exceed
    the bound is run a few samples at a time (here one: a bound of 1 byte). The sums only
    regroup: per-layer SQNR within rounding, every other figure equal."""
    import qcli.analyze.core as core

    runs: list[int] = []
    real = core._run

    def counted(session, names, feeds, where, model):
        runs.append(next(iter(feeds.values())).shape[0])
        return real(session, names, feeds, where, model)

    monkeypatch.setattr(core, "RUN_OUTPUT_BYTES", 1)
    monkeypatch.setattr(core, "_run", counted)
    parted = analyze(FLOAT, quantized, EVAL, runs=0)
    assert max(runs) > 1 and 1 in runs  # whole batches for the outputs, one sample for the layers
    assert parted.fidelity == report.fidelity and parted.accuracy == report.accuracy
    whole = {t.tensor: t.sqnr_db for t in report.layers.tensors}
    for t in parted.layers.tensors:
        assert t.sqnr_db == pytest.approx(whole[t.tensor], abs=1e-3)


def test_a_run_holds_what_memory_affords_and_the_figures_stay(tmp_path):
    """Samples of 4 x 2**18 floats (2 x 4 MB of intermediate tensors each) are evaluated in
    runs that keep under 64 MB (7 samples), not the 32 asked, with a note; the figures are those
    of runs of one sample. The speech-quality CNN's 9 s clips at 32 per run held 7.6 GB."""
    from test_verify import WIDE

    from conftest import write_npz
    from qcli.prepare.shapes import RUN_BYTES

    wide = parse_model(WIDE)  # ReduceMax over Tanh(Relu(x)); the "quantized" one rounds it to 0.05
    rounded = parse_model(WIDE.replace("y = ReduceMax <axes = [2], keepdims = 0> (t)", """
        m = ReduceMax <axes = [2], keepdims = 0> (t)
        s = Constant <value = float {0.05}> ()
        d = Div (m, s)
        k = Round (d)
        y = Mul (k, s)"""))
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(10):
        write_npz(data / f"{i}.npz", x=rng.standard_normal((1, 4, 1 << 18)).astype(np.float32))
    seen = []
    r = evaluate(wide, rounded, data, batch_size=32, progress=seen.append)
    assert RUN_BYTES // (2 * 4 * 4 * (1 << 18) + 16) == 7 and seen == [7, 3]
    assert r.settings.batch_size == r.data.batch_size == 7
    assert "batches of 7 sample(s), not 32: a run's intermediate tensors are kept under 64 MB" in " ".join(r.notes)
    one = evaluate(wide, rounded, data, batch_size=1)
    figures = [[dataclasses.replace(f, reason="") for f in report.fidelity] for report in (r, one)]  # reason: a shape
    assert figures[0] == figures[1] and not any("batches of" in n for n in one.notes)
