"""The worker's Faust producer, patched:

- **Retries and outages** (:class:`Transport`): one retry a second instead of ten,
  a short fetch wait, bounded commits, a bounded producer flush and stop, and a
  consumer thread that stops even when aiokafka raises on the way out or its loop
  has already closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_kafka

from stream_export.kafka.connection import (
    RETRY_BACKOFF_MS,
)
from stream_export.runtime import shutdown

log = logging.getLogger(__name__)


class Producer(faust_kafka.Producer):
    def _settings_default(self) -> Mapping[str, Any]:
        return {**super()._settings_default(), "retry_backoff_ms": RETRY_BACKOFF_MS}

    async def flush(self) -> None:
        """Faust's flush; once the app stops, bounded by STOP_FLUSH_TIMEOUT_S and the
        stop budget (shutdown.stop_wait). Without the broker, aiokafka waits for
        delivery until the request timeout (20 min), and each of Faust's commits
        flushes first: a flush that began before the stop is bounded too (the last
        commit waits for the commit running)."""
        flush = asyncio.ensure_future(super().flush())
        stopping = asyncio.ensure_future(self.app.wait_until_stopped())
        try:
            await asyncio.wait({flush, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            flush.cancel()
            raise
        finally:
            stopping.cancel()
        if flush.done():
            flush.result()
        else:
            await shutdown.bounded(self.app, flush, _PRODUCER_GAVE_UP.format(what="flush"))

    async def on_stop(self) -> None:
        """Stop, waiting at most STOP_FLUSH_TIMEOUT_S (and the stop budget) for
        undelivered messages."""
        await shutdown.bounded(self.app, super().on_stop(), _PRODUCER_GAVE_UP.format(what="stop"))


_PRODUCER_GAVE_UP = (
    "assemble: producer {what} gave up after %.0fs; the unacknowledged events behind "
    "undelivered messages are handled again on restart"
)


def raw_producer(app: faust.App) -> aiokafka.AIOKafkaProducer:
    """The aiokafka producer inside Faust's (record batches are not in Faust's API)."""
    producer: aiokafka.AIOKafkaProducer = app.producer._ensure_producer()  # type: ignore[attr-defined]
    return producer
