"""Faust's topic, with a declaration that a caller stopping cannot break, and that
returns only once the topic can be read."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import faust

from stream_export.runtime.patches import producer as adapter

log = logging.getLogger(__name__)

#: Longest wait for a declared topic to show its partitions, each with a leader.
VISIBLE_WAIT_S: Final = 30.0


class Topic(faust.Topic):
    """``maybe_declare`` runs one declaration at a time, in a task of its own that
    each caller awaits shielded.

    Faust's is mode's ``stampede``: its callers share a future, and a caller
    cancelled while it waits (the conductor's task, when the worker stops during
    start-up) cancels that future; the caller running the declaration then cannot
    set its result and crashed the worker with ``InvalidStateError``: a traceback
    and exit code 1 for a plain SIGTERM.
    """

    _declaring: asyncio.Future[None] | None = None

    async def maybe_declare(self) -> None:
        task = self._declaring
        if task is None or task.done():
            task = self._declaring = asyncio.ensure_future(self.declare())
            # Retrieved here too: a failure every caller stopped waiting for is
            # not logged as never retrieved (the next caller declares again).
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(task)

    async def declare(self) -> None:
        """Faust's declaration, then a wait until the topic shows all its partitions
        with a leader. The consumer subscribes right after the declarations; a topic
        just created (here, or by a worker started at the same moment) read as
        unknown then, so the group's assignment left its partitions out (Faust:
        "Ignoring missing topic"): a table whose changelog it was got no state at
        all, and a worker failed on the partition count 0."""
        await super().declare()
        partitions = self.partitions or self.app.conf.topic_partitions
        for name in self.topics:
            if not await visible(self.app, name, partitions, VISIBLE_WAIT_S):
                log.warning(
                    "topic %s: not all of its %d partitions have a leader after %.0fs",
                    name,
                    partitions,
                    VISIBLE_WAIT_S,
                )


async def visible(app: Any, topic: str, partitions: int, timeout_s: float) -> bool:
    """Wait until the producer's metadata shows ``topic`` with ``partitions``
    partitions, each with a leader (False: not within ``timeout_s``)."""
    client = adapter.raw_producer(app).client
    deadline = time.monotonic() + timeout_s
    await client.add_topic(topic)
    while len(client.cluster.available_partitions_for_topic(topic) or ()) < partitions:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
        await client.force_metadata_update()
    return True
