"""The step-event contract: round trips, forward compatibility and typed decode errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.contract.calls import (
    CallMessage,
    CallRequest,
    CallResponse,
    LlmCall,
    ToolCall,
    ToolFunction,
)
from stream_export.contract.decoding import decode_event, encode, encode_event
from stream_export.contract.events import (
    SCHEMA_VERSION,
    ChatMessage,
    EpisodeEnd,
    EpisodeStart,
    Step,
    StepEvent,
)
from stream_export.contract.widths import INT32_MAX
from stream_export.errors import DecodeError, StreamExportError

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
    id=st.none() | st.text(max_size=12),
)
tool_calls = st.none() | st.lists(
    st.builds(
        ToolCall,
        id=st.text(max_size=8),
        function=st.builds(ToolFunction, name=st.text(max_size=8), arguments=st.text(max_size=20)),
    ),
    max_size=2,
)
call_messages = st.builds(
    CallMessage,
    role=st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
    content=st.none() | st.text(max_size=20) | st.lists(st.fixed_dictionaries({"text": ids})),
    name=st.none() | st.text(max_size=8),
    reasoning=st.none() | st.text(max_size=20),
    tool_calls=tool_calls,
    tool_call_id=st.none() | st.text(max_size=8),
)


@st.composite
def llm_calls(draw: st.DrawFn) -> Step:
    """An llm_call step: logprobs one per completion token, prompt_base before seq."""
    seq = draw(st.integers(0, 2**40))
    completion = draw(st.lists(st.integers(0, INT32_MAX), max_size=8))
    call = LlmCall(
        request=CallRequest(
            messages=draw(st.lists(call_messages, max_size=3)),
            tools=draw(st.none() | st.lists(st.dictionaries(st.text(max_size=5), json_values))),
        ),
        response=draw(
            st.builds(
                CallResponse,
                content=st.none() | st.text(max_size=20),
                reasoning=st.none() | st.text(max_size=20),
                tool_calls=tool_calls,
            )
        ),
        prompt_token_ids=draw(st.lists(st.integers(0, INT32_MAX), max_size=8)),
        completion_token_ids=completion,
        logprobs=[draw(st.floats(-1e4, 0)) for _ in completion],
        model=draw(st.text(max_size=10)),
        weight_version=draw(st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10)),
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls"])),
        request_id=draw(st.text(max_size=10)),
        usage=draw(st.none() | st.dictionaries(st.text(max_size=8), json_values)),
        prompt_base=draw(st.none() | st.integers(0, seq - 1)) if seq else None,
    )
    return Step(episode_id=draw(ids), time=draw(times), seq=seq, kind="llm_call", call=call)


ends = st.builds(
    EpisodeEnd,
    episode_id=ids,
    time=times,
    steps=st.integers(min_value=0, max_value=10_000),
    outcome=st.sampled_from(["success", "failure", "other"]),
    reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    metadata=metadata,
)
events = st.one_of(starts, steps, llm_calls(), ends)


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
REASONS |= {"call_too_large", "token_length_mismatch", "out_of_range"}


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


def call_json(seq: int = 3, **changes: Any) -> bytes:
    """An llm_call step as JSON, with ``changes`` to its ``call``."""
    call = {
        "request": {"messages": [{"role": "user", "content": "hi"}], "tools": []},
        "response": {"content": "hello", "reasoning": "greet back"},
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3, 4, 5],
        "logprobs": [-0.5, -0.25, 0.0],
        "model": "tiny",
        "weight_version": 7,
        "finish_reason": "stop",
        "request_id": "r1",
        **changes,
    }
    return step_json(seq=seq, kind="llm_call", call=call)


def test_an_llm_call_keeps_every_field_and_ignores_unknown_ones() -> None:
    data = json.loads(call_json(prompt_base=1, usage={"prompt_tokens": 2}, x_server="vllm"))
    data["call"]["request"]["messages"][0]["cache_control"] = {"type": "ephemeral"}
    step = decode_event(json.dumps(data).encode())
    assert isinstance(step, Step) and step.call is not None
    call = step.call
    assert (call.prompt_base, call.usage, call.weight_version) == (1, {"prompt_tokens": 2}, 7)
    assert call.request.messages == [CallMessage(role="user", content="hi")]
    assert (call.response.content, call.response.reasoning) == ("hello", "greet back")
    text_version = decode_event(call_json(weight_version="global_step_12"))
    assert isinstance(text_version, Step) and text_version.call is not None
    assert text_version.call.weight_version == "global_step_12"


@pytest.mark.parametrize(
    ("data", "reason", "where"),
    [
        (step_json(kind="llm_call"), "invalid", "$.call"),
        (json.dumps({**json.loads(call_json()), "kind": "thought"}).encode(), "invalid", "$.call"),
        (call_json(logprobs=[-1.0]), "token_length_mismatch", "$.call.logprobs"),
        (call_json(completion_token_ids=[]), "token_length_mismatch", "$.call.logprobs"),
        (call_json(prompt_base=3), "invalid", "$.call.prompt_base"),
        (call_json(prompt_base=-1), "invalid", "$.call.prompt_base"),
        (call_json(prompt_token_ids=[1, -2]), "invalid", "$.call.prompt_token_ids"),
        (call_json(weight_version=1.5), "invalid", "$.call.weight_version"),
        (call_json(weight_version="v" * 257), "invalid", "$.call.weight_version"),
        (call_json(model=None), "invalid", "$.call.model"),
        (call_json(request={"messages": [{"role": "robot"}]}), "invalid", "role"),
        (call_json(response={"tool_calls": [{"function": {}}]}), "invalid", "tool_calls"),
    ],
)
def test_a_bad_llm_call_says_what_is_wrong_and_where(data: bytes, reason: str, where: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_event(data)
    assert info.value.reason == reason
    assert where in info.value.detail


def test_an_llm_call_over_the_event_limit_has_its_own_reason() -> None:
    big = call_json(prompt_token_ids=list(range(500)))
    assert reason_of(big, max_bytes=1000) == "call_too_large"
    assert reason_of(step_json(content="x" * 2000), max_bytes=1000) == "too_large"
    cut = big[:1500]  # not even JSON: only the size is known
    assert reason_of(cut, max_bytes=1000) == "too_large"
    with pytest.raises(DecodeError) as refused:
        encode_event(decode_event(big), max_bytes=1000)
    assert refused.value.reason == "call_too_large"


def test_tool_call_ids_ride_on_actions_and_their_results() -> None:
    action = decode_event(step_json(kind="action", name="open_door", id="call_1"))
    assert isinstance(action, Step) and action.id == "call_1"
    assert b'"id"' not in encode(decode_event(step_json(kind="action")))
