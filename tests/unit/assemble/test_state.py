"""The episode state machine, without a broker: ordering, duplicates, conflicts,
timeouts, limits, late and replayed events, rebuilds and crashes."""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.assemble.chunks import chunk_key
from stream_export.assemble.verdicts import LATE, Rejected, Verdict
from stream_export.contract.decoding import encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.errors import ConfigError
from stream_export.settings import load
from stream_export.settings.assemble import AssembleSettings
from tests.support.assemble_sim import (
    TICK,
    WINDOW,
    Item,
    Memory,
    Pipeline,
    crash,
    episode_events,
)

WALL = 2000.0
#: Timeouts that never fire while a test feeds events (only a final tick closes).
PATIENT = AssembleSettings(
    idle_timeout_s=1e6, grace_s=0, max_duration_s=2e6, window_expires_s=1e7, closed_retention_s=1e7
)


def feed(
    pipeline: Pipeline, events: Sequence[StepEvent], batch: int = 1, wall: float = WALL
) -> None:
    start = pipeline.state.last_offset + 1
    items: list[Item] = list(enumerate(events, start))
    for i in range(0, len(items), batch):
        pipeline.batch(items[i : i + batch], wall)


def tick(pipeline: Pipeline, wall: float) -> None:
    pipeline.batch([(pipeline.state.last_offset + 1, TICK)], wall)


def step(eid: str, seq: int, t: float = 1001.0, content: str | None = None) -> Step:
    return Step(episode_id=eid, time=t, seq=seq, kind="thought", content=content or f"{eid}/{seq}")


def start(eid: str, t: float = 1000.0) -> EpisodeStart:
    return EpisodeStart(episode_id=eid, time=t, agent_id="agent", prompt=f"task {eid}")


def end(eid: str, steps: int, t: float = 1010.0) -> EpisodeEnd:
    return EpisodeEnd(episode_id=eid, time=t, steps=steps, outcome="success", reward=1.0)


def check_complete(episode: Episode, steps: int) -> None:
    assert [s.seq for s in episode.steps] == list(range(steps))
    assert [s.content for s in episode.steps] == [f"{episode.episode_id}/{i}" for i in range(steps)]
    assert not episode.truncated
    assert len(episode.sources) == steps + 2
    assert len({(s.partition, s.offset) for s in episode.sources}) == steps + 2


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(0, 12), seed=st.integers(0, 2**32), batch=st.integers(1, 20))
def test_any_order_and_batching_emits_the_episode_once_in_seq_order(
    steps: int, seed: int, batch: int
) -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, episode_events(random.Random(seed), "e", steps, 1000.0), batch)
    assert len(pipeline.emitted) == 1
    check_complete(pipeline.emitted[0], steps)
    assert pipeline.verdicts == {"accepted": steps + 2}
    tick(pipeline, WALL)  # the chunks go once the marker is acknowledged
    assert not pipeline.memory.chunks
    assert list(pipeline.memory.markers) == [(0, b"e")]


def test_sources_are_start_then_steps_in_seq_order_then_end() -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [end("e", 2), step("e", 1), start("e"), step("e", 0)])
    episode = pipeline.emitted[0]
    assert [s.offset for s in episode.sources] == [2, 3, 1, 0]
    assert episode.reward == 1.0 and episode.outcome == "success"


def test_identical_duplicates_are_ignored_even_with_another_time() -> None:
    pipeline = Pipeline(PATIENT)
    again = msgspec.structs.replace(step("e", 0), time=1005.0)
    feed(pipeline, [start("e"), step("e", 0), again, start("e"), end("e", 1), end("e", 1)])
    assert pipeline.verdicts == {"accepted": 3, "duplicate": 2, LATE: 1}
    check_complete(pipeline.emitted[0], 1)


def test_duplicate_of_a_stored_step_is_compared_with_the_stored_copy() -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [start("e"), step("e", 0)], batch=1)  # step 0 is now in a chunk
    feed(pipeline, [step("e", 0), step("e", 0, content="other")])
    assert pipeline.verdicts == {"accepted": 2, "duplicate": 1, "conflicting_duplicate": 1}
    assert pipeline.dead == [("conflicting_duplicate", 3)]


