"""Faust application factory: broker, store, topics and tables for one worker.

All topics carry raw bytes; stream-export decodes with msgspec itself (faster than
faust's codecs, and bad input becomes a typed error instead of a crashed agent).

Faust's Kafka transport is replaced by a thin subclass (:class:`_Transport`) for
broker outages: its consumer and producer retry with
:data:`~stream_export.connection.RETRY_BACKOFF_MS` between attempts (Faust has no
setting for it; aiokafka's 100 ms default turns an outage into a retry loop), and
nothing it does waits for ever for an absent broker: commits are bounded, and
so are the producer's flush and stop when the worker stops (SIGTERM during an
outage), and its consumer thread stops even when aiokafka's consumer raises on
the way out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_kafka

from stream_export.config import Settings
from stream_export.connection import (
    COMMIT_TIMEOUT_S,
    RETRY_BACKOFF_MS,
    STOP_FLUSH_TIMEOUT_S,
    sasl,
    ssl_context,
)

log = logging.getLogger(__name__)

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


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # Faust passes no retry_backoff_ms; both are read when the consumer starts.
        consumer._retry_backoff_ms = RETRY_BACKOFF_MS
        consumer._client._retry_backoff = RETRY_BACKOFF_MS / 1000
        return consumer

    async def _commit(self, offsets: Mapping[Any, int]) -> bool:
        """Faust's commit, given up after COMMIT_TIMEOUT_S (Faust retries it later).

        Unbounded, a commit started while the broker is away never returns, and
        a stopping worker waits for it before its own last commit.
        """
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                return bool(await super()._commit(offsets))
        except TimeoutError:
            log.warning("assemble: offset commit timed out after %.0fs", COMMIT_TIMEOUT_S)
            return False

    async def on_thread_stop(self) -> None:
        """Stop the consumer; a CancelledError from inside it does not stop the thread's
        shutdown.

        With the broker away, aiokafka's fetcher sits in its retry sleep; its
        ``close()`` cancels that task and re-raises the CancelledError. Unhandled,
        it ends the thread before it reports its shutdown, and the worker waits
        out mode's 60 s shutdown timeout instead of exiting.
        """
        try:
            await super().on_thread_stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.warning("assemble: the consumer stopped without reaching the broker")


class _Consumer(faust_kafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Producer(faust_kafka.Producer):
    def _settings_default(self) -> Mapping[str, Any]:
        return {**super()._settings_default(), "retry_backoff_ms": RETRY_BACKOFF_MS}

    async def flush(self) -> None:
        """Faust's flush; once the app stops, bounded by STOP_FLUSH_TIMEOUT_S (without
        the broker, aiokafka waits for delivery until the request timeout, 20 min)."""
        if not self.app.should_stop:
            await super().flush()
            return
        await _bounded(super().flush(), "flush")

    async def on_stop(self) -> None:
        """Stop, waiting at most STOP_FLUSH_TIMEOUT_S for undelivered messages."""
        await _bounded(super().on_stop(), "stop")


async def _bounded(step: Coroutine[Any, Any, None], what: str) -> None:
    try:
        async with asyncio.timeout(STOP_FLUSH_TIMEOUT_S):
            await step
    except TimeoutError:
        log.warning(
            "assemble: producer %s gave up after %.0fs; the unacknowledged events behind "
            "undelivered messages are handled again on restart",
            what,
            STOP_FLUSH_TIMEOUT_S,
        )


class _Transport(faust_kafka.Transport):
    Consumer = _Consumer
    Producer = _Producer


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
        # Episodes may be as large as assemble.max_episode_bytes (the topic specs
        # allow that plus 64 KiB of envelope).
        producer_max_request_size=settings.assemble.max_episode_bytes + 65_536,
        broker_client_id=settings.kafka.client_id,
        # Static membership, as for the sink: after a kill -9 the restarted worker
        # rejoins as the same member instead of waiting out its old session.
        consumer_group_instance_id=f"{settings.worker.worker_id}-assemble",
        broker_session_timeout=settings.worker.session_timeout_s,
        broker_credentials=broker_credentials(settings),
        **overrides,
    )
    app.transport = _Transport(app.conf.broker_consumer, app)
    return app


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    t, n = settings.topics, settings.topics.partitions
    return Topics(
        steps=app.topic(t.steps, schema=RAW, partitions=n),
        episodes=app.topic(t.episodes, schema=RAW, partitions=n),
        dead_letters=app.topic(t.dead_letters, schema=RAW, partitions=n),
    )
