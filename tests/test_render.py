"""The terminal renderings of the library's documents (qcli/render.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from qcli.render import quantization


def quantize_summary(before: int, after: int, compression: float) -> dict:
    """The part of `qcli quantize`'s document that its summary prints."""
    return {
        "notes": [],
        "quantized": {"Conv": 2},
        "folded": {},
        "float": [{"op_type": "Softmax", "count": 1, "reason": "float by default"}],
        "quantized_tensors": 3,
        "activations": {"uint8": 3},
        "weights": {"int8 per_channel": 2},
        "weight_tensors": 2,
        "method": "minmax",
        "output": "model.int8.onnx",
        "bytes_before": before,
        "bytes_after": after,
        "compression": compression,
    }


@pytest.mark.parametrize(
    ("before", "after", "compression", "said"),
    [
        (4 << 20, 1 << 20, 4.0, "4.0 MiB -> 1.0 MiB (4.00x smaller)"),
        # A model can grow (Q/DQ nodes on a small model, weights kept float): said as such.
        (3_355_443, 3_879_731, 0.87, "3.2 MiB -> 3.7 MiB (1.15x larger)"),
    ],
)
def test_quantize_summary_says_how_the_size_changed(before: int, after: int, compression: float, said: str) -> None:
    out = io.StringIO()
    quantization(Console(file=out, width=200), quantize_summary(before, after, compression))
    assert f"wrote model.int8.onnx: {said}" in out.getvalue()


def test_quantize_summary_says_what_the_plan_chose() -> None:
    doc = {**quantize_summary(100, 50, 2.0), "precisions": {"Conv": {"uint8 act, int8 weights": 1, "uint16 act, int8 weights": 1}},
           "activations": {"uint16": 1, "uint8": 2}}
    out = io.StringIO()
    quantization(Console(file=out, width=200), doc)
    text = out.getvalue()
    assert "Conv          1   uint16 act, int8 weights" in text and "Conv          1   uint8 act, int8 weights" in text
    assert "activations: uint16 x1, uint8 x2; weights: int8 per_channel x2; ranges by minmax" in text
