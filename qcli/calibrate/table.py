"""The calibration table: per-tensor statistics plus the range each method chose, and the
calibration file that stores it (DESIGN.md §4).

The file is JSON, `"format": "qcli-calibration/1"`, carrying the model's fingerprint so that a
stale file is refused. Because the histograms are stored, `quantize --calib` can switch the
method, the percentile, or the activation dtype without reading the data again. Written
atomically and deterministically: the same model, data and settings give the same bytes.
SmoothQuant's per-channel statistics (`channels`, calibrate/channels.py) are kept in a section
of their own, present only when a config asked for them (older files read as before).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qcli.calibrate.channels import ChannelObserver
from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.pool import Job, solve, solve_many
from qcli.calibrate.ranges import Range, RangeSettings
from qcli.calibrate.solvers import clipped_fraction
from qcli.errors import CalibrationError, QcliError
from qcli.files import write_text_atomic
from qcli.textfile import read_text

FORMAT = "qcli-calibration/1"
METHODS = ("minmax", "percentile", "kl", "mse")


@dataclass
class CalibrationTable:
    """Statistics of every observed tensor of one model, and the ranges solved from them."""

    fingerprint: str
    observers: dict[str, TensorObserver]
    samples: int
    settings: RangeSettings
    ranges: dict[str, dict[str, Range]] = field(default_factory=dict)  # method -> tensor -> range
    warnings: list[str] = field(default_factory=list)
    channels: dict[str, ChannelObserver] = field(default_factory=dict)  # tensor -> per-channel statistics
    # tensor -> its range whatever the method: a tensor whose values a graph change set from
    # statistics (SmoothQuant's smoothed activations); never written to the file
    derived: dict[str, Range] = field(default_factory=dict)
    # bias correction's measured shifts (qcli.recovery.bias), in memory only: None = not measured
    bias_shifts: dict | None = None
    # weights.algorithm gptq: input tensor -> its Gram matrix (qcli.gptq.Gram), awq: its qcli.awq.Moments, in
    # memory only: None = not measured; and the weights rounded on them (a qcli.qweights.WeightMemo: this
    # table's, not shared with its folds')
    grams: dict | None = None
    rounded: Any = None
    rounding_sqnr: dict = field(default_factory=dict)  # weight -> its SQNRs (qcli.recovery.rounding.Sqnr)
    # the recovery steps that changed the float graph before it was observed (equalization):
    # a table is valid only for a config running the same ones (qcli.recovery.graph_steps)
    graph_steps: tuple[str, ...] = ()
    # k-fold verification: fold k's table, from every fold but k (in memory only; empty: no folds)
    folds: list[CalibrationTable] = field(default_factory=list)

    def covers(self, tensor: str) -> bool:
        """Whether the table gives `tensor` a range (observed or derived)."""
        return tensor in self.derived or tensor in self.observers

    def range(self, tensor: str, settings: RangeSettings | None = None) -> Range:
        """The range of `tensor` for `settings` (default: the table's own), solved on demand."""
        settings = settings or self.settings
        if tensor in self.derived:
            return self.derived[tensor]
        if settings == self.settings and tensor in self.ranges.get(settings.method, {}):
            return self.ranges[settings.method][tensor]
        observer = self.observers.get(tensor)
        if observer is None:
            raise CalibrationError(
                f"the calibration has no statistics for tensor {tensor!r}",
                hint="calibrate again with the same --config as quantize",
            )
        return solve(observer, settings, settings.method)

    def clipped(self, tensor: str, method: str | None = None) -> float:
        """Share of observed values outside the range `method` chose for `tensor`."""
        lo, hi = self.ranges[method or self.settings.method][tensor]
        observer = self.observers[tensor]
        return clipped_fraction(observer, lo, hi) if observer.count else 0.0

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "samples": self.samples,
            "settings": {
                "method": self.settings.method,
                "percentile": self.settings.percentile,
                "bins": self.settings.bins,
                "activations": {"dtype": self.settings.dtype, "symmetric": self.settings.symmetric},
            },
            "warnings": self.warnings,
            **({"graph_steps": list(self.graph_steps)} if self.graph_steps else {}),  # older files' bytes kept
            "tensors": {
                name: {
                    **obs.to_dict(),
                    "ranges": {m: list(self.ranges[m][name]) for m in self.ranges if name in self.ranges[m]},
                }
                for name, obs in self.observers.items()
            },
        }
        channels = {name: obs.to_dict() for name, obs in sorted(self.channels.items())}
        # One line per tensor: readable in a diff, and not 4096 lines of histogram counts each.
        tensors = doc.pop("tensors")
        head = json.dumps(doc, indent=1, allow_nan=False)[:-2]
        body = ",\n".join(
            f"  {json.dumps(name)}: {json.dumps(entry, allow_nan=False, separators=(',', ':'))}"
            for name, entry in tensors.items()
        )
        tail = "".join(
            f',\n  {json.dumps(name)}: {json.dumps(entry, allow_nan=False, separators=(",", ":"))}'
            for name, entry in channels.items()
        )
        extra = f',\n "channels": {{{tail[1:]}\n }}' if channels else ""
        return f'{head},\n "tensors": {{\n{body}\n }}{extra}\n}}\n'



