"""Scores joined in the stream (the assembler's score rules, without a broker): the
event's contract, the reward expression, join, hold and late scores, duplicates
and conflicts, rebuilds; and, for any interleaving, every score counted once."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.assemble.chunks import clock_key
from stream_export.assemble.scoring import with_late
from stream_export.client import Producer
from stream_export.client.recorder import EpisodeBuilder
from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import MAX_SCORE_BYTES, Evaluator, Score, StepEvent
from stream_export.contract.reasons import DeadLetterReason
from stream_export.contract.scores import RecordEvaluator, late_row, score_record
from stream_export.errors import ConfigError, DecodeError, RecorderError
from stream_export.output import formatter, score_rows
from stream_export.rows import schema
from stream_export.runtime.metrics import Metrics
from stream_export.settings import load
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings
from stream_export.settings.reward import RewardExpression
from stream_export.settings.scores import ScoreSettings
from tests.support.assemble_sim import Memory, Pipeline, episode_events
from tests.support.typed_rows import conform_row, lines, transcoded

PATIENT = AssembleSettings(
    idle_timeout_s=1e6, grace_s=0, max_duration_s=2e6, window_expires_s=1e7, closed_retention_s=1e7
)
WALL = 2000.0
HELD = ScoreSettings(enabled=True, required=["correctness"], hold_s=50.0)


def score(
    eid: str, name: str = "correctness", value: float = 1.0, t: float = 1020.0, sid: str = ""
) -> Score:
    return Score(
        episode_id=eid,
        time=t,
        score_id=sid or f"judge:{eid}:{name}",
        name=name,
        value=value,
        evaluator=Evaluator(id="judge", version="1"),
    )


def episode(eid: str, t0: float = 1000.0, steps: int = 2) -> list[StepEvent]:
    """An episode's events in order; its last event is at t0 + steps + 1."""
    events = episode_events(random.Random(0), eid, steps, t0)
    return sorted(events, key=lambda e: e.time)


def feed(pipeline: Pipeline, events: list[Any], batch: int = 1, start: int | None = None) -> None:
    start = pipeline.state.last_offset + 1 if start is None else start
    items = list(enumerate(events, start))
    for i in range(0, len(items), batch):
        pipeline.batch(items[i : i + batch], WALL)


# -- the contract --------------------------------------------------------------


def test_a_score_decodes_and_bad_ones_are_typed() -> None:
    good = encode(score("e"))
    assert decode_event(good) == score("e")
    cases = {
        good.replace(b'"value":1.0', b'"value":1e999'): DeadLetterReason.NON_FINITE,
        good.replace(b'"name":"correctness"', b'"name":"9lives"'): DeadLetterReason.INVALID,
        good.replace(b'"name":"correctness"', b'"name":"end_reward"'): DeadLetterReason.INVALID,
        good.replace(b',"evaluator":{"id":"judge","version":"1"}', b""): DeadLetterReason.INVALID,
        good[:-1]
        + b',"label":"'
        + b"x" * MAX_SCORE_BYTES
        + b'"}': DeadLetterReason.SCORE_TOO_LARGE,
    }
    for data, reason in cases.items():
        with pytest.raises(DecodeError) as caught:
            decode_event(data)
        assert caught.value.reason == reason, data[:80]
    big = good[:-1] + b',"label":"' + b"x" * 2_000_000 + b'"}'
    with pytest.raises(DecodeError) as caught:
        decode_event(big)
    assert caught.value.reason == DeadLetterReason.SCORE_TOO_LARGE


def test_the_reward_expression_is_arithmetic_over_names_and_never_eval() -> None:
    expr = RewardExpression("0.7*correctness + 0.3*format - max(0, length/100)")
    assert expr.names == {"correctness", "format", "length"}
    assert expr.evaluate({"correctness": 1, "format": 0.5, "length": 50}) == pytest.approx(0.35)
    assert expr.evaluate({"correctness": 1, "format": 0.5}) is None  # a component missing
    assert RewardExpression("a / b").evaluate({"a": 1, "b": 0}) is None
    assert RewardExpression("a * 1e308 * 10").evaluate({"a": 1}) is None
    for bad in ("__import__('os')", "a.b", "a ** 2", "a if b else c", "a[0]", "'x'", "a <", ""):
        with pytest.raises(ConfigError, match=r"scores\.reward"):
            RewardExpression(bad)
    with pytest.raises(ConfigError, match=r"scores\.reward"):
        ScoreSettings(reward="open('x')")


