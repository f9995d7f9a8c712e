"""Read a data folder (DESIGN.md §2) as a stream of samples checked against the model's inputs.

Layouts, detected from the folder's contents:
- `*.npz`: one array per model input keyed by the input's name, optional `label`;
- `*.npy`: one array, for single-input models;
- ONNX test data: `test_data_set_*/input_<i>.pb` (+ `output_<i>.pb`, kept as reference outputs);
- images (`.png .jpg .jpeg .bmp`), at the top level or in class subfolders (`DIR/<class>/x.png`,
  sorted class names -> label ids, as torchvision's ImageFolder), decoded with Pillow and
  preprocessed as a `Preprocess` says;
- `labels.csv` (`file,label`) beside the samples gives or overrides labels for any layout.

Decisions (README "Data folders" says the same for users):
- Files are read in sorted order of their path relative to DIR; `samples=N` keeps the first N
  samples (a file holding a batch counts as that many samples).
- An array with the model input's rank is a batch whose first axis is the batch axis; one rank
  lower is a single sample and gets a batch axis of 1. Inputs whose first dimension is a fixed
  number cannot be batched: each file is then one run of the model.
- dtypes must match exactly (no silent float64 -> float32 casts: the error says how to convert);
  fixed dimensions must match; NaN/Inf in float inputs is an error naming file and input.
- Only one sample file is in memory at a time, plus the batch being assembled.
"""

from __future__ import annotations

import copy
import csv
import difflib
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from qcli.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
LABEL_KEY = "label"
LABELS_CSV = "labels.csv"


# --------------------------------------------------------------------------- model inputs


