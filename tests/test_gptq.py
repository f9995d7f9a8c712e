"""GPTQ (`weights.algorithm: gptq`): weights rounded by the Gram matrix of their layer's inputs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import fused_op_counts, parse_model
from decoders import decoder, int4_blocks
from qcli.config import PRESETS
from qcli.gptq import RATIOS, Gram, rounded
from qcli.plan import WeightPlan
from qcli.qweights import quantized_weight, weight_qparams
from qcli.scheme import QuantScheme, dequantize, quantize

INT4_BLOCKS = QuantScheme.of("int4", "per_block", True, block_size=32)


def correlated_inputs(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Rows whose features are strongly correlated and of unequal energy, as hidden states are."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(k, k)) * np.linspace(0.1, 2.0, k)
    return rng.normal(size=(rows, k)) @ mix


def gram_of(x: np.ndarray) -> Gram:
    return Gram(x.T @ x, x.shape[0])


def output_error(x: np.ndarray, w: np.ndarray, weight, wp: WeightPlan) -> float:
    q, scale, zero = weight
    blocks = np.repeat(scale, 32, axis=0)[: w.shape[0]], np.repeat(zero, 32, axis=0)[: w.shape[0]]
    return float(np.mean((x @ w - x @ dequantize(q, *blocks)) ** 2))


def test_gptq_moves_the_layers_output_less_than_rounding_to_nearest() -> None:
    rng = np.random.default_rng(1)
    x = correlated_inputs(2048, 128)
    w = rng.normal(size=(128, 64)).astype(np.float32)  # a MatMul's [K, N]
    wp = WeightPlan("w", INT4_BLOCKS, 0)
    rtn, gptq = quantized_weight(w, wp), rounded(w, wp, gram_of(x[:1024]))
    assert gptq[0].dtype == rtn[0].dtype and gptq[0].shape == w.shape
    # RTN's scales, or clipped below them (in magnitude: a block's scale has its largest value's sign)
    assert gptq[1].shape == rtn[1].shape and np.all(np.abs(gptq[1]) <= np.abs(rtn[1]))
    assert np.any(np.abs(gptq[1]) < np.abs(rtn[1]))
    held_out = x[1024:]  # rows the Gram matrix did not see
    assert output_error(held_out, w, gptq, wp) < 0.6 * output_error(held_out, w, rtn, wp)
    assert gptq[0].min() >= -8 and gptq[0].max() <= 7  # symmetric int4: every integer, -8..7


def test_gptq_on_uncorrelated_inputs_of_equal_energy_rounds_to_nearest() -> None:
    """With a diagonal Gram matrix no row's error can be cancelled by another's: GPTQ rounds each
    value to its nearest, on the scales `searched` chose, which are those of least plain error."""
    w = np.random.default_rng(2).normal(size=(64, 16)).astype(np.float32)
    wp = WeightPlan("w", INT4_BLOCKS, 0)
    q, scale, zero = rounded(w, wp, Gram(np.eye(64) * 10.0, 10))
    nearest = quantize(w, np.repeat(scale, 32, axis=0), np.repeat(zero, 32, axis=0), INT4_BLOCKS.dtype,
                       symmetric=True)
    assert np.array_equal(q, nearest)
    errors = {}
    for ratio in RATIOS:
        s, z = weight_qparams(w * np.float32(ratio), wp)
        s, z = np.repeat(s, 32, axis=0), np.repeat(z, 32, axis=0)
        errors[ratio] = (w - dequantize(quantize(w, s, z, INT4_BLOCKS.dtype, symmetric=True), s, z)) ** 2
    best = np.min([e.reshape(2, 32, 16).sum(1) for e in errors.values()], axis=0)
    got = ((w - dequantize(q, np.repeat(scale, 32, axis=0), np.repeat(zero, 32, axis=0))) ** 2).reshape(2, 32, 16)
    assert np.allclose(got.sum(1), best)


def test_gptq_per_channel_int8_on_a_gemm_with_transposed_weights() -> None:
    """Gemm transB=1 stores [N, K], quantized per output channel (axis 0): the reduction axis is 1."""
    rng = np.random.default_rng(3)
    x = correlated_inputs(1024, 96, seed=4)
    w = rng.normal(size=(32, 96)).astype(np.float32)
    wp = WeightPlan("w", QuantScheme.of("int8", "per_channel", True), 0)
    rtn, gptq = quantized_weight(w, wp), rounded(w, wp, gram_of(x))

    def error(weight) -> float:
        return float(np.mean((x @ w.T - x @ dequantize(weight[0], weight[1], weight[2], axis=0).T) ** 2))

    assert error(gptq) < 0.7 * error(rtn)


def test_gptq_from_a_text_folder_beats_rtn_on_the_decoders_perplexity(cli, tmp_path: Path, tiny: Path) -> None:
    found = {}
    for algorithm in ("rtn", "gptq"):
        found[algorithm] = int4_blocks(cli, tmp_path, tiny, algorithm, f"algorithm: {algorithm}")
        found[algorithm + " model"] = onnx.load(str(tmp_path / f"{algorithm}.onnx"))
    assert "gptq: 13 weight(s) rounded by the Gram matrices of their layers' inputs" in found["gptq"]["notes"]
    increase = {a: next(o for o in found[a]["verification"]["outputs"] if o["name"] == "logits")["perplexity_increase"]
                for a in ("rtn", "gptq")}
    assert abs(increase["gptq"]) < abs(increase["rtn"])
    ints = {a: {t.name: numpy_helper.to_array(t) for t in found[a + " model"].graph.initializer
                if t.name.endswith("_quantized")} for a in ("rtn", "gptq")}
    assert ints["rtn"].keys() == ints["gptq"].keys() and len(ints["rtn"]) == 13
    assert any(not np.array_equal(ints["rtn"][n], ints["gptq"][n]) for n in ints["rtn"])


@pytest.mark.parametrize(("algorithm", "reads"), [("gptq", "the Gram matrices of the layers' inputs"),
                                                   ("awq", "its layers' input statistics")])
def test_gptq_and_awq_with_a_calibration_file_are_refused(cli, tmp_path: Path, tiny: Path, algorithm: str,
                                                          reads: str) -> None:
    (tmp_path / "g.yaml").write_text("version: 1\nactivations: {dtype: float}\n"
                                     f"weights: {{dtype: int4, granularity: per_block, algorithm: {algorithm}}}\n")
    calib = tmp_path / "c.json"
    assert cli("calibrate", tiny / "decoder.onnx", "--data", tiny / "text", "--seq-len", "16", "-o", calib,
               "--config", tmp_path / "g.yaml").exit_code == 0
    result = cli("quantize", tiny / "decoder.onnx", "--calib", calib, "-o", tmp_path / "q.onnx", "--config",
                 tmp_path / "g.yaml")
    assert result.exit_code == 2
    assert (f"error: weights.algorithm {algorithm} needs --data DIR: it reads {reads} on the "
            "calibration samples, which a calibration file does not hold") in result.stderr


@pytest.mark.parametrize(("key", "op_type", "weights"), [
    ("algorithm", "MatMul", "{dtype: int4, granularity: per_block, algorithm: gptq}"),
    ("embeddings", "Gather", "{embeddings: int8}"),
])
def test_a_per_model_weights_key_in_an_override_is_refused(cli, tmp_path: Path, tiny: Path, key: str, op_type: str,
                                                          weights: str) -> None:
    (tmp_path / "o.yaml").write_text(f"version: 1\noverrides:\n  - match: {{op_types: [{op_type}]}}\n"
                                     f"    weights: {weights}\n")
    result = cli("quantize", tiny / "decoder.onnx", "-o", tmp_path / "q.onnx", "--data", tiny / "text",
                 "--config", tmp_path / "o.yaml")
    assert result.exit_code == 2
    assert f"weights.{key} is one per model: set it in the top-level weights section" in result.stderr


def test_llm_mixed_gives_int4_to_the_quietest_layers_within_the_perplexity_budget(cli, tmp_path: Path,
                                                                                 tiny: Path) -> None:
    """llm-mixed with a budget below what int4 everywhere costs on this decoder (+0.02%): some
    layers keep int8 (or go float), the rest take int4, and the perplexity stays within the budget."""
    config = (PRESETS / "llm-mixed.yaml").read_text().replace("max_accuracy_drop: 0.003", "max_accuracy_drop: 0.0001")
    (tmp_path / "mixed.yaml").write_text(config)
    out = tmp_path / "mixed.onnx"
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", tiny / "text", "--seq-len", "16",
                   "--config", tmp_path / "mixed.yaml")
    int4 = [n for n, p in doc["precision"]["promoted"].items() if p["precision"] == "int4"]
    assert doc["precision"]["goal_met"] and 0 < len(int4) < 13
    logits = next(o for o in doc["verification"]["outputs"] if o["name"] == "logits")
    assert logits["perplexity_increase"] <= 0.0001
    floats = [n for n, p in doc["precision"]["promoted"].items() if p["precision"] == "float"]
    stored = Counter((t.data_type, t.name.endswith("_gather_quantized")) for t in onnx.load(str(out)).graph.initializer
                     if t.name.endswith("_quantized"))
    wanted = {(onnx.TensorProto.INT4, False): len(int4), (onnx.TensorProto.INT8, False): 13 - len(int4) - len(floats),
              (onnx.TensorProto.INT8, True): 2}  # and the two embedding tables (llm presets: int8)
    assert stored == Counter({key: count for key, count in wanted.items() if count})


@pytest.mark.parametrize("algorithm", ["gptq", "awq"])
def test_gptq_and_awq_do_not_combine_with_recovery_steps_that_change_the_weights(tmp_path: Path,
                                                                                algorithm: str) -> None:
    from qcli.config import load_config
    from qcli.errors import ConfigError

    (tmp_path / "c.yaml").write_text(f"version: 1\nweights: {{algorithm: {algorithm}}}\nrecovery: [smoothquant]\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "c.yaml")
    assert (f"weights.algorithm {algorithm} does not combine with recovery step smoothquant: drop one of the two"
            in str(err.value))


def test_gram_matrices_summed_in_several_passes_round_the_same_bytes(cli, tmp_path: Path, tiny: Path,
                                                                     monkeypatch) -> None:
    """Gram matrices past PASS_BYTES are summed a group a pass and kept in a temporary folder:
    the model written is the one a single pass gives."""
    import qcli.gptq

    grouped, written = qcli.gptq.passes, {}
    counted: list[int] = []
    monkeypatch.setattr(qcli.gptq, "passes", lambda *a: counted.append(len(grouped(*a))) or grouped(*a))
    for name, limit in (("one", 1 << 40), ("each", 1)):
        monkeypatch.setattr(qcli.gptq, "PASS_BYTES", limit)
        out = tmp_path / f"{name}.onnx"
        doc = cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", tiny / "text", "--seq-len", "16",
                       "--config", "llm-int4")
        written[name] = (out.read_bytes(), doc["verification"]["checks"])
    assert written["one"] == written["each"]
    assert counted[0] == 1 and counted[-1] == 9  # per layer: q/k/v's, o's, fc1's, fc2's input; lm_head's


def test_embeddings_int8_store_the_tables_int8_and_dequantize_only_the_rows_read(cli, tmp_path: Path,
                                                                                 tiny: Path) -> None:
    """`weights.embeddings: int8` (the llm presets): the token and position tables int8 per
    column, a Gather of the integers then a DequantizeLinear of the rows read; nothing else
    changes, and the model gets smaller."""
    runs = {}
    for mode in ("float", "int8"):
        doc = int4_blocks(cli, tmp_path, tiny, mode, f"embeddings: {mode}")
        out = tmp_path / f"{mode}.onnx"
        runs[mode] = (doc, onnx.load(str(out)), out.stat().st_size)
    doc, model, size = runs["int8"]
    assert doc["precisions"] == {"Gather": {"int8 table": 2}, "MatMul": {"float act, int4 weights": 13}}
    assert doc["activations"] == {} and doc["verification"]["passed"]
    types = {t.name: t.data_type for t in model.graph.initializer}
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and types.get(n.input[0]) == onnx.TensorProto.INT8]
    assert len(gathers) == 2
    readers = {i: n for n in model.graph.node for i in n.input}
    assert all(readers[g.output[0]].op_type == "DequantizeLinear" for g in gathers)
    assert runs["float"][0]["precisions"] == {"MatMul": {"float act, int4 weights": 13}}
    assert size < runs["float"][2] - 0.7 * (320 + 256) * 64 * 4  # two float tables, 3/4 of their bytes saved


def test_embeddings_float_keeps_a_dynamic_models_tables_float(tmp_path: Path) -> None:
    from qcli.config import Config
    from qcli.plan import make_plan
    from qcli.quantize import prepare_for

    model = decoder()
    plans = {}
    for mode in ("auto", "float"):
        config = Config.model_validate({"version": 1, "activations": {"mode": "dynamic"},
                                        "weights": {"embeddings": mode}})
        plan = make_plan(prepare_for(model, config).model, config)
        plans[mode] = sorted(d.form for d in plan.dynamic.values())
    assert plans["auto"].count("gather") == 2 and "gather" not in plans["float"]


@pytest.mark.parametrize("dtype", ["uint2", "int2"])
def test_2_bit_weights_run_as_matmulnbits(cli, tmp_path: Path, tiny: Path, dtype: str) -> None:
    """2-bit blocks: the model goes to opset 25 (DequantizeLinear takes int2/uint2 there), its
    weights packed four to a byte, and onnxruntime runs every MatMul as MatMulNBits with bits 2."""
    symmetric = "true" if dtype == "int2" else "false"
    (tmp_path / "two.yaml").write_text(
        "version: 1\nactivations: {dtype: float}\n"
        f"weights: {{dtype: {dtype}, symmetric: {symmetric}, granularity: per_block, block_size: 32, "
        "algorithm: gptq}\nverify: {max_latency_ratio: null, max_perplexity_increase: 1.0}\n")
    out = tmp_path / "two.onnx"
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", tiny / "text", "--seq-len", "16",
                   "--config", tmp_path / "two.yaml")
    assert doc["precisions"]["MatMul"] == {f"float act, {dtype} weights": 13}
    model = onnx.load(str(out))
    assert model.opset_import[0].version == 25
    two = onnx.TensorProto.UINT2 if dtype == "uint2" else onnx.TensorProto.INT2
    ints = [t for t in model.graph.initializer if t.name.endswith("_quantized") and t.data_type == two]
    assert len(ints) == 13 and all(len(t.raw_data) == -(-np.prod(t.dims) // 4) for t in ints)
    assert fused_op_counts(out, tmp_path)["MatMulNBits"] == 13
    # the fused kernel computes what DequantizeLinear + MatMul compute (onnxruntime #28551: zeros)
    ids = np.array([[5, 17, 42, 8, 99, 3]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(6)[None]}
    feeds.update({f"past_key_values.{k}.{kv}": np.zeros((1, 4, 0, 16), np.float32) for k in range(2)
                  for kv in ("key", "value")})
    runs = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        runs.append(ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0])
    assert np.abs(runs[0] - runs[1]).max() < 0.02 * np.abs(runs[1]).max() and np.abs(runs[0]).max() > 0


def test_2_bit_weights_a_matmulnbits_cannot_run_take_4_bits(tmp_path: Path) -> None:
    from qcli.config import Config
    from qcli.plan import make_plan
    from qcli.quantize import prepare_for

    w = ", ".join(["0.5", "-0.25"] * 32 * 16)
    model = parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 64] x) => (float[N, 16] y) <float[64, 16] a = {{{w}}}, float[16, 64] b = {{{w}}}> {{
            h = MatMul(x, a)
            y = Gemm(x, b) <transB = 1>
            z = Add(h, y)
        }}""")
    config = Config.model_validate({"version": 1, "activations": {"dtype": "float"},
                                    "weights": {"dtype": "uint2", "symmetric": False, "granularity": "per_block"}})
    plan = make_plan(prepare_for(model, config).model, config)
    assert plan.weights["a"].scheme.dtype.name == "uint2" and plan.weights["b"].scheme.dtype.name == "uint4"
    assert ("weight b: uint2 runs in onnxruntime only as MatMulNBits (a float MatMul's weight); Gemm 'y' reads it: "
            "uint4 instead") in plan.notes


