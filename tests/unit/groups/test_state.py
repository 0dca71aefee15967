"""The group state machine: closing at size or timeout, duplicates, truncation, late
rollouts, and the same results after a restore from the stored state."""

from __future__ import annotations

import math
from collections import Counter

import msgspec
import pytest
from hypothesis import given, settings

from stream_export.contract.episode import Episode
from stream_export.groups.keys import group_key, prompt_digest
from stream_export.groups.records import score_group
from stream_export.groups.state import (
    Clock,
    ClosedGroup,
    Dropped,
    Duplicate,
    Emitted,
    GroupBook,
    Late,
    Member,
    Mismatch,
    OpenGroup,
    Result,
    member_of,
    source_position,
)
from tests.support.group_book import (
    Crash,
    apply,
    book,
    crashes,
    m,
    published,
    streams,
)


def test_closes_when_the_expected_members_arrived() -> None:
    b = book()
    assert b.add("g", m("a", 1.0), expected=3) == []
    assert b.add("g", m("b", 2.0), expected=3) == []
    [result] = b.add("g", m("c", 3.0), expected=3)
    assert isinstance(result, Emitted)
    assert (result.reason, result.complete, result.missing) == ("size", True, 0)
    assert [x.episode_id for x in result.group.members] == ["a", "b", "c"]
    assert "g" not in b.open and b.closed["g"].episode_ids == ["a", "b", "c"]


def test_default_size_applies_without_group_size() -> None:
    b = book(default_size=2)
    b.add("g", m("a", 1.0))
    [result] = b.add("g", m("b", 2.0))
    assert isinstance(result, Emitted) and result.group.expected == 2


def test_timeout_from_the_first_rollout_emits_incomplete() -> None:
    b = book()
    b.add("g", m("a", 10.0), expected=4)
    b.add("g", m("b", 50.0))
    assert b.advance(109.9) == []
    [result] = b.advance(110.0)
    assert isinstance(result, Emitted)
    assert (result.reason, result.complete, result.missing) == ("timeout", False, 2)


def test_timeout_without_a_known_size_has_no_missing_count() -> None:
    b = book()
    b.add("g", m("a", 0.0))
    b.add("g", m("b", 1.0))
    [result] = b.advance(100.0)
    assert isinstance(result, Emitted) and result.missing is None and not result.complete


def test_a_rollout_after_the_deadline_finds_the_group_closed() -> None:
    b = book()
    b.add("g", m("a", 0.0), expected=4)
    b.add("g", m("b", 1.0))
    # the clock passes the deadline before the rollout joins: it is late
    [first] = b.advance(200.0)
    [second] = b.add("g", m("c", 200.0))
    assert isinstance(first, Emitted) and first.reason == "timeout"
    assert isinstance(second, Late) and second.member.episode_id == "c"


def test_no_rollout_moves_the_clock() -> None:
    """A rollout that ended past a group's deadline closes nothing: another source
    (a stalled worker's partition) may still hold that group's rollouts. Only the
    watermarks of every source move the clock."""
    b = book()
    b.add("g", m("a", 0.0), expected=4)
    b.add("g", m("b", 1.0))
    assert b.add("h", m("x", 500.0), expected=4) == []
    assert b.add("g", m("c", 600.0)) == []
    assert sorted(b.open) == ["g", "h"] and len(b.open["g"].members) == 3
    [result] = b.advance(100.0)
    assert isinstance(result, Emitted) and result.group.group_id == "g"


def test_too_small_timed_out_group_is_dropped_and_stays_closed() -> None:
    b = book(min_members=3)
    b.add("g", m("a", 0.0), expected=4)
    b.add("g", m("b", 1.0))
    [result] = b.advance(100.0)
    assert isinstance(result, Dropped) and result.reason == "too_small"
    [late] = b.add("g", m("c", 100.0))
    assert isinstance(late, Late)


