"""Versions in the outputs: a conversation that continues across a fence keeps one
token segment, each call with the version that served it, and the segment's and
the episode's min/max span both; the tokens row carries them."""

from __future__ import annotations

from typing import Any

from stream_export.assemble.tokens import token_plane
from stream_export.client.recorder import EpisodeBuilder
from stream_export.contract.events import Step
from stream_export.gateway.book import OpenEpisode, call_events
from stream_export.gateway.mapping import call_request, sampled, served_by


def answer(prompt: list[int], completion: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "tiny",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "message": {"role": "assistant", "content": "hi"},
                "token_ids": completion,
                "logprobs": {"content": [{"logprob": -0.5} for _ in completion]},
                "finish_reason": "length",
            }
        ],
        **extra,
    }


def test_a_conversation_across_a_fence_keeps_its_segment_with_each_calls_version() -> None:
    builder = EpisodeBuilder(episode_id="e", agent_id="a", prompt="p", clock=lambda: 1.0)
    builder.start()
    episode = OpenEpisode(builder)
    request = call_request("chat", {"messages": [{"role": "user", "content": "go"}]}, 1 << 20)
    # the first call was served by version 3 (the fence's stamp), the second, which
    # continues it token for token after a commit, by 4; the third by an upstream
    # that reports its own version 5, which wins over the stamp
    calls = [
        (sampled("chat", answer([1, 2], [3])), 3),
        (sampled("chat", answer([1, 2, 3, 9], [4])), 4),
        (sampled("chat", answer([1, 2, 3, 9, 4, 7], [8], weight_version=5)), 4),
    ]
    steps = []
    for call, stamp in calls:
        version = call.weight_version if call.weight_version is not None else stamp
        steps += [
            e
            for e in call_events(episode, request, call, weight_version=version).events
            if isinstance(e, Step)
        ]
    plane = token_plane(steps)
    assert plane is not None
    (segment,) = plane.tokens.segments
    assert segment.input_ids == [1, 2, 3, 9, 4, 7, 8]
    assert [c.weight_version for c in segment.calls] == [3, 4, 5]
    assert (segment.weight_version_min, segment.weight_version_max) == (3, 5)
    assert (plane.tokens.weight_version_min, plane.tokens.weight_version_max) == (3, 5)


def test_without_a_fence_or_an_upstream_version_the_model_name_is_recorded() -> None:
    assert served_by(sampled("chat", answer([1], [2])), None) == "tiny"
    assert served_by(sampled("chat", answer([1], [2])), 0) == 0
