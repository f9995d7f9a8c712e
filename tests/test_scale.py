"""Scale-out calibration: shards merge into exactly the single-process statistics, whatever the
executor; failures in workers are reported naming the sample or the shard."""

from __future__ import annotations

import functools
import os
import shutil
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLE_MODELS
from qcli.calibrate.shards import _batch_starts, plan_shards
from qcli.config import load_config
from qcli.data import DataFolder, InputSpec, model_inputs
from qcli.errors import CalibrationError, DataError, QcliError, WorkerLost
from qcli.executor import LocalExecutor, SerialExecutor, make_executor
from qcli.model import load_model
from qcli.quantize import calibrate, quantize

CNN = SAMPLE_MODELS / "cnn"


class Sharded:
    """In-process executor that still splits the work into `workers` shards."""

    def __init__(self, workers: int):
        self.workers, self.threads = workers, None

    def map(self, fn, items, done=None):
        return SerialExecutor().map(fn, items, done)


@pytest.fixture(scope="module")
def cnn():
    return load_model(CNN / "model.onnx")


def _config(samples: int, batch_size: int = 8):
    return load_config(None).merged(calibration={"samples": samples, "batch_size": batch_size})


def _folder(model, path: Path, samples: int) -> DataFolder:
    return DataFolder(path, model_inputs(model), samples=samples)


def _run(model, path: Path, config, executor=None):
    """The calibration file's text and the quantized model's bytes."""
    table = calibrate(model, _folder(model, path, config.calibration.samples), config, executor=executor)
    return table.to_json(), quantize(model, config, table).model.SerializeToString()


# ------------------------------------------------------------------------------ shard plans


def _npy_folder(tmp_path: Path, sizes: list[int]) -> DataFolder:
    """A folder of .npy files holding `sizes` samples each, for a [N, 2] input."""
    folder = tmp_path / "sized"
    folder.mkdir()
    for i, size in enumerate(sizes):
        np.save(folder / f"{i:03d}.npy", np.zeros((size, 2), np.float32))
    return DataFolder(folder, [InputSpec("x", np.dtype(np.float32), ("N", 2))])


def test_batch_starts_follow_the_batching_rule() -> None:
    assert _batch_starts([1] * 10, 4, True) == [True, False, False, False] * 2 + [True, False]
    # 3 + 3 > 4: the second file starts a batch; 5 is split into 4 + 1, the 1 stays pending.
    assert _batch_starts([3, 3, 5, 2, 1], 4, True) == [True, True, True, False, False]
    assert _batch_starts([1, 1, 1], 8, False) == [True, True, True]


def test_shards_start_at_batch_boundaries(tmp_path: Path) -> None:
    folder = _npy_folder(tmp_path, [1] * 20)
    shards = plan_shards(folder, 2, 8)
    assert [(s.start, s.stop, s.first, s.samples) for s in shards] == [(0, 8, 0, 8), (8, 20, 8, 12)]
    assert [(s.start, s.stop) for s in plan_shards(folder, 3, 4)] == [(0, 8), (8, 12), (12, 20)]
    assert len(plan_shards(folder, 8, 16)) == 2  # only file 16 starts a batch
    folder.limit = 13  # --samples 13: the last shard stops there
    assert [(s.start, s.stop, s.samples) for s in plan_shards(folder, 2, 4)] == [(0, 8, 8), (8, 13, 5)]


def test_subset_holds_paths_of_its_files_only(tmp_path: Path) -> None:
    folder = _npy_folder(tmp_path, [2, 3, 4])
    part = folder.subset(1, 3, samples=5)
    assert [e.rel for e in part.entries] == ["001.npy", "002.npy"]
    assert len(part) == 5 and len(folder) == 9
    assert sum(s.size for s in part) == 5


# ------------------------------------------------------------------ sharded == single process


@pytest.mark.parametrize(("samples", "batch_size", "workers"), [(64, 8, 2), (61, 5, 3), (20, 8, 1)])
def test_sharded_calibration_equals_single_process(cnn, samples: int, batch_size: int, workers: int) -> None:
    config = _config(samples, batch_size)
    single = _run(cnn, CNN / "calib", config)
    sharded = _run(cnn, CNN / "calib", config, Sharded(workers))
    assert sharded[0] == single[0]  # the calibration file: statistics, ranges, batch shapes
    assert sharded[1] == single[1]  # the quantized model, byte for byte


