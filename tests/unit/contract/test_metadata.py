"""Nested metadata flattened by the documented rule (stream_export.contract.metadata)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.contract.metadata import flatten


def test_nested_metadata_becomes_dotted_keys_and_lists_of_objects_json_text() -> None:
    nested = {
        "context": "dark-room",
        "args": {"rollout": "r0", "room": {"name": "dark room", "exits": ["north"]}},
        "empty": {},
        "plan": [{"x": 1}, [2]],
    }
    assert flatten(nested) == {
        "context": "dark-room",
        "args.rollout": "r0",
        "args.room.name": "dark room",
        "args.room.exits": ["north"],
        "plan": '[{"x":1},[2]]',
    }
    assert flatten(None) is None


@pytest.mark.parametrize("clash", [{"a.b": 1, "a": {"b": 2}}, {"a": {"b": 2}, "a.b": 1}])
def test_two_keys_that_flatten_to_one_are_refused_naming_it(clash: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"'a\.b'"):
        flatten(clash)
    with pytest.raises(ValueError, match="object"):
        flatten(["not", "an", "object"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=4), json_values, max_size=4))
def test_flat_metadata_is_the_contracts_shape_or_a_clash(metadata: dict[str, Any]) -> None:
    try:
        flat = flatten(metadata)
    except ValueError as exc:
        assert "given twice" in str(exc)
        return
    assert flat is not None
    for value in flat.values():
        assert not isinstance(value, dict)
        if isinstance(value, list):
            assert not any(isinstance(v, (dict, list)) for v in value)
