"""A model's latency on a target, predicted from its profile: pure arithmetic on the kernels
onnxruntime runs (qcli.target.executed), so the same model, feeds and profile always give the
same figure. Decisions read these; a measured latency is only ever reported beside them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx

from qcli.target.executed import run
from qcli.target.kernels import Kernel
from qcli.target.profile import Profile


@dataclass(frozen=True)
class Prediction:
    """Predicted µs of one run, each node's share (its kernel calls summed), and the bytes of
    the weights onnxruntime holds to run it (not priced: reported beside)."""

    us: float
    nodes: dict[str, float]
    weight_bytes: int = 0

    @property
    def ms(self) -> float:
        return self.us / 1e3


def priced(kernels: list[Kernel], profile: Profile) -> Prediction:
    """The prediction for these kernel calls under `profile`.

    >>> from qcli.target.profile import Cost
    >>> p = Profile(name="t", kind="rules", run_us=10, node_us=1, kernels={
    ...     "memory": Cost(terms={"moved": 0.01}), "conv.f32": Cost(terms={"call": 2, "mac": 0.001})})
    >>> ks = [Kernel("a", "Relu", "memory", moved=100), Kernel("b", "Conv", "conv.f32", work=1000),
    ...       Kernel("a", "Relu", "memory", moved=100)]
    >>> priced(ks, p)
    Prediction(us=18.0, nodes={'a': 4.0, 'b': 4.0}, weight_bytes=0)
    """
    nodes: dict[str, float] = {}
    for k in kernels:
        nodes[k.node] = nodes.get(k.node, 0.0) + profile.price(k)
    return Prediction(round(profile.run_cost + sum(nodes.values()), 6), {n: round(us, 6) for n, us in nodes.items()})


def predict(model: onnx.ModelProto, feeds: dict[str, np.ndarray], profile: Profile,
            threads: int | None = None) -> Prediction:
    """`model`'s predicted latency on `feeds` (one run) under `profile`."""
    ran = run(model, feeds, threads if threads is not None else profile.threads)
    return replace(priced(ran.kernels, profile), weight_bytes=ran.weight_bytes)
