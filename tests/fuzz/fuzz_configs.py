"""Random configs and pipeline files for the fuzzer, drawn from qcli's pydantic schema.

`documents(Config)` walks the schema's fields: each is left out (its default) or drawn from
its annotation and constraints (Literal -> one of its values, int/float -> within ge/gt/le,
unions, lists, tuples, nested sections); `Match` patterns come from the graph's own node
names, op types and tensor names (globs, `re:`, exact, and names that match nothing). The
expensive knobs are bounded (`BOUNDS`: trials, time budgets, samples) so a run stays short.
`mutate` breaks a document (typo keys, wrong types, out-of-range numbers, bad regexes) and
`render` writes it as YAML, sometimes broken at the text level (syntax errors, duplicate
keys, anchors that recurse, deep nesting, bytes that are not UTF-8) and `fuzz_text.garbled`
changes the text (any code point anywhere, CRLF, tabs, BOMs, long lines). Whether a text is
valid is decided by the schema itself (`expected_valid`), never by qcli's own loader.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from fuzz_text import garbled, strings
from qcli.config import Config, Match
from qcli.target import shipped

PRESETS = ("default", "tensorrt", "accuracy", "weights-int4")

# Bounds on the knobs that cost time, by key path ("*" matches a list index); `fast` configs
# also turn the latency floor off, so no run's outcome depends on timing.
BOUNDS: dict[str, tuple[float, float]] = {
    "calibration.samples": (1, 300), "calibration.batch_size": (1, 16), "calibration.bins": (128, 4096),
    "verify.samples": (1, 80), "verify.max_trials": (1, 3), "verify.time_budget": (0.5, 5.0),
    "auto_precision.samples": (1, 80), "auto_precision.max_trials": (1, 3), "auto_precision.time_budget": (0.5, 5.0),
    "verify.min_float_ms": (0.0, 10.0), "auto_precision.max_accuracy_drop": (0.0, 1.0),
    "auto_precision.min_speedup": (0.1, 3.0), "verify.max_latency_ratio": (0.1, 100.0),
    "weights.block_size": (8, 256), "data.preprocess.scale": (0.1, 255.0),
    "runs": (0, 3), "warmup": (0, 2), "samples": (1, 40), "batch_size": (1, 40), "threads": (1, 2),
    "latency_batch": (1, 3), "worst": (0, 5),
}


@dataclass(frozen=True)
class Names:
    """What `Match` patterns can name: the graph's node names, op types and tensor names."""

    nodes: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()


OTHER_OPS = ("Conv", "MatMul", "Gemm", "Add", "Softmax", "LayerNormalization", "Attention", "conv")


