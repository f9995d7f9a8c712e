"""Target profiles (issue 44): the kernels onnxruntime runs, priced by a profile, decide latency;
the same model, data and config give the same bytes and exit code whatever the clock says."""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import SAMPLE_MODELS, normal_folder, parse_model, save
from qcli.errors import ConfigError
from qcli.target import Profile, load_profile, predict, priced, resolve, shipped
from qcli.target.executed import executed
from qcli.target.kernels import Kernel, Operand, kernel
from qcli.target.profile import Cost

CONV = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[1, 8, {SIZE}, {SIZE}] x) => (float[1, 16, {SIZE}, {SIZE}] y) <float[16, 8, 3, 3] w = {WEIGHTS}> {
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    y = Relu (c)
}
"""

QDQ_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[1, 8, {SIZE}, {SIZE}] x) => (float[1, 16, {SIZE}, {SIZE}] y)
    <float s = {0.02}, uint8 z = {128}, int8[16, 8, 3, 3] wq = {WEIGHTS}, float[16] ws = {SCALES},
     int8[16] wz = {ZEROS}> {
    xq = QuantizeLinear (x, s, z)
    xd = DequantizeLinear (xq, s, z)
    w = DequantizeLinear <axis = 0> (wq, ws, wz)
    c = Conv <pads = [1, 1, 1, 1]> (xd, w)
    yq = QuantizeLinear (c, s, z)
    y = DequantizeLinear (yq, s, z)
}
"""


def conv_models(size: int = 16) -> tuple:
    rng = np.random.default_rng(0)
    weights = "{" + ", ".join(f"{v:.3f}" for v in rng.normal(0, 0.1, 16 * 8 * 9)) + "}"
    ints = "{" + ", ".join(str(int(v)) for v in rng.integers(-100, 100, 16 * 8 * 9)) + "}"
    float_model = parse_model(CONV.replace("{WEIGHTS}", weights).replace("{SIZE}", str(size)))
    qdq = parse_model(QDQ_CONV.replace("{SIZE}", str(size)).replace("{WEIGHTS}", ints).replace("{SCALES}", "{" + ", ".join(["0.01"] * 16) + "}")
                      .replace("{ZEROS}", "{" + ", ".join(["0"] * 16) + "}"))
    return float_model, qdq, {"x": rng.standard_normal((1, 8, size, size)).astype(np.float32)}


def test_the_executed_graph_is_onnxruntimes_after_its_fusions() -> None:
    """The QDQ Conv runs as one QLinearConv (int8 class) with its MACs counted from the weight's
    dims (the profile shows the prepacked weight's shape, not them); the float Conv + Relu as a
    convolution with a fused activation."""
    float_model, qdq, feeds = conv_models()
    convs = [k for k in executed(qdq, feeds) if k.cls.startswith("conv")]
    assert [(k.op, k.cls, k.work) for k in convs] == [("QLinearConv", "conv.i8", 16 * 16 * 16 * 8 * 9)]
    fused = [k for k in executed(float_model, feeds) if k.cls == "conv.f32"]
    assert len(fused) == 1 and fused[0].work == 16 * 16 * 16 * 8 * 9 and fused[0].fused == 16 * 16 * 16
    assert not any(k.op == "Relu" for k in executed(float_model, feeds))


def test_the_profile_prices_by_op_then_class_then_fallback() -> None:
    p = Profile(name="t", kind="rules", kernels={
        "memory": Cost(terms={"call": 1.0}), "conv.f32": Cost(terms={"call": 10.0}),
        "conv.i8:QLinearConv": Cost(terms={"call": 3.0}), "qdq": Cost(like="memory", factor=2.0)})
    assert p.price(Kernel("a", "QLinearConv", "conv.i8")) == 3.0
    assert p.price(Kernel("b", "ConvInteger", "conv.i8")) == 10.0  # conv.i8 -> conv.f32
    assert p.price(Kernel("c", "DequantizeLinear", "qdq")) == 2.0
    assert p.price(Kernel("d", "Softmax", "memory")) == 1.0


