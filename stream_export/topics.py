"""Create the pipeline's topics before anything produces to them (walking skeleton).

Kafka's auto-creation would give a topic the broker's default partition count, and
a Faust table's changelog must match its source topic's partitions.
"""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_export.app import kafka_client_kwargs
from stream_export.config import Settings


async def ensure(settings: Settings) -> list[str]:
    """Create missing topics; return the names created."""
    t = settings.topics
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka.bootstrap_servers, **kafka_client_kwargs(settings)
    )
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(name, t.partitions, t.replication_factor)
            for name in (t.steps, t.episodes, t.dead_letters)
            if name not in existing
        ]
        if missing:
            await admin.create_topics(missing)
        return [m.name for m in missing]
    finally:
        await admin.close()
