#!/usr/bin/env python3
"""Rebuild qcli's sample models: train, export to ONNX, write calibration/eval data and READMEs.

Run from the repository root inside the build-only venv (``make sample-models``)::

    python sample_models/build.py [--only cnn|transformer|mlp]

Everything is deterministic: fixed seeds, ``torch.use_deterministic_algorithms(True)``, two
threads, sorted file lists, and npz files written with fixed zip timestamps, so a rebuild on the
same package versions (``requirements-build.txt``) reproduces the same files.

Three models are built, each into ``sample_models/<name>/``:

* ``cnn``: small ResNet-style digit classifier (Conv/BatchNormalization/Relu/MaxPool/Add/Gemm),
  opset 17, plus the eval set as PNG files and the ``preprocess.yaml`` that maps them to tensors.
* ``transformer``: 2-layer Transformer encoder classifying lines of text (Python / C++ / prose),
  byte-level tokens, dynamic batch and sequence axes, padding mask computed inside the graph.
* ``mlp``: Gemm/Relu classifier at opset 11 whose weights live in ``Constant`` nodes.

The data-folder contract (DESIGN.md §2): one ``NNNNN.npz`` per sample, keyed by the model's input
names, each array with a leading batch dimension of 1, plus ``label`` (int64, shape ``[1]``).
Nothing outside this script (qcli, its tests) may depend on torch.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning. Numerics are unchanged, but when other work
# shares the 2 cores, spinning threads made training 4-6x slower (measured). Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import ast
import collections
import io
import platform
import random
import shutil
import sys
import sysconfig
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
SEED = 0

# torch 2.13 still ships the TorchScript exporter (dynamo=False) but warns that it is deprecated.
# We use it on purpose: it names nodes after the module path (/layer1/conv1/Conv) and keeps
# BatchNormalization nodes, which is what real-world exported models look like. The dynamo
# exporter names nodes node_Conv_11 and folds BatchNorm into the Conv.
warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------

def seed_everything(seed: int = SEED) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write a compressed .npz that ``np.load`` reads, byte-identical across rebuilds.

    ``np.savez_compressed`` stamps every zip entry with the current time, so each rebuild would
    change every sample file in git; here the timestamp is fixed.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, arr in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
    path.write_bytes(buf.getvalue())


def write_samples(folder: Path, samples: list[dict[str, np.ndarray]]) -> None:
    """Replace ``folder`` with one ``00000.npz``-style file per sample (sorted order = list order)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for i, sample in enumerate(samples):
        save_npz(folder / f"{i:05d}.npz", sample)


def read_samples(folder: Path) -> list[dict[str, np.ndarray]]:
    out = []
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as z:
            out.append({k: z[k] for k in z.files})
    return out