@pytest.mark.parametrize(("kernels", "message"), [
    ({"conv.f32": {"terms": {"call": 1}}}, "kernels: no 'memory' entry (what every op without an entry"),
    ({"memory": {"like": "qdq"}, "qdq": {"like": "memory"}}, "kernels: 'like' goes round in a loop: memory -> qdq"),
    ({"memory": {"like": "x"}}, "kernels: memory: 'like: x' names no entry"),
    ({"memory": {"terms": {"calls": 1}}}, "kernels.memory.terms.calls.[key]: Input should be 'call', 'mac'"),
    ({"memory": {"terms": {"call": 1}, "like": "x"}}, "kernels.memory: give exactly one of terms or like"),
])
def test_a_bad_profile_file_is_refused_naming_the_key(tmp_path: Path, kernels: dict, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "qcli-target/1", "name": "p", "kind": "rules", "kernels": kernels}))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    assert str(err.value).startswith(f"target profile {path}: {message}")


@pytest.mark.parametrize(("text", "message"), [
    ('{"format": "qcli-target/1",\n "name": }', "target profile {path}:2:10: not JSON: Expecting value"),
    ('{"format": "qcli-target/1",\n "name": "a\x01"}',
     "{path}:2:12: remove the control character U+0001: a target profile cannot hold it"),
])
def test_an_unreadable_profile_names_line_and_column(tmp_path: Path, cli, text: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    result = cli("target", "show", path)
    assert result.exit_code == 2
    assert "error: " + message.format(path=path) in result.stderr


def test_auto_takes_the_measured_profile_this_cpu_has_the_flags_of() -> None:
    measured = [n for n in shipped() if resolve(n)[0].kind == "measured"]
    assert measured, "qcli ships a measured profile"
    flags = frozenset(resolve(measured[0])[0].cpu_flags)
    assert resolve("auto", flags)[0].name == measured[0]
    profile, why = resolve("auto", frozenset({"sse2"}))
    assert profile.name == "generic" and "generic's rules" in why


def test_shipped_profiles_load_and_price_every_class() -> None:
    from qcli.target.kernels import CLASSES

    for name in shipped():
        profile = resolve(name)[0]
        assert all(profile.price(Kernel("n", "X", cls, 1e6, 1e6, 1e3)) > 0 for cls in CLASSES), name


def test_a_prediction_is_a_pure_function_of_the_model_and_the_profile(monkeypatch) -> None:
    """The same figures with a clock that returns random times (the profile's durations are
    never read). The measured profile prices a 64-channel 3x3 QLinearConv on a 28x28 map below
    its float convolution (profiled here: 90 against 276 us; on the 8-channel 16x16 one below
    the two cost the same, their fixed cost); generic's rules credit int8 compute with no speed."""
    float_model, qdq, feeds = conv_models()
    profile = resolve("x86-64-avx512vnni")[0]
    first = [predict(m, feeds, profile) for m in (float_model, qdq)]
    monkeypatch.setattr(time, "perf_counter_ns", lambda: random.randrange(1 << 40))
    monkeypatch.setattr(time, "perf_counter", lambda: random.random() * 1e6)
    assert [predict(m, feeds, profile) for m in (float_model, qdq)] == first
    x, y = Operand("uint8", (1, 64, 28, 28)), Operand("uint8", (1, 64, 28, 28))
    w = Operand("int8", (64, 64, 3, 3), True)
    q = kernel("q", "QLinearConv", [x, Operand("float", ()), Operand("uint8", ()), w], [y], {})
    f = kernel("f", "Conv", [Operand("float", x.shape), Operand("float", w.shape, True)], [Operand("float", y.shape)], {})
    assert (q.cls, f.cls) == ("conv.i8", "conv.f32") and profile.price(q) < profile.price(f) / 2
    generic = resolve("generic")[0]
    assert predict(qdq, feeds, generic).us >= predict(float_model, feeds, generic).us


def test_priced_sums_each_nodes_calls() -> None:
    p = Profile(name="t", kind="rules", run_us=5, kernels={"memory": Cost(terms={"moved": 0.5})})
    ks = [Kernel("loop/body", "Add", "memory", moved=4), Kernel("loop/body", "Add", "memory", moved=4)]
    assert priced(ks, p).nodes == {"loop/body": 4.0} and priced(ks, p).us == 9.0


def near_parity_data(tmp_path: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_latency_verdict import near_parity

    return near_parity(tmp_path), normal_folder(tmp_path / "data", 24, x=(1, 32, 40, 40))


def test_the_same_bytes_and_exit_code_with_a_clock_that_returns_random_times(cli, tmp_path: Path,
                                                                             monkeypatch) -> None:
    model, data = near_parity_data(tmp_path)
    first = cli("quantize", model, "-o", tmp_path / "a.onnx", "--data", data, "-q")
    rng = random.Random(0)
    monkeypatch.setattr(time, "perf_counter_ns", lambda: rng.randrange(1 << 40))
    monkeypatch.setattr(time, "perf_counter", lambda: rng.random() * 1e4)
    monkeypatch.setattr(time, "monotonic", lambda: rng.random() * 1e4)
    second = cli("quantize", model, "-o", tmp_path / "b.onnx", "--data", data, "-q")
    assert first.exit_code == second.exit_code
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_the_same_bytes_under_load_as_idle(tmp_path: Path) -> None:
    """Two CPU-bound processes beside the second run (the machine has two cores)."""
    model, data = near_parity_data(tmp_path)

    def run(out: Path) -> int:
        return subprocess.run([sys.executable, "-m", "qcli.cli", "quantize", str(model), "-o", str(out),
                               "--data", str(data), "-q"], capture_output=True).returncode

    idle = run(tmp_path / "idle.onnx")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = run(tmp_path / "loaded.onnx")
    finally:
        for hog in hogs:
            hog.kill()
    assert idle == loaded
    assert (tmp_path / "idle.onnx").read_bytes() == (tmp_path / "loaded.onnx").read_bytes()


def test_target_measure_writes_a_profile_qcli_reads(cli, tmp_path: Path, monkeypatch) -> None:
    """On three of the micro-models (the whole suite takes minutes): a measured profile, read
    back by `qcli target show` and usable as `target:`."""
    from qcli.target import bench

    suite = bench.suite
    monkeypatch.setattr(bench, "suite", lambda rng: (m for _, m in zip(range(3), suite(rng), strict=False)))
    out = tmp_path / "mine.json"
    doc = cli.json("target", "measure", "-o", out, "--name", "mine", "--batch", "4")
    assert doc["path"] == str(out) and doc["models"] == 3 and doc["batch"] == 4
    shown = cli.json("target", "show", out)
    assert shown["name"] == "mine" and shown["kind"] == "measured" and "conv.f32" in shown["kernels"]
    assert shown["batch"] == 4
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\ntarget: {out}\n")
    assert cli("config", "validate", config).exit_code == 0
    from qcli.config import load_config
    from qcli.target.deployment import Deployment

    said = Deployment.of(load_config(config)).describe()
    assert said == "target mine (file), batch 1 (its kernels measured at batch 4), latency predicted"


def test_micro_models_run_at_the_batch_asked_along_their_batch_axis() -> None:
    """A convolution's batch is its first axis, a recurrence's its second; an operand that
    broadcasts (a [1] against [1, N, 1]) keeps its shape."""
    import onnxruntime as ort

    from qcli.target import bench

    wanted = {"Conv 3->16": 0, "LSTM 16x32->32": 1, "DynamicQuantizeLSTM 16x32": 1, "Add [1, 1024, 1] [1]": 0}
    seen = set()
    rng = np.random.default_rng(0)
    conv = bench._conv(rng, 3, 16, (112, 112), (3, 3), (2, 2), 1, None, False)
    # the suite's parts that hold these (its weight streams alone take ~27 s to make)
    for what, model, feeds in itertools.chain([conv], bench._dynamic(rng), bench._rnns(rng), bench._elementwise(rng)):
        found = next((key for key in wanted if what.startswith(key) and key not in seen), None)
        if found is None:
            continue
        seen.add(found)
        model, fed = bench.batched(model, feeds, 3)
        axis = wanted[found]
        assert fed["x"].shape[axis] == 3 * feeds["x"].shape[axis], what
        assert all(fed[k].shape == v.shape for k, v in feeds.items() if k != "x"), what
        outputs = ort.InferenceSession(model.SerializeToString()).run(None, fed)
        alone = ort.InferenceSession(model.SerializeToString()).run(None, feeds) if found.startswith("Add") else None
        assert outputs[0].ndim >= 2 and (alone is None or outputs[0].shape[0] == 3 * alone[0].shape[0]), what
    assert seen == set(wanted)


def test_a_target_that_is_neither_shipped_nor_a_file_is_refused_before_calibrating(cli, tmp_path: Path) -> None:
    model, data = near_parity_data(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\ntarget: {profile: nowhere.json, batch: 4}\n")
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--config", config)
    assert result.exit_code == 2
    assert "error: target 'nowhere.json' is neither a shipped profile nor a file" in result.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_the_verdict_says_what_it_rests_on(cli, tmp_path: Path) -> None:
    model, data = near_parity_data(tmp_path)
    doc = json.loads(cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--json").stdout)
    target = doc["verification"]["target"]
    assert target.startswith(("target x86-64-avx512vnni (auto: ", "target generic (auto: "))
    assert target.endswith("batch 1, latency predicted against your model file as given")
    check = next(c for c in doc["verification"]["checks"] if c["name"] == "latency ratio")
    assert check["how"] == "predicted by the target profile"
    # written weight-only (its int8 weights folded to float at load): the original's kernels, not timed again
    assert doc["notes"][-1].startswith("weight-only: the rescue's") and doc["verification"]["measured_latency"] is None


def test_the_clock_is_reported_beside_the_prediction_for_int8_compute(cli, tmp_path: Path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    doc = cli.json("quantize", cnn / "model.onnx", "-o", tmp_path / "q.onnx", "--data", cnn / "calib")
    measured = doc["verification"]["measured_latency"]
    assert doc["verification"]["latency_ratio"] < 0.8 and measured["rounds"] >= 12
    assert measured["how"] == "this machine, A/B at the target's batch; reported, never decides"


REDUCE_MEAN = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 8, 16, 16] x) => (float[N, 4] y) <float[8, 4] w = {W}> {
    r = Relu (x)
    m = ReduceMean <keepdims = 0, axes = [2, 3]> (r)
    y = MatMul (m, w)
}
"""


def test_a_preparation_pass_predicted_slower_than_the_file_is_left_out(cli, tmp_path: Path) -> None:
    """qcli rewrites a spatial ReduceMean as a GlobalAveragePool (canonicalize); under a profile
    that prices the pool far above the mean, the run leaves that pass out, says so, and records
    it in the model's config (`prepare.skip`), which a run without verification follows."""
    weights = "{" + ", ".join(f"{v:.3f}" for v in np.random.default_rng(0).normal(0, 0.3, 32)) + "}"
    model = save(parse_model(REDUCE_MEAN.replace("{W}", weights)), tmp_path / "m.onnx")
    profile = tmp_path / "slowpool.json"
    profile.write_text(json.dumps({"format": "qcli-target/1", "name": "slowpool", "kind": "rules", "kernels": {
        "memory": {"terms": {"call": 1.0}}, "memory:GlobalAveragePool": {"terms": {"call": 500.0}}}}))
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\ntarget: {profile}\nverify: {{min_float_ms: 0}}\n")
    data = normal_folder(tmp_path / "data", 24, x=(1, 8, 16, 16))
    doc = json.loads(cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--config", config,
                         "--json").stdout)
    note = next(n for n in doc["notes"] if n.startswith("preparation: "))
    assert re.fullmatch(r"preparation: canonicalize left out \(prepare\.skip\): your model is predicted at "
                        r"\d+\.\d{3}x its latency on the target with it, 1\.000x without", note), note
    assert not any(n.startswith("preparation alone") for n in doc["notes"])
    assert doc["verification"]["target"].startswith("target slowpool (file), batch 1")
    written = onnx.load(tmp_path / "q.onnx")
    assert "ReduceMean" in {n.op_type for n in written.graph.node}
    assert "GlobalAveragePool" not in {n.op_type for n in written.graph.node}
    recorded = json.loads(next(p.value for p in written.metadata_props if p.key == "qcli.config"))
    assert recorded["prepare"] == {"skip": ["canonicalize"]}
    for skip, op in (("[canonicalize]", "ReduceMean"), ("[]", "GlobalAveragePool")):  # no prediction: as the key says
        again = tmp_path / "again.yaml"
        again.write_text(f"version: 1\nprepare: {{skip: {skip}}}\nverify: {{enabled: false}}\n")
        assert cli("quantize", model, "-o", tmp_path / "r.onnx", "--data", data, "--config", again, "-q").exit_code == 0
        assert op in {n.op_type for n in onnx.load(tmp_path / "r.onnx").graph.node}


def test_analyze_gates_speedup_on_the_prediction(cli, tmp_path: Path, monkeypatch) -> None:
    """`qcli analyze --min-speedup` reads the target profile's predicted speedup (the same on
    any machine), reported beside the timing; with `verify.latency: measured` the timing's."""
    model, data = near_parity_data(tmp_path)
    assert cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--no-verify", "-q").exit_code == 0
    doc = json.loads(cli("analyze", model, tmp_path / "q.onnx", "--data", data, "--min-speedup", "100",
                         "--json").stdout)
    predicted = doc["predicted"]
    assert predicted["batch"] == 1 and predicted["target"].startswith("target ")
    gate = next(g for g in doc["gates"] if g["name"] == "min_speedup")
    assert gate["metric"] == "predicted speedup" and gate["value"] == predicted["speedup"] and not gate["passed"]
    rng = random.Random(1)  # a clock gone mad changes no verdict
    monkeypatch.setattr(time, "perf_counter_ns", lambda: rng.randrange(1 << 40))
    again = json.loads(cli("analyze", model, tmp_path / "q.onnx", "--data", data, "--min-speedup", "100",
                           "--json").stdout)
    assert again["predicted"] == predicted and again["gates"] == doc["gates"]
    config = tmp_path / "measured.yaml"
    config.write_text("version: 1\nverify: {latency: measured}\n")
    measured = json.loads(cli("analyze", model, tmp_path / "q.onnx", "--data", data, "--min-speedup", "100",
                              "--config", config, "--json").stdout)
    assert measured["predicted"] is None
    assert next(g for g in measured["gates"] if g["name"] == "min_speedup")["metric"] == "speedup"


def test_narrow_convolutions_are_their_own_class_and_priced_by_padded_products() -> None:
    """A convolution with fewer than 16 output channels is `nconv` (onnxruntime's int8 kernel
    pads them to 16); the fit keeps the pack whose padded products explain the times."""
    from qcli.target.measure import fitted

    x = Operand("uint8", (1, 1, 1, 8192))
    narrow = kernel("n", "QLinearConv", [x, Operand("float", ()), Operand("uint8", ()),
                                         Operand("int8", (1, 1, 1, 256), True)], [Operand("uint8", (1, 1, 1, 4097))],
                    {"group": 1})
    assert narrow.cls == "nconv.i8" and narrow.gemm == (4097, 1, 1, 256, 1)
    shapes = ((100, 1, 1), (400, 3, 8), (900, 8, 24), (50, 64, 64), (2000, 16, 4), (300, 33, 1))
    calls = [Kernel("c", "QLinearConv", "conv.i8", work=m * k * n * 9, moved=m * (k + n), rows=m, gemm=(m, k, n, 9, 1))
             for m, k, n in shapes]
    times = [2.0 + 0.001 * m * 9 * -(-k // 4) * 4 * -(-n // 16) * 16 for m, k, n in shapes]
    cost = fitted("conv.i8", calls, times)
    assert cost.pack == (4, 16)
    assert [round(cost.us(c), 3) for c in calls] == [round(t, 3) for t in times]


def test_target_show_prints_the_batch_and_each_entrys_channel_packing(cli, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "qcli-target/1", "name": "mine", "kind": "measured", "batch": 8,
                                "kernels": {"memory": {"terms": {"call": 1.0}},
                                            "conv.i8": {"terms": {"mac": 1e-6}, "pack": [4, 16]}}}))
    monkeypatch.setenv("COLUMNS", "200")
    shown = cli("target", "show", path)
    assert shown.exit_code == 0, shown.stderr
    assert "batch 8 · threads onnxruntime's default" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if "conv.i8" in line)
    assert "4 in, 16 out" in row and "1.00e-06" in row


def test_a_verified_run_predicts_the_float_model_once(cli, tmp_path: Path, monkeypatch) -> None:
    """The prediction of the user's model made while preparing (to judge the passes) is the one
    the latency verdict divides by: the probe does not make it again."""
    import traceback

    import qcli.target.deployment as deployment

    model, data = near_parity_data(tmp_path)
    callers: list[str] = []  # the function asking for each prediction
    real = deployment.predict

    def counted(m, feeds, *args, **kwargs):
        callers.append(traceback.extract_stack()[-3].name)  # above Deployment.predict
        return real(m, feeds, *args, **kwargs)

    monkeypatch.setattr(deployment, "predict", counted)
    assert cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "-q").exit_code == 0
    assert callers.count("quantize_checked") == 1  # the user's model, while preparing
    assert "predicted_ratio" in callers  # the verdict ran on predictions
    assert "_reference_prediction" not in callers


