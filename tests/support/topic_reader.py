"""Read what really landed on a topic (for integration tests): every record with a
deadline (:func:`read_topic`), what it holds so far (:func:`read_so_far`), or the
episodes as they arrive (:class:`EpisodeReader`)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream_export.contract.decoding import decode_episode
from stream_export.contract.episode import Episode


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


def read_so_far(bootstrap: str, topic: str, *, partitions: int, timeout: float) -> list[Any]:
    """Every record on ``topic``'s ``partitions`` up to their end offsets now: what a
    poll for progress needs, without :func:`read_topic`'s wait for stragglers."""
    return asyncio.run(_read_so_far(bootstrap, topic, partitions, timeout))


async def _read_so_far(bootstrap: str, topic: str, partitions: int, limit: float) -> list[Any]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(limit):
            parts = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(parts)
            ends = await consumer.end_offsets(parts)
            await consumer.seek_to_beginning(*parts)
            while any([await consumer.position(tp) < end for tp, end in ends.items()]):
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
    except TimeoutError:
        raise AssertionError(
            f"timed out after {limit}s: {len(records)} records read so far on {topic}"
        ) from None
    finally:
        await consumer.stop()
    return records


def header(record: Any, name: str) -> str:
    """A record header's value as text ('' when absent)."""
    return next((v.decode() for k, v in record.headers if k == name), "")


class EpisodeReader:
    """Reads a topic of episodes from the beginning, on its own event loop."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.consumer = self.loop.run_until_complete(self._start(bootstrap, topic))
        self.copies: dict[str, list[Episode]] = defaultdict(list)
        self.messages = 0

    @staticmethod
    async def _start(bootstrap: str, topic: str) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        return consumer

    def poll(self, timeout_ms: int = 200) -> int:
        """Read what is there; return how many distinct episodes were seen so far."""
        batches = self.loop.run_until_complete(self.consumer.getmany(timeout_ms=timeout_ms))
        for records in batches.values():
            for record in records:
                assert record.value is not None
                episode = decode_episode(record.value)
                self.copies[episode.episode_id].append(episode)
                self.messages += 1
        return len(self.copies)

    def close(self) -> None:
        self.loop.run_until_complete(self.consumer.stop())
        self.loop.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The end offset of each of the topic's ``partitions``."""

    async def ends() -> dict[int, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            parts = [TopicPartition(topic, p) for p in range(partitions)]
            return {tp.partition: end for tp, end in (await consumer.end_offsets(parts)).items()}
        finally:
            await consumer.stop()

    return asyncio.run(ends())


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """A consumer group's committed offset of each partition of ``topic``."""

    async def committed() -> dict[int, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            found = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        return {tp.partition: at.offset for tp, at in found.items() if tp.topic == topic}

    return asyncio.run(committed())
