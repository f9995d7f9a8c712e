"""qdq's broken invariants are bugs, not bad input: they raise InternalError (exit 3)."""

from __future__ import annotations

import pytest
from onnx import helper

from conftest import parse_model
from qcli.config import Config
from qcli.errors import InternalError, QcliError
from qcli.plan import make_plan
from qcli.prepare import prepare
from qcli.qdq import _toposort, materialize

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
        _toposort(nodes, available={"x"})


def test_internal_error_is_not_a_user_error() -> None:
    assert not issubclass(InternalError, QcliError)
