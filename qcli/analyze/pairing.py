"""What the two models of an analysis read: the inputs both take (`check_compatible`), and how
many samples one run of each takes (`run_batch`)."""

from __future__ import annotations

from typing import Protocol

import onnx

from qcli.data import DataFolder, InputSpec, model_inputs
from qcli.errors import ModelError
from qcli.prepare.shapes import batch_within


class Labelled(Protocol):
    """A model and the name it is reported by (qcli.analyze.core's `_Model`)."""

    @property
    def proto(self) -> onnx.ModelProto: ...

    @property
    def label(self) -> str: ...


def run_batch(model: onnx.ModelProto, folder: DataFolder, asked: int) -> int:
    """Samples per run: `asked`, fewer when one sample's intermediate tensors pass RUN_BYTES
    (`batch_within`): each session keeps the memory of its largest run, and the speech-quality
    CNN's 9 s clips at the default 32 held 7.6 GB in `quantize --eval-data`'s evaluation."""
    first = next(iter(folder.batches(1)), None)
    return asked if first is None else batch_within(model, {n: a.shape for n, a in first.inputs.items()}, asked)


def check_compatible(fm: Labelled, qm: Labelled) -> list[InputSpec]:
    """The float model's inputs, after checking the quantized model takes and gives the same."""
    fin, qin = model_inputs(fm.proto), model_inputs(qm.proto)
    fnames, qnames = [s.name for s in fin], [s.name for s in qin]
    if sorted(fnames) != sorted(qnames):
        raise ModelError(
            f"the models take different inputs: {fm.label} takes {', '.join(fnames)}; "
            f"{qm.label} takes {', '.join(qnames)}",
            hint="compare a quantized model with the float model it was made from",
        )
    qspec = {s.name: s for s in qin}
    for f in fin:
        q = qspec[f.name]
        if f.dtype != q.dtype or len(f.shape) != len(q.shape):
            raise ModelError(
                f"input {f.name!r} differs: {fm.label} expects {f.dtype} {f.shape_text()}, "
                f"{qm.label} expects {q.dtype} {q.shape_text()}",
                hint="compare a quantized model with the float model it was made from",
            )
    fout = [o.name for o in fm.proto.graph.output]
    qout = {o.name for o in qm.proto.graph.output}
    missing = [n for n in fout if n not in qout]
    if missing:
        raise ModelError(
            f"{qm.label} lacks output(s) {', '.join(map(repr, missing))} of {fm.label}",
            hint="compare a quantized model with the float model it was made from",
        )
    return fin