def ort_session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def finalize_onnx(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Check the model strictly, make sure onnxruntime can load it, and save it."""
    # onnx >= 1.23 helpers write IR 14, which onnxruntime 1.31 refuses. The TorchScript exporter
    # writes an older IR already; clamp anyway in case a rewrite step bumped it.
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    ort_session(path)  # raises if onnxruntime cannot load it
    return model


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def count_flops(model: nn.Module, *inputs: torch.Tensor) -> int:
    """FLOPs (2 x multiply-adds) of Conv2d/Linear layers plus extra matmuls a module declares.

    Element-wise ops, pooling and normalization are not counted (they are a few percent).
    """
    macs = 0

    def hook(mod, args, out):
        nonlocal macs
        if isinstance(mod, nn.Conv2d):
            macs += out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
        elif isinstance(mod, nn.Linear):
            macs += out.numel() * mod.in_features
        elif hasattr(mod, "extra_macs"):
            macs += mod.extra_macs(args, out)

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(*inputs)
    for h in handles:
        h.remove()
    return 2 * macs


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def evaluate_onnx(model_path: Path, samples: list[dict[str, np.ndarray]]) -> tuple[float, np.ndarray]:
    """Top-1 accuracy of the ONNX model on samples (run one by one, as stored); returns logits too."""
    sess = ort_session(model_path)
    input_names = [i.name for i in sess.get_inputs()]
    logits = [sess.run(None, {k: s[k] for k in input_names})[0] for s in samples]
    logits = np.concatenate(logits)
    labels = np.concatenate([s["label"] for s in samples])
    return float((logits.argmax(1) == labels).mean()), logits


def compare_with_torch(model: nn.Module, samples, ort_logits: np.ndarray, input_name: str) -> float:
    """Max |torch - onnxruntime| over the logits of all samples."""
    with torch.no_grad():
        ref = np.concatenate([model(torch.from_numpy(s[input_name])).numpy() for s in samples])
    return float(np.abs(ref - ort_logits).max())


def train_loop(model, batches_fn, epochs: int, lr: float, weight_decay: float, label_smoothing=0.0,
               name: str = "") -> None:
    """AdamW + one-cycle LR schedule; ``batches_fn(epoch)`` yields (inputs, labels) batches.

    ``batches_fn(-1)`` must yield the same number of batches without touching the RNG (it is
    only used to count the steps for the schedule).
    """
    steps_per_epoch = sum(1 for _ in batches_fn(-1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch,
                                                pct_start=0.15)
    t0 = time.time()
    for epoch in range(epochs):
        model.train()
        total, correct, loss_sum = 0, 0, 0.0
        for x, y in batches_fn(epoch):
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y, label_smoothing=label_smoothing)
            loss.backward()
            opt.step()
            sched.step()
            total += len(y)
            correct += int((out.argmax(1) == y).sum())
            loss_sum += loss.item() * len(y)
        if epoch == 0 or (epoch + 1) % 5 == 0 or epoch == epochs - 1:
            print(f"  [{name}] epoch {epoch + 1:3d}/{epochs}  loss {loss_sum / total:.4f}  "
                  f"train acc {correct / total:.4f}  ({time.time() - t0:.0f}s)", flush=True)
    model.eval()


@dataclass
class BuildResult:
    name: str
    accuracy: float
    max_abs_diff: float
    opset: int
    ir_version: int
    ops: dict[str, int]
    model_bytes: int
    folder_bytes: int
    mflops: float | None
    seconds: float


def model_summary(model: onnx.ModelProto) -> tuple[int, int]:
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return opset, model.ir_version


def io_table(model: onnx.ModelProto) -> str:
    def shape(vi):
        return "[" + ", ".join(d.dim_param or str(d.dim_value) for d in vi.type.tensor_type.shape.dim) + "]"

    def dtype(vi):
        return onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name

    inits = {i.name for i in model.graph.initializer}
    rows = ["| | name | dtype | shape |", "| --- | --- | --- | --- |"]
    rows += [f"| input | `{v.name}` | {dtype(v)} | `{shape(v)}` |" for v in model.graph.input if v.name not in inits]
    rows += [f"| output | `{v.name}` | {dtype(v)} | `{shape(v)}` |" for v in model.graph.output]
    return "\n".join(rows)


def ops_line(ops: dict[str, int]) -> str:
    return ", ".join(f"{k} ×{v}" for k, v in ops.items())


# --------------------------------------------------------------------------------------------
# Digits data (shared by cnn and mlp)
# --------------------------------------------------------------------------------------------

DIGITS_EVAL = 400     # held-out samples (stratified), never used for training or calibration
CNN_CALIB = 256
MLP_CALIB = 128


def digits_split():
    """Fixed, seeded, stratified split of sklearn's 1797 8x8 digits: (train_idx, eval_idx)."""
    digits = load_digits()
    idx = np.arange(len(digits.target))
    train_idx, eval_idx = train_test_split(idx, test_size=DIGITS_EVAL, random_state=SEED,
                                           stratify=digits.target)
    return digits, np.sort(train_idx), np.sort(eval_idx)


def digits_to_png_pixels(images8: np.ndarray) -> np.ndarray:
    """8x8 values 0..16 -> uint8 32x32 grayscale, exactly as the PNGs in cnn/eval_images store them."""
    out = np.empty((len(images8), 32, 32), dtype=np.uint8)
    for i, img in enumerate(images8):
        u8 = np.round(img * 255.0 / 16.0).astype(np.uint8)
        out[i] = np.asarray(Image.fromarray(u8, "L").resize((32, 32), Image.BILINEAR))
    return out


def normalize_pixels(pixels: np.ndarray, mean: float, std: float) -> np.ndarray:
    """uint8 [..., 32, 32] -> float32 (x / 255 - mean) / std, all in float32 (what qcli does)."""
    x = pixels.astype(np.float32) / np.float32(255)
    return (x - np.float32(mean)) / np.float32(std)


# --------------------------------------------------------------------------------------------
# CNN
# --------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    """ResNet basic block: conv-bn-relu-conv-bn + shortcut, then relu (torchvision layout)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()
        self.downsample = None
        if cin != cout:  # 1x1 projection so the residual Add sees matching channels
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


# Channel widths of (stem and layer1, layer2, layer3). Wide enough that int8 kernels pay off:
# at 16/32/64 channels int8 ran at 0.93x of fp32 speed and graph overhead weighed as much as the
# weights; QLinearConv starts to win from a few dozen channels on.
CNN_WIDTHS = (32, 64, 128)


class DigitsCNN(nn.Module):
    def __init__(self, num_classes: int = 10, widths: tuple[int, int, int] = CNN_WIDTHS):
        super().__init__()
        w1, w2, w3 = widths
        self.stem = nn.Sequential(nn.Conv2d(1, w1, 3, padding=1, bias=False), nn.BatchNorm2d(w1), nn.ReLU())
        self.layer1 = BasicBlock(w1, w1)       # 32x32
        self.pool1 = nn.MaxPool2d(2)
        self.layer2 = BasicBlock(w1, w2)       # 16x16
        self.pool2 = nn.MaxPool2d(2)
        self.layer3 = BasicBlock(w2, w3)       # 8x8
        self.gap = nn.AdaptiveAvgPool2d(1)     # exported as GlobalAveragePool
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(w3, num_classes)   # exported as Gemm

    def forward(self, x):
        x = self.layer1(self.stem(x))
        x = self.layer2(self.pool1(x))
        x = self.layer3(self.pool2(x))
        return self.fc(self.flatten(self.gap(x)))


CNN_EPOCHS = 40
CNN_SHIFT = 3  # random translation of up to +-3 px (of 32) in each direction during training


def build_cnn() -> BuildResult:
    t_start = time.time()
    out_dir = HERE / "cnn"
    seed_everything()
    digits, train_idx, eval_idx = digits_split()
    pixels = digits_to_png_pixels(digits.images)
    labels = digits.target.astype(np.int64)

    # One mean/std for the single gray channel, from the training split, rounded to 3 decimals
    # so preprocess.yaml can state them exactly.
    train_f = pixels[train_idx].astype(np.float64) / 255.0
    mean, std = round(float(train_f.mean()), 3), round(float(train_f.std()), 3)
    x_all = normalize_pixels(pixels, mean, std)[:, None]  # [N, 1, 32, 32] float32
    background = float(normalize_pixels(np.zeros(1, np.uint8), mean, std)[0])

    x_train = torch.from_numpy(x_all[train_idx])
    y_train = torch.from_numpy(labels[train_idx])
    gen = torch.Generator().manual_seed(SEED)

    def batches(epoch: int, batch_size: int = 64):
        perm = torch.randperm(len(y_train), generator=gen) if epoch >= 0 else torch.arange(len(y_train))
        for s in range(0, len(perm), batch_size):
            b = perm[s:s + batch_size]
            x = x_train[b]
            if epoch >= 0:  # random-shift augmentation: pad with background, crop back to 32x32
                xp = F.pad(x, (CNN_SHIFT,) * 4, value=background)
                offs = torch.randint(0, 2 * CNN_SHIFT + 1, (len(b), 2), generator=gen)
                x = torch.stack([xp[i, :, dy:dy + 32, dx:dx + 32] for i, (dy, dx) in enumerate(offs.tolist())])
            yield x, y_train[b]

    model = DigitsCNN()
    print(f"[cnn] training on {len(train_idx)} images, {CNN_EPOCHS} epochs, mean={mean} std={std}", flush=True)
    train_loop(model, batches, CNN_EPOCHS, lr=3e-3, weight_decay=5e-4, label_smoothing=0.05, name="cnn")
    mflops = count_flops(model, torch.zeros(1, 1, 32, 32)) / 1e6

    # Export. do_constant_folding=False keeps BatchNormalization nodes (with folding on, the
    # exporter merges them into the Conv weights); qcli has to fold BatchNorm itself.
    onnx_path = out_dir / "model.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, (torch.from_numpy(x_all[:1]),), str(onnx_path), dynamo=False,
                      opset_version=17, do_constant_folding=False,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    onnx_model = finalize_onnx(onnx.load(str(onnx_path)), onnx_path)
    assert "BatchNormalization" in op_histogram(onnx_model), "exporter folded BatchNorm"

    # Calibration: 256 training images (seeded pick); eval: every held-out image.
    rng = np.random.default_rng(SEED)
    calib_idx = np.sort(rng.choice(train_idx, CNN_CALIB, replace=False))
    write_samples(out_dir / "calib", [{"input": x_all[i:i + 1], "label": labels[i:i + 1]} for i in calib_idx])
    eval_samples = [{"input": x_all[i:i + 1], "label": labels[i:i + 1]} for i in eval_idx]
    write_samples(out_dir / "eval", eval_samples)

    # The same eval set as PNG files eval_images/<class>/<index>.png (index = eval/<index>.npz).
    img_dir = out_dir / "eval_images"
    if img_dir.exists():
        shutil.rmtree(img_dir)
    for k, i in enumerate(eval_idx):
        cls_dir = img_dir / str(labels[i])
        cls_dir.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i], "L").save(cls_dir / f"{k:05d}.png")
    (out_dir / "preprocess.yaml").write_text(
        "data:\n"
        f"  preprocess: {{scale: 255, mean: [{mean}], std: [{std}], channels: GRAY, layout: NCHW, dtype: float32}}\n")
    check_png_matches_npz(out_dir, mean, std)

    # Check what we shipped, as qcli will read it.
    samples = read_samples(out_dir / "eval")
    acc, logits = evaluate_onnx(onnx_path, samples)
    diff = compare_with_torch(model, samples, logits, "input")
    opset, ir = model_summary(onnx_model)
    res = BuildResult("cnn", acc, diff, opset, ir, op_histogram(onnx_model), onnx_path.stat().st_size, 0,
                      mflops, time.time() - t_start)
    n_params = sum(p.numel() for p in model.parameters())
    write_cnn_readme(out_dir, onnx_model, res, mean, std, len(train_idx), len(calib_idx), len(eval_idx), n_params)
    res.folder_bytes = dir_size(out_dir)
    return res


