"""YAML configuration files: reading them with clear errors, and the sections in use so far.

Only the `data.preprocess` section is read yet; the full schema (DESIGN.md §3) is validated
here once calibration and quantization settings exist.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from qcli.data import Preprocess
from qcli.errors import ConfigError, DataError


def load_yaml(path: str | os.PathLike) -> dict:
    """Parse a YAML file into a mapping; syntax errors name the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    return raw


def load_preprocess(path: str | os.PathLike | None) -> Preprocess | None:
    """The `data.preprocess` section of a config file, validated, or None when absent."""
    if path is None:
        return None
    raw = load_yaml(path)
    data = raw.get("data")
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: 'data' must be a mapping")
    if "preprocess" not in data:
        return None
    try:
        return Preprocess.from_dict(data["preprocess"])
    except DataError as exc:
        raise ConfigError(f"{path}: {exc.message}", hint=exc.hint) from exc
