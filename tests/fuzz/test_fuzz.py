"""Property-based fuzzing of the qcli CLI (issue 20): random valid graphs with data, random
configs, pipeline files, text files (labels.csv, calibration files, issue 50) and bad inputs,
each run through the commands in-process and judged by fuzz_check's properties. `make test`
runs the fast profile, `make fuzz` the long one (fuzz_stats: QCLI_FUZZ=long,
QCLI_FUZZ_MINUTES, QCLI_FUZZ_EXAMPLES, --hypothesis-seed)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnx.parser
import pytest
import yaml
from hypothesis import example, given, reject
from hypothesis import strategies as st

from fuzz_bad import BAD
from fuzz_check import Context, Expect, judge, judge_debug, qcli
from fuzz_configs import ConfigCase, config_files
from fuzz_data import Samples, case_of, make_samples, runnable
from fuzz_graphs import GraphCase, graphs
from fuzz_runs import TEXT_FILES, graph_commands, names_of, pipeline_file, small_model, text_file, write_small
from fuzz_seeds import SEEDS
from fuzz_stats import STATS, SummaryPlugin, profile, run
from fuzz_text import shown
from qcli.model import clamp_ir_version

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    plugins = request.config.pluginmanager
    if not plugins.has_plugin("qcli-fuzz-summary"):
        plugins.register(SummaryPlugin(), "qcli-fuzz-summary")
    yield


@contextmanager
def _workspace(test: str, case: GraphCase, data) -> Iterator[tuple[Path, Samples]]:
    """A temporary folder holding the case's model.onnx, data/ and eval/, and the samples."""
    STATS.check_time(test)
    with tempfile.TemporaryDirectory(prefix="qcli-fuzz-") as tmp:
        root = Path(tmp)
        samples = _prepare(case, data, root)
        STATS.counts[test] += 1
        yield root, samples


