"""The `recovery:` section: its list and mapping forms, errors with file:line, what the model's
metadata records."""

from __future__ import annotations

from pathlib import Path

import pytest

from qcli.config import Config, config_document, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text",
    [
        "recovery: [equalization, {smoothquant: {alpha: 0.5}}]\n",
        "recovery:\n  smoothquant: {alpha: 0.5}\n  equalization:\n",
    ],
)
def test_list_and_mapping_forms_are_the_same(tmp_path: Path, text: str) -> None:
    recovery = load_config(write(tmp_path, text)).recovery
    assert recovery.steps == ["equalization", "smoothquant"]
    assert recovery.smoothquant is not None and recovery.smoothquant.alpha == 0.5
    assert recovery.equalization is not None and recovery.equalization.iterations == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ("recovery: [smoothqant]\n", ":1: recovery: Value error, unknown recovery step 'smoothqant': did you mean 'smoothquant'?"),
        ("recovery: [bias_correction, bias_correction]\n", ":1: recovery: Value error, recovery step 'bias_correction' is given twice"),
        ("recovery:\n  smoothquant: {alpha: 1.5}\n", ":2: recovery.smoothquant.alpha: Value error, alpha is a share between 0 and 1, or auto (got 1.5)"),
        ("recovery:\n  equalization: {iterations: 0}\n", ":2: recovery.equalization.iterations: Input should be greater than or equal to 1 (got 0)"),
        ("recovery:\n  smoothquant: {op_types: [Relu]}\n", ":2: recovery.smoothquant.op_types[0]: Input should be 'MatMul', 'Gemm' or 'Conv' (got 'Relu')"),
        ("recovery:\n  smothquant: {}\n", ":2: unknown key recovery.smothquant\nhint: did you mean 'smoothquant'?"),
    ],
)
def test_bad_recovery_names_file_line_and_key(cli, tmp_path: Path, text: str, message: str) -> None:
    result = cli("config", "validate", write(tmp_path, text))
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"error: {tmp_path / 'c.yaml'}{message}"), result.stderr


def test_off_steps_stay_off_through_merging_and_metadata(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "recovery: [bias_correction]\n"))
    merged = config.merged(calibration={"method": "kl"})
    assert merged.recovery.steps == ["bias_correction"]
    assert config_document(merged)["recovery"] == {"bias_correction": {"op_types": ["Conv", "Gemm", "MatMul"]}}
    assert "recovery" not in config_document(Config())  # models made without recovery keep their bytes
