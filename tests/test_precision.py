"""Automatic mixed precision: the search on synthetic sensitivity tables (no inference), the
config it writes, and the attribution of profiled kernel times to units."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import parse_model
from qcli.analyze.fidelity import Fidelity, OutputFidelity
from qcli.config import Config, parse_config
from qcli.plan import make_plan
from qcli.precision import Goal, StepKind, Unit, attribute, find_units, promoted_config, search
from qcli.quantize import prepare_for


def units(*names: str) -> list[Unit]:
    return [Unit(n, "MatMul", i, frozenset({f"{n}_in", f"{n}_out"})) for i, n in enumerate(names)]


class FakeTrials:
    """A model whose output error is the sum of its int8 units' errors (1 - cosine) and whose
    latency ratio is a base plus each promoted unit's cost."""

    def __init__(self, errors: dict[str, float], costs: dict[str, float] | None = None, base_ratio: float = 0.5,
                 max_trials: int = 1000, interaction: tuple[str, str, float] | None = None):
        self.errors, self.costs, self.base_ratio = errors, costs or {}, base_ratio
        self.max_trials, self.count, self.stopped = max_trials, 0, None
        self.interaction = interaction  # (a, b, extra error while both are int8)
        self.seen: list[frozenset] = []

    def _error(self, choices: dict[str, str]) -> float:
        error = sum(e for n, e in self.errors.items() if n not in choices)
        if self.interaction:
            a, b, extra = self.interaction
            if a not in choices and b not in choices:
                error += extra
        return error

    def fidelity(self, choices: dict[str, str], quick: bool = False, stop_below: float | None = None) -> Fidelity:
        key = frozenset(choices.items())
        if key not in self.seen:
            self.seen.append(key)
            self.count += 1
        error = self._error(choices)
        return Fidelity((OutputFidelity("y", False, None, 1.0 - error, None),), noise=error)

    def demoted(self, choices: dict[str, str]) -> int:
        return len(choices)

    def fidelity_many(self, candidates: list[dict[str, str]], quick: bool = False) -> list[Fidelity]:
        return [self.fidelity(c, quick) for c in candidates]

    def affordable(self, n: int) -> bool:
        return n <= (self.max_trials - self.count) / 2


    def latency(self, choices: dict[str, str]) -> float:
        return self.base_ratio + sum(self.costs.get(n, 0.0) for n in choices)

    def exhausted(self) -> bool:
        if self.count >= self.max_trials:
            self.stopped = f"max trials ({self.max_trials}) reached"
        return self.stopped is not None


def float_costs(us: list[Unit], values: dict[str, float] | None = None) -> dict[str, tuple[str, float]]:
    return {u.node: ("float", (values or {}).get(u.node, 10.0)) for u in us}


def test_nothing_is_promoted_when_int8_meets_the_budget() -> None:
    us = units("a", "b", "c")
    trials = FakeTrials({"a": 0.001, "b": 0.002, "c": 0.001})
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us))
    assert found.met and found.choices == {}
    assert [s.action for s in found.steps] == ["all int8"]
    assert trials.count == 1


def test_one_sensitive_unit_is_the_only_promotion() -> None:
    names = [f"u{i}" for i in range(12)]
    errors = {n: 0.0005 for n in names} | {"u7": 0.2}  # all int8: drop 0.2055
    us = units(*names)
    trials = FakeTrials(errors)
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us))
    assert found.met
    assert found.choices == {"u7": "float"}
    assert max(found.sensitivity, key=found.sensitivity.get) == "u7"
    # every unit measured once (sensitivity) + the base + a short prefix search: bounded
    assert trials.count <= 1 + len(names) + 4


def test_prefix_then_prune_keeps_only_what_the_budget_needs() -> None:
    # Three units matter; the budget needs two of them (whichever), the third is noise-level.
    errors = {"a": 0.05, "b": 0.04, "c": 0.03, "d": 0.001, "e": 0.001}
    us = units(*errors)
    found = search(us, FakeTrials(errors), Goal(max_drop=0.035), float_costs(us))
    assert found.met
    assert found.choices == {"a": "float", "b": "float"}  # 0.032 left: within 0.035


def test_prune_drops_a_promotion_made_redundant_by_the_others() -> None:
    # a and b each look sensitive alone because of their interaction; promoting either removes it.
    errors = {"a": 0.01, "b": 0.01, "c": 0.0}
    us = units(*errors)
    found = search(us, FakeTrials(errors, interaction=("a", "b", 0.1)), Goal(max_drop=0.015), float_costs(us))
    assert found.met
    assert len(found.choices) == 1  # one of a, b is enough once the interaction is gone


class MaskingTrials(FakeTrials):
    """Unit `a` int8 wrecks the output (error 1.0) and hides every other unit's error."""

    def _error(self, choices: dict[str, str]) -> float:
        return 1.0 if "a" not in choices else super()._error(choices)


def test_an_error_hidden_behind_a_worse_one_is_still_found() -> None:
    """c's error shows only once a is promoted: the prefix search takes it along (and b, d),
    the prune drops what the goal does not need."""
    errors = {"a": 0.0, "b": 0.0001, "c": 0.02, "d": 0.0001}
    us = units(*errors)
    found = search(us, MaskingTrials(errors), Goal(max_drop=0.01), float_costs(us))
    assert found.met
    assert found.choices == {"a": "float", "c": "float"}
    assert [s.action for s in found.steps if s.action == "back to int8" and s.kept]  # pruned
    # a few promoted units (<= PRUNE_ONE_BY_ONE) are tried back one at a time
    assert all(len(s.changed) == 1 for s in found.steps if s.action == "back to int8")


def test_a_hidden_error_among_many_units_is_pruned_in_halves() -> None:
    """200 units; u0 hides the last unit's error, so the ranking puts it last and the prefix
    takes all 200 along. One at a time the prune would need 200 trials; in halves it isolates
    the two needed units in a few dozen."""
    names = [f"u{i}" for i in range(200)]
    errors = {n: 0.00001 for n in names} | {"u0": 0.5, "u199": 0.3}

    class Hidden(FakeTrials):
        def _error(self, choices: dict[str, str]) -> float:
            return 1.0 if "u0" not in choices else super()._error(choices)

    us = units(*names)
    trials = Hidden(errors, max_trials=120)
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us))
    assert found.met and found.stopped is None
    assert found.choices == {"u0": "float", "u199": "float"}
    prune = [s for s in found.steps if s.action == "back to int8"]
    assert any(s.kept and len(s.changed) >= 25 for s in prune)  # whole chunks went back
    assert trials.count < 80, trials.count


