"""Text data folders (.txt / .jsonl + tokenizer.json) and language models' verdicts: decoders with a
KV cache fed prompts with no past, judged by perplexity on the text's next tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import fused_op_counts, write_npz
from decoders import TEXT, decoder, save, tokenizer_json
from qcli.analyze.kinds import Kind, output_kinds
from qcli.analyze.tokens import TokenAccumulator, log_softmax
from qcli.data import DataFolder, Reading, model_inputs
from qcli.data.text import chunks
from qcli.errors import DataError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer decoder with a KV cache and random weights, and its tokenizer."""
    root = tmp_path_factory.mktemp("decoder")
    save(decoder(), root / "decoder.onnx")
    tokenizer_json(root / "tokenizer.json", TEXT)
    return root


def text_folder(root: Path, tiny: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_bytes((tiny / "tokenizer.json").read_bytes())
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def corpus(root: Path, tiny: Path, n: int = 40) -> Path:
    """`n` .txt files of the docstring-like sentences, each a few chunks of 16 tokens."""
    return text_folder(root, tiny, {f"{i:03d}.txt": " ".join(TEXT[(i + j) % len(TEXT)] for j in range(3))
                                    for i in range(n)})


def test_a_text_folder_feeds_prompts_with_an_empty_past(tmp_path: Path, tiny: Path) -> None:
    inputs = model_inputs(onnx.load(str(tiny / "decoder.onnx")))
    data = text_folder(tmp_path / "text", tiny, {"a.txt": TEXT[0] * 3, "b.jsonl": "\n".join(
        json.dumps({"text": t}) for t in TEXT[:3]) + "\n\n"})
    folder = DataFolder(data, inputs, reading=Reading(seq_len=16))
    assert folder.layout == "text"
    samples = list(folder)
    assert [s.source for s in samples] == ["a.txt", "b.jsonl"]
    a = samples[0].inputs
    assert a["input_ids"].shape[1] == 16 and a["input_ids"].dtype == np.int64
    assert (a["attention_mask"] == 1).all() and a["attention_mask"].shape == a["input_ids"].shape
    assert (a["position_ids"] == np.arange(16)).all()
    assert a["past_key_values.1.value"].shape == (a["input_ids"].shape[0], 4, 0, 16)
    assert len(folder) == sum(s.size for s in samples)
    # the chunks are the tokenizer's ids of the whole file, cut every 16 tokens (the tail dropped)
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(data / "tokenizer.json")).encode(TEXT[0] * 3).ids
    assert a["input_ids"].ravel().tolist() == ids[:len(ids) // 16 * 16]
    # a .jsonl file's records are one document, joined by blank lines
    jsonl = Tokenizer.from_file(str(data / "tokenizer.json")).encode("\n\n".join(TEXT[:3])).ids
    assert samples[1].inputs["input_ids"].ravel().tolist() == jsonl[:len(jsonl) // 16 * 16]


def test_chunks_keep_one_length_per_file() -> None:
    assert chunks(list(range(40)), 16) == [list(range(16)), list(range(16, 32))]
    assert chunks(list(range(5)), 16) == [list(range(5))]  # a short file is one shorter chunk
    assert chunks([3], 16) == []


def test_text_files_without_a_tokenizer_are_not_samples(tmp_path: Path, tiny: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    inputs = model_inputs(onnx.load(str(tiny / "decoder.onnx")))
    with pytest.raises(DataError) as err:
        DataFolder(tmp_path, inputs)
    assert err.value.message == f"no samples found in {tmp_path}"
    assert err.value.hint.endswith("or *.txt / *.jsonl text with the model's tokenizer.json (text files are samples "
                                   "only beside a tokenizer.json)")
    write_npz(tmp_path / "0.npz", x=np.zeros((1, 3), np.float32))  # a README beside .npz samples stays ignored
    assert DataFolder(tmp_path, inputs).layout == "npz"


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "b.jsonl:2: not a JSON record: Expecting property name enclosed in double quotes"),
    ('{"txt": "x"}', 'b.jsonl:2: a record without a "text" string'),
])
def test_a_bad_jsonl_record_is_named_by_line(tmp_path: Path, tiny: Path, line: str, message: str) -> None:
    data = text_folder(tmp_path / "t", tiny, {"b.jsonl": json.dumps({"text": TEXT[0]}) + "\n" + line + "\n"})
    inputs = model_inputs(onnx.load(str(tiny / "decoder.onnx")))
    with pytest.raises(DataError) as err:
        list(DataFolder(data, inputs))
    assert err.value.message == f"{data}/{message}"


