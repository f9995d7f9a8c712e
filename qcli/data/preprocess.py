"""How images become model inputs: the YAML `data.preprocess` section, and decoding with Pillow."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qcli.errors import DataError


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