def test_impossible_budget_returns_the_best_reachable_and_says_so() -> None:
    errors = {"a": 0.05, "b": 0.05}
    us = units(*errors)
    # only "a" can be promoted (b has no candidate): the drop cannot go below 0.05
    found = search(us, FakeTrials(errors), Goal(max_drop=0.01), {"a": ("float", 1.0)})
    assert not found.met
    assert found.choices == {"a": "float"}
    assert found.fidelity.drop == pytest.approx(0.05)


def test_a_small_budget_measures_blocks_of_units_and_stops_safely() -> None:
    """40 units, one of them sensitive, and 30 trials: one trial per unit does not fit, so
    blocks of units are measured and the sensitive block split until the unit shows."""
    names = [f"u{i}" for i in range(40)]
    errors = {n: 0.0002 for n in names} | {"u29": 0.3}
    us = units(*names)
    trials = FakeTrials(errors, max_trials=30)
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us))
    assert found.steps[1].action == "sensitivity by blocks (one trial per unit does not fit the trial budget)"
    assert found.met and found.choices == {"u29": "float"}
    assert trials.count <= 30


def test_when_the_goal_needs_most_units_the_blocks_are_not_refined() -> None:
    """40 equally sensitive units of which 10 may stay int8: the most sensitive blocks holding
    half of the units, promoted, miss the goal, so finer blocks could not shorten the prefix
    and are not measured, and the prefix search starts past those 20; their trials go to the
    prune: the fewest promotions (30) within 30 trials, where refining the blocks left 32."""
    names = [f"u{i}" for i in range(40)]
    us = units(*names)
    trials = FakeTrials({n: 0.001 for n in names}, max_trials=30)
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us))
    assert found.steps[1].action.endswith("the goal needs more than half of the units (the most sensitive blocks "
                                          "miss it): no finer blocks")
    assert [s.action for s in found.steps[2:4]] == ["promote top 40", "promote top 30"]
    assert found.met and len(found.choices) == 30 and trials.count <= 30


def test_when_the_goal_needs_most_units_the_missed_half_is_tried_beside_the_dynamic_forms() -> None:
    """DNSMOS's shape: one unit int8 (its STFT) hides every other error, so the dynamic forms,
    judged together against all int8, seem to gain nothing; the MatMuls' static int8 needs
    most units promoted. The half that missed the goal with every other unit dynamic holds; its
    units are pruned back to int8 on all samples (least sensitive first) while the goal holds,
    and the caller's model is asked about the result, not about everything promoted."""
    us = [Unit("a", "Conv", 0, frozenset({"x", "s"}), weighted=True)] + [
        replace(u, index=u.index + 1, weighted=True, dynamic=True) for u in units("m1", "m2", "m3", "m4")]
    trials = MaskingTrials({"m1": 0.01, "m2": 0.011, "m3": 0.012, "m4": 0.013}, max_trials=14)  # `a` int8: error 1
    # (the budget ranks by blocks: one trial per unit and dynamic form does not fit)
    asked: list = []
    found = search(us, trials, Goal(max_drop=0.015), float_costs(us), candidates=["dynamic", "float"],
                   dynamic_first=True, instead=lambda choices, settled: asked.append(dict(choices)))
    actions = [s.action for s in found.steps]
    assert actions[1] == "every unit with a dynamic form dynamic" and not found.steps[1].kept
    beside = actions.index("the half that missed, every other unit with a dynamic form dynamic, on all samples")
    assert found.steps[beside].kept
    # the half: a, m1, m2 (a masks the others' gains: graph order); m2 goes back to int8 (0.011),
    # m1 and a cannot
    assert found.met and found.choices == {"a": "float", "m1": "float", "m3": "dynamic", "m4": "dynamic"}
    assert [(s.changed, s.kept) for s in found.steps[beside + 1:]] == [(["m2"], True), (["m1"], False),
                                                                        (["a"], False)]
    assert asked == [found.choices]  # about the pruned model, not about everything promoted


def test_when_the_goal_needs_most_units_the_callers_better_model_is_asked_before_the_prefix() -> None:
    """The rescue's `instead` (its weight-only model) is asked about everything promoted as
    soon as the blocks show that the goal needs most units, before the prefix search: the
    prefix would be mostly float anyway. Taken, the search ends there, with its model's
    fidelity; refused, the search goes on as before, asking again at the prefix it confirms,
    before and after (the rescue's `instead` tries its model once and refuses after)."""
    names = [f"u{i}" for i in range(40)]
    us = units(*names)
    asked: list = []  # lengths, then (length, settled)
    better = Fidelity((OutputFidelity("y", False, None, 1.0, None),), noise=0.0)

    def instead(choices: dict, settled: bool) -> Fidelity:
        asked.append(len(choices))
        return better

    trials = FakeTrials({n: 0.001 for n in names}, max_trials=30)
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us), instead=instead)
    assert asked == [40] and len(found.choices) == 40 and found.fidelity is better  # settled: everything
    assert not any(s.action.startswith("promote top") for s in found.steps)
    asked.clear()
    refused = search(us, FakeTrials({n: 0.001 for n in names}, max_trials=30), Goal(max_drop=0.01),
                     float_costs(us), instead=lambda choices, settled: asked.append((len(choices), settled)))
    assert asked == [(40, True), (30, False), (30, True)] and refused.met and len(refused.choices) == 30


class NoisyTrials(FakeTrials):
    """FakeTrials with each unit's own noise (`Trials.unit_noise`): its error, as if one run
    showed exactly that."""

    def unit_noise(self, choices: dict[str, str], nodes: list[str]) -> dict[str, float]:
        return {n: self.errors[n] for n in nodes if n not in choices}