def test_local_executor_with_two_workers(cnn) -> None:
    config = _config(96)
    single = _run(cnn, CNN / "calib", config)
    with LocalExecutor(2) as executor:
        assert executor.threads == max(1, len(os.sched_getaffinity(0)) // 2)
        sharded = _run(cnn, CNN / "calib", config, executor)
    assert sharded == single


def test_cli_workers_give_the_same_model(cli, tmp_path: Path) -> None:
    outputs = []
    for workers in ("1", "2"):
        out = tmp_path / f"cnn.{workers}.onnx"
        doc = cli.json("quantize", CNN / "model.onnx", "-o", out, "--data", CNN / "calib", "--samples", "64",
                       "--workers", workers)
        assert doc["output"] == str(out)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


# ----------------------------------------------------------------------------- failures


@pytest.fixture
def bad_data(tmp_path: Path) -> Path:
    """24 CNN samples, the 20th corrupt (in the second of two shards)."""
    folder = tmp_path / "bad"
    folder.mkdir()
    for source in sorted((CNN / "calib").glob("*.npz"))[:24]:
        shutil.copyfile(source, folder / source.name)
    (folder / "00019.npz").write_bytes(b"not a zip archive")
    return folder


def test_a_bad_sample_in_a_worker_names_the_file(cnn, bad_data: Path) -> None:
    config = _config(24)
    with pytest.raises(DataError) as single:
        calibrate(cnn, _folder(cnn, bad_data, 24), config)
    with LocalExecutor(2) as executor, pytest.raises(DataError) as sharded:
        calibrate(cnn, _folder(cnn, bad_data, 24), config, executor=executor)
    assert single.value.message.startswith(f"cannot read {bad_data / '00019.npz'}: ")
    assert (sharded.value.message, sharded.value.hint) == (single.value.message, single.value.hint)


def _square(x: int) -> int:
    return x * x


def _raise_data_error(x: int) -> int:
    raise DataError(f"sample {x} is bad", hint="fix it")


def _die_once(marker: str, x: int) -> int:
    """Dies the first time it sees item 2 (the marker file remembers), then works."""
    if x == 2 and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return x * x


def _die_on_file(fn, name: str, task):
    """Run a calibration shard, except the shard starting at file `name`: its worker dies."""
    if task.folder.entries[0].rel == name:
        os._exit(1)
    return fn(task)


def test_local_executor_keeps_item_order_and_errors() -> None:
    done = []
    with LocalExecutor(2) as executor:
        assert executor.map(_square, list(range(7)), done=lambda i, r: done.append((i, r))) == [
            i * i for i in range(7)
        ]
        with pytest.raises(DataError) as error:
            executor.map(_raise_data_error, [1])
    assert sorted(done) == [(i, i * i) for i in range(7)]
    assert (error.value.message, error.value.hint) == ("sample 1 is bad", "fix it")


def test_a_dead_worker_is_retried_once(tmp_path: Path) -> None:
    with LocalExecutor(2) as executor:
        marker = str(tmp_path / "died")
        assert executor.map(functools.partial(_die_once, marker), [0, 1, 2, 3]) == [0, 1, 4, 9]
        assert os.path.exists(marker)


def test_a_worker_that_dies_twice_names_the_shard(cnn, bad_data: Path) -> None:
    class Dying(LocalExecutor):
        def map(self, fn, items, done=None):
            return super().map(functools.partial(_die_on_file, fn, "00008.npz"), items, done)

    (bad_data / "00019.npz").unlink()  # 23 good samples: shards 0..7 and 8..22
    with Dying(2) as executor, pytest.raises(CalibrationError) as error:
        calibrate(cnn, _folder(cnn, bad_data, 23), _config(23), executor=executor)
    message = error.value.message
    assert message == (
        f"a calibration worker died twice on shard 2 of 2: samples 8..22, from {bad_data / '00008.npz'}"
    )
    assert error.value.hint == "the machine may be out of memory: use fewer --workers or a smaller --batch-size"


def test_worker_lost_message() -> None:
    assert str(WorkerLost(1, 4)) == "a worker died twice running item 2 of 4"


def test_executor_choices(monkeypatch) -> None:
    assert isinstance(make_executor("local", 1), SerialExecutor)
    assert make_executor("local", 3).workers == 3
    for args, message in (
        (("process", 2), "unknown executor 'process'"),
        (("local", 0), "--workers must be at least 1, got 0"),
        (("local", 2, "auto"), "--ray-address needs --executor ray"),
    ):
        with pytest.raises(QcliError) as error:
            make_executor(*args)
        assert error.value.message == message
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(QcliError) as error:
        make_executor("ray", 2)
    assert error.value.message.startswith("--executor ray needs Ray, which is not installed")
    assert error.value.hint == "install the extra: pip install 'qcli[ray]'"


def test_cli_refuses_executor_flags_without_data(cli, tmp_path: Path) -> None:
    result = cli("quantize", CNN / "model.onnx", "-o", tmp_path / "q.onnx", "--calib", tmp_path / "c.json",
                 "--workers", "2")
    assert result.exit_code == 2
    assert ("error: --executor, --workers and --ray-address apply to calibration and the precision search: "
            "use them with --data or --auto-precision") in result.stderr.replace("\n", " ")


# ---------------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'qcli[ray]'; .ci/run does)")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_executor_matches_single_process(ray_instance, cnn, bad_data: Path) -> None:
    from qcli.executor import RayExecutor

    config = _config(64)
    single = _run(cnn, CNN / "calib", config)
    with RayExecutor(2) as executor:
        assert (executor.workers, executor.threads) == (2, 1)
        assert _run(cnn, CNN / "calib", config, executor) == single
        with pytest.raises(DataError) as error:
            calibrate(cnn, _folder(cnn, bad_data, 24), _config(24), executor=executor)
    assert error.value.message.startswith(f"cannot read {bad_data / '00019.npz'}: ")
    assert ray_instance.is_initialized()  # an instance it did not start is left running


def test_ray_executor_starts_and_stops_its_own_instance(ray_instance) -> None:
    from qcli.executor import RayExecutor

    ray_instance.shutdown()
    try:
        with RayExecutor(2) as executor:
            assert ray_instance.is_initialized()
            assert executor.map(abs, [-3, 4]) == [3, 4]  # Ray workers cannot import this test module
        assert not ray_instance.is_initialized()
    finally:
        ray_instance.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)


