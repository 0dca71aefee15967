"""A :class:`.stage.Stage` run on Faust: batch intake, timers, ticks, rebuilds.

Faust's consumer hands each fetched batch of a stage's input topic to
:meth:`Runner.on_batch` whole (:mod:`.adapter`), and its messages are applied in
offset order (:meth:`.stage.Stage.take`, which also reads back any gap with
:class:`.gaps.GapReader`). A batch ends after ``batch_max_events`` messages or
``batch_max_wait_s``; what it handled is persisted at least every
``persist_interval_s``, and at once when a rebalance starts or the worker stops
(Faust's consumer asks: :meth:`Runner.drain`). After every recovery (start-up and
each rebalance) the states of the partitions this worker now owns are rebuilt from
the tables and positioned at their committed offsets (:meth:`Runner.recover`).

A partition that goes quiet still makes progress: a timer sends a control tick (a
message with the ``x-stream-export-control: tick`` header, never data) to each of
the stage's partitions whose logic asks for one, and to every partition after a
rebuild; the tick is handled in log order like any message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic

import faust
from aiokafka import ConsumerRecord

from stream_export.errors import ConfigError
from stream_export.runtime import shutdown
from stream_export.runtime.gaps import GapReader
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.patches import consumer as adapter
from stream_export.runtime.patches import transport
from stream_export.runtime.stage import CONTROL_HEADER, TICK, Logic, Outbox, S, Stage, Window
from stream_export.settings import Settings

log = logging.getLogger(__name__)


def tick_interval(settings: Settings) -> float:
    """How often ticks are sent: often enough to notice a quiet partition in time."""
    return min(5.0, max(0.05, settings.assemble.quiet_partition_s / 4))


class Runner(Generic[S]):
    """Runs one stage's :class:`.stage.Stage` for the partitions of ``topic`` this
    worker is assigned."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        metrics: Metrics,
        logic: Logic[S],
        outbox: Outbox,
        *,
        name: str,
        topic: Any,
        window: Callable[[float], Window],
        changelogs: Sequence[str],
        wants_tick: Callable[[S, float], bool] | None = None,
    ) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics
        self.stage = Stage(logic, outbox, self.acknowledge)
        self.name = name
        self.source = topic
        #: The topic whose fetched records Faust's consumer hands over (adapter.Batches).
        self.topic: str = topic.get_topic_name()
        self.window, self.changelogs, self.wants_tick = window, changelogs, wants_tick
        self.gaps = GapReader(settings, self.topic)
        a = settings.assemble
        self.tick_interval = tick_interval(settings)
        self.check_every = max(0.02, min(a.batch_max_wait_s, a.persist_interval_s / 4))
        #: Serialises batches, batch ends, persists and rebuilds.
        self.lock = asyncio.Lock()
        #: Size and start of the batch being collected, and when the oldest message
        #: not acknowledged yet arrived.
        self.batch_size = 0
        self.batch_since = 0.0
        self.held_since = 0.0
        #: A line of the stage's counters, logged when the worker stops.
        self.summary: Callable[[], str] = lambda: ""

    async def on_batch(self, records: Mapping[int, Sequence[ConsumerRecord[Any, Any]]]) -> None:
        """Take the records fetched of each partition; end the batch when due."""
        try:
            async with self.lock:
                stage, now = self.stage, time.monotonic()
                if not stage.batch:
                    self.batch_since = now
                if not stage.pending:
                    self.held_since = now
                before = stage.pending
                for p in sorted(records):
                    await stage.take(p, records[p], self._refetch)
                self.batch_size += stage.pending - before
                a = self.settings.assemble
                if (
                    self.batch_size >= a.batch_max_events
                    or now - self.batch_since >= a.batch_max_wait_s
                ):
                    await self._finish(persist=False)
        except Exception as exc:
            await self.fail("handling a batch", exc)

    async def drain(self) -> bool:
        """Persist everything handled (adapter.Batches: Faust commits next); when the
        worker stops, bounded (shutdown.drained): giving up is a crash the protocol
        is made for (nothing it covers was acknowledged; a restart handles it again)."""

        async def finish() -> None:
            async with self.lock:
                await self._finish(persist=True)

        try:
            return await shutdown.drained(self.app, self.name, finish)
        except Exception as exc:
            await self.fail("persisting before a commit", exc)
            return False

    async def keep_going(self) -> None:
        """End a batch nobody else ends and persist handled messages when due."""
        a = self.settings.assemble
        try:
            while True:
                await asyncio.sleep(self.check_every)
                stage, now = self.stage, time.monotonic()
                late_batch = stage.batch and now - self.batch_since >= a.batch_max_wait_s
                if late_batch or (stage.pending and self._persist_due()):
                    async with self.lock:
                        await self._finish(persist=False)
        except Exception as exc:
            await self.fail("ending a batch", exc)
        finally:
            await self.gaps.close()

    async def fail(self, what: str, exc: BaseException) -> None:
        """Stop the worker: messages we could not handle must not be acknowledged
        (they would block every later commit), and a restart replays them."""
        log.exception("%s: %s failed", self.name, what)
        await self.app.crash(exc)

    def _persist_due(self) -> bool:
        a = self.settings.assemble
        age = time.monotonic() - self.held_since
        return age >= a.persist_interval_s or self.stage.pending >= 10 * a.batch_max_events

    async def _finish(self, *, persist: bool) -> None:
        stage = self.stage
        if stage.batch:
            self.batch_size = 0
            await stage.end_batch()
        if stage.pending and (persist or self._persist_due()):
            await stage.persist(self.window(time.time()))

    async def _refetch(self, partition: int, start: int, end: int) -> list[Any]:
        """Messages ``start`` to ``end - 1`` the consumer did not hand over (:mod:`.gaps`)."""
        found = await self.gaps.read(partition, start, end)
        if found:
            log.warning(
                "%s: partition %d: offsets %d-%d were not fetched; %d messages read again",
                self.name,
                partition,
                start,
                end - 1,
                len(found),
            )
            self.metrics.events_refetched.inc(len(found))
        return found

    def acknowledge(self, offsets: Mapping[int, int]) -> None:
        adapter.consumer(self.app).acknowledge(self.topic, offsets)

    # -- ticks and recovery -------------------------------------------------------

    async def send_ticks(self) -> None:
        """A control tick to each partition whose state needs one to make progress."""
        wants, wall = self.wants_tick, time.time()
        if wants is None:
            return
        for p, state in list(self.stage.states.items()):
            if wants(state, wall):
                await self._tick(p)

    async def _tick(self, partition: int) -> None:
        await self.source.send(
            key=b"", value=b"", partition=partition, headers=[(CONTROL_HEADER, TICK)]
        )

    async def recover(self) -> None:
        """Rebuild the states of this worker's partitions (start-up, every rebalance)."""
        try:
            async with self.lock:
                # Faust waited for these to be acknowledged before it moved the
                # partitions, so this is empty unless that wait was cut short;
                # then they are not committed and will be read again.
                self.batch_size = 0
                await self._rebuild()
        except Exception as exc:
            await self.fail("rebuilding its state", exc)

    async def _rebuild(self) -> None:
        started, consumer = time.monotonic(), self.app.consumer
        counts = {t: consumer.topic_partitions(t) for t in (self.topic, *self.changelogs)}
        known = {count for count in counts.values() if count}
        if len(known) > 1:
            # Faust checks this only in table[key] = value, which we do not use. A
            # count of 0 (None: not the group's leader) is a topic not in the
            # metadata yet, just created: not a misconfiguration (topic.Topic
            # waits for its partitions before the consumer subscribes).
            raise ConfigError(
                f"partition counts differ: {counts} (Faust tables need the same partition "
                "count as their source topic)"
            )
        assigned = sorted(
            tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == self.topic
        )
        positions = await self.gaps.positions(assigned)
        self.stage.rebuild(assigned, time.time(), positions)
        log.info("%s: rebuilt in %.2fs", self.name, time.monotonic() - started)
        if self.wants_tick is not None:
            for p in assigned:
                await self._tick(p)


def attach(app: faust.App, runner: Runner[Any], table: Any) -> None:
    """Run ``runner``: its topic's batches, its recovery after ``table``'s, its timers."""
    table.on_recover(runner.recover)
    transport.take_batches(app, runner)

    @app.agent(runner.source, name=runner.name)
    async def subscribe(stream: Any) -> None:
        """Subscribes the topic: Faust's assignment, and the tables that follow it.
        Its records reach :meth:`Runner.on_batch`, never this stream."""
        try:
            async for event in stream.noack().events():
                raise RuntimeError(
                    f"a {runner.name} message took Faust's per-message path: {event!r}"
                )
        finally:
            log.info("%s summary: %s", runner.name, runner.summary())

    app.timer(runner.tick_interval, name=f"{runner.name}-ticks")(runner.send_ticks)
    app.task(runner.keep_going)