def test_the_noisiest_half_asks_whether_the_goal_needs_most_units_before_any_block() -> None:
    """40 equally sensitive units of which 10 may stay int8: the noisiest half promoted misses
    the goal (one trial), so no block is measured and the rescue's model is asked about
    everything at once: 2 trials in all, against the blocks' 10."""
    names = [f"u{i}" for i in range(40)]
    us = units(*names)
    better = Fidelity((OutputFidelity("y", False, None, 1.0, None),), noise=0.0)
    asked: list[int] = []
    counts = []
    for trials in (FakeTrials({n: 0.001 for n in names}, max_trials=30),
                   NoisyTrials({n: 0.001 for n in names}, max_trials=30)):
        found = search(us, trials, Goal(max_drop=0.01), float_costs(us),
                       instead=lambda c, settled: asked.append(len(c)) or better)
        assert found.fidelity is better and len(found.choices) == 40
        counts.append(trials.count)
    assert asked == [40, 40] and counts == [10, 2]
    assert found.steps[1].action == ("sensitivity by each unit's own noise (one run): the goal needs more than half "
                                     "of the units (the noisiest half misses it)")


def test_when_the_noisiest_half_holds_the_blocks_rank_as_before_in_as_many_trials() -> None:
    """One sensitive unit: the noisiest half (holding it) meets the goal, and that trial stands
    for the blocks' own first question, so the blocks find the same unit in the same trials."""
    names = [f"u{i}" for i in range(40)]
    errors = {n: 0.0002 for n in names} | {"u29": 0.3}
    us = units(*names)
    plain, noisy = FakeTrials(errors, max_trials=30), NoisyTrials(errors, max_trials=30)
    found = [search(us, t, Goal(max_drop=0.01), float_costs(us), instead=lambda c, settled: None)
             for t in (plain, noisy)]
    assert found[0].choices == found[1].choices == {"u29": "float"}
    assert plain.count == noisy.count and [s.action for s in found[0].steps] == [s.action for s in found[1].steps]


def test_a_guess_the_callers_model_refuses_leaves_the_blocks_to_rank_as_before() -> None:
    """The noisiest half misses, but the caller's model is refused about everything promoted:
    the blocks then rank as they would have without the guess (their own question too, one
    trial more), and the search ends where it ended without the guess. Without a better model
    to ask (auto-precision, a TensorRT config) no guess is made at all."""
    names = [f"u{i}" for i in range(40)]
    us = units(*names)
    asked: list[list[tuple[int, bool]]] = []
    found, counts = [], []
    for trials in (FakeTrials({n: 0.001 for n in names}, max_trials=30),
                   NoisyTrials({n: 0.001 for n in names}, max_trials=30)):
        asked.append([])
        found.append(search(us, trials, Goal(max_drop=0.01), float_costs(us),
                            instead=lambda c, settled, seen=asked[-1]: seen.append((len(c), settled))))
        counts.append(trials.count)
    assert found[0].choices == found[1].choices and len(found[1].choices) == 30
    # (here the noisiest half is the blocks' half too: the same candidate, measured once)
    assert asked[0] == asked[1] == [(40, True), (30, False), (30, True)] and counts[1] <= counts[0] + 1
    plain = [s.action for s in found[0].steps]
    assert [s.action for s in found[1].steps] == plain[:1] + [found[1].steps[1].action] + plain[1:]
    unasked = NoisyTrials({n: 0.001 for n in names}, max_trials=30)
    assert [s.action for s in search(us, unasked, Goal(max_drop=0.01), float_costs(us)).steps] == plain
    assert unasked.count == counts[0]


class Flattered(FakeTrials):
    """The quick probe flatters any two units promoted (magika: 2 of its 31 hold on the quick
    probe's 8 samples; 28 are needed on all 32)."""

    def fidelity(self, choices, quick=False, stop_below=None):
        f = super().fidelity(choices, quick)
        return replace(f, outputs=(replace(f.outputs[0], cosine=1.0),)) if quick and len(choices) >= 2 else f


class FlatteredNoisy(Flattered, NoisyTrials):
    pass


def test_one_unit_at_a_time_the_noisiest_half_asks_on_all_samples() -> None:
    """8 equally sensitive units of which 3 may stay int8, the quick probe flattering: the
    noisiest half promoted, measured on all samples, misses the goal, so no unit is measured
    alone and the rescue's model (taken when mostly float) is asked about everything at once:
    2 trials, against 11 measuring each unit and confirming the doubling prefixes. Refused,
    the units are measured one at a time as without the guess, and the search ends where it
    ended without it, in as many trials (the half is the ranking's top 4, measured once)."""
    names = [f"u{i}" for i in range(8)]
    us = units(*names)
    errors = {n: 0.003 for n in names}
    better = Fidelity((OutputFidelity("y", False, None, 1.0, None),), noise=0.0)
    runs = {}
    for kind in (Flattered, FlatteredNoisy):
        for takes in (5, 9):  # mostly float: taken; never
            asked: list[tuple[int, bool]] = []
            trials = kind(errors)
            found = search(us, trials, Goal(max_drop=0.01), float_costs(us),
                           instead=lambda c, settled, seen=asked, k=takes: seen.append((len(c), settled)) or (
                               better if len(c) >= k else None))
            runs[kind, takes] = (trials.count, asked, found)
    count, asked, found = runs[FlatteredNoisy, 5]
    assert (count, asked, len(found.choices), found.fidelity) == (2, [(8, True)], 8, better)
    assert found.steps[1].action == ("sensitivity by each unit's own noise (one run): the goal needs more than half "
                                     "of the units (the noisiest half misses it on all samples)")
    assert runs[Flattered, 5][:2] == (11, [(2, False), (4, False), (8, False)])
    (plain, _, without), (noisy, asked, refused) = runs[Flattered, 9], runs[FlatteredNoisy, 9]
    assert asked[0] == (8, True) and refused.choices == without.choices and len(refused.choices) == 5
    assert noisy == plain and [s.action for s in refused.steps[2:]] == [s.action for s in without.steps[1:]]


