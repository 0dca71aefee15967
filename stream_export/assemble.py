"""The assemble agent: steps topic -> open episodes in Faust tables -> episodes topic.

The rules live in :mod:`stream_export.episode_state`; this module is the I/O
around them. Per batch of step events (``stream.take_events``), in this order:

1. decode each event (undecodable input -> dead-letter topic, stage ``decode``)
   and apply it to its partition's state; rejected events -> dead-letter topic;
2. close due episodes and publish the finished ones to the episodes topic;
3. wait until every message sent in 1-2 is acknowledged by the broker;
4. write one chunk per episode that gained events (open-episodes table), then
   the markers of the episodes published in 2 (closed-episodes table);
5. delete the chunks of episodes whose marker the broker has acknowledged.

Faust commits the batch's source offsets only after the batch (and after
flushing the producer), so a crash at any point replays events whose effects are
partly stored; the state machine recognises them by offset. Step 3 before 4 is
what makes a stored chunk or marker imply that everything decided before it was
delivered. A partition that goes quiet still closes its episodes: a timer sends
a control tick (a message with the ``x-stream-export-control: tick`` header, never
an event) to each of this worker's quiet partitions, and the tick is handled in
log order like any event.

Both tables are plain Faust tables with our own expiry; see README "Assembly"
for why windowed tables are not used.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import faust
from faust.streams import _current_event

from stream_export import dlq
from stream_export.app import Topics
from stream_export.config import Settings
from stream_export.episode_state import (
    CONFLICT,
    LATE,
    Finished,
    OpenEpisode,
    PartitionState,
    Rejected,
    Verdict,
    build_episode,
    decode_index,
)
from stream_export.errors import DecodeError, EpisodeError
from stream_export.events import decode_event, encode
from stream_export.metrics import Metrics

log = logging.getLogger(__name__)

CONTROL_HEADER: Final = "x-stream-export-control"
TICK: Final = b"tick"
OPEN_TABLE: Final = "assemble-open"
CLOSED_TABLE: Final = "assemble-closed"
_TIMEOUTS: Final = frozenset({"timeout", "max_duration"})
#: RocksDB per table partition: small memtables, the events are written once.
_ROCKSDB: Final = {"write_buffer_size": 8 * 1024 * 1024, "block_cache_size": 32 * 1024 * 1024}


@contextmanager
def _partition_of(event: Any) -> Iterator[None]:
    """Make ``event`` the current event, so table writes go to its partition.

    Faust takes the partition of a table write (local store and changelog) from
    the current event; batches and ticks are handled outside Faust's per-event
    iteration, so we name the partition explicitly.
    """
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


class _Tracked:
    """A topic whose sends are remembered, to wait for their delivery in step 3."""

    def __init__(self, topic: Any) -> None:
        self.topic = topic
        self.pending: list[asyncio.Future[Any]] = []

    async def send(self, **kwargs: Any) -> Any:
        fut = await self.topic.send(**kwargs)
        self.pending.append(fut)
        return fut

    async def delivered(self) -> None:
        pending, self.pending = self.pending, []
        if pending:
            await asyncio.gather(*pending)


class _TableStore:
    def __init__(self, open_table: Any, closed_table: Any) -> None:
        self._open = open_table.data
        self._closed = closed_table.data

    def chunk(self, key: bytes) -> bytes | None:
        value: bytes | None = self._open.get(key)
        return value

    def marker(self, key: bytes) -> bytes | None:
        value: bytes | None = self._closed.get(key)
        return value


class Assembler:
    """Owns the per-partition states of this worker and does their I/O."""

    def __init__(self, app: faust.App, topics: Topics, settings: Settings, metrics: Metrics):
        self.app = app
        self.topics = topics
        self.settings = settings
        self.metrics = metrics
        a = settings.assemble
        n = settings.topics.partitions
        self.open_table = app.Table(
            OPEN_TABLE,
            key_type=bytes,
            value_type=bytes,
            partitions=n,
            options={**_ROCKSDB, "ttl": int(a.window_expires_s)},
            extra_topic_configs=_retention(a.window_expires_s),
        )
        self.closed_table = app.Table(
            CLOSED_TABLE,
            key_type=bytes,
            value_type=bytes,
            partitions=n,
            options={**_ROCKSDB, "ttl": int(a.closed_retention_s)},
            extra_topic_configs=_retention(a.closed_retention_s),
        )
        self.store = _TableStore(self.open_table, self.closed_table)
        self.partitions: dict[int, PartitionState] = {}
        #: Published episodes whose marker is on its way, per partition.
        self.closing: dict[int, list[tuple[asyncio.Future[Any], OpenEpisode]]] = {}
        self.sent = _Tracked(topics.episodes)
        self.dead_letters = _Tracked(topics.dead_letters)
        self.tick_interval = min(5.0, max(0.05, a.quiet_partition_s / 4))

    # -- batches ----------------------------------------------------------------

    async def handle(self, events: list[Any]) -> None:
        wall = time.time()
        groups: dict[int, list[Any]] = {}
        for event in events:
            groups.setdefault(event.message.partition, []).append(event)
        finished: dict[int, list[Finished]] = {}
        for p, group in groups.items():
            state = self.partitions.get(p)
            if state is None:
                raise RuntimeError(f"steps partition {p} is not assigned to this worker")
            for event in group:
                await self._one(state, event, wall)
            state.sweep()
            finished[p] = state.take_finished()
            for item in finished[p]:
                await self._publish(p, item)
        await self.sent.delivered()
        await self.dead_letters.delivered()
        for p, group in groups.items():
            with _partition_of(group[-1]):
                self._store(self.partitions[p], finished[p])

    async def _one(self, state: PartitionState, event: Any, wall: float) -> None:
        message = event.message
        if event.headers and event.headers.get(CONTROL_HEADER) == TICK:
            state.tick(message.offset, wall)
            return
        key, raw, m = event.key, event.value, self.metrics
        try:
            decoded = decode_event(raw, max_bytes=self.settings.assemble.max_event_bytes)
        except DecodeError as exc:
            m.events_invalid.labels(exc.reason).inc()
            await self._dead_letter(message, key, raw, exc, "decode")
            return
        m.events_consumed.labels(decoded.__struct_config__.tag).inc()
        if key != decoded.episode_id.encode():
            result: Verdict | Rejected = Rejected(
                "key_mismatch", f"message key {key!r} is not the episode_id"
            )
        else:
            result = state.apply(decoded, key, raw, message.offset, wall)
        if result is Verdict.ACCEPTED:
            m.steps_accepted.inc()
        elif result is Verdict.DUPLICATE:
            m.steps_duplicate.inc()
        elif result is Verdict.REPLAYED:
            m.events_replayed.inc()
        elif isinstance(result, Rejected):
            if result.reason == LATE:
                m.events_late.inc()
            elif result.reason == CONFLICT:
                m.steps_conflicting.inc()
            else:
                m.events_invalid.labels(result.reason).inc()
            error = EpisodeError(result.detail, reason=result.reason)
            await self._dead_letter(message, key, raw, error, "assemble")

    async def _dead_letter(
        self, message: Any, key: bytes | None, raw: bytes, error: Any, stage: str
    ) -> None:
        source = dlq.Source(message.topic, message.partition, message.offset)
        await dlq.send(
            self.dead_letters,
            self.metrics,
            key=key,
            value=raw,
            error=error,
            source=source,
            stage=stage,
        )

    async def _publish(self, partition: int, item: Finished) -> None:
        """Publish one closed episode (or dead-letter it, or drop it by policy)."""
        ep, m = item.episode, self.metrics
        timed_out = ep.close_reason in _TIMEOUTS
        if timed_out and self.settings.assemble.timeout_policy == "drop":
            m.episodes_timed_out.labels("drop").inc()
            return
        episode = build_episode(partition, item)
        if episode is None:
            if timed_out:
                m.episodes_timed_out.labels("dead_letter").inc()
            error = EpisodeError(
                f"episode {ep.eid!r} closed ({ep.close_reason}) without its start event",
                reason="missing_start",
            )
            for part in item.parts:
                source = dlq.Source(self.topics.steps.get_topic_name(), partition, part.offset)
                await dlq.send(
                    self.dead_letters,
                    m,
                    key=ep.key,
                    value=part.raw,
                    error=error,
                    source=source,
                    stage="assemble",
                )
            return
        await self.sent.send(key=ep.key, value=encode(episode))
        m.episodes_emitted.labels(episode.outcome).inc()
        if timed_out:
            m.episodes_timed_out.labels("emit").inc()
        if episode.truncated_reason is not None:
            m.episodes_truncated.labels(episode.truncated_reason).inc()
        m.episode_steps.observe(len(episode.steps))
        m.episode_duration_seconds.observe(episode.duration)

    def _store(self, state: PartitionState, finished: list[Finished]) -> None:
        """Steps 4 and 5 for one partition (runs in that partition's context)."""
        table = self.open_table
        for key, value in state.flush():
            table[key] = value
        for key in state.garbage:
            table.pop(key, None)
        state.garbage.clear()
        closing = self.closing.setdefault(state.partition, [])
        still = []
        for fut, ep in closing:
            if not fut.done():
                still.append((fut, ep))
                continue
            fut.result()
            for key in state.forget(ep):
                table.pop(key, None)
        for item in finished:
            marker = state.marker(item.episode)
            self.closed_table.data[item.episode.key] = marker
            fut = self.closed_table.send_changelog(state.partition, item.episode.key, marker)
            still.append((fut, item.episode))
        self.closing[state.partition] = still
        self.metrics.open_episodes.labels(str(state.partition)).set(state.open_count)

    # -- ticks and recovery -------------------------------------------------------

    async def send_ticks(self) -> None:
        """Send a control tick to each of our partitions that needs one to make progress."""
        wall = time.time()
        for p, state in list(self.partitions.items()):
            if self.closing.get(p) or state.wants_tick(wall):
                await self._tick(p)

    async def _tick(self, partition: int) -> None:
        await self.topics.steps.send(
            key=b"", value=b"", partition=partition, headers=[(CONTROL_HEADER, TICK)]
        )

    async def recover(self) -> None:
        """Rebuild the partition states after recovery (startup and every rebalance)."""
        try:
            markers = [fut for items in self.closing.values() for fut, _ in items]
            if markers:
                # A marker must be durable before the chunks it makes garbage go.
                await asyncio.gather(*markers)
            await self._rebuild()
        except Exception as exc:
            log.exception("assemble: rebuilding the open episodes failed")
            await self.app.crash(exc)

    async def _rebuild(self) -> None:
        started = time.monotonic()
        steps = self.topics.steps.get_topic_name()
        assigned = sorted(
            tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == steps
        )
        for p in self.partitions.keys() - set(assigned):
            self.metrics.open_episodes.remove(str(p))
        wall = time.time()
        states = {p: PartitionState(p, self.settings.assemble, self.store) for p in assigned}
        chunks: dict[int, list[Any]] = {p: [] for p in assigned}
        for key, value in self.open_table.data.items():
            index = decode_index(value)
            if index.partition in chunks:
                chunks[index.partition].append((key, index))
        for p, state in states.items():
            state.load(chunks[p], wall)
            self.metrics.open_episodes.labels(str(p)).set(state.open_count)
        self.partitions, self.closing = states, {}
        log.info(
            "assemble: %d open episodes on partitions %s rebuilt in %.2fs",
            sum(s.open_count for s in states.values()),
            assigned,
            time.monotonic() - started,
        )
        for p in assigned:
            await self._tick(p)

    def summary(self) -> str:
        """One line with this worker's assembly counters (logged at shutdown)."""
        totals: dict[str, float] = {}
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    name = sample.name.removeprefix("stream_export_").removesuffix("_total")
                    totals[name] = totals.get(name, 0) + sample.value
        names = (
            "steps_accepted",
            "steps_duplicate",
            "steps_conflicting",
            "events_late",
            "events_replayed",
            "events_invalid",
            "episodes_emitted",
            "episodes_timed_out",
            "episodes_truncated",
        )
        return " ".join(f"{name}={int(totals.get(name, 0))}" for name in names)


def _retention(seconds: float) -> dict[str, str]:
    """Changelog topics compact, and drop records older than the backstop expiry."""
    return {"cleanup.policy": "compact,delete", "retention.ms": str(int(seconds * 1000))}


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> Assembler:
    """Declare the assemble agent, its tables, its tick timer and its recovery hook."""
    assembler = Assembler(app, topics, settings, metrics)
    a = settings.assemble
    assembler.open_table.on_recover(assembler.recover)

    @app.agent(topics.steps, name="assemble")
    async def assemble(stream: Any) -> None:
        try:
            # noack: a batch is acknowledged only once it is fully handled, so a
            # failed batch is never committed.
            async for events in stream.noack_take(a.batch_max_events, a.batch_max_wait_s):
                await assembler.handle(events)
                for event in events:
                    await stream.ack(event)
        except Exception as exc:
            # Unacknowledged events would block every later commit: stop the
            # worker instead, so that a restart replays them.
            log.exception("assemble: batch failed")
            await app.crash(exc)
            raise
        finally:
            log.info("assemble summary: %s", assembler.summary())

    app.timer(assembler.tick_interval, name="assemble-ticks")(assembler.send_ticks)

    return assembler
