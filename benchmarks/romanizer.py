"""arabic-name-romanizer's GRU sequence-to-sequence model (its wheel: a bidirectional GRU
encoder and an attention GRU decoder run one step at a time, trained weights), fed the Arabic
names of the wheel's own lexicon, and judged by what its users read: the Latin spelling.

* `write_encoder_names`: one name a sample, as the package encodes it (its country and role
  tokens, the characters, EOS: src int64 [1, L]; src_mask bool [1, L], True at padding: none);
* `write_decoder_steps`: the decoder's steps along float's greedy decoding of each name
  (prefix int64 [1, t] from BOS, memory, src_mask, hidden: the encoder's outputs and the hidden
  state the previous step returned), each name's steps in order;
* `names_by_steps`: the share of names whose every step's best next character is float's (greedy
  decoding with the quantized decoder then writes float's spelling, each step fed float's
  prefix); `names_by_encoder`: the share of names the float decoder spells as float's from the
  quantized encoder's outputs. The package decodes with a beam of 2; greedy is its first beam.

The names come from the package's own lexicon (names.sqlite3, Wikidata and other sources):
the model may have been trained on them, and each split reads its own names.
"""

from __future__ import annotations

import json
import sqlite3
from functools import cache
from pathlib import Path

import numpy as np
from inputs import REAL  # noqa: E402  (benchmarks/inputs.py)
from usermetrics import Judgement, Outputs, Samples  # noqa: E402  (benchmarks/usermetrics.py)

HOME = REAL / "arabic_name_romanizer" / "resources"
ENCODER, DECODER = HOME / "encoder.onnx", HOME / "decoder.onnx"
SPLITS = {"calib": 32, "verify": 64, "holdout": 256}  # names
BOS, EOS, MAX_LEN = 1, 2, 32  # the vocabulary's ids; meta.json's max_tgt_len
STATE = (("memory", "memory_out"), ("src_mask", "src_mask_out"), ("hidden", "hidden_out"))  # decoder <- encoder


@cache
def sessions() -> tuple:
    from qcli.runtime import make_session
    return make_session(ENCODER), make_session(DECODER)


def names(sizes: dict[str, int]) -> dict[str, list[tuple[str, str, str]]]:
    """(arabic, country, role) of distinct names, shuffled once (seed 0), cut into the splits."""
    with sqlite3.connect(HOME / "names.sqlite3") as db:
        rows = db.execute("SELECT arabic_key, country, role FROM units GROUP BY arabic_key "
                          "ORDER BY arabic_key").fetchall()
    order = np.random.default_rng(0).permutation(len(rows))
    out, start = {}, 0
    for split, n in sizes.items():
        out[split] = [rows[i] for i in order[start:start + n]]
        start += n
    return out


@cache
def vocabulary() -> dict[str, int]:
    """The package's tokens (vocab.json) by id."""
    tokens = json.loads((HOME / "vocab.json").read_text(encoding="utf-8"))["tokens"]
    return {t: i for i, t in enumerate(tokens)}


def encoded(arabic: str, country: str, role: str) -> dict[str, np.ndarray]:
    """The encoder's inputs for one name, as `encode_source_ids` makes them."""
    index = vocabulary()
    prefix = [f"<{country.upper()}>" if country else "<UNK_COUNTRY>", f"<ROLE_{(role or 'unknown').upper()}>"]
    ids = [index.get(t, 3) for t in prefix] + [index.get(ch, 3) for ch in arabic] + [EOS]
    return {"src": np.array([ids], np.int64), "src_mask": np.zeros((1, len(ids)), bool)}  # True: padding


def greedy(state: dict[str, np.ndarray]) -> tuple[list[dict[str, np.ndarray]], tuple[int, ...]]:
    """The decoder's inputs at each step of greedy decoding from the encoder's outputs `state`
    (by the decoder's input names), and the ids it chose, the last EOS (or MAX_LEN steps)."""
    prefix, steps = [BOS], []
    hidden = state["hidden"]
    for _ in range(MAX_LEN):
        feed = {"prefix": np.array([prefix], np.int64), "memory": state["memory"], "src_mask": state["src_mask"],
                "hidden": hidden}
        steps.append(feed)
        logprobs, hidden = sessions()[1].run(["logprobs", "hidden_out"], feed)
        prefix.append(int(logprobs[0].argmax()))
        if prefix[-1] == EOS:
            break
    return steps, tuple(prefix[1:])


def _write(folder: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(samples):
        np.savez(folder / f"{i:04d}.npz", **sample)
    return folder


def write_encoder_names(out: Path, sizes: dict[str, int] = SPLITS) -> dict[str, Path]:
    return {split: _write(out / split, [encoded(*row) for row in rows]) for split, rows in names(sizes).items()}


def write_decoder_steps(out: Path, sizes: dict[str, int] = SPLITS) -> dict[str, Path]:
    """Every step of float's greedy decoding of each name (calibration and verification: the
    names' steps, at least as many as `sizes` says of names, whole names; held out: every name)."""
    encoder = sessions()[0]
    folders = {}
    for split, rows in names(sizes).items():
        samples: list[dict[str, np.ndarray]] = []
        for row in rows:
            outs = dict(zip([o for o, _ in STATE], encoder.run([e for _, e in STATE], encoded(*row)), strict=True))
            samples += greedy(outs)[0]
            if split != "holdout" and len(samples) >= sizes[split]:
                break
        folders[split] = _write(out / split, samples)
    return folders


def names_by_steps(reference: Outputs, got: Outputs, held_out: Samples, floor: float = 0.99) -> Judgement:
    """The share of names whose every step's best next character is float's; the steps' in the
    details. A name's steps start where the prefix is BOS alone."""
    same = [bool(r["logprobs"][0].argmax() == g["logprobs"][0].argmax()) for r, g in zip(reference, got, strict=True)]
    starts = [i for i, s in enumerate(held_out) if s["prefix"].shape[1] == 1] + [len(held_out)]
    whole = [all(same[a:b]) for a, b in zip(starts, starts[1:], strict=False)]
    return Judgement("names spelled as float's", float(np.mean(whole)), floor,
                     detail=f"{len(whole) - sum(whole)} of {len(whole)} differ; steps {np.mean(same):.4f}")


def names_by_encoder(reference: Outputs, got: Outputs, held_out: Samples, floor: float = 0.99) -> Judgement:
    """The share of names the float decoder spells as float's from the quantized encoder's
    outputs (greedy)."""
    pairs = [(greedy({d: r[e] for d, e in STATE})[1], greedy({d: g[e] for d, e in STATE})[1])
             for r, g in zip(reference, got, strict=True)]
    same = [a == b for a, b in pairs]
    return Judgement("names spelled as float's", float(np.mean(same)), floor,
                     detail=f"{len(same) - sum(same)} of {len(same)} differ")