def test_a_prefix_the_caller_has_better_than_is_not_confirmed() -> None:
    """The quick probe flatters the top 10 (all samples need 30): the doubling asks the
    rescue's `instead` about each prefix before confirming it; at 20 (mostly float: from there
    on any prefix that holds is) its model meets the goal, and top 20 is neither confirmed
    nor pruned."""
    names = [f"u{i}" for i in range(40)]
    us = units(*names)

    class Flattered(FakeTrials):
        def fidelity(self, choices, quick=False, stop_below=None):
            f = super().fidelity(choices, quick)
            return replace(f, outputs=(replace(f.outputs[0], cosine=1.0),)) if quick and len(choices) >= 10 else f

    asked: list[tuple[int, bool]] = []
    better = Fidelity((OutputFidelity("y", False, None, 1.0, None),), noise=0.0)
    trials = Flattered({n: 0.001 for n in names}, max_trials=200)
    found = search(us, trials, Goal(max_drop=0.01), float_costs(us),
                   instead=lambda c, settled: asked.append((len(c), settled)) or (better if len(c) >= 20 else None))
    assert asked == [(10, False), (20, False)] and len(found.choices) == 20 and found.fidelity is better
    assert [s.action for s in found.steps if s.action.startswith("confirm")] == ["confirm top 10 on all samples"]


def test_when_the_goal_needs_most_units_the_prune_stops_once_they_prove_dense() -> None:
    """60 equally sensitive units of which 9 may stay int8 (blocks: the goal needs most): the
    prefix promotes 51, every one of them needed. The prune finds one needed alone, then the
    rest at once and the rest's least useful half needed too, and stops there, where going on
    would spend a dozen trials on each of the other 50 (a hidden unit, the test above, leaves
    that half free)."""
    names = [f"u{i}" for i in range(60)]
    us = units(*names)
    trials = FakeTrials({n: 0.001 for n in names}, max_trials=100)  # one trial per unit does not fit
    found = search(us, trials, Goal(max_drop=0.0095), float_costs(us))
    assert found.met and len(found.choices) == 51 and found.stopped is None
    prune = [s for s in found.steps if s.action == "back to int8"]
    assert [len(s.changed) for s in prune] == [25, 12, 6, 3, 1, 50, 25] and not any(s.kept for s in prune)


def test_what_the_search_can_afford_is_counted_not_timed() -> None:
    """Per unit or by blocks follows the trials left, whatever time the run has spent: a path
    that followed the clock would change the model with the machine's load."""
    from qcli.precision.trials import Trials

    trials = Trials(None, None, None, None, None, [], max_trials=64, time_budget=1e-9)  # type: ignore[arg-type]
    trials.count = 2
    assert trials.affordable(31) and not trials.affordable(32)


def test_out_of_budget_the_search_returns_everything_promoted() -> None:
    names = [f"u{i}" for i in range(40)]
    us = units(*names)
    trials = FakeTrials({n: 0.01 for n in names}, max_trials=10)
    found = search(us, trials, Goal(max_drop=0.05), float_costs(us))
    assert found.stopped == "max trials (10) reached"
    assert found.met and len(found.choices) == 40
    assert found.steps[-1].action == "best reachable: all promoted"


def test_units_slower_in_int8_go_float_when_the_latency_ceiling_is_missed() -> None:
    errors = {"a": 0.001, "b": 0.001, "c": 0.001}
    us = units(*errors)
    costs = {"a": ("float", -50.0), "b": ("float", 30.0), "c": ("float", -1.0)}  # c: a tie
    trials = FakeTrials(errors, costs={"a": -0.3, "b": 0.2, "c": -0.001}, base_ratio=1.2)
    found = search(us, trials, Goal(max_drop=0.01, max_latency_ratio=1.0), costs)
    assert found.met
    assert found.choices == {"a": "float"}
    assert found.latency_ratio == pytest.approx(0.9)
    assert found.steps[1].action == "slower in int8: promoted"


class Int16Trials(FakeTrials):
    """FakeTrials where int16 removes the error of the units in `helped` only (onnxruntime runs
    a MatMul after int16 activations as MatMulNBits, which quantizes them to int8 again)."""

    def __init__(self, errors: dict[str, float], helped: set[str]):
        super().__init__(errors)
        self.helped = helped

    def _error(self, choices: dict[str, str]) -> float:
        return sum(e for n, e in self.errors.items()
                   if n not in choices or (choices[n] == "int16" and n not in self.helped))


def test_the_accuracy_search_promotes_to_float_then_tries_the_cheaper_promotion() -> None:
    """Units ranked with their cheapest promotion (int16 here, by timing) would hide `a`, whose
    int16 form does not help: ranking with float finds both sensitive units whatever the
    timings said, and only `b`, whose int16 form holds the goal, ends int16."""
    errors = {"a": 0.05, "b": 0.05, "c": 0.001}
    us = units(*errors)
    costs = {n: ("int16", -5.0) for n in errors}
    trials = Int16Trials(errors, helped={"b"})
    found = search(us, trials, Goal(max_drop=0.01), costs, candidates=["int8", "int16", "float"])
    assert found.met
    assert found.choices == {"a": "float", "b": "int16"}
    cheaper = [(s.action, s.changed, s.kept) for s in found.steps if s.action.endswith("(cheaper)")]
    assert cheaper == [("to int16 (cheaper)", ["b"], True), ("to int16 (cheaper)", ["a"], False)]
    assert any(s.action == "confirm the cheaper promotions on all samples" and s.kept for s in found.steps)
    # without float among the candidates, int16 is all there is: a cannot be fixed
    found = search(us, Int16Trials(errors, helped={"b"}), Goal(max_drop=0.01), costs, candidates=["int8", "int16"])
    assert not found.met and found.choices["b"] == "int16"


def test_when_every_weight_goes_dynamic_the_units_without_one_go_float_with_them() -> None:
    """A transformer's shape: every weighted unit has a dynamic form; `r` (a residual Add) has
    no weight. The rescue's first candidate makes the weights dynamic and `r` float: its static
    Q/DQ pairs would feed no int8 kernel. With a weighted unit left static (`c`, a Conv), the
    rest stays as configured."""
    errors = {"a": 0.004, "b": 0.03, "r": 0.002}
    us = [replace(u, dynamic=u.node != "r", weighted=u.node != "r") for u in units(*errors)]
    costs = {n: ("float", 5.0) for n in errors}
    goal, candidates = Goal(max_drop=0.01, max_latency_ratio=1.0), ["dynamic", "float"]
    found = search(us, DynamicTrials(errors, hard=set()), goal, costs, candidates=candidates, dynamic_first=True)
    assert found.met and found.choices == {"a": "dynamic", "b": "dynamic", "r": "float"}
    conv = [*us, replace(units("c")[0], index=3, weighted=True)]
    found = search(conv, DynamicTrials(errors | {"c": 0.001}, hard=set()), goal, costs | {"c": ("float", 5.0)},
                   candidates=candidates, dynamic_first=True)
    assert found.met and found.choices == {"a": "dynamic", "b": "dynamic"}


