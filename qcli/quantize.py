"""`quantize`: float model + config + calibration table -> QDQ model, with a summary.

The stages run one way (DESIGN.md §5): prepare -> plan -> ranges -> materialize. The output
carries metadata (`qcli.version`, `qcli.config`, `qcli.calibration`) saying how it was made.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import onnx

from qcli import __version__
from qcli.calibrate.table import CalibrationTable, RangeSettings
from qcli.config import Config
from qcli.errors import ConfigError
from qcli.model import opset_version
from qcli.plan import Plan, assign_ranges, make_plan
from qcli.prepare import prepare
from qcli.qdq import materialize


@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    plan: Plan
    notes: list[str] = field(default_factory=list)  # what prepare changed, and warnings


def quantize(
    model: onnx.ModelProto, config: Config, table: CalibrationTable, *, force: bool = False
) -> QuantizeResult:
    """Quantize `model` with the ranges of `table` (solved for `config`'s method and dtype)."""
    prepared = prepare(model, force=force)
    plan = make_plan(prepared.model, config)
    opset = opset_version(prepared.model)
    blocked = [w.name for w in plan.weights.values() if w.scheme.granularity == "per_block"]
    if blocked and opset < 21:
        raise ConfigError(
            f"per_block weights need opset 21 (DequantizeLinear's block_size); the model is at opset {opset}",
            hint="re-export the model at opset 21, or use granularity: per_channel",
        )
    settings = RangeSettings.of(config)
    assign_ranges(plan, prepared.model, table, settings)
    out = materialize(prepared.model, plan)
    for key, value in (
        ("qcli.version", __version__),
        ("qcli.config", json.dumps(config.model_dump(mode="json", exclude={"data"}), separators=(",", ":"))),
        ("qcli.calibration", json.dumps({"method": settings.method, "samples": table.samples, "fingerprint": table.fingerprint})),
    ):
        entry = out.metadata_props.add()
        entry.key, entry.value = key, value
    notes = list(prepared.notes) + plan.notes
    notes += [f"config rule {where} matched nothing" for where in plan.unmatched]
    return QuantizeResult(out, plan, notes)


def summary(result: QuantizeResult) -> dict:
    """Counts by op type of quantized and float nodes, with the reasons nodes stayed float."""
    quantized = Counter(d.op_type for d in result.plan.nodes if d.quantized and not d.reason)
    folded = Counter(d.op_type for d in result.plan.nodes if d.quantized and d.reason)
    floats: Counter[tuple[str, str]] = Counter(
        (d.op_type, d.reason) for d in result.plan.nodes if not d.quantized
    )
    return {
        "quantized": dict(sorted(quantized.items(), key=lambda kv: (-kv[1], kv[0]))),
        "float": [
            {"op_type": op, "reason": reason, "count": n}
            for (op, reason), n in sorted(floats.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "folded": dict(sorted(folded.items())),
        "quantized_tensors": len(result.plan.activations),
        "groups": len(result.plan.groups),
        "weight_tensors": len(result.plan.weights),
        "notes": result.notes,
    }
