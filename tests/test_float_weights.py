"""The summary's weights left float (qcli.census.float_weights): how many bytes, which share of
the weights, and why, for a user asking why a model came out little smaller."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from tests.conftest import _values, parse_model, save

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 32] x, int64 trips, bool cond) => (float[N, 32] y, float[N, 32] z)
    <float[32, 32] m = {M}, float[32, 32] e = {E}> {
    h = MatMul (x, m)
    y = Einsum <equation = "nk,kj->nj"> (h, e)
    z = Loop (trips, cond, h) <body = g (int64 i, bool c, float[N, 32] s) => (bool c2, float[N, 32] s2) {
        w = Constant <value = float[32, 32] {W}> ()
        c2 = Identity (c)
        s2 = MatMul (s, w)
    }>
}
"""


def test_the_summary_says_which_weights_stay_float_and_why(cli, tmp_path: Path) -> None:
    """A MatMul's weight int8; the Loop body's own weight moved to the main graph and stored as
    integers too (qcli.prepare.hoist); the Einsum's (no int8 kernel) float: its bytes, share and
    reason in `--json` and in the summary. The Loop computes as before, from the folded weight."""
    text = MODEL.replace("{M}", _values(1024, 1)).replace("{E}", _values(1024, 2)).replace("{W}", _values(1024, 3))
    model = save(parse_model(text), tmp_path / "m.onnx")
    data = tmp_path / "calib"
    data.mkdir()
    for i in range(4):  # the Loop's trip count and condition beside x
        x = np.random.default_rng(i).normal(size=(2, 32)).astype(np.float32)
        np.savez(data / f"{i:03d}.npz", x=x, trips=np.array(2, np.int64), cond=np.array(True))
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--no-verify", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert any(n.startswith("moved 1 weight(s) (0.00 MB) out of Loop/Scan/If bodies") for n in doc["notes"])
    left = doc["float_weights"]
    assert left["bytes"] == 4096 and 0.5 < left["share"] < 0.7  # beside two int8 weights of 1024 bytes and scales
    assert left["why"] == [{"reason": "Einsum: no int8 kernel for this op", "tensors": 1, "bytes": 4096}]
    written = onnx.load(str(tmp_path / "q.onnx"))
    assert {t.name for t in written.graph.initializer if t.data_type == onnx.TensorProto.INT8} >= {"w_1_quantized"}
    feeds = {"x": np.ones((2, 32), np.float32), "trips": np.array(2, np.int64), "cond": np.array(True)}
    got, want = (ort.InferenceSession(str(m), providers=["CPUExecutionProvider"]).run(["z"], feeds)[0]
                 for m in (tmp_path / "q.onnx", model))
    np.testing.assert_allclose(got, want, rtol=0.1, atol=0.5)
    text = " ".join(cli("quantize", model, "-o", tmp_path / "q2.onnx", "--data", data, "--no-verify").stdout.split())
    assert "weights left float: 4.0 KiB" in text and "1 read by Einsum: no int8 kernel for this op" in text
