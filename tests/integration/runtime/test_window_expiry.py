"""The open-episodes table's window expiry on the real broker: state restored
from the changelog is tracked again, and what is past the expiry is deleted
(changelog tombstone), counted and never emitted; what is not is assembled."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.windows import TumblingWindow

from stream_export.assemble.agent import OPEN_TABLE
from stream_export.assemble.chunks import START, STEP, Chunk, chunk_key
from stream_export.contract.decoding import encode
from stream_export.contract.events import EpisodeStart, Step
from stream_export.kafka import topics
from stream_export.runtime.tables import WINDOW_KEY_CODEC
from stream_export.settings import Settings
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker
from tests.support.topic_reader import EpisodeReader
from tests.support.waiting import wait_for

TIMEOUTS = ("assemble.idle_timeout_s=2.5", "assemble.grace_s=0.5", "assemble.quiet_partition_s=1")


def stored_chunk(eid: str, now: float) -> bytes:
    """Chunk 0 of an episode as the assembler persists it: its start and step 0."""
    raws = [
        encode(EpisodeStart(episode_id=eid, time=now, agent_id="a", prompt=f"task {eid}")),
        encode(Step(episode_id=eid, time=now, seq=0, kind="thought", content="s0")),
    ]
    chunk = Chunk(0, [0, 1], [START, STEP], [0, 0], [now, now], [len(r) for r in raws], raws)
    return msgspec.msgpack.encode(chunk)


async def seed_changelog(settings: Settings, records: list[tuple[bytes, bytes]]) -> str:
    """Create the open table's changelog (as Faust would) and write ``records`` to
    partition 0: the state a previous worker left behind."""
    name = f"{settings.worker.app_id}-{OPEN_TABLE}-changelog"
    bootstrap = settings.kafka.bootstrap_servers
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, settings.topics.partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(name, value, key=key, partition=0)
    finally:
        await producer.stop()
    return name


def changelog(settings: Settings, name: str) -> list[tuple[bytes, bytes | None]]:
    async def read() -> list[tuple[bytes, bytes | None]]:
        tp = TopicPartition(name, 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            out: list[tuple[bytes, bytes | None]] = []
            while await consumer.position(tp) < end:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    out += [(r.key, r.value) for r in records if r.key is not None]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(read())


def test_state_past_the_window_expiry_is_deleted_and_counted_the_rest_is_assembled(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_for(*TIMEOUTS, "http.enabled=true", f"http.port={port}")
    a = settings.assemble
    window = TumblingWindow(a.window_s, expires=a.window_expires_s)
    now = time.time()
    codec = WINDOW_KEY_CODEC
    stale_key = codec.dumps(
        (chunk_key(b"abandoned", 0), window.current(now - 2 * a.window_expires_s))
    )
    live_key = codec.dumps((chunk_key(b"restored", 0), window.current(now)))
    asyncio.run(topics.ensure(settings))
    name = asyncio.run(
        seed_changelog(
            settings,
            [
                (stale_key, stored_chunk("abandoned", now)),
                (live_key, stored_chunk("restored", now)),
            ],
        )
    )
    episodes = EpisodeReader(settings.kafka.bootstrap_servers, settings.topics.episodes)
    worker = Worker(settings, tmp_path / "worker.log").start()
    try:

        def restored_emitted() -> bool:
            assert worker.alive(), worker.log()[-3000:]
            episodes.poll()
            return "restored" in episodes.copies

        wait_for(restored_emitted, timeout=60, what=f"the restored episode\n{worker.log()[-3000:]}")
        body = get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        assert re.search(r"^stream_export_state_expired_total 1\.0$", body, re.M), body

        def tombstoned() -> bool:
            last = dict(changelog(settings, name))
            return last.get(stale_key, b"") is None and last.get(live_key, b"") is None

        wait_for(tombstoned, timeout=30, what="tombstones for both chunks in the changelog")
        episodes.poll(timeout_ms=1000)
    finally:
        worker.stop()
        episodes.close()
    assert set(episodes.copies) == {"restored"}
    (restored,) = episodes.copies["restored"]
    assert restored.truncated_reason == "timeout"
    assert [s.content for s in restored.steps] == ["s0"]
