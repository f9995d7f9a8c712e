"""What the two models of an analysis must share: the inputs both take and the outputs the
float model gives (`check_compatible`)."""

from __future__ import annotations

from typing import Protocol

import onnx

from qcli.data import InputSpec, model_inputs
from qcli.errors import ModelError


class Labelled(Protocol):
    """A model and the name it is reported by (qcli.analyze.core's `_Model`)."""

    @property
    def proto(self) -> onnx.ModelProto: ...

    @property
    def label(self) -> str: ...


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