def check_png_matches_npz(out_dir: Path, mean: float, std: float) -> None:
    """Reproduce qcli's image preprocessing by hand from the PNGs and compare with eval/*.npz."""
    class_names = sorted((p.name for p in (out_dir / "eval_images").iterdir()), key=str)
    n = 0
    for label_id, cls in enumerate(class_names):
        for png in sorted((out_dir / "eval_images" / cls).glob("*.png")):
            pix = np.asarray(Image.open(png).convert("L"))
            x = ((pix.astype(np.float32) / np.float32(255)) - np.float32(mean)) / np.float32(std)
            x = x[None, None]  # HW -> NCHW
            with np.load(out_dir / "eval" / (png.stem + ".npz")) as z:
                assert np.array_equal(z["input"], x), f"{png} does not reproduce eval/{png.stem}.npz"
                assert int(z["label"][0]) == label_id == int(cls), f"{png}: label mismatch"
            n += 1
    assert n == len(list((out_dir / "eval").glob("*.npz"))), "PNG and npz eval sets differ in size"
    print(f"[cnn] {n} PNG files reproduce eval/*.npz exactly (float32 preprocessing)")


def write_cnn_readme(out_dir, onnx_model, res: BuildResult, mean, std, n_train, n_calib, n_eval, n_params):
    w1, w2, w3 = CNN_WIDTHS
    identity_note = ""
    identities = [n for n in onnx_model.graph.node if n.op_type == "Identity"]
    if identities:
        pairs = "; ".join(f"`{n.output[0]}` = Identity(`{n.input[0]}`)" for n in identities)
        # Both BatchNorms before a residual Add get the same bias gradient, so with zero init
        # their biases stay bit-identical through training; the exporter then stores one
        # initializer and feeds the other BatchNormalization through an Identity node.
        identity_note = f"""
The Identity nodes are the exporter's doing: the two BatchNorms feeding each projection block's
residual Add receive the same bias gradient, so their biases stay bit-identical through training,
and the TorchScript exporter deduplicates equal initializers into Identity nodes ({pairs}).
So some BatchNormalization parameters are not initializers but Identity outputs; any ResNet
exported this way (BatchNorm kept, projection shortcuts) can show the same.
"""
    text = f"""# cnn: handwritten digit classifier (ResNet-style CNN)

Built by `sample_models/build.py` (`make sample-models`); do not edit by hand.

## Data
scikit-learn's bundled handwritten digits (`sklearn.datasets.load_digits`: 1797 images of 8×8
pixels, values 0..16, 10 classes, shipped inside the scikit-learn wheel, no download). We looked
for a larger labelled image set shipped inside a PyPI wheel: the candidates either download at
run time or do not install (invalid wheel), so the digits it is.

Split (fixed, seeded, stratified by class): {n_eval} images held out as `eval/` (never used for
training or calibration), the other {n_train} train; `calib/` is {n_calib} of the training images
(seeded pick).

Image pipeline (the PNG files in `eval_images/` are its uint8 stage):
1. 8×8 values 0..16 → uint8 with `np.round(v * 255 / 16)`;
2. `PIL.Image.fromarray(u8, "L").resize((32, 32), Image.BILINEAR)` → uint8 32×32;
3. float32 `/ 255`, then `(x - {mean}) / {std}` (mean and std of the training pixels, 3 decimals);
4. layout NCHW `[N, 1, 32, 32]`.

`preprocess.yaml` states this for qcli's image reader; `eval_images/<class>/<index>.png` read
with it gives exactly `eval/<index>.npz` (build.py checks equality with numpy).

## Model
- Stem Conv3×3(1→{w1})+BN+ReLU; `layer1` BasicBlock({w1}) at 32×32; MaxPool 2; `layer2`
  BasicBlock({w1}→{w2}, 1×1 projection shortcut) at 16×16; MaxPool 2; `layer3` BasicBlock({w2}→{w3},
  projection) at 8×8; GlobalAveragePool, Flatten, Linear({w3}→10). BasicBlock = Conv3×3+BN+ReLU,
  Conv3×3+BN, residual Add, ReLU (torchvision layout).
- **{res.mflops:.1f} MFLOPs per image** (multiply-adds ×2 of Conv and Gemm, batch 1); {n_params:,}
  parameters; `model.onnx` is {fmt_bytes(res.model_bytes)}.
- Why {w1}/{w2}/{w3} channels: int8 kernels (QLinearConv, MatMulInteger) pay off from a few dozen
  channels on, and real image classifiers have 64-512. An earlier 16/32/64-channel version
  (24 MFLOPs, 78k parameters) ran int8 at only 0.93× of fp32 speed at batch 1 and its quantized file
  was only 3.1× smaller, because graph overhead weighed as much as the weights.
- Training: {CNN_EPOCHS} epochs, AdamW (lr 3e-3 one-cycle, weight decay 5e-4), batch 64,
  cross-entropy with label smoothing 0.05; augmentation: random shift of up to ±{CNN_SHIFT} px in
  x and y (padding with the background value).
- Exported with torch {torch.__version__.split('+')[0]}'s TorchScript exporter (`dynamo=False`), eval mode,
  `do_constant_folding=False` so the BatchNormalization nodes stay in the graph (qcli folds them).

## ONNX
opset {res.opset}, IR version {res.ir_version}, dynamic batch axis.

{io_table(onnx_model)}

Ops: {ops_line(res.ops)}.
{identity_note}
## Accuracy
fp32 top-1 on `eval/` ({n_eval} images) with onnxruntime {ort.__version__}: **{res.accuracy:.2%}**
(max |torch − onnxruntime| on the logits: {res.max_abs_diff:.1e}).
"""
    (out_dir / "README.md").write_text(text)


