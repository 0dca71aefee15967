"""The token plane: deltas put back together, continuity, segments and breaks, checked
against an independent reference built from the calls' full prompts
(tests/support/token_calls.py), directly and through the assembler."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.assemble.episode import fitted
from stream_export.assemble.tokens import token_plane, tokens_upto
from stream_export.contract.calls import Tokens, version_key
from stream_export.contract.decoding import encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.settings.assemble import AssembleSettings
from tests.support.assemble_sim import TICK, Item, Pipeline
from tests.support.token_calls import Call, Expected, conversations, episode_steps, expected


def check(tokens: Tokens, want: Expected) -> None:
    """``tokens`` is exactly what the reference says, and each segment's loss mask and
    aligned logprobs follow from it."""
    assert tokens.base_missing == want.base_missing
    assert len(tokens.segments) == len(want.segments)
    for seg, ref in zip(tokens.segments, want.segments, strict=True):
        assert [span.seq for span in seg.calls] == ref["seqs"]
        assert seg.input_ids == ref["input_ids"]
        assert seg.logprobs == ref["logprobs"]
        assert seg.break_reason == ref["reason"]
        assert (seg.weight_version_min, seg.weight_version_max) == (ref["min"], ref["max"])
        spans = [(span.start, seg.input_ids[span.start : span.end]) for span in seg.calls]
        assert spans == ref["sampled"]
        mask, aligned = seg.loss_mask(), seg.aligned_logprobs()
        assert len(mask) == len(aligned) == len(seg.input_ids)
        assert [lp for lp, m in zip(aligned, mask, strict=True) if m] == seg.logprobs
        assert all(lp == 0.0 for lp, m in zip(aligned, mask, strict=True) if not m)
    versions = [v for ref in want.segments for v in ref["versions"]]
    low = min(versions, key=version_key) if versions else None
    high = max(versions, key=version_key) if versions else None
    assert (tokens.weight_version_min, tokens.weight_version_max) == (low, high)


@given(conversations())
@settings(max_examples=400, deadline=None)
def test_segments_are_the_reference_ones(conversation: tuple[list[Call], int]) -> None:
    calls, count = conversation
    steps = episode_steps("e", calls, count)
    plane = token_plane(steps)
    if all(c.lost for c in calls):
        assert plane is None
        return
    assert plane is not None
    want = expected(calls)
    check(plane.tokens, want)
    # the steps to publish: every step that arrived but the calls left out, in seq
    # order, each call without its token arrays (they are in the segments)
    assert [s.seq for s in plane.steps] == [s.seq for s in steps if s.seq not in want.base_missing]
    for step in plane.steps:
        if step.call is not None:
            assert step.call.prompt_token_ids == step.call.completion_token_ids == []
            assert step.call.logprobs == [] and step.call.prompt_base is None
            assert step.call.response.content == f"answer {step.seq}"


@given(conversations(), st.integers(-1, 25))
@settings(max_examples=200, deadline=None)
def test_cutting_the_tokens_at_a_step_is_assembling_the_steps_up_to_it(
    conversation: tuple[list[Call], int], last: int
) -> None:
    steps = episode_steps("e", conversation[0], conversation[1])
    whole, upto = token_plane(steps), token_plane([s for s in steps if s.seq <= last])
    if whole is None:
        return
    cut = tokens_upto(whole.tokens, last)
    if upto is None:
        assert cut.segments == []
        return
    assert cut.segments == upto.tokens.segments
    assert cut.weight_version_min == upto.tokens.weight_version_min
    assert cut.weight_version_max == upto.tokens.weight_version_max


def call(seq: int, prompt: list[int], completion: list[int], base: int | None = None) -> Step:
    calls = {seq: Call(seq, prompt, completion, [-1.0] * len(completion), seq, base)}
    if base is not None:  # only its length matters to the delta: say it sent nothing
        calls[base] = Call(base, [], [], [], 0)
    return calls[seq].step("e", calls)


def test_a_delta_chain_is_one_segment_and_a_re_rendered_history_starts_another() -> None:
    steps = [
        call(0, [1, 2], [3]),
        Step(episode_id="e", time=1.0, seq=1, kind="action_result", content="tool says 4"),
        call(2, [4], [5, 6], base=0),  # 1 2 3 + 4, then 5 6 sampled
        call(3, [7], [8], base=2),
        call(4, [1, 2, 3, 9], [10]),  # the history re-rendered: another token after 3
        call(5, [1, 2, 3, 9], [11]),  # the same prompt again
    ]
    plane = token_plane(steps)
    assert plane is not None
    first, second, third = plane.tokens.segments
    assert first.input_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first.loss_mask() == [0, 0, 1, 0, 1, 1, 0, 1]
    assert first.aligned_logprobs() == [0.0, 0.0, -1.0, 0.0, -1.0, -1.0, 0.0, -1.0]
    assert (first.weight_version_min, first.weight_version_max) == (0, 3)
    assert (second.break_reason, second.input_ids) == ("prefix_mismatch", [1, 2, 3, 9, 10])
    assert (third.break_reason, third.input_ids) == ("repeated_prompt", [1, 2, 3, 9, 11])
    assert (plane.tokens.weight_version_min, plane.tokens.weight_version_max) == (0, 5)


def test_a_delta_against_a_missing_base_is_left_out_and_so_are_its_own_deltas() -> None:
    steps = [
        call(0, [1], [2]),
        Step(episode_id="e", time=1.0, seq=1, kind="thought"),
        call(2, [3], [4], base=1),  # a thought is no base
        call(3, [5], [6], base=2),  # its base is itself left out
        call(5, [7], [8], base=4),  # seq 4 never arrived
        call(6, [9], [10], base=0),  # 1 2 + 9: continues call 0
    ]
    plane = token_plane(steps)
    assert plane is not None
    assert plane.tokens.base_missing == [2, 3, 5]
    (segment,) = plane.tokens.segments
    assert segment.input_ids == [1, 2, 9, 10] and [c.seq for c in segment.calls] == [0, 6]
    assert [s.seq for s in plane.steps] == [0, 1, 6]


def test_weight_versions_order_numbers_by_value_before_other_strings() -> None:
    versions: list[int | str] = ["v10", 3, "12", "v9", -1, "2"]
    assert sorted(versions, key=version_key) == [-1, "2", 3, "12", "v10", "v9"]


def test_an_episode_without_calls_has_no_token_plane() -> None:
    assert token_plane([Step(episode_id="e", time=1.0, seq=0, kind="thought")]) is None


# -- through the assembler -----------------------------------------------------


def events_of(calls: list[Call], count: int) -> list[StepEvent]:
    start = EpisodeStart(episode_id="e", time=999.0, agent_id="a", prompt="p")
    end = EpisodeEnd(episode_id="e", time=2000.0, steps=count, outcome="success", reward=1.0)
    return [start, *episode_steps("e", calls, count), end]


def assemble(batches: list[list[StepEvent]]) -> tuple[list[Episode], list[tuple[str, int]]]:
    """The episodes published and the dead letters of ``batches``, each followed by a
    persist and a restart (a rebuild from the tables), then a tick late enough to
    close an episode that lost a call."""
    limits, offset, wall = AssembleSettings(), 0, 5000.0
    pipeline = Pipeline(limits)
    emitted, dead = [], []
    for batch in [*batches, None]:
        items: list[Item] = [(offset, TICK)] if batch is None else list(enumerate(batch, offset))
        if batch is None:
            wall += 20_000
        pipeline.batch(items, wall)
        offset += len(items)
        emitted += pipeline.emitted
        dead += pipeline.dead
        pipeline = Pipeline.rebuilt(limits, pipeline.memory, wall, position=offset)
    return emitted, dead


@given(conversations(), st.randoms(use_true_random=False), st.integers(0, 5))
@settings(max_examples=200, deadline=None)
def test_the_assembler_builds_the_reference_segments_whatever_the_order_and_repeats(
    conversation: tuple[list[Call], int], rng: random.Random, repeats: int
) -> None:
    """Events shuffled and some sent twice, in batches with persists and a restart:
    the published episode carries the reference segments, and each call whose base
    is missing is dead-lettered once, from the offset it was accepted at."""
    calls, count = conversation
    events = events_of(calls, count)
    events += [rng.choice(events) for _ in range(repeats)]
    rng.shuffle(events)
    half = len(events) // 2
    (episode,), dead = assemble([events[:half], events[half:]])
    want = expected(calls)
    if episode.tokens is None:
        assert not [c for c in calls if not c.lost]
    else:
        check(episode.tokens, want)
    first: dict[int, int] = {}
    for offset, event in enumerate(events):
        if isinstance(event, Step):
            first.setdefault(event.seq, offset)
    # a repeat after the episode closed is late; nothing else is a dead letter
    assert sorted(d for d in dead if d[0] != "late_event") == sorted(
        ("token_base_missing", first[s]) for s in want.base_missing
    )
    assert [s.seq for s in episode.steps] == [
        s for s in range(count) if s in first and s not in want.base_missing
    ]
    assert len(episode.sources) == len(episode.steps) + 2


@given(conversations(), st.integers(400, 4000))
@settings(max_examples=150, deadline=None)
def test_a_record_cut_to_fit_keeps_the_tokens_of_the_steps_it_keeps(
    conversation: tuple[list[Call], int], limit: int
) -> None:
    calls, count = conversation
    (episode,), _ = assemble([events_of(calls, count)])
    found = fitted(episode, limit)
    if found is None:
        return
    short, value = found
    assert len(value) <= limit and value == encode(short)
    if short.steps == episode.steps:
        assert short.tokens == episode.tokens
        return
    assert short.truncated_reason == "max_bytes"
    if episode.tokens is not None:
        last = short.steps[-1].seq if short.steps else -1
        assert short.tokens == tokens_upto(episode.tokens, last)
        assert msgspec.json.decode(value)["tokens"]["base_missing"] == episode.tokens.base_missing
