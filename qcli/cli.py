"""The `qcli` command line: parse options, call the library, render. The only typer module
but clihelp.py (how its help is written).

One error boundary (`_guard`) turns QcliError into `error: ...` plus a hint on stderr and the
error's exit code (2 bad input, 1 a quality gate); anything else is a bug, reported as an
internal error with exit code 3. `--debug` prints the traceback first; the exit code stays.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from qcli import __version__, render
from qcli.clihelp import ClickStyleTyper
from qcli.cliparts import (
    BatchOpt,
    ConfigOpt,
    DebugOpt,
    DropOpt,
    ExecutorOpt,
    JsonOpt,
    MaxLatencyOpt,
    MethodOpt,
    MinCosineOpt,
    MinSpatialOpt,
    MinTop1Opt,
    PercentileOpt,
    PrecisionOutOpt,
    QuietOpt,
    RayAddressOpt,
    SamplesOpt,
    SearchTimeOpt,
    SeqLenOpt,
    SizeOpt,
    StrictOpt,
    WorkersOpt,
    guard,
)

if TYPE_CHECKING:
    from qcli.commands import QuantizeRun


app = ClickStyleTyper(
    name="qcli",
    help="Quantize float ONNX models into fast, small, accurate QDQ models, and prove it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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


def _console(quiet: bool) -> Console:
    """The console for results. Strings from models and data reach it escaped (`render.plain`,
    `rich.markup.escape`) or printed with markup=False: "[batch, seq]" is a shape, not a tag."""
    return Console(quiet=quiet, highlight=False)


def _print_json(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(help="ONNX model file.")],
    data: Annotated[Path | None, typer.Option("--data", help="Also check a data folder against the model.")] = None,
    config: ConfigOpt = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Check only the first N samples.")] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show a model's opsets, inputs/outputs, op types, weights and subgraphs."""

    def work() -> None:
        from qcli import commands

        info = commands.inspect_command(model, data, config=config, samples=samples)
        if json_out:
            _print_json(info)
            return
        console = _console(quiet)
        render.model_info(console, info)
        if "data" in info:
            render.data_info(console, info["data"])

    guard(debug, work)


def _progress(quiet: bool) -> Callable[..., Any]:
    """Progress bars on stderr: (description, total, unit=...) -> a context giving advance(n)."""
    return partial(render.progress_bar, quiet=quiet)