def test_conflicting_start_and_end_go_to_dead_letters() -> None:
    pipeline = Pipeline(PATIENT)
    other_start = EpisodeStart(episode_id="e", time=1000.0, agent_id="other", prompt="p")
    other_end = msgspec.structs.replace(end("e", 3), outcome="failure")
    feed(pipeline, [start("e"), end("e", 3), other_start, other_end])
    assert [reason for reason, _ in pipeline.dead] == ["conflicting_duplicate"] * 2


def test_end_before_steps_waits_for_every_step() -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [end("e", 3), start("e"), step("e", 2), step("e", 0)])
    assert not pipeline.emitted
    feed(pipeline, [step("e", 1)])
    check_complete(pipeline.emitted[0], 3)


def test_steps_beyond_the_announced_count_are_rejected() -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [start("e"), step("e", 4), end("e", 3), step("e", 3)])
    assert pipeline.dead == [("seq_out_of_range", 2)]  # the end contradicts step 4
    feed(pipeline, [end("f", 1), step("f", 1)])
    assert pipeline.dead[-1] == ("seq_out_of_range", 5)


def idle(**kw: float) -> AssembleSettings:
    base = {
        "idle_timeout_s": 10.0,
        "grace_s": 5.0,
        "quiet_partition_s": 30.0,
        "max_duration_s": 1000.0,
        "window_expires_s": 1e5,
        "closed_retention_s": 1e5,
    }
    return AssembleSettings(**{**base, **kw})  # type: ignore[arg-type]


def test_idle_timeout_runs_on_event_time_plus_grace() -> None:
    pipeline = Pipeline(idle())
    feed(pipeline, [start("a", 1000.0), step("a", 0, 1001.0)])
    feed(pipeline, [start("b", 1015.9)])  # 14.9s after a's last event: within grace
    assert not pipeline.emitted
    feed(pipeline, [start("c", 1016.0)])  # idle 10 + grace 5 reached
    (episode,) = pipeline.emitted
    assert episode.episode_id == "a" and episode.truncated_reason == "timeout"
    assert episode.outcome == "other" and episode.end_time == 1001.0
    assert pipeline.verdicts[LATE] == 0
    feed(pipeline, [step("a", 1, 1016.0)])
    assert pipeline.dead[-1] == (LATE, 4)


def test_a_quiet_partition_falls_back_to_the_wall_clock() -> None:
    pipeline = Pipeline(idle())
    feed(pipeline, [start("a", 1000.0)], wall=5000.0)
    tick(pipeline, 5029.0)  # quiet for 29s < 30s: event time stays at 1000
    assert not pipeline.emitted
    assert not pipeline.state.wants_tick(5029.0)
    assert pipeline.state.wants_tick(5030.0)
    tick(pipeline, 5030.0)
    assert [e.truncated_reason for e in pipeline.emitted] == ["timeout"]


def test_an_event_resets_the_quiet_bound() -> None:
    pipeline = Pipeline(idle())
    feed(pipeline, [start("a", 1000.0)], wall=5000.0)
    feed(pipeline, [start("b", 1001.0)], wall=5025.0)
    tick(pipeline, 5040.0)  # 15s after b: not quiet long enough
    assert not pipeline.emitted
    tick(pipeline, 5060.0)  # quiet 35s: clock 1001+35 closes both
    assert sorted(e.episode_id for e in pipeline.emitted) == ["a", "b"]


def test_max_duration_closes_a_chatty_episode() -> None:
    pipeline = Pipeline(idle(max_duration_s=20.0))
    feed(pipeline, [start("a", 1000.0)] + [step("a", i, 1001.0 + 8 * i) for i in range(4)])
    (episode,) = pipeline.emitted
    assert episode.truncated_reason == "max_duration" and len(episode.steps) == 3


def test_timed_out_episode_without_start_is_dead_lettered() -> None:
    pipeline = Pipeline(idle())
    feed(pipeline, [step("a", 0, 1000.0), step("a", 1, 1000.0), start("b", 1100.0)])
    assert not pipeline.emitted
    assert pipeline.dead == [("missing_start", 0), ("missing_start", 1)]


