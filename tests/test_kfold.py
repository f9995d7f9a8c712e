"""k-fold verification (issue #17): a folder too small to hold samples back is still judged on
samples each candidate's calibration never read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import parse_model, save, write_npz
from qcli.calibrate.shards import plan_folds
from qcli.calibrate.table import METHODS
from qcli.config import Config
from qcli.data import DataFolder, model_inputs
from qcli.quantize import calibrate

MLP = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 6] x) => (float[N, 4] y)
    <float[6, 5] w1 = {W1}, float[5] b1 = {0.1, -0.2, 0.3, 0, 0.05}, float[5, 4] w2 = {W2}> {
    h = Gemm (x, w1, b1)
    r = Relu (h)
    y = MatMul (r, w2)
}
"""

# Top-1 of two scores: class 0 when x0 > 36 (logits = (x0, 36 + x1 / 100)). Fold k (8 samples)
# holds one sample with x0 = 10k + 15; the others' x0 is at most 3. Calibrated on every sample, x's
# range reaches 45 and nothing flips; fold 3 compared on a model calibrated on folds 0-2 has its
# x0 = 45 clipped at 35 < 36: that sample flips, as a sample the calibration never saw would.
IDENTITY = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 2] x) => (float[N, 2] logits) <float[2, 2] w = {1, 0, 0, 0.01}, float[2] b = {0, 36}> {
    logits = Gemm (x, w, b)
}
"""


def mlp_text() -> str:
    rng = np.random.default_rng(3)
    values = lambda n: "{" + ", ".join(f"{v:.4f}" for v in rng.normal(0, 0.5, n)) + "}"  # noqa: E731
    return MLP.replace("{W1}", values(30)).replace("{W2}", values(20))


def outlier_data(folder: Path) -> Path:
    x = np.random.default_rng(0).uniform(0, 3, (32, 2)).astype(np.float32)
    x[::8, 0] = [15, 25, 35, 45]
    folder.mkdir()
    write_npz(folder / "data.npz", x=x)
    return folder


def test_fold_tables_equal_calibrating_on_the_other_folds_alone(tmp_path: Path) -> None:
    model = parse_model(mlp_text())
    x = np.random.default_rng(1).normal(0, 1, (32, 6)).astype(np.float32)
    x[5, 2] = 9.0  # an outlier in fold 0 only: fold 0's table must not see it
    (tmp_path / "all").mkdir()
    write_npz(tmp_path / "all" / "data.npz", x=x)
    inputs, config = model_inputs(model), Config()
    folds = plan_folds(32, 4, config.calibration.batch_size)
    folded = calibrate(model, DataFolder(tmp_path / "all", inputs), config, methods=METHODS, folds=folds)
    whole = calibrate(model, DataFolder(tmp_path / "all", inputs), config, methods=METHODS)
    assert folded.ranges == whole.ranges and folded.samples == 32 and not whole.folds
    for k, fold in enumerate(folds):
        others = np.concatenate([x[: fold.first], x[fold.first + fold.samples:]])
        (tmp_path / f"without{k}").mkdir()
        write_npz(tmp_path / f"without{k}" / "data.npz", x=others)
        alone = calibrate(model, DataFolder(tmp_path / f"without{k}", inputs), config, methods=METHODS)
        assert folded.folds[k].ranges == alone.ranges, k
        assert folded.folds[k].samples == 24
    assert folded.folds[0].ranges["minmax"]["x"] != whole.ranges["minmax"]["x"]  # the outlier left out


def test_plan_folds_cut_at_batches_and_never_leave_a_fold_empty() -> None:
    assert [(f.first, f.samples) for f in plan_folds(60, 4, 8)] == [(0, 16), (16, 16), (32, 16), (48, 12)]
    assert [f.samples for f in plan_folds(3, 4, 8)] == [1, 1, 1]
    assert [f.samples for f in plan_folds(17, 4, 8)] == [4, 4, 5, 4]


@pytest.fixture
def identity(tmp_path: Path) -> tuple[Path, Path, Path]:
    (tmp_path / "kinds.yaml").write_text("version: 1\nverify: {outputs: {logits: top1}}\n")
    return save(parse_model(IDENTITY), tmp_path / "identity.onnx"), outlier_data(tmp_path / "data"), tmp_path / "kinds.yaml"


def test_kfold_sees_the_flip_the_calibration_samples_hide_and_the_rescue_fixes_it(cli, identity, tmp_path) -> None:
    model, data, config = identity
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--config", config)
    v = doc["verification"]
    assert v["data"] == (f"{data} samples 1-32 in 4 folds: 32 compared, each fold on a model calibrated on the "
                         "other 3 folds (at least 24 samples); the model written is calibrated on all 32 (the folder "
                         "is too small to hold 16 back)")
    assert v["passed"] and v["samples"] == 32
    assert doc["precision"]["promoted"], "the flip in fold 3 must send the Gemm to the rescue"


def test_one_fold_compares_on_the_calibration_samples_and_sees_nothing(cli, identity, tmp_path) -> None:
    model, data, _ = identity
    (tmp_path / "one.yaml").write_text("version: 1\nverify: {outputs: {logits: top1}, folds: 1}\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--config", tmp_path / "one.yaml")
    v = doc["verification"]
    assert "also calibration samples" in v["data"]
    assert v["passed"] and v["checks"][0]["value"] == 1.0 and doc["precision"] is None


def test_fold_bias_shifts_equal_measuring_on_the_other_folds_alone(tmp_path: Path) -> None:
    """Bias correction under k-fold: each fold's model is corrected by shifts measured on the
    other folds' samples alone (as its ranges are), never on the samples it is compared on."""
    from qcli.holdout import calibrate_planned, plan_samples
    from qcli.quantize import measure_bias_shifts, prepare_for

    model = parse_model(mlp_text())
    x = np.random.default_rng(4).normal(0, 1, (32, 6)).astype(np.float32)
    x[:8] += 2.0  # fold 0's inputs sit elsewhere: so do the shifts measured with them
    (tmp_path / "all").mkdir()
    write_npz(tmp_path / "all" / "data.npz", x=x)
    inputs = model_inputs(model)
    config = Config.model_validate({"recovery": ["bias_correction"]})
    prepared = prepare_for(model, config)
    plan = plan_samples(tmp_path / "all", None, config, inputs)
    plan, folded = calibrate_planned(model, config, tmp_path / "all", plan, prepared)
    assert folded.bias_shifts and len(folded.folds) == 4
    for k, fold in enumerate(plan_folds(32, 4, config.calibration.batch_size)):
        (tmp_path / f"without{k}").mkdir()
        write_npz(tmp_path / f"without{k}" / "data.npz", x=np.concatenate([x[: fold.first], x[fold.first + fold.samples:]]))
        others = DataFolder(tmp_path / f"without{k}", inputs)
        alone = calibrate(model, others, config)
        measure_bias_shifts(model, config, alone, [others], prepared=prepared)
        assert folded.folds[k].bias_shifts == alone.bias_shifts, k
    assert folded.folds[0].bias_shifts != folded.bias_shifts


def test_the_fold_tables_go_once_the_search_ends(identity) -> None:
    """After the rescue's search only the whole table is read: its fold tables (their histograms:
    tashkeel's were 15 MB) are dropped, and the model is the same."""
    from qcli.config import load_config
    from qcli.model import load_model
    from qcli.verify import quantize_checked

    model, data, config = identity
    outcome = quantize_checked(load_model(model), load_config(config), data=data)
    assert outcome.promoted and outcome.table.folds == [] and outcome.table.observers