class DynamicTrials(FakeTrials):
    """FakeTrials where dynamic int8 leaves a tenth of a unit's error, except for the units in
    `hard` (their error is not in the activation ranges: dynamic keeps all of it)."""

    def __init__(self, errors: dict[str, float], hard: set[str]):
        super().__init__(errors)
        self.hard = hard

    def _error(self, choices: dict[str, str]) -> float:
        def left(n: str, e: float) -> float:
            if n not in choices:
                return e
            return (e if n in self.hard else e / 10) if choices[n] == "dynamic" else 0.0
        return sum(left(n, e) for n, e in self.errors.items())


def test_dynamic_is_tried_before_float_and_float_is_the_last_resort() -> None:
    """Units with a dynamic form end dynamic when that meets the goal (b, and the twelve
    moderately sensitive ones, tried in chunks); `a`, whose dynamic form does not help, and `c`,
    which has none, end float. Timings do not enter: dynamic is preferred by a fixed rule."""
    errors = {"a": 0.05, "b": 0.05, "c": 0.05} | {f"m{i}": 0.004 for i in range(12)}
    us = [replace(u, dynamic=u.node != "c") for u in units(*errors)]
    costs = {n: ("float", 5.0) for n in errors}  # float measured cheapest: dynamic is still tried first
    found = search(us, DynamicTrials(errors, hard={"a"}), Goal(max_drop=0.01), costs,
                   candidates=["int8", "dynamic", "float"])
    assert found.met
    assert found.choices["a"] == "float" and found.choices["c"] == "float" and found.choices["b"] == "dynamic"
    assert {p for n, p in found.choices.items() if n.startswith("m")} <= {"dynamic"}
    # without dynamic among the candidates, every promotion is float
    plain = search(us, DynamicTrials(errors, hard={"a"}), Goal(max_drop=0.01), costs, candidates=["int8", "float"])
    assert plain.met and set(plain.choices.values()) == {"float"}


def test_the_rescue_tries_every_dynamic_form_first_and_stops_there_when_it_meets_the_goal() -> None:
    """`dynamic_first` (verification's rescue): all int8 misses, every unit with a dynamic form
    dynamic meets the goal: that is the result, in one more trial, no weight float (`c`, a
    weighted unit without a dynamic form, stays int8). When it misses (`a`'s error stays), the
    search goes on as without it and float takes what dynamic cannot."""
    errors = {"a": 0.004, "b": 0.03, "c": 0.002}
    us = [replace(u, dynamic=u.node != "c", weighted=True) for u in units(*errors)]
    costs = {n: ("float", 5.0) for n in errors}
    goal, candidates = Goal(max_drop=0.01, max_latency_ratio=1.0), ["dynamic", "float"]
    trials = DynamicTrials(errors, hard=set())
    found = search(us, trials, goal, costs, candidates=candidates, dynamic_first=True)
    assert found.met and found.choices == {"a": "dynamic", "b": "dynamic"} and trials.count == 2
    assert [(s.kind, s.kept) for s in found.steps] == [(StepKind.ALL_INT8, True), (StepKind.ALL_DYNAMIC, True)]
    assert found.steps[1].latency_ratio == 0.5  # timed: it meets the ceiling too
    hard = search(us, DynamicTrials(errors | {"a": 0.02}, hard={"a"}), goal, costs, candidates=candidates,
                  dynamic_first=True)
    assert hard.met and hard.choices["a"] == "float" and hard.steps[1].kind is StepKind.ALL_DYNAMIC
    assert not hard.steps[1].kept and hard.steps[1].latency_ratio is None  # a miss is not timed
    plain = search(us, DynamicTrials(errors | {"a": 0.02}, hard={"a"}), goal, costs, candidates=candidates)
    assert plain.choices == hard.choices and StepKind.ALL_DYNAMIC not in {s.kind for s in plain.steps}


