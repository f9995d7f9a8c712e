"""The config's sections that stand on their own: the base every section derives from, the
recovery steps, the preparation and the deployment target. Part of the one schema of
qcli.config (which holds the quantization sections, the whole `Config` and its loading, and
re-exports `Section`); kept apart so neither module outgrows a reader."""

from __future__ import annotations

import difflib
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# qcli.prepare's passes a run may leave out (`prepare.skip`): rewrites the quantizer does without,
# which a target may run slower than the exporter's graph; the others are needed to quantize
SkippablePass = Literal["canonicalize", "fold_batchnorm"]
SKIPPABLE_PASSES: tuple[str, ...] = get_args(SkippablePass)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .nan/.inf: no setting means them


RECOVERY_STEPS = ("smoothquant", "bias_correction", "equalization", "adaround", "seq_mse")
ROUNDING = ("seq_mse", "adaround")  # the steps that round weights from the calibration samples


class SmoothQuant(Section):
    """Per-input-channel scales that move activation outliers into the weights of MatMul/Gemm
    and 1x1 Conv (docs/guides/recovery.md). `alpha`: the share of the outlier moved (0: none, 1: all),
    or `auto`: chosen per layer by measured error."""

    alpha: float | Literal["auto"] = Field("auto", description=(
        "the share of each outlier moved into the weights, 0 to 1; `auto`: off, 0.0, 0.1, ..., 1.0 scored per "
        "activation by its readers' int8 error, the smallest kept (off wins ties)"))
    op_types: list[Literal["MatMul", "Gemm", "Conv"]] = Field(["MatMul", "Gemm", "Conv"], description=(
        "the readers smoothed: MatMul, Gemm (transA 0), 1x1 Conv"))

    @field_validator("alpha")
    @classmethod
    def _share(cls, alpha: float | str) -> float | str:
        if not isinstance(alpha, str) and not 0.0 <= alpha <= 1.0:
            raise ValueError("alpha is a share between 0 and 1, or auto")
        return alpha


class BiasCorrection(Section):
    """Empirical bias correction (docs/guides/recovery.md): the mean output shift int8 causes in each
    quantized node of these types, measured on the calibration data, taken out of its bias."""

    op_types: list[Literal["Conv", "ConvTranspose", "Gemm", "MatMul"]] = Field(["Conv", "Gemm", "MatMul"],
                                                                               description="the nodes corrected")


class Equalization(Section):
    """Cross-layer equalization of Conv -> (Relu/Clip) -> Conv pairs, depthwise included
    (docs/guides/recovery.md): per-channel weight ranges balanced across each pair before calibration."""

    iterations: int = Field(1, ge=1, le=100, description="passes over the chains (each balances every pair once)")


class SeqMse(Section):
    """Sequential MSE (docs/guides/recovery.md): each output channel's weight scale clipped to the
    ratio of its range whose rounding moves the layer's output on the calibration data least."""

    candidates: int = Field(20, ge=1, le=100, description=(
        "ratios of the full range tried, 1, (c-1)/c, ..., 1/c (AIMET's 20)"))


class AdaRound(Section):
    """AdaRound (docs/guides/recovery.md): each weight value rounded down or up, the choice learned
    for the layer's output on the calibration data."""

    iterations: int = Field(500, ge=10, le=100000, description=(
        "Adam steps per weight, each over every calibration row (the Gram matrix of the layer's input)"))
    reg_param: float = Field(0.01, gt=0, le=10, description=(
        "lambda, the weight of the regulariser that pushes each value to down or up (AIMET's 0.01)"))


