"""qcli: quantize float ONNX models to fast, small, accurate QDQ models, and prove it."""

from __future__ import annotations

__version__ = "0.1.0"
