"""What a data folder holds: its sample entries, their kind, and the labels given beside them.

A folder holds one layout: `*.npz`, `*.npy`, images, image class subfolders (sorted class names
-> label ids, as torchvision's ImageFolder), ONNX test data sets, or text (`*.txt` / `*.jsonl`
with a `tokenizer.json`: qcli.data.text); mixing layouts is refused.
Entries are listed in sorted order of their path under the folder. `labels.csv` (`file,label`)
gives or overrides the label of any entry.
"""

from __future__ import annotations

import csv
import difflib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from qcli.data.text import TEXT_EXTENSIONS, TOKENIZER
from qcli.errors import DataError
from qcli.textfile import read_text

EntryKind = Literal["npz", "npy", "pb", "image", "text"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
LABELS_CSV = "labels.csv"
_KIND_BY_SUFFIX: dict[str, EntryKind] = {".npz": "npz", ".npy": "npy", **dict.fromkeys(IMAGE_EXTENSIONS, "image")}


@dataclass(frozen=True, slots=True)
class Entry:
    """One sample file (or test_data_set folder) found in the data folder. Small on purpose
    (the folder's root is shared, the path is built when read): a folder lists every entry."""

    root: Path
    rel: str  # path under root, '/'-separated
    kind: EntryKind
    class_label: int | None = None

    @property
    def path(self) -> Path:
        return self.root / self.rel


@dataclass(frozen=True)
class Scan:
    """A folder's entries in reading order, its layout (as reported), and its class names."""

    entries: list[Entry]
    layout: str  # npz | npy | image | image-folders | onnx-test-data | text
    class_names: list[str]


def scan(root: Path) -> Scan:
    """The entries of the folder `root`, all of one layout."""
    files, dirs = _listing(root)
    test_sets = [d for d in dirs if d.startswith("test_data_set")]
    if test_sets:
        return Scan([Entry(root, d, "pb") for d in test_sets], "onnx-test-data", [])
    # in the order mixes are named
    by_kind: dict[EntryKind, list[str]] = {"npz": [], "npy": [], "image": [], "text": []}
    kinds: dict[str, EntryKind] = dict(_KIND_BY_SUFFIX)
    if TOKENIZER in files:
        kinds.update(dict.fromkeys(TEXT_EXTENSIONS, "text"))
    for name in files:
        suffix = os.path.splitext(name)[1].lower()
        if suffix in kinds:
            by_kind[kinds[suffix]].append(name)
    # As torchvision's ImageFolder: once any subfolder holds images, every subfolder is a
    # class (an empty one still takes its label id, so ids do not shift).
    subdirs = [root / d for d in dirs]
    has_images = any(is_image(f) for d in subdirs for f in d.iterdir())
    found: list[str] = [kind for kind, names in by_kind.items() if names]
    if has_images:
        found.append("image-folders")
    if not found:
        raise DataError(
            f"no samples found in {root}",
            hint="a data folder holds *.npz, *.npy, image files, image class subfolders, "
            "test_data_set_*/input_<i>.pb folders, or *.txt / *.jsonl text with the model's tokenizer.json"
            + (" (text files are samples only beside a tokenizer.json)" if any(
                os.path.splitext(name)[1].lower() in TEXT_EXTENSIONS for name in files) else ""),
        )
    if len(found) > 1:
        raise DataError(
            f"{root} mixes sample layouts ({', '.join(found)})",
            hint="keep one kind of sample file per data folder",
        )
    if has_images:
        return _image_folders(root, subdirs)
    layout = next(kind for kind, names in by_kind.items() if names)
    return Scan([Entry(root, name, layout) for name in by_kind[layout]], layout, [])


def _listing(root: Path) -> tuple[list[str], list[str]]:
    """Sorted names of the files and of the subfolders of `root`, hidden ones left out. Names, not
    Path objects: a folder of 10,000 samples is listed whole, and its listing is most of what
    reading it keeps in memory."""
    files, dirs = [], []
    with os.scandir(root) as listing:
        for item in listing:
            if item.name.startswith("."):
                continue
            if item.is_dir():
                dirs.append(item.name)
            elif item.is_file():
                files.append(item.name)
    return sorted(files), sorted(dirs)


def _image_folders(root: Path, class_dirs: list[Path]) -> Scan:
    entries = [
        Entry(root, f"{d.name}/{f.name}", "image", class_label=i)
        for i, d in enumerate(class_dirs)
        for f in sorted(d.iterdir())
        if is_image(f)
    ]
    return Scan(entries, "image-folders", [d.name for d in class_dirs])


def is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")


def read_labels(root: Path, entries: list[Entry], labels_file: Path | None = None) -> dict[str, np.ndarray]:
    """Labels by entry path from `labels_file` (default: `root/labels.csv` when present).

    Rows are `file,label`, with an optional header; a file holding a batch takes space-separated
    integers. A row naming no entry of the folder is an error (a typo would drop its label).
    """
    path = labels_file or root / LABELS_CSV
    if labels_file is not None and not path.is_file():
        raise DataError(f"labels file not found: {path}", hint="--labels takes a CSV file of file,label rows")
    if not path.is_file():
        return {}
    reader = csv.reader(io.StringIO(read_text(path, "labels file", DataError), newline=""))
    try:
        rows = list(reader)
    except csv.Error as exc:  # a field over csv.field_size_limit(): no file name is that long
        raise DataError(f"{path}:{reader.line_num}: cannot read the CSV: {exc}") from None
    header = bool(rows) and [c.strip().lower() for c in rows[0]] == ["file", "label"]
    known = {e.rel for e in entries}
    labels: dict[str, np.ndarray] = {}
    for line, row in enumerate(rows[1:] if header else rows, start=2 if header else 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 2:
            raise DataError(f"{path}:{line}: expected 'file,label', got {','.join(row)!r}")
        name, value = row[0].strip(), row[1].strip()
        try:
            labels[name] = np.array([int(v) for v in value.split()], dtype=np.int64)
        except ValueError as exc:
            raise DataError(
                f"{path}:{line}: label {value!r} is not an integer "
                "(a file holding a batch takes space-separated integers)"
            ) from exc
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise DataError(
                f"{path}:{line}: {name!r} is not a sample file in {root}",
                hint=f"did you mean {close[0]!r}?" if close else "names are relative to the data folder",
            )
    return labels
