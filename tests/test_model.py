"""Model loading, fingerprinting, atomic saving and validation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conftest import IMAGE_MODEL, LIGHT_MODELS, parse_model, save
from qcli.errors import InternalError, ModelError
from qcli.lazy import deferred, tensor_array
from qcli.model import (
    check_model,
    clamp_ir_version,
    external_data_files,
    fingerprint,
    load_model,
    max_ir_version,
    save_model,
    without_initializers,
)
from qcli.runtime import make_session


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=f"model file not found: {tmp_path / 'x.onnx'}"):
        load_model(tmp_path / "x.onnx")


def test_folder_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="is a folder, not an ONNX model file"):
        load_model(tmp_path)


@pytest.mark.parametrize("content", [b"", b"hello, this is not a model\n", b"\x08\x07"])
def test_non_onnx_bytes(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError) as err:
        load_model(path)
    assert str(err.value) == (
        f"{path} is not a valid ONNX model (the file is empty, truncated or of another format)"
    )


def test_truncated_real_model(tmp_path: Path) -> None:
    data = (LIGHT_MODELS / "light_squeezenet.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="is not a valid ONNX model"):
        load_model(path)


def _model_with_weight(value: float) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((64, 64), value, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 64])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = max_ir_version()
    return model


def test_external_data_is_read_and_missing_data_reported(tmp_path: Path) -> None:
    model = _model_with_weight(0.5)
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    loaded = load_model(path)
    assert deferred(loaded.graph.initializer[0])  # left in its file until read
    assert tensor_array(loaded.graph.initializer[0])[0, 0] == 0.5
    assert external_data_files(load_model(path, load_external_data=False)) == ["ext.onnx.data"]
    assert fingerprint(loaded) == fingerprint(_model_with_weight(0.5))  # same weights, same hash
    (tmp_path / "ext.onnx.data").unlink()
    with pytest.raises(ModelError, match=f"cannot read the external data of {path}: ext.onnx.data: No such file"):
        load_model(path)


def test_deferred_weights_run_and_are_written_whole(tmp_path: Path) -> None:
    """A model read with its weights left in its .data file runs in onnxruntime from there, and
    is written as the same bytes as the same model held whole: nothing points into the input's
    files."""
    model = _model_with_weight(0.25)
    path = tmp_path / "in" / "ext.onnx"
    path.parent.mkdir()
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    loaded = load_model(path)
    x = np.ones((2, 64), np.float32)
    assert np.allclose(make_session(loaded).run(None, {"x": x})[0], 16.0)
    assert loaded.graph.initializer[0].external_data[0].value == str(path.parent / "ext.onnx.data")  # as it was
    save_model(loaded, tmp_path / "a.onnx")
    save_model(_model_with_weight(0.25), tmp_path / "b.onnx")  # onnx's save made `model` external
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


@pytest.mark.parametrize(("location", "offset", "message"), [
    ("../outside.data", 0, "tensor 'w' points outside the model's folder ('../outside.data')"),
    ("ext.onnx.data", 8, "tensor 'w' lies past the end of ext.onnx.data (8 + 16384 > 16384 bytes)"),
])
def test_external_data_out_of_bounds_is_refused(tmp_path: Path, location: str, offset: int, message: str) -> None:
    model = _model_with_weight(0.5)
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    (tmp_path.parent / "outside.data").write_bytes(b"\0" * 16384)
    stored = onnx.load(str(path), load_external_data=False)
    for entry in stored.graph.initializer[0].external_data:
        entry.value = {"location": location, "offset": str(offset)}.get(entry.key, entry.value)
    path.write_bytes(stored.SerializeToString())
    with pytest.raises(ModelError, match=re.escape(f"cannot read the external data of {path}: {message}")):
        load_model(path)


def test_a_string_initializers_fingerprint_is_its_values() -> None:
    """Strings hash by their values (their array's buffer holds pointers, different each load)."""
    def model(values: list[bytes]) -> onnx.ModelProto:
        graph = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [2])],
                                  [helper.make_tensor("s", onnx.TensorProto.STRING, [2], values)])
        return helper.make_model(graph)

    assert fingerprint(model([b"ab", b"c"])) == fingerprint(model([b"ab", b"c"]))
    assert fingerprint(model([b"ab", b"c"])) != fingerprint(model([b"ab", b"d"]))


