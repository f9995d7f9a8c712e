"""Output files: checked before the work (`check_writable`), so that a run never computes for
minutes and then fails to save; written atomically (`write_text_atomic`: a temporary file in
the target's folder, usual umask permissions unlike mkstemp's private 0600, then a rename), so
that a crash never leaves a half-written one. Failures are OutputError (exit 2) naming the path."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from pathlib import Path

from qcli.errors import OutputError


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """`path`, or OutputError if `what` (e.g. "the quantized model") cannot be written there:
    the path is a folder, a folder on the way is a file or cannot be created, or the folder takes
    no new files. The check really creates the missing folders and a file, then removes them
    (only trying tells, e.g. under /proc, or for root on a read-only mount)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {what} to {path}: it is a folder", hint="give a file name")
    missing = []
    folder = path.parent
    while not folder.exists() and not folder.is_symlink():
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        kind = "a broken link" if folder.is_symlink() else "a file"
        raise OutputError(f"cannot write {what} to {path}: {folder} is {kind}, not a folder")
    created: list[Path] = []
    try:
        for step in reversed(missing):
            doing = f"cannot create the folder {step}"
            step.mkdir()
            created.append(step)
        doing = f"cannot create files in {path.parent}"
        probe = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.probe"
        probe.open("x").close()
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write {what} to {path}: {doing} ({_reason(exc)})") from exc
    finally:
        for step in reversed(created):
            with contextlib.suppress(OSError):
                step.rmdir()
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically (the folder is created when missing); OutputError on failure."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "x", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from exc
        raise
    return path


def write_error(path: Path, exc: OSError) -> OutputError:
    """The error for an OSError met writing `path`, the last line of defence behind `check_writable`."""
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    return OutputError(f"cannot write {path}: " + (f"{blocker} is a file, not a folder" if blocker else _reason(exc)))


def _reason(exc: OSError) -> str:
    return "it is a folder" if exc.errno == errno.EISDIR else exc.strerror or str(exc)
