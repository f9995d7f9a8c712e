"""The simulation (qcli.simulation): fed a candidate's plan, it computes what the candidate's
real Q/DQ model computes unfused, to the bit; what it does not emulate it says (None); the
search's quick trials run on it and choose what the real models choose."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import normal_folder, parse_model, save, write_npz
from qcli.config import load_config
from qcli.data import DataFolder, model_inputs
from qcli.errors import CalibrationError
from qcli.plan import make_plan
from qcli.precision.trials import Alone, Trials
from qcli.precision.units import alone, find_units, promoted_config
from qcli.quantize import calibrate, plan_for, prepare_for, quantize
from qcli.runtime import session_options
from qcli.simulation import IDENTITY, Simulation

EMBEDDINGS = """
<ir_version: 8, opset_import: ["" : 17]>
e (int64[N, T] ids) => (float[N, T, 16] y, float[N, T, 6] z) <float[64, 16] t1 = {T1}, float[16] b = {B},
                                                         float[32, 8] t2 = {T2}, float[8, 6] w = {W}> {
    g1 = Gather (t1, ids)
    y = Add (g1, b)
    g2 = Gather (t2, ids)
    m = MatMul (g2, w)
    z = Relu (m)
}
"""


def _values(shape: tuple[int, ...], seed: int) -> str:
    return "{" + ", ".join(f"{v:.5f}" for v in np.random.default_rng(seed).normal(0, 0.5, shape).ravel()) + "}"


def _unfused(model: onnx.ModelProto) -> ort.InferenceSession:
    """A session running the model's nodes as written: Q/DQ pairs as pairs, not fused kernels."""
    options = session_options(1)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class _Setup:
    def __init__(self, path: Path, data: Path) -> None:
        self.model = onnx.load(str(path))
        self.config = load_config(None)
        self.prepared = prepare_for(self.model, self.config)
        folder = DataFolder(data, model_inputs(self.model), reading=self.config.data.reading)
        self.table = calibrate(self.model, folder, self.config, prepared=self.prepared, methods=("mse",))
        self.batches = list(folder.batches(4))
        work = self.prepared.model
        self.units = find_units(work, make_plan(work, self.config))
        self.int8 = quantize(self.model, self.config, self.table, prepared=self.prepared)
        self.simulation = Simulation.of(work, self.int8.plan, self.prepared.quantized)
        self.session = _unfused(self.simulation.model)
        self.names = [o.name for o in work.graph.output]

    def compare(self, choices: dict | Alone) -> bool:
        """The candidate's real model and the simulation fed its plan give the same outputs;
        False when the calibration cannot build it (neither its model nor its plan)."""
        try:
            self._compare(choices)
        except CalibrationError:
            return False
        return True

    def _compare(self, choices: dict | Alone) -> None:
        work = self.prepared.model
        if isinstance(choices, Alone):
            unit = next(u for u in self.units if u.node == choices.unit)
            restrict = lambda plan, graph: alone(plan, graph, unit)  # noqa: E731
            real = quantize(self.model, self.config, self.table, prepared=self.prepared, restrict=restrict).model
            plan = plan_for(work, self.config, self.table, restrict=restrict)
        else:
            config = promoted_config(self.config, choices, self.units)
            real = quantize(self.model, config, self.table, prepared=self.prepared).model
            plan = plan_for(work, config, self.table)
        feeds = self.simulation.feeds(plan)
        assert feeds is not None, choices
        reference = _unfused(real)
        for batch in self.batches:
            want = reference.run(self.names, batch.inputs)
            got = self.session.run(self.names, {**batch.inputs, **feeds})
            for name, w, g in zip(self.names, want, got, strict=True):
                assert np.array_equal(w, g), (choices, name, np.abs(w - g).max())


@pytest.fixture
def residual_setup(residual: Path, tmp_path: Path) -> _Setup:
    data = normal_folder(tmp_path / "rdata", 12, x=(2, 4, 8, 8))
    return _Setup(residual, data)


