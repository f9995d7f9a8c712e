"""How images become model inputs: the YAML `data.preprocess` section, and decoding with Pillow.

Validated as the rest of the config (pydantic, unknown keys refused): loaded through
`qcli.config`, an error names the file, the line and the key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from qcli.errors import DataError


class Preprocess(BaseModel):
    """How images become model inputs: the YAML `data.preprocess` section.

    Order: decode (Pillow) -> channels -> resize -> center_crop -> float / scale -> (x - mean) / std
    -> layout -> dtype. `resize: N` scales the shorter side to N (aspect kept, bilinear);
    `resize: [H, W]` resizes exactly. `center_crop: N` or `[H, W]`. A number where a list is
    expected is a list of one; a null value is the default.

    >>> pre = Preprocess.from_dict({"resize": 256, "center_crop": 224, "scale": 255, "mean": [0.5, 0.4, 0.3]})
    >>> pre.resize, pre.center_crop, pre.scale, pre.mean, pre.channels
    ((256,), (224, 224), 255.0, (0.5, 0.4, 0.3), 'RGB')
    >>> Preprocess.from_dict({"std": [0.2, 0]})
    Traceback (most recent call last):
    qcli.errors.DataError: data.preprocess.std: must not contain 0 (got [0.2, 0])
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .nan/.inf: no mean or std

    resize: tuple[int, ...] | None = Field(None, json_schema_extra={"values": "int N, or [H, W], or `null`"},
                                           description="`N`: the shorter side to N, aspect kept; `[H, W]`: "
                                           "exactly; bilinear")
    center_crop: tuple[int, int] | None = Field(None, json_schema_extra={"values": "int N, or [H, W], or `null`"},
                                                description="the center N x N or H x W pixels")
    scale: float = Field(1.0, description="pixel values are divided by it (255: to 0..1)")
    mean: tuple[float, ...] = Field((0.0,), json_schema_extra={"values": "float, or one per channel"},
                                    description="subtracted after scaling")
    std: tuple[float, ...] = Field((1.0,), json_schema_extra={"values": "float, or one per channel (no 0)"},
                                   description="divides after the mean is subtracted")
    channels: Literal["RGB", "BGR", "GRAY"] = Field("RGB", description="the channel order (or gray) decoded")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="channels first or last")
    dtype: Literal["float32", "float16", "float64", "uint8", "int8"] = Field("float32", description=(
        "the input's element type"))

    @field_validator("resize", "center_crop", mode="before")
    @classmethod
    def _size(cls, value: Any, info: ValidationInfo) -> tuple[int, ...] | None:
        if value is None:
            return None
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if len(items) not in (1, 2) or not all(_is_int(v) and v > 0 for v in items):
            raise ValueError("must be a positive integer or [height, width]")
        if info.field_name == "center_crop" and len(items) == 1:
            items *= 2
        return tuple(items)

    @field_validator("mean", "std", mode="before")
    @classmethod
    def _per_channel(cls, value: Any, info: ValidationInfo) -> tuple[float, ...]:
        if value is None:
            return cls.model_fields[str(info.field_name)].default
        numbers = _numbers(value)
        if info.field_name == "std" and 0 in numbers:
            raise ValueError("must not contain 0")
        return numbers

    @field_validator("scale", mode="before")
    @classmethod
    def _scale(cls, value: Any) -> float:
        if value is None:
            return 1.0
        numbers = _numbers(value)
        if len(numbers) != 1 or numbers[0] == 0:
            raise ValueError("must be one non-zero number")
        return numbers[0]

    @classmethod
    def from_dict(cls, raw: object, where: str = "data.preprocess") -> Preprocess:
        """Validate a mapping (parsed YAML); errors name the key path `where.<key>`."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise _data_error(exc, where) from None

    def apply(self, path: Path) -> np.ndarray:
        """Decode and preprocess one image file into a [1, C, H, W] (or [1, H, W, C]) array."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as file:
                img = file.convert("L" if self.channels == "GRAY" else "RGB")
                if self.resize:
                    img = img.resize(self._resize_to(img.size), Image.Resampling.BILINEAR)
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
        x: np.ndarray = pixels.astype(np.float32) / np.float32(self.scale)
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(value: Any) -> tuple[float, ...]:
    """A number or a non-empty list of numbers, as floats (booleans are not numbers here)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        raise ValueError("must be a number or a list of numbers")
    return tuple(float(v) for v in items)


def _data_error(exc: ValidationError, where: str) -> DataError:
    """The first of pydantic's errors as a DataError naming `where.<key>` (as config.py's
    errors do, without a file)."""
    first = exc.errors()[0]
    key = ".".join([where, *(str(p) for p in first["loc"])])
    if first["type"] == "extra_forbidden":
        known = list(Preprocess.model_fields)
        close = difflib.get_close_matches(str(first["loc"][-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        return DataError(f"unknown key {key}", hint=hint)
    message = first["msg"].removeprefix("Value error, ")
    return DataError(f"{key}: {message} (got {first['input']!r})")
