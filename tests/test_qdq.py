"""qdq's broken invariants are bugs, not bad input: they raise InternalError (exit 3)."""

from __future__ import annotations

import pytest
from onnx import helper

from conftest import parse_model
from qcli.config import Config
from qcli.errors import InternalError, QcliError
from qcli.graph import toposort
from qcli.plan import make_plan
from qcli.prepare import prepare
from qcli.qdq import materialize

MATMUL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4] x) => (float[N, 2] y) <float[4, 2] w = {1, 2, 3, 4, 5, 6, 7, 8}> {
    y = MatMul (x, w)
}
"""


def test_group_without_qparams_is_an_internal_error() -> None:
    model = prepare(parse_model(MATMUL)).model
    plan = make_plan(model, Config())  # assign_ranges not run: no group has a scale
    assert plan.groups and all(g.scale is None for g in plan.groups)
    with pytest.raises(InternalError, match="has no qparams"):
        materialize(model, plan)


def test_cycle_in_the_quantized_graph_is_an_internal_error() -> None:
    nodes = [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    with pytest.raises(InternalError, match="cycle"):
        toposort(nodes, available={"x"})


def test_internal_error_is_not_a_user_error() -> None:
    assert not issubclass(InternalError, QcliError)


def test_a_control_flow_body_reads_the_quantized_value_so_its_relu_folds(cli, tmp_path) -> None:
    """An If body that reads a quantized activation by outer-scope name reads its
    DequantizeLinear, as every other reader does: so the Relu before the QuantizeLinear folds
    into onnxruntime's QLinearConv (kept, that Conv ran float with its int8 weight dequantized
    each run: Silero VAD's encoder), and the body still reads the clipped value (read under the
    float name after the Relu was dropped, it got the Conv's unclipped output: Silero's int8
    output noise 14.5 x the signal)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    from conftest import fused_op_counts, save, write_npz
    from qcli.runtime import make_session

    rng = np.random.default_rng(3)
    body = helper.make_graph([helper.make_node("Identity", ["r"], ["t"])], "then",
                             [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["r"], ["e"])], "else",
                              [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=other)],
        "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8]),
                helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path, out = save(model, tmp_path / "if.onnx"), tmp_path / "q.onnx"
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        write_npz(data / f"{i}.npz", x=np.random.default_rng(i).normal(size=(2, 4, 8, 8)).astype(np.float32), c=np.array(True))
    cli.json("quantize", path, "-o", out, "--data", data, "--no-verify")
    written = onnx.load(str(out)).graph
    assert "Relu" not in [n.op_type for n in written.node]
    branch = next(n for n in written.node if n.op_type == "If").attribute[0].g
    assert [list(n.input) for n in branch.node] == [["r_dequantized"]]
    fused = fused_op_counts(out, tmp_path)
    assert fused["QLinearConv"] == 2 and fused["Conv"] == fused["FusedConv"] == 0, fused
    x = rng.normal(size=(2, 4, 8, 8)).astype(np.float32)
    z = make_session(out).run(["z"], {"x": x, "c": np.array(True)})[0]
    want = make_session(path).run(["z"], {"x": x, "c": np.array(True)})[0]
    assert z.min() >= 0 and float((z * want).sum() / np.linalg.norm(z) / np.linalg.norm(want)) > 0.99
