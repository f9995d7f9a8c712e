"""The fuzzer's hypothesis profiles, its counters and the summary it prints at the end.

Profiles (environment variable QCLI_FUZZ):
- `fast` (default; `make test`): derandomized (the same examples every run), few examples per
  test, no example database. Failures raise at once, unshrunk: shrinking a failing pipeline
  ran over a thousand qcli commands (minutes), which `make test` cannot afford; the long
  profile shrinks.
- `long` (`make fuzz`): random, QCLI_FUZZ_EXAMPLES examples per test at most, within
  QCLI_FUZZ_MINUTES minutes shared by the tests (`Stats.time_up`); the example database in
  .hypothesis/ (git-ignored) replays past failures first. Failures are collected by cause
  (with the smallest case seen) instead of stopping the run; each test fails at its end if
  it found one that is not in `fuzz_check.KNOWN`.
"""

from __future__ import annotations

import os
import re
import time
import unittest
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyStrategyDefinition

PROFILE = os.environ.get("QCLI_FUZZ", "fast")
LONG = PROFILE == "long"
MINUTES = float(os.environ.get("QCLI_FUZZ_MINUTES", "10"))
SHARE = {"graphs": 0.5, "configs": 0.15, "pipelines": 0.2, "texts": 0.05, "bad_inputs": 0.1}  # of the time
FAST_EXAMPLES = {"graphs": 80, "configs": 40, "pipelines": 20, "texts": 30, "bad_inputs": 45}

_common = {"deadline": None, "suppress_health_check": list(HealthCheck), "print_blob": False}
settings.register_profile("fast", derandomize=True, database=None, phases=[Phase.explicit, Phase.generate], **_common)
settings.register_profile(
    "long", max_examples=int(os.environ.get("QCLI_FUZZ_EXAMPLES", "20000")),
    database=DirectoryBasedExampleDatabase(os.path.join(os.path.dirname(__file__), "..", "..", ".hypothesis")),
    **_common,
)


def profile(test: str) -> settings:
    """The settings of one fuzz test under the selected profile."""
    base = settings.get_profile(PROFILE if PROFILE in ("fast", "long") else "fast")
    return settings(base, max_examples=base.max_examples if LONG else FAST_EXAMPLES[test])


class TimeUp(unittest.SkipTest):
    """Ends a long fuzz test: hypothesis stops at once on a skip exception (no shrinking)."""


def run(test: str, fuzz: Callable[[], None]) -> None:
    """Run one @given fuzz function to its end or its time budget, then fail on any new cause
    it collected (the long profile collects instead of raising at the first)."""
    try:
        fuzz()
    except TimeUp:
        pass
    except FlakyStrategyDefinition as exc:
        # TimeUp concludes the example where it was raised; when an earlier example with the same
        # choices drew further, hypothesis calls the generation flaky: the budget's end, not a bug
        if not isinstance(exc.__context__, TimeUp):
            raise
    new = STATS.new_failures(test)
    assert not new, "\n\n".join(f"{f.count}x {f.cause}\n{f.smallest}" for f in new)


@dataclass
class Failure:
    cause: str
    count: int = 0
    known: str | None = None
    smallest: str = ""  # the reproducer: model text, config, command, output

    def add(self, reproducer: str) -> None:
        self.count += 1
        if not self.smallest or len(reproducer) < len(self.smallest):
            self.smallest = reproducer


