"""The fuzzer's properties: run qcli in-process and judge the result.

Every run: exit code 0, 1 or 2 (never 3, never another), no traceback in the output; exit 1
and 2 print an `error:` line (a text file holding what qcli must refuse: exit 2 naming its
file:line:col and the character, fuzz_text) (2 is bad input: on an input the fuzzer knows is valid, exit 2
blames the user for qcli's limits, unless the message is one of `TRUE_BLAME`); an input the
fuzzer knows is invalid never exits 0; `--json` prints JSON. A model written (exit 0, or exit 1
after a missed gate) loads in onnxruntime, has the float model's output names, dtypes and
static dims, and runs on the data with finite outputs of the float model's shapes.

`KNOWN` lists the issue-20 bugs the fuzzer finds today, each with the cases it explains: a
failing case one of them explains is counted, not failed. The lead empties it once the fixes
are merged.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from typer.testing import CliRunner

from fuzz_data import Samples, run_all, session
from fuzz_stats import LONG, STATS
from fuzz_text import refusal_problem
from qcli.cli import app

RUNNER = CliRunner()


@dataclass
class Run:
    args: list[str]
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None
    tb: str = ""

    @property
    def command(self) -> str:
        return "qcli " + " ".join(a if re.fullmatch(r"[\w./:=,+-]+", a) else repr(a) for a in self.args)

    @property
    def error(self) -> str | None:
        return next((line for line in self.stderr.splitlines() if line.startswith("error: ")), None)


# The long profile runs each command in a forked child: a native crash (onnxruntime aborting on
# a model qcli wrote) then ends the child, and comes back as a failing run with its case,
# instead of ending the fuzzer and losing the case.
FORK = LONG and hasattr(os, "fork") and os.environ.get("QCLI_FUZZ_FORK", "1") != "0"


def qcli(*args: object) -> Run:
    """One qcli command (typer's CliRunner on `qcli.cli.app`): in this process, or in a forked
    child in the long profile (`FORK`)."""
    argv = [str(a) for a in args]
    start = time.monotonic()
    run = _in_child(argv) if FORK else _invoke(argv)
    STATS.timed(" ".join(argv), time.monotonic() - start)
    command = " ".join(argv[:2]) if argv[0] == "config" else argv[0]
    STATS.counts["runs"] += 1
    STATS.counts[f"{command} exit {run.exit_code}"] += 1
    return run


def _invoke(argv: list[str]) -> Run:
    result = RUNNER.invoke(app, argv, catch_exceptions=True)
    exc = result.exception if not isinstance(result.exception, SystemExit) else None
    tb = "".join(traceback.format_exception(*result.exc_info)) if exc is not None and result.exc_info else ""
    return Run(argv, result.exit_code, result.stdout, result.stderr, exc, tb)


def _in_child(argv: list[str]) -> Run:
    """`_invoke` in a forked child; its exception comes back as one of the same class name (the
    original may not pickle); a child killed by a signal as exit -signal, "the process died"."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send the result, leave without cleanup
        os.close(read)
        try:
            run = _invoke(argv)
            exc = (type(run.exception).__name__, str(run.exception)) if run.exception is not None else None
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps((run.exit_code, run.stdout, run.stderr, exc, run.tb)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        payload = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return Run(argv, -os.WTERMSIG(status), "", f"the process died: {signal.Signals(os.WTERMSIG(status)).name}\n")
    if not payload:
        return Run(argv, -1, "", "the process died: it returned nothing\n")
    code, stdout, stderr, exc, tb = pickle.loads(payload)
    exception = type(exc[0], (Exception,), {})(exc[1]) if exc is not None else None
    return Run(argv, code, stdout, stderr, exception, tb)


@dataclass
class Expect:
    """What the fuzzer knows about a run's inputs. `valid`: True (all valid), False (something
    is invalid), None (it cannot tell). `output`: the model the command writes, to check
    against `float_model` on `samples`. `text`: a text file the command reads first and the
    bytes written to it, whose refusal (fuzz_text) the error must name."""

    valid: bool | None
    output: Path | None = None
    float_model: onnx.ModelProto | None = None
    samples: Samples | None = None
    text: tuple[Path, bytes] | None = None


# Exit 2 on valid inputs that is right: the user asked for something these inputs cannot give.
TRUE_BLAME = (
    "matched nothing",  # --strict: a config rule that selects no node
    "needs auto_precision.min_speedup",  # criteria custom without its floor
    "auto-precision needs data",  # --auto-precision with --calib and no --eval-data
    "gate needs latency runs",  # a min_speedup gate with analyze.runs 0
    "the model has no inputs",  # nothing to feed, calibrate or compare (docs/guides/data-folders.md, rules)
    "needs --data DIR: it measures",  # recovery: [bias_correction] with --calib and no --data
    "needs --data DIR: it reads the Gram",  # recovery: [seq_mse] or [adaround] with --calib and no --data
)


def problem(run: Run, expect: Expect) -> str | None:
    """Why the run breaks a property (see the module docstring), or None."""
    out = run.stdout + run.stderr
    if run.exit_code < 0:
        return run.stderr.strip()
    if run.exit_code not in (0, 1, 2):
        line = next((x for x in run.stderr.splitlines() if x.startswith("internal error")), run.stderr[-200:])
        return f"exit {run.exit_code}: {normalize(line)}"
    if run.exception is not None:
        return f"uncaught {type(run.exception).__name__}"
    if "Traceback (most recent call last)" in out:
        return "a traceback in the output"
    if run.exit_code in (1, 2) and run.error is None:
        return f"exit {run.exit_code} without an `error:` line" + (" (click usage error)" if "Usage:" in out else "")
    refused = refusal_problem(run.error, run.exit_code, *expect.text) if expect.text else None
    if refused:
        return refused
    if run.exit_code == 2 and "a bug in qcli" in run.stderr:
        return f"exit 2 for a bug in qcli: {normalize(run.error or '')}"
    if run.exit_code == 2 and expect.valid and not _true_blame(run.stderr):
        return f"exit 2 on valid input: {normalize(run.error or '')}"
    if run.exit_code == 0 and expect.valid is False:
        return "invalid input accepted (exit 0)"
    if "--json" in run.args and run.exit_code == 0:
        try:
            json.loads(run.stdout)
        except ValueError:
            return "--json printed something that is not JSON"
    written = expect.output is not None and (run.exit_code == 0 or (run.exit_code == 1 and expect.output.exists()))
    if written and expect.float_model is not None and expect.samples is not None:
        found = model_problem(expect.output, expect.float_model, expect.samples)
        if found:
            return f"exit {run.exit_code} but the output model {found}"
    return None


def _true_blame(stderr: str) -> bool:
    """Exit 2 that is right on inputs the fuzzer made valid: TRUE_BLAME, or the float model
    itself failing on a batch qcli formed (qcli runs the model as given on that very feed):
    a graph whose If takes a branch that fixes the batch size only for some batches. A batch
    the model's fixed dimensions forbid ("invalid dimensions") is qcli's to avoid."""
    if any(t in stderr for t in TRUE_BLAME):
        return True
    return "before any change by qcli" in stderr and "Got invalid dimensions" not in stderr


def normalize(message: str) -> str:
    """A message with the run's paths, numbers and quoted names blanked, to group failures."""
    message = re.sub(re.escape(tempfile.gettempdir()) + r"/[^\s:'\"]+", "<path>", message)
    message = re.sub(r"'[^']*'", "'…'", message)
    return re.sub(r"\d+(\.\d+)?", "#", message)[:160]


def _dims(value: onnx.ValueInfoProto) -> list[int | str] | None:
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]


def model_problem(path: Path, float_model: onnx.ModelProto, samples: Samples) -> str | None:
    """What is wrong with a written model, or None (see the module docstring)."""
    if not path.exists():
        return "was not written"
    quantized = onnx.load(str(path), load_external_data=False)
    want, got = float_model.graph.output, quantized.graph.output
    if [o.name for o in got] != [o.name for o in want]:
        return f"has outputs {[o.name for o in got]}, not {[o.name for o in want]}"
    for w, g in zip(want, got, strict=True):
        if w.type.tensor_type.elem_type != g.type.tensor_type.elem_type:
            return f"changes the dtype of output {w.name}"
        wd, gd = _dims(w), _dims(g)
        if wd is not None and (gd is None or len(gd) != len(wd) or any(
                isinstance(a, int) and a and a != b for a, b in zip(wd, gd, strict=True))):
            return f"declares output {w.name} as {gd}, not {wd}"
    try:
        sess = session(path)
    except Exception as exc:  # onnxruntime's own error types
        return f"does not load in onnxruntime: {normalize(str(exc).splitlines()[0])}"
    reference = run_all(float_model, samples.runs) or []
    for feed, ref in zip(samples.runs, reference, strict=False):
        try:
            outs = sess.run(None, feed)
        except Exception as exc:
            return f"does not run on the data: {normalize(str(exc).splitlines()[0])}"
        for r, o in zip(ref, outs, strict=True):
            if r.shape != o.shape or r.dtype != o.dtype:
                return f"computes {o.dtype}{list(o.shape)} where the float model computes {r.dtype}{list(r.shape)}"
            if np.issubdtype(o.dtype, np.floating) and not np.all(np.isfinite(o)):
                return "computes non-finite values"
    return None


# --------------------------------------------------------------------------- known causes


@dataclass
class Context:
    """What a failing case was made of, for `KNOWN`'s predicates."""

    model: onnx.ModelProto | None = None
    config: Any = None  # the config document (dict), if any
    args: list[str] = field(default_factory=list)
    tags: set[str] = field(default_factory=set)


def _constants(model: onnx.ModelProto) -> set[str]:
    """Tensors computed from constants only (initializers, Constant nodes and what they feed)."""
    known = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if all(not i or i in known for i in node.input) and node.op_type not in ("If", "Loop"):
            known.update(node.output)
    return known


def _static_shapes(model: onnx.ModelProto) -> dict[str, list]:
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    for v in inferred.graph.value_info:
        shapes[v.name] = _dims(v) or []
    return shapes


def _ops_with(model: onnx.ModelProto | None, op: str, test: Callable[[onnx.NodeProto, dict, set], bool]) -> bool:
    if model is None:
        return False
    nodes = [n for n in model.graph.node if n.op_type == op]
    if not nodes:
        return False
    shapes, constants = _static_shapes(model), _constants(model)
    return any(test(n, shapes, constants) for n in nodes)


def _attr(node: onnx.NodeProto, name: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _first_dim(value: onnx.ValueInfoProto) -> int:
    dims = _dims(value)
    return dims[0] if dims and isinstance(dims[0], int) else 0


def _per_block(c: Context) -> bool:
    text = json.dumps(c.config) if c.config is not None else ""
    return "per_block" in text or "weights-int4" in c.args or "weights-int4" in text


def _opset(c: Context) -> int:
    return next((o.version for o in c.model.opset_import if o.domain in ("", "ai.onnx")), 0) if c.model else 0


def _gemm_bias_not_n(c: Context) -> bool:
    def odd(n: onnx.NodeProto, shapes: dict, constants: set) -> bool:
        w, bias = shapes.get(n.input[1]), shapes.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        return bool(w and len(w) == 2 and bias is not None and bias != [w[0] if _attr(n, "transB") else w[1]])

    return _ops_with(c.model, "Gemm", odd)


def _grouped_conv_transpose(c: Context) -> bool:
    return _ops_with(c.model, "ConvTranspose", lambda n, s, k: _attr(n, "group", 1) >= 2 and (
        s.get(n.input[1]) or [0, 0])[1] >= 2)


def _matmul_weight_not_2d(c: Context) -> bool:
    return _ops_with(c.model, "MatMul", lambda n, s, k: n.input[1] in k and len(s.get(n.input[1]) or [0, 0]) != 2)


def _weight_only_with_quantized_activations(c: Context) -> bool:
    doc = c.config if isinstance(c.config, dict) else {}
    weight_only = (doc.get("activations") or {}).get("dtype") == "float" or "weights-int4" in (*c.args, str(doc))
    ap = doc.get("auto_precision") or {}
    return weight_only and bool(doc.get("overrides") or "--auto-precision" in c.args or ap.get("enabled"))


def _weight_and_bias(c: Context) -> bool:
    if c.model is None:
        return False
    nodes = c.model.graph.node
    biases = {n.input[2] for n in nodes if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2}
    weights = {n.input[1] for n in nodes if n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul")}
    return bool(biases & weights)


def _candidates_degenerate(c: Context) -> bool:
    ap = (c.config or {}).get("auto_precision") if isinstance(c.config, dict) else None
    enabled = "--auto-precision" in c.args or bool(isinstance(ap, dict) and ap.get("enabled"))
    return enabled and isinstance(ap, dict) and "candidates" in ap and len(set(ap["candidates"]) - {"float"}) <= 1


@dataclass(frozen=True)
class Known:
    """A known bug: what it is, which cases it explains, and the symptom (a regex searched in
    the failure and the run's output) it shows in them."""

    what: str
    explains: Callable[[Context], bool]
    symptom: str


# Emptied once the issue-20 fixes landed: every failure is now a new one.
KNOWN: dict[str, Known] = {}


def known_cause(context: Context, text: str) -> str | None:
    """The first KNOWN bug that explains this case and shows its symptom in `text`."""
    return next((k for k, bug in KNOWN.items() if bug.explains(context) and re.search(bug.symptom, text)), None)


def judge(test: str, run: Run, expect: Expect, context: Context, reproducer: Callable[[], str]) -> None:
    """Check a run; a failure is counted by cause, and raised unless KNOWN explains it or the
    long profile collects it (fuzz_stats)."""
    found = problem(run, expect)
    if found is None:
        return
    if found.startswith("exit 3") and "--debug" not in run.args:
        found += _origin([*run.args, "--debug"])
    output = f"{run.stderr[-1500:]}{run.tb[-3000:]}"
    known = known_cause(context, f"{found}\n{output}")
    text = f"{run.command}\n{found}\n-- output:\n{output}\n{reproducer()}"
    STATS.fail(test, found, text, known)
    if known is None and not LONG:
        raise AssertionError(f"{found}\n{text}")


def judge_debug(test: str, plain: Run, debug: Run, context: Context, reproducer: Callable[[], str]) -> None:
    """`--debug` shows the traceback but keeps the exit code of the run without it."""
    if debug.exit_code == plain.exit_code:
        return
    found = f"--debug exits {debug.exit_code} where the run without it exits {plain.exit_code}"
    known = known_cause(Context(context.model, context.config, debug.args, context.tags), found)
    STATS.fail(test, found, f"{debug.command}\n{found}\n{reproducer()}", known)
    if known is None and not LONG:
        raise AssertionError(f"{found}\n{debug.command}")


def _origin(args: list[str]) -> str:
    """Where an internal error is raised: rerun with --debug and name the innermost qcli frame."""
    run = _in_child(args) if FORK else _invoke(args)
    if run.exception is None:
        return ""
    frames = re.findall(r'File "([^"]*/qcli/[^"]*)", line \d+, in (\w+)', run.tb)
    where = f" at {Path(frames[-1][0]).name}:{frames[-1][1]}" if frames else ""
    return f" ({type(run.exception).__name__}{where})"
