"""What a verdict on n samples can show (qcli.analyze.confidence): the bounds against a
simulation with a known change rate, the samples a floor needs, `verify.confidence` setting the
intervals, and the statement in quantize's --json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_verify import mlp, mlp_data

from conftest import save
from qcli.analyze.confidence import Shows, samples_needed, unseen, upper_rate, z_of
from qcli.analyze.kinds import Kind, OutputKind
from qcli.analyze.metrics import FidelityAccumulator
from qcli.config import Config

RUNS = 20000


@pytest.mark.parametrize(("rate", "n"), [(0.02, 32), (0.01, 64), (0.05, 16)])
def test_a_known_change_rate_goes_unseen_as_often_as_stated(rate: float, n: int) -> None:
    """"A 2% change rate goes unseen ~52 times in 100 with 32 samples": simulated."""
    changes = np.random.default_rng(7).binomial(n, rate, RUNS)
    assert np.mean(changes == 0) == pytest.approx(unseen(rate, n), abs=0.015)


@pytest.mark.parametrize("confidence", [0.9, 0.975])
@pytest.mark.parametrize(("rate", "n"), [(0.02, 32), (0.1, 40), (0.01, 200)])
def test_the_ruled_out_rate_covers_the_true_one_as_often_as_promised(confidence: float, rate: float, n: int) -> None:
    changes = np.random.default_rng(11).binomial(n, rate, RUNS)
    bounds = {k: upper_rate(int(k), n, confidence) for k in np.unique(changes)}
    covered = np.mean([bounds[k] >= rate for k in changes])
    assert covered >= confidence - 0.005  # Clopper-Pearson: at least as often (conservative)


def test_the_bound_and_the_samples_needed_at_their_edges() -> None:
    assert upper_rate(0, 32, 0.975) == pytest.approx(1 - 0.025 ** (1 / 32))
    assert upper_rate(32, 32, 0.9) == 1.0 and upper_rate(0, 0, 0.9) == 1.0
    assert upper_rate(1, 100, 0.975) == pytest.approx(0.0545, abs=5e-4)  # the beta quantile's value
    n = samples_needed(0.99, 0.975)
    assert unseen(0.01, n) <= 0.025 < unseen(0.01, n - 1)
    assert samples_needed(0.99, 0.9) == 230


def test_the_statement_says_what_the_samples_cannot_show() -> None:
    assert Shows(400, 0, 0.99, 0.975).words() == (
        "0 of 400 samples changed: 97.5% sure at most 0.918% of unseen samples change; a 1% change rate goes "
        "unseen 2 times in 100 on 400 samples")  # enough samples: no call for more
    doc = Shows(32, 1, 0.99, 0.9).to_dict()
    assert doc["samples_needed"] == 230 and doc["words"].endswith("the floor 0.99 needs 230 samples without a change "
                                                                 "(--eval-data DIR supplies them)")


def test_the_confidence_sets_the_intervals() -> None:
    wide, narrow = (FidelityAccumulator(OutputKind(Kind.TOP1, ""), z=z_of(c)) for c in (0.975, 0.9))
    scores = np.eye(4, dtype=np.float32)[np.arange(32) % 4]
    for acc in (wide, narrow):
        acc.update(scores, scores, 32)
    assert wide.agreement_interval is not None and narrow.agreement_interval is not None
    assert narrow.agreement_interval[0] > wide.agreement_interval[0]
    assert Config().verify.confidence == 0.975
    with pytest.raises(Exception, match="greater than 0.5"):
        Config.model_validate({"verify": {"confidence": 0.3}})


def test_quantize_json_states_what_its_samples_show(cli, tmp_path: Path) -> None:
    model, data = save(mlp(False), tmp_path / "mlp.onnx"), mlp_data(tmp_path / "data", 160, False)
    result = cli("quantize", str(model), "--data", str(data), "-o", str(tmp_path / "q.onnx"), "--json")
    doc = json.loads(result.stdout)["verification"]
    check = next(c for c in doc["checks"] if c["name"] == "top-1 agreement")
    assert doc["confidence"] == 0.975 and check["shows"]["samples"] == check["samples"]
    assert check["shows"]["words"].startswith(f"{check['shows']['changed']} of {check['samples']} samples changed")
