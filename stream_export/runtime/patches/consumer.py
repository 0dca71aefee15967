"""The worker's Faust consumer, patched:

- **Batches** (:class:`Consumer`): the records Faust's consumer fetched for a
  stateful stage's input topic (the steps topic, the groups repartition topic)
  are handed to that stage's runner whole (:class:`Batches`, ``runtime/runner.py``),
  instead of one by one through Faust's per-message path
  (``Consumer._drain_messages``: a ``wait_first`` with four tasks per message, an
  ``Event``, a queue, a sleep per event). Faust keeps the group, assignment, flow
  control, tables, recovery and offset commits; the stage says how far each
  partition may be committed (:meth:`Consumer.acknowledge`), and Faust's commit
  loop commits that, and nothing before the stage has persisted it. Other topics
  (the changelogs, the episodes topic the sinks read) keep Faust's stock path.
- **Records lost after a recovery** (:class:`Consumer`): two ways Faust's fetcher
  dropped records of stream partitions once the tables were recovered, each with
  the fetch position and Faust's read offset already past them (the partition's
  next records then look like a gap, which Faust commits over). Faust resumes the
  stream partitions, seeks them and only then resumes the flow, which empties
  every stream's queue, while its fetcher, started for the changelogs, runs all
  along: the consumer keeps those partitions paused until the flow resumes. And
  Faust hands the fetch its live set of active partitions, which pausing the
  changelogs can empty while the fetch waits, and aiokafka reads an empty set as
  every partition: the consumer passes a copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from stream_export.kafka.connection import (
    COMMIT_TIMEOUT_S,
    FETCH_MAX_WAIT_MS,
    RETRY_BACKOFF_MS,
    STOP_FLUSH_TIMEOUT_S,
)
from stream_export.runtime import shutdown

log = logging.getLogger(__name__)


class Batches(Protocol):
    """Takes the fetched records of one topic whole (a stage's runner)."""

    topic: str

    async def on_batch(self, records: Mapping[int, Sequence[Any]]) -> None:
        """Handle the records fetched for each partition (aiokafka ``ConsumerRecord``s,
        in offset order)."""

    async def drain(self) -> bool:
        """Make everything handled durable and acknowledged: Faust commits next
        (a rebalance or the worker stopping); False when it gave up."""


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # Faust passes no retry_backoff_ms and fixes fetch_max_wait_ms at 1.5 s;
        # all three are read when the consumer starts.
        consumer._retry_backoff_ms = RETRY_BACKOFF_MS
        consumer._client._retry_backoff = RETRY_BACKOFF_MS / 1000
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    async def _commit(self, offsets: Mapping[Any, int]) -> bool:
        """Faust's commit, given up after COMMIT_TIMEOUT_S (Faust retries it later; when
        the worker stops, sooner if the stop budget is spent: shutdown.stop_wait).

        Unbounded, a commit started while the broker is away never returns, and
        a stopping worker waits for it before its own last commit.
        """
        bound = shutdown.stop_wait(self.consumer.app, COMMIT_TIMEOUT_S)
        try:
            async with asyncio.timeout(bound):
                return bool(await super()._commit(offsets))
        except TimeoutError:
            log.warning("assemble: offset commit timed out after %.0fs", bound)
            return False

    def _stopped_set(self) -> None:
        """mode's stopped flag, set through the thread's loop unless that loop has
        already closed (the thread ended first: nothing waits on it any more).

        Unguarded, a worker stopping on an error (a sink that refuses its folder)
        could log mode's "Event loop is closed" traceback on its way out.
        """
        if not self.thread_loop.is_closed():
            super()._stopped_set()

    async def on_thread_stop(self) -> None:
        """Stop the consumer, within the stop budget (shutdown.stop_wait: it waits for
        aiokafka's group coordination, and mode waits for this thread without a
        bound); a CancelledError from inside it does not stop the thread's shutdown.

        With the broker away, aiokafka's fetcher sits in its retry sleep; its
        ``close()`` cancels that task and re-raises the CancelledError. Unhandled,
        it ends the thread before it reports its shutdown, and the worker waits
        out mode's 60 s shutdown timeout instead of exiting.
        """
        try:
            await shutdown.bounded(
                self.consumer.app,
                super().on_thread_stop(),
                "assemble: the consumer's stop gave up after %.0fs",
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.warning("assemble: the consumer stopped without reaching the broker")


class Consumer(faust_kafka.Consumer):
    """Faust's consumer, handing the records of each of :attr:`batches`' topics over whole.

    Faust's own bookkeeping of acknowledged offsets (and of gaps, which it treats
    as acknowledged) is not used for that topic: what may be committed is exactly
    what the assembler acknowledged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The offset each partition of the batch topic may be committed up to.
        self.acknowledged: dict[TP, int] = {}
        #: Between Faust's end of recovery and its resumed flow: the partitions it
        #: resumed meanwhile, still paused (None: none held).
        self.held_resumes: set[TP] | None = None
        #: Whether the stages acknowledged all they had handled when the worker
        #: stopped (None: not drained for the stop yet).
        self.drained_at_stop: bool | None = None
        self.app.on_rebalance_complete.connect(self._hold_resumes)

    def _hold_resumes(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Faust's signal at the end of recovery, before it resumes and seeks."""
        self.held_resumes = set()

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        if self.held_resumes is not None:
            self.held_resumes.update(tps)
            return
        super().resume_partitions(tps)

    def resume_flow(self) -> None:
        """Resume the partitions held since recovery ended (the streams' queues were
        emptied just before: nothing fetched from here on is dropped), then the flow."""
        held, self.held_resumes = self.held_resumes, None
        if held:
            super().resume_partitions(held)
        super().resume_flow()

    @property
    def batches(self) -> Mapping[str, Batches]:
        batches: Mapping[str, Batches] = getattr(self.transport, "batches", {})
        return batches

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(
        self,
        active_partitions: set[TP] | None,
        timeout: float,  # noqa: ASYNC109 (Faust's signature)
    ) -> Any:
        generation = self.app.consumer_generation_id
        # A copy of Faust's live set (see the module's docstring): emptied during the
        # fetch, aiokafka would hand over the records of every partition.
        asked = None if active_partitions is None else set(active_partitions)
        records = await super()._getmany(asked, timeout)
        batches = self.batches
        if not batches or not records:
            return records
        ours = {tp: batch for tp, batch in records.items() if tp.topic in batches}
        if not ours:
            return records
        records = {tp: batch for tp, batch in records.items() if tp.topic not in batches}
        if (
            not self.flow_active
            or self.should_stop
            or generation != self.app.consumer_generation_id
        ):
            # As Faust drops a fetch that a rebalance overtook: the partitions are
            # sought back to their committed offsets and read again.
            return records
        now = time.monotonic()
        taken: dict[str, dict[int, Any]] = {}
        for tp, batch in ours.items():
            self.app.monitor.stream_inbound_time[tp] = now  # Faust's stream-idle warnings
            if active_partitions is None or tp in active_partitions:
                taken.setdefault(tp.topic, {})[tp.partition] = batch
        for topic, partitions in taken.items():
            await batches[topic].on_batch(partitions)
        return records

    def acknowledge(self, topic: str, offsets: Mapping[int, int]) -> None:
        """Let the commit loop commit each partition of a batch topic up to its offset."""
        for partition, offset in offsets.items():
            self.acknowledged[TP(topic, partition)] = offset

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterator[TP]:
        yield from super()._filter_tps_with_pending_acks(topics)
        for tp in list(self.acknowledged):
            if topics is None or tp in topics or tp.topic in topics:
                yield tp

    def _new_offset(self, tp: TP) -> int | None:
        if tp in self.acknowledged:
            return self.acknowledged[tp]
        offset: int | None = super()._new_offset(tp)
        return offset

    async def wait_empty(self) -> None:
        """Faust's wait for every message to be acknowledged (before its commit at a
        rebalance or stop): every stage first makes what it handled durable and
        acknowledged (:class:`Batches`).

        When the worker stops, every wait here is bounded (shutdown.stop_wait): a
        stage gives up after STOP_FLUSH_TIMEOUT_S (without the broker nothing is
        delivered), and so does Faust's wait for acknowledgements still missing then,
        which would otherwise last as long as an outage. Faust asks twice (the app
        stopping, then the consumer): the stages are drained once. Offsets of what
        was not acknowledged are not committed: a restart handles it again.
        """
        if not self.app.should_stop:
            await self._drain()
            await super().wait_empty()
            return
        if self.drained_at_stop is None:
            self.drained_at_stop = await self._drain() and await self._acknowledged()
            if not self.drained_at_stop:
                log.warning(
                    "worker: %d messages were not acknowledged when it stopped; they are "
                    "handled again on restart",
                    len(self._unacked_messages),
                )
        await self.commit_and_end_transactions()

    async def _acknowledged(self) -> bool:
        """Faust's wait for the stream events in flight, within the stop budget;
        whether they were all acknowledged."""
        try:
            async with asyncio.timeout(shutdown.stop_wait(self.app, STOP_FLUSH_TIMEOUT_S)):
                await super().wait_empty()
        except TimeoutError:
            return False
        return True

    async def _drain(self) -> bool:
        """Drain every stage, all at once; whether each acknowledged all it had
        handled."""
        drained = await asyncio.gather(*(b.drain() for b in self.batches.values()))
        return all(drained)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        await super().on_partitions_revoked(revoked)
        for tp in revoked:
            self.acknowledged.pop(tp, None)
        if self.held_resumes is not None:
            self.held_resumes -= revoked


def consumer(app: faust.App) -> Consumer:
    found = app.consumer
    assert isinstance(found, Consumer), "the app's transport is not adapter.Transport"
    return found