def test_the_recorder_scores_after_its_end_and_a_producer_scores_by_id() -> None:
    ep = EpisodeBuilder(agent_id="a", prompt="p", episode_id="e", clock=lambda: 5.0)
    with pytest.raises(RecorderError):
        ep.score("correctness", 1.0, evaluator="judge")  # not started
    ep.start()
    ep.end("success")
    made = ep.score("correctness", 1.0, evaluator="judge", evaluator_version="v2", label="ok")
    assert made == Score(
        episode_id="e",
        time=5.0,
        score_id="judge:e:correctness",
        name="correctness",
        value=1.0,
        evaluator=Evaluator(id="judge", version="v2"),
        label="ok",
    )
    for value, name, reason in [(math.inf, "c", "non_finite"), (1.0, "no spaces", "invalid")]:
        with pytest.raises(DecodeError) as caught:
            ep.score(name, value, evaluator="judge")
        assert caught.value.reason == reason
    producer, sent = Producer("127.0.0.1:1"), list[Any]()
    producer.send = sent.append  # type: ignore[method-assign,assignment]
    producer.score("elsewhere", "format", 0.5, evaluator="person", score_id="s1", seq=3)
    (event,) = sent
    assert (event.episode_id, event.score_id, event.seq, event.value) == ("elsewhere", "s1", 3, 0.5)
    assert decode_event(encode(event)) == event


# -- join and hold -------------------------------------------------------------


def test_scores_of_an_open_episode_are_in_its_record_with_the_reward_expression() -> None:
    scores = ScoreSettings(reward="0.5*correctness + 0.5*end_reward")
    pipeline = Pipeline(PATIENT, scores=scores)
    events = episode("e")
    end = msgspec.structs.replace(events.pop(), reward=1.0)
    feed(pipeline, [*events, score("e", value=0.0, sid="a"), score("e", value=0.6, sid="b"), end])
    (published,) = pipeline.emitted
    assert published.rewards == {"correctness": 0.6, "end_reward": 1.0}  # the last of a name
    assert [s.score_id for s in published.scores] == ["a", "b"]
    assert published.scores[0].evaluator == RecordEvaluator(id="judge", version="1")
    assert published.reward == pytest.approx(0.5 * 0.6 + 0.5 * 1.0)
    assert published.scores_missing == []


def test_every_score_in_a_record_and_a_row_carries_every_field() -> None:
    """A reader of ``s["label"]`` or ``s["evaluator"]["version"]`` never meets a
    missing key: unset fields are null, on the episodes topic, in the scores output
    and in the files (the score event itself keeps omitting them)."""
    pipeline = Pipeline(PATIENT, scores=ScoreSettings(enabled=True))
    bare = Score(
        episode_id="e", time=1020.0, score_id="s", name="n", value=1.0, evaluator=Evaluator(id="j")
    )
    assert b"label" not in encode(bare) and b"version" not in encode(bare)  # digests unchanged
    *events, end = episode("e")
    feed(pipeline, [*events, bare, end])
    feed(pipeline, [msgspec.structs.replace(bare, score_id="late", time=1030.0)])
    (published,) = pipeline.emitted
    fields = {"score_id", "name", "value", "evaluator", "time", "label", "request_id", "seq"}
    [record] = json.loads(encode(published))["scores"]
    [row] = pipeline.late_scores
    for entry in (record, row):
        assert fields <= entry.keys() and set(entry["evaluator"]) == {"id", "version"}
        assert entry["label"] is entry["request_id"] is entry["seq"] is None
    [line] = formatter.build(FormatSettings(format="episode"), Metrics())(published)
    assert json.loads(line)["scores"] == [record]


def test_an_ended_episode_waits_for_its_required_scores() -> None:
    pipeline = Pipeline(PATIENT, scores=HELD)
    feed(pipeline, [*episode("e"), score("e", "format", 0.5)])
    assert pipeline.emitted == []
    assert pipeline.state.held == 1
    feed(pipeline, [score("e", "correctness", 1.0)])
    (published,) = pipeline.emitted
    assert published.rewards == {"format": 0.5, "correctness": 1.0}
    assert published.scores_missing == [] and not published.truncated
    assert pipeline.state.held == 0
    assert pipeline.metrics.scores_joined._value.get() == 2  # noqa: SLF001


def test_a_hold_ends_on_event_time_and_later_scores_go_to_the_scores_output() -> None:
    pipeline = Pipeline(PATIENT, scores=HELD)
    feed(pipeline, episode("e"))  # last event at 1003: the hold ends at 1053
    feed(pipeline, [*episode("other", t0=1049.0)])  # the clock at 1052: both held
    assert pipeline.emitted == [] and pipeline.state.held == 2
    # the score itself moves the clock past the hold: it is late, whatever the batch
    feed(pipeline, [score("e", t=1054.0), score("e", t=1055.0)], batch=2)
    (held, *_) = [e for e in pipeline.emitted if e.episode_id == "e"]
    assert held.scores == [] and held.scores_missing == ["correctness"]
    (row,) = pipeline.late_scores
    assert row["record_id"] == "e" and row["name"] == "correctness" and row["value"] == 1.0
    assert pipeline.verdicts["duplicate"] == 1  # the second: same id, same content
    assert pipeline.metrics.score_hold_timeouts._value.get() == 1  # noqa: SLF001
    assert pipeline.metrics.scores_late._value.get() == 1  # noqa: SLF001


