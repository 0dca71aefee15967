"""Steps-topic messages the assembler did not get from Faust's consumer, read
again straight from Kafka.

The assembler knows, per partition, the offset after the last message it
handled (after a rebuild: the committed offset). When a fetched batch starts
further on, the messages in between are read with this reader and handled
first, in order, so no offset is acknowledged past a message that was not
handled. It happens when records of a partition were fetched while it was not
active (they are dropped, as Faust drops them), when a seek moved the fetch
position, and at every transaction marker of a transactional producer (a marker
takes an offset and is never delivered; then nothing is found).
"""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream_export.errors import GapError
from stream_export.kafka.connection import worker_options
from stream_export.settings import Settings


class GapReader:
    """One consumer without a group, started on first use, that reads offset ranges."""

    def __init__(self, settings: Settings, topic: str, timeout_s: float = 30.0) -> None:
        self.settings = settings
        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer: AIOKafkaConsumer | None = None

    async def read(self, partition: int, start: int, end: int) -> list[ConsumerRecord[Any, Any]]:
        """Messages at offsets ``start`` to ``end - 1`` (fewer where the log has
        none: transaction markers occupy offsets too)."""
        consumer = await self._started()
        tp = TopicPartition(self.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        found: list[ConsumerRecord[Any, Any]] = []
        deadline = time.monotonic() + self.timeout_s
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise GapError(f"could not read {self.topic}/{partition} offsets {start}-{end - 1}")
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=end - start)
            found += [r for r in batch.get(tp, []) if r.offset < end]
        return found

    async def positions(self, partitions: list[int]) -> dict[int, int]:
        """Where each partition's messages start for the worker's consumer group:
        its committed offset, else (nothing committed yet) the start of the log,
        where the group's consumer starts too. Asked of the broker: Faust learns
        the committed offsets only after recovery, when it seeks."""
        admin = AIOKafkaAdminClient(
            **worker_options(self.settings) | {"client_id": f"{self.settings.kafka.client_id}-gaps"}
        )
        await admin.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in partitions]
            found = await admin.list_consumer_group_offsets(
                self.settings.worker.app_id, partitions=tps
            )
        finally:
            await admin.close()
        positions = {tp.partition: meta.offset for tp, meta in found.items() if meta.offset >= 0}
        new = [tp for tp in tps if tp.partition not in positions]
        if new:
            starts = await (await self._started()).beginning_offsets(new)
            positions |= {tp.partition: offset for tp, offset in starts.items()}
        return positions

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
