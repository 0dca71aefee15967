"""The group judge's pure part (request, schema, reading answers, applying a verdict),
the book's judging transitions, its settings, and the groups stage with a judge in
the crash simulator: the first verdict read for a group wins, whatever the kills
and rebalances, and nothing is published twice with other content."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.contract.decoding import decode_event, decode_record
from stream_export.contract.episode import Episode
from stream_export.contract.events import Score
from stream_export.errors import ConfigError, JudgeError
from stream_export.groups import judge
from stream_export.groups.stage import GroupStage
from stream_export.groups.state import Duplicate, Emitted, Ignored, Judging, Late, Member, OpenGroup
from stream_export.settings import Settings, load
from tests.support.group_book import book, m
from tests.support.stage_runs import dead, groups_logic, outputs, play, rollout_log
from tests.support.stage_sim import Broker, Msg, World, run

JUDGE = ("groups.judge_url=http://judge:8000/v1", "groups.judge_model=j", "scores.enabled=true")


def judged_settings(*more: str) -> Settings:
    return load(env={}, overrides=["groups.enabled=true", *JUDGE, *more])


def answer(content: Any) -> bytes:
    return json.dumps({"choices": [{"message": {"content": content}}]}).encode()


def test_an_answer_of_one_score_per_attempt_gives_tenths() -> None:
    assert judge.parse(answer('{"2": 10, "1": 3}'), 2) == [0.3, 1.0]


@pytest.mark.parametrize(
    "body",
    [
        answer('{"1": 3}'),  # one missing
        answer('{"1": 3, "2": 4, "3": 5}'),  # one too many
        answer('{"1": 11, "2": 4}'),  # out of range
        answer('{"1": true, "2": 4}'),  # not an integer
        answer('{"1": 3.5, "2": 4}'),
        answer("3, 4"),
        answer(None),
        b'{"choices": []}',
        b"<html>busy</html>",
    ],
)
def test_an_answer_that_is_not_the_json_asked_for_is_a_failed_attempt(body: bytes) -> None:
    with pytest.raises(JudgeError):
        judge.parse(body, 2)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200)
    | json_values.map(lambda v: answer(json.dumps(v)))
    | st.dictionaries(st.sampled_from(["1", "2", "3", "x"]), json_values).map(
        lambda d: answer(json.dumps(d))
    ),
    st.integers(1, 3),
)
def test_a_hostile_answer_never_crashes_and_always_fails_typed(body: bytes, n: int) -> None:
    try:
        scores = judge.parse(body, n)
    except JudgeError:
        return
    assert len(scores) == n and all(0 <= s <= 1 and s * 10 == int(s * 10) for s in scores)


def test_the_request_asks_for_exactly_one_bounded_score_per_attempt() -> None:
    s = judged_settings("groups.judge_max_chars=1000")
    body = judge.request("p" * 5000, ["a" * (1 << 20)] * 16, s)
    assert len(json.dumps(body)) < 16 * 1000 + 5000  # 16 rollouts of 1 MiB, bounded
    assert body["temperature"] == 0 and body["model"] == "j"
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == [str(i) for i in range(1, 17)]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["16"] == {"type": "integer", "enum": list(range(11))}
    user = body["messages"][1]["content"]
    assert user.count("[...]") == 17 and "Attempt 16:\n" in user


def test_a_text_is_cut_to_its_start_and_end() -> None:
    assert judge.cut("abcdefghijklmnopqrstuvwxyz", 15) == "abcde[...]vwxyz"
    assert judge.cut("short", 15) == "short"


def test_judge_settings_are_checked_when_loaded() -> None:
    with pytest.raises(ConfigError, match=r"scores\.enabled"):
        load(env={}, overrides=[*JUDGE[:2]])
    with pytest.raises(ConfigError, match="judge_model"):
        load(env={}, overrides=[JUDGE[0], JUDGE[2]])
    with pytest.raises(ConfigError, match=r"scores\.required"):
        judged_settings("scores.required=judge")
    with pytest.raises(ConfigError, match="end_reward"):
        judged_settings("groups.judge_name=end_reward")
    key = judged_settings("groups.judge_api_key=sk-very-secret").redacted()
    assert key["groups"]["judge_api_key"] == "***"


# -- the book -------------------------------------------------------------------


def test_a_judged_group_waits_for_its_first_verdict_and_never_times_out() -> None:
    b = book(with_judge=True)
    assert b.add("g", m("a", 1.0), 2, 0) == []
    [judging] = b.add("g", m("b", 2.0), 2, 1)
    assert isinstance(judging, Judging) and b.judging == {"g"}
    assert b.advance(1e6, 2) == []  # no timeout while judged
    [late] = b.add("g", m("c", 3.0), 2, 3)  # as for a closed group
    assert isinstance(late, Late)
    assert b.add("g", m("c", 3.0), 2, 4) == [Duplicate("g", "c")]  # another copy of it
    [emitted] = b.judged("g", 5)
    assert isinstance(emitted, Emitted) and emitted.reason == "size" and emitted.complete
    assert [x.episode_id for x in emitted.group.members] == ["a", "b"]
    assert b.closed["g"].late == ["c"] and not b.judging
    assert b.judged("g", 5) == []  # the same verdict replayed
    assert b.judged("g", 6) == [Ignored("g")]  # another verdict: the first one won
    assert b.judged("other", 7) == [Ignored("other")]


def test_a_timed_out_group_is_judged_and_emitted_at_its_deadline() -> None:
    b = book(with_judge=True)
    b.add("g", m("a", 1.0), 3, 0)
    b.add("g", m("b", 2.0), 3, 1)
    [judging] = b.advance(200.0, 2)
    assert isinstance(judging, Judging)
    [emitted] = b.judged("g", 3)
    assert isinstance(emitted, Emitted)
    assert (emitted.reason, emitted.complete, emitted.missing, emitted.closed_at) == (
        "timeout",
        False,
        1,
        101.0,
    )


def test_a_group_too_small_to_emit_is_dropped_unjudged() -> None:
    b = book(with_judge=True)
    b.add("g", m("a", 1.0), 3, 0)
    [dropped] = b.advance(200.0, 1)
    assert not isinstance(dropped, Judging) and not b.judging


# -- a verdict applied ------------------------------------------------------------


def group_of(*rewards: float | None) -> OpenGroup:
    members = []
    for i, reward in enumerate(rewards):
        episode = Episode(
            episode_id=f"e{i}",
            agent_id="a",
            prompt="p",
            steps=[],
            start_time=0.0,
            end_time=1.0,
            outcome="failure",
            reward=reward,
            rewards={"end_reward": reward} if reward is not None else {},
        )
        members.append(Member(f"e{i}", 1.0, reward or 0.0, False, msgspec.json.encode(episode)))
    return OpenGroup("g", 1.0, len(rewards), members)


def test_without_an_expression_the_judges_score_is_the_reward() -> None:
    s = judged_settings("groups.judge_version=v2")
    verdict = judge.Verdict(group_id="g", time=5.0, scores={"e0": 0.3, "e1": 0.8}, attempts=1)
    group, rollouts, events = judge.apply(group_of(1.0, None), verdict, s)
    assert [x.reward for x in group.members] == [0.3, 0.8]
    assert [(e.reward, e.rewards["judge"]) for e in rollouts] == [(0.3, 0.3), (0.8, 0.8)]
    [first, _] = events
    event = decode_event(first[1])
    assert first[0] == "e0" and event.score_id == "j:g:e0"  # type: ignore[union-attr]
    assert event.evaluator.version == "v2" and event.time == 5.0  # type: ignore[union-attr]


def test_with_an_expression_the_reward_is_computed_again_with_the_judges_score() -> None:
    s = judged_settings("scores.reward=0.5*end_reward + judge")
    verdict = judge.Verdict(group_id="g", time=5.0, scores={"e0": 0.3, "e1": 0.8}, attempts=1)
    group, rollouts, _ = judge.apply(group_of(1.0, None), verdict, s)
    assert [e.reward for e in rollouts] == [0.8, None]  # e1 has no end reward
    assert [x.reward for x in group.members] == [0.8, 0.0]  # None: by its outcome


def test_a_failed_verdict_names_the_judge_in_scores_missing() -> None:
    s = judged_settings()
    verdict = judge.Verdict(group_id="g", time=5.0, scores=None, attempts=4, error="down")
    _, rollouts, events = judge.apply(group_of(1.0, 0.0), verdict, s)
    assert [e.scores_missing for e in rollouts] == [["judge"], ["judge"]]
    assert [e.reward for e in rollouts] == [1.0, 0.0] and events == []


# -- the groups stage with a judge, through kills and rebalances -----------------------


def first_verdicts(broker: Broker) -> dict[str, dict[str, float] | None]:
    """Each group's first verdict on the input topic (in partition order)."""
    first: dict[str, dict[str, float] | None] = {}
    for messages in broker.log.values():
        for message in messages:
            if dict(message.headers).get(judge.VERDICT_HEADER):
                verdict = judge.decode_verdict(message.value)
                first.setdefault(verdict.group_id, verdict.scores)
    return first


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), drop=st.sampled_from([0.0, 0.2]))
def test_the_first_verdict_wins_across_kills_and_rebalances(seed: int, drop: float) -> None:
    s = judged_settings("groups.timeout_s=30")
    reference = play(rollout_log(random.Random(seed)), groups_logic(s), seed, faults=False)
    log = rollout_log(random.Random(seed))
    faulty = play(log, groups_logic(s), seed + 1, faults=True, drop=drop)
    got, want = outputs(faulty, "groups"), outputs(reference, "groups")
    assert got.keys() == want.keys() and got
    assert dead(faulty) == dead(reference)
    first = first_verdicts(faulty)
    scores: dict[tuple[bytes, str], set[bytes]] = defaultdict(set)
    for key, events in outputs(faulty, "steps").items():
        for value in events:
            event = decode_event(value)
            assert isinstance(event, Score)
            scores[(key, event.score_id)].add(value)
    assert all(len(v) == 1 for v in scores.values())  # a score id has one value
    for key, copies in got.items():
        assert len(copies) == 1, key  # every copy identical: the first verdict's
        record = decode_record(next(iter(copies)))
        if record.close_reason == "late":
            continue
        verdict = first[record.group_id]
        for episode in record.rollouts:
            if episode.truncated:
                assert "judge" not in episode.rewards
            elif verdict is None:
                assert "judge" in episode.scores_missing
            else:
                assert episode.rewards["judge"] == verdict[episode.episode_id]
                assert math.isclose(episode.reward or 0.0, verdict[episode.episode_id])
                score_id = f"j:{record.group_id}:{episode.episode_id}"
                assert (episode.episode_id.encode(), score_id) in scores


def test_a_message_marked_as_a_verdict_that_is_none_is_ignored_and_counted() -> None:
    world = World(Broker({0: []}), groups_logic(judged_settings()), random.Random(0))
    worker = world.start()
    world.rebalance()
    stage = worker.stage.logic
    assert isinstance(stage, GroupStage)
    marked = ((judge.VERDICT_HEADER, b"1"),)
    for value in (b"{", None, b'{"group_id": 3}'):
        run(stage.handle(0, worker.stage.states[0], Msg(0, 0, None, value, marked)))
    ignored = {"result": "ignored"}
    assert stage.metrics.registry.get_sample_value(VERDICTS, ignored) == 3
    assert not world.broker.ops  # nothing published, nothing stored


VERDICTS = "stream_export_group_verdicts_total"