# --------------------------------------------------------------------------------------------
# MLP
# --------------------------------------------------------------------------------------------

class DigitsMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(128, 64)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


MLP_EPOCHS = 60


def initializers_to_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """Move every initializer into a Constant node producing the same tensor name.

    Paddle2ONNX and some other exporters write weights this way; qcli must handle it.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    const_nodes = [onnx.helper.make_node("Constant", [], [init.name], name=f"Constant_{i}", value=init)
                   for i, init in enumerate(graph.initializer)]
    # Constants go first so the node list stays topologically sorted.
    nodes = const_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    # Older exporters also list initializers as graph inputs; those inputs must go too.
    const_names = {n.output[0] for n in const_nodes}
    kept = [i for i in graph.input if i.name not in const_names]
    del graph.input[:]
    graph.input.extend(kept)
    return out


def build_mlp() -> BuildResult:
    t_start = time.time()
    out_dir = HERE / "mlp"
    seed_everything()
    digits, train_idx, eval_idx = digits_split()
    x_all = (digits.data / 16.0).astype(np.float32)  # [N, 64], values 0..1
    labels = digits.target.astype(np.int64)
    x_train, y_train = torch.from_numpy(x_all[train_idx]), torch.from_numpy(labels[train_idx])
    gen = torch.Generator().manual_seed(SEED)

    def batches(epoch: int, batch_size: int = 64):
        perm = torch.randperm(len(y_train), generator=gen) if epoch >= 0 else torch.arange(len(y_train))
        for s in range(0, len(perm), batch_size):
            b = perm[s:s + batch_size]
            yield x_train[b], y_train[b]

    model = DigitsMLP()
    print(f"[mlp] training on {len(train_idx)} samples, {MLP_EPOCHS} epochs", flush=True)
    train_loop(model, batches, MLP_EPOCHS, lr=3e-3, weight_decay=1e-4, name="mlp")

    onnx_path = out_dir / "model.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, (torch.from_numpy(x_all[:1]),), str(onnx_path), dynamo=False,
                      opset_version=11, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    exported = onnx.load(str(onnx_path))
    rewritten = initializers_to_constants(exported)
    # Same outputs before and after the rewrite (bit-exact: the arithmetic is unchanged).
    probe = x_all[eval_idx[:64]]
    before = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    after = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"])
    rewrite_diff = float(np.abs(before.run(None, {"input": probe})[0] - after.run(None, {"input": probe})[0]).max())
    assert rewrite_diff < 1e-6, f"Constant rewrite changed outputs by {rewrite_diff}"
    assert not rewritten.graph.initializer
    onnx_model = finalize_onnx(rewritten, onnx_path)

    rng = np.random.default_rng(SEED)
    calib_idx = np.sort(rng.choice(train_idx, MLP_CALIB, replace=False))
    write_samples(out_dir / "calib", [{"input": x_all[i:i + 1], "label": labels[i:i + 1]} for i in calib_idx])
    write_samples(out_dir / "eval", [{"input": x_all[i:i + 1], "label": labels[i:i + 1]} for i in eval_idx])

    samples = read_samples(out_dir / "eval")
    acc, logits = evaluate_onnx(onnx_path, samples)
    diff = compare_with_torch(model, samples, logits, "input")
    mflops = count_flops(model, torch.zeros(1, 64)) / 1e6
    opset, ir = model_summary(onnx_model)
    res = BuildResult("mlp", acc, diff, opset, ir, op_histogram(onnx_model), onnx_path.stat().st_size, 0,
                      mflops, time.time() - t_start)
    text = f"""# mlp: digits classifier with weights in Constant nodes (opset {opset})