def test_nodes_reading_one_weight_are_one_unit() -> None:
    """An unrolled decoder's steps share a weight: one unit (its mates follow its choice), so
    the weight is stored once, in one precision."""
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 8] x) => (float[N, 8] y) <float[8, 8] w = {1,0,0,0,0,0,0,0, 0,1,0,0,0,0,0,0, 0,0,1,0,0,0,0,0,
        0,0,0,1,0,0,0,0, 0,0,0,0,1,0,0,0, 0,0,0,0,0,1,0,0, 0,0,0,0,0,0,1,0, 0,0,0,0,0,0,0,1}> {
            [step1] h1 = MatMul (x, w)
            [relu1] r1 = Relu (h1)
            [step2] h2 = MatMul (r1, w)
            [add] y = Add (h2, x)
        }
    """)
    prepared = prepare_for(model, Config()).model
    found = find_units(prepared, make_plan(prepared, Config()))
    assert [(u.node, u.mates, u.dynamic) for u in found] == [("step1", ("step2",), True), ("add", (), False)]
    out = promoted_config(Config(), {"step1": "dynamic"}, found)
    assert out.overrides[0].precision == "dynamic" and out.overrides[0].match.nodes == ["step1", "step2"]


def test_accuracy_criterion_promotes_as_far_as_the_speed_floor_allows() -> None:
    errors = {"a": 0.04, "b": 0.03, "c": 0.02, "d": 0.01}
    us = units(*errors)
    trials = FakeTrials(errors, costs={n: 0.2 for n in errors}, base_ratio=0.5)
    found = search(us, trials, Goal("accuracy", max_latency_ratio=1.0), float_costs(us))
    assert found.choices == {"a": "float", "b": "float"}  # a third would make it 1.1x float
    assert found.latency_ratio == pytest.approx(0.9)


def test_balanced_aims_at_half_the_budget_when_it_can() -> None:
    errors = {"a": 0.05, "b": 0.008, "c": 0.004}
    us = units(*errors)
    perf = search(us, FakeTrials(errors), Goal("performance", max_drop=0.02), float_costs(us))
    bal = search(us, FakeTrials(errors), Goal("balanced", max_drop=0.02), float_costs(us))
    assert perf.choices == {"a": "float"}  # 0.012 <= 0.02
    assert bal.choices == {"a": "float", "b": "float"}  # 0.004 <= 0.01


def test_same_table_same_choices() -> None:
    errors = {f"u{i}": 0.001 * (i % 5) for i in range(20)}
    us = units(*errors)
    runs = [search(us, FakeTrials(errors), Goal(max_drop=0.005), float_costs(us)).choices for _ in range(2)]
    assert runs[0] == runs[1] and runs[0]


def test_promoted_config_appends_overrides_that_reproduce_the_choices() -> None:
    us = units("/b/MatMul", "/a[0]/MatMul", "/c/MatMul")
    config = parse_config({"overrides": [{"match": {"op_types": ["Add"]}, "precision": "float"}],
                           "auto_precision": {"enabled": True}})
    out = promoted_config(config, {"/c/MatMul": "float", "/b/MatMul": "int16", "/a[0]/MatMul": "float"}, us)
    assert out.auto_precision.enabled is False
    assert out.overrides[0] == config.overrides[0]  # the user's first, untouched
    assert out.overrides[1].activations.dtype == "uint16" and out.overrides[1].match.nodes == ["/b/MatMul"]
    # graph order; glob characters escaped into an exact regex
    assert out.overrides[2].precision == "float"
    assert out.overrides[2].match.nodes == ["re:/a\\[0\\]/MatMul", "/c/MatMul"]
    signed = promoted_config(Config().merged(activations={"dtype": "int8", "symmetric": True}), {"/b/MatMul": "int16"}, us)
    assert signed.overrides[0].activations.dtype == "int16" and signed.overrides[0].activations.symmetric


def test_kernel_times_are_attributed_to_units() -> None:
    us = [Unit("/fc/MatMul", "MatMul", 0, frozenset({"x", "w", "h"})), Unit("/add/Add", "Add", 1, frozenset({"h", "b", "y"}))]
    times = {
        "/fc/MatMul": 10.0,  # fused int8 kernel keeps the node's name
        "/add/Add/SomeFusion/": 4.0,  # an onnxruntime fusion named after its first node
        "x_Q": 2.0,
        "h_dequantized_DQ": 3.0,  # shared by both units
        "w_dequantized_DQ": 1.0,
        "y_DQ": 2.0,  # graph output: DQ writes the output's own name
        "/other/Softmax": 50.0,  # not a unit
    }
    got = attribute(times, us)
    assert got == pytest.approx({"/fc/MatMul": 10 + 2 + 1.5 + 1, "/add/Add": 4 + 1.5 + 2})


def test_all_float_is_not_taken_for_a_ceiling_below_float_speed() -> None:
    """A latency ceiling of 0.05 cannot be met; int8 (0.5x float) is the fastest there is, so it
    stays: all-float only passes a ceiling >= 1 by construction."""
    errors = {"a": 0.001, "b": 0.001}
    us = units(*errors)
    costs = {"a": ("float", -5.0), "b": ("float", 10.0)}
    trials = FakeTrials(errors, costs={"a": 0.2, "b": 0.3}, base_ratio=0.5)
    found = search(us, trials, Goal(max_drop=0.01, max_latency_ratio=0.05), costs)
    assert not found.met
    assert found.choices == {} and found.latency_ratio == pytest.approx(0.5)


def test_all_float_is_taken_when_int8_misses_a_ceiling_of_one() -> None:
    errors = {"a": 0.001, "b": 0.001}
    us = units(*errors)
    costs = {"a": ("float", 5.0), "b": ("float", 10.0)}  # profiles say int8 is faster per node...
    trials = FakeTrials(errors, costs={"a": -0.05, "b": -0.2}, base_ratio=1.3)  # ...the model is not
    found = search(us, trials, Goal(max_drop=0.01, max_latency_ratio=1.0), costs)
    assert found.met and found.choices == {"a": "float", "b": "float"}
    assert found.steps[-1].action == "int8 slower overall: all promoted"


def test_a_result_with_every_unit_float_is_not_timed_under_a_ceiling_of_one() -> None:
    """Every unit needed float for accuracy: the result computes like the float model, as fast
    as it by construction, so it is not timed (a timing of ~1.0 that decides nothing); under a
    ceiling below float's speed it is."""
    errors = {"a": 0.02, "b": 0.02}
    us = units(*errors)

    class Timed(FakeTrials):
        timed: list[dict] = []

        def latency(self, choices):
            self.timed.append(dict(choices))
            return super().latency(choices)

    for ceiling, timed in ((1.0, False), (0.9, True)):
        trials = Timed(errors, base_ratio=0.5)
        trials.timed = []
        found = search(us, trials, Goal(max_drop=0.01, max_latency_ratio=ceiling), float_costs(us))
        assert found.choices == {"a": "float", "b": "float"} and found.met
        assert ({"a": "float", "b": "float"} in trials.timed) is timed
        assert (found.latency_ratio is None) is not timed


def test_when_no_mix_can_pay_off_the_callers_model_is_asked_before_everything_float_is_measured() -> None:
    """No mix of int8 and float could pay off: every unit goes float at once, without a search.
    The rescue's weight-only model, asked first, replaces that model when it meets the goal, so
    everything float is not measured (one trial: all int8); refused, it is, as before."""
    errors = {"a": 0.02, "b": 0.02}
    us = units(*errors)
    better = Fidelity((OutputFidelity("y", False, None, 1.0, None),), noise=0.0)
    for answer, trials_run in ((better, 1), (None, 2)):
        asked: list[tuple[int, bool]] = []
        trials = FakeTrials(errors)
        found = search(us, trials, Goal(max_drop=0.01), float_costs(us), no_payoff="int8 would not pay off",
                       instead=lambda c, settled, seen=asked, a=answer: seen.append((len(c), settled)) or a)
        assert asked == [(2, True)] and found.choices == {"a": "float", "b": "float"} and found.met
        assert trials.count == trials_run and (found.fidelity is better) is (answer is better)
        assert (found.steps[-1].drop is None) is (answer is better)


