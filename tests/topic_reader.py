"""Read what really landed on a topic (for integration tests), with a deadline."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer


def read_topic(
    bootstrap: str, topic: str, *, count: int, timeout: float, settle: float = 1.0
) -> list[Any]:
    """Every record on ``topic`` once at least ``count`` arrived, plus any that follow
    within ``settle`` seconds (so tests can assert nothing extra arrived)."""
    return asyncio.run(_read(bootstrap, topic, count, timeout, settle))


async def _read(bootstrap: str, topic: str, count: int, limit: float, settle: float) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(limit):
            while len(records) < count:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
        async with asyncio.timeout(limit):
            for batch in (await consumer.getmany(timeout_ms=int(settle * 1000))).values():
                records.extend(batch)
    except TimeoutError:
        raise AssertionError(
            f"timed out after {limit}s: {len(records)} of {count} records on {topic}"
        ) from None
    finally:
        await consumer.stop()
    return records


def header(record: Any, name: str) -> str:
    """A record header's value as text ('' when absent)."""
    return next((v.decode() for k, v in record.headers if k == name), "")