def test_fingerprint_covers_weights_not_metadata() -> None:
    a, b = _model_with_weight(0.5), _model_with_weight(0.5)
    b.producer_name = "someone else"
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(_model_with_weight(0.25))
    assert fingerprint(a).startswith("sha256:") and len(fingerprint(a)) == 71


def test_save_is_atomic_and_deterministic(tmp_path: Path) -> None:
    model = parse_model(IMAGE_MODEL)
    out = tmp_path / "sub" / "out.onnx"
    save_model(model, out)
    first = out.read_bytes()
    save_model(model, out)
    assert out.read_bytes() == first
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.onnx"]  # no temp files left
    check_model(out)


def test_failed_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous")

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(OSError, match="disk full"):
        save_model(parse_model(IMAGE_MODEL), out)
    monkeypatch.undo()
    assert out.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"]


def unloadable() -> onnx.ModelProto:
    """A model the ONNX checker passes (ops of an unknown domain are not checked) and
    onnxruntime refuses (no kernel for the op). An IR version above onnxruntime's is not such a
    model everywhere: onnxruntime 1.32 loads every IR version onnx 1.23's checker accepts."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "unloadable",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    return clamp_ir_version(model)


def test_check_model_reports_what_onnxruntime_refuses_as_a_bug(tmp_path: Path) -> None:
    path = save(unloadable(), tmp_path / "frobnicate.onnx")
    with pytest.raises(InternalError, match="onnxruntime cannot load the model written to"):
        check_model(path)


def test_max_ir_version_is_what_onnxruntime_loads() -> None:
    assert 7 <= max_ir_version() <= onnx.IR_VERSION


def test_checked_save_never_leaves_an_invalid_model(tmp_path: Path) -> None:
    model = unloadable()
    out = tmp_path / "out.onnx"
    with pytest.raises(InternalError, match=f"onnxruntime cannot load the model written to {out}"):
        save_model(model, out, check=True)
    assert list(tmp_path.iterdir()) == []


def test_a_model_past_the_in_memory_limit_loads_through_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime takes a model of 2 GiB or more only from a file: past `_INLINE_LIMIT` (set
    to 0 here) the session is made from a temporary file, with the same outputs."""
    from qcli import runtime

    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) <float[2] w = {1.5, -2.0}> { y = Mul(x, w) }
    """)
    x = {"x": np.array([2.0, 3.0], np.float32)}
    inline = runtime.make_session(model).run(None, x)[0]
    monkeypatch.setattr(runtime, "_INLINE_LIMIT", 0)
    assert runtime._serialized(model) is None
    assert runtime.make_session(model).run(None, x)[0].tolist() == inline.tolist() == [3.0, -6.0]


def test_a_copy_without_initializers_holds_everything_else() -> None:
    """`without_initializers` (made field by field, so that its protobuf arena never holds the
    weights) is the model less its main-graph initializers: put back, the same bytes."""
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 17], producer_name: "exporter">
        g (float[N, 4] x) => (float[N, 4] y) <float[4] w = {1.0, 2.0, 3.0, 4.0}> { y = Add(x, w) }
    """)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(1 << 18, np.float32), "big"))
    shell = without_initializers(model)
    assert len(shell.graph.initializer) == 0 and shell.ByteSize() < 1024
    shell.graph.initializer.extend(model.graph.initializer)
    assert shell.SerializeToString() == model.SerializeToString()


def test_a_session_keeps_no_copy_of_the_serialized_model() -> None:
    """onnxruntime's Python session keeps the bytes it was made from, to remake itself on
    another provider; qcli's sessions run on CPU alone and drop them (a float reference
    session held its whole model again for the run)."""
    from qcli import runtime

    model = parse_model(IMAGE_MODEL)
    session = runtime.make_session(model)
    assert getattr(session, "_model_bytes", None) is None
    assert session.run(None, {"image": np.ones((1, 1, 4, 4), np.float32)})[0].shape == (1, 3)


