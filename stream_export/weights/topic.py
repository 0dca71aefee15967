"""The control topic on Kafka: created on first use (compacted, one partition),
read from its start and followed, written with the broker's acknowledgement.

A trainer's fence client and each gateway replica hold one; both fold what they
read into a :class:`~stream_export.weights.state.ControlState`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from stream_export.contract.weights import ControlRecord, encode, key_of
from stream_export.errors import FenceError
from stream_export.kafka.connection import worker_options
from stream_export.settings import Settings
from stream_export.telemetry import logs
from stream_export.weights.state import ControlState

log = logging.getLogger(__name__)
#: Compacted: the latest record per key is the state; tombstones of stopped
#: replicas' leases go after a day.
TOPIC_CONFIG: Final = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "60000",
    "delete.retention.ms": "86400000",
}


class ControlTopic:
    """One client's view of the control topic: ``state`` is what it has read."""

    def __init__(self, settings: Settings, role: str) -> None:
        self.settings = settings
        self.name = settings.weights.control_topic
        self.partition = TopicPartition(self.name, 0)
        self.options: dict[str, Any] = {
            **worker_options(settings),
            "client_id": f"{settings.kafka.client_id}-weights-{role}",
        }
        self.state = ControlState()
        self.producer: AIOKafkaProducer | None = None
        self.consumer: AIOKafkaConsumer | None = None
        #: Messages read that were no control record (logged, skipped).
        self.unreadable = 0

    async def start(self) -> None:
        await self._create()
        self.producer = AIOKafkaProducer(**self.options, acks="all", linger_ms=0)
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(
            **self.options,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,  # a begin seen within 0.1 s
        )
        await self.consumer.start()
        self.consumer.assign([self.partition])
        await self.consumer.seek_to_beginning(self.partition)

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
        if self.consumer is not None:
            await self.consumer.stop()

    async def _create(self) -> None:
        admin = AIOKafkaAdminClient(**self.options)
        await admin.start()
        try:
            topic = NewTopic(
                self.name,
                1,
                self.settings.topics.replication_factor,
                topic_configs=TOPIC_CONFIG,
            )
            await admin.create_topics([topic])
        except TopicAlreadyExistsError:
            pass
        finally:
            await admin.close()

    async def publish(self, record: ControlRecord | None, key: bytes, timeout_s: float) -> None:
        """Write ``record`` (None: a tombstone) and wait for the broker's
        acknowledgement; FenceError ``control_unavailable`` past ``timeout_s``."""
        assert self.producer is not None
        value = None if record is None else encode(record)
        try:
            async with asyncio.timeout(timeout_s):
                delivery = await self.producer.send(self.name, value, key=key, partition=0)
            # wait, not wait_for: a timeout must not cancel aiokafka's future (its
            # sender would stop for good)
            done, _ = await asyncio.wait([delivery], timeout=timeout_s)
            if not done:
                raise TimeoutError
            delivery.result()
        except (KafkaError, TimeoutError) as exc:
            raise FenceError(
                f"the control topic {self.name!r} did not take the record: {type(exc).__name__}",
                reason="control_unavailable",
            ) from None

    async def send(self, record: ControlRecord, timeout_s: float) -> None:
        await self.publish(record, key_of(record), timeout_s)

    async def read(self, timeout_s: float) -> list[ControlRecord]:
        """Fold what arrives within ``timeout_s`` into ``state``; the records read."""
        assert self.consumer is not None
        fetched = await self.consumer.getmany(self.partition, timeout_ms=int(timeout_s * 1000))
        read = []
        for message in fetched.get(self.partition, []):
            try:
                record = self.state.apply(message.key, message.value)
            except ValueError as exc:
                self.unreadable += 1
                at = message.offset
                logs.event(log, "weights.unreadable", logging.WARNING, offset=at, error=str(exc))
                continue
            if record is not None:
                read.append(record)
        return read

    async def catch_up(self, timeout_s: float) -> list[ControlRecord]:
        """Read up to the topic's end as it is now (the records read); FenceError
        past ``timeout_s``."""
        assert self.consumer is not None
        read = []
        try:
            async with asyncio.timeout(timeout_s):
                end = (await self.consumer.end_offsets([self.partition]))[self.partition]
                while await self.consumer.position(self.partition) < end:
                    read += await self.read(0.2)
        except (KafkaError, TimeoutError) as exc:
            raise FenceError(
                f"cannot read the control topic {self.name!r}: {type(exc).__name__}",
                reason="control_unavailable",
            ) from None
        return read
