"""A decoder's decode step: one new token after the prompt, its key/value cache fed back.

`qcli analyze` times a decoder (a model with past key/value inputs and `present*` outputs) at
the two speeds people quote: the prompt (prefill: the timed batch, L tokens a sample) and a
decode step after it. The step's inputs (`step_feeds`) come from one run of the prompt:
- `input_ids` [N, 1]: the float model's greedy next token after each prompt, fed to both models
  (the same work for each);
- `attention_mask` [N, L + 1] ones, `position_ids` [[L]], `token_type_ids` zeros;
- each past input: the matching cache output of that model's own prompt run
  (`past_key_values.3.key` or `past.3.key` <- `present.3.key`).
Every timed run repeats the same step (the cache is not grown between runs), so the runs time
the same work: decode tokens/s = N / the step's median seconds. Timings are reported, never
decide anything.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from qcli.analyze.latency import measure
from qcli.analyze.report import Decode
from qcli.runtime import make_session

PREFIXES = ("past_key_values.", "past_key_value.", "past.")


def cache_pairs(inputs: list[str], outputs: list[str]) -> dict[str, str] | None:
    """Each past input's cache output (`present.` + what follows its prefix); None when some past
    input has none, or there is no past input: not a decoder with a cache qcli can feed.

    >>> cache_pairs(["input_ids", "past_key_values.0.key"], ["logits", "present.0.key"])
    {'past_key_values.0.key': 'present.0.key'}
    >>> cache_pairs(["input_ids", "past.0.key"], ["logits"]) is None
    True
    """
    pairs = {}
    for name in inputs:
        prefix = next((p for p in PREFIXES if name.startswith(p)), None)
        if prefix is None:
            continue
        present = "present." + name[len(prefix):]
        if present not in outputs:
            return None
        pairs[name] = present
    return pairs or None


def step_feeds(prompt: dict[str, np.ndarray], outputs: dict[str, np.ndarray], pairs: dict[str, str],
               tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The inputs of the decode step after `prompt` (its feeds), from the model's outputs on it
    (`outputs`, by name) and the next token of each sample (`tokens`, [N])."""
    n, length = prompt["input_ids"].shape
    feeds = {"input_ids": tokens.reshape(n, 1).astype(prompt["input_ids"].dtype)}
    for name, value in prompt.items():
        if name == "attention_mask":
            feeds[name] = np.ones((n, length + 1), value.dtype)
        elif name == "position_ids":
            feeds[name] = np.full((n, 1), length, value.dtype)
        elif name == "token_type_ids":
            feeds[name] = np.zeros((n, 1), value.dtype)
        elif name in pairs:
            feeds[name] = np.ascontiguousarray(outputs[pairs[name]])
    return feeds


def decode_step(model: onnx.ModelProto, prompt: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The feeds of a decode step after `prompt` for pricing it (qcli.target): the cache the
    prompt leaves, zeros of its shape (a prediction reads shapes, not values); None when `model`
    is not a decoder with a cache qcli can feed."""
    outputs = [o.name for o in model.graph.output]
    pairs = cache_pairs([i.name for i in model.graph.input], outputs)
    if pairs is None or "input_ids" not in prompt:
        return None
    session = make_session(model, pass_only=True)
    wanted = sorted(set(pairs.values()))
    caches = {name: np.zeros_like(value) for name, value in zip(wanted, session.run(wanted, prompt), strict=True)}
    return step_feeds(prompt, caches, pairs, np.zeros(len(prompt["input_ids"]), np.int64))


def next_tokens(logits: np.ndarray) -> np.ndarray:
    """The greedy next token after each sample's last position, [N] (logits [N, L, V])."""
    return np.asarray(logits)[:, -1, :].argmax(-1)


def time_decode(float_session: Any, quantized_session: Any, prompt: dict[str, np.ndarray], *, runs: int,
                warmup: int, batch: int, threads: int | None) -> Decode | None:
    """The decode step after `prompt` (the timed feeds), timed as the prompt was: alternating
    runs of both sessions; None when the model is not a decoder with a cache qcli can feed."""
    outputs = [o.name for o in float_session.get_outputs()]
    pairs = cache_pairs([i.name for i in float_session.get_inputs()], outputs)
    if pairs is None or "input_ids" not in prompt:
        return None
    f_out = dict(zip(outputs, float_session.run(outputs, prompt), strict=True))
    q_out = dict(zip(outputs, quantized_session.run(outputs, prompt), strict=True))
    tokens = next_tokens(f_out[outputs[0]])
    f_step, q_step = step_feeds(prompt, f_out, pairs, tokens), step_feeds(prompt, q_out, pairs, tokens)
    del f_out, q_out
    step = measure(lambda: float_session.run(None, f_step), lambda: quantized_session.run(None, q_step),
                   runs=runs, warmup=warmup, batch=batch, threads=threads)
    return Decode(prompt_tokens=int(prompt["input_ids"].shape[1]), step=step)
