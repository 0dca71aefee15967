"""Consumer lag per partition: how many messages this worker still has to process.

Two consumers, two lags, one gauge (``topic`` tells them apart):

* the assembler (Faust's consumer) on its steps partitions: the partition's end
  offset minus the group's committed offset (from the broker; the gateway's
  backpressure measures the same, over all steps partitions). Table changelog
  partitions are left out: Faust reads them by seeking, never commits them, so
  they would show as lag.
* the sink (its own aiokafka consumer) on its episodes partitions: the end offset
  minus the next offset not yet in the sink's checkpoint on disk, so a sink that
  stalls (output not writable, a formatter stuck) shows its lag growing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from faust.exceptions import FaustError

from stream_export.config import Settings
from stream_export.kafka.connection import worker_options
from stream_export.runtime import logs
from stream_export.runtime.metrics import Metrics

INTERVAL_S = 5.0
log = logging.getLogger(__name__)

Partition = tuple[str, int]


def compute(
    ends: Mapping[Partition, int], committed: Mapping[Partition, int]
) -> dict[Partition, int]:
    """Lag per partition; a partition without a commit yet lags by its whole end offset."""
    return {tp: max(0, end - max(committed.get(tp, 0), 0)) for tp, end in ends.items()}


class Shown:
    """Publishes one consumer's lag to the gauge, dropping partitions it no longer has."""

    def __init__(self, metrics: Metrics) -> None:
        self.gauge = metrics.consumer_lag
        self.partitions: set[Partition] = set()

    def publish(self, lag: Mapping[Partition, int]) -> None:
        for topic, partition in self.partitions - lag.keys():
            self.gauge.remove(topic, str(partition))
        for (topic, partition), value in lag.items():
            self.gauge.labels(topic, str(partition)).set(value)
        self.partitions = set(lag)


def unavailable(exc: Exception) -> None:
    logs.event(log, "lag.unavailable", logging.WARNING, error=type(exc).__name__)


#: What a lag measurement may fail with while the broker or a rebalance is away.
ERRORS = (KafkaError, FaustError, OSError, RuntimeError)


async def committed(
    admin: AIOKafkaAdminClient, group: str, partitions: list[TopicPartition]
) -> dict[Partition, int]:
    """A consumer group's committed offsets on these partitions (-1: none yet)."""
    offsets = await admin.list_consumer_group_offsets(group, partitions=partitions)
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


async def sink_lag(
    consumer: AIOKafkaConsumer, topic: str, positions: Mapping[int, int]
) -> dict[Partition, int]:
    """The sink's lag: end offsets (asked from the broker, so they keep moving while
    the sink is paused) minus ``positions``, the next offset to write per partition."""
    if not positions:
        return {}
    ends = await consumer.end_offsets([TopicPartition(topic, p) for p in positions])
    return compute(
        {(tp.topic, tp.partition): end for tp, end in ends.items()},
        {(topic, p): offset for p, offset in positions.items()},
    )


class Assignment:
    """This worker's steps and episodes partitions, kept from Faust's assignment signal."""

    def __init__(self, app: faust.App, settings: Settings) -> None:
        self.topics = {settings.topics.steps, settings.topics.episodes}
        self.partitions: set[Any] = set()
        app.on_partitions_assigned.connect(self._on_assigned)

    def _on_assigned(self, sender: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        """The signal carries the whole new assignment, table changelogs included."""
        self.partitions = {tp for tp in args[0] if tp.topic in self.topics}


class WorkerService(faust.Service):
    """A mode service started with the Faust worker that watches it (HTTP, lag)."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        metrics: Metrics,
        assignment: Assignment,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.app, self.settings, self.metrics = app, settings, metrics
        self.assignment = assignment


class LagMonitor(WorkerService):
    """Updates the assembler's ``metrics.consumer_lag`` every few seconds from inside
    the worker (the sink updates its own: stream_export.output.sink)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.shown = Shown(self.metrics)
        self.admin: AIOKafkaAdminClient | None = None

    async def on_stop(self) -> None:
        if self.admin is not None:
            await self.admin.close()

    async def _admin(self) -> AIOKafkaAdminClient:
        if self.admin is None:
            client_id = f"{self.settings.kafka.client_id}-lag"
            admin = AIOKafkaAdminClient(**worker_options(self.settings) | {"client_id": client_id})
            await admin.start()
            self.admin = admin
        return self.admin

    async def measure(self) -> dict[Partition, int]:
        steps = self.settings.topics.steps
        assigned = sorted(tp for tp in self.assignment.partitions if tp.topic == steps)
        if not assigned:
            return {}
        ends = await self.app.consumer.highwaters(*assigned)
        offsets = await committed(
            await self._admin(),
            self.settings.worker.app_id,
            [TopicPartition(tp.topic, tp.partition) for tp in assigned],
        )
        return compute({(tp.topic, tp.partition): end for tp, end in ends.items()}, offsets)

    @faust.Service.timer(INTERVAL_S)
    async def _update(self) -> None:
        if self.app.rebalancing:
            return
        try:
            lag = await self.measure()
        except ERRORS as exc:
            unavailable(exc)
            return
        self.shown.publish(lag)
