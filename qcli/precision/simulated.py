"""The search's quick trials on the simulation (qcli.simulation), when `Trials.simulate` is
on: one session built on the all-int8 plan for the whole search; a candidate it emulates is its
plan per fold (the config with the choices, each fold's ranges) turned into that session's
inputs. No model is built and no session loaded for it. Confirmations on all samples, and the
latency, stay on real models: the verdict is the real model's.

Off by default, by measurement (benchmarks/simulation.py, docs/benchmarks.md): on onnxruntime's
CPU provider a trial on the simulation costs more than building the candidate, loading it and
running its fused int8 kernels on the quick probe's 8 samples on all but the smallest exported
models (the simulation computes in float, with four elementwise passes per quantized reader and
weights that are not constants), and on models whose HardSwish qcli writes as integer gates
(PP-LCNet) it ranks candidates apart from their real models.

The simulation is used only where it computes what the build writes: weights rounded to
nearest (`weights.algorithm: rtn`, no seq_mse or adaround), no SmoothQuant or bias correction
(they change the float graph or its biases per build), and a plan with quantized activations.
A candidate it does not emulate (`Simulation.feeds` None) is measured on its real model, as
before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qcli.analyze.probe import Probe, parallel_runs
from qcli.calibrate.table import CalibrationTable
from qcli.config import Config
from qcli.graph import GraphIndex
from qcli.phases import phase
from qcli.plan import Plan
from qcli.precision.units import Choices, Unit, alone, promoted_config
from qcli.prepare import PrepareResult
from qcli.runtime import make_session
from qcli.simulation import Simulated, Simulation

if TYPE_CHECKING:
    from qcli.quantize import QuantizeResult


def emulable(config: Config) -> bool:
    """Whether every build under `config` is a plan materialized on the prepared graph, its
    weights rounded to nearest (module docstring)."""
    steps = config.recovery
    return (config.weights.algorithm == "rtn" and steps.smoothquant is None and steps.bias_correction is None
            and not steps.rounds)


@dataclass(frozen=True)
class Simulator:
    simulation: Simulation
    session: Any
    prepared: PrepareResult
    config: Config
    table: CalibrationTable
    units: Sequence[Unit]
    index: GraphIndex

    @classmethod
    def of(cls, prepared: PrepareResult, config: Config, table: CalibrationTable, units: Sequence[Unit],
           int8: QuantizeResult, threads: int | None) -> Simulator | None:
        """The simulator of a search whose all-int8 build is `int8`; None where the simulation
        would not compute what the builds write (module docstring)."""
        if not emulable(config) or (int8.planned is not None and int8.planned is not prepared.model):
            return None
        if not int8.plan.groups:  # nothing quantized at run time: nothing the switches save
            return None
        with phase("simulation"):
            simulation = Simulation.of(prepared.model, int8.plan, prepared.quantized)
            session = make_session(simulation.model, 1 if parallel_runs(threads) > 1 else threads, pass_only=True)
        return cls(simulation, session, prepared, config, table, units, GraphIndex.of(prepared.model))

    def candidate(self, choices: Choices | str, probe: Probe) -> tuple[Simulated, int, bytes] | None:
        """The candidate (choices, or the name of the unit alone) as `probe` runs it on the
        simulation, the units it leaves unquantized, and a digest of its inputs; None when the
        simulation does not emulate it."""
        feeds = {}
        first: Plan | None = None
        for k in probe.fold_indices:
            plan = self._plan(choices, self.table.folds[k] if self.table.folds else self.table)
            first = first or plan
            fed = self.simulation.feeds(plan)
            if fed is None:
                return None
            feeds[k] = fed
        assert first is not None  # a probe has one fold at least
        kept = {d.name for d in first.nodes if d.quantized and not d.reason}
        demoted = sum(1 for u in self.units if u.node not in kept)
        h = hashlib.sha256(b"simulated")
        for k in sorted(feeds):
            for name in sorted(feeds[k]):
                h.update(name.encode() + feeds[k][name].tobytes())
        return Simulated(self.session, feeds.__getitem__), demoted, h.digest()

    def _plan(self, choices: Choices | str, table: CalibrationTable) -> Plan:
        from qcli.quantize import plan_for

        work = self.prepared.model
        if isinstance(choices, str):
            unit = next(u for u in self.units if u.node == choices)
            return plan_for(work, self.config, table, index=self.index,
                            restrict=lambda plan, graph: alone(plan, graph, unit))
        return plan_for(work, promoted_config(self.config, choices, list(self.units)), table, index=self.index)
