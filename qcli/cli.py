"""The `qcli` command line: parse options, call the library, render. The only typer module.

One error boundary (`_guard`) turns QcliError into `error: ...` plus a hint on stderr and the
error's exit code (2 bad input, 1 a quality gate); anything else is a bug, reported as an
internal error with exit code 3. `--debug` lets every exception through with its traceback.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from functools import partial
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from qcli import __version__, render
from qcli.errors import QcliError

def _click_style(params: list) -> list:
    """Name parameters in help as click does: a flag takes no value (typer's help prints `--json
    <bool>`; an empty metavar prints nothing), an argument is named in capitals (MODEL)."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
        elif isinstance(param, TyperArgument) and param.metavar is None and param.name:
            param.metavar = param.name.upper()
    return params


class _Command(TyperCommand):
    """A command whose help shows flags without a value and arguments by name (`_click_style`)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _click_style(super().get_params(ctx))  # includes the --help option typer adds

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        """The usage line as click writes it: `MODEL` for a required argument (typer: `{model}`)."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.metavar if param.required else f"[{param.metavar}]"
                pieces.append(f"{name}..." if param.nargs != 1 else str(name))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class _Group(TyperGroup):
    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _click_style(super().get_params(ctx))


class _Typer(typer.Typer):
    """typer.Typer whose commands and groups write click-style help (`_Command`, `_Group`)."""

    def __init__(self, **kwargs: Any):
        super().__init__(cls=_Group, **kwargs)

    def command(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        return super().command(*args, cls=_Command, **kwargs)


app = _Typer(
    name="qcli",
    help="Quantize float ONNX models into fast, small, accurate QDQ models, and prove it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

INTERNAL_ERROR = 3

# Options shared by every command, declared once.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")]
ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", help="YAML config file, or a preset: default, tensorrt, accuracy, weights-int4."),
]
DropOpt = Annotated[
    float | None,
    typer.Option("--max-accuracy-drop", help="Gate: largest allowed top-1 drop as a fraction (0.01 = 1 point)."),
]
StrictOpt = Annotated[bool, typer.Option("--strict", help="A config rule that matches nothing is an error.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"qcli {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """qcli: calibrate, quantize and analyze ONNX models."""


def _guard(debug: bool, work: Callable[[], Any]) -> Any:
    """Run `work`; map library errors to a message and an exit code."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return work()
    except QcliError as exc:
        if debug:
            raise
        err.print(f"[bold red]error:[/bold red] {escape(exc.message)}", markup=True)
        if exc.hint:
            err.print(f"hint: {exc.hint}", markup=False)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:
        if debug:
            raise
        err.print(f"[bold red]internal error:[/bold red] {escape(f'{type(exc).__name__}: {exc}')}", markup=True)
        err.print("hint: this is a bug in qcli; rerun with --debug and report the traceback")
        raise typer.Exit(INTERNAL_ERROR) from None


def _console(quiet: bool) -> Console:
    """The console for results. Strings from models and data reach it escaped (`render.plain`,
    `rich.markup.escape`) or printed with markup=False: "[batch, seq]" is a shape, not a tag."""
    return Console(quiet=quiet, highlight=False)


def _print_json(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(help="ONNX model file.")],
    data: Annotated[
        Path | None, typer.Option("--data", help="Also check a data folder against the model.")
    ] = None,
    config: ConfigOpt = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Check only the first N samples.")] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show a model's opsets, inputs/outputs, op types, weights and subgraphs."""

    def work() -> None:
        from qcli.config import load_preprocess
        from qcli.data import DataFolder, model_inputs
        from qcli.info import describe_data, describe_model
        from qcli.model import load_model

        info = describe_model(model)
        if data is not None:
            folder = DataFolder(
                data,
                model_inputs(load_model(model)),
                preprocess=load_preprocess(config),
                samples=samples,
            )
            info["data"] = describe_data(folder)
        if json_out:
            _print_json(info)
            return
        console = _console(quiet)
        render.model_info(console, info)
        if "data" in info:
            render.data_info(console, info["data"])

    _guard(debug, work)


MethodOpt = Annotated[
    str | None,
    typer.Option("--method", help="Range method: minmax, percentile, kl or mse (config: calibration.method)."),
]
PercentileOpt = Annotated[
    float | None, typer.Option("--percentile", help="Percentile for --method percentile (default 99.999).")
]
SamplesOpt = Annotated[int | None, typer.Option("--samples", help="Use the first N samples (default 256).")]
BatchOpt = Annotated[int | None, typer.Option("--batch-size", help="Samples per inference batch (default 8).")]
ExecutorOpt = Annotated[
    str,
    typer.Option("--executor", help="Where calibration and precision-search trials run: local (processes on "
                 "this machine) or ray (a Ray cluster)."),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option("--workers", help="Calibration shards (and search trials) run at once (local default 1; ray "
                 "default: the cluster's CPUs)."),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option("--ray-address", help="Ray cluster to use (host:port or 'auto'; default: start a local one)."),
]


def _executor(kind: str, workers: int | None, address: str | None):
    """The executor the scale-out flags ask for (local defaults to one worker: README)."""
    from qcli.executor import make_executor

    return make_executor(kind, 1 if workers is None and kind == "local" else workers, address)


def _calibration_config(config: str | None, method, percentile, samples, batch_size):
    from qcli.config import load_config

    return load_config(config).merged(
        calibration={"method": method, "percentile": percentile, "samples": samples, "batch_size": batch_size}
    )


@app.command()
def calibrate(
    model: Annotated[Path, typer.Argument(help="ONNX model file.")],
    data: Annotated[Path, typer.Option("--data", help="Data folder of calibration samples.")],
    method: MethodOpt = None,
    percentile: PercentileOpt = None,
    samples: SamplesOpt = None,
    batch_size: BatchOpt = None,
    config: ConfigOpt = None,
    strict: StrictOpt = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Calibration file (default ./<model>.calib.json).")
    ] = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run the model over a data folder once and compute every range method's ranges."""

    def work() -> None:
        import time

        from qcli.quantize import calibrate as run_calibration
        from qcli.calibrate.table import METHODS, save_table
        from qcli.data import DataFolder, model_inputs
        from qcli.model import load_model

        cfg = _calibration_config(config, method, percentile, samples, batch_size)
        onnx_model = load_model(model)
        folder = DataFolder(
            data, model_inputs(onnx_model), preprocess=cfg.data.preprocess, samples=cfg.calibration.samples
        )
        out = output or Path.cwd() / f"{model.name.removesuffix('.onnx')}.calib.json"
        start = time.perf_counter()
        with _executor(executor, workers, ray_address) as pool, render.progress_bar(
            "calibrating", total=len(folder), quiet=quiet or json_out
        ) as advance:
            table = run_calibration(onnx_model, folder, cfg, progress=advance, strict=strict, executor=pool)
        save_table(table, out)
        seconds = time.perf_counter() - start
        doc = {
            "calibration_file": str(out),
            "samples": table.samples,
            "tensors": len(table.observers),
            "method": table.settings.method,
            "activations": f"{table.settings.dtype}{' symmetric' if table.settings.symmetric else ''}",
            "seconds": round(seconds, 3),
            "warnings": table.warnings,
            "ranges": {
                name: {
                    "min": obs.min if obs.count else None,
                    "max": obs.max if obs.count else None,
                    **{m: list(table.ranges[m][name]) for m in METHODS},
                    "clipped": table.clipped(name),
                }
                for name, obs in table.observers.items()
            },
        }
        if json_out:
            _print_json(doc)
        else:
            render.calibration(_console(quiet), doc)

    _guard(debug, work)


@app.command()
def quantize(
    model: Annotated[Path, typer.Argument(help="Float ONNX model file (never modified).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the quantized model.")],
    data: Annotated[Path | None, typer.Option("--data", help="Calibrate on this data folder first.")] = None,
    calib: Annotated[Path | None, typer.Option("--calib", help="Use this calibration file.")] = None,
    method: MethodOpt = None,
    percentile: PercentileOpt = None,
    samples: SamplesOpt = None,
    batch_size: BatchOpt = None,
    config: ConfigOpt = None,
    strict: StrictOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Quantize a model that already has Q/DQ or integer ops.")] = False,
    eval_data: Annotated[
        Path | None,
        typer.Option("--eval-data", help="Verify (and search precisions) on this data; report accuracy with labels."),
    ] = None,
    max_accuracy_drop: DropOpt = None,
    auto_precision: Annotated[
        bool, typer.Option("--auto-precision", help="Search per-node precisions to meet an accuracy budget.")
    ] = False,
    criteria: Annotated[
        str | None, typer.Option("--criteria", help="Auto-precision goal: performance, balanced, accuracy or custom.")
    ] = None,
    min_speedup: Annotated[
        float | None, typer.Option("--min-speedup", help="Auto-precision speed floor: float / quantized latency.")
    ] = None,
    max_trials: Annotated[int | None, typer.Option("--max-trials", help="Candidate models the search may try.")] = None,
    time_budget: Annotated[float | None, typer.Option("--time-budget", help="Seconds the search may take.")] = None,
    precision_out: Annotated[
        Path | None, typer.Option("--precision-out", help="Where to write the chosen precisions (YAML config).")
    ] = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the comparison with the float model.")] = False,
    no_rescue: Annotated[
        bool, typer.Option("--no-rescue", help="When a floor is missed, fail without searching precisions.")
    ] = False,
    min_top1_agreement: Annotated[
        float | None, typer.Option("--min-top1-agreement", help="Verification floor for class-score outputs.")
    ] = None,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Verification floor for other outputs.")] = None,
    max_latency_ratio: Annotated[
        float | None, typer.Option("--max-latency-ratio", help="Verification ceiling: quantized / float latency.")
    ] = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Rewrite a float model into a QDQ model onnxruntime runs with int8 kernels, then verify it."""

    def work() -> None:
        import os

        from qcli.calibrate.table import load_table
        from qcli.errors import GateFailed, QcliError
        from qcli.info import file_bytes
        from qcli.model import fingerprint, load_model, save_model
        from qcli.quantize import summary
        from qcli.verify import quantize_checked

        if (data is None) == (calib is None):
            raise QcliError("give exactly one of --data DIR (calibrate now) or --calib FILE")
        if calib is not None and not auto_precision and (workers is not None or executor != "local" or ray_address is not None):
            raise QcliError("--executor, --workers and --ray-address apply to calibration and the precision "
                            "search: use them with --data or --auto-precision")
        if max_accuracy_drop is not None and eval_data is None and not auto_precision:
            raise QcliError("--max-accuracy-drop needs --eval-data DIR to measure the drop on")
        if output.exists() and model.exists() and os.path.samefile(output, model):
            raise QcliError(f"-o {output} is the input model; qcli never overwrites its input",
                            hint="write the quantized model to another file")
        onnx_model = load_model(model)
        cfg = _calibration_config(config, method, percentile, samples, batch_size).merged(
            verify={
                "enabled": False if no_verify else None, "rescue": False if no_rescue else None,
                "min_top1_agreement": min_top1_agreement, "min_cosine": min_cosine,
                "max_latency_ratio": max_latency_ratio,
            },
            auto_precision={
                "enabled": True if auto_precision else None, "criteria": criteria,
                "max_accuracy_drop": max_accuracy_drop if auto_precision else None,
                "min_speedup": min_speedup, "max_trials": max_trials, "time_budget": time_budget,
            },
        )
        if not cfg.auto_precision.enabled and (criteria or min_speedup or precision_out):
            raise QcliError("--criteria, --min-speedup and --precision-out go with --auto-precision")
        table = None
        if calib is not None:
            table = load_table(calib, fingerprint(onnx_model))
            # The file's own method applies unless the command line or the config chose one.
            chosen = load_config_fields(config)
            cfg = cfg.merged(calibration={
                "method": None if method or "method" in chosen else table.settings.method,
                "percentile": None if percentile or "percentile" in chosen else table.settings.percentile,
            })

        bar = partial(render.progress_bar, quiet=quiet or json_out)  # (description, total, unit=...)

        with _executor(executor, workers, ray_address) if data is not None or auto_precision else nullcontext() as pool:
            outcome = quantize_checked(
                onnx_model, cfg, data=data, table=table, eval_data=eval_data, force=force, strict=strict,
                progress=bar, executor=pool,
            )
        result = outcome.result
        save_model(result.model, output, check=True)
        doc = {
            "output": str(output),
            "method": cfg.calibration.method,
            "activations": cfg.activations.dtype,
            "weights": f"{cfg.weights.dtype} {cfg.weights.granularity}",
            "bytes_before": file_bytes(model),
            "bytes_after": file_bytes(output),
            **summary(result),
        }
        doc["compression"] = round(doc["bytes_before"] / max(doc["bytes_after"], 1), 3)
        doc["notes"] = doc["notes"] + outcome.notes
        doc["verification"] = outcome.verification.to_dict() if outcome.verification else None
        doc["precision"] = _precision_doc(outcome, output, precision_out)
        evaluation = None
        if eval_data is not None:
            from qcli.analyze import evaluate, headline

            evaluation = evaluate(
                onnx_model, output, eval_data, max_accuracy_drop=max_accuracy_drop, preprocess=cfg.data.preprocess
            )
            doc["evaluation"] = {"summary": headline(evaluation), **evaluation.to_dict()}
        if json_out:
            _print_json(doc)
        else:
            console = _console(quiet)
            render.quantization(console, doc)
            render.verification(console, doc)
            if evaluation is not None:
                console.print(doc["evaluation"]["summary"], markup=False)
                for gate in evaluation.gates:
                    console.print(gate.message, markup=False)
        _check_outcome(outcome, output)
        if evaluation is not None and (error := evaluation.gate_error()) is not None:
            raise error

    _guard(debug, work)


def _check_outcome(outcome, output: Path) -> None:
    """GateFailed (exit 1) when verification missed a floor or auto-precision its goal."""
    from qcli.errors import GateFailed

    cfg = outcome.config
    if outcome.verification is not None and not outcome.verification.passed:
        missed = [c for c in outcome.verification.checks if not c.passed]
        raise GateFailed(
            "verification failed: " + "; ".join(
                f"{c.name} {c.value:.4f} misses its floor {c.floor:g} by {abs(c.value - c.floor):.4f}" for c in missed
            ) + f" (wrote the best model found: {output})",
            hint=_what_to_try(outcome, missed),
        )
    if outcome.search is not None and outcome.searched_for_goal and not outcome.goal_met:
        raise GateFailed(
            f"auto-precision could not meet its goal ({cfg.auto_precision.criteria}, max accuracy drop "
            f"{cfg.auto_precision.max_accuracy_drop:g}); wrote the best model found: {output}",
            hint="raise --max-accuracy-drop, add candidates (int16, float), or raise --max-trials/--time-budget",
        )


def _precision_doc(outcome, output: Path, precision_out: Path | None) -> dict | None:
    """Write the precision config (when a search ran and promoted, or auto-precision ran) and
    describe the search for the summary."""
    from qcli.config import config_yaml
    from qcli.files import write_text_atomic

    found = outcome.search
    if found is None:
        return None
    path = None
    if outcome.promoted or outcome.searched_for_goal or precision_out is not None:
        path = precision_out or output.with_name(f"{output.name.removesuffix('.onnx')}.precision.yaml")
        header = (
            f"# qcli {__version__}: the precisions chosen for {output.name}.\n"
            f"# `qcli quantize MODEL --config {path.name} ...` (same data and calibration) reproduces it without searching.\n"
        )
        write_text_atomic(path, header + config_yaml(outcome.config))
    return {
        "file": str(path) if path else None,
        "goal_met": found.met,
        "trials": found.trials,
        "stopped": found.stopped,
        "promoted": {n: {"precision": p, "reason": outcome.reasons.get(n, "")} for n, p in outcome.promoted.items()},
        "steps": [
            {"action": s.action, "changed": s.changed, "promoted": s.promoted, "drop": s.drop, "noise": s.noise,
             "latency_ratio": s.latency_ratio, "kept": s.kept, "quick": s.quick}
            for s in found.steps
        ],
    }


def _what_to_try(outcome, missed) -> str:
    names = {c.name for c in missed}
    tips = []
    if names & {"top-1 agreement", "cosine"}:
        tips.append("exclude or promote the sensitive layers in a --config (see the layer table of qcli analyze)")
        if not outcome.config.verify.rescue:
            tips.append("drop --no-rescue to let qcli search")
        elif outcome.search is not None and outcome.search.stopped:
            tips.append("give the rescue more room (verify.max_trials, verify.time_budget)")
    if "latency ratio" in names:
        tips.append("raise --max-latency-ratio, or keep the model float if int8 does not pay off here")
    tips.append("--no-verify skips the check")
    return "; ".join(tips)


def load_config_fields(config: str | None) -> set[str]:
    """Keys the config file sets explicitly in its calibration section."""
    from qcli.config import load_config

    return set(load_config(config).calibration.model_fields_set) if config else set()


@app.command()
def analyze(
    model: Annotated[Path, typer.Argument(help="Float ONNX model.")],
    quantized: Annotated[Path, typer.Argument(help="Quantized ONNX model.")],
    data: Annotated[Path, typer.Option("--data", help="Evaluation data folder (labels give top-1).")],
    labels: Annotated[Path | None, typer.Option("--labels", help="labels.csv (file,label) kept outside DIR.")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write FILE.json, FILE.md or FILE.html.")] = None,
    max_accuracy_drop: DropOpt = None,
    min_speedup: Annotated[float | None, typer.Option("--min-speedup", help="Gate: float / quantized median latency.")] = None,
    min_compression: Annotated[float | None, typer.Option("--min-compression", help="Gate: float / quantized file size.")] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Use the first N samples (default all).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per batch for accuracy.")] = 32,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per model (0: no latency).")] = 50,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs first.")] = 5,
    threads: Annotated[int | None, typer.Option("--threads", help="onnxruntime intra-op threads (default: all cores).")] = None,
    latency_batch: Annotated[int, typer.Option("--latency-batch", help="Batch size of the timed runs.")] = 1,
    worst: Annotated[int, typer.Option("--worst", help="Layers listed in the worst-layers table.")] = 10,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Accuracy, per-layer error, speedup and compression of a quantized model; gates exit 1."""

    def work() -> None:
        from qcli.analyze import Gates, render as show, sample_count, write_report
        from qcli.analyze import analyze as run_analysis
        from qcli.config import AnalyzeOptions, load_preprocess

        pre = load_preprocess(config)
        gates = Gates(max_accuracy_drop, min_speedup, min_compression)
        total = sample_count(model, data, samples=samples, preprocess=pre)
        options = AnalyzeOptions.of(
            samples=samples, batch_size=batch_size, runs=runs, warmup=warmup, threads=threads,
            latency_batch=latency_batch, worst=worst,
        )
        with render.progress_bar("analyzing", total=total, quiet=quiet or json_out) as advance:
            result = run_analysis(
                model, quantized, data, options, labels=labels, gates=gates, preprocess=pre, progress=advance
            )
        if report is not None:
            write_report(result, report)
        if json_out:
            _print_json(result.to_dict())
        else:
            show(_console(quiet), result)
            if report is not None:
                _console(quiet).print(f"wrote {report}", markup=False)
        error = result.gate_error()
        if error is not None:
            raise error

    _guard(debug, work)


@app.command("run")
def run_command(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML: model, output, data, config, gates, reports.")],
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Calibrate, quantize and analyze in one go, as a pipeline file says (for CI)."""

    def work() -> None:
        from qcli.analyze import render as show
        from qcli.pipeline import run_pipeline
        from qcli.quantize import summary

        bar = partial(render.progress_bar, quiet=quiet or json_out)  # (description, total, unit=...)

        result = run_pipeline(pipeline, progress=bar)
        outcome = result.outcome
        doc = {
            "output": str(result.output),
            "calibration_file": str(result.calibration_file) if result.calibration_file else None,
            "quantization": summary(result.quantized),
            "verification": outcome.verification.to_dict() if outcome.verification else None,
            "precision": _precision_doc(outcome, result.output, None),
            "reports": [str(p) for p in result.reports],
            "analysis": result.report.to_dict() if result.report else None,
        }
        if json_out:
            _print_json(doc)
        else:
            console = _console(quiet)
            q = doc["quantization"]
            console.print(
                f"quantized {sum(q['quantized'].values())} nodes "
                f"({', '.join(f'{k} {v}' for k, v in q['quantized'].items())}); wrote {result.output}",
                markup=False,
            )
            for note in outcome.notes:
                console.print(note, markup=False)
            render.verification(console, doc)
            if result.report is not None:
                show(console, result.report)
            for p in result.reports:
                console.print(f"wrote {p}", markup=False)
        _check_outcome(outcome, result.output)
        if result.report is not None and (error := result.report.gate_error()) is not None:
            raise error

    _guard(debug, work)


config_app = _Typer(help="Show, check and create YAML configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    config: ConfigOpt = None, json_out: JsonOpt = False, quiet: QuietOpt = False, debug: DebugOpt = False
) -> None:
    """Print the resolved config (defaults filled in) as YAML."""

    def work() -> None:
        from qcli.config import config_document, config_yaml, load_config

        cfg = load_config(config)
        if json_out:
            _print_json(config_document(cfg))
        elif not quiet:
            sys.stdout.write(config_yaml(cfg))

    _guard(debug, work)


@config_app.command("validate")
def config_validate(
    file: Annotated[str, typer.Argument(help="YAML config file or preset name.")],
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check a config file against the schema; exit 2 with file:line and key on error."""

    def work() -> None:
        from qcli.config import load_config, resolve_config

        load_config(file)
        if json_out:
            _print_json({"config": str(resolve_config(file)), "valid": True})
        else:
            _console(quiet).print(f"{resolve_config(file)}: valid", markup=False)

    _guard(debug, work)


@config_app.command("init")
def config_init(
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the template.")] = Path("qcli.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write a commented config template (the default preset) to start from."""

    def work() -> None:
        from qcli.config import PRESETS
        from qcli.errors import QcliError

        if output.exists() and not force:
            raise QcliError(f"{output} exists", hint="choose another path with -o, or --force to overwrite")
        output.write_text((PRESETS / "default.yaml").read_text())
        if json_out:
            _print_json({"config": str(output)})
        else:
            _console(quiet).print(f"wrote {output}", markup=False)

    _guard(debug, work)


def run() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    run()
