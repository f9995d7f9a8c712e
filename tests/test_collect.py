"""collect: the pipelined pass (reader thread, onnxruntime, observer thread) gives exactly the
statistics of a plain loop over the same batches, shares the work of tensors that only
rearrange another's values, and cleans up its threads on errors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import parse_model, write_npz
from qcli.calibrate.collect import collect, session_with_outputs, value_aliases
from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.sampling import SAMPLE_VALUES
from qcli.data import DataFolder, model_inputs
from qcli.errors import DataError

# q -> Reshape -> Transpose (values of q, rearranged), as in attention heads; s is not a
# rearrangement (Slice keeps part of the values) and must be observed on its own.
MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 6, 8] x) => (float[N, 2, 6, 4] t, float[N, 6, 4] s)
    <float[8, 8] w = {WEIGHTS}, int64[4] heads = {0, 6, 2, 4}, int64[1] zero = {0}, int64[1] four = {4},
     int64[1] last = {2}> {
    q = MatMul (x, w)
    r = Reshape (q, heads)
    t = Transpose <perm = [0, 2, 1, 3]> (r)
    s = Slice (q, zero, four, last)
}
""".replace("WEIGHTS", ", ".join(f"{v:.3f}" for v in np.linspace(-1.5, 2.0, 64)))

NAMES = ["x", "q", "r", "t", "s"]


@pytest.fixture
def model():
    return parse_model(MODEL)


def make_data(folder: Path, count: int, seed: int = 0) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(count):
        x = (rng.standard_normal((6, 8)) * (1 + i % 5)).astype(np.float32)
        write_npz(folder / f"{i:03d}.npz", x=x)
    return folder


def reference(
    model, folder: Path, batch_size: int, max_bins: int = 256, sample_values: int | None = SAMPLE_VALUES
) -> dict[str, dict]:
    """Every tensor observed directly, batch by batch, in one thread."""
    session = session_with_outputs(model, NAMES)
    observers = {name: TensorObserver(max_bins=max_bins, name=name, sample_values=sample_values) for name in NAMES}
    for batch in DataFolder(folder, model_inputs(model)).batches(batch_size):
        for name, value in zip(NAMES, session.run(NAMES, batch.inputs), strict=True):
            observers[name].update(value, samples=batch.size)
    return {name: obs.to_dict() for name, obs in observers.items()}