def test_duplicates_count_once_open_and_closed() -> None:
    b = book()
    b.add("g", m("a", 0.0), expected=2)
    [dup] = b.add("g", m("a", 0.5))
    assert dup == Duplicate("g", "a")
    assert b.open["g"].duplicates == 1 and len(b.open["g"].members) == 1
    [closed] = b.add("g", m("b", 1.0))
    assert isinstance(closed, Emitted) and len(closed.group.members) == 2
    assert b.add("g", m("b", 1.0)) == [Duplicate("g", "b")]  # a replay, not a late rollout


def test_the_same_position_forwarded_again_is_no_duplicate() -> None:
    """A restarted worker forwards the episodes it had not acknowledged again (the
    same episodes-topic position, a new repartition offset): nothing, open or
    closed; another copy of the episode (another position) is a duplicate."""
    b = book()
    first = msgspec.structs.replace(m("a", 0.0), source=source_position(1, 7))
    b.add("g", first, expected=3, offset=0)
    assert b.add("g", first, offset=1) == []
    assert b.open["g"].duplicates == 0
    other = msgspec.structs.replace(first, source=source_position(1, 9))
    assert b.add("g", other, offset=2) == [Duplicate("g", "a")]
    assert b.add("g", other, offset=3) == []  # that copy forwarded again
    second = msgspec.structs.replace(m("b", 1.0), source=source_position(0, 3))
    b.add("g", second, offset=4)
    [closed] = b.add("g", msgspec.structs.replace(m("c", 2.0), source=5), offset=5)
    assert isinstance(closed, Emitted) and closed.group.duplicates == 1
    assert b.add("g", second, offset=6) == []
    assert b.add("g", other, offset=7) == []
    third = msgspec.structs.replace(first, source=source_position(2, 1))
    assert b.add("g", third, offset=8) == [Duplicate("g", "a")]
    assert b.add("g", third, offset=9) == []
    late = msgspec.structs.replace(m("d", 3.0), source=6)
    assert [type(r) for r in b.add("g", late, offset=10)] == [Late]
    assert b.add("g", late, offset=11) == []


def test_a_rollout_of_another_task_under_the_group_id_is_left_out() -> None:
    """Two prompts under one group id are two tasks: the rollouts of the second are
    mismatches (dead-lettered by the stage), open and closed, and the group's
    statistics hold its own task only; an unchecked prompt ("") joins."""
    b = book()
    task, other = prompt_digest("What is 2 + 2?"), prompt_digest("Name a prime.")
    assert prompt_digest("  What is\n2 + 2? ") == task
    b.add("g", m("a", 0.0, 1.0), expected=3, prompt=task)
    [mismatch] = b.add("g", m("x", 1.0, 0.0), prompt=other)
    assert mismatch == Mismatch("g", m("x", 1.0, 0.0))
    assert [x.episode_id for x in b.open["g"].members] == ["a"]
    b.add("g", m("b", 2.0, 0.0), prompt=task)
    [closed] = b.add("g", m("c", 3.0, 1.0), prompt="")
    assert isinstance(closed, Emitted) and len(closed.group.members) == 3
    assert [type(r) for r in b.add("g", m("y", 4.0), prompt=other)] == [Mismatch]
    assert [type(r) for r in b.add("g", m("d", 4.0), prompt=task)] == [Late]


def test_truncated_rollouts_count_for_size_not_for_statistics() -> None:
    b = book()
    b.add("g", m("a", 0.0, reward=1.0), expected=3)
    b.add("g", m("b", 1.0, reward=0.0))
    [result] = b.add("g", m("c", 2.0, reward=100.0, truncated=True))
    assert isinstance(result, Emitted) and result.complete
    stats, advantages = score_group(result.group, estimator="dr_grpo", eps=1e-6, ddof=1)
    assert stats.mean == 0.5
    assert advantages == [0.5, -0.5, None]


def test_a_timed_out_group_counts_scored_members_only() -> None:
    b = book()
    b.add("g", m("a", 0.0), expected=4)
    b.add("g", m("b", 1.0, truncated=True))
    [result] = b.advance(100.0)
    assert isinstance(result, Dropped)


def test_a_full_group_of_only_truncated_rollouts_is_dropped() -> None:
    b = book()
    [result] = b.add("g", m("a", 0.0, truncated=True), expected=1)
    assert isinstance(result, Dropped)