class Recovery(Section):
    """The `recovery:` steps, each absent (off) or with its knobs. Written in YAML as a list of
    step names or one-key mappings (`[smoothquant, {equalization: {iterations: 2}}]`) or as a
    mapping; the order they run in is fixed (equalization, smoothquant, seq_mse, adaround, bias
    correction), not
    the list's."""

    smoothquant: SmoothQuant | None = Field(None, description=(
        "per-input-channel scales moving activation outliers into the weights of MatMul, Gemm and 1x1 Conv"))
    bias_correction: BiasCorrection | None = Field(None, description=(
        "the mean output shift int8 weights add to each channel, measured on the calibration data, taken out of "
        "the bias (needs `--data`)"))
    equalization: Equalization | None = Field(None, description=(
        "cross-layer equalization of Conv -> Conv pairs (through Relu/LeakyRelu/PRelu), depthwise included"))
    seq_mse: SeqMse | None = Field(None, description=(
        "weight scales chosen per output channel by the layer's output error on the calibration data "
        "(needs `--data`)"))
    adaround: AdaRound | None = Field(None, description=(
        "weights rounded down or up as learned for the layer's output on the calibration data, with seq_mse's "
        "scales when it is on too (needs `--data`)"))

    @model_validator(mode="before")
    @classmethod
    def _steps(cls, raw: Any) -> Any:
        if raw is None:
            return {}
        if isinstance(raw, dict):
            raw = {k: ({} if v is None else v) for k, v in raw.items()}
            return raw
        if not isinstance(raw, list):
            return raw
        steps: dict[str, Any] = {}
        for item in raw:
            name, knobs = (item, {}) if isinstance(item, str) else next(iter(item.items()), (None, None)) \
                if isinstance(item, dict) and len(item) == 1 else (None, None)
            if name not in RECOVERY_STEPS:
                close = difflib.get_close_matches(str(name), RECOVERY_STEPS, n=1)
                raise ValueError(f"unknown recovery step {item!r}" + (f": did you mean {close[0]!r}?" if close else "")
                                 + f" (steps: {', '.join(RECOVERY_STEPS)}; each a name or a one-key mapping)")
            if name in steps:
                raise ValueError(f"recovery step {name!r} is given twice")
            steps[name] = {} if knobs is None else knobs
        return steps

    @model_validator(mode="after")
    def _rounding_alone(self) -> Recovery:
        # seq_mse and adaround round on the Gram matrices of the unsmoothed graph's inputs
        if self.rounding and self.smoothquant is not None:
            raise ValueError(f"recovery step {self.rounding[0]} does not combine with smoothquant: drop one of "
                             "the two")
        return self

    @property
    def steps(self) -> list[str]:
        """The steps that are on, in the order they run.

        >>> Recovery.model_construct(bias_correction=BiasCorrection(), equalization=Equalization(),
        ...                          adaround=AdaRound()).steps
        ['equalization', 'adaround', 'bias_correction']
        """
        order = ("equalization", "smoothquant", "seq_mse", "adaround", "bias_correction")
        return [s for s in order if getattr(self, s) is not None]

    @property
    def rounding(self) -> list[str]:
        """The steps that are on and round the weights from the calibration samples, in the
        order they run (seq_mse, adaround)."""
        return [s for s in ROUNDING if getattr(self, s) is not None]

    @property
    def rounds(self) -> bool:
        return bool(self.rounding)


class Prepare(Section):
    """The graph passes qcli may leave out of preparing the float model (qcli.prepare):
    `canonicalize` (exporter idioms rewritten) and `fold_batchnorm`. A verified run leaves out
    a pass the target profile predicts makes the float graph slower than the user's file, and
    writes it here, so the precision config reproduces the model (docs/guides/targets.md)."""

    skip: list[SkippablePass] = Field([], description=(
        "passes not run: `canonicalize` (Sum -> Add, Mul/Add folded into the Conv before, ReduceMean -> "
        "GlobalAveragePool, HardSwish rewrites, ...) and `fold_batchnorm`; a verified run adds the ones "
        "the target profile predicts make your model slower"))

    @field_validator("skip")
    @classmethod
    def _ordered(cls, skip: list[str]) -> list[str]:
        return [name for name in SKIPPABLE_PASSES if name in skip]


class Target(Section):
    """The deployment target decisions are made for (docs/guides/targets.md): a profile (`auto`, a
    shipped name, or a file from `qcli target measure`), the batch the model is served at, and
    the threads it runs on (None: the profile's). `target: NAME` is short for `{profile: NAME}`."""

    profile: str = Field("auto", min_length=1, description=(
        "`auto` (the first shipped measured profile whose CPU flags this CPU has, else `generic`), a shipped "
        "name (`x86-64-avx512vnni`, `generic`, `tensorrt`) or a file from `qcli target measure`"))
    batch: int = Field(1, ge=1, description="the batch the model is served at: latencies are compared there")
    threads: int | None = Field(None, ge=1, description="intra-op threads (`null`: the profile's)")

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        return {"profile": value} if isinstance(value, str) else value
