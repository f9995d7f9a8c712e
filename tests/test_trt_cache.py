"""TensorRT's calibration cache from `qcli calibrate --trt-cache` and the `run` pipeline's
`trt_cache` key (issue #18): the documented text format, parsed back, scales = amax / 127."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from conftest import SAMPLE_MODELS
from qcli.calibrate.trtcache import HEADER

CNN = SAMPLE_MODELS / "cnn"


def read_trt_cache(path: Path) -> tuple[str, dict[str, float]]:
    """The header and tensor -> scale of a TensorRT calibration cache, as TensorRT reads it:
    `TRT-<version>-<calibrator>`, then `tensor: <float32 bits in 8 hex digits>` per line."""
    header, *lines = path.read_text(encoding="utf-8").splitlines()
    assert re.fullmatch(r"TRT-\d+-\w+", header), header
    scales = {}
    for line in lines:
        name, value = re.fullmatch(r"(.+): ([0-9a-f]{8})", line).groups()  # type: ignore[union-attr]
        scales[name] = struct.unpack(">f", bytes.fromhex(value))[0]
    return header, scales


def test_the_cache_has_the_format_and_the_minmax_scales(cli, tmp_path: Path) -> None:
    cache = tmp_path / "cnn.cache"
    doc = cli.json("calibrate", CNN / "model.onnx", "--data", CNN / "calib", "--samples", "32", "--method", "minmax",
                   "-o", tmp_path / "cnn.calib.json", "--trt-cache", cache)
    assert doc["trt_cache"] == str(cache)
    lines = cache.read_text().splitlines()
    assert lines[0] == HEADER and re.fullmatch(r"TRT-\d+-EntropyCalibration2", lines[0])
    assert all(re.fullmatch(r"[^:]+: [0-9a-f]{8}", line) for line in lines[1:])
    header, scales = read_trt_cache(cache)
    ranges = doc["ranges"]
    assert sorted(scales) == sorted(ranges) and len(scales) == doc["tensors"]
    for name, r in ranges.items():  # minmax, symmetric int8: amax = the larger |observed value|
        amax = max(abs(r["min"]), abs(r["max"]))
        assert scales[name] == pytest.approx(amax / 127, rel=1e-6), name


def test_the_pipeline_writes_the_cache_too(cli, tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"""version: 1
model: {CNN / 'model.onnx'}
output: out/cnn.int8.onnx
calibration_data: {CNN / 'calib'}
config: {{calibration: {{samples: 32}}, verify: {{enabled: false}}}}
trt_cache: out/cnn.cache
""")
    result = cli("run", path)
    assert result.exit_code == 0, result.stderr
    header, scales = read_trt_cache(tmp_path / "out" / "cnn.cache")
    assert header == HEADER and len(scales) > 10 and all(s > 0 for s in scales.values())
