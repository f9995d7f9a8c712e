"""What the target profile predicts for a pair of models in `qcli analyze` (qcli.target): both
models' latency on the first samples at the deployment's batch, a decoder's decode step after
them (qcli.analyze.decode), and what onnxruntime holds to run each (the weights of the graph it
runs, a decoder's key/value cache). Pure functions of the models, the feeds' shapes and the
profile: the same figures on any machine."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from qcli.analyze.decode import PREFIXES, decode_step
from qcli.analyze.latency import timed_inputs
from qcli.analyze.report import Memory, Predicted, rounded
from qcli.data import Batch, InputSpec


def predicted(float_model: onnx.ModelProto, quantized: onnx.ModelProto, first: Batch, inputs: list[InputSpec],
              deployment: Any) -> tuple[Predicted, Memory]:
    """Both models' latency on the first samples at the deployment's batch, by its profile, and
    what onnxruntime holds to run them."""
    feeds, batch = timed_inputs(first, inputs, deployment.batch)
    f, q = deployment.predict(float_model, feeds), deployment.predict(quantized, feeds)
    step = decode_step(float_model, feeds)
    figures = Predicted(deployment.describe(), batch, round(f.ms, 4), round(q.ms, 4), round(f.us / q.us, 4))
    memory = Memory(f.weight_bytes, q.weight_bytes, rounded(f.weight_bytes / max(q.weight_bytes, 1), 4))
    if step is not None:
        fs, qs = deployment.predict(float_model, step), deployment.predict(quantized, step)
        figures.decode_float_ms, figures.decode_quantized_ms = round(fs.ms, 4), round(qs.ms, 4)
        figures.decode_speedup = round(fs.us / qs.us, 4)
        memory.cache_bytes = int(sum(v.nbytes for name, v in step.items() if name.startswith(PREFIXES)))
        memory.cache_tokens = int(feeds["input_ids"].shape[1])
    return figures, memory


def served(model: onnx.ModelProto, prompt: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a latency floor judges `model` on: a decoder with a cache is served a token at a
    time, so its decode step after `prompt` (qcli.analyze.decode); any other model, `prompt`."""
    return decode_step(model, prompt) or prompt
