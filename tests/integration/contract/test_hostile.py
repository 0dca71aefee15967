"""Poison pills on the real worker: every message ends as an episode or a dead letter.

Deeply nested events (the ~6 KB message that used to crash Faust for good), a
tombstone, a message without a key and a hostile episode on the episodes topic
are dead-lettered with their reason and original bytes, counted in /metrics,
and the valid episodes around them are written exactly once, also after a
kill -9 and restart.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.contract.decoding import encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.monitoring import free_port, labelled
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkkafka import prompts
from tests.support.topic_reader import header, read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

NOW = time.time()
DEEP = '{"k":' * 1000 + "1" + "}" * 1000


def deep(event: dict[str, object], field: str) -> bytes:
    return json.dumps({**event, field: "@@"}).replace('"@@"', DEEP).encode()


def pills() -> list[tuple[bytes | None, bytes | None, str, str]]:
    """(key, value, expected reason, stage) of every poison pill."""
    step = {"type": "step", "episode_id": "pill", "time": NOW, "seq": 0, "kind": "action"}
    start = {"type": "start", "episode_id": "pill", "time": NOW, "agent_id": "a", "prompt": "p"}
    return [
        (b"pill", deep(step, "data"), "too_deep", "decode"),
        (b"pill", deep(step, "arguments"), "too_deep", "decode"),
        (b"pill", deep(step, "unknown_field"), "too_deep", "decode"),
        (b"pill", deep(start, "metadata"), "too_deep", "decode"),
        (b"pill", deep(start, "prompt"), "too_deep", "decode"),
        (b"pill", None, "not_json", "decode"),  # a tombstone
        (None, json.dumps(start).encode(), "key_mismatch", "assemble"),
    ]


def episode(i: int) -> list[StepEvent]:
    eid = f"ok-{i}"
    return [
        EpisodeStart(episode_id=eid, time=NOW, agent_id="a", prompt=f"task {i}"),
        Step(episode_id=eid, time=NOW, seq=0, kind="action", content=f"answer {i}"),
        EpisodeEnd(episode_id=eid, time=NOW, steps=1, outcome="success"),
    ]


Messages = list[tuple[bytes | None, bytes | None]]


def valid(lo: int, hi: int) -> Messages:
    return [(e.episode_id.encode(), encode(e)) for i in range(lo, hi) for e in episode(i)]


def wait_records(worker: Worker, out: Path, expected: dict[str, int]) -> None:
    def done() -> bool:
        assert worker.alive(), worker.log()[-3000:]
        return prompts(out) == expected

    wait_for(done, timeout=90, what=f"{len(expected)} records, each once")


def metric(port: int, name: str, reason: str) -> float:
    return labelled(port, name, "reason", reason)


def test_poison_pills_are_dead_lettered_and_the_rest_is_written_once(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_for("http.enabled=true", f"http.port={port}", "topics.partitions=1")
    asyncio.run(topics.ensure(settings))
    bootstrap, out = settings.kafka.bootstrap_servers, tmp_path / "out"
    poison = pills()
    hostile_episode = b'{"unknown_field":' + DEEP.encode() + b',"episode_id":"x"}'
    messages = valid(0, 20) + [(k, v) for k, v, _, _ in poison] + valid(20, 40)
    asyncio.run(produce(bootstrap, settings.topics.steps, messages))
    asyncio.run(produce(bootstrap, settings.topics.episodes, [(b"x", hostile_episode)]))
    expected = {f"task {i}": 1 for i in range(40)}

    worker = Worker(settings, tmp_path / "worker.log").start()
    try:
        wait_records(worker, out, expected)
        dead_letters = settings.topics.dead_letters
        dead = read_topic(bootstrap, dead_letters, count=len(poison) + 1, timeout=30)
        wait_for(
            lambda: metric(port, "stream_export_events_invalid_total", "too_deep") == 6,
            timeout=20,
            what="too_deep counted in /metrics (5 step events and the episode)",
        )
        assert metric(port, "stream_export_dead_letters_total", "too_deep") == 6
        assert metric(port, "stream_export_dead_letters_total", "not_json") == 1
        assert metric(port, "stream_export_events_invalid_total", "key_mismatch") == 1
        worker.kill9()
        # The restarted worker reads whatever was not committed again, pills
        # included: it must neither crash on them nor write any record twice.
        worker = Worker(settings, tmp_path / "worker2.log").start()
        asyncio.run(produce(bootstrap, settings.topics.steps, valid(40, 50)))
        expected |= {f"task {i}": 1 for i in range(40, 50)}
        wait_records(worker, out, expected)
    finally:
        worker.stop()
    got = [(r.key, r.value, header(r, "x-reason"), header(r, "x-stage")) for r in dead]
    for key, value, reason, stage in poison:
        assert (key, value, reason, stage) in got, (reason, stage)
    assert (b"x", hostile_episode, "too_deep", "sink") in got
    assert "Traceback" not in worker.log()