@pytest.mark.parametrize(
    ("events", "reason", "kept"),
    [
        ([start("e"), step("e", 0), step("e", 1), step("e", 2)], "max_steps", 2),
        ([start("e"), step("e", 0), end("e", 5)], "max_steps", 1),
    ],
)
def test_step_limit_emits_truncated(events: list[StepEvent], reason: str, kept: int) -> None:
    pipeline = Pipeline(AssembleSettings(max_steps=2))
    feed(pipeline, [*events, step("e", 1)])
    (episode,) = pipeline.emitted
    assert episode.truncated_reason == reason and len(episode.steps) == kept
    assert pipeline.dead[-1][0] == LATE


def test_a_huge_seq_does_not_make_an_open_episode_large() -> None:
    """One step at seq 9,999 used to cost its episode a 40 KB slot array: a producer
    opening many such episodes could exhaust the worker's memory."""
    pipeline = Pipeline(PATIENT)
    for i in range(1000):
        feed(pipeline, [start(f"e{i}"), step(f"e{i}", PATIENT.max_steps - 1)], batch=2)
    episodes = pipeline.state.open.values()
    assert len(episodes) == 1000
    assert sum(len(ep.slots) for ep in episodes) == 0
    assert all(ep.far == {PATIENT.max_steps - 1: 0} for ep in episodes)


@pytest.mark.parametrize("order", ["descending", "far_then_near"])
def test_steps_far_ahead_of_the_count_still_assemble(order: str) -> None:
    n = 300
    seqs = list(range(n - 1, -1, -1))
    if order == "far_then_near":  # far ones first, then the array grows over them
        seqs = [299, 250, 100, *range(100), *range(101, 250), *range(251, 299)]
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [start("e"), *(step("e", q) for q in seqs), end("e", n)], batch=7)
    (episode,) = pipeline.emitted
    check_complete(episode, n)


def test_byte_limit_emits_truncated_and_rejects_the_event_over_it() -> None:
    big = "x" * 700
    s = AssembleSettings(max_event_bytes=1000, max_episode_bytes=1500)
    pipeline = Pipeline(s)
    feed(pipeline, [start("e"), step("e", 0, content=big), step("e", 1, content=big)])
    (episode,) = pipeline.emitted
    assert episode.truncated_reason == "max_bytes" and len(episode.steps) == 1
    assert pipeline.dead == [("max_bytes", 2)]


def test_events_far_in_the_future_are_rejected() -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [start("e", WALL + 3601.0), start("f", WALL + 3599.0)])
    assert pipeline.dead == [("future_time", 0)]


def test_a_replayed_event_of_a_closed_episode_is_not_late() -> None:
    pipeline = Pipeline(PATIENT)
    events: list[StepEvent] = [start("e"), step("e", 0), end("e", 1)]
    feed(pipeline, events)
    tick(pipeline, WALL)  # marker written
    state, wall = pipeline.state, WALL
    for offset, event in enumerate(events):
        result = state.apply(event, b"e", encode(event), offset, wall)
        assert result is Verdict.REPLAYED
    result = state.apply(events[1], b"e", encode(events[1]), 10, wall)
    assert isinstance(result, Rejected) and result.reason == LATE


def test_rebuild_from_the_tables_continues_where_it_stopped() -> None:
    rng = random.Random(3)
    first = Pipeline(PATIENT)
    a, b = episode_events(rng, "a", 5, 1000.0), episode_events(rng, "b", 5, 1000.0)
    feed(first, a[:4] + b[:3], batch=3)
    again = Pipeline.rebuilt(PATIENT, first.memory, WALL)
    assert again.state.open_count == 2
    again.state.last_offset = first.state.last_offset
    feed(again, a[4:] + b[3:], batch=2)
    assert sorted(e.episode_id for e in again.emitted) == ["a", "b"]
    for episode in again.emitted:
        check_complete(episode, 5)


