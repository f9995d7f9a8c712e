#!/usr/bin/env python3
"""Build a small decoder-only language model for int4/int8 weight-only quantization tests.

Run from the repository root inside the build-only venv (``make llm-models``)::

    python sample_models/decoder.py [--out DIR] [--steps N] [--minutes M]

It trains a GPT-style decoder (4 layers, d_model 256, ~4M parameters) on the docstrings of the
running Python's standard library with a byte-level BPE tokenizer (2048 tokens) trained on the
same text, and exports it to ONNX with a KV cache in the torch.onnx / Hugging Face optimum layout
(``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key|value`` in;
``logits``, ``present.{i}.key|value`` out). The output folder (default ``.llm-models/decoder``,
git-ignored: weights are never committed) gets ``model.onnx``, ``tokenizer.json``,
``text/calib/`` and ``text/eval/`` (``.txt`` files, each folder with its ``tokenizer.json``) and
a README.

Deterministic like build.py (whose helpers it uses): fixed seeds, deterministic algorithms on
two threads, sorted file lists, a fixed number of training steps.
"""

from __future__ import annotations

import os

# As in build.py: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import ast
import math
import platform
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tokenizers
import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build import (  # noqa: E402
    SEED,
    SelfAttention,
    STDLIB_SKIP,
    _docstring_nodes,
    finalize_onnx,
    fmt_bytes,
    io_table,
    model_summary,
    op_histogram,
    ops_line,
    ort_session,
    seed_everything,
)

DEFAULT_OUT = Path(".llm-models/decoder")
EOT = "<|endoftext|>"
VOCAB = 2048
HELD_OUT_FRACTION = 0.10
MODEL = dict(n_layers=4, d_model=256, n_heads=4, d_ff=1024, max_pos=512)
SEQ = 128
BATCH = 32
LR, WARMUP, WEIGHT_DECAY = 3e-3, 100, 0.1
# Fixed so that a rebuild is deterministic: a step took ~1.1 s on 2 CPU cores, so 600 steps are
# ~12 minutes of training. --steps overrides it, --minutes scales it.
STEPS_PER_12_MINUTES = 600
TEXT_TOKENS = 40_000          # about this many tokens in text/calib/ and in text/eval/
MODULE_TOKENS = (200, 12_000)  # a module's text goes into calib/ or eval/ when of this size


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

def collect_docstrings() -> dict[str, str]:
    """Module name -> its docstrings (module, classes, functions in source order) joined by blank lines.

    The standard library's .py files of the running Python, sorted, test suites, idlelib and
    lib2to3 left out (build.py's STDLIB_SKIP); each docstring cleaned by ``inspect.cleandoc``
    (``ast.get_docstring`` does that). Modules without docstrings are left out.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    py_files = sorted(p for p in stdlib.rglob("*.py") if not STDLIB_SKIP & set(p.relative_to(stdlib).parts))
    texts = {}
    for path in py_files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        nodes = sorted(_docstring_nodes(tree), key=lambda ne: (ne[1].lineno, ne[1].col_offset))
        docs = [ast.get_docstring(node, clean=True) for node, _ in nodes]
        docs = [d for d in docs if d.strip()]
        if docs:
            name = ".".join(path.relative_to(stdlib).with_suffix("").parts)
            texts[name] = "\n\n".join(docs) + "\n"
    return texts


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------

class CausalSelfAttention(SelfAttention):
    """The transformer sample's projections (build.py), attention written out (MatMul, Softmax,
    MatMul) so it exports to plain ONNX ops, causal and with a KV cache."""

    def forward(self, x, allowed, past_k=None, past_v=None):
        """x [b, t, d]; allowed bool [b, 1, t, past + t]. Returns output, keys and values [b, h, past + t, dh]."""
        b, t, _ = x.shape

        def heads(y):  # [b, t, d] -> [b, h, t, dh]
            return y.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if past_k is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.d_head ** -0.5)
        # Masked keys get the float32 minimum (as Hugging Face models do). A row with every key
        # masked (a padding query) is uniform, not NaN.
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        attn = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, -1)
        return self.out_proj(ctx), k, v


class Block(nn.Module):
    """Pre-LayerNorm decoder block."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()   # exact GELU: Div/Erf/Add/Mul/Mul at opset 17
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x, allowed, past_k=None, past_v=None):
        a, k, v = self.attn(self.norm1(x), allowed, past_k, past_v)
        x = x + a
        return x + self.fc2(self.act(self.fc1(self.norm2(x)))), k, v


