"""The gateway's producer recovering from a failed delivery, with the real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_export.client import Producer

pytestmark = pytest.mark.integration


def test_a_delivery_kafka_refuses_leaves_the_next_ones_of_its_partition_acknowledged(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    """A failed delivery consumed sequence numbers the broker never saw (aiokafka gives
    up a batch whose partition has had no leader for the ack timeout, as while the
    broker restarts under load; here the broker refuses a record too large for the
    topic): aiokafka then sent every later batch of that partition out of sequence,
    refused for good, so the gateway answered nothing after a broker restart. The
    producer is replaced after such a failure: the next deliveries are acknowledged."""
    topic = unique("small")

    async def run() -> list[bool]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            config = {"max.message.bytes": "2000"}
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
        finally:
            await admin.close()
        async with Producer(kafka_bootstrap, topic=topic, timeout_s=5) as producer:
            small, large = [b"x" * 100], [b"x" * 5000]
            return [await producer.deliver(b"k", v, 5) for v in (small, large, small, small)]

    assert asyncio.run(run()) == [True, False, True, True]
