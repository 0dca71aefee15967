"""Send messages to a topic as fast as one acknowledged producer allows."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer


async def produce(
    bootstrap: str,
    topic: str,
    messages: Sequence[tuple[bytes | None, bytes | None]],
    *,
    max_request_size: int = 1024 * 1024,
) -> None:
    """Send (key, value) ``messages`` in order (per key) with one batched, acknowledged
    producer; a None key or value is sent as such (a keyless message, a tombstone).
    ``max_request_size`` is aiokafka's (its default; raise it for larger messages)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=20,
        max_batch_size=512 * 1024,
        acks="all",
        max_request_size=max_request_size,
    )
    await producer.start()
    try:
        pending = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
