"""The trainer feed's pure rules: commits never pass an unacknowledged batch, and
what a message gives a trainer (or why it gives nothing)."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from stream_export.feed.batches import Ledger, Reader
from tests.support.call_episodes import tool_episode
from tests.support.group_records import group, rollout


@given(
    st.lists(st.dictionaries(st.integers(0, 2), st.integers(1, 5), min_size=1), min_size=1),
    st.randoms(use_true_random=False),
)
def test_a_commit_never_passes_a_batch_not_acknowledged(
    batches: list[dict[int, int]], rng: random.Random
) -> None:
    """Batches consume runs of each partition in order; acknowledged in any order,
    a partition's commit is the end of its longest acknowledged prefix."""
    ledger = Ledger()
    ends: list[dict[tuple[str, int], int]] = []
    position = {p: 0 for p in range(3)}
    for number, sizes in enumerate(batches):
        end = {}
        for p, size in sizes.items():
            position[p] += size
            end[("t", p)] = position[p]
        ends.append(end)
        ledger.deliver(number, end)
    order = list(range(len(batches)))
    rng.shuffle(order)
    committed: dict[tuple[str, int], int] = {}
    acked: set[int] = set()
    for number in order:
        commits = ledger.acknowledge(number)
        acked.add(number)
        for tp, offset in commits.items():
            assert offset > committed.get(tp, 0)
        committed.update(commits)
        for tp, offset in committed.items():
            covering = [n for n, end in enumerate(ends) if tp in end and end[tp] <= offset]
            assert set(covering) <= acked  # nothing unacknowledged is committed
        assert ledger.unacknowledged == len(batches) - len(acked)
    assert committed == {tp: position[tp[1]] for tp in {tp for e in ends for tp in e}}


def test_forgotten_partitions_commit_nothing() -> None:
    ledger = Ledger()
    ledger.deliver(0, {("t", 0): 5, ("t", 1): 3})
    ledger.forget([("t", 1)])
    assert ledger.acknowledge(0) == {("t", 0): 5}
    assert ledger.unacknowledged == 0


def test_a_group_reader_skips_late_repeated_stale_and_broken_records() -> None:
    version = [10]
    reader = Reader("groups", max_weight_lag=3, current_version=lambda: version[0], stale="drop")
    text = group("g1", [rollout("x", 1.0), rollout("y", 0.0)])
    late = group("g2", [rollout("z", 1.0)], reason="late")
    old = group("g3", [tool_episode("a", versions=(6, 7)), tool_episode("b", versions=(8, 9))])
    [item], skip, _, _ = reader.read(msgspec.json.encode(text))
    assert skip is None and item.record_id == text.record_id
    assert reader.read(msgspec.json.encode(text))[:2] == ([], "duplicate")
    assert reader.read(msgspec.json.encode(late))[:2] == ([], "late")
    assert reader.read(msgspec.json.encode(old))[:2] == ([], "stale")  # 10 - 6 > 3
    assert reader.read(b"not json")[:2] == ([], "undecodable")
    version[0] = 9
    fresh = group("g4", [tool_episode("c", versions=(6, 7))])
    assert reader.read(msgspec.json.encode(fresh))[1] is None  # 9 - 6 = 3: not stale


def test_token_and_episode_readers_give_rows_and_episodes() -> None:
    episode = tool_episode("a")
    value = msgspec.json.encode(episode)
    rows, skip, _, _ = Reader("tokens").read(value)
    assert skip is None and [r["segment"] for r in rows] == [0] and rows[0]["episode_id"] == "a"
    [got], *_ = Reader("episodes").read(value)
    assert got.episode_id == "a" and got.tokens is not None


def test_records_remembered_from_before_the_resume_point_count_as_delivered() -> None:
    """A restarted feed reads back the messages before its group's last
    acknowledgement: their records are not delivered again, whatever else they are."""
    groups = Reader("groups")
    before = group("g1", [rollout("x", 1.0), rollout("y", 0.0)])
    after = group("g2", [rollout("z", 1.0), rollout("w", 0.0)])
    groups.remember([msgspec.json.encode(before), None, b"not json", b'{"record_id": 3}'])
    assert groups.read(msgspec.json.encode(before))[:2] == ([], "duplicate")
    assert groups.read(msgspec.json.encode(after))[1] is None
    episodes = Reader("tokens", window=2)
    calls = [tool_episode(name) for name in ("a", "b", "c")]
    episodes.remember(msgspec.json.encode(e) for e in calls)
    assert episodes.read(msgspec.json.encode(calls[0]))[1] is None  # beyond the window
    assert episodes.read(msgspec.json.encode(calls[2]))[:2] == ([], "duplicate")
