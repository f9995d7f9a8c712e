"""What every qcli command shares: its options, declared once, and how an error becomes a
message on stderr and an exit code (0 ok, 1 a gate failed, 2 bad input, 3 a bug, 130 Ctrl-C)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from qcli.errors import QcliError

BAD_INPUT, INTERNAL_ERROR = 2, 3

# Options shared by every command, declared once.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")]
ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", help="YAML config file, or a preset: default, dynamic, tensorrt, accuracy, weights-int4, "
                 "llm-int4, llm-int8, llm-mixed, llm-awq, llm-hqq."),
]
DropOpt = Annotated[
    float | None,
    typer.Option("--max-accuracy-drop", help="Gate: largest allowed top-1 drop as a fraction (0.01 = 1 point)."),
]
SearchTimeOpt = Annotated[float | None, typer.Option(
    "--time-budget", help="Seconds after which the summary says the search ran long (--max-trials stops it).")]
PrecisionOutOpt = Annotated[
    Path | None, typer.Option("--precision-out", help="Where to write the chosen precisions (YAML config).")]
SizeOpt = Annotated[float | None, typer.Option(
    "--max-size-mb", help="Auto-precision size budget in MB: int4 weights where they cost least, until it fits.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="A config rule that matches nothing is an error.")]

MethodOpt = Annotated[
    str | None,
    typer.Option("--method", help="Range method: minmax, percentile, kl or mse (config: calibration.method)."),
]
PercentileOpt = Annotated[
    float | None, typer.Option("--percentile", help="Percentile for --method percentile (default 99.999).")
]
SamplesOpt = Annotated[int | None, typer.Option("--samples", help="Use the first N samples (default 256).")]
BatchOpt = Annotated[int | None, typer.Option("--batch-size", help="Samples per inference batch (default 8).")]
SeqLenOpt = Annotated[int | None, typer.Option(
    "--seq-len", help="A text data folder's chunk length in tokens (default 128; config: data.seq_len).")]
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
# verify's floors (`verify.*` in the config)
MinTop1Opt = Annotated[
    float | None, typer.Option("--min-top1-agreement", help="Verification floor for class-score outputs.")]
MinCosineOpt = Annotated[float | None, typer.Option("--min-cosine", help="Verification floor for other outputs.")]
MinSpatialOpt = Annotated[
    float | None, typer.Option("--min-spatial-agreement", help="Verification floor for maps and boxes.")]
MaxLatencyOpt = Annotated[
    float | None, typer.Option("--max-latency-ratio", help="Verification ceiling: quantized / float latency.")]
RayAddressOpt = Annotated[
    str | None,
    typer.Option("--ray-address", help="Ray cluster to use (host:port or 'auto'; default: start a local one)."),
]


def guard(debug: bool, work: Callable[[], Any]) -> Any:
    """Run `work`; map its errors to a message and an exit code (`--debug` adds the traceback)."""
    try:
        return work()
    except (Exception, KeyboardInterrupt) as exc:
        if debug:
            sys.stderr.write(traceback.format_exc())
        raise typer.Exit(_report(exc, debug)) from None


def _report(exc: BaseException, debug: bool) -> int:
    """Say on stderr what went wrong; the exit code: the error's own, 130 on Ctrl-C, else 3 (a bug)."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if isinstance(exc, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    if isinstance(exc, MemoryError):  # a size the user chose (batch, samples) or a model beyond this machine
        err.print("[bold red]error:[/bold red] out of memory", markup=True)
        err.print("hint: lower --batch-size, --latency-batch or --samples, or run on a machine with more "
                  "memory", markup=False)
        return BAD_INPUT
    if isinstance(exc, QcliError):
        err.print(f"[bold red]error:[/bold red] {escape(exc.message)}", markup=True)
        if exc.hint:
            err.print(f"hint: {exc.hint}", markup=False)
        return exc.exit_code
    err.print(f"[bold red]internal error:[/bold red] {escape(f'{type(exc).__name__}: {exc}')}", markup=True)
    report = "report the traceback above" if debug else "rerun with --debug and report the traceback"
    err.print(f"hint: this is a bug in qcli; {report}", markup=False)
    return INTERNAL_ERROR
