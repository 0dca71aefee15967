"""The admitted groups (whole-group admission): who a group covers, and the book's
bounds (ended episodes, idle time, the cap)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream_export.gateway.admitted import AdmittedGroups


def test_an_admitted_group_covers_its_first_group_size_episodes_and_no_more() -> None:
    book = AdmittedGroups(max_groups=10)
    assert not book.covers("g", "e0") and not book.covers(None, "e0")
    book.admit("g", 3, "e0", at=1.0)
    assert book.covers("g", "e0") and book.covers("g", "e1")
    book.admit("g", 3, "e1", at=2.0)
    book.admit("g", 3, "e1", at=2.5)  # a later call of the same episode: no new room taken
    book.admit("g", 3, "e2", at=3.0)
    assert all(book.covers("g", e) for e in ("e0", "e1", "e2"))
    assert not book.covers("g", "e3")  # past group_size: held as a new group's call
    book.admit("g", 3, "e3", at=4.0)  # it went through under the bounds itself
    assert not book.covers("g", "e3")
    assert not book.covers("other", "e0") and not book.covers(None, "e0")


def test_a_group_is_forgotten_once_group_size_of_its_episodes_ended() -> None:
    book = AdmittedGroups(max_groups=10)
    book.admit("g", 2, "e0", at=1.0)
    book.ended("g", "e0")
    book.ended("g", "e0")  # closed twice: counted once
    assert book.covers("g", "e1") and len(book) == 1
    book.ended("g", "e1")  # it never called: still one of the group's episodes
    assert not book.covers("g", "e1") and len(book) == 0
    book.ended("g", "e2")  # an unknown group, or none
    book.ended(None, "e3")
    assert len(book) == 0


def test_a_group_is_kept_while_an_episode_that_went_through_is_open() -> None:
    book = AdmittedGroups(max_groups=10)
    book.admit("g", 2, "e0", at=1.0)
    book.admit("g", 2, "e1", at=1.0)
    book.ended("g", "e0")
    book.ended("g", "x")  # past the group's size: it never went through as the group
    book.ended("g", "y")
    assert book.covers("g", "e1") and book.groups["g"].ended == {"e0", "x"}
    book.ended("g", "e1")
    assert len(book) == 0


def test_groups_with_no_call_since_a_time_are_forgotten() -> None:
    book = AdmittedGroups(max_groups=10)
    book.admit("old", 8, "e0", at=1.0)
    book.admit("recent", 8, "e1", at=5.0)
    book.admit("old", 8, "e2", at=6.0)  # a call of it: active again
    book.admit("idle", 8, "e3", at=2.0)
    assert book.forget(before=5.5) == 2
    assert list(book.groups) == ["old"]


def test_past_the_cap_the_least_recently_active_groups_are_dropped_and_counted() -> None:
    book = AdmittedGroups(max_groups=2)
    assert book.admit("a", 8, "a0", at=1.0) == 0
    assert book.admit("b", 8, "b0", at=2.0) == 0
    assert book.admit("a", 8, "a1", at=3.0) == 0  # a is the most recently active now
    assert book.admit("c", 8, "c0", at=4.0) == 1
    assert list(book.groups) == ["a", "c"]
    assert not book.covers("b", "b0")


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "end", "forget"]),
            st.integers(0, 5),  # group
            st.integers(0, 9),  # episode
            st.integers(1, 4),  # size
        ),
        max_size=200,
    )
)
def test_the_book_stays_within_its_bounds(operations: list[tuple[str, int, int, int]]) -> None:
    book = AdmittedGroups(max_groups=3)
    for clock, (operation, group, episode, size) in enumerate(operations):
        if operation == "admit":
            book.admit(f"g{group}", size, f"e{episode}", at=float(clock))
        elif operation == "end":
            book.ended(f"g{group}", f"e{episode}")
        else:
            book.forget(before=float(clock - 5))
        assert len(book) <= 3
        for kept in book.groups.values():
            assert len(kept.members) <= kept.size
            assert len(kept.ended) <= 2 * kept.size
            assert len(kept.ended) < kept.size or not kept.members <= kept.ended