@dataclass(frozen=True)
class InputSpec:
    """A graph input as the data must supply it: name, numpy dtype, dims (int, str or None)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def batchable(self) -> bool:
        """True when the first axis is free (symbolic or unknown), so samples can be stacked."""
        return bool(self.shape) and not isinstance(self.shape[0], int)

    def shape_text(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed (graph inputs that are not initializers)."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims: list[int | str | None] = []
        for d in tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        specs.append(InputSpec(value.name, dtype, tuple(dims)))
    return specs


# --------------------------------------------------------------------------- images


@dataclass(frozen=True)
class Preprocess:
    """How images become model inputs: the YAML `data.preprocess` section.

    Order: decode (Pillow) -> channels -> resize -> center_crop -> float / scale -> (x - mean) / std
    -> layout -> dtype. `resize: N` scales the shorter side to N (aspect kept, bilinear);
    `resize: [H, W]` resizes exactly. `center_crop: N` or `[H, W]`.
    """

    resize: tuple[int, ...] | None = None
    center_crop: tuple[int, int] | None = None
    scale: float = 1.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    channels: str = "RGB"  # RGB | BGR | GRAY
    layout: str = "NCHW"  # NCHW | NHWC
    dtype: str = "float32"

    KEYS = ("resize", "center_crop", "scale", "mean", "std", "channels", "layout", "dtype")

    @classmethod
    def from_dict(cls, raw: object, where: str = "data.preprocess") -> Preprocess:
        """Validate a YAML mapping; errors name the key path `where.<key>`."""
        if not isinstance(raw, dict):
            raise DataError(f"{where} must be a mapping, got {type(raw).__name__}")
        for key in raw:
            if key not in cls.KEYS:
                close = difflib.get_close_matches(str(key), cls.KEYS, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(cls.KEYS)}"
                raise DataError(f"unknown key {where}.{key}", hint=hint)

        def ints(key: str, allowed: tuple[int, ...]) -> tuple[int, ...] | None:
            value = raw.get(key)
            if value is None:
                return None
            items = value if isinstance(value, list) else [value]
            if len(items) not in allowed or not all(isinstance(v, int) and v > 0 for v in items):
                raise DataError(f"{where}.{key} must be a positive integer or [height, width], got {value!r}")
            return tuple(items)

        def floats(key: str, default: tuple[float, ...]) -> tuple[float, ...]:
            value = raw.get(key)
            if value is None:
                return default
            items = value if isinstance(value, list) else [value]
            if not items or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
                raise DataError(f"{where}.{key} must be a number or a list of numbers, got {value!r}")
            return tuple(float(v) for v in items)

        def choice(key: str, options: tuple[str, ...], default: str) -> str:
            value = raw.get(key, default)
            if value not in options:
                raise DataError(f"{where}.{key} must be one of {', '.join(options)}, got {value!r}")
            return value

        crop = ints("center_crop", (1, 2))
        std = floats("std", (1.0,))
        if any(s == 0 for s in std):
            raise DataError(f"{where}.std must not contain 0")
        scale = floats("scale", (1.0,))
        if len(scale) != 1 or scale[0] == 0:
            raise DataError(f"{where}.scale must be one non-zero number, got {raw.get('scale')!r}")
        return cls(
            resize=ints("resize", (1, 2)),
            center_crop=(crop * 2 if crop and len(crop) == 1 else crop),  # type: ignore[arg-type]
            scale=scale[0],
            mean=floats("mean", (0.0,)),
            std=std,
            channels=choice("channels", ("RGB", "BGR", "GRAY"), "RGB"),
            layout=choice("layout", ("NCHW", "NHWC"), "NCHW"),
            dtype=choice("dtype", ("float32", "float16", "float64", "uint8", "int8"), "float32"),
        )

    def apply(self, path: Path) -> np.ndarray:
        """Decode and preprocess one image file into a [1, C, H, W] (or [1, H, W, C]) array."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                img = img.convert("L" if self.channels == "GRAY" else "RGB")
                if self.resize:
                    img = img.resize(self._resize_to(img.size), Image.BILINEAR)
                if self.center_crop:
                    img = self._crop(img, path)
                pixels = np.asarray(img)
        except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as exc:
            raise DataError(
                f"cannot read image {path}: {exc}",
                hint="the file is corrupt or not an image; remove or replace it",
            ) from exc
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        if self.channels == "BGR":
            pixels = pixels[:, :, ::-1]
        channels = pixels.shape[2]
        for key in ("mean", "std"):
            if len(getattr(self, key)) not in (1, channels):
                raise DataError(
                    f"data.preprocess.{key} has {len(getattr(self, key))} values for "
                    f"{channels}-channel ({self.channels}) images"
                )
        x = pixels.astype(np.float32) / np.float32(self.scale)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        if self.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        return np.ascontiguousarray(x[None]).astype(self.dtype, copy=False)

    def _resize_to(self, size: tuple[int, int]) -> tuple[int, int]:
        width, height = size
        assert self.resize is not None
        if len(self.resize) == 2:
            return self.resize[1], self.resize[0]
        short = self.resize[0]
        if width <= height:
            return short, max(1, round(height * short / width))
        return max(1, round(width * short / height)), short

    def _crop(self, img, path: Path):
        assert self.center_crop is not None
        crop_h, crop_w = self.center_crop
        width, height = img.size
        if crop_h > height or crop_w > width:
            raise DataError(
                f"image {path} is {height}x{width} after resize, smaller than center_crop "
                f"{crop_h}x{crop_w}",
                hint="set data.preprocess.resize at least as large as center_crop",
            )
        top, left = (height - crop_h) // 2, (width - crop_w) // 2
        return img.crop((left, top, left + crop_w, top + crop_h))


# --------------------------------------------------------------------------- samples


@dataclass
class Sample:
    """What one data file holds: arrays per input (leading batch axis), labels, reference outputs."""

    source: str  # path relative to the data folder, for messages
    inputs: dict[str, np.ndarray]
    label: np.ndarray | None = None  # int64 [batch]
    outputs: dict[str, np.ndarray] | None = None  # reference outputs (ONNX test data)

    @property
    def size(self) -> int:
        return next(iter(self.inputs.values())).shape[0] if self.inputs else 0


@dataclass
class Batch:
    """Consecutive samples stacked along the batch axis, with the files they came from."""

    inputs: dict[str, np.ndarray]
    label: np.ndarray | None
    outputs: dict[str, np.ndarray] | None
    sources: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return next(iter(self.inputs.values())).shape[0]


