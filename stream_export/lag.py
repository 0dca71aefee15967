"""Consumer lag per partition: how many messages this worker still has to process.

Lag is the partition's end offset (from the worker's own consumer) minus the
group's committed offset (from the broker), for the steps and episodes
partitions assigned to this worker. Table changelog partitions are left out:
Faust reads them by seeking, never commits them, so they would show as lag.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import faust
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from faust.exceptions import FaustError

from stream_export import logs
from stream_export.config import Settings
from stream_export.connection import worker_options
from stream_export.metrics import Metrics

INTERVAL_S = 5.0
log = logging.getLogger(__name__)

Partition = tuple[str, int]


def compute(
    ends: Mapping[Partition, int], committed: Mapping[Partition, int]
) -> dict[Partition, int]:
    """Lag per partition; a partition without a commit yet lags by its whole end offset."""
    return {tp: max(0, end - max(committed.get(tp, 0), 0)) for tp, end in ends.items()}


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
    """Updates ``metrics.consumer_lag`` every few seconds from inside the worker."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.shown: set[Partition] = set()
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
        assigned = sorted(self.assignment.partitions)
        if not assigned:
            return {}
        ends = await self.app.consumer.highwaters(*assigned)
        offsets = await (await self._admin()).list_consumer_group_offsets(
            self.settings.worker.app_id,
            partitions=[TopicPartition(tp.topic, tp.partition) for tp in assigned],
        )
        committed = {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}
        return compute({(tp.topic, tp.partition): end for tp, end in ends.items()}, committed)

    @faust.Service.timer(INTERVAL_S)
    async def _update(self) -> None:
        if self.app.rebalancing:
            return
        try:
            lag = await self.measure()
        except (KafkaError, FaustError, OSError, RuntimeError) as exc:
            logs.event(log, "lag.unavailable", logging.WARNING, error=type(exc).__name__)
            return
        gauge = self.metrics.consumer_lag
        for topic, partition in self.shown - lag.keys():
            gauge.remove(topic, str(partition))
        for (topic, partition), value in lag.items():
            gauge.labels(topic, str(partition)).set(value)
        self.shown = set(lag)
