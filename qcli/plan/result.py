"""What a plan is made of: groups of activations sharing one scale, weights, biases, and one
decision per node with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qcli.scheme import QuantScheme


@dataclass
class Group:
    """Activations that share one scale and zero point."""

    tensors: list[str]
    scheme: QuantScheme
    constant: str | None = None  # an initializer member (embedding table) fixes the params
    fixed_range: tuple[float, float] | None = None  # known without calibration, or set by YAML
    settings: dict | None = None  # per-group calibration override fields (method, percentile)
    range: tuple[float, float] | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None


@dataclass(frozen=True)
class WeightPlan:
    name: str  # initializer
    scheme: QuantScheme
    axis: int | None  # per-channel (or per-block) axis, None for per-tensor


@dataclass(frozen=True)
class BiasPlan:
    """An int32 copy of a bias on its nodes' accumulator grid: scale = factor x input scale x the
    weight's scales, repeated `repeats` times along the output channels (rules.bias_scale_factor,
    rules.channel_repeats). A bias that nodes of different grids share has one copy per grid,
    each read by its `nodes`."""

    name: str  # initializer
    input: str  # the activation whose scale multiplies the weight's
    weight: str
    factor: float = 1.0
    repeats: int = 1
    nodes: tuple[int, ...] = ()  # the nodes that read this copy as their bias


@dataclass(frozen=True)
class DynamicNode:
    """A node quantized dynamically: its activations at run time, its weights as planned.
    `form`: what qcli/dynamic.py emits for it (rules.DynamicRule)."""

    index: int
    form: str
    weights: tuple[WeightPlan, ...]


@dataclass(frozen=True)
class NodeDecision:
    index: int
    name: str
    op_type: str
    quantized: bool
    reason: str = ""  # why it stays float (or "folded into <producer>")
    folded_into: str | None = None  # a folded Relu/Clip: its producer's display name
    dynamic: bool = False  # quantized dynamically (plan.dynamic)


@dataclass
class Plan:
    groups: list[Group] = field(default_factory=list)
    weights: dict[str, WeightPlan] = field(default_factory=dict)
    biases: dict[str, BiasPlan] = field(default_factory=dict)
    nodes: list[NodeDecision] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # config rules that matched nothing
    keep_float: set[int] = field(default_factory=set)  # nodes excluded by config: read float inputs
    notes: list[str] = field(default_factory=list)  # conflicts resolved, and the like
    dynamic: dict[int, DynamicNode] = field(default_factory=dict)  # node -> its dynamic form
    half: list[int] = field(default_factory=list)  # nodes run in float16/bfloat16 (qcli/half.py)
    half_tensors: list[str] = field(default_factory=list)  # their float activations: observed for range
    control_flow: dict[int, list[str]] = field(default_factory=dict)  # node -> weights only its bodies read

    @property
    def quantizes(self) -> bool:
        """Whether the model built from it computes anything in integers (or reads integer weights)."""
        return bool(self.groups or self.weights or self.dynamic)

    @property
    def activations(self) -> list[str]:
        """Every tensor that gets a Q/DQ pair, in group order."""
        return [t for g in self.groups for t in g.tensors if t != g.constant]

    @property
    def at_run_time(self) -> bool:
        """Whether any activation is quantized at run time (a dynamic node other than an int8
        embedding table's Gather, which quantizes none)."""
        return any(d.form != "gather" for d in self.dynamic.values())

    @property
    def calibrated_tensors(self) -> list[str]:
        """Tensors whose range must come from calibration."""
        return [t for g in self.groups if g.constant is None and g.fixed_range is None for t in g.tensors]

    @property
    def observed_tensors(self) -> list[str]:
        """What calibration observes: the calibrated tensors, then the half nodes' activations
        (whose ranges decide which of them stay float32; without data they go unchecked)."""
        calibrated = self.calibrated_tensors
        return calibrated + sorted(set(self.half_tensors) - set(calibrated))
