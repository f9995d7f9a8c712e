"""Read a data folder (DESIGN.md §2) as a stream of samples checked against the model's inputs.

Layouts, detected from the folder's contents (`scan`), each read by the reader of its kind
(`readers`):
- `*.npz`: one array per model input keyed by the input's name, optional `label`;
- `*.npy`: one array, for single-input models;
- ONNX test data: `test_data_set_*/input_<i>.pb` (+ `output_<i>.pb`, kept as reference outputs);
- images (`.png .jpg .jpeg .bmp`), at the top level or in class subfolders (`DIR/<class>/x.png`,
  sorted class names -> label ids, as torchvision's ImageFolder), decoded with Pillow and
  preprocessed as a `Preprocess` says;
- `labels.csv` (`file,label`) beside the samples gives or overrides labels for any layout.

Decisions (docs/guides/data-folders.md says the same for users):
- Files are read in sorted order of their path relative to DIR; `samples=N` keeps the first N
  samples (a file holding a batch counts as that many samples).
- An array with the model input's rank is a batch whose first axis is the batch axis; one rank
  lower is a single sample and gets a batch axis of 1. Inputs whose first dimension is a fixed
  number cannot be batched: each file is then one run of the model.
- dtypes must match exactly (no silent float64 -> float32 casts: the error says how to convert);
  fixed dimensions must match; NaN/Inf in float inputs is an error naming file and input
  (`validate`).
- Only one sample file is in memory at a time, plus the batch being assembled (`folder`).
"""

from __future__ import annotations

from qcli.data.folder import DataFolder
from qcli.data.inputs import InputSpec, model_inputs
from qcli.data.preprocess import Preprocess
from qcli.data.readers import Reading
from qcli.data.samples import LABEL_KEY, Batch, Sample
from qcli.data.scan import IMAGE_EXTENSIONS, LABELS_CSV

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_KEY",
    "LABELS_CSV",
    "Batch",
    "DataFolder",
    "InputSpec",
    "Preprocess",
    "Reading",
    "Sample",
    "model_inputs",
]
