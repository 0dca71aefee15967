"""Staleness that does not bias the data: with ``flag`` (the default) a stale item is
delivered with its lag; with ``drop`` it is skipped. The order a batch takes held
messages in: arrival, oldest version first, or earliest published first, never
reordering a partition (its commit follows its offsets)."""

from __future__ import annotations

import msgspec

from stream_export.feed.batches import Held, Read, Reader, next_held
from tests.support.call_episodes import tool_episode
from tests.support.group_records import group


def test_a_stale_group_is_flagged_with_its_lag_by_default_and_skipped_with_drop() -> None:
    old = msgspec.json.encode(group("old", [tool_episode("a", versions=(2, 3))]))
    fresh = msgspec.json.encode(group("new", [tool_episode("b", versions=(9, 9))]))
    flag = Reader("groups", max_weight_lag=4, current_version=lambda: 9)
    read = flag.read(old)
    assert (len(read.items), read.skip, read.oldest, read.lag) == (1, None, 2, 7)
    assert flag.read(fresh).lag == 0
    drop = Reader("groups", max_weight_lag=4, current_version=lambda: 9, stale="drop")
    assert drop.read(old)[:2] == ([], "stale")
    unknown = Reader("groups", max_weight_lag=4)  # no current version: no lag
    assert unknown.read(old).lag is None


def held(partition: int, offset: int, timestamp: int, oldest: int | None) -> Held:
    return Held(("t", partition), offset, timestamp, Read(["x"], None, oldest, None))


MESSAGES = [
    held(0, 0, timestamp=30, oldest=7),
    held(0, 1, timestamp=10, oldest=1),  # behind its partition's head: never first
    held(1, 0, timestamp=20, oldest=5),
    held(2, 0, timestamp=5, oldest=None),
]


def order(name: str) -> list[tuple[int, int]]:
    messages, taken = list(MESSAGES), []
    while messages:
        message = messages.pop(next_held(messages, name))  # type: ignore[arg-type]
        taken.append((message.tp[1], message.offset))
    return taken


def test_arrival_takes_the_messages_as_fetched() -> None:
    assert order("arrival") == [(0, 0), (0, 1), (1, 0), (2, 0)]


def test_oldest_takes_the_oldest_version_among_the_partitions_heads_unknown_last() -> None:
    assert order("oldest") == [(1, 0), (0, 0), (0, 1), (2, 0)]


def test_ready_takes_the_earliest_published_among_the_partitions_heads() -> None:
    assert order("ready") == [(2, 0), (1, 0), (0, 0), (0, 1)]


def test_a_partitions_own_order_is_kept_whatever_the_order() -> None:
    for name in ("arrival", "oldest", "ready"):
        taken = order(name)
        assert taken.index((0, 0)) < taken.index((0, 1))
