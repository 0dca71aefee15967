"""The gateway's pure parts: what it asks the upstream and strips again, a call put
together from any split of its stream, and the steps each call makes (tool results
before their call, deltas, aborted streams), across a restart too."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.assemble.tokens import token_plane
from stream_export.client.recorder import EpisodeBuilder
from stream_export.contract.calls import text_only
from stream_export.contract.decoding import decode_event, encode_event
from stream_export.contract.events import Step
from stream_export.errors import GatewayRequestError
from stream_export.gateway.book import OpenEpisode, call_events
from stream_export.gateway.mapping import (
    ABORTED,
    Asked,
    Sampled,
    StreamGather,
    call_request,
    sampled,
    strip,
    upstream_request,
)
from stream_export.gateway.wal import EpisodeLog

ids = st.lists(st.integers(0, 50_000), min_size=1, max_size=30)
texts = st.lists(st.text(max_size=5), min_size=1, max_size=30)


def chat_answer(prompt: list[int], completion: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "tiny",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": {"content": [{"token": "x", "logprob": lp} for lp in logprobs]},
                "token_ids": completion,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": len(prompt)},
    }


@given(logprobs=st.booleans(), token_ids=st.booleans(), seed=st.integers())
def test_the_upstream_is_asked_for_ids_and_logprobs_and_the_client_gets_only_what_it_asked(
    logprobs: bool, token_ids: bool, seed: int
) -> None:
    body = {"messages": [], "seed": seed, "logprobs": logprobs, "return_token_ids": token_ids}
    sent, asked = upstream_request("chat", body)
    assert sent["logprobs"] is True and sent["return_token_ids"] is True
    assert sent["seed"] == seed and asked == Asked(logprobs=logprobs, token_ids=token_ids)
    answer = chat_answer([1, 2], [3], [-0.5])
    shown = strip(answer, asked)
    (choice,) = shown["choices"]
    assert ("prompt_token_ids" in shown) is token_ids and ("token_ids" in choice) is token_ids
    assert (choice["logprobs"] is not None) is logprobs
    assert choice["message"] == answer["choices"][0]["message"]
    assert answer == chat_answer([1, 2], [3], [-0.5])  # the upstream's answer is left as it was


def test_completions_ask_for_one_logprob_unless_the_client_chose() -> None:
    sent, asked = upstream_request("completions", {"prompt": "a"})
    assert (sent["logprobs"], asked.logprobs) == (1, False)
    sent, asked = upstream_request("completions", {"prompt": "a", "logprobs": 3})
    assert (sent["logprobs"], asked.logprobs) == (3, True)


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", {"messages": [{"role": "user", "content": "a"}], "n": 2}),
        ("chat", {"messages": [{"role": "function", "content": "a"}]}),
        ("completions", {"prompt": ["a", "b"]}),
    ],
)
def test_a_request_that_is_not_one_recordable_call_is_refused(
    endpoint: Any, body: dict[str, Any]
) -> None:
    with pytest.raises(GatewayRequestError):
        call_request(endpoint, body, max_bytes=1 << 20)
        upstream_request(endpoint, body)


def _chunks(
    prompt: list[int], pieces: list[tuple[list[int], str]], logprobs: list[float]
) -> list[dict[str, Any]]:
    """A vLLM-style chat stream: prompt ids in the first chunk, ids per chunk."""
    chunks: list[dict[str, Any]] = [
        {"id": "c", "model": "tiny", "prompt_token_ids": prompt, "choices": [{"delta": {}}]}
    ]
    taken = 0
    for ids_, text in pieces:
        lps = logprobs[taken : taken + len(ids_)]
        taken += len(ids_)
        content = [{"logprob": lp} for lp in lps]
        chunks.append(
            {
                "id": "c",
                "choices": [
                    {
                        "delta": {"content": text},
                        "token_ids": ids_,
                        "logprobs": {"content": content},
                    }
                ],
            }
        )
    chunks.append({"id": "c", "choices": [{"delta": {}, "finish_reason": "stop"}]})
    return chunks


@settings(max_examples=60)
@given(prompt=ids, completion=ids, texts_=texts, data=st.data())
def test_a_stream_in_any_pieces_gives_the_tokens_logprobs_and_text_of_the_whole_answer(
    prompt: list[int], completion: list[int], texts_: list[str], data: st.DataObject
) -> None:
    logprobs = [-(i + 1) / 7 for i in range(len(completion))]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(completion)), max_size=len(completion))))
    bounds = [0, *[c for c in cuts if c < len(completion)], len(completion)]
    pieces = [
        (completion[a:b], texts_[i % len(texts_)])
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    gather = StreamGather("chat")
    for chunk in _chunks(prompt, pieces, logprobs):
        gather.feed(chunk)
    call = gather.result()
    assert (call.prompt_token_ids, call.completion_token_ids) == (prompt, completion)
    assert call.logprobs == logprobs and call.finish_reason == "stop"
    assert call.response.content == ("".join(t for _, t in pieces) or None)
    whole = sampled("chat", chat_answer(prompt, completion, logprobs))
    assert (whole.completion_token_ids, whole.logprobs) == (completion, logprobs)


@given(prompt=ids, completion=ids, left_after=st.integers(0, 30))
def test_a_stream_the_client_left_is_recorded_as_far_as_it_went_and_marked_aborted(
    prompt: list[int], completion: list[int], left_after: int
) -> None:
    logprobs = [-1.0] * len(completion)
    pieces = [([token], "t") for token in completion]
    gather = StreamGather("chat")
    for chunk in _chunks(prompt, pieces, logprobs)[: 1 + left_after]:
        gather.feed(chunk)
    call = gather.result(aborted=True)
    assert call.finish_reason == ABORTED
    assert call.completion_token_ids == completion[:left_after]
    assert len(call.logprobs) == len(call.completion_token_ids)


def test_streamed_tool_calls_are_put_together_from_their_deltas() -> None:
    gather = StreamGather("chat")
    parts = [
        {"index": 0, "id": "call_a", "function": {"name": "get_weather", "arguments": '{"ci'}},
        {"index": 0, "function": {"arguments": 'ty": "oslo"}'}},
    ]
    gather.feed({"id": "c", "prompt_token_ids": [1], "choices": [{"delta": {}}]})
    for part in parts:
        logprobs = {"content": [{"logprob": -1.0}]}
        choice = {"delta": {"tool_calls": [part]}, "token_ids": [5], "logprobs": logprobs}
        gather.feed({"choices": [choice]})
    (tool,) = gather.result().response.tool_calls or []
    assert (tool.id, tool.function.name) == ("call_a", "get_weather")
    assert json.loads(tool.function.arguments) == {"city": "oslo"}


def test_unreadable_token_data_makes_a_text_only_call_never_an_error() -> None:
    mismatched = sampled("chat", chat_answer([1], [2, 3], [-1.0]))
    assert (mismatched.lost, mismatched.text_only) == ("logprobs_mismatch", True)
    assert mismatched.response.content == "hi"
    null = chat_answer([1], [2], [-1.0])
    null["choices"][0]["logprobs"] = None
    entries = chat_answer([1], [2, 3], [-1.0, -2.0])
    entries["choices"][0]["logprobs"]["content"][1]["logprob"] = None
    nan = chat_answer([1], [2], [float("nan")])
    bad_ids = chat_answer([1], [2], [-1.0])
    bad_ids["choices"][0]["token_ids"] = ["x"]
    no_ids = chat_answer([1], [2], [-1.0])
    del no_ids["choices"][0]["token_ids"]
    cases = [(null, "null_logprobs"), (entries, "null_logprobs"), (nan, "null_logprobs")]
    cases += [(bad_ids, "missing_ids"), (no_ids, "missing_ids")]
    for answer, reason in cases:
        call = sampled("chat", answer)
        assert (call.lost, call.text_only, call.logprobs) == (reason, True, []), answer
        assert call.response.content == "hi"


def test_a_stream_goes_on_text_only_from_its_first_chunk_with_null_logprobs() -> None:
    gather = StreamGather("chat")
    choice = {"delta": {"content": "a"}, "token_ids": [5]}
    choice["logprobs"] = {"content": [{"logprob": -1.0}]}
    gather.feed({"prompt_token_ids": [1, 2], "choices": [choice]})
    gather.feed({"choices": [{"delta": {"content": "b"}, "token_ids": [6], "logprobs": None}]})
    gather.feed({"choices": [{"delta": {"content": "c"}, "token_ids": [7], "logprobs": None}]})
    gather.feed({"choices": [{"delta": {}, "token_ids": [], "finish_reason": "stop"}]})
    call = gather.result()
    assert (call.lost, call.text_only, call.response.content) == ("null_logprobs", True, "abc")


def test_an_answer_without_token_ids_or_not_asking_for_them_is_a_text_only_call() -> None:
    hosted = chat_answer([1], [2], [-1.0])
    del hosted["prompt_token_ids"]
    del hosted["choices"][0]["token_ids"]  # a hosted model: logprobs, no ids
    call = sampled("chat", hosted)
    assert call.text_only and call.response.content == "hi"
    assert (call.prompt_token_ids, call.completion_token_ids, call.logprobs) == ([], [], [])
    not_asked = sampled("chat", chat_answer([1], [2], [-1.0]), tokens=False)
    assert not_asked.text_only and not_asked.finish_reason == "length"
    assert not sampled("chat", chat_answer([1], [], [])).text_only  # a prompt, nothing sampled
    body = {"messages": [], "logprobs": False}
    assert upstream_request("chat", body, tokens=False) == (body, Asked(False, False))


def test_a_text_only_call_is_in_no_token_segment_and_breaks_no_delta() -> None:
    """Between two token calls, a text-only call keeps its text in the steps; the next
    token call is still a delta of the previous token call, in the same segment."""
    episode = _episode()
    hosted = chat_answer([], [], [])
    del hosted["prompt_token_ids"]
    made = [
        call_events(episode, _request(), call, "tiny").events[0]
        for call in (_call([1, 2], [3]), sampled("chat", hosted), _call([1, 2, 3, 4], [5]))
    ]
    steps = [step for step in made if isinstance(step, Step)]
    assert len(steps) == 3
    _, middle, last = (s.call for s in steps)
    assert middle is not None and text_only(middle) and middle.response.content == "hi"
    assert last is not None and (last.prompt_base, last.prompt_token_ids) == (0, [4])
    plane = token_plane(steps)
    assert plane is not None
    (segment,) = plane.tokens.segments
    assert segment.input_ids == [1, 2, 3, 4, 5] and [c.seq for c in segment.calls] == [0, 2]
    assert plane.steps[1] == steps[1]
    alone = token_plane(steps[1:2])  # an episode of text-only calls: no segment
    assert alone is not None and alone.tokens.segments == [] and alone.steps == steps[1:2]


def _call(prompt: list[int], completion: list[int], tools: list[str] = ()) -> Sampled:  # type: ignore[assignment]
    answer = chat_answer(prompt, completion, [-0.25] * len(completion))
    answer["choices"][0]["message"]["tool_calls"] = [
        {"id": t, "type": "function", "function": {"name": "look", "arguments": "{}"}}
        for t in tools
    ]
    return sampled("chat", answer)


def _request(*tool_ids: str) -> Any:
    messages = [{"role": "user", "content": "go"}]
    messages += [{"role": "tool", "content": f"result {t}", "tool_call_id": t} for t in tool_ids]
    return call_request("chat", {"messages": messages}, max_bytes=1 << 20)


def _episode() -> OpenEpisode:
    builder = EpisodeBuilder(episode_id="e", agent_id="a", prompt="p", clock=lambda: 1.0)
    builder.start()
    return OpenEpisode(builder)


def test_tool_results_become_action_result_steps_before_their_call_once_each() -> None:
    episode = _episode()
    first = call_events(episode, _request(), _call([1, 2], [3], ["call_a", "call_b"]), "tiny")
    assert [(e.seq, e.kind) for e in first.events] == [(0, "llm_call")]  # type: ignore[union-attr]
    second = call_events(
        episode, _request("call_b", "call_a", "call_x"), _call([1, 2, 3, 9], [4]), "tiny"
    )
    steps = [e for e in second.events if isinstance(e, Step)]
    assert [(s.seq, s.kind, s.id, s.content) for s in steps] == [
        (1, "action_result", "call_b", "result call_b"),
        (2, "action_result", "call_a", "result call_a"),
        (3, "llm_call", None, ""),
    ]
    again = call_events(episode, _request("call_b", "call_a"), _call([1, 2, 3, 9, 4], [5]), "tiny")
    assert [e.kind for e in again.events] == ["llm_call"]  # type: ignore[union-attr]
    for event in [*first.events, *second.events, *again.events]:
        decode_event(encode_event(event))  # the worker takes every one


@settings(max_examples=60)
@given(
    turns=st.lists(st.tuples(ids, ids, st.booleans()), min_size=1, max_size=6),
    restart_at=st.integers(0, 6),
)
def test_calls_are_deltas_when_they_continue_and_a_restart_changes_nothing(
    turns: list[tuple[list[int], list[int], bool]], restart_at: int, tmp_path_factory: Any
) -> None:
    """Each call's prompt is sent as a delta against the previous call when it continues
    it (else whole); an episode restored from the log at any point numbers and bases
    its next calls exactly as one that never stopped."""
    folder = tmp_path_factory.mktemp("wal")
    log = EpisodeLog(folder)
    log.open()
    steady, restarted = _episode(), _episode()
    history: list[int] = []
    for turn, (added, completion, continues) in enumerate(turns):
        prompt = history + added if continues else added
        if turn == restart_at:
            asyncio.run(log.state("e", restarted.state(), []))
            log.close()
            log = EpisodeLog(folder)
            ((key, (state, outbox)),) = log.open().episodes.items()
            restarted = OpenEpisode.restore(key, state, outbox, 1 << 20)
        one = call_events(steady, _request(), _call(prompt, completion), "tiny").events
        two = call_events(restarted, _request(), _call(prompt, completion), "tiny").events
        timeless = [msgspec.structs.replace(e, time=1.0) for e in two]
        assert [encode_event(e) for e in one] == [encode_event(e) for e in timeless]
        (step,) = one
        assert isinstance(step, Step) and step.call is not None and step.seq == turn
        base = turn - 1 if turn and prompt[: len(history)] == history else None
        assert step.call.prompt_base == base
        assert step.call.prompt_token_ids == (
            prompt[len(history) :] if base is not None else prompt
        )
        history = prompt + completion
    log.close()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_call_whose_request_alone_is_over_the_event_cap_is_refused_before_sampling(
    endpoint: Any,
) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 2000}], "prompt": "x" * 2000}
    assert call_request(endpoint, body, max_bytes=4096).messages[0].content == "x" * 2000
    with pytest.raises(GatewayRequestError) as over:
        call_request(endpoint, body, max_bytes=2000)
    assert over.value.reason == "call_too_large"
