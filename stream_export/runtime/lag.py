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
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from faust.exceptions import FaustError

from stream_export.kafka import lag as broker_lag
from stream_export.kafka.connection import worker_options
from stream_export.kafka.lag import Partition, committed, compute, unavailable
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings

INTERVAL_S = 5.0
log = logging.getLogger(__name__)


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


#: What a lag measurement may fail with while the broker or a rebalance is away.
ERRORS = (*broker_lag.ERRORS, FaustError)


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
