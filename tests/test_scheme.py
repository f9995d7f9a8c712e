"""Granularity is a type in the core: the config's spelling in, PerTensor/PerChannel/PerBlock out."""

from __future__ import annotations

import pytest

from qcli.errors import ConfigError
from qcli.scheme import Granularity, PerBlock, PerChannel, PerTensor, QuantScheme, granularity_of, quant_dtype


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
