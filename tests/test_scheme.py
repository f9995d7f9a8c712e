"""Granularity is a type in the core: the config's spelling in, PerTensor/PerChannel/PerBlock out."""

from __future__ import annotations

import numpy as np
import pytest

from qcli.errors import ConfigError
from qcli.scheme import (
    Granularity,
    PerBlock,
    PerChannel,
    PerTensor,
    QuantScheme,
    choose_qparams,
    dequantize,
    granularity_of,
    quant_dtype,
    quantize,
)


def test_granularity_of_each_config_spelling() -> None:
    assert granularity_of("per_tensor") == PerTensor()
    assert granularity_of("per_channel") == PerChannel()
    assert granularity_of("per_block", 32) == PerBlock(32)
    assert granularity_of("per_channel", 32) == PerChannel()  # block_size is read for per_block only
    assert all(isinstance(granularity_of(n, 16), Granularity) for n in ("per_tensor", "per_channel", "per_block"))


@pytest.mark.parametrize("name, block_size", [("per_axis", None), ("per_block", None), ("per_block", 0)])
def test_granularity_of_refuses_what_it_cannot_type(name: str, block_size: int | None) -> None:
    with pytest.raises(ConfigError):
        granularity_of(name, block_size)


def test_scheme_of_the_config_spelling() -> None:
    scheme = QuantScheme.of("int4", "per_block", symmetric=True, block_size=32)
    assert scheme == QuantScheme(quant_dtype("int4"), PerBlock(32), True)
    assert QuantScheme.of("uint8") == QuantScheme(quant_dtype("uint8"), PerTensor(), False)
    assert QuantScheme.of("int8", "per_channel", True, block_size=0).granularity == PerChannel()


def test_schemes_compare_and_hash_by_value() -> None:
    a, b = QuantScheme.of("int4", "per_block", True, 32), QuantScheme.of("int4", "per_block", True, 32)
    assert a == b and hash(a) == hash(b)
    assert a != QuantScheme.of("int4", "per_block", True, 64)
    assert len({a, b, QuantScheme.of("int8")}) == 2


def test_granularity_matches_by_type() -> None:
    def describe(g: Granularity) -> str:
        match g:
            case PerBlock(size):
                return f"blocks of {size}"
            case PerChannel():
                return "per channel"
            case PerTensor():
                return "per tensor"
        return "?"

    assert [describe(granularity_of(n, 16)) for n in ("per_tensor", "per_channel", "per_block")] == [
        "per tensor", "per channel", "blocks of 16"
    ]


def test_symmetric_int4_uses_all_sixteen_levels_with_the_largest_value_exact() -> None:
    """The value of largest magnitude maps to -8 whatever its sign (a negative scale when it is
    positive); the rest round on a step 7/8 of -7..7's, so the error falls."""
    int4 = quant_dtype("int4")
    block = np.array([[0.3, -0.1, 2.4, 0.9], [-1.6, 0.5, 1.0, -0.2]], np.float32)
    scale, zero = choose_qparams(block.min(axis=1), block.max(axis=1), int4, symmetric=True)
    assert scale.tolist() == pytest.approx([-0.3, 0.2]) and zero.tolist() == [0, 0]
    q = quantize(block, scale, zero, int4, axis=0, symmetric=True)
    assert q[0, 2] == -8 and q[1, 0] == -8 and q.min() >= -8 and q.max() <= 7
    back = dequantize(q, scale, zero, axis=0)
    assert back[0, 2] == pytest.approx(2.4) and back[1, 0] == pytest.approx(-1.6)
    w = np.random.default_rng(0).standard_normal((256, 32)).astype(np.float32)
    step = np.abs(choose_qparams(w.min(axis=1), w.max(axis=1), int4, symmetric=True)[0])
    assert step == pytest.approx(np.abs(w).max(axis=1) / 8)  # -7..7's would be max / 7


def test_int4_blocks_of_denormals_get_a_scale_of_one_from_either_candidate() -> None:
    """A block too narrow for a normal float32 scale gets scale 1 (onnxruntime's kernels fail on
    denormal scales), whichever of the full-range and -7..7 scales the block keeps."""
    from qcli.plan import WeightPlan
    from qcli.qweights import weight_qparams

    w = np.full((32, 2), 1e-39, np.float32)
    w[:, 1] = np.linspace(-1, 1, 32)
    scale, zero = weight_qparams(w, WeightPlan("w", QuantScheme.of("int4", "per_block", True, 32), 0))
    # -1 and 1 both in the block: -8..7 would clip one of them, so it keeps -7..7's step
    assert scale[0, 0] == 1.0 and scale[0, 1] == pytest.approx(1 / 7) and zero.tolist() == [[0, 0]]