def test_rebuild_deletes_chunks_left_over_by_an_interrupted_close() -> None:
    first = Pipeline(PATIENT)
    feed(first, [start("e"), step("e", 0)], batch=1)
    chunks = dict(first.memory.chunks)
    feed(first, [end("e", 1)])  # emitted, marked, chunks deleted
    assert not first.memory.chunks
    leftover = Memory(chunks, dict(first.memory.markers))  # the deletes were lost
    again = Pipeline.rebuilt(PATIENT, leftover, WALL)
    assert again.state.open_count == 0 and len(again.state.garbage) == 2
    tick(again, WALL)
    assert not leftover.chunks and not again.emitted


def test_a_lost_marker_means_the_replay_emits_the_same_episode_again() -> None:
    first = Pipeline(PATIENT)
    events: list[StepEvent] = [start("e"), step("e", 0), end("e", 1)]
    feed(first, events[:2], batch=2)
    chunks = dict(first.memory.chunks)
    feed(first, events[2:])
    (emitted,) = first.emitted
    # the crash loses the marker (so not the chunks); the last batch was not
    # committed, so it is replayed
    again = Pipeline.rebuilt(PATIENT, Memory(chunks), WALL)
    again.batch([(1, events[1]), (2, events[2])], WALL)
    assert again.emitted == [emitted]
    assert again.verdicts == {"replayed": 1, "accepted": 1}


def test_chunk_bytes_grow_linearly_with_the_episode() -> None:
    pipeline = Pipeline(PATIENT)
    events: list[StepEvent] = [start("e")]
    events += [step("e", i, content="y" * 200) for i in range(300)]
    feed(pipeline, events, batch=1)
    written = sum(len(op.value or b"") for op in pipeline.ops if op.table == "chunks")
    raw = sum(len(encode(e)) for e in events)
    assert written < 1.3 * raw


def scenario(seed: int) -> list[StepEvent]:
    """Interleaved shuffled episodes with 10% identical duplicates and some unended."""
    rng = random.Random(seed)
    per_episode = []
    for i in range(rng.randint(1, 6)):
        events = episode_events(rng, f"e{i}", rng.randint(0, 5), 1000.0 + i, end=rng.random() < 0.8)
        events += [e for e in events if rng.random() < 0.1]
        per_episode.append(events)
    stream: list[StepEvent] = []
    while any(per_episode):
        queue = rng.choice([q for q in per_episode if q])
        stream.append(queue.pop(0))
    return stream


def run(
    pipeline: Pipeline,
    items: list[Item],
    rng: random.Random,
    *,
    stop: int | None = None,
    drop: float = 0.0,
    persist: float = 1.0,
    commit_at: float = 0.0,
    tick_at: int | None = None,
) -> list[tuple[int, int]]:
    """Feed ``items`` (up to offset ``stop``) in random batches, each record missing
    from what is fetched with probability ``drop`` (a fetch that a seek or a
    rebalance overtook); without ``stop`` end with a tick far in the future that
    closes everything. Returns ``pipeline.last_ack`` at each commit: Faust commits
    what was acknowledged, whenever its commit loop runs (``commit_at`` per batch)."""
    commits = []
    end = len(items) if stop is None else stop
    i = 0
    while i < end:
        n = min(rng.randint(1, 4), end - i)
        fetched = [item for item in items[i : i + n] if rng.random() >= drop]
        pipeline.batch(fetched, WALL, persist=rng.random() < persist)
        i += n
        if rng.random() < commit_at:
            commits.append(pipeline.last_ack)
    if stop is None:
        last = (items[-1][0] + 1 if items else 0) if tick_at is None else tick_at
        # the first tick reveals records missing at the end, read back at WALL
        pipeline.batch([(last, TICK)], WALL)
        pipeline.batch([(last + 1, TICK)], WALL + 1e9)
    return commits