Built by `sample_models/build.py` (`make sample-models`); do not edit by hand.

## Data
scikit-learn's bundled handwritten digits (`sklearn.datasets.load_digits`), each 8×8 image
flattened to 64 features and divided by 16 (values 0..1), float32. Same fixed, seeded, stratified
split as `../cnn`: the same {len(eval_idx)} held-out images are `eval/` (never trained on);
{len(train_idx)} train; `calib/` is {len(calib_idx)} of the training samples (seeded pick).

## Model
- Linear(64→128), ReLU, Linear(128→64), ReLU, Linear(64→10): {res.mflops:.3f} MFLOPs per sample.
- Training: {MLP_EPOCHS} epochs, AdamW (lr 3e-3 one-cycle, weight decay 1e-4), batch 64, no
  augmentation.
- Exported with torch {torch.__version__.split('+')[0]}'s TorchScript exporter (`dynamo=False`) at opset 11, then
  every initializer was rewritten into a `Constant` node feeding the same tensor name (the way
  Paddle2ONNX and some other exporters store weights): the graph has **no initializers**. The
  rewrite was checked to leave onnxruntime's outputs unchanged (max diff {rewrite_diff:.1e}).

## ONNX
opset {res.opset}, IR version {res.ir_version}, dynamic batch axis.

{io_table(onnx_model)}

Ops: {ops_line(res.ops)}.

## Accuracy
fp32 top-1 on `eval/` ({len(eval_idx)} samples) with onnxruntime {ort.__version__}: **{res.accuracy:.2%}**
(max |torch − onnxruntime| on the logits: {res.max_abs_diff:.1e}).
"""
    (out_dir / "README.md").write_text(text)
    res.folder_bytes = dir_size(out_dir)
    return res


# --------------------------------------------------------------------------------------------
# Transformer
# --------------------------------------------------------------------------------------------

TEXT_CLASSES = ["python", "cpp", "prose"]
TEXT_MIN_BYTES, TEXT_MAX_BYTES = 20, 120
TEXT_TRAIN_PER_CLASS = 2000
TEXT_EVAL_PER_CLASS = 150
TEXT_CALIB = 256
MAX_LEN = 128            # positional table size; lines are <= 120 bytes, stored padded to 16k
PAD_MULTIPLE = 16
# Stdlib folders left out: test suites (odd encodings, generated data) and vendored packages.
STDLIB_SKIP = {"test", "tests", "site-packages", "idlelib", "lib2to3", "__pycache__"}
CPP_SUFFIXES = {".h", ".hpp", ".cuh", ".c", ".cpp"}


def _keep(line: str) -> bool:
    return TEXT_MIN_BYTES <= len(line.encode("utf-8")) <= TEXT_MAX_BYTES


def _docstring_nodes(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield node, first


def collect_text_lines() -> tuple[dict[str, list[str]], dict[str, str]]:
    """Lines of text per class, from files any build venv has; sorted, deduplicated.

    - python: code lines (comments included, docstrings excluded) of the standard library's .py
      files.
    - cpp: lines of the C/C++ headers shipped in torch's and numpy's include directories.
    - prose: the docstrings of those same standard-library modules, classes and functions
      (English prose; doctest lines dropped).
    Lines are stripped of surrounding whitespace (so indentation is no give-away), kept when
    20..120 bytes of UTF-8, and a line that occurs in two classes is dropped from both.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    lines: dict[str, set[str]] = {c: set() for c in TEXT_CLASSES}

    py_files = sorted(p for p in stdlib.rglob("*.py") if not STDLIB_SKIP & set(p.relative_to(stdlib).parts))
    for path in py_files:
        src = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        doc_rows: set[int] = set()
        for node, expr in _docstring_nodes(tree):
            doc_rows.update(range(expr.lineno, expr.end_lineno + 1))
            for line in ast.get_docstring(node).splitlines():
                line = line.strip()
                if _keep(line) and not line.startswith((">>>", "...")):
                    lines["prose"].add(line)
        for row, line in enumerate(src.splitlines(), start=1):
            line = line.strip()
            if row not in doc_rows and _keep(line):
                lines["python"].add(line)

    include_dirs = [purelib / "torch" / "include", purelib / "numpy" / "_core" / "include"]
    cpp_files = sorted(p for d in include_dirs for p in d.rglob("*") if p.suffix in CPP_SUFFIXES and p.is_file())
    for path in cpp_files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if _keep(line):
                lines["cpp"].add(line)

    counts = collections.Counter(line for s in lines.values() for line in s)
    result = {c: sorted(line for line in s if counts[line] == 1) for c, s in lines.items()}
    sources = {
        "python": f"{len(py_files)} `.py` files of the Python {platform.python_version()} standard library "
                  f"(test suites, idlelib, lib2to3 left out), docstrings excluded",
        "cpp": f"{len(cpp_files)} C/C++ headers under torch/include and numpy/_core/include",
        "prose": f"docstrings of the same {len(py_files)} standard-library files",
    }
    return result, sources