def test_reasons_say_why_each_unit_was_promoted() -> None:
    """A unit promoted with the ones ranked above it, whose own promotion did not cut the noise
    (seen on an exported classifier), is not called sensitive."""
    from qcli.precision import SearchResult, Step, StepKind
    from qcli.precision.reasons import reasons

    steps = [Step(StepKind.ALL_INT8, "all int8", [], 0, 0.4, 1.0),
             Step(StepKind.SPEED, "slower in int8: promoted", ["c"], 1, 0.4, 1.0),
             Step(StepKind.PREFIX, "promote top 3", ["a", "b", "d"], 4, 0.0, 0.01)]
    found = SearchResult({"a": "float", "b": "float", "c": "float"}, None, None, True, steps,
                         {"a": 0.5, "b": -0.002}, {"c": ("float", -12.5)}, 3)
    assert reasons(found) == {
        "a": "sensitive: promoting it alone cuts output noise by 0.5",
        "b": "promoted with the units ranked above it (alone it changes output noise by +0.002: "
             "not sensitive by itself)",
        "c": "faster in float (12.5 µs less per run)",
    }


def test_block_sensitivity_leaves_budget_for_the_prefix_and_the_prune() -> None:
    """205 units (a 12-layer BERT's), three of them sensitive among many a little so, and 34
    trials: every block level splits three blocks, so the levels took the whole budget and the
    search returned everything float. Now a level runs only when it fits in half of what is
    left, and the search ends with a fraction of the units promoted."""
    names = [f"u{i}" for i in range(205)]
    errors = {n: 0.0003 for n in names} | {"u20": 0.05, "u100": 0.05, "u180": 0.05}
    us = units(*names)
    trials = FakeTrials(errors, max_trials=34)
    found = search(us, trials, Goal(max_drop=0.08), float_costs(us))
    assert found.met
    assert {"u20", "u100", "u180"} <= set(found.choices) and len(found.choices) < 30
    assert "best reachable: all promoted" not in [s.action for s in found.steps]


def test_accuracy_criterion_with_every_unit_promoted_for_speed_and_no_budget_left() -> None:
    """`criteria: accuracy` ranks the units left int8 even after the speed step promoted them
    all; with the budget spent, the ranking went by blocks and split an empty list (a zero
    step: internal error, seen with `--max-trials 3` on the sample MLP)."""
    errors = {"a": 0.001, "b": 0.001}
    us = units(*errors)
    costs = {"a": ("float", -50.0), "b": ("float", -30.0)}
    trials = FakeTrials(errors, costs={"a": -0.3, "b": -0.2}, base_ratio=1.2, max_trials=1)
    found = search(us, trials, Goal("accuracy", max_drop=0.01, max_latency_ratio=1.0), costs)
    assert found.met and found.choices == {"a": "float", "b": "float"}
    assert found.steps[1].action == "slower in int8: promoted"


class HiddenOnFewSamples(FakeTrials):
    """FakeTrials whose unit `hidden` adds `extra` error only on all samples (the quick probe's
    few samples miss it)."""

    def __init__(self, errors: dict[str, float], hidden: str, extra: float):
        super().__init__(errors)
        self.hidden, self.extra = hidden, extra

    def fidelity(self, choices: dict[str, str], quick: bool = False, stop_below: float | None = None) -> Fidelity:
        f = super().fidelity(choices, quick)
        if quick or self.hidden in choices:
            return f
        error = f.noise + self.extra
        return Fidelity((OutputFidelity("y", False, None, 1.0 - error, None),), noise=error)


def test_a_prune_that_does_not_hold_is_redone_over_the_units_it_changed() -> None:
    """x's error shows on all samples only: the prefix doubles until it takes x along, the
    quick prune sends x, c and b back, which all samples refuse; the prune redone on all
    samples tries those three again (x stays promoted), not a, which the quick probe showed
    needed."""
    errors = {"a": 0.05, "b": 0.001, "c": 0.001, "x": 0.0}
    us = units(*errors)
    found = search(us, HiddenOnFewSamples(errors, "x", 0.05), Goal(max_drop=0.03), float_costs(us))
    assert found.met and found.choices == {"a": "float", "x": "float"}
    redone = [s.changed for s in found.steps if s.kind is StepKind.PRUNE and not s.quick]
    assert redone == [["x"], ["c"], ["b"]]


def test_a_confirmation_measured_in_part_stands_for_no_other_model() -> None:
    """`Trials.fidelity(stop_below=)`: a miss measured until it had to miss is cached for the
    verdict it gave, not shared with another candidate of the same bytes, and measured whole
    when its figures are asked for (`best reachable` compares noise)."""
    from types import SimpleNamespace

    from qcli.analyze.fidelity import OutputFidelity
    from qcli.precision.trials import Trials

    class Probe:
        samples, asked = 10, []

        def measure(self, models, stop_below=None):
            self.asked.append(stop_below)
            return Fidelity((OutputFidelity("y", True, 0.5, 0.9, None, samples=4 if stop_below else 10),), noise=0.1)

    probe = Probe()
    trials = Trials(None, None, None, None, probe, [])  # type: ignore[arg-type]
    built = SimpleNamespace(plan=SimpleNamespace(nodes=[]))
    trials.measured = lambda choices, p: (None, lambda: built, b"the same bytes")  # type: ignore[method-assign]
    assert trials.fidelity({"a": "float"}, stop_below=0.99).outputs[0].samples == 4
    assert trials.fidelity({"a": "float"}, stop_below=0.99).outputs[0].samples == 4  # cached
    assert trials.fidelity({"b": "float"}).outputs[0].samples == 10  # measured: the part is no figure for it
    assert trials.fidelity({"a": "float"}).outputs[0].samples == 10  # whole, as b's bytes were
    assert probe.asked == [0.99, None] and trials.count == 2