def test_aliases_follow_rearranging_chains(model) -> None:
    assert value_aliases(model, NAMES) == {"r": "q", "t": "q"}
    # Without q observed, the Transpose output is a rearrangement of the Reshape output.
    assert value_aliases(model, ["x", "r", "t", "s"]) == {"t": "r"}
    assert value_aliases(model, ["t", "x"]) == {}
    # The order of the names does not matter: aliases always point at a tensor observed itself.
    assert value_aliases(model, ["t", "r", "q"]) == {"r": "q", "t": "q"}


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_statistics_equal_a_plain_loop(model, tmp_path: Path, background: bool, batch_size: int) -> None:
    folder = make_data(tmp_path / "data", 17)
    expected = reference(model, folder, batch_size)
    got = collect(
        model, DataFolder(folder, model_inputs(model)), batch_size=batch_size, tensors=NAMES,
        max_bins=256, background=background,
    )
    # `batches` counts onnxruntime runs: the first sample runs alone (it measures the outputs'
    # size per sample), the rest in batches of `batch_size`.
    assert got.samples == 17 and got.batches == -(-17 // batch_size) + (batch_size > 1) and got.skipped == []
    assert got.aliases == {"r": "q", "t": "q"}
    assert list(got.observers) == NAMES
    for name in NAMES:
        assert got.observers[name].to_dict() == expected[name], name
    # The rearranged tensors keep their own shapes.
    assert got.observers["t"].shape == (batch_size if batch_size == 1 else None, 2, 6, 4)
    assert got.observers["r"].shape[1:] == (6, 2, 4)


def test_pooling_small_outputs_changes_nothing(model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qcli.calibrate import collect as collect_module

    folder = make_data(tmp_path / "data", 23)
    expected = reference(model, folder, 2)
    for pool in (1, 50, 100, 1000, 1 << 20):  # never, sometimes, always pooled; some batches bigger
        monkeypatch.setattr(collect_module._ObserverSink, "POOL", pool)
        for background in (True, False):
            got = collect(model, DataFolder(folder, model_inputs(model)), batch_size=2, tensors=NAMES,
                          max_bins=256, background=background)
            assert {n: o.to_dict() for n, o in got.observers.items()} == expected, (pool, background)


def test_sampled_histograms_do_not_depend_on_batching(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 48 values a sample, at least 8 binned: stride 5 (the largest prime <= 6 not dividing 48),
    # after the first 4 samples (binned whole).
    from qcli.calibrate import sampling as observers

    monkeypatch.setattr(observers, "WHOLE_SAMPLES", 4)
    folder = make_data(tmp_path / "data", 17)
    runs = {}
    for batch_size in (1, 3, 8):
        got = collect(model, DataFolder(folder, model_inputs(model)), batch_size=batch_size, tensors=NAMES,
                      max_bins=256, sample_values=8)
        expected = reference(model, folder, batch_size, sample_values=8)
        for name in ("x", "q", "s"):
            assert got.observers[name].to_dict() == expected[name], name
        for name in ("r", "t"):  # rearrangements of q: q's statistics (its subset), their own layout
            assert {**got.observers[name].to_dict(), "shape": None} == {**expected["q"], "shape": None}
        runs[batch_size] = {n: {**o.to_dict(), "shape": None} for n, o in got.observers.items()}
    assert runs[1] == runs[3] == runs[8]
    x = runs[1]["x"]
    assert x["count"] == 17 * 48 and x["binned"] == 4 * 48 + 13 * 10 and x["sample_values"] == 8
    values = np.concatenate([np.load(f)["x"].reshape(-1) for f in sorted(folder.glob("*.npz"))])
    assert (x["min"], x["max"]) == (float(values.min()), float(values.max()))  # over every value


def test_repeated_names_are_observed_once(model, tmp_path: Path) -> None:
    folder = make_data(tmp_path / "data", 5)
    got = collect(model, DataFolder(folder, model_inputs(model)), tensors=["q", "q", "x"], max_bins=256)
    assert list(got.observers) == ["q", "x"]
    assert got.observers["x"].count == 5 * 6 * 8


def test_progress_is_reported_per_run(model, tmp_path: Path) -> None:
    folder = make_data(tmp_path / "data", 10)
    seen: list[int] = []
    collect(model, DataFolder(folder, model_inputs(model)), batch_size=4, tensors=NAMES, progress=seen.append)
    assert seen == [1, 3, 4, 2]  # the first sample runs alone (it measures the outputs' size)


def test_a_bad_sample_file_stops_the_pass_and_its_threads(model, tmp_path: Path) -> None:
    folder = make_data(tmp_path / "data", 12)
    (folder / "007.npz").write_bytes(b"not an npz")
    before = threading.active_count()
    with pytest.raises(DataError, match="007.npz"):
        collect(model, DataFolder(folder, model_inputs(model)), batch_size=2, tensors=NAMES)
    assert threading.active_count() == before


def test_an_observer_error_reaches_the_caller(model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_data(tmp_path / "data", 12)
    calls = []

    def failing_update(self, x, samples=1):
        calls.append(self.name)
        if len(calls) > 3:
            raise MemoryError("observer ran out of memory")

    monkeypatch.setattr(TensorObserver, "update_layout", failing_update)
    before = threading.active_count()
    with pytest.raises(MemoryError, match="observer ran out of memory"):
        collect(model, DataFolder(folder, model_inputs(model)), batch_size=1, tensors=NAMES)
    assert threading.active_count() == before


def test_an_onnxruntime_failure_names_the_batch(tmp_path: Path) -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x, int64[N, 1] i) => (float[N, 1] y) {
            y = GatherElements <axis = 1> (x, i)
        }
        """
    )
    folder = tmp_path / "data"
    folder.mkdir()
    for k in range(6):  # sample 4 indexes out of bounds
        write_npz(folder / f"{k}.npz", x=np.ones(4, np.float32), i=np.array([9 if k == 4 else 1]))
    before = threading.active_count()
    with pytest.raises(DataError, match=r"onnxruntime failed on .*4\.npz"):
        collect(model, DataFolder(folder, model_inputs(model)), batch_size=1, tensors=["x", "y"])
    assert threading.active_count() == before

    # The hint says whose model fails: the one given (here the same), or qcli's prepared one.
    with pytest.raises(DataError) as err:
        collect(model, DataFolder(folder, model_inputs(model)), batch_size=1, tensors=["x", "y"], reference=model)
    assert err.value.hint.startswith("the model fails on this sample as given, before any change by qcli")
    fine = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x, int64[N, 1] i) => (float[N, 4] y) {
            y = Identity (x)
        }
        """
    )
    with pytest.raises(DataError) as err:
        collect(model, DataFolder(folder, model_inputs(model)), batch_size=1, tensors=["x", "y"], reference=fine)
    assert err.value.hint == ("the model as given runs on this sample, so qcli's preparation broke it: this is a "
                              "bug in qcli; rerun with --debug and report it")


def test_batches_do_not_pile_up_behind_a_slow_observer(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Memory stays flat: onnxruntime runs at most two batches ahead of the observers (one
    # queued, one being observed), however slow they are.
    import time

    folder = make_data(tmp_path / "data", 12)
    observed: list[int] = []
    update = TensorObserver.update_layout  # called once per batch and tensor

    def slow_update(self, x, samples=1):
        if self.name == "x":
            time.sleep(0.02)
        update(self, x, samples)
        if self.name == "x":
            observed.append(samples)

    monkeypatch.setattr(TensorObserver, "update_layout", slow_update)
    lags: list[int] = []
    ran: list[int] = []

    def progress(n: int) -> None:
        ran.append(n)
        lags.append(len(ran) - len(observed))

    got = collect(model, DataFolder(folder, model_inputs(model)), batch_size=1, tensors=NAMES, progress=progress)
    assert got.observers["x"].samples == 12 and len(observed) == 12
    assert max(lags) <= 2 and max(lags) >= 1  # it did run ahead, by two batches at most


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("samples_per_run, runs", [(0, 17), (3, 8)])
def test_large_outputs_are_run_in_smaller_parts(model, tmp_path: Path, monkeypatch, background, samples_per_run, runs) -> None:
    # A budget below one sample's outputs runs (and observes) one sample at a time; a budget of
    # 3 samples' outputs cuts the batches of 8, 8, 1 into runs of 1+3+3+1, 3+3+2, 1. Statistics
    # stay the same.
    import qcli.calibrate.collect as collect_module

    folder = make_data(tmp_path / "data", 17)
    expected = reference(model, folder, 8)
    one = next(iter(DataFolder(folder, model_inputs(model)).batches(1)))
    per_sample = sum(v.nbytes for v in session_with_outputs(model, NAMES).run(NAMES, one.inputs))
    monkeypatch.setattr(collect_module, "RUN_OUTPUT_BYTES", max(samples_per_run * per_sample, 1))
    got = collect(
        model, DataFolder(folder, model_inputs(model)), batch_size=8, tensors=NAMES, max_bins=256,
        background=background,
    )
    assert got.samples == 17 and got.batches == runs
    for name in NAMES:
        assert {**got.observers[name].to_dict(), "shape": None} == {**expected[name], "shape": None}, name


def test_runs_aim_at_the_target_below_the_bound(model, tmp_path: Path, monkeypatch) -> None:
    # A target of 2 samples' outputs, far below the bound: the batches of 8, 8, 1 run as
    # 1+2+2+2+1, 2+2+2+2, 1 (the first sample alone measures them), none waits to be observed,
    # and the statistics stay the same.
    import qcli.calibrate.collect as collect_module

    folder = make_data(tmp_path / "data", 17)
    expected = reference(model, folder, 8)
    one = next(iter(DataFolder(folder, model_inputs(model)).batches(1)))
    per_sample = sum(v.nbytes for v in session_with_outputs(model, NAMES).run(NAMES, one.inputs))
    monkeypatch.setattr(collect_module, "RUN_TARGET_BYTES", 2 * per_sample)
    waits: list[bool] = []
    put = collect_module._ObserverSink.put

    def recording_put(self, values, samples, wait=False):
        waits.append(wait)
        put(self, values, samples, wait)

    monkeypatch.setattr(collect_module._ObserverSink, "put", recording_put)
    got = collect(model, DataFolder(folder, model_inputs(model)), batch_size=8, tensors=NAMES, max_bins=256)
    assert got.samples == 17 and got.batches == 10 and not any(waits)
    for name in NAMES:
        assert {**got.observers[name].to_dict(), "shape": None} == {**expected[name], "shape": None}, name


def test_a_session_with_outputs_leaves_the_model_as_it_was(model) -> None:
    """The observed tensors are outputs of the session only: the model (no copy of it is made,
    its weights would be held twice) gets its own outputs back, byte for byte."""
    before = model.SerializeToString(deterministic=True)
    own = [o.name for o in model.graph.output]
    session = session_with_outputs(model, NAMES + NAMES[:1])  # a name twice counts once
    assert [o.name for o in session.get_outputs()] == own + [n for n in NAMES if n not in own]
    assert model.SerializeToString(deterministic=True) == before
