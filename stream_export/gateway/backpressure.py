"""Backpressure: a consumer group's lag, as the gateway measures it for
``gateway.max_consumer_lag`` (the workers on the steps topic) and
``gateway.max_feed_lag`` (the trainer feed's group on the topic it reads): the
group's committed offsets against the end offsets, summed over the topic's
partitions (``stream_export.runtime.lag``)."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client import Gauge

from stream_export.contract.topics import topic_names
from stream_export.errors import KafkaUnavailableError
from stream_export.kafka import lag
from stream_export.kafka.connection import worker_options
from stream_export.settings import Settings


class GroupLag:
    """A consumer group's lag on one topic; clients started on first use."""

    def __init__(self, settings: Settings, topic: str, group: str) -> None:
        self.settings = settings
        self.topic = topic
        self.group = group
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

    @classmethod
    def workers(cls, settings: Settings) -> GroupLag:
        return cls(settings, settings.topics.steps, settings.worker.app_id)

    @classmethod
    def feed(cls, settings: Settings, group: str) -> GroupLag:
        """The trainer feed's group on the topic its ``groups`` or ``episodes``
        source reads (see stream_export.feed)."""
        groups = topic_names(settings.worker.app_id)[1]
        return cls(settings, groups if settings.groups.enabled else settings.topics.episodes, group)

    async def close(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()


@dataclass
class Bound:
    """A lag the gateway answers 429 over: who lags, its group, the bound, the
    gauge that shows it and its last measurement (None: unknown)."""

    who: str
    group: GroupLag
    limit: int
    gauge: Gauge
    value: int | None = None

    @property
    def exceeded(self) -> bool:
        return self.value is not None and self.value > self.limit

    def measured(self, value: int | None) -> None:
        self.value = value
        self.gauge.set(-1 if value is None else value)
