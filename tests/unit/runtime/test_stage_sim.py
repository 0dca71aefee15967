"""Both stateful stages, run by the real stage runtime in the broker-free simulator
(tests/support/stage_sim.py), with several workers, kill -9 at any moment (also
in the middle of a persist) and partitions moving between live workers: every
output is what one worker without faults produces, each record at least once and
every copy identical (the sinks keep one per id), every dead letter too."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.contract.decoding import decode_episode, decode_event, encode
from stream_export.contract.episode import Episode, SourceOffset
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Evaluator, Score, Step
from stream_export.groups.regroup import FROM_HEADER, SOURCE_HEADER, Regroup
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings, load
from tests.support.stage_runs import (
    PARTITIONS,
    T0,
    TICK_HEADERS,
    dead,
    groups_logic,
    outputs,
    play,
    rollout_log,
)
from tests.support.stage_sim import Broker, Msg, assembler


def assemble_logic(s: Settings) -> Any:
    return lambda worker: assembler(worker, s, Metrics(), ("assemble-open", "assemble-closed"))


def steps_log(rng: random.Random) -> dict[int, list[Msg]]:
    """Episodes of 1-5 steps (some events twice, some episodes without an end, a
    few events conflicting), interleaved per partition, then a tick far ahead."""
    per: dict[int, list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]]]
    per = defaultdict(list)
    for e in range(30):
        eid, n = f"e{e}", rng.randint(0, 5)
        events: list[Any] = [EpisodeStart(episode_id=eid, time=T0, agent_id="a", prompt=eid)]
        events += [
            Step(episode_id=eid, time=T0 + 1 + i, seq=i, kind="thought", content=f"{eid}/{i}")
            for i in range(n)
        ]
        if rng.random() < 0.8:
            events.append(EpisodeEnd(episode_id=eid, time=T0 + n + 1, steps=n, outcome="success"))
        events += [x for x in events if rng.random() < 0.15]
        if rng.random() < 0.1 and n:
            events.append(Step(episode_id=eid, time=T0 + 1, seq=0, kind="thought", content="x"))
        p = e % PARTITIONS
        for event in events:
            per[p].append((eid.encode(), encode(event), ()))
    for p, messages in per.items():
        head, tail = messages[:1], messages[1:]
        rng.shuffle(tail)
        per[p] = [*head, *tail]
    for p in range(PARTITIONS):
        per[p].append((b"", b"", TICK_HEADERS))
    return {
        p: [
            Msg(p, o, k, v, h, timestamp=int((T0 + 1e6) * 1000) if h else 0)
            for o, (k, v, h) in enumerate(per[p])
        ]
        for p in range(PARTITIONS)
    }


def check_same(reference: Broker, faulty: Broker, topic: str) -> dict[bytes, bytes]:
    want, got = outputs(reference, topic), outputs(faulty, topic)
    assert all(len(v) == 1 for v in want.values())
    assert got.keys() == want.keys(), got.keys() ^ want.keys()
    for key, copies in got.items():
        assert copies == want[key], key  # every copy identical: the sinks keep one
    assert dead(faulty) == dead(reference)
    return {key: next(iter(v)) for key, v in want.items()}


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), drop=st.sampled_from([0.0, 0.2]))
def test_groups_are_exactly_once_across_kills_and_rebalances(seed: int, drop: float) -> None:
    # The log's watermarks come from two sources: with more partitions the clock
    # would never move, and no group would time out.
    s = load(
        env={}, overrides=["groups.enabled=true", "groups.timeout_s=30", "topics.partitions=2"]
    )
    log = rollout_log(random.Random(seed))
    reference = play(log, groups_logic(s), seed, faults=False)
    records = check_same(
        reference, play(log, groups_logic(s), seed + 1, faults=True, drop=drop), "groups"
    )
    assert records  # the workload closes groups


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), drop=st.sampled_from([0.0, 0.2]))
def test_a_group_is_published_in_one_version_after_it_was_forgotten(seed: int, drop: float) -> None:
    """Issue 36 item 1: every rollout forwarded again once its group closed and was
    forgotten (closed_retention_s later) opened the group anew, and its timeout
    published a second version of the record under the same id. Each record id
    has one version, with kills anywhere (between a group's close and its marker
    too): the rollouts forwarded again are late."""
    s = load(
        env={},
        overrides=[
            "groups.enabled=true",
            "groups.timeout_s=30",
            "groups.closed_retention_s=30",
            "topics.partitions=2",  # the log's watermarks come from two sources
        ],
    )
    log = rollout_log(random.Random(seed), again=True)
    reference = play(log, groups_logic(s), seed, faults=False)
    faulty = play(log, groups_logic(s), seed + 1, faults=True, drop=drop)
    records = check_same(reference, faulty, "groups")
    assert any(b"/late/" in key for key in records)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), drop=st.sampled_from([0.0, 0.2]))
def test_episodes_are_exactly_once_across_kills_and_rebalances(seed: int, drop: float) -> None:
    s = load(env={}, overrides=["assemble.idle_timeout_s=600"])
    log = steps_log(random.Random(seed))
    reference = play(log, assemble_logic(s), seed, faults=False)
    faulty = play(log, assemble_logic(s), seed + 1, faults=True, drop=drop)
    episodes = check_same(reference, faulty, "episodes")
    assert {decode_episode(v).episode_id for v in episodes.values()}


def episodes_log(rng: random.Random) -> dict[int, list[Msg]]:
    """Finished episodes, most with a group, some twice (as a crashed assembler
    publishes again), a few undecodable, on the episodes topic's partitions."""
    per: dict[int, list[Msg]] = defaultdict(list)
    for e in range(60):
        group = f"g{e % 7}" if rng.random() < 0.8 else None
        episode = Episode(
            episode_id=f"e{e}",
            agent_id="a",
            prompt="p",
            steps=[],
            start_time=T0,
            end_time=T0 + e,
            outcome="success",
            group_id=group,
        )
        value = b"{" if rng.random() < 0.05 else msgspec.json.encode(episode)
        p = rng.randrange(PARTITIONS)
        for _ in range(2 if rng.random() < 0.1 else 1):
            per[p].append(Msg(p, len(per[p]), f"e{e}".encode(), value))
    return {p: per[p] for p in range(PARTITIONS)}


