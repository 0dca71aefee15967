"""The steps route's pure parts: a batch parsed and numbered atomically after the
episode's steps, and a repeat answered as the first (or refused when it conflicts
or skips one)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.client.recorder import EpisodeBuilder
from stream_export.contract.events import Step
from stream_export.errors import GatewayRefusal
from stream_export.gateway import steps
from stream_export.gateway.book import LastBatch, OpenEpisode


def episode() -> OpenEpisode:
    builder = EpisodeBuilder(episode_id="ep-1", agent_id="a", prompt="p", max_event_bytes=4096)
    builder.start()
    builder.thought("before")  # stands for a call recorded before
    return OpenEpisode(builder)


def test_a_batch_is_numbered_after_the_episodes_steps() -> None:
    open_episode = episode()
    batch = steps.parse(
        {
            "batch": 0,
            "steps": [
                {"kind": "thought", "content": "why", "extra": "ignored"},
                {"kind": "action", "name": "open_door", "arguments": {"direction": "north"}},
            ],
        }
    )
    made = steps.events(open_episode, batch)
    assert [(e.seq, e.kind) for e in made if isinstance(e, Step)] == [(1, "thought"), (2, "action")]
    assert open_episode.builder.steps == 3


@pytest.mark.parametrize(
    ("body", "reason", "text"),
    [
        ({"batch": -1, "steps": [{"kind": "thought"}]}, "invalid_steps", "batch"),
        ({"batch": True, "steps": [{"kind": "thought"}]}, "invalid_steps", "batch"),
        ({"batch": 0, "steps": []}, "invalid_steps", "steps"),
        (
            {"batch": 0, "steps": [{"kind": "thought"}, {"kind": "llm_call"}]},
            "invalid_step",
            "steps[1]",
        ),
        ({"batch": 0, "steps": [{"kind": "action", "arguments": [1]}]}, "invalid_step", "steps[0]"),
    ],
)
def test_a_bad_batch_is_refused_naming_the_step(
    body: dict[str, Any], reason: str, text: str
) -> None:
    with pytest.raises(GatewayRefusal) as refused:
        steps.parse(body)
    assert (refused.value.status, refused.value.reason) == (400, reason)
    assert text in refused.value.detail


def test_a_step_too_large_refuses_its_batch_and_takes_no_seq() -> None:
    open_episode = episode()
    batch = steps.parse(
        {
            "batch": 0,
            "steps": [
                {"kind": "thought", "content": "ok"},
                {"kind": "thought", "content": "x" * 5000},
            ],
        }
    )
    with pytest.raises(GatewayRefusal, match=r"steps\[1\]"):
        steps.events(open_episode, batch)
    assert open_episode.builder.steps == 1  # no gap: the first step gave its seq back


def test_a_repeat_answers_as_the_first_and_a_conflict_or_a_skip_is_refused() -> None:
    open_episode = episode()
    first = steps.parse({"batch": 0, "steps": [{"kind": "thought", "content": "a"}]})
    assert steps.answered_before(open_episode, first) is None  # new
    answer = {"episode_id": "ep-1", "batch": 0, "first_seq": 1, "steps": 2}
    open_episode.batches, open_episode.last_batch = 1, LastBatch(0, first.digest, answer)
    assert steps.answered_before(open_episode, first) == answer
    other = steps.parse({"batch": 0, "steps": [{"kind": "thought", "content": "b"}]})
    with pytest.raises(GatewayRefusal, match="other steps") as conflict:
        steps.answered_before(open_episode, other)
    assert conflict.value.reason == "batch_conflict"
    skip = steps.parse({"batch": 2, "steps": [{"kind": "thought"}]})
    with pytest.raises(GatewayRefusal, match="batch 2 before batch 1") as skipped:
        steps.answered_before(open_episode, skip)
    assert skipped.value.reason == "batch_out_of_order"


def test_the_logged_state_keeps_the_batches_for_a_restart() -> None:
    open_episode = episode()
    answer = {"episode_id": "ep-1", "batch": 0, "first_seq": 1, "steps": 2}
    open_episode.batches, open_episode.last_batch = 1, LastBatch(0, "d", answer)
    restored = OpenEpisode.restore("ep-1", open_episode.state(), [], 4096)
    assert (restored.batches, restored.last_batch) == (1, LastBatch(0, "d", answer))
    older = {k: v for k, v in open_episode.state().items() if k not in ("batches", "last_batch")}
    assert OpenEpisode.restore("ep-1", older, [], 4096).batches == 0  # an older log's line


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=20,
)
kinds = st.sampled_from(["thought", "action", "llm_call", "output", 3, None])
steps_like = st.lists(
    st.fixed_dictionaries(
        {"kind": kinds}, optional={"content": json_values, "arguments": json_values}
    ),
    max_size=3,
)


@given(
    st.fixed_dictionaries({}, optional={"batch": json_values, "steps": steps_like | json_values})
)
def test_any_body_is_a_batch_or_a_400_naming_why(body: dict[str, Any]) -> None:
    try:
        batch = steps.parse(body)
    except GatewayRefusal as refused:
        assert refused.status == 400 and refused.reason in ("invalid_steps", "invalid_step")
        return
    open_episode = episode()
    try:
        made = steps.events(open_episode, batch)
    except GatewayRefusal as refused:
        assert refused.reason == "invalid_step" and open_episode.builder.steps == 1
        return
    assert [e.seq for e in made if isinstance(e, Step)] == list(range(1, 1 + len(batch.steps)))