@dataclass(frozen=True, slots=True)
class _Entry:
    """One sample file (or test_data_set folder) found in the data folder. Small on purpose
    (the folder's root is shared, the path is built when read): a folder lists every entry."""

    root: Path
    rel: str  # path under root, '/'-separated
    kind: str  # npz | npy | pb | image
    class_label: int | None = None

    @property
    def path(self) -> Path:
        return self.root / self.rel


class DataFolder:
    """A data folder read as a stream of validated samples; see the module docstring.

    >>> folder = DataFolder("calib/", model_inputs(model), samples=128)
    >>> for batch in folder.batches(8): session.run(None, batch.inputs)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        inputs: list[InputSpec],
        *,
        preprocess: Preprocess | None = None,
        samples: int | None = None,
        labels: str | os.PathLike | None = None,
        start: int = 0,
    ):
        """`labels`: a labels.csv kept outside the folder (default: DIR/labels.csv if present);
        `start`: skip the first `start` samples (`samples` counts from there)."""
        self.path = Path(path)
        self.labels_file = Path(labels) if labels is not None else None
        self.inputs = inputs
        self.preprocess = preprocess
        self.limit = samples
        self.start = start
        if start < 0:
            raise DataError(f"the first sample must be at least 0, got {start}")
        if samples is not None and samples < 1:
            raise DataError(f"the number of samples must be at least 1, got {samples}")
        if not self.path.exists():
            raise DataError(f"data folder not found: {self.path}")
        if not self.path.is_dir():
            raise DataError(f"{self.path} is not a folder", hint="--data takes a folder of samples")
        self.entries, self.layout, self.class_names = self._scan()
        self.labels_csv = self._read_labels_csv()

    # -- discovery

    def _scan(self) -> tuple[list[_Entry], str, list[str]]:
        root = self.path
        # Names, not Path objects: a folder of 10,000 samples is listed whole, and its listing
        # is most of what reading it keeps in memory.
        files, dirs = [], []
        with os.scandir(root) as listing:
            for item in listing:
                if item.name.startswith("."):
                    continue
                if item.is_dir():
                    dirs.append(item.name)
                elif item.is_file():
                    files.append(item.name)
        files.sort()
        dirs.sort()
        test_sets = [d for d in dirs if d.startswith("test_data_set")]
        if test_sets:
            return [_Entry(root, d, "pb") for d in test_sets], "onnx-test-data", []
        by_kind: dict[str, list[str]] = {"npz": [], "npy": [], "image": []}
        for name in files:
            suffix = os.path.splitext(name)[1].lower()
            if suffix == ".npz":
                by_kind["npz"].append(name)
            elif suffix == ".npy":
                by_kind["npy"].append(name)
            elif suffix in IMAGE_EXTENSIONS:
                by_kind["image"].append(name)
        # As torchvision's ImageFolder: once any subfolder holds images, every subfolder is a
        # class (an empty one still takes its label id, so ids do not shift).
        subdirs = [root / d for d in dirs]
        has_images = any(_is_image(f) for d in subdirs for f in d.iterdir())
        class_dirs = subdirs if has_images else []
        found = [kind for kind, paths in by_kind.items() if paths]
        if class_dirs:
            found.append("image-folders")
        if not found:
            raise DataError(
                f"no samples found in {root}",
                hint="a data folder holds *.npz, *.npy, image files, image class subfolders, "
                "or test_data_set_*/input_<i>.pb folders",
            )
        if len(found) > 1:
            raise DataError(
                f"{root} mixes sample layouts ({', '.join(found)})",
                hint="keep one kind of sample file per data folder",
            )
        kind = found[0]
        if kind == "image-folders":
            class_names = [p.name for p in class_dirs]
            entries = [
                _Entry(root, f"{d.name}/{f.name}", "image", class_label=i)
                for i, d in enumerate(class_dirs)
                for f in sorted(d.iterdir())
                if _is_image(f)
            ]
            return entries, "image-folders", class_names
        entries = [_Entry(root, name, kind) for name in by_kind[kind]]
        return entries, kind, []

    def _read_labels_csv(self) -> dict[str, np.ndarray]:
        path = self.labels_file or self.path / LABELS_CSV
        if self.labels_file is not None and not path.is_file():
            raise DataError(f"labels file not found: {path}", hint="--labels takes a CSV file of file,label rows")
        if not path.is_file():
            return {}
        labels: dict[str, np.ndarray] = {}
        try:
            with open(path, newline="") as fh:
                rows = list(csv.reader(fh))
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read {path}: {exc}") from exc
        if rows and [c.strip().lower() for c in rows[0]] == ["file", "label"]:
            rows = rows[1:]
        known = {e.rel for e in self.entries}
        for line, row in enumerate(rows, start=2):
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
                    f"{path}:{line}: {name!r} is not a sample file in {self.path}",
                    hint=f"did you mean {close[0]!r}?" if close else "names are relative to the data folder",
                )
        return labels

    # -- reading

    def __len__(self) -> int:
        """Number of samples the stream yields (reads only array headers, not data)."""
        total = 0
        for entry in self.entries:
            total += self._entry_size(entry)
            if self.limit is not None and total >= self.start + self.limit:
                return self.limit
        return max(total - self.start, 0)

    def _entry_size(self, entry: _Entry) -> int:
        spec = self.inputs[0] if self.inputs else None
        if entry.kind == "image" or spec is None:
            return 1
        if entry.kind == "npz":
            shape = _npz_member_shape(entry.path, spec.name)
        elif entry.kind == "npy":
            shape = _npy_shape(entry.path)
        else:
            return 1 if not spec.batchable else self.read(entry).size
        if shape is None:
            return 1
        return shape[0] if len(shape) == len(spec.shape) and spec.batchable else 1

    def entry_sizes(self) -> list[int]:
        """Samples each file gives, in order, for the files the stream reads (the last one
        cut to `samples=N`); from array headers, as `len`. For folders read from their first
        sample (`start=0`: calibration data, which is what is sharded)."""
        sizes: list[int] = []
        total = 0
        for entry in self.entries:
            if self.limit is not None and total >= self.limit:
                break
            size = self._entry_size(entry)
            if self.limit is not None:
                size = min(size, self.limit - total)
            sizes.append(size)
            total += size
        return sizes

    def subset(self, start: int, stop: int, samples: int | None = None) -> DataFolder:
        """This folder restricted to its files `start..stop-1` (and their first `samples`
        samples): a shard that a worker reads on its own. Holds paths, not arrays."""
        part = copy.copy(self)
        part.entries = self.entries[start:stop]
        part.limit = samples
        names = {e.rel for e in part.entries}
        part.labels_csv = {k: v for k, v in self.labels_csv.items() if k in names}
        return part

    def __iter__(self) -> Iterator[Sample]:
        """Validated samples in sorted file order, one file in memory at a time."""
        remaining, skip = self.limit, self.start
        for entry in self.entries:
            if skip and (size := self._entry_size(entry)) <= skip:
                skip -= size  # read only the headers of skipped files
                continue
            sample = self.read(entry)
            if skip:
                sample, skip = _take(sample, skip, sample.size), 0
            if remaining is not None:
                if remaining <= 0:
                    return
                if sample.size > remaining:
                    sample = _take(sample, remaining)
                remaining -= sample.size
            yield sample

    def read(self, entry: _Entry) -> Sample:
        """Load one entry and check it against the model inputs."""
        if entry.kind == "npz":
            arrays = _load_npz(entry.path)
            label = arrays.pop(LABEL_KEY, None)
            sample = Sample(entry.rel, arrays, label)
        elif entry.kind == "npy":
            if len(self.inputs) != 1:
                raise DataError(
                    f"{entry.path}: .npy files feed single-input models, but the model has "
                    f"{len(self.inputs)} inputs ({', '.join(s.name for s in self.inputs)})",
                    hint="store each sample as .npz with one array per input name",
                )
            sample = Sample(entry.rel, {self.inputs[0].name: _load_npy(entry.path)})
        elif entry.kind == "pb":
            sample = self._read_test_data_set(entry)
        else:
            if self.preprocess is None:
                raise DataError(
                    f"{self.path} holds images but no preprocessing is configured",
                    hint="add a data.preprocess section (resize, scale, mean, std, channels, "
                    "layout) to the YAML given with --config",
                )
            if len(self.inputs) != 1:
                raise DataError(f"images feed single-input models; the model has {len(self.inputs)} inputs")
            image = self.preprocess.apply(entry.path)
            label = None if entry.class_label is None else np.array([entry.class_label], np.int64)
            sample = Sample(entry.rel, {self.inputs[0].name: image}, label)
        if entry.rel in self.labels_csv:
            sample.label = self.labels_csv[entry.rel]
        return self._validate(sample)

    def _read_test_data_set(self, entry: _Entry) -> Sample:
        def tensors(prefix: str) -> list[tuple[str, np.ndarray]]:
            found = sorted(
                entry.path.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1])
                if p.stem.split("_")[-1].isdigit() else 1 << 30
            )
            out = []
            for p in found:
                proto = onnx.TensorProto()
                try:
                    proto.ParseFromString(p.read_bytes())
                    out.append((proto.name, numpy_helper.to_array(proto)))
                except Exception as exc:  # DecodeError, or a tensor numpy cannot represent
                    raise DataError(f"cannot read tensor file {p}: {exc}") from exc
            return out

        inputs = tensors("input")
        if len(inputs) != len(self.inputs):
            raise DataError(
                f"{entry.rel}: {len(inputs)} input_<i>.pb files for a model with "
                f"{len(self.inputs)} inputs ({', '.join(s.name for s in self.inputs)})"
            )
        names = {s.name for s in self.inputs}
        arrays = {}
        for (name, array), spec in zip(inputs, self.inputs):
            arrays[name if name in names else spec.name] = array
        outputs = dict(tensors("output")) or None
        return Sample(entry.rel, arrays, outputs=outputs)

    def _validate(self, sample: Sample) -> Sample:
        where = self.path / sample.source
        expected = {s.name for s in self.inputs}
        for key in sample.inputs:
            if key not in expected:
                close = difflib.get_close_matches(key, sorted(expected), n=1)
                raise DataError(
                    f"{where}: array {key!r} is not a model input "
                    f"(inputs: {', '.join(sorted(expected))})",
                    hint=f"did you mean {close[0]!r}?" if close else
                    f"name each array after a model input; '{LABEL_KEY}' holds labels",
                )
        batch = None
        for spec in self.inputs:
            if spec.name not in sample.inputs:
                raise DataError(
                    f"{where}: missing input {spec.name!r} (model inputs: "
                    f"{', '.join(s.name for s in self.inputs)})",
                    hint="each sample file needs one array per model input, keyed by its name",
                )
            array = _with_batch_axis(sample.inputs[spec.name], spec, where)
            if array.dtype != spec.dtype:
                raise DataError(
                    f"{where}: input {spec.name!r} is {array.dtype}, the model expects {spec.dtype}",
                    hint=f"convert the data, e.g. array.astype(numpy.{spec.dtype})",
                )
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                bad = int(array.size - np.isfinite(array).sum())
                raise DataError(
                    f"{where}: input {spec.name!r} contains {bad} NaN or Inf value(s)",
                    hint="fix or drop this sample; calibration needs finite values",
                )
            if batch is not None and spec.batchable and array.shape[0] != batch:
                raise DataError(f"{where}: inputs disagree on the batch size ({array.shape[0]} vs {batch})")
            if spec.batchable:
                batch = array.shape[0]
            sample.inputs[spec.name] = array
        if sample.label is not None:
            label = np.asarray(sample.label)
            if not np.issubdtype(label.dtype, np.integer):
                raise DataError(f"{where}: '{LABEL_KEY}' must hold integers, got {label.dtype}")
            label = label.reshape(-1).astype(np.int64)
            if label.shape[0] != sample.size:
                raise DataError(
                    f"{where}: {label.shape[0]} label(s) for a batch of {sample.size} sample(s)"
                )
            sample.label = label
        return sample

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Stack consecutive samples whose shapes agree into batches of up to `batch_size`.

        A new batch starts whenever a sample's shapes (past the batch axis) differ from the
        pending ones, so variable-length data (e.g. token sequences) still batches where it can.
        """
        if batch_size < 1:
            raise DataError(f"the batch size must be at least 1, got {batch_size}")
        stackable = all(spec.batchable for spec in self.inputs)
        pending: list[Sample] = []
        count = 0
        for sample in self:
            if not stackable:
                yield _stack([sample])
                continue
            for part in _split(sample, batch_size):
                if pending and (
                    _signature(pending[0]) != _signature(part) or count + part.size > batch_size
                ):
                    yield _stack(pending)
                    pending, count = [], 0
                pending.append(part)
                count += part.size
        if pending:
            yield _stack(pending)


