"""The step-event contract: round trips, forward compatibility and typed decode errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.errors import DecodeError, StreamExportError
from stream_export.events import (
    SCHEMA_VERSION,
    ChatMessage,
    EpisodeEnd,
    EpisodeStart,
    Step,
    StepEvent,
    decode_event,
    encode,
    encode_event,
)

ids = st.text(min_size=1, max_size=40)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
metadata = st.dictionaries(st.text(max_size=10), scalars | st.lists(scalars, max_size=3))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
prompts = st.text() | st.lists(
    st.builds(
        ChatMessage,
        role=st.sampled_from(["system", "user", "assistant", "tool"]),
        content=st.text(),
        name=st.none() | st.text(max_size=10),
    ),
    max_size=3,
)
starts = st.builds(
    EpisodeStart,
    episode_id=ids,
    time=times,
    agent_id=ids,
    prompt=prompts,
    group_id=st.none() | st.text(max_size=20),
    group_size=st.none() | st.integers(1, 100_000),
    metadata=metadata,
)
steps = st.builds(
    Step,
    episode_id=ids,
    time=times,
    seq=st.integers(min_value=0, max_value=2**40),
    kind=st.sampled_from(
        ["observation", "thought", "action", "action_result", "output", "message"]
    ),
    content=st.text(),
    name=st.none() | st.text(max_size=20),
    arguments=st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    data=json_values,
)
ends = st.builds(
    EpisodeEnd,
    episode_id=ids,
    time=times,
    steps=st.integers(min_value=0, max_value=10_000),
    outcome=st.sampled_from(["success", "failure", "other"]),
    reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    metadata=metadata,
)
events = st.one_of(starts, steps, ends)


def reason_of(data: bytes | None, **kwargs: Any) -> str:
    with pytest.raises(DecodeError) as info:
        decode_event(data, **kwargs)
    assert isinstance(info.value, StreamExportError)
    return info.value.reason


def step_json(**changes: Any) -> bytes:
    base = {"type": "step", "v": 1, "episode_id": "e1", "time": 1.5, "seq": 0, "kind": "thought"}
    return json.dumps({**base, **changes}).encode()


@given(events)
def test_every_valid_event_round_trips(event: StepEvent) -> None:
    data = encode(event)
    assert decode_event(data) == event
    assert encode_event(event) == data


@given(events)
def test_every_encoded_event_carries_its_type_and_version(event: StepEvent) -> None:
    raw = json.loads(encode(event))
    assert raw["v"] == SCHEMA_VERSION
    assert raw["type"] == event.__struct_config__.tag


REASONS = {"not_json", "invalid", "too_large", "unknown_type", "unsupported_version"}


def decodes_or_rejects(data: bytes) -> None:
    try:
        event = decode_event(data, max_bytes=250)
    except DecodeError as exc:
        assert exc.reason in REASONS and exc.detail
    else:
        assert isinstance(event, (EpisodeStart, Step, EpisodeEnd))


@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_nothing_but_decode_error(data: bytes) -> None:
    decodes_or_rejects(data)


@given(json_values | st.dictionaries(st.sampled_from(["type", "v", "seq", "kind"]), json_values))
def test_arbitrary_json_raises_nothing_but_decode_error(value: Any) -> None:
    decodes_or_rejects(json.dumps(value).encode())


@given(events, st.binary(max_size=20), st.integers(min_value=0))
def test_corrupted_events_raise_nothing_but_decode_error(
    event: StepEvent, junk: bytes, at: int
) -> None:
    data = encode(event)
    at %= len(data)
    decodes_or_rejects(data[:at] + junk + data[at + len(junk) :])


@given(events, st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=3))
def test_unknown_fields_are_ignored(event: StepEvent, extra: dict[str, Any]) -> None:
    raw = json.loads(encode(event))
    unknown = {f"x_{key}": value for key, value in extra.items()}
    assert decode_event(json.dumps({**unknown, **raw}).encode()) == event


def test_unknown_fields_in_chat_messages_are_ignored() -> None:
    data = json.dumps(
        {
            "type": "start",
            "episode_id": "e",
            "time": 1,
            "agent_id": "a",
            "prompt": [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}],
        }
    ).encode()
    event = decode_event(data)
    assert isinstance(event, EpisodeStart)
    assert event.prompt == [ChatMessage(role="user", content="hi")]


def test_a_missing_version_means_version_1() -> None:
    data = step_json()
    without = json.loads(data)
    del without["v"]
    assert decode_event(json.dumps(without).encode()) == decode_event(data)


@pytest.mark.parametrize(
    ("data", "reason", "where"),
    [
        (None, "not_json", "empty"),
        (b"", "not_json", "empty"),
        (b"\xff\xfe not json", "not_json", "byte 0"),
        (b'{"type": "step", ', "not_json", "truncated"),
        (b"[1, 2]", "invalid", "array"),
        (step_json(seq="three"), "invalid", "$.seq"),
        (step_json(seq=-1), "invalid", "$.seq"),
        (step_json(kind="dance"), "invalid", "$.kind"),
        (step_json(episode_id=""), "invalid", "$.episode_id"),
        (step_json(v=0), "invalid", "$.v"),
        (step_json(type="bogus"), "unknown_type", "$.type"),
        (b'{"episode_id": "e1"}', "unknown_type", "$.type"),
        (step_json(v=2), "unsupported_version", "$.v"),
        (step_json(v=2, type="start"), "unsupported_version", "$.v"),
        (step_json(v=3, type="bogus", seq="x"), "unsupported_version", "$.v"),
    ],
)
def test_bad_input_says_what_is_wrong_and_where(
    data: bytes | None, reason: str, where: str
) -> None:
    with pytest.raises(DecodeError) as info:
        decode_event(data)
    assert info.value.reason == reason
    assert where in info.value.detail


@pytest.mark.parametrize("size", [0, 100_001, "4", 2.5])
def test_group_size_is_a_positive_bounded_integer(size: object) -> None:
    start = {"type": "start", "episode_id": "e", "time": 1.0, "agent_id": "a", "prompt": "p"}
    assert decode_event(json.dumps({**start, "group_size": 8}).encode()) == EpisodeStart(
        episode_id="e", time=1.0, agent_id="a", prompt="p", group_size=8
    )
    with pytest.raises(DecodeError) as info:
        decode_event(json.dumps({**start, "group_size": size}).encode())
    assert info.value.reason == "invalid" and "$.group_size" in info.value.detail


def test_too_large_is_checked_before_parsing() -> None:
    big = step_json(content="x" * 2000)
    assert reason_of(big, max_bytes=1000) == "too_large"
    assert reason_of(b"\x00" * 1001, max_bytes=1000) == "too_large"
    assert isinstance(decode_event(big, max_bytes=len(big)), Step)


def test_encode_event_refuses_what_a_worker_would_reject() -> None:
    # Struct construction does not validate; encode_event checks with the decoder.
    bad = Step(episode_id="e", time=1.0, seq=-1, kind="thought")
    with pytest.raises(DecodeError) as info:
        encode_event(bad)
    assert "$.seq" in info.value.detail
    with pytest.raises(DecodeError) as too_big:
        encode_event(Step(episode_id="e", time=1.0, seq=0, kind="thought"), max_bytes=10)
    assert too_big.value.reason == "too_large"


def test_decoded_events_are_the_union_members() -> None:
    start = b'{"type":"start","episode_id":"e","time":1,"agent_id":"a","prompt":"p"}'
    end = b'{"type":"end","episode_id":"e","time":2,"steps":0,"outcome":"other"}'
    assert type(decode_event(start)) is EpisodeStart
    assert type(decode_event(step_json())) is Step
    assert type(decode_event(end)) is EpisodeEnd
