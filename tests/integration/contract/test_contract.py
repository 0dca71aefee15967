"""Bad input as the worker handles it: a flood of garbage mixed into valid episodes
leaves the worker alive, puts every garbage message on the dead-letter topic with its
reason, and every valid episode is still assembled.

Assertions are about behaviour at the topic boundaries (steps in; episodes and dead
letters out), not about how the worker is built.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.contract.decoding import decode_episode, encode
from stream_export.contract.events import Step, StepEvent
from stream_export.ops import demo
from stream_export.settings import Settings
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.topic_reader import header, read_topic

pytestmark = pytest.mark.integration

MAX_EVENT_BYTES = 4096
Message = tuple[bytes | None, bytes | None]  # key, value


def garbage(episode_id: str, n: int) -> list[tuple[bytes, str]]:
    """Every kind of bad input, aimed at a live episode (its id, a seq it uses)."""

    def step(**changes: Any) -> bytes:
        base = {"type": "step", "v": 1, "episode_id": episode_id, "time": 1.0, "seq": 0}
        return json.dumps(
            {**base, "kind": "thought", "content": f"garbage {n}", **changes}
        ).encode()

    return [
        (b"\x00\xff not json %d" % n, "not_json"),
        (b"", "not_json"),
        (b'{"type": "step", "episode_id": "%s", ' % episode_id.encode(), "not_json"),
        (step(seq="zero"), "invalid"),
        (step(kind="dance"), "invalid"),
        (b"[%d, 2, 3]" % n, "invalid"),
        (step(type="bogus"), "unknown_type"),
        (step(v=2), "unsupported_version"),
        (step(content="x" * MAX_EVENT_BYTES), "too_large"),
    ]


def flood(episodes: list[list[StepEvent]]) -> tuple[list[Message], Counter[tuple[bytes, str]]]:
    """Valid episodes with garbage wedged between their events, plus keyless garbage
    and tombstones (on the dead-letter topic, an empty value stands for both)."""
    messages: list[Message] = []
    expected: Counter[tuple[bytes, str]] = Counter()
    for n, events in enumerate(episodes):
        key = events[0].episode_id.encode()
        bad = garbage(events[0].episode_id, n)
        expected.update(bad)
        messages.append((key, encode(events[0])))
        messages += [(key, value) for value, _ in bad]
        messages += [(key, encode(e)) for e in events[1:]]
        messages.append((None, b"keyless garbage %d" % n))
        expected[(b"keyless garbage %d" % n, "not_json")] += 1
        messages.append((key, None))  # a tombstone: no value at all
        expected[(b"", "not_json")] += 1
    return messages, expected


def test_garbage_flood_dead_letters_every_bad_message_and_spares_every_episode(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(f"assemble.max_event_bytes={MAX_EVENT_BYTES}")
    bootstrap, t = settings.kafka.bootstrap_servers, settings.topics
    valid = list(itertools.islice(demo.episodes(seed=21), 10))
    messages, expected = flood(valid)
    late = next(demo.episodes(seed=22))

    with Worker(settings, tmp_path / "worker.log") as worker:
        asyncio.run(produce(bootstrap, t.steps, messages))
        dead = read_topic(bootstrap, t.dead_letters, count=sum(expected.values()), timeout=150)
        episodes = read_topic(bootstrap, t.episodes, count=len(valid), timeout=60)
        assert worker.alive(), worker.log()[-3000:]
        # Still working, not just alive: an episode sent after the flood is assembled too.
        asyncio.run(produce(bootstrap, t.steps, [(e.episode_id.encode(), encode(e)) for e in late]))
        after = read_topic(bootstrap, t.episodes, count=len(valid) + 1, timeout=60)
        assert worker.alive(), worker.log()[-3000:]

    got = Counter((r.value or b"", header(r, "x-reason")) for r in dead)
    assert got == expected, "every garbage message, unchanged, with its reason; nothing else"
    for record in dead:
        assert header(record, "x-source").startswith(f"{t.steps}/")
        assert header(record, "x-detail")

    want = {e[0].episode_id: e for e in [*valid, late]}
    built = [decode_episode(r.value) for r in after]
    assert sorted(e.episode_id for e in built) == sorted(want)
    assert len(episodes) == len(valid)
    for episode in built:
        steps = [e for e in want[episode.episode_id] if isinstance(e, Step)]
        assert [(s.seq, s.content) for s in episode.steps] == [(s.seq, s.content) for s in steps]
