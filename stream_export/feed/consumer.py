"""The trainer feed: batches of ready groups, episodes or token rows from the topics
the worker publishes, acknowledged after the training step.

A ``Feed`` is a Kafka consumer in the feed's own consumer group, run on an event
loop in a background thread so that a trainer's loop stays plain Python::

    with Feed(settings, "groups", group_id="trainer", batch_size=8) as feed:
        for batch in feed:
            train(batch.items)
            batch.ack()

``ack`` commits exactly the offsets the batch consumed (see ``batches``) and
returns once the broker has them; a batch never acknowledged is delivered again
to the next trainer of the group (after a crash, or a rebalance). At most
``max_inflight`` batches are out unacknowledged: asking for one more raises
FeedError. The feed's lag (messages published and not acknowledged) is a gauge
in ``registry`` and ``Feed.lag()``; a gateway can read the same lag from the
consumer group and refuse agents when the trainer falls behind.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from stream_export.contract.topics import topic_names
from stream_export.errors import FeedError
from stream_export.feed.batches import (
    Held,
    Ledger,
    Order,
    Partition,
    Reader,
    Source,
    Stale,
    next_held,
)
from stream_export.feed.metrics import FeedMetrics
from stream_export.kafka.connection import kafka_options
from stream_export.settings import Settings

T = TypeVar("T")


@dataclass
class Batch:
    """Items for one training step; ``ack()`` once the step is done. ``lags``: per
    item, how many versions its oldest integer weight version lags the trainer's
    (``current_version``; None: unknown), so a trainer can weight stale items."""

    items: list[Any]
    number: int
    _feed: Feed = field(repr=False)
    acked: bool = False
    lags: list[int | None] = field(default_factory=list)

    def ack(self) -> None:
        """Commit what this batch consumed (and any earlier batch acknowledged
        before it; nothing of partitions that moved to another trainer, which gets
        them again); raises FeedError when the broker refuses the commit."""
        if not self.acked:
            self._feed.acknowledge(self)
            self.acked = True


class _Revoked(ConsumerRebalanceListener):  # type: ignore[misc]
    """Partitions gone to another trainer: forget their batches and held messages
    (the other trainer gets them from the last acknowledged offset)."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in revoked}
        self.feed.ledger.forget(gone)
        self.feed.held = [h for h in self.feed.held if h.tp not in gone]
        self.feed.resumed -= gone

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        return None