def test_few_row_products_are_priced_by_their_weights_streamed_from_memory() -> None:
    """A decode step's products (one row, weights read once) carry their constant bytes as
    `streamed`; a product of many rows does not. A fit on calls whose weights come from memory
    at few rows and from cache at many prices both."""
    from qcli.target.kernels import STREAM_ROWS
    from qcli.target.measure import fitted

    def matmul(rows: int, k: int, n: int) -> Kernel:
        return kernel("m", "MatMul", [Operand("float", (1, rows, k)), Operand("float", (k, n), True)],
                      [Operand("float", (1, rows, n))], {})

    one, many = matmul(1, 1024, 4096), matmul(STREAM_ROWS + 1, 1024, 4096)
    assert one.streamed == one.weights == 1024 * 4096 * 4 and many.streamed == 0
    nbits = kernel("q", "MatMulNBits", [Operand("float", (1, 1, 1024)), Operand("uint8", (4096, 32, 16), True),
                                        Operand("float", (4096, 32), True)], [Operand("float", (1, 1, 4096))],
                   {"K": 1024, "N": 4096})
    assert nbits.gemm == (1, 1024, 4096, 1, 1) and nbits.streamed == 4096 * 32 * (16 + 4)
    calls = [matmul(rows, k, n) for rows in (1, 4, 16, 64, 256) for k, n in ((256, 256), (1024, 1024), (512, 2048))]
    times = [3 + 1e-5 * c.work + 1e-5 * c.weights + 1e-4 * c.streamed for c in calls]
    cost = fitted("matmul.f32", calls, times)
    assert [round(cost.us(c), 2) for c in calls] == [round(t, 2) for t in times]