def test_2_bit_weights_are_per_block(cli, tmp_path: Path, tiny: Path) -> None:
    (tmp_path / "c.yaml").write_text("version: 1\nweights: {dtype: int2, granularity: per_channel}\n")
    result = cli("quantize", tiny / "decoder.onnx", "-o", tmp_path / "q.onnx", "--data", tiny / "text",
                 "--config", tmp_path / "c.yaml")
    assert result.exit_code == 2
    assert ("int2 weights are per block (granularity: per_block): onnxruntime runs 2-bit weights only as "
            "MatMulNBits, which reads blocks") in result.stderr


def test_the_part_of_a_graph_computing_some_tensors_holds_only_what_they_need() -> None:
    """Each Gram pass runs the part of the graph its tensors need (qcli.graph.computing):
    a first layer's input needs neither the later layers nor the head, and comes out the same."""
    from qcli.calibrate.collect import session_with_outputs
    from qcli.graph import computing

    model = decoder()
    part = computing(model, ["layers.0/ln1"])
    assert 0 < len(part.graph.node) < len(model.graph.node) // 4
    assert [o.name for o in part.graph.output] == ["layers.0/ln1"]
    assert [i.name for i in part.graph.input] == ["input_ids", "position_ids"]  # no mask, no cache
    assert [t.name for t in part.graph.initializer] == ["wte", "wpe", "layers.0.ln1.weight", "layers.0.ln1.bias"]
    ids = np.arange(12, dtype=np.int64).reshape(2, 6) % 300
    positions = np.tile(np.arange(6, dtype=np.int64), (2, 1))
    got = ort.InferenceSession(part.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids, "position_ids": positions})[0]
    whole = session_with_outputs(model, ["layers.0/ln1"])
    feeds = {"input_ids": ids, "position_ids": positions, "attention_mask": np.ones((2, 6), np.int64)}
    feeds |= {i.name: np.zeros((2, 4, 0, 16), np.float32) for i in whole.get_inputs() if i.name.startswith("past")}
    assert np.allclose(got, whole.run(["layers.0/ln1"], feeds)[0], rtol=1e-5, atol=1e-5)


