"""What the config's `exclude:` and `overrides[].match` select in a graph, made once per plan."""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from qcli.config import HALF_PRECISIONS, NO_QDQ, Config, Match, Override
from qcli.graph import GraphIndex
from qcli.rules import DYNAMIC_ONLY


def pattern(text: str) -> Callable[[str], bool]:
    """A name test: `re:<regex>` (full match) or a glob (`*`, `?`, `[...]`).

    >>> pattern("/enc*/Add")("/encoder/Add"), pattern("re:/dec.*")("/encoder/Add")
    (True, False)
    """
    if text.startswith("re:"):
        regex = re.compile(text[3:])  # compiled once already by the config schema
        return lambda name: regex.fullmatch(name) is not None
    return lambda name: fnmatch.fnmatchcase(name, text)


@dataclass
class Selection:
    """What one `match:` selects in a graph: node indices and tensor names."""

    where: str
    nodes: set[int]
    tensors: set[str]

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.tensors


_GLOB = re.compile(r"[*?[]")  # what makes a name a glob for fnmatch


def any_of(patterns: list[str]) -> Callable[[str], bool]:
    """A test for names that any of `patterns` (`pattern`) matches. Names without a glob or
    regex are looked up in a set: the precision search's configs name hundreds of nodes, and
    a glob test per name and pattern cost seconds per search (7 million calls on tashkeel).

    >>> test = any_of(["/a/Add", "/b/*"])
    >>> test("/a/Add"), test("/b/Mul"), test("/a/Mul")
    (True, True, False)
    """
    exact = {p for p in patterns if not p.startswith("re:") and not _GLOB.search(p)}
    tests = [pattern(p) for p in patterns if p not in exact]
    return lambda name: name in exact or any(t(name) for t in tests)


def select(match: Match, where: str, names: list[str], graph: onnx.GraphProto, tensors: set[str]) -> Selection:
    node_test, tensor_test = any_of(match.nodes), any_of(match.tensors)
    nodes: set[int] = set()
    if match.nodes or match.op_types:
        for i, node in enumerate(graph.node):
            if (not match.nodes or node_test(names[i])) and (not match.op_types or node.op_type in match.op_types):
                nodes.add(i)
    chosen = {t for t in tensors if tensor_test(t)} if match.tensors else set()
    return Selection(where, nodes, chosen)


@dataclass(frozen=True)
class Selections:
    """Every config rule's selection, and what they add up to."""

    exclude: Selection
    overrides: list[tuple[int, Override, Selection]]  # (position in the config, rule, selection)
    off_nodes: frozenset[int]  # excluded, or `precision: float`
    off_tensors: frozenset[str]
    asked_nodes: frozenset[int]  # selected by an override with a quantized precision
    asked_tensors: frozenset[str]  # named by an override that does not keep them float
    dynamic: frozenset[int] = frozenset()  # nodes whose activations the config quantizes at run time
    asked_dynamic: frozenset[int] = frozenset()  # selected by an override with precision dynamic
    half: frozenset[int] = frozenset()  # nodes run in config.half (float16/bfloat16), float to the plan

    @classmethod
    def of(cls, config: Config, names: list[str], index: GraphIndex) -> Selections:
        graph, tensors = index.graph, index.tensors
        exclude = select(config.exclude, "exclude", names, graph, tensors)
        overrides = [
            (k, o, select(o.match, f"overrides[{k}].match", names, graph, tensors))
            for k, o in enumerate(config.overrides)
        ]
        off = [exclude] + [sel for _, o, sel in overrides if o.precision == "float"]
        static = (None, *NO_QDQ)
        half = half_nodes(config, len(graph.node), overrides)
        return cls(
            exclude=exclude,
            overrides=overrides,
            off_nodes=frozenset().union(*(s.nodes for s in off)) | half,
            off_tensors=frozenset().union(*(s.tensors for s in off)),
            asked_nodes=frozenset().union(
                *(sel.nodes for _, o, sel in overrides if o.precision not in static)
            ),
            asked_tensors=frozenset().union(
                *(sel.tensors for _, o, sel in overrides if o.precision not in NO_QDQ)
            ),
            dynamic=dynamic_nodes(config, graph, overrides) - half,
            asked_dynamic=frozenset().union(*(sel.nodes for _, o, sel in overrides if o.precision == "dynamic")),
            half=half,
        )

    def asked_for(self, i: int) -> bool:
        """Whether an override selects node `i` with a quantized precision."""
        return i in self.asked_nodes

    def unmatched(self, config: Config, names: list[str], index: GraphIndex) -> list[str]:
        """'<where> matched nothing' for each rule that selects nothing in this graph."""
        rules = [(config.exclude, self.exclude)] + [(o.match, sel) for _, o, sel in self.overrides]
        return [
            _unmatched(match, sel.where, names, index.graph, index.tensors)
            for match, sel in rules
            if sel.empty and (match.nodes or match.op_types or match.tensors)
        ]


def dynamic_nodes(config: Config, graph: onnx.GraphProto, overrides: list[tuple[int, Override, Selection]]
                  ) -> frozenset[int]:
    """The nodes whose mode is dynamic: all of them under `activations.mode: dynamic`; under
    static 8-bit activations, the ops whose only int8 kernel is dynamic (rules.DYNAMIC_ONLY:
    LSTM); then each override in order (later wins): `precision: dynamic` or an `activations`
    section whose mode is dynamic makes its nodes dynamic; a static precision (int8, uint16...)
    or a static `activations` section makes them static."""
    if config.activations.mode == "dynamic":
        dynamic = set(range(len(graph.node)))
    elif config.activations.dtype in ("int8", "uint8"):
        dynamic = {i for i, n in enumerate(graph.node) if n.op_type in DYNAMIC_ONLY and n.domain in ("", "ai.onnx")}
    else:
        dynamic = set()
    for _, o, sel in overrides:
        if o.precision == "dynamic" or (o.activations is not None and o.activations.mode == "dynamic"):
            dynamic |= sel.nodes
        elif o.activations is not None or o.precision not in (None, "float"):
            dynamic -= sel.nodes
    return frozenset(dynamic)


def half_nodes(config: Config, count: int, overrides: list[tuple[int, Override, Selection]]) -> frozenset[int]:
    """The nodes run in float16/bfloat16: all of them under `default_precision: float16` (or
    bfloat16), then each override in order (later wins): `precision: float16` adds its nodes, any
    other precision or an `activations`/`weights` section takes them out."""
    half = set(range(count)) if config.default_precision in HALF_PRECISIONS else set()
    for _, o, sel in overrides:
        if o.precision in HALF_PRECISIONS:
            half |= sel.nodes
        elif o.precision is not None or o.activations is not None or o.weights is not None:
            half -= sel.nodes
    return frozenset(half)


def _unmatched(match: Match, where: str, names: list[str], graph: onnx.GraphProto, tensors: set[str]) -> str:
    """'<where> matched nothing', with the closest names the model does have."""

    def close(patterns: list[str], pool: list[str]) -> list[str]:
        found: list[str] = []
        for p in patterns:
            bare = p[3:] if p.startswith("re:") else p.replace("*", "").replace("?", "")
            found += difflib.get_close_matches(bare, pool, n=3, cutoff=0.5)
        return sorted(set(found))[:5]

    hints = close(match.nodes, names) + close(match.op_types, sorted({n.op_type for n in graph.node}))
    hints += close(match.tensors, sorted(tensors))
    return f"{where} matched nothing" + (f" (close: {', '.join(hints)})" if hints else "")
