"""A YAML file's validation errors as `FILE:LINE: key.path: message` (`config_error`), for the
config (qcli.config) and the pipeline file (qcli.pipeline) alike."""

from __future__ import annotations

import copy
import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from qcli.errors import ConfigError


def config_error(
    exc: ValidationError, raw: dict, source: str, lines: dict[tuple, int], schema: type[BaseModel]
) -> ConfigError:
    """The first of `exc`'s problems as `source:line: key.path: message`, with a hint for an
    unknown key (the closest known one) and the count of the rest; `schema` names the keys."""
    first = exc.errors()[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    loc = tuple(p for p in loc if p not in ("tuple[float, float]",))
    key = key_path(loc)
    line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
    where = f"{source}:{line}" if line else source
    hint = None
    if first["type"] == "extra_forbidden":
        known = _known_keys(loc[:-1], schema)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        message = f"{where}: unknown key {key}"
    elif first["type"] == "invalid_key":  # `1: 2` (YAML keys may be numbers, ours are names)
        message = f"{where}: {key_path(loc[:-1])}: keys should be strings, got {loc[-1]!r}"
    else:
        given = _lookup(raw, loc)
        shown = f" (got {_shorten(repr(given))})" if given is not _MISSING else ""
        message = f"{where}: {key}: {first['msg']}{shown}"
    more = len(exc.errors()) - 1
    if more:
        hint = (hint + "; " if hint else "") + f"{more} more problem(s) after this one"
    return ConfigError(message, hint=hint)


_MISSING = object()


def _shorten(text: str, width: int = 80) -> str:
    """`text` cut to about `width` characters, after a comma when it has one (a value quoted back
    in an error message).

    >>> _shorten(repr(list(range(100))), 20), _shorten("'" + "x" * 30 + "'", 20)
    ('[0, 1, 2, 3, 4, ...', "'xxxxxxxxxxxxxxx ...")
    """
    if len(text) <= width:
        return text
    cut = text[: width - 4]
    return (cut[: cut.rfind(",") + 1] if "," in cut else cut) + " ..."


def key_path(loc: tuple) -> str:
    """`overrides[0].activations.dtype` from pydantic's ('overrides', 0, 'activations', 'dtype')."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return copy.deepcopy(node)


def _known_keys(loc: tuple, root: type[BaseModel]) -> list[str]:
    """Field names of the section at `loc` (list indices skipped)."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            inner = getattr(candidate, "__args__", (candidate,))
            found = next((c for c in (candidate, *inner) if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if found is not None:
                model = found
                break
        else:
            return []
    return list(model.model_fields)
