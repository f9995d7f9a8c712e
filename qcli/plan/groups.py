"""The shared-scale groups: what the overrides ask of each tensor, the groups with their
schemes and known ranges, and (`assign_ranges`) their calibrated ranges and qparams."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx

from qcli.calibrate.ranges import RangeSettings
from qcli.calibrate.table import CalibrationTable
from qcli.config import NO_QDQ
from qcli.errors import CalibrationError
from qcli.graph import GraphIndex
from qcli.lazy import tensor_array
from qcli.plan.context import Context
from qcli.plan.result import Group, Plan
from qcli.plan.tensors import Shared
from qcli.plan.weights import activation_scheme
from qcli.rules import rule_for
from qcli.scheme import PerTensor, QuantScheme, choose_qparams, quant_dtype


@dataclass
class Requests:
    """What the overrides ask for, per tensor (later rules overwrite)."""

    activation: dict[str, tuple[QuantScheme | None, int]] = field(default_factory=dict)  # scheme, rule index
    settings: dict[str, dict] = field(default_factory=dict)  # tensor -> calibration override fields
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)


def requests_of(ctx: Context, shared: Shared) -> Requests:
    """Each override's activation scheme, calibration settings and range, for the tensors it
    names and the quantized tensors of the nodes it selects."""
    requests = Requests()
    for k, o, sel in ctx.selections.overrides:
        if o.precision in NO_QDQ:  # dynamic nodes have no Q/DQ (plan/dynamic.py), float16 ones none
            continue
        act = None
        if o.activations is not None:
            act = activation_scheme(o.activations)
        elif o.precision is not None:
            act = QuantScheme(quant_dtype(o.precision), PerTensor(), ctx.config.activations.symmetric)
        has_act = o.activations is not None or o.precision is not None
        targets = set(sel.tensors)
        for i in sel.nodes:
            targets |= shared.quantized.touched.get(i, frozenset())
        for t in targets:
            if has_act:
                requests.activation[t] = (act, k)
            if o.calibration is not None:
                requests.settings.setdefault(t, {}).update(o.calibration.model_dump(exclude_none=True))
            if o.range is not None:
                requests.ranges[t] = o.range
    return requests


def groups_of(ctx: Context, shared: Shared, requests: Requests) -> tuple[list[Group], list[str]]:
    """The groups in graph order of their first tensor, and a note for each group whose members
    were asked for different dtypes. A group's dtype is the widest any override asked for (16
    over 8 bits; on a tie, the later rule); weight-only quantization leaves no group."""
    index = ctx.index
    order = list(index.inputs) + [o for n in index.graph.node for o in n.output]
    position = {name: k for k, name in enumerate(order)}
    constants = {t for i in shared.active for t in ctx.activations(i) if t in index.initializers}
    members: dict[str, list[str]] = {}
    for t in sorted(shared.quantized.tensors | constants, key=lambda t: (position.get(t, -1), t)):
        members.setdefault(shared.groups.find(t), []).append(t)
    default = activation_scheme(ctx.config.activations)
    groups, notes = [], []
    for tensors in members.values():
        scheme = default
        asked = [(requests.activation[t], t) for t in tensors if t in requests.activation]
        if asked:
            (scheme, _), _ = max(asked, key=lambda a: (_bits(a[0][0]), a[0][1]))
            if len({a[0][0] for a in asked}) > 1 or (len(asked) < len(tensors) and scheme != default):
                notes.append(
                    f"tensors {', '.join(tensors)} share one scale: all get "
                    f"{scheme.dtype.name if scheme else 'float'} (the widest any override asked for)"
                )
        if scheme is None:  # weight-only: these activations keep no Q/DQ
            continue
        constant = next((t for t in tensors if t in index.initializers), None)
        group = Group(tensors, scheme, constant, known_range(tensors, index, shared.active))
        for t in tensors:
            if t in requests.ranges:
                group.fixed_range = requests.ranges[t]
            if t in requests.settings:
                group.settings = requests.settings[t]  # fields; resolved in assign_ranges
        groups.append(group)
    return groups, notes


def _bits(scheme: QuantScheme | None) -> int:
    return 32 if scheme is None else scheme.dtype.bits


def known_range(tensors: list[str], index: GraphIndex, moving: frozenset[int]) -> tuple[float, float] | None:
    """The range a group holds without calibration: when every member that does not come out
    of the group's own data movement (`moving`: Reshape, Concat, ... whose values are their
    inputs') is the output of an op with a known range (Sigmoid, Softmax: [0, 1]), the union
    of those ranges; else None (calibrate). One member of known range does not fix the group:
    a detector's head concatenates raw box offsets with Sigmoid scores, and [0, 1] for all of
    them would clip every box offset."""
    ranges = []
    for t in tensors:
        j = index.producer(t)
        if j in moving:
            continue
        rule = rule_for(index.graph.node[j]) if j is not None else None
        if rule is None or rule.output_range is None:
            return None
        ranges.append(rule.output_range)
    if not ranges:
        return None
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def assign_ranges(plan: Plan, model: onnx.ModelProto, table: CalibrationTable, settings: RangeSettings) -> Plan:
    """Give every group its range (union of its members' calibrated ranges) and qparams."""
    inits = {t.name: t for t in model.graph.initializer}
    for group in plan.groups:
        if group.fixed_range is not None:
            lo, hi = group.fixed_range
        elif group.constant is not None:
            values = tensor_array(inits[group.constant])
            lo, hi = float(values.min()), float(values.max())
        else:
            mine = replace(
                settings,
                dtype=group.scheme.dtype.name,
                symmetric=group.scheme.symmetric,
                **(group.settings or {}),
            )
            ranges = [table.range(t, mine) for t in group.tensors if table.covers(t)]
            if not ranges:
                raise CalibrationError(
                    f"the calibration has no statistics for tensor {group.tensors[0]!r}",
                    hint="calibrate with the same model and --config as quantize (or use --data)",
                )
            lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        group.range = (lo, hi)
        group.scale, group.zero_point = choose_qparams(lo, hi, group.scheme.dtype, group.scheme.symmetric)
    return plan