def solved_methods(method: str) -> tuple[str, ...]:
    """What `qcli calibrate` solves now: minmax (the observed ends: free) and `method`.

    >>> solved_methods("mse"), solved_methods("minmax")
    (('minmax', 'mse'), ('minmax',))
    """
    return tuple(dict.fromkeys(("minmax", method)))


def build_table(
    observers: dict[str, TensorObserver],
    fingerprint: str,
    samples: int,
    settings: RangeSettings,
    methods: tuple[str, ...] = METHODS,
    aliases: dict[str, str] | None = None,
) -> CalibrationTable:
    """Solve each of `methods`' ranges for every tensor (`qcli calibrate`: `solved_methods`;
    `quantize --data` only its own; another is solved from the histograms when asked for,
    `CalibrationTable.range`) and note tensors that need a look. A tensor in
    `aliases` holds the same values as another (a Reshape's output): its ranges are copied."""
    return build_tables([(observers, samples, aliases or {})], fingerprint, settings, methods)[0]


def build_tables(
    parts: list[tuple[dict[str, TensorObserver], int, dict[str, str]]],
    fingerprint: str,
    settings: RangeSettings,
    methods: tuple[str, ...] = METHODS,
    helper: subprocess.Popen | None = None,
) -> list[CalibrationTable]:
    """`build_table` of each (observers, samples, aliases), their ranges solved together (a
    k-fold run's five tables: `solve_many` splits them over two processes; `helper`: one
    `pool.started` for them)."""
    jobs: list[Job] = [(obs, settings, method) for observers, _, aliases in parts for method in methods
                       for name, obs in observers.items() if name not in aliases]
    solved = iter(solve_many(jobs, helper=helper))
    tables = []
    for observers, samples, aliases in parts:
        table = CalibrationTable(fingerprint, observers, samples, settings)
        for method in methods:
            ranges = {name: next(solved) for name in observers if name not in aliases}
            table.ranges[method] = {name: ranges[_root(name, aliases)] for name in observers}
        table.warnings += _warnings(observers)
        tables.append(table)
    return tables


def _warnings(observers: dict[str, TensorObserver]) -> list[str]:
    """The tensors that need a look: NaN/Inf seen, constant, or nothing finite."""
    warnings = []
    for name, obs in observers.items():
        if obs.nonfinite_count:
            warnings.append(
                f"tensor {name!r}: {obs.nonfinite_count} NaN/Inf value(s) ignored; its range "
                "comes from the finite values"
            )
        if obs.count and obs.min == obs.max:
            warnings.append(f"tensor {name!r} is constant ({obs.min:g}) over the calibration data")
        elif obs.count == 0:
            warnings.append(f"tensor {name!r} had no finite values; its range is [0, 0]")
    return warnings


def _root(name: str, aliases: dict[str, str]) -> str:
    while name in aliases:
        name = aliases[name]
    return name


def save_table(table: CalibrationTable, path: str | os.PathLike) -> Path:
    """Write the calibration file atomically (temp file in the same folder, then rename)."""
    return write_text_atomic(path, table.to_json())


def load_table(path: str | os.PathLike, fingerprint: str | None = None) -> CalibrationTable:
    """Read a calibration file; refuse it if malformed or made for another model."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"calibration file not found: {path}")
    text = read_text(path, "calibration file", CalibrationError)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CalibrationError(
            f"{path} is not a readable calibration file: {exc}", hint="run qcli calibrate again"
        ) from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise CalibrationError(
            f"{path} is not a qcli calibration file (format {found!r}, expected {FORMAT!r})",
            hint="run qcli calibrate to make one",
        )
    if fingerprint is not None and doc.get("fingerprint") != fingerprint:
        raise CalibrationError(
            f"{path} was made for another model (fingerprint {doc.get('fingerprint')}, "
            f"this model is {fingerprint})",
            hint="calibrate this model again: qcli calibrate MODEL --data DIR",
        )
    try:
        s = doc["settings"]
        settings = RangeSettings(
            method=str(s["method"]),
            percentile=float(s["percentile"]),
            bins=int(s["bins"]),
            dtype=str(s["activations"]["dtype"]),
            symmetric=bool(s["activations"]["symmetric"]),
        )
        observers = {}
        ranges: dict[str, dict[str, Range]] = {}
        for name, entry in doc["tensors"].items():
            observers[name] = TensorObserver.from_dict(entry, name=name)
            for method, (lo, hi) in entry.get("ranges", {}).items():
                if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                    raise ValueError(f"bad {method} range for {name!r}")
                ranges.setdefault(method, {})[name] = (float(lo), float(hi))
        channels = {name: ChannelObserver.from_dict(entry) for name, entry in doc.get("channels", {}).items()}
        table = CalibrationTable(
            str(doc["fingerprint"]), observers, int(doc["samples"]), settings, ranges, list(doc.get("warnings", [])),
            channels, graph_steps=tuple(str(s) for s in doc.get("graph_steps", [])),
        )
    except QcliError as exc:
        raise CalibrationError(f"{path}: {exc.message}", hint="run qcli calibrate again") from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CalibrationError(
            f"{path} is a damaged calibration file ({type(exc).__name__}: {exc})",
            hint="run qcli calibrate again",
        ) from exc
    if settings.method not in METHODS:
        raise CalibrationError(f"{path}: unknown method {settings.method!r}")
    return table