def encode_line(line: str, pad_to_multiple: int = PAD_MULTIPLE) -> np.ndarray:
    """UTF-8 bytes -> ids (byte + 1), zero-padded to a multiple of 16. Shape [1, L]."""
    ids = np.frombuffer(line.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 1
    length = -(-len(ids) // pad_to_multiple) * pad_to_multiple
    out = np.zeros((1, length), dtype=np.int64)
    out[0, :len(ids)] = ids
    return out


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, key_mask):
        b, t, _ = x.shape
        def heads(y):  # [b, t, d] -> [b, h, t, dh]
            return y.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.d_head ** -0.5)
        # Padding keys get the most negative float (as Hugging Face models do): exported as
        # Where(Not(mask), min, scores). Padding queries still see real keys, so no NaN rows.
        scores = scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        attn = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, -1)
        return self.out_proj(ctx)

    def extra_macs(self, args, out):  # QK^T and attn@V, for count_flops
        b, t, d = args[0].shape
        return 2 * b * t * t * d


class EncoderLayer(nn.Module):
    """Pre-norm Transformer encoder layer."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()   # exact GELU: exported as Div/Erf/Add/Mul/Mul at opset 17
        self.ff2 = nn.Linear(d_ff, d_model)

    def forward(self, x, key_mask):
        x = x + self.attn(self.norm1(x), key_mask)
        return x + self.ff2(self.act(self.ff1(self.norm2(x))))


# Sized to train in a couple of minutes on 2 CPU cores (d_model 128 took ~4x longer).
TEXT_MODEL = dict(d_model=64, n_heads=4, d_ff=256, n_layers=2)


class TextClassifier(nn.Module):
    def __init__(self, n_classes: int, d_model: int, n_heads: int, d_ff: int, n_layers: int,
                 vocab: int = 257, max_len: int = MAX_LEN):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, input_ids):
        mask = input_ids != 0                                   # [b, t] bool: Equal + Not
        x = self.embed(input_ids) + self.pos[:, :input_ids.shape[1]]
        for layer in self.layers:
            x = layer(x, mask)
        x = self.norm(x)
        m = mask.unsqueeze(-1).to(x.dtype)                      # Cast
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1.0)       # masked mean over real tokens
        return self.head(pooled)


TEXT_EPOCHS = 10


def build_transformer() -> BuildResult:
    t_start = time.time()
    out_dir = HERE / "transformer"
    seed_everything()
    per_class, sources = collect_text_lines()
    for c in TEXT_CLASSES:
        print(f"[transformer] {c}: {len(per_class[c])} distinct lines", flush=True)

    # Deterministic sample per class; the first TEXT_EVAL_PER_CLASS of each class are held out.
    rng = random.Random(SEED)
    train, held_out = [], []
    for label, c in enumerate(TEXT_CLASSES):
        picked = rng.sample(per_class[c], TEXT_TRAIN_PER_CLASS + TEXT_EVAL_PER_CLASS)
        held_out += [(line, label) for line in picked[:TEXT_EVAL_PER_CLASS]]
        train += [(line, label) for line in picked[TEXT_EVAL_PER_CLASS:]]
    rng.shuffle(train)
    rng.shuffle(held_out)

    train_ids = [encode_line(line)[0] for line, _ in train]
    train_y = torch.tensor([y for _, y in train], dtype=torch.int64)
    gen = torch.Generator().manual_seed(SEED)

    def batches(epoch: int, batch_size: int = 64, bucket: int = 16):
        # Shuffle, then sort each run of `bucket` batches by length so a batch is padded only to
        # lines of similar length (half the compute of random batches), and shuffle the batches.
        perm = torch.randperm(len(train), generator=gen).tolist() if epoch >= 0 else list(range(len(train)))
        chunk = batch_size * bucket
        groups = []
        for s in range(0, len(perm), chunk):
            run = sorted(perm[s:s + chunk], key=lambda i: len(train_ids[i]))
            groups += [run[k:k + batch_size] for k in range(0, len(run), batch_size)]
        order = torch.randperm(len(groups), generator=gen).tolist() if epoch >= 0 else range(len(groups))
        for g in order:
            b = groups[g]
            width = max(len(train_ids[i]) for i in b)
            x = torch.zeros(len(b), width, dtype=torch.int64)
            for row, i in enumerate(b):
                x[row, :len(train_ids[i])] = torch.from_numpy(train_ids[i])
            yield x, train_y[b]

    model = TextClassifier(len(TEXT_CLASSES), **TEXT_MODEL)
    print(f"[transformer] training on {len(train)} lines, {TEXT_EPOCHS} epochs", flush=True)
    train_loop(model, batches, TEXT_EPOCHS, lr=2e-3, weight_decay=1e-2, name="transformer")

    onnx_path = out_dir / "model.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    example = torch.from_numpy(encode_line(held_out[0][0]))
    # Default export settings (eval mode, constant folding on), as a user would export it.
    torch.onnx.export(model, (example,), str(onnx_path), dynamo=False, opset_version=17,
                      input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}})
    onnx_model = finalize_onnx(onnx.load(str(onnx_path)), onnx_path)

    calib_pick = sorted(rng.sample(range(len(train)), TEXT_CALIB))
    write_samples(out_dir / "calib", [{"input_ids": encode_line(train[i][0]),
                                       "label": np.array([train[i][1]], np.int64)} for i in calib_pick])
    write_samples(out_dir / "eval", [{"input_ids": encode_line(line), "label": np.array([y], np.int64)}
                                     for line, y in held_out])

    samples = read_samples(out_dir / "eval")
    acc, logits = evaluate_onnx(onnx_path, samples)
    diff = compare_with_torch(model, samples, logits, "input_ids")
    pad_diff = check_padding_invariance(onnx_path, samples[:32], logits[:32])
    labels = np.concatenate([s["label"] for s in samples])
    per_class_acc = {c: float((logits.argmax(1)[labels == k] == k).mean()) for k, c in enumerate(TEXT_CLASSES)}
    lengths = collections.Counter(s["input_ids"].shape[1] for s in samples)
    mflops = count_flops(model, torch.ones(1, 64, dtype=torch.int64)) / 1e6
    opset, ir = model_summary(onnx_model)
    res = BuildResult("transformer", acc, diff, opset, ir, op_histogram(onnx_model),
                      onnx_path.stat().st_size, 0, mflops, time.time() - t_start)
    n_params = sum(p.numel() for p in model.parameters())
    cfg = TEXT_MODEL
    d = cfg["d_model"]
    # A few eval lines for the README (skipping ones a Markdown table cell cannot show as is).
    shown = [(line, y) for line, y in held_out if "|" not in line and "`" not in line][:6]
    examples = "\n".join(f"| {TEXT_CLASSES[y]} | `{line}` |" for line, y in shown)
    text = f"""# transformer: which kind of text is this line? (byte-level Transformer encoder)

