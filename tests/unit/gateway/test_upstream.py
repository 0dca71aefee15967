"""Where the gateway sends a call and each retry of it, and how long it waits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream_export.gateway.upstream import BACKOFF_MAX_S, BACKOFF_S, backoff_s, pick


@given(urls=st.lists(st.text(min_size=1), min_size=1, max_size=5, unique=True), key=st.text())
def test_an_episode_sticks_to_one_upstream_and_its_retries_go_round_the_list(
    urls: list[str], key: str
) -> None:
    tried = [pick(urls, key, attempt) for attempt in range(len(urls))]
    assert sorted(tried) == sorted(urls)  # each upstream once before any again
    assert pick(urls, key, 0) == tried[0] == pick(urls, key, len(urls))


def test_the_backoff_doubles_and_is_bounded() -> None:
    waits = [backoff_s(attempt) for attempt in range(1, 10)]
    assert waits[:3] == [BACKOFF_S, 2 * BACKOFF_S, 4 * BACKOFF_S]
    assert max(waits) == BACKOFF_MAX_S == waits[-1]