def test_a_hold_ends_at_the_batch_end_when_the_clock_passes_it() -> None:
    pipeline = Pipeline(PATIENT, scores=HELD)
    feed(pipeline, [*episode("e"), *episode("other", t0=1060.0)], batch=8)
    assert [e.episode_id for e in pipeline.emitted] == ["e"]  # other: held till 1113
    assert pipeline.emitted[0].scores_missing == ["correctness"]


def test_same_score_once_other_content_a_conflict_before_and_after_publication() -> None:
    pipeline = Pipeline(PATIENT, scores=HELD)
    feed(pipeline, [*episode("e"), score("e", "format", 0.5, sid="f")])
    feed(pipeline, [score("e", "format", 0.5, t=1030.0, sid="f")])  # resent, restamped
    feed(pipeline, [score("e", "format", 0.9, sid="f")])
    feed(pipeline, [score("e")])  # published now
    feed(pipeline, [score("e", "format", 0.5, t=1040.0, sid="f"), score("e", t=1041.0)])
    feed(pipeline, [score("e", "format", 0.1, sid="f"), score("e", value=0.0)])
    assert len(pipeline.emitted) == 1 and pipeline.late_scores == []
    assert pipeline.verdicts["duplicate"] == 3
    assert [r for r, _ in pipeline.dead] == [DeadLetterReason.CONFLICTING_DUPLICATE] * 3


def test_scores_for_unknown_episodes_and_without_a_scores_output_are_dead_letters() -> None:
    off = ScoreSettings(enabled=False)
    pipeline = Pipeline(PATIENT, scores=off)
    feed(pipeline, [score("nobody"), *episode("e"), score("e"), score("e")])
    assert [r for r, _ in pipeline.dead] == ["unknown_episode", "late_score", "late_score"]
    assert pipeline.emitted[0].scores == [] and pipeline.late_scores == []


def test_a_held_episode_and_its_clock_survive_a_rebuild() -> None:
    memory = Memory()
    pipeline = Pipeline(PATIENT, memory, scores=HELD)
    feed(pipeline, [*episode("e"), score("e", "format", 0.5), *episode("x", t0=1040.0)])
    assert (0, clock_key(0)) in memory.markers  # the clock is 1043, with the markers
    assert pipeline.emitted == [] and pipeline.state.held == 2
    feed(pipeline, [score("x")])  # x is published: its chunks go
    assert [e.episode_id for e in pipeline.emitted] == ["x"]
    # a new owner has only e's chunks; the stored clock (1043) keeps its deadline
    del memory.markers[(0, clock_key(0))]
    forgetful = Pipeline.rebuilt(PATIENT, Memory(dict(memory.chunks)), WALL, scores=HELD)
    assert forgetful.state.clock == float("-inf")  # without it: from the events read again
    feed(pipeline, [score("x", "format", t=1044.0)])  # the clock is stored again
    again = Pipeline.rebuilt(PATIENT, memory, WALL, scores=HELD, position=11)
    assert again.state.held == 1 and again.state.clock == 1044.0
    feed(again, [score("e", t=1060.0)], start=11)
    (published,) = again.emitted
    assert published.rewards == {"format": 0.5} and published.scores_missing == ["correctness"]
    assert [r["name"] for r in again.late_scores] == ["correctness"]


def test_a_late_score_after_a_restart_is_recognised_by_the_marker() -> None:
    memory = Memory()
    pipeline = Pipeline(PATIENT, memory, scores=HELD)
    feed(pipeline, [*episode("e"), score("e"), score("e", "format", 0.2)])
    assert [r["name"] for r in pipeline.late_scores] == ["format"]
    again = Pipeline.rebuilt(PATIENT, memory, WALL, scores=HELD, position=6)
    events = [score("e"), score("e", "format", 0.3), score("e", "format", 0.2, t=1050.0)]
    feed(again, events, start=6)
    assert again.verdicts["duplicate"] == 2
    assert [r for r, _ in again.dead] == ["conflicting_duplicate"]
    assert again.late_scores == []


