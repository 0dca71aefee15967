"""Hostile input: whatever bytes a producer sends, only typed rejections come out.

Fuzzes the decoders and the assembler's whole per-message path
(:func:`assemble.state.receive`, then closing, building, encoding and formatting
the episodes) with arbitrary bytes, mutated events and arbitrarily deep JSON.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_export.contract.decoding import MAX_DEPTH, decode_episode, decode_event, encode
from stream_export.contract.events import Step
from stream_export.errors import DecodeError
from stream_export.output import formatter
from stream_export.runtime.metrics import Metrics
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings
from tests.support.assemble_sim import TICK, Item, Pipeline

DECODE_REASONS = {"not_json", "invalid", "too_large", "too_deep", "unknown_type"}
DECODE_REASONS |= {"unsupported_version", "call_too_large", "token_length_mismatch"}
DECODE_REASONS |= {"out_of_range"}
ASSEMBLE_REASONS = {"future_time", "seq_out_of_range", "max_steps", "max_bytes", "max_duration"}
ASSEMBLE_REASONS |= {"state_expired", "late_event", "conflicting_duplicate", "key_mismatch"}
ASSEMBLE_REASONS |= {"token_base_missing"}
NOW = 1_700_000_000.0

START = {"type": "start", "episode_id": "e1", "time": NOW, "agent_id": "a", "prompt": "p"}
STEP = {"type": "step", "episode_id": "e1", "time": NOW, "seq": 0, "kind": "action"}
END = {"type": "end", "episode_id": "e1", "time": NOW, "steps": 1, "outcome": "success"}
CALL_FIELDS = {
    "request": {"messages": [{"role": "user", "content": "hi"}]},
    "response": {"content": "yo"},
    "prompt_token_ids": [1, 2],
    "completion_token_ids": [3],
    "logprobs": [-0.5],
    "model": "m",
    "weight_version": 1,
    "finish_reason": "stop",
    "request_id": "r",
}
CALL = {**STEP, "kind": "llm_call", "call": CALL_FIELDS}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["start", "step", "end", "e1", "e2", "action", "success"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)


def nest(depth: int, leaf: str = "1", *, objects: bool = False) -> str:
    """``depth`` levels of arrays (or objects) around ``leaf``, as JSON text."""
    if objects:
        return '{"k":' * depth + leaf + "}" * depth
    return "[" * depth + leaf + "]" * depth


def with_field(event: dict[str, Any], field: str, raw_json: str) -> bytes:
    """``event`` as JSON with ``field`` set to the literal JSON text ``raw_json``."""
    base = json.dumps({**event, field: "@@"})
    return base.replace('"@@"', raw_json).encode()


@st.composite
def mutated_events(draw: st.DrawFn) -> bytes:
    """A valid event with one field replaced, added or removed, or its bytes cut."""
    event = dict(draw(st.sampled_from([START, STEP, END, CALL])))
    event["episode_id"] = draw(st.sampled_from(["e1", "e2", "e3"]))
    action = draw(st.sampled_from(["replace", "add", "remove", "cut", "keep"]))
    keys = sorted(event)
    if action == "replace":
        event[draw(st.sampled_from(keys))] = draw(json_values)
    elif action == "add":
        field = draw(st.sampled_from(["data", "arguments", "metadata", "seq", "x", "v", "name"]))
        event[field] = draw(json_values)
    elif action == "remove":
        del event[draw(st.sampled_from(keys))]
    data = json.dumps(event, allow_nan=True).encode()
    if action == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    return data


@st.composite
def deep_events(draw: st.DrawFn) -> bytes:
    """A valid event with a value nested 0-3000 levels deep somewhere in it."""
    event = draw(st.sampled_from([START, STEP, END, CALL]))
    field = draw(st.sampled_from(["data", "arguments", "metadata", "prompt", "unknown", "time"]))
    depth = draw(st.integers(0, 3000))
    return with_field(event, field, nest(depth, objects=draw(st.booleans())))


messages = st.binary(max_size=300) | mutated_events() | deep_events()


@given(st.binary(max_size=2000) | mutated_events() | deep_events())
@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
def test_decoding_any_bytes_gives_an_event_or_a_typed_error(data: bytes) -> None:
    try:
        decode_event(data)
    except DecodeError as exc:
        assert exc.reason in DECODE_REASONS, exc
    try:
        decode_episode(data)
    except DecodeError as exc:
        assert exc.reason in DECODE_REASONS, exc


@pytest.mark.parametrize(
    ("field", "objects"), [("data", False), ("data", True), ("arguments", True)]
)
def test_free_form_values_nest_at_most_max_depth(field: str, objects: bool) -> None:
    ok = decode_event(with_field(STEP, field, nest(MAX_DEPTH, objects=objects)))
    assert getattr(ok, field) is not None
    for depth in (MAX_DEPTH + 1, 1000, 100_000):
        with pytest.raises(DecodeError) as caught:
            decode_event(with_field(STEP, field, nest(depth, objects=objects)))
        assert caught.value.reason == "too_deep"
        assert "64 levels" in caught.value.detail


@pytest.mark.parametrize("field", ["metadata", "prompt", "unknown", "time", "episode_id"])
def test_a_thousand_levels_anywhere_is_a_decode_error(field: str) -> None:
    """The issue's poison pill (about 1000 levels, ~6 KB) in any field, known or not."""
    data = with_field(START, field, nest(1000, objects=True))
    assert 5_000 < len(data) < 8_000
    with pytest.raises(DecodeError) as caught:
        decode_event(data)
    assert caught.value.reason in {"too_deep", "invalid"}


