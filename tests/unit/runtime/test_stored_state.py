"""State of any size in bounded entries: the pieces of large table values, the groups
stage's stored form (a summary plus one entry per member), and the record bound of
published episodes; each checked with a crash at any entry of a write."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.assemble.episode import fitted
from stream_export.contract.decoding import encode
from stream_export.contract.episode import Episode, SourceOffset
from stream_export.contract.events import Step
from stream_export.groups import storage
from stream_export.groups.stage import CLOSED_TABLE
from stream_export.groups.state import GroupBook
from stream_export.ops.worker import build
from stream_export.runtime import pieces
from stream_export.settings import load
from tests.support.group_book import Crash, Message, apply, book, crashes, published

PIECE = 16  # small pieces, so that short values are split too

Store = dict[Any, bytes]


def write(store: Store, items: list[tuple[Any, bytes | None]], durable: int | None = None) -> None:
    """What the changelog writer does, through a dict, the first ``durable`` entries
    only (a crash after them; None: all)."""
    for key, value in pieces.entries(items, store.get, PIECE)[:durable]:
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value


def read(store: Store, key: Any) -> bytes | None:
    return pieces.join(key, store.get(key), store.get)


values = st.binary(max_size=5 * PIECE) | st.binary(min_size=1, max_size=3).map(
    lambda b: b"\xc1" + b  # a value that looks like a tag is stored safely too
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([b"a", b"b", (b"c", (0.0, 1.0))]), values | st.none())),
    st.integers(0, 40),
)
def test_a_value_reads_back_whole_or_as_before_whatever_entry_a_crash_stops_at(
    writes: list[tuple[Any, bytes | None]], durable: int
) -> None:
    store: Store = {}
    want: dict[Any, bytes | None] = {}
    for key, value in writes[:-1]:
        write(store, [(key, value)])
        want[key] = value
        assert read(store, key) == value
    if writes:
        key, value = writes[-1]
        before = want.get(key)
        write(store, [(key, value)], durable)
        assert read(store, key) in (before, value)
        want[key] = read(store, key)
    listed = {k: v for k, v, _ in pieces.whole_items(iter(store.items()), store.get)}
    assert listed == {k: v for k, v in want.items() if v is not None}
    for key, value in store.items():  # no entry above a changelog record's bound
        assert len(value) <= PIECE + len(pieces.PIECE) or not pieces.is_piece(value)
        assert pieces.is_key(key[0] if isinstance(key, tuple) else key) == pieces.is_piece(value)


def test_pieces_are_deleted_with_their_value_and_replaced_by_the_next_generation() -> None:
    store: Store = {}
    write(store, [(b"k", b"x" * 40)])
    assert len(store) == 4 and read(store, b"k") == b"x" * 40
    write(store, [(b"k", b"y" * 20)])
    assert len(store) == 3 and read(store, b"k") == b"y" * 20
    write(store, [(b"k", b"small")])
    assert store == {b"k": b"small"}
    write(store, [(b"k", b"z" * 17), (b"k", None)])
    assert store == {}


# -- the groups stage's stored form ---------------------------------------------


def stored(
    entries: storage.OpenEntries,
    b: GroupBook,
    opened_store: Store,
    closed: Store,
    *,
    durable: int | None = None,
) -> None:
    """One persist of partition 0, through the stored form and the pieces, as the
    stage orders it (markers, open groups, clock), its first ``durable`` entries
    durable only (None: all)."""
    opened, markers = b.take_changes()
    writes = [
        (closed, storage.marker_writes(0, markers)),
        (opened_store, entries.writes(0, opened, (0.0, 10.0))),
        (closed, storage.clock_writes(0, b.take_clock())),
    ]
    for store, items in writes:
        n = len(pieces.entries(items, store.get, PIECE))
        write(store, items, durable)
        durable = None if durable is None else max(0, durable - n)


def restored(
    opened_store: Store, closed: Store, judged: bool = False
) -> tuple[GroupBook, storage.OpenEntries]:
    entries = storage.OpenEntries()
    found, expiring = entries.restore(
        pieces.whole_items(iter(opened_store.items()), opened_store.get),
        pieces.whole_items(iter(closed.items()), closed.get),
        [0],
    )
    assert {k for _p, k in expiring} <= set(opened_store)
    b = book(with_judge=judged)
    b.restore(found[0].open, found[0].closed, found[0].clock)
    return b, entries


@settings(max_examples=300, deadline=None)
@given(crashes(), st.integers(0, 60), st.booleans())
def test_a_crash_within_a_persist_publishes_what_a_straight_run_does(
    case: Crash, durable: int, whole: bool
) -> None:
    """The stored form, written entry by entry and cut by a crash at any entry of a
    persist (then nothing of it was acknowledged: the successor replays from 0), or
    after it (from any offset up to it), restores a book that publishes what a
    straight run does; members keep their episodes' bytes (groups being judged
    too: a judge is sent them again after a restore)."""
    messages, cut, crash, replay, judged = case
    messages = [with_record(x) for x in messages]
    straight = book(with_judge=judged)
    want = published(apply(straight, messages, 0, len(messages)) + straight.advance(math.inf))
    first, entries = book(with_judge=judged), storage.OpenEntries()
    before = apply(first, messages, 0, cut)
    opened_store: Store = {}
    closed: Store = {}
    stored(entries, first, opened_store, closed, durable=None if whole else durable)
    before += apply(first, messages, cut, crash)
    second, again = restored(opened_store, closed, judged)
    for group_id in second.judging:
        assert all(m.record for m in second.open[group_id].members)
    after = apply(second, messages, replay if whole else 0, len(messages))
    after += second.advance(math.inf)
    for group in second.open.values():
        assert all(m.record == m.episode_id.encode() for m in group.members)
    got = published(before) | published(after)
    assert got.keys() == want.keys()
    for record_id, record in [*published(before).items(), *published(after).items()]:
        assert record == want[record_id], record_id
    # the next persist leaves exactly the open groups stored
    stored(again, second, opened_store, closed)
    third, _ = restored(opened_store, closed, judged)
    assert third.open.keys() == second.open.keys() and third.judging == second.judging


def test_a_change_to_a_group_writes_its_summary_and_its_new_members_only() -> None:
    b, entries = book(), storage.OpenEntries()
    for i in range(3):
        b.add("g", m_with_record(f"r{i}", 1.0 + i), 16, i)
    opened, _ = b.take_changes()
    first = entries.writes(0, opened, (0.0, 10.0))
    assert len(first) == 4  # three members and the summary
    b.add("g", m_with_record("r3", 5.0), 16, 3)
    opened, _ = b.take_changes()
    second = entries.writes(0, opened, (0.0, 10.0))
    assert [split(k) for k, _v in second] == [("g", 3), ("g", None)]
    b.add("g", m_with_record("r3", 5.0), 16, 4)  # an agent's duplicate: summary only
    opened, _ = b.take_changes()
    assert [split(k) for k, _v in entries.writes(0, opened, (0.0, 10.0))] == [("g", None)]


def with_record(message: Message) -> Message:
    if len(message) != 3:
        return message
    group_id, member, size = message
    return group_id, msgspec.structs.replace(member, record=member.episode_id.encode()), size


def split(key: Any) -> tuple[str, int | None]:
    member = storage.split_member_key(key[0])
    return (key[0].decode(), None) if member is None else (member[0].decode(), member[1])


def m_with_record(eid: str, time: float) -> Any:
    from stream_export.groups.state import Member

    return Member(eid, time, 1.0, False, eid.encode())


# -- published episodes ---------------------------------------------------------


def long_episode(steps: int, content: str = "x") -> Episode:
    return Episode(
        episode_id="e",
        agent_id="a",
        prompt="p",
        steps=[
            Step(episode_id="e", time=1.0, seq=i, kind="output", content=content)
            for i in range(steps)
        ],
        start_time=0.0,
        end_time=2.0,
        outcome="success",
        sources=[SourceOffset(0, i) for i in range(steps + 2)],
    )


@given(st.integers(0, 60), st.integers(0, 3000))
def test_a_published_episode_keeps_its_first_steps_within_the_bound(steps: int, limit: int) -> None:
    episode = long_episode(steps)
    found = fitted(episode, limit)
    whole = len(encode(episode))
    if whole <= limit:
        assert found == (episode, encode(episode))
        return
    bare = len(
        encode(
            msgspec.structs.replace(
                episode,
                steps=[],
                sources=episode.sources[:1] + episode.sources[-1:],
                truncated=True,
                truncated_reason="max_bytes",
            )
        )
    )
    if bare > limit:
        assert found is None
        return
    assert found is not None
    short, value = found
    assert value == encode(short) and len(value) <= limit
    assert short.truncated and short.truncated_reason == "max_bytes"
    k = len(short.steps)
    assert short.steps == episode.steps[:k] and k < steps
    assert short.sources == [*episode.sources[: 1 + k], episode.sources[-1]]
    longer = msgspec.structs.replace(
        short,
        steps=episode.steps[: k + 1],
        sources=[*episode.sources[: 2 + k], episode.sources[-1]],
    )
    assert len(encode(longer)) > limit  # as many steps as fit


def test_a_restored_group_is_the_group_that_was_stored() -> None:
    """Every field of an open group survives the stored form (the summary keeps all
    but the members' episodes, which come back from their entries)."""
    b, entries = book(), storage.OpenEntries()
    b.add("g", m_with_record("r0", 1.0), 4, 0, prompt="digest")
    b.add("g", m_with_record("r0", 1.0), 4, 1, prompt="digest")  # a copy: duplicates 1
    b.add("g", m_with_record("r1", 0.5), 4, 2, prompt="digest")
    opened_store: Store = {}
    closed: Store = {}
    stored(entries, b, opened_store, closed)
    again, _ = restored(opened_store, closed)
    assert again.open == b.open and again.open["g"].prompt == "digest"


def test_a_small_table_takes_only_values_that_fit_one_entry() -> None:
    assert pieces.small(b"\x93\x00\x01\xc0") == b"\x93\x00\x01\xc0" and pieces.small(None) is None
    for value in (b"x" * (pieces.PIECE_BYTES + 1), b"\xc1tagged"):
        with pytest.raises(ValueError):
            pieces.small(value)


def test_stored_markers_outlive_the_books_retention() -> None:
    """Issue 36 items 1 and 2b: RocksDB's TTL and the changelog's retention forget on
    the wall clock, the book on event time, which lags it (quiet_partition_s, and
    any stalled source). With the markers' TTL at groups.closed_retention_s, a
    compaction dropped markers the book still held, and the rebuild after a crash
    or a rebalance opened their groups anew (a second version of the record, or a
    late rollout dropped as a group too small). The book deletes its markers
    itself; what is stored outlives the retention by a day at least."""
    s = load(
        env={},
        overrides=["groups.enabled=true", "groups.timeout_s=60", "groups.closed_retention_s=900"],
    )
    table = build(s).tables[CLOSED_TABLE]
    options, topic = table.options or {}, table.changelog_topic.config or {}
    assert options["ttl"] >= 900 + 86_400
    assert int(topic["retention.ms"]) >= (900 + 86_400) * 1000