def test_the_simulation_computes_every_candidate_as_its_real_model(residual_setup: _Setup) -> None:
    """All int8; each unit float (the input x is read by a float Conv and a quantized Add);
    each int16; two at once; one unit alone (the sensitivity report's candidates)."""
    s = residual_setup
    assert [u.node for u in s.units] == ["Conv_0", "Conv_2", "Add_3", "GlobalAveragePool_5", "Gemm_7"]
    candidates = [{}, *({u.node: p} for u in s.units for p in ("float", "int16")), *(Alone(u.node) for u in s.units),
                  {s.units[0].node: "float", s.units[-1].node: "int16"}]
    assert all(s.compare(c) for c in candidates)


def test_a_unit_promoted_to_float_reads_unquantized_where_its_neighbour_reads_quantized(residual_setup: _Setup) -> None:
    """x feeds the first Conv and the residual Add: promoting the Conv gives it the identity row
    while the Add's chain keeps x's scale."""
    s = residual_setup
    conv = s.units[0].node
    feeds = s.simulation.feeds(plan_for(s.prepared.model, promoted_config(s.config, {conv: "float"}, s.units), s.table))
    assert feeds is not None
    rows = {(t, i): r for (t, i, _), r in s.simulation.rows.items() if t == "x"}
    assert len(rows) == 2
    scales = sorted(float(feeds["qsim.scale"][r]) for r in rows.values())
    assert scales[0] == np.float32(IDENTITY[0]) and scales[1] > 1e-3


def test_embedding_tables_are_simulated_int8_by_column_and_by_their_group(tmp_path: Path) -> None:
    """A Gather-only table goes int8 per column (the `gather` form); a table whose rows a
    quantized MatMul reads is quantized with its group's scale (`Group.constant`)."""
    text = EMBEDDINGS.replace("{T1}", _values((64, 16), 1)).replace("{B}", _values((16,), 2)).replace(
        "{T2}", _values((32, 8), 3)).replace("{W}", _values((8, 6), 4))
    path = save(parse_model(text), tmp_path / "emb.onnx")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        write_npz(data / f"{i}.npz", ids=np.random.default_rng(i).integers(0, 32, (2, 5)))
    s = _Setup(path, data)
    assert any(d.form == "gather" for d in s.int8.plan.dynamic.values())
    assert any(g.constant == "t2" for g in s.int8.plan.groups)
    s.compare({})
    assert sum(s.compare({unit.node: "float"}) for unit in s.units) >= 2


def test_what_the_simulation_does_not_emulate_it_says(residual_setup: _Setup) -> None:
    """A dynamic choice is measured on its real model: `feeds` gives None."""
    s = residual_setup
    gemm = next(u for u in s.units if u.op_type == "Gemm")
    plan = plan_for(s.prepared.model, promoted_config(s.config, {gemm.node: "dynamic"}, s.units), s.table)
    assert plan.dynamic
    assert s.simulation.feeds(plan) is None


def test_the_search_on_the_simulation_chooses_what_it_chooses_on_real_models(cli, tmp_path: Path, monkeypatch) -> None:
    """Auto-precision on an MLP with one layer of extreme outliers, the simulation on (it is off
    by default: qcli.precision.simulated): the quick trials run on it (`verify/search/simulate`),
    and the promotions and the model written are those of the search that builds every
    candidate."""
    from test_verify import mlp, mlp_data

    model, data = save(mlp(True), tmp_path / "sensitive.onnx"), mlp_data(tmp_path / "data", 160, True)
    evaluation = mlp_data(tmp_path / "eval", 48, True, seed=7)
    config = tmp_path / "untimed.yaml"
    config.write_text("verify: {max_latency_ratio: null}\n")
    docs, outs = [], []
    for simulated in (True, False):
        monkeypatch.setattr("qcli.verify.Trials", partial(Trials, simulate=simulated))
        out = tmp_path / f"{simulated}.onnx"
        docs.append(cli.json("quantize", model, "-o", out, "--data", data, "--eval-data", evaluation, "--auto-precision",
                             "--max-accuracy-drop", "0.01", "--config", config))
        outs.append(out.read_bytes())
    assert docs[0]["phases"]["verify/search/simulate"]["calls"] >= 3
    assert "verify/search/simulate" not in docs[1]["phases"]
    assert docs[0]["precision"]["promoted"] == docs[1]["precision"]["promoted"] != {}
    assert outs[0] == outs[1]
