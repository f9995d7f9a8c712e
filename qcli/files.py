"""Writing text files so that a crash never leaves a half-written one: a temporary file in the
target's folder (usual umask permissions, unlike mkstemp's private 0600), then a rename."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically (the folder is created when missing); OSError on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