def test_group_of_one_is_zero_variance() -> None:
    b = book()
    [result] = b.add("g", m("a", 0.0, reward=0.3), expected=1)
    assert isinstance(result, Emitted)
    stats, advantages = score_group(result.group, estimator="grpo", eps=1e-6, ddof=1)
    assert stats.zero_variance and advantages == [0.0]


def test_an_earlier_rollout_moves_the_deadline_back() -> None:
    b = book()
    b.add("g", m("a", 50.0), expected=4)
    b.add("h", m("x", 60.0), expected=4)
    b.add("g", m("b", 10.0))  # arrived later, ended earlier
    [result] = b.advance(110.0)
    assert isinstance(result, Emitted) and result.group.group_id == "g"


def test_closed_markers_expire_after_retention() -> None:
    """A forgotten marker is deleted from the stored state one persist after the one
    that stores the clock saying so (the clock is stored last): a crash in between
    must not leave the group without marker and without that clock, where a
    replayed rollout of it would open it anew."""
    b = book(closed_retention_s=500.0)
    b.add("g", m("a", 0.0), expected=1, offset=0)
    assert b.take_changes()[1].keys() == {"g"}
    b.advance(499.0, offset=1)
    assert "g" in b.closed
    b.advance(500.0, offset=2)
    assert "g" not in b.closed
    assert b.take_changes() == ({}, {})
    clock = b.take_clock()
    assert clock is not None and clock.forgotten == 2
    assert b.take_changes() == ({}, {"g": None})
    assert b.add("g", m("a", 0.0), offset=0) == []  # replayed: applied before


def test_a_rollout_older_than_the_retention_opens_no_group() -> None:
    """Issue 36 item 1: once a closed group is forgotten, its members forwarded again
    after a crash opened it anew, and its timeout published a second version of
    its record under the same id (a subset of its members, other advantages). A
    rollout that ended closed_retention_s before the clock is late instead."""
    b = book(closed_retention_s=500.0)
    first, second = m("a", 0.0, 1.0), m("b", 1.0)
    b.add("g", first, expected=2)
    [closed] = b.add("g", second)
    assert isinstance(closed, Emitted)
    b.advance(501.0)
    assert "g" not in b.closed
    assert b.add("g", first, offset=7) == [Late("g", first)]
    assert "g" not in b.open and "g" not in b.closed
    assert [type(r) for r in b.add("h", m("x", 2.0), expected=2)] == []  # within: a group
    assert "h" in b.open


def test_a_markers_retention_counts_from_its_latest_rollout() -> None:
    """A group that timed out at 100 holds a rollout that ended at 150 (after the
    deadline, before the clock got there): its marker is kept until that rollout
    is too old to open a group, else the rollout forwarded again in between would
    open the group anew. A late rollout extends it likewise."""
    b = book(timeout_s=100.0, closed_retention_s=500.0)
    b.add("g", m("a", 0.0), expected=3)
    b.add("g", m("b", 150.0))
    [closed] = b.advance(100.0)
    assert isinstance(closed, Emitted) and closed.closed_at == 100.0
    b.advance(649.0)
    assert b.add("g", m("b", 150.0)) == [Duplicate("g", "b")]  # not a new group
    [late] = b.add("g", m("c", 640.0))
    assert isinstance(late, Late)
    b.advance(1139.0)
    assert "g" in b.closed
    b.advance(1140.0)
    assert "g" not in b.closed


def test_member_of_scores_an_episode_without_reward_by_its_outcome() -> None:
    base = {"agent_id": "x", "prompt": "p", "steps": [], "start_time": 0.0, "end_time": 5.0}
    won = Episode(episode_id="a", outcome="success", **base)  # type: ignore[arg-type]
    lost = Episode(episode_id="b", outcome="failure", reward=None, **base)  # type: ignore[arg-type]
    given_reward = Episode(episode_id="c", outcome="success", reward=0.25, **base)  # type: ignore[arg-type]
    assert member_of(won).reward == 1.0 and member_of(lost).reward == 0.0
    assert member_of(given_reward) == Member("c", 5.0, 0.25, False, b"")