# --------------------------------------------------------------------------- helpers


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}", hint="the file is corrupt or not a .npz archive") from exc


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}", hint="the file is corrupt or not a .npy array") from exc


def _npy_shape(path: Path) -> tuple[int, ...] | None:
    try:
        with open(path, "rb") as fh:
            return _read_npy_header(fh)
    except (OSError, ValueError):
        return None


def _npz_member_shape(path: Path, name: str) -> tuple[int, ...] | None:
    try:
        with zipfile.ZipFile(path) as zf, zf.open(name + ".npy") as fh:
            return _read_npy_header(fh)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _read_npy_header(fh) -> tuple[int, ...]:
    version = np.lib.format.read_magic(fh)
    reader = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }.get(version)
    if reader is None:
        raise ValueError(f"unsupported .npy version {version}")
    shape, _, _ = reader(fh)
    return tuple(shape)


def _with_batch_axis(array: np.ndarray, spec: InputSpec, where: Path) -> np.ndarray:
    """Give a single sample its batch axis; check rank and fixed dimensions."""
    rank = len(spec.shape)
    if array.ndim == rank - 1 and spec.batchable:
        array = array[None]
    if array.ndim != rank:
        raise DataError(
            f"{where}: input {spec.name!r} has shape {list(array.shape)}, the model expects "
            f"{spec.shape_text()} (rank {rank})",
            hint="store one sample without the batch axis, or a batch with it",
        )
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and array.shape[axis] != dim:
            raise DataError(
                f"{where}: input {spec.name!r} has shape {list(array.shape)}, the model expects "
                f"{spec.shape_text()} (axis {axis} must be {dim})",
                hint="resize or reshape the data to the model's input shape",
            )
    return array