@pytest.mark.parametrize(
    ("field", "where"),
    [
        ("usage", "$.call.usage"),
        ("tools", "$.call.request.tools"),
        ("content", "$.call.request.messages[0].content"),
    ],
)
def test_a_calls_free_form_values_nest_at_most_max_depth(field: str, where: str) -> None:
    def with_value(depth: int) -> bytes:
        value = json.loads(nest(depth, '{"k": 1}', objects=True))
        call = json.loads(json.dumps(CALL_FIELDS))
        if field == "usage":
            call["usage"] = value
        elif field == "tools":
            call["request"]["tools"] = [value]
        else:
            call["request"]["messages"][0]["content"] = [value]
        return json.dumps({**CALL, "call": call}).encode()

    ok = decode_event(with_value(MAX_DEPTH - 2))
    assert isinstance(ok, Step) and ok.call is not None
    with pytest.raises(DecodeError) as caught:
        decode_event(with_value(MAX_DEPTH))
    assert caught.value.reason == "too_deep" and where in caught.value.detail


def test_an_episode_with_a_deep_step_is_a_decode_error() -> None:
    step = decode_event(with_field(STEP, "data", nest(MAX_DEPTH)))
    episode: dict[str, Any] = {
        "episode_id": "e1",
        "agent_id": "a",
        "prompt": "p",
        "steps": [msgspec_builtins(step)],
        "start_time": NOW,
        "end_time": NOW,
        "outcome": "success",
    }
    assert decode_episode(json.dumps(episode).encode()).steps[0].data is not None
    episode["steps"][0]["data"] = json.loads(nest(MAX_DEPTH + 1))
    with pytest.raises(DecodeError) as caught:
        decode_episode(json.dumps(episode).encode())
    assert caught.value.reason == "too_deep" and "$.steps[0].data" in caught.value.detail


def msgspec_builtins(value: Any) -> Any:
    return json.loads(encode(value))


FORMATTERS = [
    formatter.build(FormatSettings(format=name, granularity=granularity), Metrics())
    for name in ("text", "conversational", "episode")
    for granularity in ("episode", "step")
]


KEYS: list[bytes | None] = [b"e1", b"e2", b"e3", b"", None]


def valid_messages() -> st.SearchStrategy[bytes]:
    """Well-formed events of a few episodes, in any order and with any seq or count."""
    eids = st.sampled_from(["e1", "e2", "e3"])
    times = st.floats(NOW - 100_000, NOW + 10_000)
    start = st.builds(lambda e, t: {**START, "episode_id": e, "time": t}, eids, times)
    step = st.builds(
        lambda e, t, s, d: {**STEP, "episode_id": e, "time": t, "seq": s, "data": d},
        eids,
        times,
        st.integers(0, 12),
        json_values,
    )
    call = st.builds(
        lambda e, t, s, b: {
            **CALL,
            "episode_id": e,
            "time": t,
            "seq": s,
            "call": {**CALL_FIELDS, "prompt_base": b},
        },
        eids,
        times,
        st.integers(0, 12),
        st.none() | st.integers(0, 12),
    )
    end = st.builds(
        lambda e, t, n, r: {**END, "episode_id": e, "time": t, "steps": n, "reward": r},
        eids,
        times,
        st.integers(0, 12),
        st.none() | st.floats(-10, 10),
    )
    return (start | step | call | end).map(lambda event: json.dumps(event).encode())


@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from([b"e1", b"e2", b"e3", b"", None]), valid_messages() | messages
            ),
            max_size=12,
        ),
        max_size=6,
    ),
    st.lists(st.booleans(), min_size=6, max_size=6),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_per_message_path_only_gives_verdicts_and_typed_rejections(
    batches: list[list[tuple[bytes | None, bytes]]], persist: list[bool]
) -> None:
    """Arbitrary messages through the per-message path (receive(), batch ends,
    persists, a rebuild from the stored chunks), then every closed episode through
    encoding, decoding and every built-in format: nothing raises, and every
    rejection has a known reason."""
    limits = AssembleSettings(
        max_steps=10,
        idle_timeout_s=50,
        max_duration_s=1000,
        window_expires_s=10_000,
        closed_retention_s=10_000,
    )
    pipeline, offset = Pipeline(limits), 0
    for i, messages_ in enumerate(batches):
        items: list[Item] = [(offset + j, message) for j, message in enumerate(messages_)]
        offset += len(items)
        pipeline.batch(items, NOW, persist=persist[i])
        if persist[i] and i % 2:  # a restart: rebuild from what the tables hold
            pipeline = Pipeline.rebuilt(limits, pipeline.memory, NOW)
    pipeline.batch([(offset, TICK)], NOW + 10_000)  # time out whatever is still open
    for reason, _ in pipeline.dead:
        assert reason in DECODE_REASONS | ASSEMBLE_REASONS | {
            "missing_start",
            "token_base_missing",
        }, reason
    for episode in pipeline.emitted:
        assert decode_episode(encode(episode)) == episode
        for format_episode in FORMATTERS:
            format_episode(episode)  # a FormatError here fails the test