Built by `sample_models/build.py` (`make sample-models`); do not edit by hand.

## Task and data
Classify one line of text into {len(TEXT_CLASSES)} classes: {', '.join(f'`{k}` = {c}' for k, c in enumerate(TEXT_CLASSES))}.
The lines come from files every build venv has (no download):

| class | source |
| --- | --- |
| python | {sources['python']} |
| cpp | {sources['cpp']} |
| prose | {sources['prose']} |

Lines are stripped of surrounding whitespace (indentation gives nothing away), kept when
{TEXT_MIN_BYTES}..{TEXT_MAX_BYTES} bytes of UTF-8, deduplicated (a line found in two classes is dropped), then
sampled with a seeded RNG from the sorted lists: {TEXT_TRAIN_PER_CLASS} training and {TEXT_EVAL_PER_CLASS} held-out lines per class.
`eval/` holds the {len(held_out)} held-out lines (never trained on); `calib/` is {TEXT_CALIB} of the training lines.
Comments make the task non-trivial: a `//` or `#` comment is English text too.

Examples from `eval/`:

| class | line |
| --- | --- |
{examples}

## Tokenizer (no vocabulary file)
UTF-8 bytes; token id = byte + 1; 0 = padding. Each sample is stored with its own length rounded
up to a multiple of {PAD_MULTIPLE} (zero-padded), so `input_ids` is `[1, L]` with L varying across samples,
{min(lengths)}..{max(lengths)} (lines have {TEXT_MIN_BYTES}..{TEXT_MAX_BYTES} bytes; eval samples per length: {', '.join(f'{k}: {v}' for k, v in sorted(lengths.items()))}).
In Python: `ids = [b + 1 for b in line.encode("utf-8")]`.

## Model
- Token embedding (257×{d}, Gather) + learned positional embedding ({MAX_LEN} positions, sliced to the
  input length), {cfg['n_layers']} pre-norm encoder layers (d_model {d}, {cfg['n_heads']} heads, feed-forward {cfg['d_ff']}, exact GELU),
  final LayerNorm, masked mean-pooling over real tokens, Linear({d}→{len(TEXT_CLASSES)}); {n_params:,} parameters,
  {res.mflops:.1f} MFLOPs for a 64-token line.
