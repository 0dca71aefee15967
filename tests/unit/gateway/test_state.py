"""What the gateway keeps of its episodes: the write-ahead log (what it restores,
group commit, rewrites that cost no more than what was appended since the last,
a failed write, the earlier layout) and the book (caps per client and in total,
idle episodes, closed episodes remembered and forgotten)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from stream_export.client.recorder import DeltaBase, EpisodeBuilder
from stream_export.gateway.access import fingerprint
from stream_export.gateway.book import Book, Closed, OpenEpisode
from stream_export.gateway.wal import FILE_NAME, EpisodeLog, Restored


def state(steps: int = 1) -> dict[str, Any]:
    return {
        "agent_id": "a",
        "steps": steps,
        "ended": False,
        "base": None,
        "tools": {},
        "client": "",
        "at": 1.0,
    }


async def log_states(log: EpisodeLog, *entries: tuple[str, list[bytes]]) -> None:
    """Log these (episode, events added) at once, as concurrent calls do."""
    await asyncio.gather(*(log.state(key, state(), events) for key, events in entries))


def reopened(folder: Path) -> Restored:
    log = EpisodeLog(folder)
    restored = log.open()
    log.close()
    return restored


def test_the_log_restores_open_episodes_and_closed_ones_and_skips_a_torn_line(
    tmp_path: Path,
) -> None:
    log = EpisodeLog(tmp_path)
    log.open()
    asyncio.run(log_states(log, ("a", [b'{"x":1}']), ("b", [b'{"y":2}']), ("c", [])))
    asyncio.run(log_states(log, ("a", [b'{"x":2}'])))
    log.acked("b")
    log.closed("c", {"steps": 3, "at": 5.0, "expired": True})
    log.closed("d", {"steps": 0, "at": 6.0, "expired": False})
    log.forgotten("d")
    log.close()
    with open(tmp_path / FILE_NAME, "ab") as out:
        out.write(b'{"op":"state","id":"e","sta')
    restored = reopened(tmp_path)
    assert restored.episodes == {"a": (state(), [b'{"x":1}', b'{"x":2}']), "b": (state(), [])}
    assert restored.closed == {"c": {"steps": 3, "at": 5.0, "expired": True}}
    assert (tmp_path / FILE_NAME).read_bytes().count(b"\n") == 3  # rewritten: live state only


def test_concurrent_states_share_fsyncs_and_all_reach_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: 50 episodes logging at once wait on a few fsyncs, not 50 in a
    row, and every state is in the log when its call returns."""
    fsyncs: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        fsyncs.append(fd)
        real(fd)

    log = EpisodeLog(tmp_path)
    log.open()
    monkeypatch.setattr(os, "fsync", counted)
    asyncio.run(log_states(log, *((f"e{n}", [b'{"x":%d}' % n]) for n in range(50))))
    assert 1 <= len(fsyncs) < 10
    log.close()
    restored = reopened(tmp_path)
    assert sorted(restored.episodes) == sorted(f"e{n}" for n in range(50))
    assert restored.episodes["e7"][1] == [b'{"x":7}']


def test_a_rewrite_waits_until_the_file_is_twice_its_live_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past compact_bytes the log is rewritten only once what was appended since the
    last rewrite is as large as the live state: with 100 episodes holding 1 MB (far
    past a 64 KiB compact_bytes), 50 more calls of theirs rewrite nothing (each
    rewrote the whole log before); once acknowledged, the next call rewrites it small."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # what is counted is the rewrites
    log = EpisodeLog(tmp_path, compact_bytes=64 << 10)
    log.open()
    big = b'"' + b"x" * 10_000 + b'"'
    asyncio.run(log_states(log, *((f"e{n}", [big]) for n in range(100))))
    rewrites: list[object] = []
    real = os.replace

    def counted(*paths: Path) -> None:
        rewrites.append(paths)
        real(*paths)

    monkeypatch.setattr(os, "replace", counted)
    for n in range(50):
        asyncio.run(log_states(log, (f"e{n}", [b"1"])))
    assert rewrites == []
    for n in range(100):
        log.acked(f"e{n}")
    asyncio.run(log_states(log, ("e0", [b"2"])))
    log.close()
    assert len(rewrites) == 1
    assert (tmp_path / FILE_NAME).stat().st_size < 64 << 10


