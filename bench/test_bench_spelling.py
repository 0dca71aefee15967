"""The respelling bench.bench_spelling measures is correct: a line msgspec wrote,
respelt, is the bytes of ``json.dumps(record, ensure_ascii=False)``, floats of the
whole range included (msgspec writes ``-3.36e-6`` where Python writes
``-3.36e-06``), and strings that read like such floats are left as they are."""

from __future__ import annotations

import json
import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_spelling import python_spelling
from stream_export.rows.formats import encode

#: Floats at every boundary of either notation, and the extremes.
EDGES = [1e-4, 9.999999999999999e-05, 1e-5, 1.5e-5, 1e-6, 1e-9, 1e-10, 1e15, 1e16]
EDGES += [9999999999999998.0, 1.5e17, 1e100, 5e-324, sys.float_info.max, -0.0, 0.0]
EDGES += [-3.36e-6, 10.00001, 100.000012, 1e-300]
floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(EDGES)
#: Text a respelling could take for a number: exponents, a tiny fixed float, a
#: uuid's hex, escaped quotes before them.
LOOKALIKES = ["1e-6", " 1e-6,", "[0.00001]", "e16", ' "x": 1e16}', '\\", 2e-7', "78e51061-ce-6f"]
texts = st.text(st.characters(blacklist_categories=["Cs"])) | st.sampled_from(LOOKALIKES)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | floats | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=24,
)


@given(st.dictionaries(texts, values, max_size=6))
@settings(max_examples=1000, deadline=None)
def test_a_line_is_the_bytes_of_json_dumps(record: dict[str, Any]) -> None:
    assert python_spelling(encode(record)) == json.dumps(record, ensure_ascii=False).encode()


@given(st.lists(floats, max_size=50))
@settings(max_examples=500, deadline=None)
def test_every_float_is_spelled_as_python_does(numbers: list[float]) -> None:
    record = {"logprobs": numbers, "reward": numbers[0] if numbers else None}
    assert python_spelling(encode(record)) == json.dumps(record).encode()


def test_the_issues_example() -> None:
    line = encode({"logprobs": [-3.36e-6, 0.0]})
    assert line == b'{"logprobs": [-3.36e-6, 0.0]}'  # msgspec's notation, as written
    assert python_spelling(line) == b'{"logprobs": [-3.36e-06, 0.0]}'
