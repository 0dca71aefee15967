"""Faust application factory: broker, store, topics and tables for one worker.

All topics carry raw bytes; stream-export decodes with msgspec itself (faster than
faust's codecs, and bad input becomes a typed error instead of a crashed agent).

Faust's Kafka transport is replaced by :class:`stream_export.runtime.patches.transport.Transport`:
it hands the steps topic's fetched records to the assembler whole, and retries
and waits as an outage needs (see :mod:`.adapter`); so do the worker's other
aiokafka clients' metadata refreshes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust

from stream_export.kafka.connection import pace_metadata_refreshes, sasl, ssl_context
from stream_export.runtime.patches.tables import TableManager
from stream_export.runtime.patches.transport import Transport
from stream_export.runtime.topic import Topic
from stream_export.settings import Settings

RAW: faust.Schema[bytes, bytes] = faust.Schema(
    key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)


@dataclass(frozen=True)
class Topics:
    steps: Any
    episodes: Any
    dead_letters: Any


def broker_url(settings: Settings) -> str:
    return ";".join(f"kafka://{h.strip()}" for h in settings.kafka.bootstrap_servers.split(","))


def broker_credentials(settings: Settings) -> faust.types.auth.CredentialsT | None:
    """The same security settings as Faust ``broker_credentials`` (None for PLAINTEXT)."""
    context = ssl_context(settings)
    login = sasl(settings)
    if login is not None:
        mechanism, username, password = login
        return faust.SASLCredentials(
            username=username, password=password, ssl_context=context, mechanism=mechanism
        )
    return faust.SSLCredentials(context) if context is not None else None


def create_app(settings: Settings, **overrides: Any) -> faust.App:
    """A Faust app configured from settings (at-least-once; see README on guarantees)."""
    app = faust.App(
        settings.worker.app_id,
        broker=broker_url(settings),
        store=settings.worker.store,
        datadir=settings.worker.data_dir,
        topic_partitions=settings.topics.partitions,
        topic_replication_factor=settings.topics.replication_factor,
        processing_guarantee="at_least_once",
        web_enabled=False,
        autodiscover=False,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # Episodes and group records may be as large as assemble.max_record_bytes
        # (the topics the worker writes take that: kafka.topics.wanted).
        producer_max_request_size=settings.assemble.max_message_bytes,
        # The assembler appends episodes, markers and chunks to record batches of
        # this size (16 KiB by default: a produce request every few episodes).
        # aiokafka holds one batch per topic partition until it is sent, and
        # sends one request per broker at a time, so each full batch makes the
        # next wait a produce round trip: at 256 KiB token-level episodes (~100 kB)
        # filled one every two or three, and publishing them waited ~2.5 s of every
        # 25 s at 600 messages/s (bench.tokens, README "Token plane"). 1,000,000
        # bytes stays below the broker's default max.message.bytes (1,048,588),
        # which the changelogs keep.
        producer_max_batch_size=1_000_000,
        broker_client_id=settings.kafka.client_id,
        # Static membership, as for the sink: after a kill -9 the restarted worker
        # rejoins as the same member instead of waiting out its old session.
        consumer_group_instance_id=f"{settings.worker.worker_id}-assemble",
        broker_session_timeout=settings.worker.session_timeout_s,
        broker_credentials=broker_credentials(settings),
        Topic=Topic,
        TableManager=TableManager,
        **{
            # Faust's leader topic never carries data; every worker would fetch it.
            "topic_disable_leader": True,
            **overrides,
        },
    )
    app.transport = Transport(app.conf.broker_consumer, app)
    pace_metadata_refreshes()  # every client in the process: Faust's, the sinks'
    return app


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    t, n = settings.topics, settings.topics.partitions
    return Topics(
        steps=app.topic(t.steps, schema=RAW, partitions=n),
        episodes=app.topic(t.episodes, schema=RAW, partitions=n),
        dead_letters=app.topic(t.dead_letters, schema=RAW, partitions=n),
    )