def test_a_units_own_noise_is_what_it_adds_to_its_input_noise() -> None:
    """`unit_noise`: one run of a candidate against the prepared float model. Here only the
    second MatMul's weight differs (as rounding would make it): the first adds nothing, the
    second all of the output's noise, which its input does not carry."""
    from types import SimpleNamespace

    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from qcli.data import Batch
    from qcli.precision.noise import unit_noise

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)

    def mlp(second: np.ndarray) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "a"], ["h"], name="first"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "b"], ["y"], name="second")],
            "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])],
            [numpy_helper.from_array(a, "a"), numpy_helper.from_array(second, "b")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    candidate = mlp(b + 0.05 * rng.standard_normal(b.shape).astype(np.float32))
    probe = SimpleNamespace(batches=[Batch({"x": rng.standard_normal((4, 8)).astype(np.float32)}, None, None)],
                            folds=None)
    trials = SimpleNamespace(quick_probe=probe, probe=probe, prepared=SimpleNamespace(model=mlp(b)),
                             measured=lambda choices, p: (candidate, None, None))
    noise = unit_noise(trials, ["first", "second", "relu"], {})
    assert noise is not None and noise["first"] == 0.0 and noise["relu"] == 0.0 and 1e-5 < noise["second"] < 0.1
    probe.batches = [Batch({"x": np.zeros((4, 7), np.float32)}, None, None)]  # a sample the model cannot run
    assert unit_noise(trials, ["first", "second"], {}) is None
    assert unit_noise(trials, ["absent"], {}) is None  # no unit to tell apart: no guess


def test_without_a_guess_the_blocks_rank_as_before() -> None:
    """A noise run that fails (None) leaves the ranking by blocks as it was, its own question included."""
    names = [f"u{i}" for i in range(40)]
    us = units(*names)

    class Unguessed(FakeTrials):
        def unit_noise(self, choices: dict[str, str], nodes: list[str]) -> None:
            return None

    plain, unguessed = FakeTrials({n: 0.001 for n in names}, max_trials=30), Unguessed({n: 0.001 for n in names},
                                                                                        max_trials=30)
    found = [search(us, t, Goal(max_drop=0.01), float_costs(us)) for t in (plain, unguessed)]
    assert [s.action for s in found[0].steps] == [s.action for s in found[1].steps] and plain.count == unguessed.count
    assert found[1].steps[1].action.endswith("no finer blocks")


class SizedTrials(FakeTrials):
    """int8 units add nothing; a unit with int4 weights adds its `int4` error. The model's size:
    `fixed` bytes plus a byte per int8 weight, `per_int4` bytes (or the unit's) per int4 weight."""

    def __init__(self, int4: dict[str, float], params: dict[str, int], fixed: int = 100,
                 per_int4: float | dict[str, float] = 0.5):
        super().__init__(dict.fromkeys(int4, 0.0))
        self.int4, self.params, self.fixed, self.per_int4 = int4, params, fixed, per_int4
        self.sized: list[frozenset] = []

    def _error(self, choices: dict[str, str]) -> float:
        return sum(self.int4[n] for n, p in choices.items() if p == "int4")

    def size(self, choices: dict[str, str]) -> int:
        self.sized.append(frozenset(choices.items()))
        per = self.per_int4 if isinstance(self.per_int4, dict) else dict.fromkeys(self.params, self.per_int4)
        return self.fixed + round(sum(self.params[n] * (per[n] if choices.get(n) == "int4" else 1)
                                      for n in self.params))


def sized_units(params: dict[str, int]) -> list[Unit]:
    return [replace(u, weighted=True, params=params[u.node]) for u in units(*params)]


def test_a_size_budget_takes_the_int4_weights_of_least_summed_noise_that_fit() -> None:
    """300 bytes to save: `head` alone (the least noise per byte) adds 0.003, three quiet layers
    0.0024; `t`, the quietest, saves almost nothing. The knapsack takes the three, where a ranking
    by noise per byte takes `head` and one by noise alone takes `t` along."""
    params = {"head": 1000, "a": 250, "b": 250, "c": 250, "t": 10}
    trials = SizedTrials({"head": 0.003, "a": 0.0008, "b": 0.0008, "c": 0.0008, "t": 0.0001}, params)
    found = search(sized_units(params), trials, Goal(max_drop=0.01, max_bytes=1860 - 300), {}, shrink=True)
    assert found.met and found.choices == dict.fromkeys("abc", "int4")
    assert found.steps[-1].action == "int4 weights on 3, the least noise that fits 0.00156 MB (0.00148 MB)"


def test_a_size_budget_saves_more_while_the_estimate_falls_short() -> None:
    """The estimate (every unit saving the mean bytes a weight) is wrong when the quiet units save
    little (a..d: 10 bytes each, e..h: 90): the bytes still over are added to what the choice must
    save, until it fits."""
    params = dict.fromkeys("abcdefgh", 100)
    trials = SizedTrials({n: 0.001 * (k + 1) for k, n in enumerate(params)}, params,
                         per_int4={n: 0.9 if n in "abcd" else 0.1 for n in params})
    found = search(sized_units(params), trials, Goal(max_drop=0.1, max_bytes=900 - 100), {}, shrink=True)
    assert found.met and found.choices == dict.fromkeys("abcde", "int4")  # 4 x 10 + 90 bytes: the fifth fits
    assert len(set(trials.sized)) == 2 + 3  # all int8, all int4, then a and b, a..d, a..e


@pytest.mark.parametrize(("budget", "met", "int4", "last"), [
    (2000, True, 0, "fits 0.002 MB without int4 weights (0.0016 MB)"),
    (800, False, 3, "int4 weights on all 3: 0.00085 MB, still over 0.0008 MB"),
])
def test_a_size_budget_met_as_is_or_out_of_reach_spends_no_ranking(budget: int, met: bool, int4: int,
                                                                   last: str) -> None:
    """Within the budget all int8: nothing more is measured. Over it even with every weight int4:
    that model (the smallest), measured once, and the goal missed."""
    params = {"big": 1000, "small": 100, "mid": 400}
    trials = SizedTrials({"big": 0.002, "small": 0.001, "mid": 0.004}, params)
    found = search(sized_units(params), trials, Goal(max_drop=0.01, max_bytes=budget), {}, shrink=True)
    assert found.met is met and len(found.choices) == int4 and found.steps[-1].action == last
    assert trials.count == 1 + (not met)  # all int8, and all int4 when out of reach
