"""A detector's boxes judged as its users judge them (qcli.analyze.boxes): the layout recognised
from the values, detections thresholded and suppressed, matched at IoU 0.5, and the kind through
verification."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import parse_model, save, tensor_text, write_npz
from qcli.analyze.boxes import box_f1, box_layout, detections
from qcli.analyze.kinds import Kind, OutputKind, output_kinds
from qcli.analyze.metrics import FidelityAccumulator
from qcli.errors import ConfigError

RNG = np.random.default_rng(3)


def yolo_like(anchors_first: bool, n: int = 2, a: int = 64, classes: int = 3) -> np.ndarray:
    boxes = np.concatenate([RNG.uniform(0, 320, (n, a, 2)), RNG.uniform(4, 60, (n, a, 2))], axis=2)
    scores = RNG.uniform(0, 1, (n, a, classes))
    out = np.concatenate([boxes, scores], axis=2).astype(np.float32)
    return out if anchors_first else out.transpose(0, 2, 1).copy()


def test_decoded_boxes_are_recognised_either_way_round_and_nothing_else_is() -> None:
    assert box_layout([yolo_like(True)]) == 2 and box_layout([yolo_like(False)]) == 1
    raw = yolo_like(True)
    raw[..., :4] = RNG.normal(0, 1, raw[..., :4].shape)  # offsets to a grid and log sizes, before decoding
    assert box_layout([raw]) is None
    normalized = yolo_like(True)
    normalized[..., :4] /= 400  # boxes in image fractions: no different from scores
    assert box_layout([normalized]) is None
    softmax = RNG.dirichlet(np.ones(7), (2, 64)).astype(np.float32)  # a sequence's class scores
    assert box_layout([softmax]) is None


def test_suppression_is_per_class_and_matching_needs_the_class_and_half_the_area() -> None:
    rows = np.array([[100, 100, 40, 40, 0.9, 0.0],  # kept
                     [104, 100, 40, 40, 0.8, 0.0],  # suppressed by the first (IoU 0.82)
                     [104, 100, 40, 40, 0.0, 0.7],  # another class: kept
                     [300, 300, 10, 10, 0.2, 0.0]], np.float32)  # under the threshold
    found = detections(rows, 0.25)
    assert [(d.cls, round(d.score, 2)) for d in found] == [(0, 0.9), (1, 0.7)]
    shifted = rows.copy()
    shifted[0, 0] += 30  # IoU 400 / 2800 with where it was: another box
    shifted[1, 4] = 0.1  # and the box it suppressed, gone
    assert box_f1(found, detections(shifted, 0.25)) == pytest.approx(2 * 1 / 4)  # 1 matched of 2 + 2
    relabelled = rows.copy()
    relabelled[2, 4:] = [0.7, 0.0]  # now class 0, suppressed by the first box
    assert box_f1(found, detections(relabelled, 0.25)) == pytest.approx(2 * 1 / 3)
    assert box_f1([], []) == 1.0


W = tensor_text("w", RNG.standard_normal((8, 4)).astype(np.float32))
S = tensor_text("s", RNG.standard_normal((8, 3)).astype(np.float32))
DETECTOR = f"""<ir_version: 8, opset_import: ["" : 17]>
    net (float[N, 64, 8] x) => (float[N, 64, 7] y) <{W}, {S}, float k = {{40.0}}, float o = {{2.0}}> {{
        m = MatMul (x, w)  r = Relu (m)  p = Mul (r, k)  b = Add (p, o)
        c = MatMul (x, s)  q = Sigmoid (c)  y = Concat <axis = 2> (b, q) }}"""


def test_a_detectors_output_is_boxes_with_its_threshold() -> None:
    model = parse_model(DETECTOR)
    import onnxruntime as ort

    x = RNG.standard_normal((4, 64, 8)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    found = output_kinds(model, {"y": [y]})["y"]
    assert found.kind is Kind.BOXES and found.axis == 2 and found.threshold == 0.25
    assert found.reason == ("[4, 64, 7] decoded boxes with class scores (attributes on axis 2); detections scoring "
                            "0.25 (YOLO's; verify.thresholds sets another)")
    assert output_kinds(model, {"y": [y]}, thresholds={"y": 0.5})["y"].threshold == 0.5
    with pytest.raises(ConfigError, match="does not hold decoded boxes"):
        output_kinds(model, {"y": [y - 100]}, named={"y": "boxes"})


def test_boxes_catch_the_scores_a_shared_scale_wipes_out_where_the_cosine_does_not() -> None:
    """A Concat of pixel boxes (0-320) and probabilities (0-1) under one uint8 scale rounds
    every score to 0: no detection is left, and the output's cosine stays 0.9999 (the boxes fill
    it). Judged by its boxes, the output loses everything."""
    ref = yolo_like(False, n=8)
    ref[:, 4:] *= 0.6  # scores under 0.6, as a detector's mostly are
    scale = float(ref.max()) / 255
    wiped = np.round(ref / scale) * scale  # what one uint8 scale for the whole output keeps
    acc = FidelityAccumulator(OutputKind(Kind.BOXES, "", threshold=0.25, axis=1))
    acc.update(ref, wiped, 8)
    assert acc.boxes is not None and acc.boxes.boxes > 0 and acc.boxes.f1 == 0.0
    assert acc.cosine is not None and acc.cosine > 0.999


def test_quantize_verifies_a_detector_by_its_boxes_and_keeps_its_output_concat_float(cli, tmp_path: Path) -> None:
    model = save(parse_model(DETECTOR), tmp_path / "det.onnx")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(48):
        write_npz(data / f"{i:02d}.npz", x=RNG.standard_normal((1, 64, 8)).astype(np.float32))
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--no-rescue", "--json")
    doc = json.loads(result.stdout)
    (check,) = [c for c in doc["verification"]["checks"] if c["name"] == "boxes matched"]
    assert doc["verification"]["outputs"][0]["kind"] == "boxes" and check["value"] > 0
    assert doc["quantized"].get("Concat", 0) == 0  # the output's Concat reads its inputs in float


def test_boxes_are_pooled_over_the_samples_so_empty_crops_do_not_fill_the_figure() -> None:
    """Nineteen crops without a detection and one with four, two of them lost: 2 x 2 / (4 + 2).
    A mean of each crop's F1 would say 0.98 (NudeNet's held-out photos: 0.97 where its users'
    F1 was 0.73)."""
    empty = np.zeros((20, 8, 6), np.float32)  # [N, A, 4 + 2]
    empty[..., :4] = [50, 50, 10, 10]
    ref, got = empty.copy(), empty.copy()
    for k, x in enumerate((20, 80, 140, 200)):
        ref[0, k] = [x, 50, 30, 30, 0.9, 0.0]
        got[0, k] = [x, 50, 30, 30, 0.9 if k < 2 else 0.1, 0.0]
    acc = FidelityAccumulator(OutputKind(Kind.BOXES, "", threshold=0.25, axis=2))
    acc.update(ref, got, 20)
    assert acc.boxes is not None and (acc.boxes.boxes, acc.boxes.found, acc.boxes.matched) == (4, 2, 2)
    assert acc.boxes.f1 == pytest.approx(2 / 3)
    low, high = acc.agreement_interval or (0, 0)
    assert low < 2 / 3 < high and high < 0.99  # three boxes' worth: wide, and clear below 0.99