def test_a_failed_write_is_refused_and_the_next_one_rewrites_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EpisodeLog(tmp_path)
    log.open()
    asyncio.run(log_states(log, ("a", [b"1"])))
    real, failures = os.fsync, [OSError(28, "No space left on device")]

    def fsync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="No space"):
        asyncio.run(log_states(log, ("a", [b"2"])))
    asyncio.run(log_states(log, ("a", [b"2"])))  # the gateway logs what failed again
    log.close()
    assert reopened(tmp_path).episodes["a"][1] == [b"1", b"2"]


def test_a_log_of_the_earlier_layout_is_read(tmp_path: Path) -> None:
    """The layout before digests (the previous call's ids and the outbox in each
    state line) is converted on reading: the next call is still a delta."""
    old = {
        "op": "state",
        "id": "e",
        "agent_id": "a",
        "steps": 2,
        "ended": False,
        "last_call": [1, [5, 6, 7]],
        "tools": {"call_1": "look"},
        "outbox": ['{"x":1}'],
    }
    (tmp_path / FILE_NAME).write_text(json.dumps(old) + "\n")
    (key, (restored, outbox)), *more = reopened(tmp_path).episodes.items()
    assert not more and outbox == [b'{"x":1}']
    episode = OpenEpisode.restore(key, restored, outbox, 1 << 20)
    assert episode.builder.last_call == DeltaBase.of(1, [5, 6, 7])
    assert (episode.builder.steps, episode.tools) == (2, {"call_1": "look"})


def _open(book: Book, key: str, client: str, active_at: float = 0.0) -> OpenEpisode:
    builder = EpisodeBuilder(episode_id=key, agent_id="a", prompt="")
    episode = OpenEpisode(builder, client=client, active_at=active_at)
    book.add(episode)
    return episode


def test_the_book_caps_open_episodes_per_client_and_in_total() -> None:
    book = Book(max_open=3, max_open_per_key=2)
    alice, bob = fingerprint("alice-key"), fingerprint("bob-key")
    _open(book, "a1", alice)
    first = _open(book, "a2", alice)
    assert book.full(alice) == "too_many_episodes_for_key" and book.full(bob) is None
    assert book.full("") is None  # keys off: the total alone
    _open(book, "b1", bob)
    assert book.full(bob) == "too_many_episodes"
    book.close(first, Closed(steps=1, at=1.0))
    assert book.full(alice) is None and book.per_client == {alice: 1, bob: 1}


def test_idle_episodes_are_those_with_no_call_and_nothing_for_kafka() -> None:
    book = Book(max_open=10, max_open_per_key=10)
    idle = _open(book, "idle", "", active_at=1.0)
    _open(book, "recent", "", active_at=9.0)
    waiting = _open(book, "waiting", "", active_at=1.0)
    waiting.outbox.append(b"{}")
    calling = _open(book, "calling", "", active_at=1.0)
    with calling.calling():
        assert book.idle(before=5.0) == [idle]
    assert calling.active_at > 5.0  # a call just ended: active


def test_the_book_remembers_closed_episodes_until_old_or_too_many() -> None:
    book = Book(max_open=2, max_open_per_key=2)
    for n in range(3):
        episode = _open(book, f"e{n}", "")
        forgotten = book.close(episode, Closed(steps=n, at=float(n)))
    assert forgotten == ["e0"] and list(book.closed) == ["e1", "e2"]
    assert book.forget(before=2.0) == ["e1"] and list(book.closed) == ["e2"]


def test_a_restored_episode_keeps_its_group() -> None:
    """A restarted gateway knows a restored episode's group (whole-group admission)."""
    builder = EpisodeBuilder(episode_id="e", agent_id="a", prompt="", group_id="g", group_size=8)
    builder.resume(1, None)
    kept = OpenEpisode(builder).state()
    episode = OpenEpisode.restore("e", json.loads(json.dumps(kept)), [], 1 << 20)
    assert (episode.builder.group_id, episode.builder.group_size) == ("g", 8)
    ungrouped = OpenEpisode.restore("f", state(), [], 1 << 20)  # a log of before
    assert (ungrouped.builder.group_id, ungrouped.builder.group_size) == (None, None)
