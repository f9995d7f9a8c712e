"""Issue 20 at the CLI boundary: YAML that qcli cannot read (recursive, too deep, duplicate keys,
scalars their tag cannot convert), outputs that cannot be written (checked before the work),
values no setting means (NaN, infinity, a reversed range, numbers too big to use), and `--debug`
keeping the exit code. Each runs through the CLI and checks the exit code and the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SAMPLE_MODELS

MLP = SAMPLE_MODELS / "mlp"
DEEP = "[" * 5000 + "]" * 5000 + "\n"
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{prev}'] * 10)}]\n" for prev, k in zip("abcde", "bcdef", strict=True)
)


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(result) -> str:
    """The stderr of a run that exited 2 without a traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def boom(*args: object, **kwargs: object) -> None:
    raise AssertionError("the work started before the outputs were checked")


# --------------------------------------------------------------------------- YAML qcli cannot read

UNREADABLE = [
    ("a: &a [*a]\n", ":1:8: recursive alias *a: it is inside its own anchor &a"),
    ("calibration: &c {method: *c}\n", ":1:26: recursive alias *c: it is inside its own anchor &c"),
    (DEEP, ":1:101: nesting deeper than 100 levels"),
    (LAUGHS, ":6:36: the aliases expand to more than 1,000,000 values"),
    ("calibration:\n  method: kl\ncalibration:\n  method: mse\n", ":3:1: duplicate key 'calibration' (first on line 1)"),
    ("calibration: {method: kl, method: mse}\n", ":1:27: duplicate key 'method' (first on line 1)"),
    ("calibration: {samples: 2024-13-45}\n", ":1:24: cannot read '2024-13-45' as timestamp: month must be in 1..12"),
    ("calibration: {samples: !!int abc}\n",
     ":1:24: cannot read 'abc' as int: invalid literal for int() with base 10: 'abc'"),
]


@pytest.mark.parametrize(("text", "message"), UNREADABLE)
def test_yaml_qcli_cannot_read_is_exit_2_naming_file_line_and_problem(cli, tmp_path: Path, text: str,
                                                                      message: str) -> None:
    path = write(tmp_path, text)
    assert refused(cli("config", "validate", path)) == f"error: {path}{message}\n"