def _signature(sample: Sample) -> tuple:
    return tuple((k, v.shape[1:]) for k, v in sorted(sample.inputs.items()))


def _take(sample: Sample, start: int, stop: int | None = None) -> Sample:
    """Samples [start:stop] of a batch (or [0:start] when only one bound is given)."""
    if stop is None:
        start, stop = 0, start
    cut = slice(start, stop)
    return Sample(
        sample.source,
        {k: v[cut] for k, v in sample.inputs.items()},
        None if sample.label is None else sample.label[cut],
        None if sample.outputs is None else {k: v[cut] for k, v in sample.outputs.items()},
    )


def _split(sample: Sample, size: int) -> Iterator[Sample]:
    if sample.size <= size:
        yield sample
        return
    for start in range(0, sample.size, size):
        yield _take(sample, start, min(start + size, sample.size))


def _stack(samples: list[Sample]) -> Batch:
    """Concatenate samples; labels/outputs only when every sample has them."""
    sources = [s.source for s in samples]
    if len(samples) == 1:
        s = samples[0]
        return Batch(s.inputs, s.label, s.outputs, sources)
    inputs = {k: np.concatenate([s.inputs[k] for s in samples]) for k in samples[0].inputs}
    labels = [s.label for s in samples]
    label = np.concatenate(labels) if all(x is not None for x in labels) else None
    outs = [s.outputs for s in samples]
    outputs = None
    if all(o is not None for o in outs):
        try:
            outputs = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}  # type: ignore[index]
        except (KeyError, ValueError):
            outputs = None
    return Batch(inputs, label, outputs, sources)
