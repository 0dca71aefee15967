"""Messages for Kafka batched per topic partition and sent through the app's
producer: what every stage publishes with (episodes, group records, dead letters,
changelog records)."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
from aiokafka.partitioner import DefaultPartitioner

from stream_export.runtime.patches import producer as adapter


class KafkaOutbox:
    """Messages for Kafka gathered into one record batch per topic partition, sent
    through the app's producer, and awaited together.

    Appending to a batch costs a fraction of a ``send`` per message (the figures are
    in the README's assembly section). Keyed messages go to the partition the
    producer's own default partitioner would pick, so a repeat lands where the first copy did.
    """

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self._partitions: dict[str, list[int]] = {}
        self._partitioner = DefaultPartitioner()
        #: The open batch of each (topic, partition) and how many messages it holds.
        self._open: dict[tuple[str, int], tuple[Any, int]] = {}
        #: Sent batches not yet awaited: (topic, partition), delivery future, count.
        self._sent: list[tuple[tuple[str, int], Any, int]] = []

    async def partition(self, topic: str, key: bytes | None) -> int:
        partitions = self._partitions.get(topic)
        if partitions is None:
            found = await self._producer().partitions_for(topic)
            partitions = self._partitions[topic] = sorted(found)
        return int(self._partitioner(key, partitions, partitions))

    async def put(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        tp = (topic, partition)
        headers = headers or []
        batch, count = self._open.get(tp) or (self._producer().create_batch(), 0)
        if batch.append(timestamp=None, key=key, value=value, headers=headers) is None:
            await self._send(tp, batch, count)  # full (a first message always fits)
            batch, count = self._producer().create_batch(), 0
            batch.append(timestamp=None, key=key, value=value, headers=headers)
        self._open[tp] = (batch, count + 1)

    async def send(self) -> None:
        """Send the open batches (their delivery is awaited by :meth:`delivered`)."""
        for tp, (batch, count) in list(self._open.items()):
            await self._send(tp, batch, count)
        self._open.clear()

    async def delivered(self) -> dict[tuple[str, int], int]:
        """Send the open batches, wait until every batch sent is acknowledged, and
        return the offset of the last message delivered to each topic partition."""
        await self.send()
        sent, self._sent = self._sent, []
        results = await asyncio.gather(*(future for _, future, _ in sent))
        return {
            tp: meta.offset + count - 1 for (tp, _, count), meta in zip(sent, results, strict=True)
        }

    async def _send(self, tp: tuple[str, int], batch: Any, count: int) -> None:
        future = await self._producer().send_batch(batch, tp[0], partition=tp[1])
        self._sent.append((tp, future, count))

    def _producer(self) -> Any:
        return adapter.raw_producer(self.app)


class Sender:
    """Sends to one topic through an outbox (the dead-letter helpers call ``send``)."""

    def __init__(self, outbox: KafkaOutbox, topic: Any) -> None:
        self.outbox = outbox
        self.topic = topic.get_topic_name()

    async def send(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        partition = await self.outbox.partition(self.topic, key)
        await self.outbox.put(self.topic, partition, key, value, headers)