def test_stored_state_round_trips_through_msgpack() -> None:
    group = OpenGroup("g", 1.0, 4, [Member("a", 1.0, 0.5, False, b"{}")], 2)
    marker = ClosedGroup(3.0, "size", ["a", "b"])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(group), type=OpenGroup) == group
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(marker), type=ClosedGroup) == marker
    # state stored before offsets were: decoded with none known (nothing is a replay)
    older = msgspec.msgpack.encode(["g", 1.0, 4, [], 2])
    assert msgspec.msgpack.decode(older, type=OpenGroup).offset == -1
    clock = Clock(5.0, {0: 4.0, 1: 6.0})
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(clock), type=Clock) == clock


# -- properties ---------------------------------------------------------------


def run(
    b: GroupBook, events: list[tuple[str, Member, int | None]], finish: bool = True
) -> list[Result]:
    results: list[Result] = []
    for group_id, member, size in events:
        results.extend(b.add(group_id, member, size))
    if finish:
        results.extend(b.advance(math.inf))
    return results


@settings(max_examples=300, deadline=None)
@given(streams())
def test_every_rollout_lands_once(
    stream: tuple[list[tuple[str, Member, int | None]], dict[str, int]],
) -> None:
    events, sizes = stream
    results = run(book(), events)
    placed: Counter[str] = Counter()
    closed_groups: Counter[str] = Counter()
    for r in results:
        if isinstance(r, Emitted | Dropped):
            closed_groups[r.group.group_id] += 1
            placed.update(x.episode_id for x in r.group.members)
            assert len(r.group.members) <= sizes[r.group.group_id]
            if isinstance(r, Emitted) and r.reason == "size":
                assert len(r.group.members) == sizes[r.group.group_id]
        elif isinstance(r, Late):
            placed[r.member.episode_id] += 1
    distinct = {member.episode_id for _, member, _ in events}
    assert placed == Counter(distinct)  # every rollout exactly once
    assert all(n == 1 for n in closed_groups.values())  # never reopened
    duplicates = sum(isinstance(r, Duplicate) for r in results)
    assert duplicates == len(events) - len(distinct)


@settings(max_examples=400, deadline=None)
@given(crashes())
def test_a_crash_and_replay_publish_what_a_straight_run_does(case: Crash) -> None:
    """Restored from stored state and replaying from an earlier offset, a book
    publishes each record the straight run does, field for field (a group the
    crashed worker published already comes out the same again), and no other; with
    a judge, each group closes at the first verdict after it was judged."""
    messages, cut, crash, replay, judged = case
    everything = len(messages)
    straight = book(with_judge=judged)
    want = published(apply(straight, messages, 0, everything) + straight.advance(math.inf))
    assert not straight.judging  # the last verdicts closed every judged group

    first = book(with_judge=judged)
    before = apply(first, messages, 0, cut)
    # what the I/O layer keeps: the changes applied to two key/value stores
    opened, closed = first.take_changes()
    clock = first.take_clock()
    stored_clock = None if clock is None else msgspec.msgpack.encode(clock)
    stored_open = {k: msgspec.msgpack.encode(v) for k, v in opened.items() if v is not None}
    stored_closed = {k: msgspec.msgpack.encode(v) for k, v in closed.items() if v is not None}
    before += apply(first, messages, cut, crash)  # published, then the crash

    second = book(with_judge=judged)
    second.restore(
        (msgspec.msgpack.decode(v, type=OpenGroup) for v in stored_open.values()),
        {k: msgspec.msgpack.decode(v, type=ClosedGroup) for k, v in stored_closed.items()},
        None if stored_clock is None else msgspec.msgpack.decode(stored_clock, type=Clock),
    )
    after = apply(second, messages, replay, everything) + second.advance(math.inf)
    got_before, got_after = published(before), published(after)
    assert got_before.keys() | got_after.keys() == want.keys()
    for record_id, record in [*got_before.items(), *got_after.items()]:
        assert record == want[record_id], record_id