@app.command()
def calibrate(
    model: Annotated[Path, typer.Argument(help="ONNX model file.")],
    data: Annotated[Path, typer.Option("--data", help="Data folder of calibration samples.")],
    method: MethodOpt = None,
    percentile: PercentileOpt = None,
    samples: SamplesOpt = None,
    batch_size: BatchOpt = None,
    seq_len: SeqLenOpt = None,
    config: ConfigOpt = None,
    strict: StrictOpt = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Calibration file (default ./<model>.calib.json).")
    ] = None,
    trt_cache: Annotated[
        Path | None, typer.Option("--trt-cache", help="Also write TensorRT's calibration cache of the ranges.")
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
        from qcli import commands
        from qcli.flags import CalibrateFlags, CalibrationFlags, ScaleFlags

        flags = CalibrateFlags(
            model, data, output, CalibrationFlags(config, method, percentile, samples, batch_size, seq_len), strict,
            ScaleFlags(executor, workers, ray_address), trt_cache,
        )
        doc = commands.calibrate_command(flags, progress=_progress(quiet or json_out))
        if json_out:
            _print_json(doc)
        else:
            render.calibration(_console(quiet), doc)

    guard(debug, work)


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
    seq_len: SeqLenOpt = None,
    config: ConfigOpt = None,
    strict: StrictOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="Quantize a model that already has Q/DQ or integer ops.")
    ] = False,
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
    max_size_mb: SizeOpt = None,
    max_trials: Annotated[int | None, typer.Option("--max-trials", help="Candidate models the search may try.")] = None,
    time_budget: SearchTimeOpt = None,
    precision_out: PrecisionOutOpt = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the comparison with the float model.")] = False,
    no_rescue: Annotated[
        bool, typer.Option("--no-rescue", help="When a floor is missed, fail without searching precisions.")
    ] = False,
    min_top1_agreement: MinTop1Opt = None,
    min_cosine: MinCosineOpt = None,
    min_spatial_agreement: MinSpatialOpt = None,
    max_latency_ratio: MaxLatencyOpt = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Rewrite a float model into a QDQ model onnxruntime runs with int8 kernels, then verify it."""

    def work() -> None:
        from qcli import commands
        from qcli.flags import CalibrationFlags, QuantizeFlags, ScaleFlags

        flags = QuantizeFlags(
            model, output, data, calib, CalibrationFlags(config, method, percentile, samples, batch_size, seq_len),
            strict=strict, force=force, eval_data=eval_data, max_accuracy_drop=max_accuracy_drop,
            auto_precision=auto_precision, criteria=criteria, min_speedup=min_speedup, max_size_mb=max_size_mb,
            max_trials=max_trials, time_budget=time_budget, precision_out=precision_out, no_verify=no_verify,
            no_rescue=no_rescue, min_top1_agreement=min_top1_agreement, min_cosine=min_cosine,
            min_spatial_agreement=min_spatial_agreement, max_latency_ratio=max_latency_ratio,
            scale=ScaleFlags(executor, workers, ray_address),
        )
        run = commands.quantize_command(flags, progress=_progress(quiet or json_out))
        if json_out:
            _print_json(run.doc)
        else:
            _show_quantization(_console(quiet), run)
        if (error := run.gate_error()) is not None:
            raise error

    guard(debug, work)


def _show_quantization(console: Console, run: QuantizeRun) -> None:
    """What `qcli quantize` did, its verification, and the accuracy on --eval-data."""
    render.quantization(console, run.doc)
    render.verification(console, run.doc)
    if run.evaluation is not None:
        console.print(run.doc["evaluation"]["summary"], markup=False)
        for gate in run.evaluation.gates:
            console.print(gate.message, markup=False)


@app.command()
def analyze(
    model: Annotated[Path, typer.Argument(help="Float ONNX model.")],
    quantized: Annotated[Path, typer.Argument(help="Quantized ONNX model.")],
    data: Annotated[Path, typer.Option("--data", help="Evaluation data folder (labels give top-1).")],
    labels: Annotated[Path | None, typer.Option("--labels", help="labels.csv (file,label) kept outside DIR.")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write FILE.json, FILE.md or FILE.html.")] = None,
    max_accuracy_drop: DropOpt = None,
    min_speedup: Annotated[
        float | None, typer.Option("--min-speedup", help="Gate: float / quantized median latency.")
    ] = None,
    min_compression: Annotated[
        float | None, typer.Option("--min-compression", help="Gate: float / quantized file size.")
    ] = None,
    min_decode_speedup: Annotated[
        float | None, typer.Option("--min-decode-speedup", help="Gate: a decoder's decode tokens/s, quantized / float.")
    ] = None,
    min_memory_reduction: Annotated[
        float | None, typer.Option("--min-memory-reduction",
                                   help="Gate: the weights onnxruntime holds to run each model, float / quantized.")
    ] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Use the first N samples (default all).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per batch for accuracy.")] = 32,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per model (0: no latency).")] = 50,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs first.")] = 5,
    threads: Annotated[
        int | None, typer.Option("--threads", help="onnxruntime intra-op threads (default: all cores).")
    ] = None,
    latency_batch: Annotated[int, typer.Option("--latency-batch", help="Batch size of the timed runs.")] = 1,
    seq_len: SeqLenOpt = None,
    worst: Annotated[int, typer.Option("--worst", help="Layers listed in the worst-layers table.")] = 10,
    config: ConfigOpt = None,
    sensitivity: Annotated[
        bool, typer.Option("--sensitivity", help="Rank the quantized units: each alone, and each kept float "
                           "(rebuilt from QUANTIZED's metadata, calibrated on DIR).")
    ] = False,
    max_trials: Annotated[
        int | None, typer.Option("--max-trials", help="Candidate models --sensitivity may measure (default 200).")
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option("--time-budget", help="Seconds after which --sensitivity says it ran long (see --max-trials)."),
    ] = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Accuracy, per-layer error, speedup and compression of a quantized model; gates exit 1."""

    def work() -> None:
        from qcli import commands
        from qcli.analyze import AnalyzeOptions, Gates
        from qcli.analyze import render as show
        from qcli.flags import ScaleFlags, SensitivityFlags

        options = AnalyzeOptions.of(
            samples=samples, batch_size=batch_size, runs=runs, warmup=warmup, threads=threads,
            latency_batch=latency_batch, worst=worst,
        )
        gates = Gates(max_accuracy_drop, min_speedup, min_compression, min_decode_speedup, min_memory_reduction)
        result = commands.analyze_command(
            model, quantized, data, options, labels=labels, gates=gates, config=config, report=report,
            seq_len=seq_len, progress=_progress(quiet or json_out),
            sensitivity=SensitivityFlags(sensitivity, max_trials, time_budget,
                                         ScaleFlags(executor, workers, ray_address)),
        )
        if json_out:
            _print_json(result.to_dict())
        else:
            show(_console(quiet), result)
            if report is not None:
                _console(quiet).print(f"wrote {report}", markup=False)
        if (error := result.gate_error()) is not None:
            raise error

    guard(debug, work)