def test_an_input_a_text_folder_cannot_feed_is_refused(tmp_path: Path, tiny: Path) -> None:
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (int64[N, T] input_ids, float[N, 3] extra) => (int64[N, T] y) { y = Identity(input_ids) }""")
    data = text_folder(tmp_path / "t", tiny, {"a.txt": TEXT[0]})
    with pytest.raises(DataError) as err:
        list(DataFolder(data, model_inputs(model)))
    assert err.value.message == f"{data} is a text data folder, which cannot feed the model's input 'extra' [N, 3]"
    assert err.value.hint == ("a text folder feeds input_ids, attention_mask, position_ids, token_type_ids and past "
                              "key/value inputs; give other models .npz samples")


def test_seq_len_below_two_is_refused(cli, tmp_path: Path, tiny: Path) -> None:
    data = corpus(tmp_path / "text", tiny, 4)
    result = cli("calibrate", tiny / "decoder.onnx", "--data", data, "--seq-len", "1", "-o", tmp_path / "c.json")
    assert result.exit_code == 2
    assert "error: --seq-len must be at least 2 tokens, got 1" in result.stderr


def test_a_decoders_logits_are_tokens_and_its_cache_is_ignored(tiny: Path) -> None:
    model = onnx.load(str(tiny / "decoder.onnx"))
    values = {o.name: [np.zeros((1, 8, 320) if o.name == "logits" else (1, 4, 8, 16), np.float32)]
              for o in model.graph.output}
    kinds = output_kinds(model, values)
    assert kinds["logits"].kind is Kind.TOKENS
    assert kinds["logits"].reason == ("[1, 8, 320] logits over 320 tokens at each position of a decoder fed "
                                      "input_ids: judged by perplexity on the next tokens")
    assert {kinds[n].kind for n in values if n != "logits"} == {Kind.IGNORE}


def test_perplexity_is_the_exponent_of_the_mean_negative_log_likelihood() -> None:
    rng = np.random.default_rng(0)
    f, q = rng.normal(size=(3, 10, 50)), rng.normal(size=(3, 10, 50))
    ids = rng.integers(0, 50, (3, 10))
    acc = TokenAccumulator()
    acc.update(f[:2], q[:2], ids[:2])
    acc.update(f[2:], q[2:], ids[2:])
    nll = [-np.mean([log_softmax(x[i, t])[ids[i, t + 1]] for i in range(3) for t in range(9)]) for x in (f, q)]
    assert acc.float_perplexity == pytest.approx(np.exp(nll[0]))
    assert acc.perplexity == pytest.approx(np.exp(nll[1]))
    assert acc.increase == pytest.approx(np.exp(nll[1] - nll[0]) - 1)
    assert acc.agreement == pytest.approx(np.mean(f.argmax(-1) == q.argmax(-1)))
    same = TokenAccumulator()
    same.update(f, f, ids)
    assert same.increase == 0 and same.agreement == 1 and same.kl.value == pytest.approx(0)


def test_int4_weights_on_a_decoder_from_a_text_folder(cli, tmp_path: Path, tiny: Path) -> None:
    data = corpus(tmp_path / "text", tiny)
    out = tmp_path / "int4.onnx"
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", data, "--seq-len", "16",
                   "--config", "weights-int4")
    outputs = {o["name"]: o for o in doc["verification"]["outputs"]}
    logits = outputs["logits"]
    assert logits["kind"] == "tokens" and abs(logits["perplexity_increase"]) < 0.02
    assert logits["perplexity"] == pytest.approx(logits["float_perplexity"] * (1 + logits["perplexity_increase"]))
    checks = {c["name"]: c for c in doc["verification"]["checks"]}
    assert checks["perplexity increase"]["passed"] and checks["perplexity increase"]["floor"] == 0.02
    assert set(outputs) == {"logits"}  # the key/value cache: neither gated nor kept
    assert ("4 key/value cache outputs (present.0.key, ...) not compared: never gated, the next step's logits show "
            "their error (name one in verify.outputs to compare it)") in doc["verification"]["notes"]
    assert fused_op_counts(out, tmp_path)["MatMulNBits"] == 13  # q, k, v, o, fc1, fc2 of 2 layers, and lm_head
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.get_outputs()[0].name == "logits"


def test_the_perplexity_ceiling_gates(cli, tmp_path: Path, tiny: Path) -> None:
    data = corpus(tmp_path / "text", tiny)
    (tmp_path / "c.yaml").write_text("version: 1\nactivations: {dtype: float}\n"
                                     "weights: {dtype: int4, symmetric: true, granularity: per_block, block_size: 32}\n"
                                     "verify: {max_perplexity_increase: 1.0e-6, max_latency_ratio: null, "
                                     "rescue: false}\n")
    result = cli("quantize", tiny / "decoder.onnx", "-o", tmp_path / "q.onnx", "--data", data, "--seq-len", "16",
                 "--config", tmp_path / "c.yaml")
    assert result.exit_code == 1, result.stderr
    assert "perplexity increase" in result.stdout + result.stderr


def test_next_token_agreement_and_kl_gate_when_asked(cli, tmp_path: Path, tiny: Path) -> None:
    """`verify.min_token_agreement` and `verify.max_token_kl` gate the figures `tokens` outputs
    report (no interval: the value decides; unset, reported and not checked), and a miss is
    rescued like any floor's: layers promoted until it holds."""
    data = corpus(tmp_path / "text", tiny)
    base = ("version: 1\nactivations: {dtype: float}\nweights: {dtype: int4, symmetric: true, granularity: per_block, "
            "block_size: 32}\n")
    (tmp_path / "c.yaml").write_text(base + "verify: {max_latency_ratio: null, rescue: false}\n")
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", tmp_path / "q.onnx", "--data", data, "--seq-len", "16",
                   "--config", tmp_path / "c.yaml")
    logits = next(o for o in doc["verification"]["outputs"] if o["name"] == "logits")
    agreement, kl = logits["token_agreement"], logits["kl"]
    assert 0 < agreement < 1 and kl > 0
    assert not {"next-token agreement", "next-token KL"} & {c["name"] for c in doc["verification"]["checks"]}
    for floors, code in ((f"min_token_agreement: {agreement - 1e-5:.6f}, max_token_kl: {kl * 1.01:.6g}", 0),
                         (f"min_token_agreement: {min(1.0, agreement + 0.01):.6f}", 1), (f"max_token_kl: {kl / 2:.6g}", 1)):
        (tmp_path / "c.yaml").write_text(base + f"verify: {{max_latency_ratio: null, rescue: false, {floors}}}\n")
        result = cli("quantize", tiny / "decoder.onnx", "-o", tmp_path / "q.onnx", "--data", data, "--seq-len", "16",
                     "--config", tmp_path / "c.yaml", "--json")
        assert result.exit_code == code, (floors, result.stderr)
        checks = {c["name"]: c for c in json.loads(result.stdout)["verification"]["checks"]}
        gated = [checks[n] for n in ("next-token agreement", "next-token KL") if n in checks]
        assert gated and all(c["interval"] is None and c["output"] == "logits" for c in gated)
        assert all(c["passed"] for c in gated) == (code == 0)
    assert result.stderr.startswith("error: verification failed: next-token KL ")
    floor = min(1.0, agreement + 0.05)  # the rescue's goal holds it: layers promoted until it is met
    (tmp_path / "c.yaml").write_text(base + f"verify: {{max_latency_ratio: null, min_token_agreement: {floor:.4f}}}\n")
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", tmp_path / "q.onnx", "--data", data, "--seq-len", "16",
                   "--config", tmp_path / "c.yaml")
    assert doc["precision"]["promoted"]
    assert next(o for o in doc["verification"]["outputs"] if o["name"] == "logits")["token_agreement"] >= floor


