"""Backpressure: the workers' lag on the steps topic, as the gateway measures it for
``gateway.max_consumer_lag`` (the worker group's committed offsets against the end
offsets, summed over the topic's partitions: ``stream_export.runtime.lag``)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream_export.config import Settings
from stream_export.errors import KafkaUnavailableError
from stream_export.kafka.connection import worker_options
from stream_export.runtime import lag


class WorkerLag:
    """The worker group's lag on the steps topic; clients started on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.topics.steps
        self.group = settings.worker.app_id
        self.consumer: AIOKafkaConsumer | None = None
        self.admin: AIOKafkaAdminClient | None = None

    async def measure(self) -> int:
        """Steps events the group has not committed yet; KafkaUnavailableError or one of
        ``lag.ERRORS`` when the broker does not say."""
        consumer, admin = await self._clients()
        (described,) = await admin.describe_topics([self.topic])
        found = [p["partition"] for p in described["partitions"]]
        if not found:
            raise KafkaUnavailableError(f"the topic {self.topic} has no partitions (yet)")
        partitions = [TopicPartition(self.topic, p) for p in sorted(found)]
        ends = await consumer.end_offsets(partitions)
        offsets = await lag.committed(admin, self.group, partitions)
        behind = lag.compute({(tp.topic, tp.partition): end for tp, end in ends.items()}, offsets)
        return sum(behind.values())

    async def _clients(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        options = worker_options(self.settings)
        options["client_id"] = f"{self.settings.kafka.client_id}-gateway-lag"
        if self.consumer is None:
            consumer = AIOKafkaConsumer(**options, group_id=None, enable_auto_commit=False)
            await consumer.start()
            self.consumer = consumer
        if self.admin is None:
            admin = AIOKafkaAdminClient(**options)
            await admin.start()
            self.admin = admin
        return self.consumer, self.admin

    async def close(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()
