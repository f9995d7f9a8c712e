"""`AnalyzeOptions`: one options object for `analyze()`, the `qcli analyze` flags and the
pipeline file's `analyze:` section."""

from __future__ import annotations

from pathlib import Path

import pytest

from qcli.analyze import AnalyzeOptions
from qcli.errors import ConfigError, QcliError
from qcli.pipeline import load_pipeline


def test_values_are_laid_over_a_base_and_checked() -> None:
    base = AnalyzeOptions(runs=3, samples=10)
    opts = AnalyzeOptions.of(base, worst=2, layers=False)
    assert (opts.runs, opts.samples, opts.worst, opts.layers, opts.batch_size) == (3, 10, 2, False, 32)
    assert AnalyzeOptions.of() == AnalyzeOptions()
    for field, value, message in (
        ("samples", 0, "the number of samples must be at least 1, got 0"),  # as the data folder says it
        ("batch_size", 0, "batch_size must be at least 1, got 0"), ("runs", -1, "runs must be at least 0, got -1"),
        ("warmup", -1, "warmup must be at least 0, got -1"), ("threads", 0, "threads must be at least 1, got 0"),
        ("latency_batch", 0, "latency_batch must be at least 1, got 0"),
        ("worst", -1, "worst must be at least 0, got -1"),
    ):
        with pytest.raises(QcliError, match=f"^{message}$"):
            AnalyzeOptions.of(**{field: value})
    with pytest.raises(TypeError, match="batchsize"):
        AnalyzeOptions.of(batchsize=8)


def test_the_pipeline_section_is_the_same_object(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text("model: m.onnx\noutput: q.onnx\ncalibration_data: calib\nanalyze: {runs: 0, worst: 3}\n")
    pipeline, _ = load_pipeline(path)
    assert pipeline.analyze == AnalyzeOptions(runs=0, worst=3)
    path.write_text(path.read_text().replace("runs: 0", "runs: -1"))
    with pytest.raises(ConfigError, match=r"pipeline.yaml:4: analyze.runs: Input should be greater than or equal to 0"):
        load_pipeline(path)
