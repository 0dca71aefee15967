"""Steps-topic messages Faust's consumer skipped, read again straight from Kafka.

Around a rebalance Faust resumes the flow of messages before it seeks the new
partitions to their committed offsets; the fetch that was already under way
then continues past the seek, Faust records the offsets in between as a "gap",
treats them as acknowledged and drops them when they arrive again
(``faust/transport/consumer.py`` ``_drain_messages``). Messages it had handed
to the agent's stream but the agent had not read yet are lost that way. The
assembler knows the last offset it handled per partition, so when the next
message is further on, it reads the missing ones with this reader and handles
them first, in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_export.config import Settings
from stream_export.connection import worker_options
from stream_export.errors import GapError


@dataclass(frozen=True)
class Message:
    """The parts of a Faust message the assembler reads."""

    topic: str
    partition: int
    offset: int
    timestamp: float


@dataclass(frozen=True)
class Refetched:
    """A message read by :class:`GapReader`, shaped like the Faust event it replaces."""

    message: Message
    key: bytes | None
    value: bytes
    headers: dict[str, bytes] = field(default_factory=dict)


class GapReader:
    """One consumer without a group, started on first use, that reads offset ranges."""

    def __init__(self, settings: Settings, topic: str, timeout_s: float = 30.0) -> None:
        self.settings = settings
        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer: AIOKafkaConsumer | None = None

    async def read(self, partition: int, start: int, end: int) -> list[Refetched]:
        """Messages at offsets ``start`` to ``end - 1`` (fewer where the log has
        none: transaction markers occupy offsets too)."""
        consumer = await self._started()
        tp = TopicPartition(self.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        found: list[Refetched] = []
        deadline = time.monotonic() + self.timeout_s
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise GapError(f"could not read {self.topic}/{partition} offsets {start}-{end - 1}")
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=end - start)
            found += [_refetched(r) for r in batch.get(tp, []) if r.offset < end]
        return found

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                **worker_options(self.settings),
                group_id=None,
                enable_auto_commit=False,
            )
            await self._consumer.start()
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


def _refetched(record: Any) -> Refetched:
    message = Message(record.topic, record.partition, record.offset, record.timestamp / 1000)
    return Refetched(message, record.key, record.value, dict(record.headers or ()))