class Decoder(nn.Module):
    def __init__(self, vocab: int, n_layers: int, d_model: int, n_heads: int, d_ff: int, max_pos: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_pos, d_model)
        self.layers = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():   # GPT-2: residual projections scaled down
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask, position_ids, past=None):
        """past: list of (key, value) [b, h, past, dh] per layer or None. Returns logits, presents."""
        t = input_ids.shape[1]
        past_len = past[0][0].shape[2] if past is not None else 0
        total = attention_mask.shape[1]
        # Query j (absolute position past_len + j) sees keys 0..past_len + j that are not padding.
        q_pos = torch.arange(t, device=input_ids.device) + past_len
        k_pos = torch.arange(total, device=input_ids.device)
        causal = k_pos[None, :] <= q_pos[:, None]                          # [t, total]
        allowed = causal[None, None] & (attention_mask[:, None, None, :] != 0)   # [b, 1, t, total]
        x = self.embed(input_ids) + self.pos(position_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            pk, pv = past[i] if past is not None else (None, None)
            x, k, v = layer(x, allowed, pk, pv)
            presents.append((k, v))
        return self.lm_head(self.norm(x)), presents

    def lm_logits(self, input_ids):
        """Plain causal LM on an unpadded batch [b, t] (training and evaluation)."""
        b, t = input_ids.shape
        pos = torch.arange(t).expand(b, t)
        return self(input_ids, torch.ones_like(input_ids), pos)[0]


class OnnxWrapper(nn.Module):
    """Flat signature for torch.onnx.export: ids, mask, positions, then past key/value per layer."""

    def __init__(self, model: Decoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past_flat):
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]
        logits, presents = self.model(input_ids, attention_mask, position_ids, past)
        return (logits, *[t for kv in presents for t in kv])


# --------------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------------

def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))   # cosine down to LR/10


