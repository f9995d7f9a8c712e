"""The data-folder reader: every layout of DESIGN.md §2, validation errors, bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from onnx import numpy_helper
from PIL import Image

from conftest import IMAGE_MODEL, TWO_INPUT_MODEL, parse_model, write_npz
from qcli.data import DataFolder, Preprocess, Reading, model_inputs
from qcli.data.readers import READERS
from qcli.data.scan import EntryKind
from qcli.errors import DataError

IMAGE_INPUTS = model_inputs(parse_model(IMAGE_MODEL))
TWO_INPUTS = model_inputs(parse_model(TWO_INPUT_MODEL))


def image(i: int) -> np.ndarray:
    return np.full((1, 4, 4), i, dtype=np.float32)


def test_npz_samples_read_in_sorted_order_with_labels(tmp_path: Path) -> None:
    for i in (2, 0, 1):
        write_npz(tmp_path / f"s{i}.npz", image=image(i), label=np.int64(i))
    folder = DataFolder(tmp_path, IMAGE_INPUTS)
    samples = list(folder)
    assert [s.source for s in samples] == ["s0.npz", "s1.npz", "s2.npz"]
    assert [s.inputs["image"].shape for s in samples] == [(1, 1, 4, 4)] * 3  # batch axis added
    assert [int(s.inputs["image"][0, 0, 0, 0]) for s in samples] == [0, 1, 2]
    assert [s.label.tolist() for s in samples] == [[0], [1], [2]]
    assert len(folder) == 3 and folder.layout == "npz"


def test_npz_batch_files_count_and_split(tmp_path: Path) -> None:
    write_npz(tmp_path / "a.npz", image=np.stack([image(i) for i in range(5)]), label=np.arange(5))
    write_npz(tmp_path / "b.npz", image=image(5)[None], label=np.array([5]))
    folder = DataFolder(tmp_path, IMAGE_INPUTS)
    assert len(folder) == 6
    batches = list(folder.batches(4))
    assert [b.size for b in batches] == [4, 2]
    assert batches[1].label.tolist() == [4, 5]
    assert batches[1].sources == ["a.npz", "b.npz"]
    limited = DataFolder(tmp_path, IMAGE_INPUTS, samples=3)
    assert len(limited) == 3
    assert sum(b.size for b in limited.batches(2)) == 3


def test_batches_break_where_shapes_differ(tmp_path: Path) -> None:
    for i, seq in enumerate([16, 16, 32, 32, 32, 16]):
        write_npz(
            tmp_path / f"{i:02d}.npz",
            x=np.zeros((seq, 8), np.float32),
            ids=np.ones(seq, np.int64),
        )
    batches = list(DataFolder(tmp_path, TWO_INPUTS).batches(8))
    assert [(b.size, b.inputs["x"].shape[1]) for b in batches] == [(2, 16), (3, 32), (1, 16)]


def test_npy_for_single_input_models(tmp_path: Path) -> None:
    np.save(tmp_path / "0.npy", image(3))
    (tmp_path / "labels.csv").write_text("file,label\n0.npy,7\n")
    [sample] = list(DataFolder(tmp_path, IMAGE_INPUTS))
    assert sample.inputs["image"][0, 0, 0, 0] == 3
    assert sample.label.tolist() == [7]


def test_npy_refused_for_multi_input_models(tmp_path: Path) -> None:
    np.save(tmp_path / "0.npy", np.zeros((4, 8), np.float32))
    with pytest.raises(DataError, match=r"\.npy files feed single-input models, but the model has 2 inputs"):
        list(DataFolder(tmp_path, TWO_INPUTS))


def test_onnx_test_data_layout_with_reference_outputs(tmp_path: Path) -> None:
    for i in range(2):
        d = tmp_path / f"test_data_set_{i}"
        d.mkdir()
        (d / "input_0.pb").write_bytes(numpy_helper.from_array(image(i)[None], "image").SerializeToString())
        (d / "output_0.pb").write_bytes(
            numpy_helper.from_array(np.full((1, 3), i, np.float32), "logits").SerializeToString()
        )
    folder = DataFolder(tmp_path, IMAGE_INPUTS)
    samples = list(folder)
    assert folder.layout == "onnx-test-data"
    assert [s.source for s in samples] == ["test_data_set_0", "test_data_set_1"]
    assert samples[1].outputs["logits"].tolist() == [[1, 1, 1]]
    batch = next(folder.batches(8))
    assert batch.outputs["logits"].shape == (2, 3)


def test_image_folders_give_labels_and_preprocess(tmp_path: Path) -> None:
    for label, name in enumerate(["cat", "dog"]):
        (tmp_path / name).mkdir()
        pixels = np.full((8, 8), 51 * (label + 1), np.uint8)
        Image.fromarray(pixels, "L").save(tmp_path / name / "x.png")
    pre = Preprocess.from_dict(
        {"resize": 6, "center_crop": 4, "scale": 255, "mean": [0.5], "std": [0.25], "channels": "GRAY"}
    )
    folder = DataFolder(tmp_path, IMAGE_INPUTS, reading=Reading(pre))
    samples = list(folder)
    assert folder.class_names == ["cat", "dog"]
    assert [s.label.tolist() for s in samples] == [[0], [1]]
    assert samples[0].inputs["image"].shape == (1, 1, 4, 4)
    np.testing.assert_allclose(samples[1].inputs["image"], (102 / 255 - 0.5) / 0.25, rtol=1e-6)


def test_rgb_image_layouts(tmp_path: Path) -> None:
    pixels = np.zeros((2, 3, 3), np.uint8)
    pixels[..., 0], pixels[..., 2] = 10, 30  # R, B
    Image.fromarray(pixels, "RGB").save(tmp_path / "a.bmp")
    spec = [type(IMAGE_INPUTS[0])("image", np.dtype("float32"), ("N", 2, 3, 3))]
    [nhwc] = list(DataFolder(tmp_path, spec, reading=Reading(Preprocess(channels="BGR", layout="NHWC"))))
    assert nhwc.inputs["image"][0, 0, 0].tolist() == [30, 0, 10]
    spec = [type(IMAGE_INPUTS[0])("image", np.dtype("float32"), ("N", 3, 2, 3))]
    [nchw] = list(DataFolder(tmp_path, spec, reading=Reading(Preprocess())))
    assert nchw.inputs["image"][0, :, 0, 0].tolist() == [10, 0, 30]


def test_labels_csv_overrides_folder_labels(tmp_path: Path) -> None:
    write_npz(tmp_path / "a.npz", image=image(0), label=np.int64(1))
    (tmp_path / "labels.csv").write_text("a.npz,2\n")
    [sample] = list(DataFolder(tmp_path, IMAGE_INPUTS))
    assert sample.label.tolist() == [2]


def test_labels_csv_errors_name_the_line(tmp_path: Path) -> None:
    write_npz(tmp_path / "a.npz", image=image(0))
    csv = tmp_path / "labels.csv"
    for text, line in [("a.npz,2\nb.npz,1\n", 2), ("file,label\na.npz,x\n", 2), ("a.npz,1,2\n", 1)]:
        csv.write_text(text)
        with pytest.raises(DataError, match=f"^{csv}:{line}: "):
            DataFolder(tmp_path, IMAGE_INPUTS)


# ---- errors: each names the file and the input


def test_wrong_shape(tmp_path: Path) -> None:
    write_npz(tmp_path / "bad.npz", image=np.zeros((1, 5, 4), np.float32))
    with pytest.raises(DataError) as err:
        list(DataFolder(tmp_path, IMAGE_INPUTS))
    assert str(err.value) == (
        f"{tmp_path / 'bad.npz'}: input 'image' has shape [1, 1, 5, 4], the model expects "
        "[N, 1, 4, 4] (axis 2 must be 4)"
    )


def test_wrong_rank(tmp_path: Path) -> None:
    write_npz(tmp_path / "bad.npz", image=np.zeros((4, 4), np.float32))
    with pytest.raises(DataError, match=r"bad\.npz: input 'image' has shape \[4, 4\], the model expects \[N, 1, 4, 4\] \(rank 4\)"):
        list(DataFolder(tmp_path, IMAGE_INPUTS))


def test_wrong_dtype(tmp_path: Path) -> None:
    write_npz(tmp_path / "bad.npz", image=np.zeros((1, 4, 4), np.float64))
    with pytest.raises(DataError) as err:
        list(DataFolder(tmp_path, IMAGE_INPUTS))
    assert str(err.value) == f"{tmp_path / 'bad.npz'}: input 'image' is float64, the model expects float32"
    assert err.value.hint == "convert the data, e.g. array.astype(numpy.float32)"


def test_missing_and_unknown_input_keys(tmp_path: Path) -> None:
    write_npz(tmp_path / "a.npz", x=np.zeros((2, 8), np.float32))
    with pytest.raises(DataError, match=r"a\.npz: missing input 'ids' \(model inputs: x, ids\)"):
        list(DataFolder(tmp_path, TWO_INPUTS))
    write_npz(tmp_path / "a.npz", x=np.zeros((2, 8), np.float32), idz=np.zeros(2, np.int64))
    with pytest.raises(DataError, match=r"a\.npz: array 'idz' is not a model input") as err:
        list(DataFolder(tmp_path, TWO_INPUTS))
    assert err.value.hint == "did you mean 'ids'?"


def test_nan_and_inf(tmp_path: Path) -> None:
    x = image(0)
    x[0, 1, 1], x[0, 2, 2] = np.nan, np.inf
    write_npz(tmp_path / "a.npz", image=x)
    with pytest.raises(DataError, match=r"a\.npz: input 'image' contains 2 NaN or Inf value\(s\)"):
        list(DataFolder(tmp_path, IMAGE_INPUTS))


def test_empty_and_missing_folders(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"no samples found in {tmp_path}"):
        DataFolder(tmp_path, IMAGE_INPUTS)
    (tmp_path / "README.txt").write_text("not a sample")
    with pytest.raises(DataError, match="no samples found"):
        DataFolder(tmp_path, IMAGE_INPUTS)
    with pytest.raises(DataError, match="data folder not found"):
        DataFolder(tmp_path / "nope", IMAGE_INPUTS)


def test_unreadable_image(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DataError, match=r"cannot read image .*broken\.png"):
        list(DataFolder(tmp_path, IMAGE_INPUTS, reading=Reading(Preprocess(channels="GRAY"))))


def test_images_without_preprocess(tmp_path: Path) -> None:
    Image.fromarray(np.zeros((4, 4), np.uint8), "L").save(tmp_path / "a.png")
    with pytest.raises(DataError, match="holds images but no preprocessing is configured"):
        list(DataFolder(tmp_path, IMAGE_INPUTS))


def test_corrupt_npz(tmp_path: Path) -> None:
    (tmp_path / "a.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match=r"cannot read .*a\.npz"):
        list(DataFolder(tmp_path, IMAGE_INPUTS))


def test_mixed_layouts_refused(tmp_path: Path) -> None:
    write_npz(tmp_path / "a.npz", image=image(0))
    np.save(tmp_path / "b.npy", image(0))
    with pytest.raises(DataError, match=r"mixes sample layouts \(npz, npy\)"):
        DataFolder(tmp_path, IMAGE_INPUTS)


def test_label_count_must_match_batch(tmp_path: Path) -> None:
    write_npz(tmp_path / "a.npz", image=np.zeros((3, 1, 4, 4), np.float32), label=np.arange(2))
    with pytest.raises(DataError, match=r"a\.npz: 2 label\(s\) for a batch of 3 sample\(s\)"):
        list(DataFolder(tmp_path, IMAGE_INPUTS))


def test_preprocess_rejects_unknown_keys() -> None:
    with pytest.raises(DataError, match=r"unknown key data\.preprocess\.men") as err:
        Preprocess.from_dict({"men": [0.5]})
    assert err.value.hint == "did you mean 'mean'?"


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"resize": 0}, "data.preprocess.resize: must be a positive integer or [height, width] (got 0)"),
        ({"center_crop": [1, 2, 3]}, "data.preprocess.center_crop: must be a positive integer or [height, width]"),
        ({"resize": True}, "data.preprocess.resize: must be a positive integer"),
        ({"mean": []}, "data.preprocess.mean: must be a number or a list of numbers (got [])"),
        ({"std": [0.5, 0]}, "data.preprocess.std: must not contain 0 (got [0.5, 0])"),
        ({"scale": [1, 2]}, "data.preprocess.scale: must be one non-zero number (got [1, 2])"),
        ({"layout": "NCWH"}, "data.preprocess.layout: Input should be 'NCHW' or 'NHWC' (got 'NCWH')"),
        ("RGB", "data.preprocess: Input should be a valid dictionary"),
    ],
)
def test_preprocess_errors_name_the_key(raw: object, message: str) -> None:
    with pytest.raises(DataError) as err:
        Preprocess.from_dict(raw)
    assert str(err.value).startswith(message), str(err.value)


def test_preprocess_values_and_defaults() -> None:
    pre = Preprocess.from_dict({"resize": [300, 200], "center_crop": 224, "scale": [255], "mean": 1, "std": None})
    assert (pre.resize, pre.center_crop, pre.scale) == ((300, 200), (224, 224), 255.0)
    assert (pre.mean, pre.std) == ((1.0,), (1.0,))
    assert Preprocess.from_dict({}) == Preprocess()
    with pytest.raises(DataError, match=r"^unknown key cfg\.pre\.zzz$") as err:
        Preprocess.from_dict({"zzz": 1}, where="cfg.pre")
    assert err.value.hint.startswith("known keys: resize, center_crop, scale")


def test_every_entry_kind_has_a_reader() -> None:
    assert set(READERS) == set(get_args(EntryKind))


def test_test_data_sets_holding_batches_are_counted(tmp_path: Path) -> None:
    for i in range(2):
        d = tmp_path / f"test_data_set_{i}"
        d.mkdir()
        batch = np.stack([image(i)] * 3)
        (d / "input_0.pb").write_bytes(numpy_helper.from_array(batch, "image").SerializeToString())
    folder = DataFolder(tmp_path, IMAGE_INPUTS)
    assert len(folder) == 6 and folder.entry_sizes() == [3, 3]
    assert [b.size for b in DataFolder(tmp_path, IMAGE_INPUTS, start=2, samples=3).batches(8)] == [3]


def test_fixed_batch_dim_is_never_stacked(tmp_path: Path) -> None:
    spec = [type(IMAGE_INPUTS[0])("image", np.dtype("float32"), (1, 1, 4, 4))]
    for i in range(3):
        write_npz(tmp_path / f"{i}.npz", image=image(i)[None])
    assert [b.size for b in DataFolder(tmp_path, spec).batches(8)] == [1, 1, 1]


# Run in a fresh interpreter: in a process that has run hundreds of tests, CPython's own tables
# (the interned-strings dict, resized while numpy parses 10,000 .npy headers) add a transient
# of a few MB to tracemalloc's peak that has nothing to do with what the reader keeps alive.
STREAM_PEAKS = """
import json, sys, tracemalloc
import numpy as np
from qcli.data import DataFolder
from qcli.data.inputs import InputSpec

