"""The fuzzer's seed corpus: the smallest case of each failure cause it has found (issue 20's
bugs and the new ones), in ONNX text. `test_fuzz.test_seed` runs each through the same
commands and properties as a generated graph, on every run of the suite, so a fixed cause
stays fixed once `fuzz_check.KNOWN` no longer excuses it. (Bugs 6 and 7 are bad inputs:
fuzz_bad runs them all.)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _values(n: int, seed: int = 0) -> str:
    return "{" + ", ".join(f"{v:.3f}" for v in np.random.default_rng(seed).normal(0, 0.5, n)) + "}"


HEADER = '<ir_version: 8, opset_import: ["" : {opset}]>\n'


@dataclass(frozen=True)
class Seed:
    """A model (ONNX text), a config (YAML, may be empty) and extra quantize flags; `known`: the
    fuzz_check.KNOWN entry it shows today."""

    model: str
    config: str = ""
    flags: tuple[str, ...] = ()
    known: str = ""
    opset: int = 17

    @property
    def text(self) -> str:
        return HEADER.replace("{opset}", str(self.opset)) + self.model


SEEDS: dict[str, Seed] = {
    "gemm bias [1, N]": Seed(f"""g (float[N, 8] x) => (float[N, 4] y)
    <float[8, 4] b = {_values(32)}, float[1, 4] c = {{0.1, -0.2, 0.3, 0.4}}> {{
    y = Gemm <alpha = 0.5> (x, b, c)
}}""", known="1"),
    "grouped ConvTranspose": Seed(f"""g (float[N, 4, 3] x) => (float[N, 4, 3] y)
    <float[4, 2, 1] w = {_values(8)}, float[4] b = {{0.1, -0.2, 0.3, 0.4}}> {{
    y = ConvTranspose <group = 2> (x, w, b)
}}""", known="2"),
    "batched MatMul weight": Seed(f"""g (float[N, 2, 3, 8] x) => (float[N, 2, 3, 4] y)
    <float[2, 8, 4] w = {_values(64)}> {{
    y = MatMul (x, w)
}}""", known="3"),
    "per_block below opset 21 with ReduceMean": Seed(f"""g (float[N, 32] x) => (float[N, 1] y)
    <float[32, 8] w = {_values(256)}> {{
    h = MatMul (x, w)
    y = ReduceMean <axes = [-1]> (h)
}}""", flags=("--config", "weights-int4"), known="4"),
    "auto-precision candidates [] and a missed goal": Seed(f"""g (float[N, 2, 8] x) => (float[N, 2, 4] y)
    <float[8, 8] w = {_values(64)}, float[8, 4] v = {_values(32, 1)}> {{
    h = MatMul (x, w)
    r = Relu (h)
    y = MatMul (r, v)
}}""", config="auto_precision: {candidates: [], max_trials: 3, time_budget: 5}\nverify: {max_latency_ratio: null}\n",
        flags=("--auto-precision", "--max-accuracy-drop", "0"), known="5"),
    "no inputs": Seed("""g () => (float[2, 3] y) {
    c = Constant <value = float[2, 3] {1, -2, 3, -4, 5, -6}> ()
    y = Relu (c)
}""", known="8"),
    "a Constant as a graph output": Seed("""g (float[N, 4] x) => (float[N, 4] y, float[2] c) {
    y = Relu (x)
    c = Constant <value = float[2] {1, 2}> ()
}""", known="9"),
    "first dim fixed at 2": Seed(f"""g (float[2, 4] x) => (float[2, 3] y)
    <float[4, 3] w = {_values(12)}> {{
    y = MatMul (x, w)
}}""", known="new A"),
    "weight-only with an int8 override": Seed(f"""g (float[N, 4] x) => (float[N, 4] y)
    <float[4, 4] w = {_values(16)}> {{
    h = MatMul (x, w)
    y = Relu (h)
}}""", config="activations: {dtype: float}\noverrides:\n- match: {op_types: [MatMul]}\n  precision: int8\n",
        known="new B"),
    "weights-int4 with auto-precision": Seed(f"""g (float[N, 64] x) => (float[N, 8] y)
    <float[64, 8] w = {_values(512)}> {{
    y = MatMul (x, w)
}}""", flags=("--config", "weights-int4", "--auto-precision", "--max-trials", "3"), known="new B", opset=21),
    "a Gemm bias that is also a MatMul weight": Seed(f"""g (float[N, 4] x) => (float[N, 4] y, float[N] z)
    <float[4, 4] w = {_values(16)}, float[4] b = {{0.1, -0.2, 0.3, 0.1}}> {{
    y = Gemm (x, w, b)
    z = MatMul (y, b)
}}""", known="new E"),
    "an override range of denormals": Seed(f"""g (float[N, 2, 4, 4] x) => (float[N, 3, 1, 1] y)
    <float[3, 2, 3, 3] w = {_values(54)}> {{
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    y = GlobalAveragePool (c)
}}""", config="overrides:\n- match: {tensors: [c]}\n  range: [1.0e-313, 2.0e-313]\n"
        "verify: {rescue: false, max_latency_ratio: null}\n", known="new F"),
}
