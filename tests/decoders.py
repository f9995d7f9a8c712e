"""Decoder-only language models with a KV cache, as torch.onnx / optimum write them, built with
onnx.helper and random weights (functional tests, memory and speed figures: never accuracy
claims), and a byte-level BPE tokenizer.json to read text folders with.

Inputs `input_ids`, `attention_mask` [batch, total], `position_ids`, `past_key_values.{i}.key|value`
[batch, heads, past, head_dim]; outputs `logits` [batch, sequence, vocab], `present.{i}.key|value`.
The causal mask allows query j (at position past + j) keys 0..past + j: Trilu(ones, k=past).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def decoder(vocab: int = 320, d: int = 64, heads: int = 4, layers: int = 2, mlp: int = 4, positions: int = 256,
            seed: int = 0) -> onnx.ModelProto:
    """A GPT-style pre-norm decoder (module docstring) with N(0, 0.02) weights from `seed`."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, *shape: int, scale: float = 0.02, value: float | None = None) -> str:
        array = np.full(shape, value, np.float32) if value is not None else (
            rng.standard_normal(shape, np.float32) * scale)
        inits.append(numpy_helper.from_array(array, name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=f"/{output}/{op}", **attrs))
        return output

    def const(name: str, values: list[int]) -> str:
        inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    hd = d // heads
    split_shape, merge_shape = const("split_shape", [0, 0, heads, hd]), const("merge_shape", [0, 0, d])
    scale = weight("attn_scale", value=1 / math.sqrt(hd))
    neg = weight("neg_inf", value=-1e9)
    one = weight("one", value=1.0)
    x = node("Add", [node("Gather", [weight("wte", vocab, d), "input_ids"], "tok"),
                     node("Gather", [weight("wpe", positions, d), "position_ids"], "pos")], "embed")
    graph_inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
                    helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence"]),
                    helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])]
    bias = _mask_bias(node, const, neg, one)
    for i in range(layers):
        p = f"layers.{i}"

        def linear(src: str, name: str, n_in: int, n_out: int, p: str = p) -> str:
            product = node("MatMul", [src, weight(f"{p}.{name}.weight", n_in, n_out)], f"{p}/{name}/MatMul")
            return node("Add", [product, weight(f"{p}.{name}.bias", n_out, value=0.0)], f"{p}/{name}/Add")

        h = node("LayerNormalization", [x, weight(f"{p}.ln1.weight", d, value=1.0), weight(f"{p}.ln1.bias", d, value=0.0)],
                 f"{p}/ln1", axis=-1)
        heads_of = {}
        for name in ("q", "k", "v"):
            split = node("Reshape", [linear(h, name, d, d), split_shape], f"{p}/{name}/split")
            heads_of[name] = node("Transpose", [split], f"{p}/{name}/heads", perm=[0, 2, 1, 3])
        present = {}
        for name, kind in (("k", "key"), ("v", "value")):
            past = f"past_key_values.{i}.{kind}"
            graph_inputs.append(helper.make_tensor_value_info(past, TensorProto.FLOAT,
                                                              ["batch", heads, "past_sequence", hd]))
            present[name] = node("Concat", [past, heads_of[name]], f"present.{i}.{kind}", axis=2)
            outputs.append(helper.make_tensor_value_info(present[name], TensorProto.FLOAT,
                                                         ["batch", heads, "total_sequence", hd]))
        keys_t = node("Transpose", [present["k"]], f"{p}/keys_t", perm=[0, 1, 3, 2])
        scores = node("Mul", [node("MatMul", [heads_of["q"], keys_t], f"{p}/scores"), scale], f"{p}/scaled")
        probs = node("Softmax", [node("Add", [scores, bias], f"{p}/masked")], f"{p}/probs", axis=-1)
        context = node("Transpose", [node("MatMul", [probs, present["v"]], f"{p}/context")], f"{p}/context_t",
                       perm=[0, 2, 1, 3])
        attn = linear(node("Reshape", [context, merge_shape], f"{p}/merged"), "o", d, d)
        x = node("Add", [x, attn], f"{p}/residual1")
        h = node("LayerNormalization", [x, weight(f"{p}.ln2.weight", d, value=1.0), weight(f"{p}.ln2.bias", d, value=0.0)],
                 f"{p}/ln2", axis=-1)
        up = linear(h, "fc1", d, mlp * d)
        gate = node("Sigmoid", [node("Mul", [up, weight(f"{p}.gelu_k", value=1.702)], f"{p}/gelu_in")], f"{p}/gelu_s")
        x = node("Add", [x, linear(node("Mul", [up, gate], f"{p}/gelu"), "fc2", mlp * d, d)], f"{p}/residual2")
    h = node("LayerNormalization", [x, weight("ln_f.weight", d, value=1.0), weight("ln_f.bias", d, value=0.0)], "ln_f",
             axis=-1)
    node("MatMul", [h, weight("lm_head.weight", d, vocab)], "logits")
    graph = helper.make_graph(nodes, "decoder", graph_inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if sum(t.ByteSize() for t in inits) < 1 << 30:  # past 2 GB the checker takes a path, not a model
        onnx.checker.check_model(model)
    return model


def _mask_bias(node, const, neg: str, one: str) -> str:
    """[batch, 1, sequence, total] additive bias: 0 where causal and not padding, -1e9 elsewhere."""
    ids_shape = node("Shape", ["input_ids"], "ids_shape")
    mask_shape = node("Shape", ["attention_mask"], "mask_shape")
    seq = node("Slice", [ids_shape, const("one_i", [1]), const("two_i", [2])], "seq_len")
    total = node("Slice", [mask_shape, const("one_j", [1]), const("two_j", [2])], "total_len")
    past = node("Squeeze", [node("Sub", [total, seq], "past_len_1")], "past_len")
    ones = node("ConstantOfShape", [node("Concat", [seq, total], "square_shape", axis=0)], "ones",
                value=helper.make_tensor("one_v", TensorProto.FLOAT, [1], [1.0]))
    causal = node("Trilu", [ones, past], "causal", upper=0)
    keys = node("Unsqueeze", [node("Cast", ["attention_mask"], "keys_f", to=TensorProto.FLOAT), const("axes_12", [1, 2])],
                "keys")
    allowed = node("Mul", [causal, keys], "allowed")
    return node("Mul", [node("Sub", [one, allowed], "blocked"), neg], "mask_bias")


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    """`model` at `path`, its weights in `path.name + '.data'` when `external` (past 2 GB it must be)."""
    onnx.save_model(model, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return path


def tokenizer_json(path: Path, texts: list[str], vocab: int = 320) -> Path:
    """A byte-level BPE tokenizer trained on `texts` (at most `vocab` ids), saved at `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


TEXT = [
    "Return a new list containing all items from the iterable in ascending order.",
    "A custom key function can be supplied to customize the sort order, and the reverse flag can be set.",
    "Open file and return a corresponding file object. If the file cannot be opened, an OSError is raised.",
    "The mode argument is an optional string that specifies the mode in which the file is opened.",
    "Return the number of items in a container. The argument may be a sequence or a collection.",
    "Create a new dictionary with keys from iterable and values set to value.",
]


def tiny_folder(root: Path) -> Path:
    """`root` with the default decoder (decoder.onnx) and a text folder (text/: 40 files of
    TEXT's sentences and the tokenizer)."""
    save(decoder(), root / "decoder.onnx")
    text = root / "text"
    text.mkdir()
    tokenizer_json(text / "tokenizer.json", TEXT)
    for i in range(40):
        (text / f"{i:03d}.txt").write_text(" ".join(TEXT[(i + j) % len(TEXT)] for j in range(3)))
    return root


def int4_blocks(cli, tmp_path: Path, tiny: Path, name: str, extra: str) -> dict:
    """`quantize --json` of `tiny_folder`'s decoder with weight-only int4 blocks of 32 and `extra`
    weights keys, written to `name`.onnx."""
    (tmp_path / f"{name}.yaml").write_text(
        "version: 1\nactivations: {dtype: float}\n"
        f"weights: {{dtype: int4, symmetric: true, granularity: per_block, block_size: 32, {extra}}}\n"
        "verify: {max_latency_ratio: null}\n")
    return cli.json("quantize", tiny / "decoder.onnx", "-o", tmp_path / f"{name}.onnx", "--data", tiny / "text",
                    "--seq-len", "16", "--config", tmp_path / f"{name}.yaml")