def peak(samples):
    folder = DataFolder(sys.argv[1], [InputSpec("image", np.dtype("float32"), ("N", 1000))], samples=samples)
    tracemalloc.start()
    seen = sum(batch.size for batch in folder.batches(8))
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seen, top

peak(16)  # one-time imports and caches
print(json.dumps([peak(1000), peak(None)]))
"""


def test_ten_thousand_samples_stream_in_bounded_memory(tmp_path: Path) -> None:
    """Reading 10,000 samples (40 MB) keeps about one batch alive: the peak does not grow
    with the number of samples."""
    row = np.ones(1000, np.float32)  # 4 KB per sample
    for i in range(10_000):
        np.save(tmp_path / f"{i:05d}.npy", row)
    child = subprocess.run([sys.executable, "-c", STREAM_PEAKS, str(tmp_path)], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).parent.parent)
    (seen_small, peak_small), (seen, peak) = json.loads(child.stdout)
    assert (seen_small, seen) == (1000, 10_000)
    assert peak < 4_000_000, f"peak {peak} bytes for 40 MB of samples"
    assert peak < 1.5 * peak_small + 256_000, f"peak grows with samples: {peak_small} -> {peak}"


def test_preprocess_refuses_nan_and_infinity() -> None:
    """`mean: [.nan]` was accepted and turned every image into NaN (issue 20)."""
    with pytest.raises(DataError, match=r"data\.preprocess\.std\.0: Input should be a finite number \(got inf\)"):
        Preprocess.from_dict({"std": [float("inf")]})