def _prepare(case: GraphCase, data, root: Path) -> Samples:
    """Samples the float model runs on, written to root/data (and root/eval); rejects the
    graph when there are none."""
    seed = data.draw(st.integers(0, 2**16), label="data seed")
    count = data.draw(st.sampled_from([6, 2, 20, 1, 40]), label="samples")
    single, npy = data.draw(st.booleans(), label="single samples"), data.draw(st.booleans(), label="npy")
    scale = data.draw(st.sampled_from([1.0, 0.01, 30.0]), label="data scale")
    samples = runnable(case, lambda c: make_samples(c, count, seed, single, scale, npy))
    if samples is None:
        STATS.counts["graphs discarded"] += 1
        reject()
    (root / "model.onnx").write_bytes(case.model.SerializeToString())
    samples.write(root / "data")
    make_samples(case, max(count // 2, 1), seed + 1, single, scale, npy).write(root / "eval")
    STATS.features.update(case.features)
    return samples


def _reproducer(case: GraphCase, samples: Samples, config: Path | None = None) -> Callable[[], str]:
    """The case as text: the model in ONNX text, the data folder's layout, the config file."""

    def text() -> str:
        extra = f"\n-- config.yaml:\n{config.read_text()}" if config is not None and config.exists() else ""
        files = {k: f"{v.dtype}{list(v.shape)}" for k, v in samples.files[0].items()} if samples.files else {}
        kind = ".npy" if samples.npy else ".npz"
        data = f"-- data/: {len(samples.files)} {kind} files of random normal values, {files}"
        return f"-- model.onnx:\n{case.text}\n{data}{extra}"

    return text


@profile("graphs")
@given(case=graphs(), data=st.data())
def fuzz_graph_commands(case: GraphCase, data) -> None:
    with _workspace("graphs", case, data) as (root, samples):
        for command in graph_commands(data, case.model, root, root / "data", root / "eval"):
            run = qcli(*command.args)
            expect = Expect(command.valid, command.output, case.model, samples)
            context = Context(case.model, command.config, run.args, command.tags)
            judge("graphs", run, expect, context, _reproducer(case, samples, root / "config.yaml"))
            if run.exit_code != 0:
                break


def test_graphs() -> None:
    run("graphs", fuzz_graph_commands)


@profile("configs")
@example(config=ConfigCase(b'version: 1\nexclude:\n  nodes: ["a\x01b"]\n', False), command="validate")  # issue 50
@example(config=ConfigCase("auto_precision: {enabled: true}\nexclude:\n  nodes: [a\x99b]\n".encode(), False),
         command="quantize")
@given(config=config_files(names_of(small_model())), command=st.sampled_from(["validate", "quantize", "calibrate"]))
def fuzz_configs(config, command: str) -> None:
    STATS.check_time("configs")
    STATS.counts["configs"] += 1
    STATS.counts["configs valid"] += config.valid
    with tempfile.TemporaryDirectory(prefix="qcli-fuzz-") as tmp:
        root = Path(tmp)
        model, folder = write_small(root)
        path = root / "config.yaml"
        path.write_bytes(config.data)
        if command == "validate":
            args = ["config", "validate", path]
        elif command == "calibrate":
            args = ["calibrate", model, "--data", folder, "--config", path, "-o", root / "c.json"]
        else:
            args = ["quantize", model, "--data", folder, "--config", path, "-o", root / "q.onnx"]
        run = qcli(*args)
        samples = make_samples(case_of(small_model()), 4, 0, True, 1.0, False)
        output = root / "q.onnx" if command == "quantize" else None
        expect = Expect(config.valid, output, small_model(), samples, text=(path, config.data))
        context = Context(small_model(), config.doc, run.args, set(config.tags))
        judge("configs", run, expect, context,
              lambda: f"-- config.yaml:\n{shown(config.data)}")


def test_configs() -> None:
    run("configs", fuzz_configs)


@profile("pipelines")
@given(case=graphs(max_steps=3), data=st.data())
def fuzz_pipelines(case: GraphCase, data) -> None:
    with _workspace("pipelines", case, data) as (root, samples):
        path, valid, doc = pipeline_file(data, case.model, root)
        run = qcli("run", path, *(["--json"] if data.draw(st.booleans()) else []))
        output = root / "out" / "model.q.onnx" if valid is not None else None  # None: the text changed it
        expect = Expect(valid, output, case.model, samples, text=(path, path.read_bytes()))
        context = Context(case.model, doc.get("config"), run.args, set())
        pipeline = f"\n-- pipeline.yaml:\n{shown(path.read_bytes())}"
        judge("pipelines", run, expect, context, lambda: _reproducer(case, samples)() + pipeline)


def test_pipelines() -> None:
    run("pipelines", fuzz_pipelines)


@profile("texts")
@given(kind=st.sampled_from(TEXT_FILES), data=st.data())
def fuzz_text_files(kind: str, data) -> None:
    STATS.check_time("texts")
    STATS.counts["text files"] += 1
    with tempfile.TemporaryDirectory(prefix="qcli-fuzz-") as tmp:
        root = Path(tmp)
        model, folder = write_small(root)
        command, path, content = text_file(data, kind, root, model, folder)
        run = qcli(*command.args)
        samples = make_samples(case_of(small_model()), 4, 0, True, 1.0, False)
        expect = Expect(command.valid, command.output, small_model(), samples, text=(path, content))
        judge("texts", run, expect, Context(small_model(), None, run.args, {kind}), lambda: f"-- {kind}:\n{shown(content)}")


def test_text_files() -> None:
    run("texts", fuzz_text_files)


@profile("bad_inputs")
@given(kind=st.sampled_from(sorted(BAD)))
def fuzz_bad_inputs(kind: str) -> None:
    STATS.check_time("bad_inputs")
    STATS.counts["bad inputs"] += 1
    with tempfile.TemporaryDirectory(prefix="qcli-fuzz-") as tmp:
        root = Path(tmp)
        model, folder = write_small(root)
        command = BAD[kind](root, model, folder)
        run = qcli(*command.args)
        context = Context(small_model(), None, run.args, command.tags | {kind})
        judge("bad_inputs", run, Expect(False), context, lambda: f"-- bad input: {kind}")
        judge_debug("bad_inputs", run, qcli(*command.args, "--debug"), context, lambda: f"-- bad input: {kind}")


def test_bad_inputs() -> None:
    run("bad_inputs", fuzz_bad_inputs)


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed(name: str, tmp_path: Path) -> None:
    """Each seed through quantize (verified and not) and calibrate, judged as a generated graph."""
    seed = SEEDS[name]
    model = clamp_ir_version(onnx.parser.parse_model(seed.text))
    case = case_of(model)
    samples = make_samples(case, 20, 0, True, 1.0, False)
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    data = samples.write(tmp_path / "data")
    config: list[object] = []
    if seed.config:
        config = ["--config", tmp_path / "config.yaml"]
        (tmp_path / "config.yaml").write_text(seed.config)
    out = tmp_path / "model.q.onnx"
    flags = [f.replace("{data}", str(data)) for f in seed.flags]
    quantize = ["quantize", tmp_path / "model.onnx", "--data", data, "-o", out, *config, *flags]
    context = Context(model, yaml.safe_load(seed.config) if seed.config else None, [], set())
    valid = True if model.graph.input else None  # whether a model without inputs quantizes is qcli's call
    for args in (quantize, [*quantize, "--no-verify"], ["calibrate", tmp_path / "model.onnx", "--data", data,
                                                        "-o", tmp_path / "c.json", *config]):
        run = qcli(*args)
        context.args = run.args
        expect = Expect(valid, out if args[0] == "quantize" else None, model, samples)
        judge("seeds", run, expect, context, lambda: f"-- seed {name!r}:\n{seed.text}\n-- config:\n{seed.config}")
