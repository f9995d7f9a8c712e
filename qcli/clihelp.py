"""How qcli's help is written: click's style (flags without a value, arguments by name in
capitals, `MODEL` in the usage line) where typer writes `--json <bool>` and `{model}`."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


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

    def get_params(self, ctx: Any) -> list[Any]:  # typer's own (vendored) click types
        return _click_style(super().get_params(ctx))  # includes the --help option typer adds

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
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
    def get_params(self, ctx: Any) -> list[Any]:  # typer's own (vendored) click types
        return _click_style(super().get_params(ctx))


class ClickStyleTyper(typer.Typer):
    """typer.Typer whose commands and groups write click-style help (`_Command`, `_Group`)."""

    def __init__(self, **kwargs: Any):
        super().__init__(cls=_Group, **kwargs)

    def command(self, *args: Any, **kwargs: Any):
        return super().command(*args, cls=_Command, **kwargs)