def test_a_decoders_cache_outputs_show_on_one_line() -> None:
    from rich.console import Console

    from qcli.render import output_kinds as show

    reason = "the key/value cache a decoder returns (the next step's logits show its error)"
    outputs = [{"name": "logits", "kind": "tokens", "reason": "logits", "perplexity_increase": 0.001}] + [
        {"name": f"present.{i}.{kv}", "kind": "ignore", "reason": reason, "cosine": 0.99 + i / 1000, "sqnr_db": 20.0 + i}
        for i in range(24) for kv in ("key", "value")]
    console = Console(record=True, width=400)
    show(console, outputs)
    lines = console.export_text().splitlines()
    assert lines == ["output 'logits': tokens, logits: perplexity increase 0.0010",
                     f"outputs 'present.0.key' to 'present.23.value' (48): ignore (not gated), {reason}: lowest cosine "
                     "0.9900, lowest SQNR dB 20.0000"]


def test_analyze_reports_perplexity_on_a_text_folder(cli, tmp_path: Path, tiny: Path) -> None:
    data = corpus(tmp_path / "text", tiny)
    out = tmp_path / "int4.onnx"
    cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", data, "--seq-len", "16", "--config", "llm-int4")
    doc = cli.json("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "0",
                   "--max-accuracy-drop", "0.02")
    logits = next(f for f in doc["fidelity"] if f["output"] == "logits")
    assert logits["kind"] == "tokens" and logits["samples"] == doc["data"]["samples"]
    assert logits["float_perplexity"] > 1 and logits["perplexity"] > 1 and 0 < logits["token_agreement"] <= 1
    assert logits["perplexity_increase"] == pytest.approx(logits["perplexity"] / logits["float_perplexity"] - 1,
                                                          abs=1e-5)
    (gate,) = doc["gates"]
    assert gate["metric"] == "perplexity increase (logits)" and gate["passed"]
    shown = cli("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "0")
    assert "perplexity" in shown.stdout


def test_a_big_decoders_memory_savings_change_no_byte(cli, tmp_path: Path, tiny: Path, monkeypatch) -> None:
    """What a decoder past memory's comfort gets (weights left in its .data file, float outputs
    in a temporary folder, the float session not kept) gives the same model and verdict as a
    small one held whole: forced here on the tiny decoder, stored with external data."""
    import qcli.analyze.probe as probe

    data = corpus(tmp_path / "text", tiny)
    (tmp_path / "ext").mkdir()
    external = save(decoder(), tmp_path / "ext" / "decoder.onnx", external=True)
    runs = {}
    for name, limit in (("held", 1 << 40), ("spilled", 0)):
        monkeypatch.setattr(probe, "REFERENCE_HELD_BYTES", limit)
        monkeypatch.setattr(probe, "HELD_SESSION_BYTES", limit)
        out = tmp_path / f"{name}.onnx"
        doc = cli.json("quantize", external if name == "spilled" else tiny / "decoder.onnx", "-o", out, "--data",
                       data, "--seq-len", "16", "--config", "weights-int4")
        runs[name] = (out.read_bytes(), doc["verification"]["checks"], doc["verification"]["outputs"])
    assert runs["held"] == runs["spilled"]
    assert sorted(p.name for p in (tmp_path / "ext").iterdir()) == ["decoder.onnx", "decoder.onnx.data"]


def test_a_decode_step_fed_the_prompts_cache_gives_the_whole_sequences_logits(tiny: Path) -> None:
    """The decode step analyze times computes what it should: its logits are those of the prompt
    and the new token run as one sequence, at the last position."""
    from qcli.analyze.decode import cache_pairs, next_tokens, step_feeds
    from qcli.data.text import feeds

    model = onnx.load(str(tiny / "decoder.onnx"))
    session = ort.InferenceSession(str(tiny / "decoder.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    pairs = cache_pairs([i.name for i in session.get_inputs()], names)
    assert pairs == {f"past_key_values.{k}.{kv}": f"present.{k}.{kv}" for k in range(2) for kv in ("key", "value")}
    ids = np.array([[5, 17, 42, 8, 99, 3], [7, 7, 1, 250, 12, 60]], np.int64)
    inputs = model_inputs(model)
    prompt = feeds(ids, inputs, tiny)
    out = dict(zip(names, session.run(names, prompt), strict=True))
    tokens = next_tokens(out["logits"])
    step = session.run(["logits"], step_feeds(prompt, out, pairs, tokens))[0]
    whole = session.run(["logits"], feeds(np.concatenate([ids, tokens[:, None]], axis=1), inputs, tiny))[0]
    assert step.shape == (2, 1, whole.shape[2])
    assert np.allclose(step[:, 0], whole[:, -1], atol=1e-4)


def test_analyze_times_a_decoders_prompt_and_decode_step(cli, tmp_path: Path, tiny: Path) -> None:
    data = corpus(tmp_path / "text", tiny)
    out = tmp_path / "int4.onnx"
    cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", data, "--seq-len", "16", "--config", "weights-int4")
    doc = cli.json("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "3",
                   "--warmup", "1", "--samples", "4")
    assert doc["decode"]["prompt_tokens"] == 16 and doc["decode"]["step"]["runs"] == 3
    assert len(doc["decode"]["step"]["float"]["runs_ms"]) == 3
    shown = cli("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "3",
                "--warmup", "1", "--samples", "4")
    assert "prompt tokens/s (16 tokens)" in shown.stdout and "decode tokens/s (a token after 16)" in shown.stdout
    plain = cli.json("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "0",
                     "--samples", "4")
    assert plain["decode"] is None  # nothing timed


def test_analyze_predicts_a_decoders_decode_step_and_gates_on_it(cli, tmp_path: Path, tiny: Path) -> None:
    """The target profile prices a decode step after the prompt (the same figure every run:
    shapes, not a clock), and `--min-decode-speedup` gates on it."""
    data = corpus(tmp_path / "text", tiny)
    out = tmp_path / "int4.onnx"
    cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", data, "--seq-len", "16", "--config", "weights-int4")
    args = ("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "0", "--samples", "4")
    first, again = cli.json(*args), cli.json(*args)
    p = first["predicted"]
    assert p["decode_speedup"] == again["predicted"]["decode_speedup"] > 0
    assert abs(p["decode_speedup"] - p["decode_float_ms"] / p["decode_quantized_ms"]) < 1e-3
    assert p["decode_float_ms"] < p["float_ms"]  # one token, where the prompt is 16
    failed = cli(*args, "--min-decode-speedup", "1000")
    assert failed.exit_code == 1
    assert (f"predicted decode speedup {p['decode_speedup']:.2f}x < 1000.00x (short by "
            f"{1000 - p['decode_speedup']:.2f}x)") in failed.stdout + failed.stderr
    memory, pasts = first["memory"], [i for i in onnx.load(str(tiny / "decoder.onnx")).graph.input
                                      if i.name.startswith("past")]
    assert memory == again["memory"] and memory["cache_tokens"] == 16
    assert memory["cache_bytes"] == len(pasts) * 16 * 64 * 4  # [1, heads, 16, 64 / heads] float each
    assert memory["quantized_weight_bytes"] < memory["float_weight_bytes"] / 2
    assert abs(memory["reduction"] * memory["quantized_weight_bytes"] / memory["float_weight_bytes"] - 1) < 1e-3
    failed = cli(*args, "--min-memory-reduction", "1000")
    assert failed.exit_code == 1
    assert f"memory reduction {memory['reduction']:.2f}x < 1000.00x" in failed.stdout + failed.stderr
    shown = cli(*args).stdout
    assert "weights held by onnxruntime" in shown and "key/value cache after 16 tokens" in shown


def test_a_decoders_latency_floor_judges_its_decode_step(cli, tmp_path: Path, tiny: Path) -> None:
    """A decoder is served a token at a time: verification's latency floor prices the decode
    step after the prompt (the same figure `analyze` predicts for it), and says so."""
    data = corpus(tmp_path / "text", tiny)
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nactivations: {dtype: float}\n"
                      "weights: {dtype: int4, symmetric: true, granularity: per_block, block_size: 32}\n"
                      "verify: {max_latency_ratio: 10.0}\n")
    out = tmp_path / "int4.onnx"
    doc = cli.json("quantize", tiny / "decoder.onnx", "-o", out, "--data", data, "--seq-len", "16", "--config", config)
    verdict = doc["verification"]
    assert verdict["target"].endswith("batch 1, latency predicted, a decode step after the prompt "
                                      "against your model file as given")
    shown = cli.json("analyze", tiny / "decoder.onnx", out, "--data", data, "--seq-len", "16", "--runs", "0",
                     "--samples", "4")
    assert verdict["latency_ratio"] == pytest.approx(1 / shown["predicted"]["decode_speedup"], rel=1e-3)