class Feed:
    """Batches from ``source`` (``groups``, ``episodes`` or ``tokens``); see the
    module doc. With ``current_version`` each item's lag is measured; with
    ``max_weight_lag`` an item that lags more is stale: ``stale="flag"`` delivers it
    (its lag in ``Batch.lags``), ``"drop"`` skips it. ``order``: ``arrival``,
    ``oldest`` (oldest version first) or ``ready`` (earliest published first), see
    ``batches``. ``max_step_s``
    bounds a training step: a trainer silent for longer leaves the group and its
    batches go to another one. ``lookback``: messages per partition, before where
    the feed takes it up, whose records count as delivered (see ``_look_back``)."""

    def __init__(
        self,
        settings: Settings,
        source: Source = "groups",
        *,
        group_id: str,
        batch_size: int = 8,
        max_wait_s: float = 1.0,
        max_inflight: int = 1,
        max_weight_lag: int | None = None,
        current_version: Callable[[], int] | None = None,
        stale: Stale = "flag",
        order: Order = "arrival",
        max_step_s: float = 3600.0,
        lookback: int = 1000,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if batch_size < 1 or max_inflight < 1:
            raise FeedError("batch_size and max_inflight must be at least 1")
        self.settings, self.group_id = settings, group_id
        self.batch_size, self.max_wait_s, self.max_inflight = batch_size, max_wait_s, max_inflight
        self.max_step_s, self.lookback = max_step_s, lookback
        self.topic = self._topic(settings, source)
        self.reader = Reader(source, max_weight_lag, current_version, stale=stale)
        self.order = order
        self.metrics = FeedMetrics(registry)
        self.ledger = Ledger()
        self._numbers = itertools.count()
        #: Fetched messages not yet in a batch.
        self.held: list[Held] = []
        #: Partitions whose look-back is done since they were assigned.
        self.resumed: set[Partition] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._consumer: AIOKafkaConsumer | None = None

    @staticmethod
    def _topic(settings: Settings, source: Source) -> str:
        if source == "groups":
            return topic_names(settings.worker.app_id)[1]
        return settings.topics.episodes

    # -- life cycle -------------------------------------------------------------

    def __enter__(self) -> Feed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._thread.start()
        self._run(self._start())

    async def _start(self) -> None:
        consumer = AIOKafkaConsumer(
            **kafka_options(self.settings),
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_interval_ms=int(self.max_step_s * 1000),
        )
        consumer.subscribe([self.topic], listener=_Revoked(self))
        await consumer.start()
        self._consumer = consumer

    def close(self) -> None:
        """Leave the group; what was not acknowledged is delivered again."""
        if self._consumer is not None:
            self._run(self._consumer.stop())
            self._consumer = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- batches ----------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def next_batch(self, timeout_s: float | None = None) -> Batch:
        """The next batch: up to ``batch_size`` items, fewer once ``max_wait_s``
        (or ``timeout_s``) passed with at least one; waits for the first one (at
        most ``timeout_s``, then FeedError)."""
        if self.ledger.unacknowledged >= self.max_inflight:
            raise FeedError(
                f"{self.ledger.unacknowledged} batches are out unacknowledged "
                f"(max_inflight={self.max_inflight}): ack one before asking for more"
            )
        return self._run(self._next(timeout_s))

    async def _next(self, timeout_s: float | None) -> Batch:
        consumer = self._require()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        first: float | None = None
        items: list[Any] = []
        lags: list[int | None] = []
        ends: dict[Partition, int] = {}
        while True:
            for held in self._take(self.batch_size - len(items)):
                items += held.items
                lags += [held.lag] * len(held.items)
                ends[held.tp] = held.offset + 1
                if first is None and items:
                    first = time.monotonic()
            now = time.monotonic()
            past_deadline = deadline is not None and now >= deadline
            if len(items) >= self.batch_size or (
                first is not None and (now - first >= self.max_wait_s or past_deadline)
            ):
                break
            if past_deadline:
                if ends:  # only skipped messages: nothing for a trainer to acknowledge
                    number = next(self._numbers)
                    self.ledger.deliver(number, ends)
                    await self._commit(self.ledger.acknowledge(number))
                raise FeedError(f"no item from {self.topic} within {timeout_s:g} s")
            await self._fetch(consumer)
        batch = Batch(items, next(self._numbers), self, lags=lags)
        self.ledger.deliver(batch.number, ends)
        self.metrics.items.inc(len(items))
        for lag in lags:
            if lag is not None:
                self.metrics.weight_lag.observe(lag)
        return batch

    def _take(self, room: int) -> Iterator[Held]:
        """Held messages, in ``order``, while their items fit ``room`` (a message's
        items go whole into one batch, a first one whatever its size; skipped
        messages, without items, always fit)."""
        taken = 0
        while self.held:
            index = next_held(self.held, self.order)
            size = len(self.held[index].items)
            if size and taken and taken + size > room:
                return
            taken += size
            yield self.held.pop(index)

    async def _fetch(self, consumer: AIOKafkaConsumer) -> None:
        fetched = await consumer.getmany(timeout_ms=100, max_records=self.batch_size * 4)
        resumes = {
            tp: messages[0].offset
            for tp, messages in fetched.items()
            if messages and (tp.topic, tp.partition) not in self.resumed
        }
        if resumes:
            await self._look_back(resumes)
        for tp, messages in fetched.items():
            for message in messages:
                read = self.reader.read(message.value)
                if read.skip is not None:
                    self.metrics.skipped.labels(read.skip).inc()
                partition = (tp.topic, tp.partition)
                self.held.append(Held(partition, message.offset, message.timestamp, read))

    async def _look_back(self, resumes: dict[TopicPartition, int]) -> None:
        """Count the ``lookback`` messages before each partition's resume offset (where
        this feed takes it up: its group's last acknowledgement) as delivered, so that
        the second copy of a record a worker published twice is skipped after a
        trainer's restart or a rebalance too, not only within one process."""
        self.resumed |= {(tp.topic, tp.partition) for tp in resumes}
        starts = {tp: max(0, end - self.lookback) for tp, end in resumes.items()}
        wanted = {tp for tp in resumes if starts[tp] < resumes[tp]}
        if not wanted:
            return
        reader = AIOKafkaConsumer(
            **kafka_options(self.settings), enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await reader.start()
        try:
            reader.assign(list(wanted))
            for tp in wanted:
                reader.seek(tp, starts[tp])
            while wanted:
                fetched = await reader.getmany(*wanted, timeout_ms=1000, max_records=500)
                if not fetched:  # the rest compacted away, or deleted by retention
                    break
                for tp, messages in fetched.items():
                    self.reader.remember(m.value for m in messages if m.offset < resumes[tp])
                wanted = {tp for tp in wanted if await reader.position(tp) < resumes[tp]}
        finally:
            await reader.stop()

    def acknowledge(self, batch: Batch) -> None:
        """``batch.ack()``."""
        self._run(self._commit(self.ledger.acknowledge(batch.number)))
        self.metrics.acknowledged.inc(len(batch.items))

    async def _commit(self, commits: dict[Partition, int]) -> None:
        if not commits:
            return
        consumer = self._require()
        offsets = {TopicPartition(t, p): OffsetAndMetadata(o, "") for (t, p), o in commits.items()}
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            raise FeedError(
                f"acknowledgement not committed ({type(exc).__name__}): the batch's partitions "
                "moved to another trainer of the group, which gets it again"
            ) from exc
        await self._update_lag(consumer, fresh=False)

    async def _update_lag(self, consumer: AIOKafkaConsumer, fresh: bool = True) -> None:
        """Set the lag gauge. ``fresh``: the topic's end offsets asked of the broker;
        else (after an ack) the high watermarks the fetches last saw. The ask goes
        on the fetches' connection and waits behind a long-poll fetch, up to 0.5 s:
        most of an ack's time in the live loop (0.1-0.5 s of 0.5 s a step)."""
        assigned = sorted(consumer.assignment())
        if not assigned:
            return
        seen = {tp: consumer.highwater(tp) for tp in assigned}
        ends = await consumer.end_offsets(assigned) if fresh or None in seen.values() else seen
        for tp in assigned:
            committed = await consumer.committed(tp) or 0
            lag = max(0, ends[tp] - committed)
            self.metrics.lag.labels(tp.topic, str(tp.partition)).set(lag)

    def lag(self) -> int:
        """Messages on the assigned partitions not yet acknowledged (as committed)."""
        self._run(self._update_lag(self._require()))
        return int(sum(s.value for m in self.metrics.lag.collect() for s in m.samples))

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise FeedError("the feed is not started (use it in a with block, or start())")
        return self._consumer
