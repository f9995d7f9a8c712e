"""`qcli run PIPELINE.yaml`: the whole job for CI, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SAMPLE_MODELS

CNN = SAMPLE_MODELS / "cnn"


def pipeline(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        f"""version: 1
model: {CNN / 'model.onnx'}
output: out/cnn.int8.onnx          # relative to this file
calibration_data: {CNN / 'calib'}
eval_data: {CNN / 'eval'}
calibration_file: out/cnn.calib.json
config: {{calibration: {{samples: 64}}}}
reports: [out/report.json, out/report.md]
analyze: {{runs: 10, samples: 100}}
{extra}"""
    )
    return path


def test_pipeline_passes(cli, tmp_path: Path) -> None:
    result = cli("run", pipeline(tmp_path, "gates: {max_accuracy_drop: 0.02, min_compression: 2.5}\n"))
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["cnn.calib.json", "cnn.int8.onnx", "report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and [g["name"] for g in report["gates"]] == ["max_accuracy_drop", "min_compression"]
    calib = json.loads((out / "cnn.calib.json").read_text())
    assert calib["samples"] == 64


def test_failed_gate_exits_1(cli, tmp_path: Path) -> None:
    result = cli("run", pipeline(tmp_path, "gates: {min_compression: 50}\n"))
    assert result.exit_code == 1
    assert "compression" in result.stderr
    assert (tmp_path / "out" / "cnn.int8.onnx").exists()  # the model is written all the same


def test_bad_pipeline_key(cli, tmp_path: Path) -> None:
    result = cli("run", pipeline(tmp_path, "gate: {min_speedup: 1}\n"))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {tmp_path / 'pipeline.yaml'}:10: unknown key gate")
    assert "did you mean 'gates'?" in result.stderr


def test_bad_inline_config(cli, tmp_path: Path) -> None:
    path = pipeline(tmp_path).read_text().replace("samples: 64", "samples: -1")
    (tmp_path / "pipeline.yaml").write_text(path)
    result = cli("run", tmp_path / "pipeline.yaml")
    assert result.exit_code == 2
    assert "calibration.samples: Input should be greater than or equal to 1" in result.stderr


def test_pipeline_verifies_the_model_and_a_missed_floor_exits_1(cli, tmp_path: Path) -> None:
    text = pipeline(tmp_path).read_text().replace(
        "config: {calibration: {samples: 64}}",
        "config: {calibration: {samples: 64}, verify: {rescue: false, max_latency_ratio: 0.05}}",
    )
    (tmp_path / "pipeline.yaml").write_text(text)
    result = cli("run", tmp_path / "pipeline.yaml", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    v = doc["verification"]
    assert v["data"].endswith("(first 64 samples at most)") and not v["passed"]
    assert [c["name"] for c in v["checks"] if not c["passed"]] == ["latency ratio"]
    assert result.stderr.startswith("error: verification failed: latency ratio 0.")
    assert (tmp_path / "out" / "report.json").exists()  # the analysis ran and was written first