def test_an_unreachable_ray_address_fails_fast() -> None:
    from qcli.executor import _check_reachable

    _check_reachable("auto")  # left to Ray
    with pytest.raises(QcliError) as error:
        _check_reachable("127.0.0.1:1")
    assert error.value.message.startswith("cannot reach the Ray cluster at 127.0.0.1:1: ")


def test_a_worker_that_died_between_maps_is_replaced() -> None:
    with LocalExecutor(1) as executor:
        assert executor.map(_square, [2]) == [4]
        for process in list(executor._pool._processes.values()):
            process.kill()
            process.join()
        assert executor.map(_square, [3]) == [9]


def test_a_worker_killed_while_sending_a_result_does_not_hang_the_pool() -> None:
    # Half a result on the pipe, as a worker killed in the middle of sending 300 KB leaves it:
    # the pool's manager thread then reads it, waiting for the rest.
    executor = LocalExecutor(1)
    assert executor.map(_square, [2]) == [4]
    pool = executor._pool
    manager = pool._executor_manager_thread
    os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 300_000) + b"half")
    time.sleep(0.2)
    executor._terminate()
    manager.join(timeout=10)
    stuck = manager.is_alive()
    if stuck:  # let the test process exit to report the failure
        os.write(pool._result_queue._writer.fileno(), bytes(300_000 - 4))
    assert not stuck


def test_precision_search_trials_on_ray_match_one_process(ray_instance, tmp_path: Path) -> None:
    """The rescue's sensitivity trials on two Ray workers: same search steps, outcome and model
    bytes as in one process. (The rescue promotes layers a and b; that model is mostly float, so
    the weight-only step writes 16-bit weights instead: test_verify's rescue test.)"""
    from test_verify import mlp, mlp_data

    from qcli.config import Config
    from qcli.executor import RayExecutor
    from qcli.verify import quantize_checked

    model = mlp(True)
    data = mlp_data(tmp_path / "data", 160, True)
    single = quantize_checked(model, Config(), data=data)
    with RayExecutor(2) as executor:
        spread = quantize_checked(model, Config(), data=data, executor=executor)
    assert single.search is not None and spread.search is not None
    assert [s.changed for s in single.search.steps] == [s.changed for s in spread.search.steps]
    assert any(s.changed for s in single.search.steps)
    assert single.search.choices == spread.search.choices != {}
    assert (single.promoted, single.weight_only) == (spread.promoted, spread.weight_only)
    assert single.result.model.SerializeToString() == spread.result.model.SerializeToString()
