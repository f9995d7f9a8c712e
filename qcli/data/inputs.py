"""The model inputs a data folder must feed: name, dtype and dimensions of each graph input."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx


@dataclass(frozen=True)
class InputSpec:
    """A graph input as the data must supply it: name, numpy dtype, dims (int, str or None).

    >>> spec = InputSpec("x", np.dtype("float32"), ("N", 3, None))
    >>> spec.batchable, spec.shape_text()
    (True, '[N, 3, ?]')
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def batchable(self) -> bool:
        """True when the first axis is free (symbolic or unknown), so samples can be stacked."""
        return bool(self.shape) and not isinstance(self.shape[0], int)

    def shape_text(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed (graph inputs that are not initializers).

    >>> import onnx.parser
    >>> model = onnx.parser.parse_model('''
    ...     <ir_version: 8, opset_import: ["" : 17]>
    ...     g (float[N, 3] x, int64[2] k) => (float[N, 3] y) <int64[2] k = {1, 3}> { y = Relu(x) }
    ... ''')
    >>> [(s.name, str(s.dtype), s.shape) for s in model_inputs(model)]
    [('x', 'float32', ('N', 3))]
    """
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims: list[int | str | None] = []
        for d in tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        specs.append(InputSpec(value.name, dtype, tuple(dims)))
    return specs