def test_llm_mixed_under_a_size_budget_writes_int4_layers_until_it_fits(cli, tmp_path: Path,
                                                                             tiny: Path) -> None:
    """`--max-size-mb` between llm-int8's size and llm-int4's: some layers int4, the others int8,
    the file within the budget, the perplexity budget met; below what int4 everywhere writes: exit 1,
    with that model (the smallest) written."""
    args = ("--data", tiny / "text", "--seq-len", "16", "--config", "llm-mixed")
    int8 = cli.json("quantize", tiny / "decoder.onnx", "-o", tmp_path / "int8.onnx", *args[:4], "--config", "llm-int8")
    budget = 0.85 * int8["bytes_after"] / 1e6
    out = tmp_path / "fits.onnx"
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", out, *args, "--max-size-mb", f"{budget:.4f}")
    int4 = [n for n, p in doc["precision"]["promoted"].items() if p["precision"] == "int4"]
    assert doc["precision"]["goal_met"] and 0 < len(int4) < 13
    assert doc["bytes_after"] <= budget * 1e6 < int8["bytes_after"]
    assert doc["precision"]["steps"][-1]["action"].startswith(f"int4 weights on {len(int4)}, the least noise that "
                                                              f"fits {budget:.3g} MB")
    stored = Counter(t.data_type for t in onnx.load(str(out)).graph.initializer
                     if t.name.endswith("_quantized") and not t.name.endswith("_gather_quantized"))
    assert stored == Counter({onnx.TensorProto.INT4: len(int4), onnx.TensorProto.INT8: 13 - len(int4)})
    result = cli("quantize", tiny / "decoder.onnx", "-o", tmp_path / "over.onnx", *args, "--max-size-mb", "0.05")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: auto-precision could not meet its goal (performance, max accuracy drop "
                                    "0.003, max size 0.05 MB); wrote the best model found:")
    assert "raise --max-accuracy-drop or --max-size-mb" in result.stderr
