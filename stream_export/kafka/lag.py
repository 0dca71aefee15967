"""Consumer lag from the broker, without Faust: what the worker's lag gauge
(:mod:`stream_export.runtime.lag`), the sink and the gateway's backpressure measure."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)

Partition = tuple[str, int]


def compute(
    ends: Mapping[Partition, int], committed: Mapping[Partition, int]
) -> dict[Partition, int]:
    """Lag per partition; a partition without a commit yet lags by its whole end offset."""
    return {tp: max(0, end - max(committed.get(tp, 0), 0)) for tp, end in ends.items()}


def unavailable(exc: Exception) -> None:
    log.warning("lag.unavailable", extra={"error": type(exc).__name__})


#: What a lag measurement may fail with while the broker or a rebalance is away.
ERRORS = (KafkaError, OSError, RuntimeError)


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