@app.command("run")
def run_pipeline(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML: model, output, data, config, gates, reports.")],
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Calibrate, quantize and analyze in one go, as a pipeline file says (for CI)."""

    def work() -> None:
        from qcli import commands
        from qcli.analyze import render as show

        run = commands.run_command(pipeline, progress=_progress(quiet or json_out))
        result, doc = run.result, run.doc
        if json_out:
            _print_json(doc)
        else:
            console = _console(quiet)
            quantized = doc["quantization"]["quantized"]
            console.print(
                f"quantized {sum(quantized.values())} nodes "
                f"({', '.join(f'{k} {v}' for k, v in quantized.items())}); wrote {result.output}",
                markup=False,
            )
            for note in result.outcome.notes:
                console.print(note, markup=False)
            render.verification(console, doc)
            if result.report is not None:
                show(console, result.report)
            for p in result.reports:
                console.print(f"wrote {p}", markup=False)
        if (error := run.gate_error()) is not None:
            raise error

    guard(debug, work)


config_app = ClickStyleTyper(help="Show, check and create YAML configs.", no_args_is_help=True)
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

    guard(debug, work)


@config_app.command("validate")
def config_validate(
    file: Annotated[str, typer.Argument(help="YAML config file or preset name.")],
    json_out: JsonOpt = False, quiet: QuietOpt = False, debug: DebugOpt = False,
) -> None:
    """Check a config file against the schema; exit 2 with file:line and key on error."""

    def work() -> None:
        from qcli.config import load_config, resolve_config

        load_config(file)
        if json_out:
            _print_json({"config": str(resolve_config(file)), "valid": True})
        else:
            _console(quiet).print(f"{resolve_config(file)}: valid", markup=False)

    guard(debug, work)


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
        from qcli.commands import init_config

        init_config(output, force)
        if json_out:
            _print_json({"config": str(output)})
        else:
            _console(quiet).print(f"wrote {output}", markup=False)

    guard(debug, work)


target_app = ClickStyleTyper(help="Measure and show target profiles (what latency decisions rest on).",
                              no_args_is_help=True)
app.add_typer(target_app, name="target")


@target_app.command("measure")
def target_measure(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Profile file to write (default "
                                                 "./<profile-name>.json).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="Intra-op threads the model is served with "
                                                "(default: onnxruntime's, one per core).", min=1)] = None,
    name: Annotated[str | None, typer.Option("--name", help="The profile's name (default: this CPU's ISA).")] = None,
    batch: Annotated[int, typer.Option("--batch", help="The batch the model is served at: the micro-models run at "
                                       "it (pair it with `target: {batch: B}`).", min=1)] = 1,
    model: Annotated[Path | None, typer.Option("--model", help="Calibrate --from's profile on this model instead: "
                                               "it and its all-int8 model timed here (needs --data).")] = None,
    data: Annotated[Path | None, typer.Option("--data", help="With --model: a data folder (calibrates the int8 "
                                              "model; its first sample is timed).")] = None,
    config: Annotated[str | None, typer.Option("--config", help="With --model: the config the int8 model is "
                                               "written with (and its target.batch, target.threads).")] = None,
    base: Annotated[str, typer.Option("--from", help="With --model: the profile to calibrate (auto, a shipped "
                                      "name or a file).")] = "auto",
    json_out: JsonOpt = False, quiet: QuietOpt = False, debug: DebugOpt = False,
) -> None:
    """Measure this machine's kernel costs into a target profile (run it on the deployment CPU)."""

    def work() -> None:
        from qcli.commands import calibrate_target, measure_target

        if model is not None:
            doc = calibrate_target(model, data, output, base, config, name, progress=_progress(quiet or json_out))
        else:
            doc = measure_target(output, threads, name, batch, progress=_progress(quiet or json_out))
        if json_out:
            _print_json(doc)
        elif model is not None:
            _console(quiet).print(f"wrote {doc['path']}: {doc['said']}; use it with `target: {doc['path']}`",
                                  markup=False)
        else:
            _console(quiet).print(f"wrote {doc['path']}: {doc['name']}, {doc['entries']} kernel entries from "
                                  f"{doc['models']} micro-models in {doc['seconds']:.0f} s; use it with "
                                  f"`target: {doc['path']}`", markup=False)

    guard(debug, work)


@target_app.command("show")
def target_show(
    profile: Annotated[str, typer.Argument(help="auto, a shipped profile's name, or a profile file.")] = "auto",
    json_out: JsonOpt = False, quiet: QuietOpt = False, debug: DebugOpt = False,
) -> None:
    """Show a target profile: what it rests on and each kernel entry's terms."""

    def work() -> None:
        from qcli.target import resolve, shipped

        found, chosen = resolve(profile)
        doc = {**found.model_dump(exclude_none=True), "chosen": chosen, "shipped": shipped()}
        if json_out:
            _print_json(doc)
        else:
            render.target_profile(_console(quiet), doc)

    guard(debug, work)


def run() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    run()
