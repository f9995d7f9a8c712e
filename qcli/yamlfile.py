"""Reading the YAML of configs and pipeline files: text as qcli.textfile reads it (UTF-8, no
control characters), safe tags only, one composition giving both the data and the line of
every key (for errors naming file:line), and a refusal, as a ConfigError naming file:line:col,
of what no config needs and what would exhaust the stack or the memory downstream (`_Loader`).
Any error of PyYAML's becomes a ConfigError naming file:line:col too (`_yaml_error`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from qcli.errors import ConfigError, QcliError
from qcli.textfile import read_text, refusal


def read_yaml(path: Path, what: str = "YAML file") -> tuple[Any, dict[tuple, int]]:
    """The data of the YAML file at `path` (a `what`: "config file") and the 1-based line of
    every key path in it, e.g. {("calibration", "method"): 2}, from one composition."""
    text = read_text(path, what)
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), _key_lines(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, path, text, what) from exc
    except RecursionError:  # the limits below keep it away; a last line of defence
        raise ConfigError(f"{path}: the YAML is nested too deeply to read (over {MAX_DEPTH} levels)") from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_error(exc: yaml.YAMLError, path: Path, text: str, what: str) -> QcliError:
    """PyYAML's error as a ConfigError naming file:line:col (any YAMLError: never exit 3)."""
    if isinstance(exc, yaml.reader.ReaderError):  # read_text refuses these characters first
        return refusal(path, text, exc.position, what) if exc.position < len(text) else ConfigError(f"{path}: {exc}")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, _Refused):
        return ConfigError(f"{where}: {problem}")
    tab = "'\\t'" in problem  # PyYAML takes a tab only inside quotes
    hint = "YAML indents and separates with spaces, not tabs: replace the tab with spaces" if tab else None
    return ConfigError(f"{where}: YAML syntax error: {problem}", hint=hint)


MAX_DEPTH = 100  # nesting levels of a YAML file; a config needs about 6
MAX_VALUES = 1_000_000  # values a YAML file may hold once its aliases are expanded


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that qcli does not read (see `_Loader`)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses what no config needs and would otherwise exhaust the stack or the
    memory downstream: an alias inside its own anchor (`&a [*a]`, a recursive structure),
    nesting deeper than MAX_DEPTH, aliases expanding past MAX_VALUES values; a key given twice in
    one mapping (PyYAML silently keeps the last); a scalar its tag cannot convert (`!!int abc`)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._open: list[str | None] = []  # anchors of the nodes being composed (None: none)
        self._sizes: dict[str, int] = {}  # values under each anchor, aliases expanded
        self._values = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        anchor, mark = event.anchor, event.start_mark
        if isinstance(event, yaml.AliasEvent):
            if anchor in self._open:
                raise _Refused(None, None, f"recursive alias *{anchor}: it is inside its own anchor &{anchor}", mark)
            self._values += self._sizes.get(anchor or "", 0)
            if self._values > MAX_VALUES:
                raise _Refused(None, None, f"the aliases expand to more than {MAX_VALUES:,} values", mark)
            return super().compose_node(parent, index)
        if self._depth == MAX_DEPTH:
            raise _Refused(None, None, f"nesting deeper than {MAX_DEPTH} levels", mark)
        self._depth += 1
        start = self._values
        self._values += 1
        self._open.append(anchor)
        node = super().compose_node(parent, index)
        self._open.pop()
        if anchor is not None:
            self._sizes[anchor] = self._values - start
        self._depth -= 1
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. `!!int abc`, `2024-13-45`
            shown = repr(node.value) if isinstance(node, yaml.ScalarNode) else "this value"
            kind = node.tag.rsplit(":", 1)[-1]
            raise _Refused(None, None, f"cannot read {shown} as {kind}: {exc}", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, then keys that override it
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if earlier is not key_node:
                    raise _Refused(None, None, f"duplicate key {key!r} (first on line {earlier.start_mark.line + 1})",
                                   key_node.start_mark)
        return super().construct_mapping(node, deep)


def _key_lines(root: yaml.Node | None) -> dict[tuple, int]:
    """1-based line of every key path in a composed YAML document (iterative: any depth)."""
    lines: dict[tuple, int] = {}
    stack: list[tuple[tuple, yaml.Node | None]] = [((), root)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            entries = [(key.value, key, value) for key, value in node.value if isinstance(key, yaml.ScalarNode)]
        elif isinstance(node, yaml.SequenceNode):
            entries = [(i, item, item) for i, item in enumerate(node.value)]
        else:
            continue
        for part, marked, child in entries:
            path = (*prefix, part)
            lines[path] = marked.start_mark.line + 1
            stack.append((path, child))
    return lines