def test_a_session_loads_large_weights_from_a_buffer_it_then_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """From ASIDE_MIN_BYTES of inline weights (and below the size that loads through a file), a
    session loads them from a temporary in-memory buffer (onnxruntime copies them; nothing
    serializes them): the same outputs, bit for bit, as the session loading them inline, and no
    buffer left behind once it exists."""
    import gc

    from qcli import runtime

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 512] x) => (float[N, 1024] y) { y = MatMul(x, w) }
    """)
    rng = np.random.default_rng(3)
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((512, 1024), np.float32), "w"))
    x = {"x": rng.standard_normal((4, 512), np.float32)}
    held = len(runtime._SHARED)
    aside = runtime.make_session(model)
    gc.collect()
    assert len(runtime._SHARED) == held and runtime._weights_aside(model)[1] is not None
    monkeypatch.setattr(runtime, "_INLINE_LIMIT", 1 << 20)  # a model that loads through a file keeps that way
    assert runtime._weights_aside(model)[1] is None
    monkeypatch.undo()
    monkeypatch.setattr(runtime, "ASIDE_MIN_BYTES", 1 << 40)
    assert runtime._weights_aside(model)[1] is None
    assert np.array_equal(aside.run(None, x)[0], runtime.make_session(model).run(None, x)[0])


def _two_weights(changed: bool) -> onnx.ModelProto:
    """y = (x @ w) + b, a 512 KB w and a 4 KB b; b scaled by 2 when `changed`."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 128] x) => (float[N, 1024] y) { t = MatMul(x, w)  y = Add(t, b) }
    """)
    rng = np.random.default_rng(5)
    b = rng.standard_normal(1024).astype(np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(rng.standard_normal((128, 1024), np.float32), "w"),
                                    numpy_helper.from_array(2 * b if changed else b, "b")])
    return model


def test_a_loan_references_the_tensors_the_lender_holds_byte_for_byte() -> None:
    """`Loan`: the model's initializers that the lender holds byte for byte become references
    (the others stay inline), its sessions compute what the model's did, bit for bit, `inlined`
    gives the whole model back, and once the block ends the references resolve no more."""
    from qcli import runtime

    model, lender = _two_weights(False), _two_weights(True)
    x = {"x": np.random.default_rng(1).standard_normal((3, 128), np.float32)}
    expected = runtime.make_session(model).run(None, x)[0]
    original = model.SerializeToString()
    with runtime.Loan(model, lender) as light:
        kinds = {t.name: t.data_location for t in light.graph.initializer}
        assert kinds == {"w": onnx.TensorProto.EXTERNAL, "b": onnx.TensorProto.DEFAULT}
        assert light.ByteSize() < 8 * 1024  # w is not in it
        assert np.array_equal(runtime.make_session(light).run(None, x)[0], expected)
        assert runtime.inlined(light).SerializeToString() == original
    assert runtime.inlined(light) is light
    with pytest.raises(ModelError, match="onnxruntime cannot load the model"):
        runtime.make_session(light)


def test_a_model_past_the_in_memory_limit_borrows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Such a model loads through a file, with no second copy of its weights in memory: a loan
    would make one (its buffer), so there is none."""
    from qcli import runtime

    monkeypatch.setattr(runtime, "_INLINE_LIMIT", 1 << 16)
    model = _two_weights(False)
    with runtime.Loan(model, _two_weights(False)) as light:
        assert light is model


def test_a_loan_keeps_no_reference_to_the_model_it_was_made_from() -> None:
    """A caller that hands over the only reference (`Owned`) frees the model's weights when
    the loan's copy replaces it: the loan holds the lender, not the model."""
    import sys

    from qcli import runtime
    from qcli.model import Owned

    handed = Owned(_two_weights(False))
    model = handed.take()
    with pytest.raises(ValueError, match="taken already"):
        handed.take()
    before = sys.getrefcount(model)
    loan = runtime.Loan(model, _two_weights(False))
    assert sys.getrefcount(model) == before
    with loan as light:
        assert light is not model and loan.model is None


def test_a_model_past_the_protobuf_limit_is_written_with_external_data(tmp_path: Path, monkeypatch) -> None:
    """Written beside a `.data` file of the same name in the working directory (the input's, when
    qcli runs in the input model's folder): onnx's own external-data save refused that."""
    import qcli.model

    values = ", ".join(["0.5"] * 512)
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 512] x) => (float[N, 512] y) <float[512] w = {{{values}}}> {{ y = Add(x, w) }}""")
    monkeypatch.setattr(qcli.model, "PROTOBUF_LIMIT", 64 * 2**20 + 16)  # this tiny model counts as past it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx.data").write_bytes(b"the input's weights")
    out = tmp_path / "out" / "m.onnx"
    save_model(model, out, check=True)
    assert (tmp_path / "out" / "m.onnx.data").stat().st_size == 512 * 4
    assert (tmp_path / "m.onnx.data").read_bytes() == b"the input's weights"
    back = load_model(out)
    assert np.array_equal(tensor_array(back.graph.initializer[0]), np.full(512, 0.5, np.float32))
