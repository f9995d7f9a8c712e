"""Target profiles: what each kernel costs on the deployment target, and the latency they predict.

A profile prices a kernel call by its class and op (`conv.i8:QLinearConv`; failing that its
class, qcli.target.kernels, then the class's FALLBACK) from the call's features: a sum of
`terms`, µs per unit of each feature (a fixed cost per call, per multiply-accumulate, per
activation byte moved, per weight byte, per fused-activation element, per row or output position), or `like` another
entry times `factor`. A run costs `run_us` plus, per call, `node_us` and its price. Measured
profiles fit the terms to micro-benchmarks (qcli.target.measure); rules ones state them. A
profile `calibration` (qcli.target.calibrated) multiplies the classes only a quantized graph runs
(kernels.INTEGER) by one factor and every other call, and `run_us`, by another: fitted once to
one model's float and all-int8 runs timed on the target.
The same profile, graph and feeds give the same prediction anywhere: that is what decisions
read (qcli.target.predict), never a clock.

Files: JSON, `"format": "qcli-target/1"`; qcli ships some (qcli/target/profiles/*.json,
docs/guides/targets.md), `auto` picks the first shipped measured profile whose CPU flags this CPU
has, else `generic` (rules that credit int8 with no speed of its own).
"""

from __future__ import annotations

import json
import platform
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qcli.errors import ConfigError
from qcli.target.kernels import FALLBACK, FEATURES, INTEGER, Kernel
from qcli.textfile import read_text

Feature = Literal["call", "mac", "moved", "weights", "fused", "rows", "streamed"]  # FEATURES

FORMAT = "qcli-target/1"
SHIPPED = Path(__file__).parent / "profiles"
GENERIC = "generic"


class Cost(BaseModel):
    """One entry's price: `terms` {feature: µs per unit} (qcli.target.kernels.FEATURES), or
    `like` another entry times `factor`. `pack` [input, output channels]: the kernel pads K and
    N to multiples of these, and `mac` counts the padded products (qcli.target.kernels.packed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    terms: dict[Feature, Annotated[float, Field(ge=0)]] | None = None
    like: str | None = None
    factor: float = Field(1.0, gt=0)
    pack: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None

    def us(self, k: Kernel) -> float:
        """µs of a call by these terms (a `like` entry is priced through its profile)."""
        terms = self.terms or {}
        return sum(terms.get(name, 0.0) * value  # type: ignore[call-overload]
                   for name, value in zip(FEATURES, k.features(self.pack), strict=True))

    @model_validator(mode="after")
    def _one_form(self) -> Cost:
        if (self.terms is None) == (self.like is None):
            raise ValueError("give exactly one of terms or like")
        return self


class Calibration(BaseModel):
    """A profile fitted to one model on the target (qcli.target.calibrated): the factors on the
    float and the integer classes, and what they rest on (the timed and the base profile's
    predicted ms of the model as given and of its all-int8 model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str  # the file's name
    sha256: str  # qcli.model.fingerprint of the model as given
    factors: dict[Literal["float", "int8"], Annotated[float, Field(gt=0)]]
    base: str  # the profile it scales
    batch: int = Field(1, ge=1)  # the batch both runs were timed at
    measured_ms: dict[Literal["float", "int8"], Annotated[float, Field(ge=0)]]
    predicted_ms: dict[Literal["float", "int8"], Annotated[float, Field(ge=0)]]  # by `base`, before
    note: str = ""  # a factor held to its bounds, in words


class Profile(BaseModel):
    """A target profile (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["qcli-target/1"] = "qcli-target/1"  # FORMAT
    name: str
    kind: Literal["measured", "rules"]
    description: str = ""
    basis: str = ""  # what the figures rest on
    cpu_flags: list[str] = []  # `auto` picks a measured profile only on a CPU with these flags
    onnxruntime: str | None = None  # the version it was measured with
    threads: int | None = Field(None, ge=1)
    batch: int = Field(1, ge=1)
    run_us: float = Field(0.0, ge=0)  # per session.run
    node_us: float = Field(0.0, ge=0)  # per kernel call, beyond its own price
    kernels: dict[str, Cost]
    calibration: Calibration | None = None

    @field_validator("kernels")
    @classmethod
    def _priced(cls, kernels: dict[str, Cost]) -> dict[str, Cost]:
        if "memory" not in kernels:
            raise ValueError("no 'memory' entry (what every op without an entry of its own costs)")
        for key, cost in kernels.items():
            chain = [key]
            while cost.like is not None:
                if cost.like not in kernels:
                    raise ValueError(f"{chain[-1]}: 'like: {cost.like}' names no entry")
                if cost.like in chain:
                    raise ValueError(f"'like' goes round in a loop: {' -> '.join([*chain, cost.like])}")
                chain.append(cost.like)
                cost = kernels[cost.like]
        return kernels

    def price(self, k: Kernel) -> float:
        """µs of one kernel call, `node_us` included."""
        key = f"{k.cls}:{k.op}" if f"{k.cls}:{k.op}" in self.kernels else k.cls
        while key not in self.kernels:
            key = FALLBACK.get(key, "memory")
        return self.factor(k.cls) * (self.node_us + self._us(key, k))

    def factor(self, cls: str) -> float:
        """The calibration's factor on kernel class `cls` (1 uncalibrated)."""
        c = self.calibration
        return 1.0 if c is None else c.factors.get("int8" if cls in INTEGER else "float", 1.0)

    @property
    def run_cost(self) -> float:
        """µs of a session.run's own cost (`run_us`, calibrated as a float call)."""
        return self.run_us * self.factor("memory")

    def _us(self, key: str, k: Kernel) -> float:
        cost = self.kernels[key]
        if cost.like is not None:
            return cost.factor * self._us(cost.like, k)
        return cost.us(k)


def shipped() -> list[str]:
    """The names of the profiles qcli ships."""
    return sorted(p.stem for p in SHIPPED.glob("*.json"))


def load_profile(path: Path) -> Profile:
    """A profile file, validated; ConfigError (exit 2) naming the file and the key."""
    text = read_text(path, "target profile")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"target profile {path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}",
                          hint="give a file written by `qcli target measure`") from exc
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ConfigError(f"target profile {path}: {where}: {err['msg'].removeprefix('Value error, ')}",
                          hint=f"a profile has \"format\": \"{FORMAT}\" (see `qcli target show {GENERIC}`)") from exc


@cache
def _shipped(name: str) -> Profile:
    return load_profile(SHIPPED / f"{name}.json")


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux: /proc/cpuinfo; elsewhere none are known)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def resolve(spec: str, flags: frozenset[str] | None = None) -> tuple[Profile, str]:
    """The profile `spec` names (`auto`, a shipped name, or a file) and how it was chosen."""
    if spec == "auto":
        have = cpu_flags() if flags is None else flags
        for name in shipped():
            profile = _shipped(name)
            if profile.kind == "measured" and profile.cpu_flags and set(profile.cpu_flags) <= have:
                return profile, f"auto: this CPU ({platform.machine()}) has {', '.join(profile.cpu_flags)}"
        return _shipped(GENERIC), "auto: no shipped measured profile matches this CPU's flags, so generic's rules"
    if spec in shipped():
        return _shipped(spec), "shipped"
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"target {spec!r} is neither a shipped profile nor a file",
                          hint=f"shipped: {', '.join(shipped())}; or auto; or a file from `qcli target measure`")
    return load_profile(path), "file"
