"""The episode recorder on a real broker: episodes arrive complete and in order per key,
from async and threaded sync agents; a broker outage is an error, never a hang."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.client import Producer, SyncProducer
from stream_export.contract.decoding import decode_event
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.errors import KafkaUnavailableError
from stream_export.kafka import topics
from stream_export.settings import Settings, load
from tests.support.topic_reader import read_topic

pytestmark = pytest.mark.integration

DEV_KAFKA = Path(__file__).resolve().parents[3] / "dev" / "kafka"
STEPS_PER_EPISODE = 3 * 5


def episodes_on_topic(settings: Settings, count: int) -> dict[str, list[StepEvent]]:
    """The events on the steps topic grouped by key, in offset order, checked per key."""
    records = read_topic(
        settings.kafka.bootstrap_servers, settings.topics.steps, count=count, timeout=60
    )
    assert len(records) == count
    by_key: dict[str, list[StepEvent]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        event = decode_event(record.value)
        assert record.key == event.episode_id.encode()
        by_key[event.episode_id].append(event)
        partitions[event.episode_id].add(record.partition)
    assert all(len(p) == 1 for p in partitions.values()), "an episode spans partitions"
    return by_key


def assert_complete_and_ordered(events: list[StepEvent], outcome: str = "success") -> None:
    start, *steps, end = events
    assert isinstance(start, EpisodeStart)
    assert isinstance(end, EpisodeEnd) and end.outcome == outcome
    assert all(isinstance(s, Step) for s in steps)
    assert [s.seq for s in steps if isinstance(s, Step)] == list(range(end.steps))
    times = [e.time for e in events]
    assert times == sorted(times)


async def record(producer: Producer, agent: int) -> str:
    async with producer.episode(
        agent_id=f"agent-{agent}", prompt=f"task {agent}", group_id="g", metadata={"n": agent}
    ) as ep:
        for k in range(STEPS_PER_EPISODE // 3):
            await ep.thought(f"thought {k}")
            await ep.action(f"act {k}", name="tool", arguments={"k": k})
            await asyncio.sleep(0)  # let the other agents interleave
            await ep.result(f"result {k}", name="tool", data={"k": k})
        await ep.end("success", reward=agent / 10)
    return ep.episode_id


def test_async_recorder_episodes_arrive_complete_and_ordered_per_key(
    settings_for: Callable[..., Settings],
) -> None:
    settings = settings_for()
    asyncio.run(topics.apply(settings))

    async def agents() -> tuple[list[str], str]:
        async with Producer.from_settings(settings, linger_ms=20) as producer:
            ids = await asyncio.gather(*(record(producer, i) for i in range(12)))
            crashing = producer.episode(agent_id="crashy", prompt="p")
            with pytest.raises(RuntimeError):
                async with crashing as ep:
                    await ep.thought("calling a flaky tool")
                    raise RuntimeError("tool crashed")
        return list(ids), crashing.episode_id

    ids, crashed = asyncio.run(agents())
    by_key = episodes_on_topic(settings, count=12 * (STEPS_PER_EPISODE + 2) + 3)
    assert set(by_key) == {*ids, crashed}
    for episode_id in ids:
        assert_complete_and_ordered(by_key[episode_id])
        assert len(by_key[episode_id]) == STEPS_PER_EPISODE + 2
    assert_complete_and_ordered(by_key[crashed], outcome="failure")
    end = by_key[crashed][-1]
    assert isinstance(end, EpisodeEnd) and end.metadata["error"] == "RuntimeError: tool crashed"


def test_sync_recorder_from_several_threads(settings_for: Callable[..., Settings]) -> None:
    settings = settings_for()
    asyncio.run(topics.apply(settings))
    ids: list[str] = []

    def agent(producer: SyncProducer, n: int) -> None:
        for _ in range(3):
            with producer.episode(agent_id=f"thread-{n}", prompt="count to five") as ep:
                for k in range(5):
                    ep.thought(f"{k}")
                ep.output("five")
                ep.end("success", reward=1.0)
            ids.append(ep.episode_id)

    with SyncProducer.from_settings(settings) as producer:
        threads = [threading.Thread(target=agent, args=(producer, n)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    by_key = episodes_on_topic(settings, count=12 * 8)
    assert sorted(by_key) == sorted(ids) and len(ids) == 12
    for events in by_key.values():
        assert_complete_and_ordered(events)


def dev_kafka(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(DEV_KAFKA), *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_a_broker_outage_is_a_clear_error_within_the_timeout(tmp_path: Path) -> None:
    # Its own broker, because this test stops it.
    env = {**os.environ, "KAFKA_STATE_DIR": str(tmp_path / "kafka")}
    dev_kafka(env, "start")
    try:
        address = dev_kafka(env, "status")
        settings = load(
            env={}, overrides=[f"kafka.bootstrap_servers={address}", "topics.partitions=1"]
        )
        asyncio.run(topics.apply(settings))
        producer = SyncProducer.from_settings(settings, timeout_s=3, max_pending=50)
        producer.start()
        with producer.episode(agent_id="a", prompt="before the outage") as ep:
            ep.thought("all good")
            ep.end("success")
        producer.flush()
    finally:
        dev_kafka(env, "stop")

    began = time.monotonic()
    outage = producer.episode(agent_id="a", prompt="during the outage")
    with pytest.raises(KafkaUnavailableError, match="not taking events") as info, outage as ep:
        for k in range(1000):
            ep.thought(f"step {k}")
    assert time.monotonic() - began < 20
    assert info.value.retriable
    began = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="not acknowledged"):
        producer.close()
    assert time.monotonic() - began < 20