@pytest.mark.parametrize(("text", "message"), [UNREADABLE[0], UNREADABLE[2], UNREADABLE[4]])
def test_quantize_and_run_refuse_it_too(cli, tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    result = cli("quantize", MLP / "model.onnx", "-o", tmp_path / "q.onnx", "--data", MLP / "calib", "--config", path)
    assert refused(result) == f"error: {path}{message}\n"
    pipeline = write(tmp_path, text, "pipeline.yaml")
    assert refused(cli("run", pipeline)) == f"error: {pipeline}{message}\n"


def test_a_pipeline_with_a_duplicate_key_or_a_recursive_inline_config(cli, tmp_path: Path) -> None:
    base = f"model: {MLP / 'model.onnx'}\noutput: q.onnx\ncalibration_data: {MLP / 'calib'}\n"
    pipeline = write(tmp_path, base + "output: other.onnx\n", "pipeline.yaml")
    assert refused(cli("run", pipeline)) == f"error: {pipeline}:4:1: duplicate key 'output' (first on line 2)\n"
    pipeline = write(tmp_path, base + "config: &c {calibration: *c}\n", "pipeline.yaml")
    assert refused(cli("run", pipeline)) == (
        f"error: {pipeline}:4:26: recursive alias *c: it is inside its own anchor &c\n"
    )


def test_aliases_and_merge_keys_that_override_still_read(cli, tmp_path: Path) -> None:
    path = write(tmp_path, "exclude: {nodes: &n [a, b], tensors: *n}\n<<: {calibration: {method: kl}}\n"
                           "calibration: {method: mse}\n")
    doc = cli.json("config", "show", "--config", path)
    assert doc["exclude"]["tensors"] == ["a", "b"] and doc["calibration"]["method"] == "mse"


# --------------------------------------------------------------------------- values no setting means


@pytest.mark.parametrize(("text", "message"), [
    ("calibration: {percentile: .nan}\n", ":1: calibration.percentile: Input should be a finite number (got nan)"),
    ("verify: {time_budget: .inf}\n", ":1: verify.time_budget: Input should be a finite number (got inf)"),
    ("overrides: [{match: {nodes: [a]}, range: [.nan, 1]}]\n",
     ":1: overrides[0].range[0]: Input should be a finite number (got nan)"),
    ("overrides: [{match: {nodes: [a]}, range: [1, -1]}]\n",
     ":1: overrides[0].range: Value error, the range is reversed (low above high): write [low, high] (got [1, -1])"),
    ("weights: {granularity: per_block, block_size: 1180591620717411303424}\n",
     ":1: weights.block_size: Input should be less than or equal to 65536 (got 1180591620717411303424)"),
    ("calibration: {1: 2}\n", ":1: calibration: keys should be strings, got 1"),
    (f"calibration: {{percentile: {list(range(100))}}}\n",
     ":1: calibration.percentile: Input should be a valid number (got [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, "
     "13, 14, 15, 16, 17, 18, 19, 20, ...)"),
])
def test_values_no_setting_means(cli, tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    assert refused(cli("config", "validate", path)) == f"error: {path}{message}\n"


def test_too_many_threads_is_exit_2(cli, tmp_path: Path) -> None:
    result = cli("analyze", MLP / "model.onnx", MLP / "model.onnx", "--data", MLP / "eval", "--threads", 99999999999)
    assert refused(result) == "error: threads: Input should be less than or equal to 1024\n"


def test_a_config_path_that_is_a_folder(cli, tmp_path: Path) -> None:
    assert refused(cli("config", "validate", tmp_path)) == (
        f"error: {tmp_path} is a folder, not a config file\nhint: pass the .yaml file\n"
    )


# --------------------------------------------------------------------------- outputs, before the work


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    return write(tmp_path, "not a folder\n", "a_file")


def test_quantize_checks_its_outputs_before_the_work(cli, tmp_path: Path, a_file: Path, monkeypatch) -> None:
    import qcli.commands

    monkeypatch.setattr(qcli.commands, "quantize_checked", boom)
    quantize = ("quantize", MLP / "model.onnx", "--data", MLP / "calib", "-o")
    assert refused(cli(*quantize, a_file / "sub" / "q.onnx")) == (
        f"error: cannot write the quantized model to {a_file / 'sub' / 'q.onnx'}: {a_file} is a file, not a folder\n"
    )
    assert refused(cli(*quantize, "/proc/qcli/q.onnx")) == (
        "error: cannot write the quantized model to /proc/qcli/q.onnx: cannot create the folder /proc/qcli "
        "(No such file or directory)\n"
    )
    assert refused(cli(*quantize, tmp_path)) == (
        f"error: cannot write the quantized model to {tmp_path}: it is a folder\nhint: give a file name\n"
    )
    assert refused(cli(*quantize, tmp_path / "q.onnx", "--auto-precision", "--precision-out", a_file / "p.yaml")) == (
        f"error: cannot write the precision config to {a_file / 'p.yaml'}: {a_file} is a file, not a folder\n"
    )


def test_the_check_leaves_no_folder_behind(cli, tmp_path: Path) -> None:
    result = cli("quantize", MLP / "model.onnx", "-o", tmp_path / "new" / "sub" / "q.onnx",
                 "--data", tmp_path / "no-data")
    assert "no-data" in refused(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_calibrate_analyze_and_config_init_check_their_outputs(cli, tmp_path: Path, a_file: Path,
                                                              monkeypatch) -> None:
    import qcli.commands

    monkeypatch.setattr(qcli.commands, "calibrate", boom)
    monkeypatch.setattr(qcli.commands, "analyze", boom)
    result = cli("calibrate", MLP / "model.onnx", "--data", MLP / "calib", "-o", "/proc/qcli/c.json")
    assert refused(result) == (
        "error: cannot write the calibration file to /proc/qcli/c.json: cannot create the folder /proc/qcli "
        "(No such file or directory)\n"
    )
    analyze = ("analyze", MLP / "model.onnx", MLP / "model.onnx", "--data", MLP / "eval", "--report")
    assert refused(cli(*analyze, a_file / "r.json")) == (
        f"error: cannot write the report to {a_file / 'r.json'}: {a_file} is a file, not a folder\n"
    )
    assert refused(cli(*analyze, tmp_path / "r.txt")) == (
        "error: cannot write a report as '.txt'\nhint: name the report file .json, .md or .html\n"
    )
    assert refused(cli("config", "init", "-o", tmp_path, "--force")) == (
        f"error: cannot write the config template to {tmp_path}: it is a folder\nhint: give a file name\n"
    )


def pipeline(tmp_path: Path, extra: str) -> Path:
    return write(tmp_path, f"model: {MLP / 'model.onnx'}\ncalibration_data: {MLP / 'calib'}\n{extra}",
                 "pipeline.yaml")


@pytest.mark.parametrize(("extra", "message"), [
    ("output: out\n", "cannot write the quantized model to {tmp}/out: it is a folder\nhint: give a file name"),
    ("output: q.onnx\ncalibration_file: a_file/c.json\n",
     "cannot write the calibration file to {tmp}/a_file/c.json: {tmp}/a_file is a file, not a folder"),
    (f"output: q.onnx\neval_data: {MLP / 'eval'}\nreports: [/proc/qcli/r.json]\n",
     "cannot write the report to /proc/qcli/r.json: cannot create the folder /proc/qcli (No such file or directory)"),
    (f"output: {MLP / 'model.onnx'}\n",
     "{tmp}/pipeline.yaml: output " + str(MLP / "model.onnx") + " is the model; qcli never overwrites its input\n"
     "hint: write the quantized model to another file"),
    ("output: q.onnx\nreports: [r.json]\n", "{tmp}/pipeline.yaml:4: reports and gates need eval_data (the data to "
     "measure on)"),
    ("output: q.onnx\nconfig: out\n", "{tmp}/out is a folder, not a config file\nhint: pass the .yaml file"),
])
def test_a_pipeline_checks_its_outputs_before_the_work(cli, tmp_path: Path, a_file: Path, monkeypatch,
                                                       extra: str, message: str) -> None:
    import qcli.pipeline

    monkeypatch.setattr(qcli.pipeline, "quantize_checked", boom)
    (tmp_path / "out").mkdir()
    result = cli("run", pipeline(tmp_path, extra))
    assert refused(result) == f"error: {message.format(tmp=tmp_path)}\n"


def test_the_writers_turn_an_os_error_into_exit_2(cli, tmp_path: Path, a_file: Path, monkeypatch) -> None:
    import qcli.flags

    monkeypatch.setattr(qcli.flags, "check_writable", lambda path, what: path)  # the last line of defence
    result = cli("quantize", MLP / "model.onnx", "-o", a_file / "q.onnx", "--data", MLP / "calib", "--no-verify")
    assert refused(result) == f"error: cannot write {a_file / 'q.onnx'}: {a_file} is a file, not a folder\n"
    result = cli("calibrate", MLP / "model.onnx", "--data", MLP / "calib", "--samples", 8, "-o", a_file / "c.json")
    assert refused(result) == f"error: cannot write {a_file / 'c.json'}: {a_file} is a file, not a folder\n"


# --------------------------------------------------------------------------- --debug keeps the exit code


def test_debug_shows_the_traceback_and_keeps_a_bad_input_exit_code(cli, tmp_path: Path) -> None:
    result = cli("config", "validate", tmp_path / "none.yaml", "--debug")
    assert result.exit_code == 2
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.endswith(f"\nerror: config file not found: {tmp_path / 'none.yaml'}\n")


def test_debug_keeps_a_failed_gate_exit_code(cli, tmp_path: Path) -> None:
    result = cli("analyze", MLP / "model.onnx", MLP / "model.onnx", "--data", MLP / "eval", "--runs", 0,
                 "--min-compression", 2, "--debug")
    assert result.exit_code == 1, result.stderr
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert "qcli.errors.GateFailed: " in result.stderr


def test_debug_keeps_an_internal_error_exit_code(cli, tmp_path: Path, monkeypatch) -> None:
    import qcli.commands

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a broken invariant")

    monkeypatch.setattr(qcli.commands, "inspect_command", broken)
    result = cli("inspect", MLP / "model.onnx", "--debug")
    assert result.exit_code == 3
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.endswith(
        "RuntimeError: a broken invariant\ninternal error: RuntimeError: a broken invariant\n"
        "hint: this is a bug in qcli; report the traceback above\n"
    )


def test_a_latency_batch_beyond_memory_is_exit_2(cli, tmp_path: Path) -> None:
    """A batch the machine cannot hold was a MemoryError reported as a bug (exit 3)."""
    result = cli("analyze", MLP / "model.onnx", MLP / "model.onnx", "--data", MLP / "calib",
                 "--latency-batch", str(10**12))
    assert refused(result).splitlines() == [
        "error: out of memory",
        "hint: lower --batch-size, --latency-batch or --samples, or run on a machine with more memory",
    ]


def test_local_workers_are_bounded(cli, tmp_path: Path) -> None:
    result = cli("calibrate", MLP / "model.onnx", "--data", MLP / "calib", "-o", tmp_path / "c.json",
                 "--workers", "100000")
    assert refused(result).startswith("error: --workers 100000 is more processes than one machine runs "
                                      "usefully (at most 256; this one has ")