def test_a_group_both_open_and_closed_in_stored_state_is_closed() -> None:
    """A crash between writing a group's marker and deleting its open entry: the
    marker wins, the stale entry is deleted and never times out."""
    b = book()
    b.restore([OpenGroup("g", 0.0, 4, [m("a", 0.0)])], {"g": ClosedGroup(5.0, "size", ["a"])})
    assert b.open == {}
    assert b.take_changes() == ({"g": None}, {})
    assert b.advance(1000.0) == []
    assert b.add("g", m("b", 1000.0), offset=9) == [Late("g", m("b", 1000.0))]


def test_a_replayed_message_changes_nothing() -> None:
    b = book()
    b.add("g", m("a", 0.0), expected=3, offset=1)
    b.add("g", m("a", 0.0), offset=2)  # a duplicate, counted
    assert b.add("g", m("a", 0.0), offset=2) == []  # its replay
    assert b.add("g", m("b", 0.5), offset=1) == []  # at or below the group's offset
    assert b.open["g"].duplicates == 1 and [x.episode_id for x in b.open["g"].members] == ["a"]
    b.add("g", m("b", 2.0), offset=3)
    [closed] = b.add("g", m("c", 1.0), offset=4)
    assert isinstance(closed, Emitted) and closed.closed_at == 2.0  # its latest end
    assert b.add("g", m("c", 1.0), offset=4) == []  # replayed after the close
    assert b.add("g", m("c", 1.0), offset=5) == [Duplicate("g", "c")]


def test_a_timed_out_group_closes_at_its_deadline() -> None:
    b = book()
    b.add("g", m("a", 10.0), expected=4)
    b.add("g", m("b", 20.0))
    [result] = b.advance(500.0)
    assert isinstance(result, Emitted) and result.closed_at == 110.0


@pytest.mark.parametrize("min_members", [1, 2, 3])
def test_min_members_sets_what_a_timeout_keeps(min_members: int) -> None:
    b = book(min_members=min_members)
    b.add("g", m("a", 0.0), expected=5)
    b.add("g", m("b", 1.0))
    [result] = b.advance(100.0)
    assert isinstance(result, Emitted) == (min_members <= 2)


def _episode(**fields: object) -> Episode:
    base: dict[str, object] = {
        "episode_id": "e",
        "agent_id": "x",
        "prompt": "p",
        "steps": [],
        "start_time": 0.0,
        "end_time": 1.0,
        "outcome": "success",
    }
    base.update(fields)
    return msgspec.convert(base, Episode)


def test_group_key_is_the_group_id_or_the_fallback() -> None:
    assert group_key(_episode(group_id="task-1"), "prompt_hash") == "task-1"
    assert group_key(_episode(), "none") is None
    one = group_key(_episode(prompt="  Find the   key.\n"), "prompt_hash")
    assert one == group_key(_episode(prompt="Find the key."), "prompt_hash")
    assert one is not None and one.startswith("prompt:") and len(one) == 7 + 32
    assert one != group_key(_episode(prompt="Find the door."), "prompt_hash")
    chat = [{"role": "user", "content": "Find  the key."}]
    as_user = group_key(_episode(prompt=chat), "prompt_hash")
    as_system = group_key(_episode(prompt=[{**chat[0], "role": "system"}]), "prompt_hash")
    assert as_user != as_system and as_user != one


def test_the_clock_follows_the_earliest_source_watermark() -> None:
    b = book()
    b.add("g", m("a", 0.0), expected=4)
    b.add("g", m("b", 1.0))
    assert b.watermark(0, 500.0, sources=2, slack=10.0) == []  # source 1 unheard
    assert b.watermark(1, 105.0, sources=2, slack=10.0) == []  # clock 95 < 100
    assert b.clock == 95.0
    assert b.watermark(0, 900.0, sources=2, slack=10.0) == []  # source 1 is stalled
    [result] = b.watermark(1, 110.0, sources=2, slack=10.0)
    assert isinstance(result, Emitted) and result.reason == "timeout"
    assert b.watermark(1, 50.0, sources=2, slack=10.0) == []  # an old tick: no way back
    assert b.clock == 100.0
