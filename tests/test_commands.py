"""The quantize and calibrate commands from Python, without the CLI: the flag rules
(`qcli.flags`) and the commands with their documents and gate errors (`qcli.commands`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SAMPLE_MODELS
from qcli.commands import calibrate_command, quantize_command
from qcli.errors import GateFailed, QcliError
from qcli.flags import CalibrateFlags, CalibrationFlags, QuantizeFlags, ScaleFlags

MLP = SAMPLE_MODELS / "mlp"


@pytest.mark.parametrize(("flags", "message"), [
    ({"data": MLP / "calib", "calib": Path("x.calib.json")}, "give exactly one of --data DIR"),
    ({"calib": Path("x.calib.json"), "scale": ScaleFlags(workers=2)}, "--executor, --workers and --ray-address"),
    ({"data": MLP / "calib", "max_accuracy_drop": 0.01}, "--max-accuracy-drop needs --eval-data"),
])
def test_flags_that_conflict_or_need_another(tmp_path: Path, flags: dict, message: str) -> None:
    with pytest.raises(QcliError, match=message) as caught:
        QuantizeFlags(MLP / "model.onnx", tmp_path / "q.onnx", **flags).check()
    assert caught.value.exit_code == 2


def test_a_static_config_needs_data(tmp_path: Path) -> None:
    """Neither --data nor --calib: only a config that calibrates nothing (dynamic) goes on."""
    with pytest.raises(QcliError, match="give exactly one of --data DIR") as caught:
        quantize_command(QuantizeFlags(MLP / "model.onnx", tmp_path / "q.onnx"))
    assert caught.value.exit_code == 2 and not (tmp_path / "q.onnx").exists()


def test_the_input_model_is_never_the_output() -> None:
    with pytest.raises(QcliError, match="is the input model"):
        QuantizeFlags(MLP / "model.onnx", MLP / "model.onnx", data=MLP / "calib").check()


def test_flags_lay_over_the_config(tmp_path: Path) -> None:
    flags = QuantizeFlags(
        MLP / "model.onnx", tmp_path / "q.onnx", data=MLP / "calib",
        calibration=CalibrationFlags("accuracy", method="kl", samples=64), no_verify=True, min_cosine=0.5,
    )
    config = flags.config()
    assert (config.calibration.method, config.calibration.samples) == ("kl", 64)
    assert not config.verify.enabled and config.verify.min_cosine == 0.5
    with pytest.raises(QcliError, match="--criteria, --min-speedup, --max-size-mb and --precision-out go with --auto-precision"):
        QuantizeFlags(MLP / "model.onnx", tmp_path / "q.onnx", data=MLP / "calib", criteria="accuracy").config()
    with pytest.raises(QcliError, match="--max-size-mb and --precision-out go with --auto-precision"):
        QuantizeFlags(MLP / "model.onnx", tmp_path / "q.onnx", data=MLP / "calib", max_size_mb=1.0).config()
    with pytest.raises(QcliError, match="command line: calibration.samples"):
        QuantizeFlags(MLP / "model.onnx", tmp_path / "q.onnx", calibration=CalibrationFlags(samples=0)).config()


def test_calibrate_then_quantize_from_python(tmp_path: Path) -> None:
    table = tmp_path / "mlp.calib.json"
    doc = calibrate_command(CalibrateFlags(MLP / "model.onnx", MLP / "calib", table, CalibrationFlags(samples=32)))
    assert doc["calibration_file"] == str(table) and doc["samples"] == 32 and table.is_file()
    run = quantize_command(QuantizeFlags(MLP / "model.onnx", tmp_path / "q.onnx", calib=table))
    assert list(run.doc)[:4] == ["output", "method", "bytes_before", "bytes_after"]
    assert run.doc["activations"] == {"uint8": 3} and run.doc["weights"] == {"int8 per_channel": 3}
    assert run.doc["method"] == "mse" and run.doc["verification"] is None  # nothing to verify on
    assert run.gate_error() is None and (tmp_path / "q.onnx").is_file()
    cnn = SAMPLE_MODELS / "cnn"  # slow enough for the latency floor to apply
    missed = quantize_command(QuantizeFlags(
        cnn / "model.onnx", tmp_path / "q2.onnx", data=cnn / "calib", calibration=CalibrationFlags(samples=32),
        no_rescue=True, max_latency_ratio=0.01,
    ))
    error = missed.gate_error()
    assert isinstance(error, GateFailed) and error.message.startswith("verification failed: latency ratio")
    assert missed.doc["verification"]["passed"] is False


def test_the_document_says_where_the_time_went(tmp_path: Path) -> None:
    """`phases`: wall seconds, calls and peak RSS of each phase, parents before their children, in the
    order they ran; the search's trials under verify (a latency floor of 0.01 forces one)."""
    cnn = SAMPLE_MODELS / "cnn"
    run = quantize_command(QuantizeFlags(
        cnn / "model.onnx", tmp_path / "q.onnx", data=cnn / "calib", calibration=CalibrationFlags(samples=32),
        max_latency_ratio=0.01,
    ))
    phases = run.doc["phases"]
    top = [p for p in phases if "/" not in p]
    assert top == ["load", "prepare", "calibrate", "build", "reference", "verify", "write"]
    assert {"calibrate/observe", "calibrate/solve", "verify/time", "verify/search"} <= set(phases)
    assert all(phases[p]["calls"] >= 1 and phases[p]["seconds"] >= 0 for p in phases)
    # the process's peak RSS when each phase last ended: the last to end (write) saw the highest
    assert all(0 < phases[p]["peak_mb"] <= phases["write"]["peak_mb"] for p in phases)
    for path in phases:  # a child within its parent's time
        parent = path.rpartition("/")[0]
        assert not parent or phases[path]["seconds"] <= phases[parent]["seconds"] + 1e-3
    assert list(phases).index("verify") < list(phases).index("verify/search")
    assert phases["verify/search/build"]["calls"] >= 1