def regroup_logic(s: Settings) -> Any:
    return lambda worker: Regroup(s, worker.sender("by-group"))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), drop=st.sampled_from([0.0, 0.2]))
def test_regroup_forwards_every_episode_from_its_position_across_kills_and_rebalances(
    seed: int, drop: float
) -> None:
    """Every episode with a group reaches the repartition topic, keyed by its group
    and naming the one position it came from, however often it is forwarded; an
    episode without a group or not decodable is not forwarded."""
    s = load(env={}, overrides=["groups.enabled=true"])
    log = episodes_log(random.Random(seed))
    want: dict[bytes, set[bytes]] = defaultdict(set)
    for messages in log.values():
        for m in messages:
            if m.value != b"{" and decode_episode(m.value).group_id is not None:
                group = decode_episode(m.value).group_id
                assert group is not None
                want[group.encode()].add(f"{m.partition}:{m.offset}".encode())
    broker = play(log, regroup_logic(s), seed, faults=True, drop=drop)
    got: dict[bytes, set[bytes]] = defaultdict(set)
    for op in broker.delivered("by-group"):
        got[op.key].add(dict(op.headers)[FROM_HEADER])
    assert got == want


def test_a_watermark_waits_until_its_source_is_caught_up() -> None:
    s = load(env={}, overrides=["groups.enabled=true", "assemble.quiet_partition_s=5"])
    now = [100.0]
    logic = Regroup(s, None, clock=lambda: now[0])  # type: ignore[arg-type]
    sources = logic.rebuild([0, 1], 0.0)
    sources[0].last = 8
    assert [w.headers for w in logic.watermarks(sources, {0: 10, 1: None})] == []
    sources[0].last = 9
    (mark,) = logic.watermarks(sources, {0: 10, 1: None})
    assert (SOURCE_HEADER, b"0") in mark.headers
    # nothing forwarded since the assignment: caught up once the end stayed put for 5 s
    assert len(logic.watermarks(sources, {0: 10, 1: 4})) == 1
    now[0] += 5
    assert len(logic.watermarks(sources, {0: 10, 1: 4})) == 2


def scores_log(rng: random.Random) -> list[tuple[int, float, bytes, bytes]]:
    """Episodes of 0-3 steps, ended one second apart, each with 0-4 scores of the
    names c (required) and f at random times around its end (some sent twice,
    some again with another value), every event of a partition in time order
    with a little jitter: a score may come before its episode ended, within its
    hold or after it. As (partition, time, key, value)."""
    sent = []
    for e in range(24):
        eid, n, t0 = f"e{e}", rng.randint(0, 3), T0 + e
        events: list[Any] = episode_events_at(eid, n, t0)
        for i in range(rng.randint(0, 4)):
            t = t0 + n + 1 + rng.uniform(-2, 9)
            name = rng.choice("cf")
            event = Score(
                episode_id=eid,
                time=t,
                score_id=f"{eid}-s{i}",
                name=name,
                value=float(i),
                evaluator=Evaluator(id="judge"),
            )
            events.append(event)
            if rng.random() < 0.15:
                events.append(msgspec.structs.replace(event, time=t + 1))
            if rng.random() < 0.05:
                events.append(msgspec.structs.replace(event, time=t + 2, value=-1.0))
        sent += [
            (e % PARTITIONS, x.time + rng.uniform(0, 0.5), eid.encode(), encode(x)) for x in events
        ]
    return sent