def _patterns(kind: str, names: Names) -> st.SearchStrategy[str]:
    if kind == "op_types":
        return st.sampled_from(sorted(set(names.op_types) | set(OTHER_OPS)))
    own = sorted(getattr(names, kind)) or ["x"]
    scopes = sorted({"/" + n.split("/")[1] + "/*" for n in own if n.count("/") >= 2})
    return st.one_of(
        st.sampled_from(own), st.sampled_from(scopes or ["*"]), st.sampled_from(["*", "nothing*", "re:.*Conv.*"]),
        st.sampled_from(own).map(lambda n: "re:" + n.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")),
        strings(),  # any code point: safe_dump writes what YAML refuses as escapes ("\x01", "\uD800")
    )


def _number(kind: type, path: str, metadata: list) -> st.SearchStrategy:
    lo = hi = None
    open_lo = False
    for m in metadata:
        lo, open_lo = (m.ge, False) if hasattr(m, "ge") else (m.gt, True) if hasattr(m, "gt") else (lo, open_lo)
        hi = m.le if hasattr(m, "le") else hi
    key = path.split(".", 1)[1] if path.startswith("analyze.") else path
    if key in BOUNDS:
        lo, hi = max(lo, BOUNDS[key][0]) if lo is not None else BOUNDS[key][0], BOUNDS[key][1]
    if kind is int:
        if path.endswith("block_size"):
            return st.sampled_from([8, 16, 32, 64, 128])
        return st.integers(int(lo if lo is not None else 0) + open_lo, int(hi if hi is not None else (lo or 0) + 100))
    low = float(lo) if lo is not None else -10.0
    return st.floats(low, float(hi) if hi is not None else low + 10, exclude_min=open_lo, allow_nan=False)


def values(annotation: Any, metadata: list, path: str, names: Names) -> st.SearchStrategy:
    """Valid values of a field (the validators' extra rules aside: `expected_valid` decides)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return st.one_of(st.none(), *[values(a, metadata, path, names) for a in options])
    if origin is list:
        (item,) = args
        if item is str and path.rsplit(".", 1)[-1] in ("nodes", "op_types", "tensors"):
            return st.lists(_patterns(path.rsplit(".", 1)[-1], names), min_size=1, max_size=3)
        return st.lists(values(item, [], path + ".*", names), max_size=3)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(values(args[0], [], path, names), min_size=1, max_size=2)
        return st.tuples(*[values(a, [], path, names) for a in args]).map(list)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return documents(annotation, path, names)
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        return _number(annotation, path, metadata)
    if annotation is dict:
        return documents(Config, "", names)
    if path == "target.profile":  # a profile qcli can have: auto, or one it ships
        return st.sampled_from(["auto", *shipped()])
    return st.sampled_from(["x", "model.onnx"])


@st.composite
def documents(draw, model: type[BaseModel], path: str, names: Names) -> dict:
    """A mapping for `model`: each optional field left out or drawn (see `values`)."""
    doc = {}
    fields = model.model_fields
    chosen = {n for n, info in fields.items() if info.is_required() or draw(st.integers(0, 2)) == 2}
    if model is Match and not chosen:  # a rule selects something (the "empty match" mutation aside)
        chosen = {draw(st.sampled_from(sorted(fields)))}
    for name, info in fields.items():
        if name in chosen:
            key = f"{path}.{name}" if path else name
            doc[name] = draw(values(info.annotation, list(info.metadata), key, names))
    return doc


def bounded(doc: dict, fast: bool) -> dict:
    """The document with the verification and search budgets small (and, `fast`, no latency floor)."""
    doc = dict(doc)
    for section in ("verify", "auto_precision"):
        part = dict(doc.get(section) or {})
        part["max_trials"] = min(part.get("max_trials", 3), 3)
        part["time_budget"] = min(part.get("time_budget", 5.0), 5.0)
        if fast and section == "verify":
            part["max_latency_ratio"] = None
        doc[section] = part
    return doc


# --------------------------------------------------------------------------- invalid configs

MUTATIONS = ("typo key", "typo section", "wrong type", "out of range", "bad literal", "bad regex", "empty match",
             "block size", "version", "top level list")
SECTIONS = ("calibration", "activations", "weights", "verify", "auto_precision")
OUT_OF_RANGE = (("calibration", "percentile", 101), ("calibration", "percentile", 50), ("calibration", "samples", 0),
                ("calibration", "bins", 5), ("verify", "samples", -3), ("verify", "min_cosine", 2),
                ("verify", "time_budget", 0), ("auto_precision", "max_accuracy_drop", -1), ("weights", "block_size", 4))


def mutate(doc: dict, kind: str, draw) -> Any:
    """`doc` broken one way (`kind` in MUTATIONS); `expected_valid` says whether it still is valid."""
    doc = dict(doc)

    def put(section: str, key: str, value: Any) -> None:
        doc[section] = {**(doc.get(section) or {}), key: value}

    section = draw(st.sampled_from(SECTIONS))
    if kind == "typo key":
        put(section, draw(st.sampled_from(["mehtod", "dtpye", "granularty", "sample", "enable"])), 1)
    elif kind == "typo section":
        doc[draw(st.sampled_from(["calibraton", "activation", "weight", "verfy", "autoprecision"]))] = {}
    elif kind == "wrong type":
        key = draw(st.sampled_from(sorted(Config.model_fields[section].annotation.model_fields)))
        put(section, key, draw(st.sampled_from(["abc", [1, 2], {"a": 1}, None, True])))
    elif kind == "out of range":
        put(*draw(st.sampled_from(OUT_OF_RANGE)))
    elif kind == "bad literal":
        put(draw(st.sampled_from(["activations", "weights"])), draw(st.sampled_from(["dtype", "granularity"])), "int3")
    elif kind in ("bad regex", "empty match"):
        match = {"nodes": ["re:("]} if kind == "bad regex" else {}
        doc["overrides"] = [*doc.get("overrides", []), {"match": match, "precision": "float"}]
    elif kind == "block size":
        put("weights", "block_size", draw(st.sampled_from([7, 48, 0])))
    elif kind == "version":
        doc["version"] = 2
    elif kind == "top level list":
        return [doc]
    return doc


TEXT_BREAKS = ("syntax error", "duplicate key", "recursive anchor", "deep nesting", "not utf-8", "empty", "tab indent")


def render(doc: Any, style: str = "block", broken: str | None = None) -> bytes:
    """The document as YAML text (`style`: block or flow), broken at the text level by `broken`."""
    flow = style == "flow" and broken != "duplicate key"
    text = yaml.safe_dump(doc, default_flow_style=flow, sort_keys=False) if doc != {} else ""
    if broken == "syntax error":
        text += "calibration: {method: kl\n"
    elif broken == "duplicate key":
        text = "bias: int32\n" + text.replace("bias: int32\n", "") + "bias: int32\n"
    elif broken == "recursive anchor":
        text = "exclude: {nodes: &a [*a]}\n" if "exclude" not in text else "&a [*a]\n"
    elif broken == "deep nesting":
        text = "exclude: {nodes: " + "[" * 600 + "]" * 600 + "}\n"
    elif broken == "empty":
        text = ""
    elif broken == "tab indent":
        text = "calibration:\n\tmethod: kl\n"
    data = text.encode()
    return b"\xff\xfeversion: 1\n" + data if broken == "not utf-8" else data


def expected_valid(data: bytes) -> bool:
    """Whether the schema accepts this file: UTF-8 YAML, no duplicate keys, a mapping that
    `Config` validates. Self-contained: qcli's loader is what is under test."""
    try:
        text = data.decode("utf-8-sig")  # qcli skips a UTF-8 byte order mark, as PyYAML does
        node = yaml.compose(text)
        doc = yaml.safe_load(text)
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False
    if _has_duplicates(node) or not (doc is None or isinstance(doc, dict)):
        return False
    try:
        Config.model_validate(doc or {})
    except (ValidationError, RecursionError, ValueError):
        return False
    return True


def _has_duplicates(node: Any, seen: set | None = None) -> bool:
    seen = set() if seen is None else seen
    if id(node) in seen:
        return False
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys = [k.value for k, _ in node.value]
        return len(keys) != len(set(keys)) or any(_has_duplicates(v, seen) for _, v in node.value)
    if isinstance(node, yaml.SequenceNode):
        return any(_has_duplicates(v, seen) for v in node.value)
    return False


@dataclass
class ConfigCase:
    """A config file to write: its bytes, whether the schema accepts it, and how it was made."""

    data: bytes
    valid: bool
    doc: Any = None
    tags: list[str] = field(default_factory=list)


@st.composite
def config_files(draw, names: Names | None = None, fast: bool = True, invalid: bool = True) -> ConfigCase:
    """A config file: drawn from the schema (often a preset's content under it), and, when
    `invalid`, sometimes broken by a mutation or at the text level."""
    doc = draw(documents(Config, "", names or Names()))
    if draw(st.integers(0, 3)) == 3:
        doc = {**yaml.safe_load(_preset_text(draw(st.sampled_from(PRESETS)))), **doc}
    doc = bounded(doc, fast)
    tags = []
    if invalid and draw(st.integers(0, 2)) == 2:
        kind = draw(st.sampled_from(MUTATIONS))
        doc = mutate(doc, kind, draw)
        tags.append(kind)
    broken = draw(st.sampled_from([None] * 8 + list(TEXT_BREAKS))) if invalid else None
    if broken:
        tags.append(broken)
    data = render(doc, draw(st.sampled_from(["block", "flow"])), broken)
    if invalid and broken != "not utf-8" and draw(st.integers(0, 2)) == 2:  # any code point, CRLF, a BOM, ...
        change = draw(garbled(data.decode("utf-8", "surrogatepass")))
        data = change.data
        tags.append(change.change)
    return ConfigCase(data, expected_valid(data), doc, tags)


def _preset_text(name: str) -> str:
    from qcli.config import PRESETS as folder

    return (folder / f"{name}.yaml").read_text()
