"""A text data folder: `.txt` / `.jsonl` files and the model's `tokenizer.json`, read as token chunks.

Decisions (docs/guides/data-folders.md says the same for users):
- The folder holds `tokenizer.json` (Hugging Face's format, read with the `tokenizers` package, the
  `text` extra) beside the text; without it, text files are not samples (a README.txt beside
  `.npz` samples stays ignored).
- Each file is one document: a `.txt` file's whole text; a `.jsonl` file's records' `"text"`
  fields, joined by blank lines. A document is encoded once and cut into chunks of `seq_len`
  tokens (default `DEFAULT_SEQ_LEN`), one sample each; the tail past the last whole chunk is
  dropped (every chunk of a file has one length, so they batch), and a file shorter than
  `seq_len` is one shorter chunk.
- A chunk feeds the model as a prompt with no past (prefill): `input_ids`, `attention_mask` all
  ones, `position_ids` 0..L-1, `token_type_ids` zeros, and every past key/value input (a name
  with `past`) empty along its free axis. Any other input is refused: a text folder cannot
  know its values.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from qcli.data.inputs import InputSpec
from qcli.data.samples import Sample
from qcli.errors import DataError
from qcli.textfile import read_text

TOKENIZER = "tokenizer.json"
TEXT_EXTENSIONS = (".txt", ".jsonl")
DEFAULT_SEQ_LEN = 128
FILLED = ("input_ids", "attention_mask", "position_ids", "token_type_ids")


def documents(path: Path) -> str:
    """The text of one file: a .txt file whole, a .jsonl file's `"text"` fields joined by blank lines."""
    text = read_text(path, "text file", DataError)
    if path.suffix.lower() != ".jsonl":
        return text
    parts = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{line_no}: not a JSON record: {exc.msg}",
                            hint='a .jsonl file holds one JSON object per line, with its text as "text"') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f'{path}:{line_no}: a record without a "text" string',
                            hint='a .jsonl file holds one JSON object per line, with its text as "text"')
        parts.append(record["text"])
    return "\n\n".join(parts)


@functools.lru_cache(maxsize=4)
def tokenizer(path: Path):  # -> tokenizers.Tokenizer (an optional package: no annotation)
    """The tokenizer saved at `path` (cached: every file of a folder uses it)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(f"{path.parent} is a text data folder, and reading it needs the tokenizers package",
                        hint="pip install 'qcli[text]'") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type for a malformed file
        raise DataError(f"cannot read the tokenizer {path}: {exc}",
                        hint="save it with the model's tokenizer: tokenizer.save('tokenizer.json')") from None


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=256)
def _encoded(path: Path, *stamps: int) -> tuple[int, ...]:
    """A file's token ids, encoded once per version of it and of the tokenizer (`stamps`: their
    modification times and sizes): a folder's files are read again to be counted (`len`), held
    back and batched, and would be encoded each time."""
    return tuple(tokenizer(path.parent / TOKENIZER).encode(documents(path)).ids)


def chunks(ids: list[int], seq_len: int) -> list[list[int]]:
    """`ids` cut into runs of `seq_len` (the tail past the last whole run dropped), or one shorter
    run when there are fewer than `seq_len` but at least 2: the rows of one [N, L] batch.

    >>> [len(c) for c in chunks(list(range(10)), 4)], [len(c) for c in chunks(list(range(3)), 4)], chunks([7], 4)
    ([4, 4], [3], [])
    """
    if len(ids) < seq_len:
        return [ids] if len(ids) >= 2 else []
    return [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]


def read_text_file(path: Path, rel: str, inputs: list[InputSpec], seq_len: int) -> Sample:
    """The chunks of one text file as one sample holding a batch (one row per chunk)."""
    if seq_len < 2:
        raise DataError(f"the text chunk length must be at least 2 tokens, got {seq_len}",
                        hint="--seq-len N (data.seq_len) with N >= 2: a token is predicted from those before it")
    ids = _encoded(path, *_stamp(path), *_stamp(path.parent / TOKENIZER))
    rows = chunks(list(ids), seq_len)
    if not rows:
        raise DataError(f"{path}: too little text ({len(ids)} token) for a chunk",
                        hint="a chunk holds at least 2 tokens: remove the file or add text")
    return Sample(rel, feeds(np.array(rows, np.int64), inputs, path))


def feeds(ids: np.ndarray, inputs: list[InputSpec], path: Path) -> dict[str, np.ndarray]:
    """The model's inputs for token rows `ids` [N, L] as a prompt with no past (module docstring)."""
    n, length = ids.shape
    out: dict[str, np.ndarray] = {}
    for spec in inputs:
        if spec.name == "input_ids":
            out[spec.name] = ids.astype(spec.dtype)
        elif spec.name in ("attention_mask", "position_ids", "token_type_ids"):
            value = {"attention_mask": np.ones((n, length)), "position_ids": np.tile(np.arange(length), (n, 1)),
                     "token_type_ids": np.zeros((n, length))}[spec.name]
            out[spec.name] = value.astype(spec.dtype)
        elif "past" in spec.name:
            out[spec.name] = np.zeros(_empty_past(spec, n), spec.dtype)
        else:
            raise DataError(
                f"{path.parent} is a text data folder, which cannot feed the model's input {spec.name!r} "
                f"{spec.shape_text()}",
                hint="a text folder feeds " + ", ".join(FILLED) + " and past key/value inputs; "
                "give other models .npz samples")
    if "input_ids" not in out:
        raise DataError(f"{path.parent} is a text data folder, but the model has no input named 'input_ids'",
                        hint="a text folder feeds token ids to an input named input_ids; give this model .npz samples")
    return out


def _empty_past(spec: InputSpec, batch: int) -> tuple[int, ...]:
    """A past key/value input's shape with nothing cached: `batch` first, its free axis 0."""
    free = [i for i, d in enumerate(spec.shape) if i and not isinstance(d, int)]
    if len(free) != 1:
        raise DataError(f"cannot tell the past-length axis of the model's input {spec.name!r} {spec.shape_text()}",
                        hint="a past key/value input has one free axis besides the batch: its past length")
    return tuple(batch if i == 0 else 0 if i == free[0] else int(d)  # type: ignore[arg-type]
                 for i, d in enumerate(spec.shape))