def episode_events_at(eid: str, n: int, t0: float) -> list[Any]:
    return [
        EpisodeStart(episode_id=eid, time=t0, agent_id="a", prompt=eid),
        *(Step(episode_id=eid, time=t0 + 0.1 * i, seq=i, kind="thought") for i in range(n)),
        EpisodeEnd(episode_id=eid, time=t0 + n + 1, steps=n, outcome="success"),
    ]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), drop=st.sampled_from([0.0, 0.2]))
def test_scores_are_joined_or_late_the_same_across_kills_and_rebalances(
    seed: int, drop: float
) -> None:
    """Every published episode has exactly the scores a fault-free run gives it
    (those that arrived in time), every later score is in the scores output, and
    no score is in both or lost: across kill -9 and partitions moving."""
    s = load(
        env={},
        overrides=[
            "assemble.idle_timeout_s=600",
            "scores.enabled=true",
            "scores.required=c",
            "scores.hold_s=4",
        ],
    )
    sent = scores_log(random.Random(seed))
    per: dict[int, list[Msg]] = defaultdict(list)
    for p, _, key, value in sorted(sent, key=lambda m: m[1]):
        per[p].append(Msg(p, len(per[p]), key, value))
    log = {p: per[p] for p in range(PARTITIONS)}
    reference = play(log, assemble_logic(s), seed, faults=False)
    faulty = play(log, assemble_logic(s), seed + 1, faults=True, drop=drop)
    episodes = [decode_episode(v) for v in check_same(reference, faulty, "episodes").values()]
    rows = [msgspec.json.decode(v) for v in check_same(reference, faulty, "scores").values()]
    joined = {(e.episode_id, x.score_id) for e in episodes for x in e.scores}
    late = {(r["episode_id"], r["score_id"]) for r in rows}
    assert not joined & late
    assert len(joined) == sum(len(e.scores) for e in episodes)  # each once in its record
    published = {e.episode_id for e in episodes}
    started: set[str] = set()
    want = set()
    for messages in log.values():
        for m in messages:
            event = decode_event(m.value)
            if not isinstance(event, Score):
                started.add(event.episode_id)
            elif event.episode_id in started and event.episode_id in published:
                want.add((event.episode_id, event.score_id))
    assert joined | late == want
    assert any(e.scores_missing for e in episodes) and rows  # holds ended, late scores came


def test_an_episode_the_assembler_published_again_is_no_duplicate() -> None:
    """Issue 36 item 3: after a kill -9 the assembler publishes the episodes of its
    last persist interval again, at other positions of the episodes topic: the
    same episode, built from the same steps. That is the crash's replay, not a
    copy; an episode a producer of its own sent twice is one."""
    s = load(env={}, overrides=["groups.enabled=true"])

    def rollout(i: int, sources: list[SourceOffset]) -> bytes:
        episode = Episode(
            episode_id=f"r{i}",
            agent_id="a",
            prompt="p",
            steps=[],
            start_time=T0,
            end_time=T0 + i,
            outcome="success",
            group_id="g",
            group_size=3,
            reward=float(i),
            sources=sources,
        )
        return msgspec.json.encode(episode)

    built = rollout(0, [SourceOffset(0, 10), SourceOffset(0, 12)])  # by the assembler
    foreign = rollout(1, [])  # sent to the episodes topic by a producer of its own
    sent = [
        (built, "0:1"),
        (built, "2:7"),  # published again by the assembler after a kill -9
        (foreign, "1:3"),
        (foreign, "1:8"),  # the producer's second copy: a duplicate
        (built, "0:1"),  # forwarded again by the regroup stage after a kill -9
        (rollout(2, [SourceOffset(1, 4)]), "2:9"),
    ]
    log = {
        p: [Msg(0, i, b"g", v, ((FROM_HEADER, f.encode()),)) for i, (v, f) in enumerate(sent)]
        if p == 0
        else []
        for p in range(PARTITIONS)
    }
    (record,) = outputs(play(log, groups_logic(s), 0, faults=False), "groups")[b"g"]
    assert msgspec.json.decode(record)["duplicates"] == 1