- The padding mask is computed in the graph from `input_ids != 0` (Equal, Not): attention scores
  of padding keys are set to the float32 minimum (Where), and the mean-pooling weights are the
  mask Cast to float. So results do not depend on how much padding follows a line (build.py
  checks this: padding to {MAX_LEN} changes the logits by at most {pad_diff:.1e}).
  Note for quantization: the Where output feeding Softmax holds -3.4e38 at padded positions.
- Training: {TEXT_EPOCHS} epochs, AdamW (lr 2e-3 one-cycle, weight decay 0.01), batch 64 (lines of
  similar length batched together, padded to the longest), cross-entropy, no augmentation.
- Exported with torch {torch.__version__.split('+')[0]}'s TorchScript exporter (`dynamo=False`), default settings
  (eval mode, constant folding on).

## ONNX
opset {res.opset}, IR version {res.ir_version}, dynamic batch and sequence axes.

{io_table(onnx_model)}

Ops: {ops_line(res.ops)}.

## Accuracy
fp32 top-1 on `eval/` ({len(held_out)} lines) with onnxruntime {ort.__version__}: **{res.accuracy:.2%}**
(per class: {', '.join(f'{c} {a:.1%}' for c, a in per_class_acc.items())}; max |torch − onnxruntime| on the
logits: {res.max_abs_diff:.1e}).
"""
    (out_dir / "README.md").write_text(text)
    res.folder_bytes = dir_size(out_dir)
    return res


def check_padding_invariance(onnx_path: Path, samples, ref_logits: np.ndarray) -> float:
    """Run samples as one batch padded to MAX_LEN: logits must match the one-by-one run."""
    batch = np.zeros((len(samples), MAX_LEN), dtype=np.int64)
    for i, s in enumerate(samples):
        batch[i, :s["input_ids"].shape[1]] = s["input_ids"][0]
    out = ort_session(onnx_path).run(None, {"input_ids": batch})[0]
    diff = float(np.abs(out - ref_logits).max())
    assert diff < 1e-3, f"padding changes the logits by {diff}"
    return diff


# --------------------------------------------------------------------------------------------
# Index
# --------------------------------------------------------------------------------------------

MODELS = {"cnn": build_cnn, "transformer": build_transformer, "mlp": build_mlp}
TASKS = {
    "cnn": ("digit image classification (10 classes), ResNet-style CNN with BatchNorm", "`input` float32 `[batch, 1, 32, 32]`"),
    "transformer": ("text-line kind (python / cpp / prose), 2-layer Transformer encoder", "`input_ids` int64 `[batch, sequence]`"),
    "mlp": ("digit classification (10 classes), Gemm/Relu MLP, weights in Constant nodes", "`input` float32 `[batch, 64]`"),
}


def write_index() -> None:
    """Top-level README: re-measure every model folder present, so --only keeps it current."""
    rows = []
    for name in MODELS:
        folder = HERE / name
        if not (folder / "model.onnx").exists():
            continue
        model = onnx.load(str(folder / "model.onnx"))
        opset, _ = model_summary(model)
        acc, _ = evaluate_onnx(folder / "model.onnx", read_samples(folder / "eval"))
        n_calib = len(list((folder / "calib").glob("*.npz")))
        n_eval = len(list((folder / "eval").glob("*.npz")))
        task, inp = TASKS[name]
        rows.append(f"| [`{name}/`]({name}/README.md) | {task} | {inp} | {opset} | {acc:.2%} | "
                    f"{n_calib} / {n_eval} | {fmt_bytes((folder / 'model.onnx').stat().st_size)} | "
                    f"{fmt_bytes(dir_size(folder))} |")
    text = f"""# Sample models

Small real models, trained and exported by `build.py`, with their data in qcli's data-folder
format (one `NNNNN.npz` per sample, keyed by input name, leading batch dimension 1, int64 `label`
of shape `[1]`). Each folder has `model.onnx`, `calib/`, `eval/` (held out, never trained on,
with labels) and a README (data, training, accuracy, input/output, opset).

| model | task | input | opset | fp32 top-1 on eval/ (onnxruntime) | calib / eval samples | model.onnx | folder |
| --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

`cnn/` also has its eval set as PNG files (`eval_images/<class>/<index>.png`) and the
`preprocess.yaml` that turns them into exactly the `eval/` tensors.

## Rebuild
```
make sample-models
```
which creates the build-only venv `.build-venv` (torch and friends, see `requirements-build.txt`;
qcli itself never needs torch) and runs `python sample_models/build.py` from the repository
root. `--only cnn|transformer|mlp` rebuilds one model (this index is re-measured every time).
Seeds are fixed and torch runs deterministic algorithms on 2 threads, so a rebuild with the same
package versions gives the same files. Each model trains in a few minutes on 2 CPU cores (the
cnn in about 7).
"""
    (HERE / "README.md").write_text(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(MODELS), help="rebuild only this model")
    args = parser.parse_args(argv)
    names = [args.only] if args.only else list(MODELS)
    results = []
    for name in names:
        results.append(MODELS[name]())
        r = results[-1]
        print(f"[{name}] done in {r.seconds:.0f}s: accuracy {r.accuracy:.4f}, max|torch-ort| {r.max_abs_diff:.1e}",
              flush=True)
    write_index()
    print("\nmodel        acc     opset  IR  MFLOPs   model.onnx  folder     ops")
    for r in results:
        print(f"{r.name:12s} {r.accuracy:.4f}  {r.opset:5d} {r.ir_version:3d}  {r.mflops:7.3f}  "
              f"{fmt_bytes(r.model_bytes):>10s}  {fmt_bytes(r.folder_bytes):>9s}  {r.ops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
