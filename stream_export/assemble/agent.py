"""The assemble agent: steps topic -> open episodes in Faust tables -> episodes topic.

The rules live in :mod:`stream_export.assemble.state`; this module is the I/O
around them. Faust's consumer hands each fetched batch of the steps topic to
:meth:`Assembler.on_batch` whole (:mod:`.adapter`), and its events are applied in
offset order (:meth:`.commit.Commit.take`, which also reads back any gap):

1. decode each event (undecodable input -> dead-letter topic, stage ``decode``)
   and apply it to its partition's state; rejected events -> dead-letter topic;
2. at the end of a batch (``batch_max_events`` or ``batch_max_wait_s``), close
   due episodes and publish the finished ones to the episodes topic.

Nothing is acknowledged (so no offset can be committed) until a persist
(:meth:`.commit.Commit.persist`), at least every ``persist_interval_s`` and at
once when a rebalance starts or the worker stops. It waits for every message sent in 1-2,
then writes the markers of the published episodes (closed-episodes table), then
deletes their chunks and writes one chunk per episode that gained events
(open-episodes table), and only then acknowledges the events. An episode that
finishes within that interval never reaches the open-episodes table.

Every table write is delivered to the changelog before it is applied to the
local store (see :class:`.tables.Changelog`), and each step waits for the previous
one's delivery, so a marker implies its episode was delivered and a stored chunk
implies that everything decided before it was. A crash at any point replays the
unacknowledged events onto tables that hold part of their effects; the state
machine recognises them by offset.

A partition that goes quiet still closes its episodes: a timer sends a control
tick (a message with the ``x-stream-export-control: tick`` header, never an
event) to each of this worker's quiet partitions, and the tick is handled in log
order like any event.

The open-episodes table is a Faust tumbling-window table (``assemble.window_s``,
expiring ``window_expires_s`` after the window ends): an episode's chunks are
filed under the window of its first persist, on the wall clock. The expiry is
only a backstop for abandoned state; episodes are closed by the state machine
long before. The closed-episodes table is a plain table whose RocksDB TTL and
changelog retention forget markers after ``closed_retention_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

import faust
from aiokafka import ConsumerRecord

from stream_export.assemble.chunks import ChunkKey, Window, decode_index, split_chunk_key
from stream_export.assemble.commit import Commit
from stream_export.assemble.episode import Finished, build_episode, fitted, token_outcome
from stream_export.assemble.gaps import GapReader
from stream_export.assemble.state import (
    CONFLICT,
    INTERNAL,
    LATE,
    PartitionState,
    Rejected,
    Verdict,
    receive,
)
from stream_export.config import Settings
from stream_export.errors import ConfigError, DecodeError, EpisodeError
from stream_export.events import EpisodeEnd, EpisodeStart, Step
from stream_export.kafka.connection import STOP_FLUSH_TIMEOUT_S
from stream_export.reasons import DeadLetterReason
from stream_export.runtime import adapter, dlq, pieces, shutdown, tables
from stream_export.runtime.adapter import stored_items
from stream_export.runtime.app import Topics
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.outbox import KafkaOutbox, Sender
from stream_export.runtime.tables import WINDOW_KEY_CODEC, Changelog, state_tables

log = logging.getLogger(__name__)

CONTROL_HEADER: Final = "x-stream-export-control"
TICK: Final = b"tick"
OPEN_TABLE: Final = "assemble-open"
CLOSED_TABLE: Final = "assemble-closed"
_TIMEOUTS: Final = frozenset({"timeout", "max_duration"})
MAX_BYTES: Final = DeadLetterReason.MAX_BYTES


class _TableStore:
    """One partition's view of the two tables' local stores (episode_state.Store)."""

    def __init__(self, open_table: Any, closed_table: Any, partition: int) -> None:
        self._open, self._closed = open_table, closed_table
        self.partition = partition

    def chunk(self, key: ChunkKey) -> bytes | None:
        return tables.read(self._open, self.partition, key)

    def marker(self, key: bytes) -> bytes | None:
        return tables.read(self._closed, self.partition, key)


class Assembler:
    """Owns the per-partition states of this worker and does their I/O."""

    def __init__(self, app: faust.App, topics: Topics, settings: Settings, metrics: Metrics):
        self.app = app
        self.topics = topics
        self.settings = settings
        self.metrics = metrics
        a = settings.assemble
        self.open_table, self.closed_table, self.window = state_tables(
            app,
            settings,
            metrics,
            names=(OPEN_TABLE, CLOSED_TABLE),
            closed_retention_s=a.closed_retention_s,
            episodes=self._stored_episodes,
        )
        #: Episodes and dead letters, awaited at each persist.
        self.outbox = KafkaOutbox(app)
        self.commit = Commit(
            self.outbox,
            markers=Changelog(app, self.closed_table, small=True),
            chunks=Changelog(app, self.open_table),
            publish=self._publish,
            acknowledge=self._acknowledge,
        )
        self.sent = Sender(self.outbox, topics.episodes)
        self.dead_letters = Sender(self.outbox, topics.dead_letters)
        #: The topic whose fetched records Faust's consumer hands over (adapter.Batches).
        self.topic: str = topics.steps.get_topic_name()
        self.gaps = GapReader(settings, self.topic)
        self.tick_interval = min(5.0, max(0.05, a.quiet_partition_s / 4))
        self.check_every = max(0.02, min(a.batch_max_wait_s, a.persist_interval_s / 4))
        #: Serialises events, batch ends, persists and rebuilds (the agent's loop
        #: and the background task below).
        self.lock = asyncio.Lock()
        #: Size and start of the batch being collected, and when the oldest event
        #: not acknowledged yet arrived (what and how: self.commit).
        self.batch_size = 0
        self.batch_since = 0.0
        self.held_since = 0.0
        self._consumed = {
            t.__struct_config__.tag: metrics.events_consumed.labels(t.__struct_config__.tag)
            for t in (EpisodeStart, Step, EpisodeEnd)
        }
        self._verdicts = {
            Verdict.ACCEPTED: metrics.steps_accepted,
            Verdict.DUPLICATE: metrics.steps_duplicate,
            Verdict.REPLAYED: metrics.events_replayed,
        }
        #: Counts of the batch being handled, added to their counters at its end
        #: (a counter's inc takes a lock: once a batch, not once an event).
        self.tally: Counter[Any] = Counter()

    def _stored_episodes(self) -> int:
        """How many episodes have chunks in this worker's open-episodes table."""
        keys = self.open_table.data.keys()
        return len({split_chunk_key(key)[0] for key, _window in keys if not pieces.is_key(key)})

    async def on_batch(self, records: Mapping[int, Sequence[ConsumerRecord[Any, Any]]]) -> None:
        """Step 1 for the records fetched of each partition; end the batch when due."""
        try:
            async with self.lock:
                commit = self.commit
                now = time.monotonic()
                if not commit.batch:
                    self.batch_since = now
                if not commit.pending:
                    self.held_since = now
                before = commit.pending
                for p in sorted(records):
                    if p in commit.states:
                        await commit.take(p, records[p], self._refetch, self._one)
                    # else: fetched before this partition was rebuilt; its position
                    # is then the committed offset, and the records are read again.
                self.batch_size += commit.pending - before
                self._count()
                a = self.settings.assemble
                if (
                    self.batch_size >= a.batch_max_events
                    or now - self.batch_since >= a.batch_max_wait_s
                ):
                    await self._finish(persist=False)
        except Exception as exc:
            await self.fail("handling a batch of steps", exc)

    def _count(self) -> None:
        for counter, n in self.tally.items():
            counter.inc(n)
        self.tally.clear()

    async def drain(self) -> None:
        """Persist everything handled (adapter.Batches: Faust commits next).

        When the worker stops, bounded by STOP_FLUSH_TIMEOUT_S: without the broker
        a persist never completes, and giving it up is a crash the protocol is
        made for (nothing it covers was acknowledged; a restart handles it again).
        """
        bound = shutdown.stop_wait(self.app, STOP_FLUSH_TIMEOUT_S) if self.app.should_stop else None
        try:
            async with asyncio.timeout(bound), self.lock:
                await self._finish(persist=True)
        except TimeoutError:
            log.warning(
                "assemble: the last persist gave up after %.0fs; what it held is handled "
                "again on restart",
                bound,
            )
        except Exception as exc:
            await self.fail("persisting before a commit", exc)

    def _acknowledge(self, offsets: Mapping[int, int]) -> None:
        adapter.consumer(self.app).acknowledge(offsets)

    async def _refetch(
        self, partition: int, start: int, end: int
    ) -> list[ConsumerRecord[Any, Any]]:
        """Messages ``start`` to ``end - 1`` the consumer did not hand over (:mod:`.gaps`)."""
        found = await self.gaps.read(partition, start, end)
        if found:
            log.warning(
                "assemble: partition %d: offsets %d-%d were not fetched; %d messages read again",
                partition,
                start,
                end - 1,
                len(found),
            )
            self.metrics.events_refetched.inc(len(found))
        return found

    async def keep_going(self) -> None:
        """End a batch nobody else ends and persist handled events when due (at a
        rebalance and when the worker stops, Faust's consumer asks for it:
        :meth:`drain`)."""
        a = self.settings.assemble
        try:
            while True:
                await asyncio.sleep(self.check_every)
                now = time.monotonic()
                late_batch = self.commit.batch and now - self.batch_since >= a.batch_max_wait_s
                if late_batch or (self.commit.pending and self._persist_due()):
                    async with self.lock:
                        await self._finish(persist=False)
        except Exception as exc:
            await self.fail("ending a batch", exc)
        finally:
            log.info("assemble summary: %s", self.summary())
            await self.gaps.close()

    async def fail(self, what: str, exc: BaseException) -> None:
        """Stop the worker: events we could not handle must not be acknowledged
        (they would block every later commit), and a restart replays them."""
        log.exception("assemble: %s failed", what)
        await self.app.crash(exc)

    def _persist_due(self) -> bool:
        a = self.settings.assemble
        age = time.monotonic() - self.held_since
        return age >= a.persist_interval_s or self.commit.pending >= 10 * a.batch_max_events

    async def _finish(self, *, persist: bool) -> None:
        commit = self.commit
        if commit.batch:
            self.batch_size = 0
            await commit.end_batch()
            # On their way now, not at the persist: the sink can write them while
            # the persist interval runs (the persist still awaits their delivery).
            await self.outbox.send()
        if commit.pending and (persist or self._persist_due()):
            for p in await commit.persist(self.window.current(time.time())):
                self.metrics.open_episodes.labels(str(p)).set(commit.states[p].open_count)

    async def _one(self, state: PartitionState, message: ConsumerRecord[Any, Any]) -> None:
        wall = time.time()
        if message.headers and (CONTROL_HEADER, TICK) in message.headers:
            state.tick(message.offset, min(wall, message.timestamp / 1000))  # its send time
            return
        key, raw, m = message.key, message.value, self.metrics
        try:
            kind, result, stage = receive(state, key, raw, message.offset, wall)
        except Exception as exc:  # a bug must cost one message, never the worker
            log.exception("assemble: partition %d offset %d", message.partition, message.offset)
            kind, result, stage = (
                None,
                Rejected(INTERNAL, f"{type(exc).__name__}: {exc}"),
                "assemble",
            )
        tally = self.tally
        if kind is not None:
            tally[self._consumed[kind]] += 1
        if isinstance(result, Verdict):
            tally[self._verdicts[result]] += 1
        elif isinstance(result, Rejected):
            if result.reason == LATE:
                m.events_late.inc()
            elif result.reason == CONFLICT:
                m.steps_conflicting.inc()
            else:
                m.events_invalid.labels(result.reason).inc()
            error = (DecodeError if stage == "decode" else EpisodeError)(
                result.detail, reason=result.reason
            )
            await self._dead_letter(message, key, raw, error, stage)

    async def _dead_letter(
        self, message: Any, key: bytes | None, raw: bytes | None, error: Any, stage: str
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
        limit = self.settings.assemble.max_record_bytes
        try:
            built = build_episode(partition, item)
            record = None if built is None else fitted(built, limit)
        except Exception as exc:  # a bug must cost one episode, never the worker
            log.exception("assemble: partition %d: building episode %r", partition, ep.eid)
            detail = f"episode {ep.eid!r} could not be built: {type(exc).__name__}: {exc}"
            await self._dead_letter_parts(partition, item, EpisodeError(detail, reason=INTERNAL))
            return
        if record is None:
            if timed_out:
                m.episodes_timed_out.labels("dead_letter").inc()
            if built is None:
                detail = f"episode {ep.eid!r} closed ({ep.close_reason}) without its start event"
                error = EpisodeError(detail, reason=DeadLetterReason.MISSING_START)
            else:
                detail = f"episode {ep.eid!r} does not fit {limit} bytes even without its steps"
                error = EpisodeError(detail, reason=MAX_BYTES)
            await self._dead_letter_parts(partition, item, error)
            return
        episode, value = record
        await self.sent.send(key=ep.key, value=value)
        m.episodes_emitted.labels(episode.outcome).inc()
        if timed_out:
            m.episodes_timed_out.labels("emit").inc()
        if episode.truncated_reason is not None:
            m.episodes_truncated.labels(episode.truncated_reason).inc()
        m.episode_steps.observe(len(episode.steps))
        m.episode_duration_seconds.observe(episode.duration)
        breaks, rejects = token_outcome(item, episode)
        for reason in breaks:
            m.token_breaks.labels(reason).inc()
        for rejected, error in rejects:
            await self._dead_letter_parts(partition, rejected, error)

    async def _dead_letter_parts(self, partition: int, item: Finished, error: EpisodeError) -> None:
        steps = self.topics.steps.get_topic_name()
        for part in item.parts:
            await dlq.send(
                self.dead_letters,
                self.metrics,
                key=item.episode.key,
                value=part.raw,
                error=error,
                source=dlq.Source(steps, partition, part.offset),
                stage="assemble",
            )

    # -- ticks and recovery -------------------------------------------------------

    async def send_ticks(self) -> None:
        """Send a control tick to each of our partitions that needs one to make progress."""
        wall = time.time()
        for p, state in list(self.commit.states.items()):
            if state.wants_tick(wall):
                await self._tick(p)

    async def _tick(self, partition: int) -> None:
        await self.topics.steps.send(
            key=b"", value=b"", partition=partition, headers=[(CONTROL_HEADER, TICK)]
        )

    async def recover(self) -> None:
        """Rebuild the partition states after recovery (startup and every rebalance)."""
        try:
            async with self.lock:
                # Faust waited for these to be acknowledged before it moved the
                # partitions, so this is empty unless that wait was cut short;
                # then they are not committed and will be read again.
                self.batch_size = 0
                await self._rebuild()
        except Exception as exc:
            await self.fail("rebuilding the open episodes", exc)

    async def _rebuild(self) -> None:
        started = time.monotonic()
        steps = self.topics.steps.get_topic_name()
        counts = {
            topic: self.app.consumer.topic_partitions(topic)
            for topic in (steps, self.open_table.changelog_topic.get_topic_name())
        }
        if None not in counts.values() and len(set(counts.values())) > 1:
            # Faust checks this only in table[key] = value, which we do not use.
            raise ConfigError(
                f"partition counts differ: {counts} (Faust tables need the same partition "
                "count as their source topic)"
            )
        assigned = sorted(
            tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == steps
        )
        for p in self.commit.states.keys() - set(assigned):
            self.metrics.open_episodes.remove(str(p))
        wall, window = time.time(), self.window
        both = self.open_table, self.closed_table
        states = {
            p: PartitionState(p, self.settings.assemble, _TableStore(*both, p)) for p in assigned
        }
        expired: dict[int, list[ChunkKey]] = {p: [] for p in assigned}
        windows: dict[Window, Window] = {}
        expiry = self.open_table
        expiry.expire_only(())  # restored keys are tracked again below
        stored = stored_items(self.open_table, WINDOW_KEY_CODEC.loads)
        for key, value, parts in pieces.whole_items(stored, self.open_table.data.get):
            # one tuple per window, not one per episode (see the README's figures)
            key = (key[0], windows.setdefault(key[1], key[1]))
            index = decode_index(value)
            p = index.partition
            state = states.get(p)
            if state is None:
                continue
            if window.stale(key[1][1], wall):
                expired[p].append(key)
            else:
                state.load_chunk(key, index)
                for stored_key in (key, *parts):
                    expiry.stored(stored_key, p)
        for p, state in states.items():
            state.loaded(wall)
            state.garbage += expired[p]
            self.metrics.open_episodes.labels(str(p)).set(state.open_count)
            if expired[p]:
                self.metrics.state_expired.inc(len(expired[p]))
                log.warning(
                    "assemble: partition %d: %d chunks of abandoned open episodes were past "
                    "the window expiry; deleted",
                    p,
                    len(expired[p]),
                )
        self.commit.reset(states, dict(await self.gaps.positions(assigned)))
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


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> Assembler:
    """Declare the assemble agent, its tables, its tick timer and its recovery hook."""
    assembler = Assembler(app, topics, settings, metrics)
    assembler.open_table.on_recover(assembler.recover)

    adapter.take_batches(app, assembler)

    @app.agent(topics.steps, name="assemble")
    async def assemble(stream: Any) -> None:
        """Subscribes the steps topic: Faust's assignment, and the tables that follow
        it. Its records reach :meth:`Assembler.on_batch`, never this stream."""
        async for event in stream.noack().events():
            raise RuntimeError(f"a steps message took Faust's per-message path: {event!r}")

    app.timer(assembler.tick_interval, name="assemble-ticks")(assembler.send_ticks)
    app.task(assembler.keep_going)

    return assembler