# -- any interleaving ------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    batch=st.integers(1, 8),
    scores=st.lists(st.tuples(st.sampled_from(["correctness", "format"]), st.integers(0, 80))),
)
def test_every_score_is_counted_once_and_in_time_ones_only_in_the_record(
    seed: int, batch: int, scores: list[tuple[str, int]]
) -> None:
    """Scores of a held episode at random event times, between other episodes that
    move the clock: the record has exactly the scores that arrived before the hold
    ended (the required one, or the clock past the deadline), the scores output
    exactly the others, each score once."""
    rng = random.Random(seed)
    events: list[Any] = episode("e")
    clock = events[-1].time
    deadline = clock + HELD.hold_s
    for i, (name, dt) in enumerate(scores):
        if rng.random() < 0.3:
            events += episode(f"o{i}", t0=clock + rng.randint(0, 30))
        events.append(score("e", name, float(i), t=clock + dt, sid=f"s{i}"))
        if rng.random() < 0.2:
            events.append(score("e", name, float(i), t=clock + dt + 1, sid=f"s{i}"))  # again
    pipeline = Pipeline(PATIENT, scores=HELD)
    feed(pipeline, events, batch)
    feed(pipeline, episode("last", t0=deadline + 10))  # ends any hold
    # the model: walk the events in order, the clock as the partition's
    time, open_ = -1e18, True
    joined: list[str] = []
    late: list[str] = []
    for event in events:
        time = max(time, event.time)
        if not isinstance(event, Score):
            continue
        if open_ and time >= deadline:
            open_ = False
        if event.score_id in joined + late:
            continue
        (joined if open_ else late).append(event.score_id)
        if open_ and event.name == "correctness":
            open_ = False
    (record,) = [e for e in pipeline.emitted if e.episode_id == "e"]
    assert [s.score_id for s in record.scores] == joined
    assert [r["score_id"] for r in pipeline.late_scores] == late
    assert record.scores_missing == ([] if "correctness" in record.rewards else ["correctness"])
    assert msgspec.json.decode(msgspec.json.encode(record.rewards)) == record.rewards


def test_score_rows_fit_their_schema_and_transcode_to_parquet(tmp_path: Path) -> None:
    events = [
        score("e"),
        msgspec.structs.replace(score("e", "format", 0.5), label="ok", seq=2, request_id="r1"),
    ]
    found = [score_rows.read(late_row(e)) for e in events]
    assert [r.record_id for r in found] == ['["e","judge:e:correctness"]', '["e","judge:e:format"]']
    rows = [line for r in found for line in r.lines]
    columns = schema.score_schema()
    want = [conform_row(json.loads(r), columns) for r in rows]
    assert all(set(json.loads(r)) == set(columns.names) for r in rows)  # each row, every field
    src = tmp_path / "a.jsonl"
    src.write_bytes(lines(rows))
    assert transcoded(src, columns) == want
    with pytest.raises(DecodeError):
        score_rows.read(b"{}")


def test_export_joins_later_scores_as_the_worker_would_have_in_time() -> None:
    settings = ScoreSettings(required=["correctness"], reward="correctness + end_reward")
    held = ScoreSettings(
        enabled=True, required=["correctness"], hold_s=50.0, reward=settings.reward
    )
    pipeline = Pipeline(PATIENT, scores=held)
    events = episode("e")
    end = msgspec.structs.replace(events.pop(), reward=0.5)
    feed(pipeline, [*events, end, score("e", "format", 0.2), *episode("x", t0=1060.0)])
    feed(pipeline, [score("e", value=1.0), score("e", value=1.0, t=1070.0)])
    (published,) = [e for e in pipeline.emitted if e.episode_id == "e"]
    assert (published.reward, published.scores_missing) == (None, ["correctness"])
    rows = [score_rows.decode_row(late_row(score("e", value=1.0)))] * 2  # a repeat: once
    late = [score_record(r) for r in rows]
    joined = with_late(published, late, settings)
    assert joined.rewards == {"format": 0.2, "correctness": 1.0, "end_reward": 0.5}
    assert (joined.reward, joined.scores_missing, len(joined.scores)) == (1.5, [], 2)
    assert with_late(joined, late, settings) == joined  # already there
    plain = ScoreSettings()
    assert with_late(published, late, plain).reward == 0.5  # no expression: the end's reward


def test_a_group_waits_at_least_as_long_as_its_rollouts_wait_for_their_scores() -> None:
    def timeout(*overrides: str) -> float:
        return load(env={}, overrides=["groups.timeout_s=60", *overrides]).group_timeout_s()

    assert timeout() == 330.0  # assemble.idle_timeout_s + grace_s
    assert timeout("scores.hold_s=3600") == 330.0  # nothing required: nothing held
    assert timeout("scores.hold_s=3600", "scores.required=correctness") == 3600.0
