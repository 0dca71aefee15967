"""The gateway's JSON (msgspec on the hot path) reads exactly what the standard
library reads, refuses exactly what it refuses, and writes what both read back."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.errors import JsonTooDeepError
from stream_export.gateway import wire

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@given(VALUES)
def test_every_document_the_standard_library_writes_decodes_the_same(value: Any) -> None:
    data = json.dumps(value).encode()  # NaN and Infinity included, as Python servers write
    assert same(wire.decode(data), json.loads(data))


@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_any_bytes_decode_as_the_standard_library_decodes_them_or_fail_alike(data: bytes) -> None:
    try:
        expected = json.loads(data)
    except ValueError:
        with pytest.raises(ValueError):
            wire.decode(data)
    else:
        assert same(wire.decode(data), expected)


@given(VALUES)
def test_what_it_writes_any_parser_reads_back(value: Any) -> None:
    written = wire.encode(value)
    read = json.loads(written, parse_constant=lambda c: pytest.fail(f"wrote {c}"))
    finite = json.loads(json.dumps(value), parse_constant=lambda _: None)
    assert same(read, finite)


@pytest.mark.parametrize("data", [b"[" * 200_000, b'{"a":' * 100_000, b"[NaN," * 100_000])
def test_json_deeper_than_a_decoder_goes_is_a_value_error_of_its_own(data: bytes) -> None:
    with pytest.raises(JsonTooDeepError) as deep:  # was a RecursionError: a 500
        wire.decode(data)
    assert isinstance(deep.value, ValueError)
    assert wire.decode(b"[" * 500 + b"]" * 500) is not None