@dataclass
class Stats:
    """What the fuzzer generated and ran, and the failures it saw, by cause."""

    features: Counter = field(default_factory=Counter)  # op types, attributes, tags
    counts: Counter = field(default_factory=Counter)  # graphs, configs, pipelines, runs, exits
    failures: dict[str, Failure] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    slowest: list[tuple[float, str]] = field(default_factory=list)  # (seconds, command), the 5 slowest runs

    def timed(self, command: str, seconds: float) -> None:
        self.slowest = sorted([*self.slowest, (seconds, command)], reverse=True)[:5]

    def check_time(self, test: str) -> None:
        """Stop `test` (TimeUp) once the long profile spent its share of QCLI_FUZZ_MINUTES;
        the fast profile has no time limit."""
        if not LONG:
            return
        start = self.started.setdefault(test, time.monotonic())
        if time.monotonic() - start > MINUTES * 60 * SHARE[test]:
            raise TimeUp(f"{test}: time budget spent")

    def fail(self, test: str, cause: str, reproducer: str, known: str | None) -> None:
        key = f"{test}: {cause}"
        self.failures.setdefault(key, Failure(key, known=known)).add(reproducer)

    def new_failures(self, test: str) -> list[Failure]:
        return [f for f in self.failures.values() if f.known is None and f.cause.startswith(test + ":")]

    def summary(self) -> list[str]:
        c = self.counts
        lines = [
            f"qcli fuzz ({PROFILE} profile): {c['graphs']} graphs run ({c['graphs discarded']} discarded: the float "
            f"model does not run), {c['configs']} configs ({c['configs valid']} valid), {c['pipelines']} pipelines, "
            f"{c['text files']} text files, {c['bad inputs']} bad inputs; {c['runs']} qcli runs "
            f"({c['refused texts']} on a text file qcli must refuse)",
        ]
        known = Counter(f.known for f in self.failures.values() for _ in range(f.count) if f.known)
        if not LONG:
            new = [f.cause for f in self.failures.values() if not f.known]
            return lines + [f"  known bugs hit (fuzz_check.KNOWN, tolerated): {', '.join(sorted(known)) or 'none'}"] + [
                f"  NEW: {cause}" for cause in new]
        lines += _exit_lines(c) + _feature_lines(self.features)
        lines.append("  slowest runs: " + "; ".join(f"{s:.1f} s {c}" for s, c in self.slowest))
        hits = ", ".join(f"{k} x{v}" for k, v in sorted(known.items()))
        lines.append(f"  failing runs by known bug: {hits or 'none'}")
        lines.append(f"  failures by cause ({len(self.failures)}), new causes first, each with its smallest case:")
        for f in sorted(self.failures.values(), key=lambda f: (f.known is not None, -f.count)):
            lines.append(f"  - {f.count}x {f.cause}" + (f"  [known: {f.known}]" if f.known else "  [NEW]"))
            lines.extend("      " + line for line in f.smallest.splitlines()[:80])
        return lines


def _exit_lines(counts: Counter) -> list[str]:
    """Runs by command and exit code: `quantize: 0 x1322, 1 x52, 2 x485`."""
    by_command: dict[str, list[str]] = {}
    for key, n in sorted(counts.items()):
        if " exit " in key:
            command, code = key.rsplit(" exit ", 1)
            by_command.setdefault(command, []).append(f"{code} x{n}")
    return ["  runs by exit code: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in by_command.items())]


def _feature_lines(features: Counter) -> list[str]:
    """Op types with counts, each op's attributes with their most frequent values, other tags."""
    ops = {k: v for k, v in features.items() if re.fullmatch(r"[A-Z][A-Za-z]*", k)}
    lines = [f"  op types ({len(ops)}): " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items()))]
    attrs: dict[str, dict[str, Counter]] = {}
    for key, n in features.items():
        match = re.fullmatch(r"([A-Z][A-Za-z]*)\.(\w+)=(.*)", key)
        if match:
            op, name, value = match.groups()
            attrs.setdefault(op, {}).setdefault(name, Counter())[value] += n
    lines.append("  attributes (value x count, the 5 most frequent):")
    for op, names in sorted(attrs.items()):
        parts = []
        for name, values in sorted(names.items()):
            top = ", ".join(f"{v} x{n}" for v, n in values.most_common(5))
            parts.append(f"{name}: {top}" + (f" (+{len(values) - 5} more)" if len(values) > 5 else ""))
        lines.append(f"    {op}: " + "; ".join(parts))
    tags = {k: v for k, v in features.items() if k not in ops and not re.fullmatch(r"[A-Z][A-Za-z]*\.\w+=.*", k)}
    lines.append("  other features: " + ", ".join(f"{k} x{v}" for k, v in sorted(tags.items())))
    return lines


STATS = Stats()


class SummaryPlugin:
    """Prints `STATS.summary()` in pytest's terminal summary."""

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if any(STATS.counts.values()):
            terminalreporter.write_sep("-", "qcli fuzz")
            for line in STATS.summary():
                terminalreporter.write_line(line)
