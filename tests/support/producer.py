"""Send messages to a topic as fast as one acknowledged producer allows."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer


async def produce(
    bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes | None]]
) -> None:
    """Send (key, value) ``messages`` in order (per key) with one batched, acknowledged
    producer; a None key or value is sent as such (a keyless message, a tombstone)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024, acks="all"
    )
    await producer.start()
    try:
        pending = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