def test_the_suite_streams_few_row_products_from_memory(monkeypatch) -> None:
    """Each chain of few-row products holds STREAM_BYTES of weights (more than a CPU's last
    cache; 4 MB here), the int4 and int8 ones fused into MatMulNBits."""
    from qcli.target import bench

    monkeypatch.setattr(bench, "STREAM_BYTES", 4 << 20)
    monkeypatch.setattr(bench, "STREAMS", [(1, 256, 1024)])
    for what, model, feeds in bench._streams(np.random.default_rng(0)):
        stored = sum(len(t.raw_data) for t in model.graph.initializer if not t.name.endswith("_s"))
        assert stored >= bench.STREAM_BYTES, what
        ops = {k.op for k in executed(model, feeds)}
        assert ops == ({"MatMul"} if "float" in what else {"MatMulNBits"}), what


def test_the_weights_held_are_those_of_the_graph_onnxruntime_runs() -> None:
    """A float16 weight cast to float is folded at load: onnxruntime holds twice its bytes; an
    int8 weight's DequantizeLinear + MatMul runs as MatMulNBits on the int8 blocks."""
    from onnx import TensorProto, helper, numpy_helper

    from qcli.target.executed import run

    wh = numpy_helper.from_array(np.full((64, 32), 0.5, np.float16), "wh")
    cast = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["wh"], ["w"], to=TensorProto.FLOAT), helper.make_node("MatMul", ["x", "w"], ["y"])],
        "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [wh]),
        opset_imports=[helper.make_opsetid("", 17)])
    held = run(cast, {"x": np.ones((1, 64), np.float32)})
    assert [k.op for k in held.kernels] == ["MatMul"] and held.weight_bytes == 64 * 32 * 4
    dq = parse_model("""
    <ir_version: 10, opset_import: ["" : 21]>
    net (float[1, 64] x) => (float[1, 32] y) <int8[64, 32] wq = {WEIGHTS}, float[32] ws = {SCALES}> {
        w = DequantizeLinear <axis = 1> (wq, ws)
        y = MatMul (x, w)
    }
    """.replace("{WEIGHTS}", "{" + ", ".join(["3"] * 64 * 32) + "}").replace("{SCALES}", "{" + ", ".join(["0.1"] * 32) + "}"))
    held = run(dq, {"x": np.ones((1, 64), np.float32)})
    assert [k.op for k in held.kernels] == ["MatMulNBits"] and 64 * 32 <= held.weight_bytes < 64 * 32 * 2