def train(model: Decoder, stream: torch.Tensor, steps: int) -> list[tuple[int, float]]:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n and "pos" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n and "pos" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(SEED)
    offsets = torch.arange(SEQ + 1)
    history, running, n, t0 = [], 0.0, 0, time.time()
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        starts = torch.randint(0, len(stream) - SEQ - 1, (BATCH,), generator=gen)
        chunk = stream[starts[:, None] + offsets]
        logits = model.lm_logits(chunk[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running, n = running + loss.item(), n + 1
        if (step + 1) % 50 == 0 or step == 0 or step == steps - 1:   # mean loss since the last print
            history.append((step + 1, running / n))
            print(f"  step {step + 1:5d}/{steps}  loss {running / n:.4f}  lr {lr_at(step, steps):.2e}  "
                  f"({time.time() - t0:.0f}s)", flush=True)
            running, n = 0.0, 0
    model.eval()
    return history


def chunks_of(ids: list[int], size: int = SEQ) -> list[list[int]]:
    """Non-overlapping chunks of `size` tokens (the last one shorter; 1-token tails dropped)."""
    return [ids[s:s + size] for s in range(0, len(ids), size) if len(ids[s:s + size]) >= 2]


def nll_torch(model: Decoder, chunks: list[list[int]]) -> tuple[float, int]:
    """Summed NLL of every predicted token (token 1.. of each chunk) and their count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for c in chunks:
            ids = torch.tensor([c])
            logits = model.lm_logits(ids)
            total += F.cross_entropy(logits[0, :-1].double(), ids[0, 1:], reduction="sum").item()
            count += len(c) - 1
    return total, count


def empty_past(batch: int = 1) -> dict[str, np.ndarray]:
    h, dh = MODEL["n_heads"], MODEL["d_model"] // MODEL["n_heads"]
    z = np.zeros((batch, h, 0, dh), np.float32)
    return {f"past_key_values.{i}.{kv}": z for i in range(MODEL["n_layers"]) for kv in ("key", "value")}


def ort_feeds(ids: np.ndarray, past: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    past_len = next(iter(past.values())).shape[2]
    b, t = ids.shape
    return {"input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((b, past_len + t), np.int64),
            "position_ids": np.broadcast_to(np.arange(past_len, past_len + t, dtype=np.int64), (b, t)).copy(),
            **past}


def nll_ort(sess: ort.InferenceSession, chunks: list[list[int]]) -> float:
    total = 0.0
    for c in chunks:
        logits = sess.run(["logits"], ort_feeds(np.array([c]), empty_past()))[0][0].astype(np.float64)
        logits = logits[:-1]
        m = logits.max(-1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        total -= logp[np.arange(len(c) - 1), c[1:]].sum()
    return total


def presents_to_past(sess: ort.InferenceSession, outs: list[np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return {n.replace("present.", "past_key_values."): v
            for n, v in zip(names, outs, strict=True) if n.startswith("present.")}


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------

def pick_modules(names: list[str], n_tokens: dict[str, int], rng: random.Random) -> list[str]:
    """Modules of MODULE_TOKENS size in seeded random order until TEXT_TOKENS are reached; sorted."""
    order = [n for n in names if MODULE_TOKENS[0] <= n_tokens[n] <= MODULE_TOKENS[1]]
    rng.shuffle(order)
    picked, total = [], 0
    for n in order:
        if total >= TEXT_TOKENS:
            break
        picked.append(n)
        total += n_tokens[n]
    return sorted(picked)


def write_text_folder(folder: Path, texts: dict[str, str], names: list[str], tokenizer_path: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for n in names:
        (folder / f"{n}.txt").write_text(texts[n], encoding="utf-8")
    shutil.copyfile(tokenizer_path, folder / "tokenizer.json")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--minutes", type=float, default=12.0,
                        help=f"training budget: scales the fixed step count ({STEPS_PER_12_MINUTES} steps per "
                             "12 minutes)")
    parser.add_argument("--steps", type=int, help="exact number of training steps (overrides --minutes)")
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else max(1, round(STEPS_PER_12_MINUTES * args.minutes / 12))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    seed_everything()

    # Text, split by module file.
    texts = collect_docstrings()
    names = sorted(texts)
    rng = random.Random(SEED)
    held = set(rng.sample(names, round(HELD_OUT_FRACTION * len(names))))
    train_names = [n for n in names if n not in held]
    held_names = [n for n in names if n in held]
    print(f"[decoder] {len(names)} modules with docstrings: {len(train_names)} train, {len(held_names)} held out "
          f"({sum(len(texts[n]) for n in train_names):,} / {sum(len(texts[n]) for n in held_names):,} characters)",
          flush=True)

    tok = train_tokenizer([texts[n] for n in train_names])
    tokenizer_path = out / "tokenizer.json"
    tok.save(str(tokenizer_path))
    eot = tok.token_to_id(EOT)
    ids = {n: tok.encode(texts[n]).ids for n in names}
    n_tokens = {n: len(v) for n, v in ids.items()}
    stream = torch.tensor([t for n in train_names for t in ids[n] + [eot]], dtype=torch.int64)
    n_held_tokens = sum(n_tokens[n] for n in held_names)
    print(f"[decoder] tokenizer: {tok.get_vocab_size()} tokens; train stream {len(stream):,} tokens, "
          f"held out {n_held_tokens:,} tokens", flush=True)

    # Data folders.
    calib_names = pick_modules(train_names, n_tokens, rng)
    eval_names = pick_modules(held_names, n_tokens, rng)
    write_text_folder(out / "text" / "calib", texts, calib_names, tokenizer_path)
    write_text_folder(out / "text" / "eval", texts, eval_names, tokenizer_path)
    calib_tokens = sum(n_tokens[n] for n in calib_names)
    eval_tokens = sum(n_tokens[n] for n in eval_names)
    print(f"[decoder] text/calib: {len(calib_names)} files, {calib_tokens:,} tokens; "
          f"text/eval: {len(eval_names)} files, {eval_tokens:,} tokens", flush=True)

    # Train.
    model = Decoder(VOCAB, **MODEL)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[decoder] model: {n_params:,} parameters; training {steps} steps of {BATCH}x{SEQ} tokens", flush=True)
    t_train = time.time()
    history = train(model, stream, steps)
    train_seconds = time.time() - t_train
    held_chunks = [c for n in held_names for c in chunks_of(ids[n])]
    nll, count = nll_torch(model, held_chunks)
    held_ppl = math.exp(nll / count)
    print(f"[decoder] trained in {train_seconds:.0f}s; held-out perplexity (torch, {count:,} predicted tokens): "
          f"{held_ppl:.3f}", flush=True)

    # Export.
    onnx_path = out / "model.onnx"
    L, H, DH = MODEL["n_layers"], MODEL["n_heads"], MODEL["d_model"] // MODEL["n_heads"]
    past_names = [f"past_key_values.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
    ex_b, ex_t, ex_past = 2, 5, 3   # traced with a non-empty past; every axis is dynamic
    ex_ids = torch.randint(0, VOCAB, (ex_b, ex_t), generator=torch.Generator().manual_seed(SEED))
    ex_mask = torch.ones(ex_b, ex_past + ex_t, dtype=torch.int64)
    ex_pos = torch.arange(ex_past, ex_past + ex_t).expand(ex_b, ex_t).contiguous()
    ex_kv = [torch.zeros(ex_b, H, ex_past, DH) for _ in past_names]
    dynamic_axes = {"input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "total_sequence"},
                    "position_ids": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch", 1: "sequence"},
                    **{n: {0: "batch", 2: "past_sequence"} for n in past_names},
                    **{n: {0: "batch", 2: "total_sequence"} for n in present_names}}
    wrapper = OnnxWrapper(model).eval()
    with torch.no_grad():
        torch.onnx.export(wrapper, (ex_ids, ex_mask, ex_pos, *ex_kv), str(onnx_path), dynamo=False,
                          opset_version=17, do_constant_folding=True,
                          input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=dynamic_axes)
    onnx_model = finalize_onnx(onnx.load(str(onnx_path)), onnx_path)   # (c) onnx.checker (full check)
    ops = op_histogram(onnx_model)
    fused = set(ops) - PLAIN_OPS
    assert not fused, f"unexpected ops in the export: {sorted(fused)}"
    print(f"[decoder] exported {fmt_bytes(onnx_path.stat().st_size)}; onnx.checker passed; ops: {ops}", flush=True)

    # (a) prefill with an empty past: onnxruntime vs torch on a held-out chunk.
    sess = ort_session(onnx_path)
    chunk = next(c for c in held_chunks if len(c) == SEQ)
    ids0 = np.array([chunk])
    outs = sess.run(None, ort_feeds(ids0, empty_past()))
    with torch.no_grad():
        ref = model.lm_logits(torch.from_numpy(ids0)).numpy()
    diff_a = float(np.abs(outs[0] - ref).max())
    print(f"[decoder] (a) prefill {len(chunk)} tokens, max |torch - onnxruntime| logits: {diff_a:.2e}", flush=True)
    assert outs[0].shape == (1, len(chunk), VOCAB) and diff_a < 1e-3, f"(a) failed: {diff_a}"
    assert all(o.shape == (1, H, len(chunk), DH) for o in outs[1:])

    # (b) prefill 64 tokens, then 16 decode steps of one token feeding present.* back as past,
    #     against one prefill of 80 tokens.
    long = next(c for n in held_names for c in chunks_of(ids[n]) if len(c) >= 80)[:80]
    full = sess.run(["logits"], ort_feeds(np.array([long]), empty_past()))[0]
    outs = sess.run(None, ort_feeds(np.array([long[:64]]), empty_past()))
    step_logits = [outs[0]]
    for j in range(64, 80):
        outs = sess.run(None, ort_feeds(np.array([[long[j]]]), presents_to_past(sess, outs)))
        step_logits.append(outs[0])
    assert outs[1].shape == (1, H, 80, DH)
    diff_b = float(np.abs(np.concatenate(step_logits, axis=1) - full).max())
    print(f"[decoder] (b) prefill 64 + 16 decode steps vs prefill 80, max |diff| logits: {diff_b:.2e}", flush=True)
    assert diff_b < 1e-4, f"(b) failed: {diff_b}"

    # (b') padding: a left-padded batch row (attention_mask 0, positions from the mask) gives the
    #      same logits on its real tokens, in prefill and in one decode step.
    diff_pad = check_left_padding(sess, long[:40], long[40])
    print(f"[decoder] (b') left padding (8 pad tokens) vs none, max |diff| logits: {diff_pad:.2e}", flush=True)
    assert diff_pad < 1e-4, f"padding check failed: {diff_pad}"

    # Perplexity on text/eval/ (each file chunked to 128 tokens), torch and onnxruntime.
    eval_chunks = [c for p in sorted((out / "text" / "eval").glob("*.txt"))
                   for c in chunks_of(tok.encode(p.read_text(encoding="utf-8")).ids)]
    nll_t, count_e = nll_torch(model, eval_chunks)
    nll_o = nll_ort(sess, eval_chunks)
    ppl_t, ppl_o = math.exp(nll_t / count_e), math.exp(nll_o / count_e)
    print(f"[decoder] text/eval perplexity ({len(eval_chunks)} chunks, {count_e:,} predicted tokens): "
          f"torch {ppl_t:.4f}, onnxruntime {ppl_o:.4f}", flush=True)
    assert abs(ppl_t - ppl_o) / ppl_t < 1e-3

    info = dict(eot=eot, n_modules=len(names), n_train=len(train_names), n_held=len(held_names),
                train_chars=sum(len(texts[n]) for n in train_names),
                held_chars=sum(len(texts[n]) for n in held_names), stream_tokens=len(stream),
                held_tokens=n_held_tokens, held_count=count, held_ppl=held_ppl, n_params=n_params,
                steps=steps, train_seconds=train_seconds, history=history, calib_names=calib_names,
                eval_names=eval_names, calib_tokens=calib_tokens, eval_tokens=eval_tokens,
                eval_chunks=len(eval_chunks), eval_count=count_e, ppl_t=ppl_t, ppl_o=ppl_o,
                diff_a=diff_a, diff_b=diff_b, diff_pad=diff_pad, ops=ops)
    write_readme(out, onnx_model, onnx_path, info)
    print(f"[decoder] done in {time.time() - t_start:.0f}s: {out}", flush=True)
    return 0


# What the export may contain: plain ops only (no fused attention or contrib ops).
PLAIN_OPS = {"Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Div", "Equal", "Erf", "Expand",
             "Gather", "LayerNormalization", "LessOrEqual", "MatMul", "Mul", "Not", "Range", "Reshape", "Shape",
             "Slice", "Softmax", "Sqrt", "Squeeze", "Transpose", "Unsqueeze", "Where"}


def check_left_padding(sess: ort.InferenceSession, ids: list[int], next_id: int, pad: int = 8) -> float:
    """Batch of two: row 0 unpadded, row 1 the same tokens after `pad` padding tokens (mask 0)."""
    t = len(ids)
    batch = np.zeros((2, pad + t), np.int64)
    batch[0, :t] = ids
    batch[0, t:] = ids[:pad]          # filler so row 0 has the same width: compared on [:t] only
    batch[1, pad:] = ids
    mask = np.ones_like(batch)
    mask[1, :pad] = 0
    pos = np.stack([np.arange(pad + t), np.clip(np.arange(pad + t) - pad, 0, None)]).astype(np.int64)
    feeds = {"input_ids": batch, "attention_mask": mask, "position_ids": pos, **empty_past(2)}
    outs = sess.run(None, feeds)
    diff = float(np.abs(outs[0][0, :t] - outs[0][1, pad:]).max())
    # One decode step: row 1 continues after its real tokens; row 0 is run alone for reference.
    past = presents_to_past(sess, outs)
    step = sess.run(["logits"], {"input_ids": np.array([[next_id], [next_id]], np.int64),
                                 "attention_mask": np.concatenate([mask, np.ones((2, 1), np.int64)], 1),
                                 "position_ids": np.array([[pad + t], [t]], np.int64), **past})[0]
    ref_out = sess.run(None, ort_feeds(np.array([ids]), empty_past()))
    ref = sess.run(["logits"], ort_feeds(np.array([[next_id]]), presents_to_past(sess, ref_out)))[0]
    return max(diff, float(np.abs(step[1] - ref[0]).max()))


def write_readme(out: Path, onnx_model: onnx.ModelProto, onnx_path: Path, i: dict) -> None:
    opset, ir = model_summary(onnx_model)
    m = MODEL
    shown = i["history"][::max(1, len(i["history"]) // 8)]
    shown += [h for h in i["history"][-1:] if h != shown[-1]]
    losses = ", ".join(f"{s}: {v:.3f}" for s, v in shown)
    text = f"""# decoder: a small GPT-style language model with a KV cache

Built by `sample_models/decoder.py` (`make llm-models`); do not edit by hand. The weights are
never committed: this folder is git-ignored (or outside the repository) and rebuilt on demand.

## Text
The docstrings (module, class and function; `inspect.cleandoc`-ed, joined by blank lines, in
source order) of the {i['n_modules']} `.py` files of the Python {platform.python_version()} standard library that have any
(test suites, idlelib and lib2to3 left out). Split by module file with a seeded RNG:
{i['n_train']} modules ({i['train_chars']:,} characters) train, {i['n_held']} ({i['held_chars']:,} characters, {i['held_tokens']:,} tokens) held out and never
trained on.

- `text/calib/`: {len(i['calib_names'])} training modules, one `.txt` each, {i['calib_tokens']:,} tokens.
- `text/eval/`: {len(i['eval_names'])} held-out modules, one `.txt` each, {i['eval_tokens']:,} tokens.
- Modules of {MODULE_TOKENS[0]:,}..{MODULE_TOKENS[1]:,} tokens, picked in seeded random order until {TEXT_TOKENS:,} tokens.
  Each folder holds a copy of `tokenizer.json`.

## Tokenizer
`tokenizer.json` (tokenizers {tokenizers.__version__}): byte-level BPE (ByteLevel pre-tokenizer without a prefix
space, ByteLevel decoder), {VOCAB} tokens including the special `{EOT}` (id
{i['eot']}), trained on the training modules only. No BOS is added; in training, modules are
concatenated with `{EOT}` after each.

## Model
GPT-style decoder: token embedding ({VOCAB}×{m['d_model']}) + learned positional embedding ({m['max_pos']} positions,
looked up by `position_ids`), {m['n_layers']} pre-LayerNorm blocks (d_model {m['d_model']}, {m['n_heads']} heads of {m['d_model'] // m['n_heads']}, causal
self-attention written out as MatMul/Softmax/MatMul, MLP {m['d_ff']} with exact GELU), final LayerNorm,
untied `lm_head` Linear({m['d_model']}→{VOCAB}, no bias). **{i['n_params']:,} parameters.**

Training: {i['steps']} steps of {BATCH} sequences × {SEQ} tokens sampled at seeded random offsets of the
training stream ({i['stream_tokens']:,} tokens), AdamW (lr {LR:g}, betas 0.9/0.95, {WARMUP} warm-up steps then
cosine decay to lr/10, weight decay {WEIGHT_DECAY} on matrices, none on embeddings/biases/norms), gradient
clipping 1.0; {i['train_seconds'] / 60:.1f} minutes on 2 CPU threads. Train loss by step: {losses}.

## Perplexity
- Held-out modules, all of them ({i['held_count']:,} predicted tokens, torch): **{i['held_ppl']:.3f}**
- `text/eval/` ({i['eval_chunks']} chunks, {i['eval_count']:,} predicted tokens): torch **{i['ppl_t']:.4f}**,
  onnxruntime {ort.__version__} **{i['ppl_o']:.4f}**

Each file's text is tokenized and cut into non-overlapping 128-token chunks (the last one
shorter), each run with an empty past; perplexity = exp(mean NLL over every predicted token,
i.e. tokens 2.. of each chunk).

## ONNX
`model.onnx`: {fmt_bytes(onnx_path.stat().st_size)}, opset {opset}, IR version {ir}; torch {torch.__version__.split('+')[0]}'s TorchScript
exporter (`dynamo=False`), eval mode, constant folding on. Inputs and outputs in the torch.onnx /
Hugging Face optimum layout (`present.{{i}}.*` = concat(past, new) on axis 2):

{io_table(onnx_model)}

The causal mask (query at position past+j sees keys 0..past+j) and the padding mask
(`attention_mask` 0 = padded key) are computed inside the graph; masked scores are set to the
float32 minimum (Where) before Softmax. With padding, pass `position_ids` counted over real
tokens (as Hugging Face does: cumsum of the mask − 1).

Ops: {ops_line(i['ops'])}.

Checks run by the build (max |difference| of the logits):
- onnxruntime vs torch, prefill of a held-out chunk with an empty past: {i['diff_a']:.1e}
- prefill 64 tokens then 16 one-token decode steps (present fed back as past) vs one prefill
  of 80 tokens: {i['diff_b']:.1e}
- a left-padded batch row (8 padding tokens) vs the same tokens unpadded, prefill and one decode
  step: {i['diff_pad']:.1e}
- `onnx.checker.check_model(full_check=True)` passes.
"""
    (out / "README.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
