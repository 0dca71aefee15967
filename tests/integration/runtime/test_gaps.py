"""GapReader reads back an offset range of a real topic, headers included."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka import AIOKafkaProducer

from stream_export.kafka import topics
from stream_export.runtime.gaps import GapReader
from stream_export.settings import Settings


def test_reads_exactly_the_range_asked_for(settings_for: Callable[..., Settings]) -> None:
    settings = settings_for()
    asyncio.run(topics.ensure(settings))
    steps = settings.topics.steps

    async def run() -> list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]]:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await producer.start()
        try:
            for n in range(6):
                headers = [("x-stream-export-control", b"tick")] if n == 2 else None
                await producer.send_and_wait(
                    steps, b"v%d" % n, key=b"k%d" % n, partition=1, headers=headers
                )
        finally:
            await producer.stop()
        reader = GapReader(settings, steps)
        try:
            found = await reader.read(1, 1, 4)
        finally:
            await reader.close()
        return [(m.offset, m.key, m.value, list(m.headers)) for m in found]

    assert asyncio.run(run()) == [
        (1, b"k1", b"v1", []),
        (2, b"k2", b"v2", [("x-stream-export-control", b"tick")]),
        (3, b"k3", b"v3", []),
    ]