def crash_and_replay(
    seed: int, crash_at: float, commit_at: float, *, drop: float = 0.0, skip: int = 0
) -> tuple[Pipeline, Pipeline]:
    """Run a scenario into a crash anywhere, then a rebuilt pipeline from the last
    commit, and check that nothing was lost and only identical episodes repeated.
    ``drop``: records missing from the fetches of both runs; ``skip``: records
    missing right after the rebuild (the fetch starts past the committed offset)."""
    events = scenario(seed)
    items: list[Item] = list(enumerate(events))
    log = dict(items)
    reference = Pipeline(PATIENT)
    run(reference, items, random.Random(seed))
    want = {e.episode_id: e for e in reference.emitted}
    assert len(want) == len(reference.emitted)

    rng = random.Random(seed + 1)
    first = Pipeline(PATIENT, position=0, log=log)
    stop = int(crash_at * len(items))
    fed = run(first, items, rng, stop=stop, drop=drop, persist=0.5, commit_at=commit_at)
    commits = [(0, 0), *fed]
    durable, committed = commits[-1]
    ends = [
        i
        for i in range(durable + 1, len(first.ops) + 1)
        if i == len(first.ops) or first.ops[i].segment != first.ops[i - 1].segment
    ]
    # half of the crashes hit the end of a delivery segment: every op of it in flight
    at_end = ends and rng.random() < 0.5
    cut = rng.choice(ends) if at_end else rng.randint(durable, len(first.ops))
    memory, delivered = crash(first.ops, durable, cut, rng)

    second = Pipeline.rebuilt(PATIENT, memory, WALL, position=committed, log=log)
    run(second, items[committed:][skip:], rng, drop=drop, tick_at=len(items))

    got = delivered + second.emitted
    assert {e.episode_id for e in got} == set(want)
    for episode in got:
        assert episode == want[episode.episode_id]
    dead_before = {d for d in first.dead if d[1] < committed}
    assert dead_before | set(second.dead) == set(reference.dead)
    return first, second


@settings(max_examples=1000, deadline=None)
@given(seed=st.integers(0, 2**32), crash_at=st.floats(0, 1), commit_at=st.floats(0, 0.5))
def test_a_crash_anywhere_loses_nothing_and_repeats_only_identical_episodes(
    seed: int, crash_at: float, commit_at: float
) -> None:
    crash_and_replay(seed, crash_at, commit_at)


@settings(max_examples=500, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    crash_at=st.floats(0, 1),
    commit_at=st.floats(0, 0.5),
    drop=st.floats(0, 0.5),
    skip=st.integers(0, 3),
)
def test_records_missing_from_the_fetches_are_read_back_before_they_are_acknowledged(
    seed: int, crash_at: float, commit_at: float, drop: float, skip: int
) -> None:
    crash_and_replay(seed, crash_at, commit_at, drop=drop, skip=skip)


def test_a_gap_is_read_back_in_order_also_right_after_a_rebuild() -> None:
    events: list[StepEvent] = [start("e"), step("e", 0), step("e", 1), end("e", 2)]
    log: dict[int, StepEvent | str] = dict(enumerate(events))
    first = Pipeline(PATIENT, position=0, log=log)
    first.batch([(0, events[0]), (2, events[2])], WALL)  # offset 1 was not fetched
    assert first.refetched == 1 and first.acked == 3
    again = Pipeline.rebuilt(PATIENT, first.memory, WALL, position=first.acked, log=log)
    again.batch([(4, TICK)], WALL)  # the fetch starts past offset 3 (the end event)
    assert again.refetched == 1 and again.acked == 5
    (episode,) = again.emitted
    check_complete(episode, 2)


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError):
        load(env={}, overrides=["assemble.window_expires_s=1000"])
    with pytest.raises(ConfigError):
        load(env={}, overrides=["assemble.max_episode_bytes=10"])
    with pytest.raises(ConfigError):
        load(env={}, overrides=["assemble.quiet_partition_s=0"])


def test_state_lost_to_the_window_expiry_truncates_the_episode_instead_of_hiding_it() -> None:
    pipeline = Pipeline(PATIENT)
    feed(pipeline, [start("e"), step("e", 0)])  # persisted: chunk 0 (start), chunk 1 (step)
    # What Faust's window expiry does to a stale window, for chunk 1 only.
    del pipeline.memory.chunks[(0, (chunk_key(b"e", 1), WINDOW))]
    feed(pipeline, [step("e", 0)])
    assert pipeline.dead[-1][0] == "state_expired"  # cannot tell duplicate from conflict
    feed(pipeline, [step("e", 1), end("e", 2)])
    (episode,) = pipeline.emitted
    assert episode.truncated and episode.truncated_reason == "state_expired"
    assert [s.seq for s in episode.steps] == [1]
