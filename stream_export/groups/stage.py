"""The groups stage: episodes -> regrouped by group id -> closed GRPO groups.

Rollouts of one group finish on different episodes-topic partitions, and on
different workers. Two Faust agents bring them together, at least once and
idempotent at every step (the rules live in :mod:`stream_export.groups.state`):

1. ``groups-regroup`` re-keys every finished episode that has a group
   (:func:`~stream_export.groups.state.group_key`) by its group id onto the repartition
   topic ``<app_id>-groups-by-group`` (value: the episode unchanged), so one
   partition, and one worker, owns each group. Episodes are acknowledged once
   their copies are delivered.
2. ``groups`` keeps one :class:`~stream_export.groups.state.GroupBook` per repartition
   partition and publishes each closed group (and each late rollout on its own)
   to ``<app_id>-groups`` as a :class:`~stream_export.groups.state.GroupRecord`, keyed
   by its record id.

The second agent persists like the assembler (and with its machinery: the
outbox and sender of ``runtime/outbox.py``, the tables and changelog writer of
``runtime/tables.py``):
first every record and dead letter sent so far is delivered, then the closed
markers are written (table ``groups-closed``), then the open groups
(``groups-open``, a windowed table: a group is filed under the window of its
first persist, whose expiry is only a backstop for abandoned state), and only
then are the rollouts acknowledged. A crash replays the unacknowledged rollouts
onto tables that hold part of their effects; the book recognises a replayed
message by its offset (it changes nothing), and a re-published group is the same
record with the same record id (sinks drop it).

Groups time out on event time. Each worker's timer sends, for every episodes
partition it regroups and has caught up on, a control tick (the assembler's tick
header, plus the source partition) to every repartition partition, behind the
rollouts it forwarded. A book's clock follows the earliest of these watermarks
less ``assemble.quiet_partition_s`` (:meth:`~stream_export.groups.state.GroupBook.watermark`),
so a quiet partition still closes its groups on time, and no group times out
while a source partition is stalled (its worker dead, say). This assumes rollouts
reach the episodes topic within that slack of their end time: a backfill of old
rollouts into a running app finds its groups' timeouts already passed (use a new
``worker.app_id`` for it).

The repartition and closed-groups topics are created with the others
(``stream_export.kafka.topics``, with ``groups.enabled``), before the worker subscribes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import faust
import msgspec
from faust.types import TP

from stream_export.assemble.agent import CONTROL_HEADER, TICK
from stream_export.config import Settings
from stream_export.errors import DecodeError, EpisodeError
from stream_export.events import decode_episode
from stream_export.groups import storage
from stream_export.groups.formats import outputs
from stream_export.groups.records import GroupRecord, closed_record, dropped_for_variance
from stream_export.groups.state import (
    Dropped,
    Duplicate,
    Emitted,
    GroupBook,
    Late,
    Mismatch,
    OpenGroup,
    Result,
    group_key,
    member_of,
    prompt_digest,
    source_position,
)
from stream_export.kafka.topics import topic_names
from stream_export.output import sink
from stream_export.output.formats import separator
from stream_export.reasons import DeadLetterReason
from stream_export.runtime import adapter, dlq, pieces, shutdown
from stream_export.runtime.app import RAW, Topics
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.outbox import KafkaOutbox, Sender
from stream_export.runtime.tables import Changelog, state_tables

log = logging.getLogger(__name__)

OPEN_TABLE: Final = "groups-open"
CLOSED_TABLE: Final = "groups-closed"
LATE_ROLLOUT: Final = DeadLetterReason.LATE_ROLLOUT
#: On a watermark tick: the episodes partition it speaks for (its value: the wall
#: time by which that partition's rollouts were all forwarded).
SOURCE_HEADER: Final = "x-stream-export-source"
#: On a forwarded rollout: the episodes-topic position it came from ("partition:offset"),
#: so that the same position forwarded again after a crash is not a duplicate.
FROM_HEADER: Final = "x-stream-export-from"
#: Rollout ids a too-large group's dead letter names at most (its summary stays small).
MAX_LISTED_IDS: Final = 1000


_json: Final = msgspec.json.Encoder()


class GroupStage:
    """The regroup and groups agents' I/O around the per-partition books."""

    def __init__(self, app: faust.App, topics: Topics, settings: Settings, metrics: Metrics):
        self.app, self.settings, self.metrics = app, settings, metrics
        n = settings.topics.partitions
        by_group, groups = topic_names(settings.worker.app_id)
        self.by_group = app.topic(by_group, schema=RAW, partitions=n, internal=True)
        self.groups_topic = app.topic(groups, schema=RAW, partitions=n, internal=True)
        a, g = settings.assemble, settings.groups
        #: The largest group record the groups topic takes (kafka.topics.wanted).
        self.max_record_bytes = a.max_record_bytes
        self.open_table, self.closed_table, self.window = state_tables(
            app,
            settings,
            metrics,
            names=(OPEN_TABLE, CLOSED_TABLE),
            closed_retention_s=g.closed_retention_s,
            episodes=None,
        )
        self.outbox = KafkaOutbox(app)
        self.regroup_outbox = KafkaOutbox(app)
        self.open_writer = Changelog(app, self.open_table)
        self.closed_writer = Changelog(app, self.closed_table)
        self.records = Sender(self.outbox, self.groups_topic)
        self.regrouped = Sender(self.regroup_outbox, self.by_group)
        self.dead_letters = Sender(self.outbox, topics.dead_letters)
        self.books: dict[int, GroupBook] = {}
        #: What is stored of the open groups (windows, member entries).
        self.entries = storage.OpenEntries()
        self.held: list[Any] = []
        self.regroup_held: list[Any] = []
        self.lock = asyncio.Lock()
        self.regroup_lock = asyncio.Lock()
        self.episodes_topic = topics.episodes.get_topic_name()
        self.by_group_name = by_group
        #: Episodes partitions this worker regroups: the last offset handled (None:
        #: none since the partition was assigned).
        self.sources: dict[int, int | None] = {}
        #: When the consumer first knew each episodes partition's end offset, and
        #: when the partitions were assigned (monotonic).
        self.ends_known: dict[int, float] = {}
        self.assigned_at = 0.0
        self._last = 0.0
        self.interval = min(a.persist_interval_s, 1.0)
        self.tick_interval = min(5.0, max(0.05, a.quiet_partition_s / 4))

    def _book(self) -> GroupBook:
        g = self.settings.groups
        return GroupBook(
            timeout_s=self.settings.group_timeout_s(),
            min_members=g.min_members,
            default_size=g.default_size,
            closed_retention_s=g.closed_retention_s,
        )

    # -- 1. regroup ---------------------------------------------------------------

    async def regroup(self, event: Any) -> None:
        """Re-key one finished episode by its group id (held until delivered)."""
        try:
            episode = decode_episode(event.value)
        except DecodeError:  # the sink dead-letters it
            key = None
        else:
            key = group_key(episode, self.settings.groups.fallback_id)
        async with self.regroup_lock:
            if key is not None:
                where = f"{event.message.partition}:{event.message.offset}".encode()
                headers = [(FROM_HEADER, where)]
                await self.regrouped.send(key=key.encode(), value=event.value, headers=headers)
            self.regroup_held.append(event)
            self.sources[event.message.partition] = event.message.offset

    async def deliver_regrouped(self) -> None:
        async with self.regroup_lock:
            held, self.regroup_held = self.regroup_held, []
            await self.regroup_outbox.delivered()
            for event in held:
                event.ack()

    def _caught_up(self, partition: int, offset: int | None) -> bool:
        """Whether the regroup agent has forwarded every episode of an episodes
        partition it can see: up to the end offset its consumer last heard of, or,
        with none handled since the partition was assigned, nothing arrived for
        quiet_partition_s after that end was known (a backlog arrives without pause).
        Only cached offsets are read: asking the broker here stalls Faust's consumer."""
        tp = TP(self.episodes_topic, partition)
        if tp not in self.app.consumer.assignment():  # revoked, not rebuilt yet
            return False
        # None until the consumer's first fetch of the partition (typed int by Faust).
        end: int | None = self.app.consumer.highwater(tp)
        if end is None:
            return False
        if offset is not None:
            return offset + 1 >= end
        known = self.ends_known.setdefault(partition, time.monotonic())
        quiet = time.monotonic() - max(self.assigned_at, known)
        return quiet >= self.settings.assemble.quiet_partition_s

    async def send_watermarks(self) -> None:
        """For each episodes partition this worker regroups and has caught up on, a
        control tick to every groups partition, behind the rollouts forwarded so far
        (the same outbox keeps their order)."""
        n = self.settings.topics.partitions
        async with self.regroup_lock:
            caught_up = [p for p, offset in self.sources.items() if self._caught_up(p, offset)]
            wall = str(time.time()).encode()
            for p in caught_up:
                headers = [(CONTROL_HEADER, TICK), (SOURCE_HEADER, str(p).encode())]
                for q in range(n):
                    await self.regroup_outbox.put(self.by_group_name, q, b"", wall, headers)
            await self.regroup_outbox.delivered()

    # -- 2. groups ----------------------------------------------------------------

    async def add(self, event: Any) -> None:
        """Apply one rollout (or control tick) of the repartition topic."""
        async with self.lock:
            message = event.message
            book = self.books.get(message.partition)
            if book is None:
                raise RuntimeError(f"groups partition {message.partition} is not assigned here")
            headers = event.headers or {}
            if headers.get(CONTROL_HEADER) == TICK:
                results = book.watermark(
                    int(headers[SOURCE_HEADER]),
                    float(event.value),
                    self.settings.topics.partitions,
                    self.settings.assemble.quiet_partition_s,
                    message.offset,
                )
            else:
                results = await self._rollout(book, event)
            for result in results:
                await self._handle(book, result, message)
            self.held.append(event)

    async def _rollout(self, book: GroupBook, event: Any) -> list[Result]:
        try:
            episode = decode_episode(event.value)
        except DecodeError:  # the regroup agent forwards only valid episodes
            return []
        key = event.key.decode()
        self.metrics.group_rollouts.inc()
        if episode.truncated:
            self.metrics.group_rollouts_truncated.inc()
        partition, _, offset = (event.headers or {}).get(FROM_HEADER, b"").partition(b":")
        source = source_position(int(partition), int(offset)) if offset.isdigit() else -1
        member = member_of(episode, event.value, source)
        checked = self.settings.groups.mixed_prompts == "dead_letter"
        prompt = prompt_digest(episode.prompt) if checked else ""
        return book.add(key, member, episode.group_size, event.message.offset, prompt)

    async def _handle(self, book: GroupBook, result: Result, message: Any) -> None:
        m, g = self.metrics, self.settings.groups
        if isinstance(result, Duplicate):
            m.group_rollouts_duplicate.inc()
        elif isinstance(result, Dropped):
            m.groups_dropped.labels(result.reason).inc()
        elif isinstance(result, Mismatch):
            m.group_rollouts_mismatched.inc()
            error = EpisodeError(
                f"rollout {result.member.episode_id!r} has another prompt than group "
                f"{result.group_id!r}'s first rollout; left out of the group",
                reason=DeadLetterReason.GROUP_PROMPT_MISMATCH,
            )
            await self._dead_letter(result.group_id, result.member.record, error, message)
        elif isinstance(result, Late):
            m.group_rollouts_late.inc()
            if g.late_policy == "dead_letter":
                error = EpisodeError(
                    f"rollout {result.member.episode_id!r} arrived after group "
                    f"{result.group_id!r} closed",
                    reason=LATE_ROLLOUT,
                )
                await self._dead_letter(result.group_id, result.member.record, error, message)
            if not result.member.truncated:  # exported on its own, with no statistics
                member = result.member
                alone = OpenGroup(result.group_id, member.time, None, [member])
                await self._publish(alone, "late", False, None, member.time, message)
        elif isinstance(result, Emitted):
            await self._publish(
                result.group,
                result.reason,
                result.complete,
                result.missing,
                result.closed_at,
                message,
            )

    async def _publish(
        self,
        group: OpenGroup,
        reason: Any,
        complete: bool,
        missing: int | None,
        closed_at: float,
        message: Any,
    ) -> None:
        g, m = self.settings.groups, self.metrics
        try:
            record = closed_record(group, reason, complete, missing, closed_at, g)
        except Exception as exc:  # a bug must cost one group, never the worker, nor vanish
            log.exception("groups: building the record of group %r", group.group_id)
            error = EpisodeError(
                f"group {group.group_id!r} could not be built: {type(exc).__name__}: {exc}",
                reason=DeadLetterReason.INTERNAL_ERROR,
            )
            ids = [x.episode_id for x in group.members[:MAX_LISTED_IDS]]
            summary = _json.encode({"group_id": group.group_id, "episode_ids": ids})
            await self._dead_letter(group.group_id, summary, error, message)
            return
        if dropped_for_variance(record, g.drop_zero_variance):
            m.groups_dropped.labels("zero_variance").inc()
            return
        value = _json.encode(record)
        if len(value) > self.max_record_bytes:
            await self._too_large(record, len(value), message)
            return
        await self.records.send(key=record.record_id.encode(), value=value)
        if reason == "late":
            return
        m.groups_closed.labels(reason).inc()
        if not complete:
            m.groups_incomplete.inc()
        if record.zero_variance:
            m.groups_zero_variance.inc()
        m.group_size.observe(record.size)
        m.observe_reward_spread([x.reward for x in group.members if not x.truncated])

    async def _too_large(self, record: GroupRecord, size: int, message: Any) -> None:
        """A group record the groups topic cannot take (its rollouts together exceed
        assemble.max_episode_bytes): dead-lettered as a summary naming its rollouts,
        which the episode sink still writes one by one, and counted as dropped."""
        error = EpisodeError(
            f"group {record.group_id!r}: its record is {size} bytes, over "
            f"assemble.max_episode_bytes plus its envelope ({self.max_record_bytes})",
            reason=DeadLetterReason.GROUP_TOO_LARGE,
        )
        summary = {
            "group_id": record.group_id,
            "record_bytes": size,
            "size": record.size,
            "episode_ids": [r.episode_id for r in record.rollouts[:MAX_LISTED_IDS]],
        }
        await self._dead_letter(record.group_id, _json.encode(summary), error, message)
        self.metrics.groups_dropped.labels("too_large").inc()

    async def _dead_letter(
        self, group_id: str, value: bytes, error: EpisodeError, message: Any
    ) -> None:
        await dlq.send(
            self.dead_letters,
            self.metrics,
            key=group_id.encode(),
            value=value,
            error=error,
            source=dlq.Source(message.topic, message.partition, message.offset),
            stage="groups",
        )

    async def persist(self) -> None:
        """Deliver, then write markers, then open groups, then the clocks, then
        acknowledge (see above)."""
        async with self.lock:
            held, self.held = self.held, []
            await self.outbox.delivered()
            window = self.window.current(time.time())
            for p, book in self.books.items():
                opened, closed = book.take_changes()
                await self.closed_writer.write(p, storage.marker_writes(p, closed))
                await self.open_writer.write(p, self.entries.writes(p, opened, window))
                await self.closed_writer.write(p, storage.clock_writes(p, book.take_clock()))
                self.metrics.groups_open.labels(str(p)).set(len(book.open))
            for event in held:
                event.ack()

    async def keep_going(self) -> None:
        """Persist and deliver regrouped episodes every ``interval`` (and at once when a
        rebalance starts or the worker stops)."""
        try:
            while True:
                await asyncio.sleep(self.interval / 4)
                urgent = self.app.rebalancing or self.app.should_stop
                if self.regroup_held:
                    await self.deliver_regrouped()
                if self.held and (urgent or time.monotonic() - self._last >= self.interval):
                    await self.persist()
                    self._last = time.monotonic()
        except Exception as exc:
            log.exception("groups: persisting failed")
            await self.app.crash(exc)

    async def recover(self) -> None:
        """Rebuild the books of this worker's repartition partitions from the tables."""
        try:
            async with self.lock:
                self.held = []
                self._rebuild()
        except Exception as exc:
            log.exception("groups: rebuilding the open groups failed")
            await self.app.crash(exc)

    def summary(self) -> str:
        """One line with this worker's group counters (logged at shutdown)."""
        m = self.metrics
        counters = {
            "rollouts": m.group_rollouts,
            "duplicate": m.group_rollouts_duplicate,
            "late": m.group_rollouts_late,
            "truncated": m.group_rollouts_truncated,
            "incomplete": m.groups_incomplete,
            "zero_variance": m.groups_zero_variance,
        }
        parts = [f"{name}={int(sum(s.value for s in _samples(c)))}" for name, c in counters.items()]
        closed = {s.labels["reason"]: int(s.value) for s in _samples(m.groups_closed)}
        dropped = {s.labels["reason"]: int(s.value) for s in _samples(m.groups_dropped)}
        return " ".join([*parts, f"closed={closed}", f"dropped={dropped}"])

    def _rebuild(self) -> None:
        name = self.by_group.get_topic_name()
        assigned = sorted(
            tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == name
        )
        for p in self.books.keys() - set(assigned):
            self.metrics.groups_open.remove(str(p))
        self.ends_known, self.assigned_at = {}, time.monotonic()
        self.sources = {
            tp.partition: None
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self.episodes_topic
        }
        found, expiring = self.entries.restore(
            pieces.whole_items(iter(self.open_table.data.items()), self.open_table.data.get),
            pieces.whole_items(iter(self.closed_table.data.items()), self.closed_table.data.get),
            assigned,
        )
        self.open_table.expire_only(expiring)
        self.books = {}
        for p in assigned:
            book = self.books[p] = self._book()
            book.restore(found[p].open, found[p].closed, found[p].clock)
            self.metrics.groups_open.labels(str(p)).set(len(book.open))
        log.info(
            "groups: %d open groups on partitions %s rebuilt",
            sum(len(b.open) for b in self.books.values()),
            assigned,
        )


def _samples(counter: Any) -> list[Any]:
    return [s for f in counter.collect() for s in f.samples if s.name.endswith("_total")]


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> GroupStage:
    """Declare the regroup and groups agents, their tables, ticks and recovery."""
    stage = GroupStage(app, topics, settings, metrics)
    stage.open_table.on_recover(stage.recover)
    # Before Faust commits (a rebalance, the worker stopping): deliver and persist.
    adapter.on_drain(
        app, lambda: shutdown.drained(app, "groups", stage.deliver_regrouped, stage.persist)
    )

    @app.agent(topics.episodes, name="groups-regroup")
    async def regroup(stream: Any) -> None:
        async for event in stream.noack().events():
            await stage.regroup(event)

    @app.agent(stage.by_group, name="groups")
    async def groups(stream: Any) -> None:
        try:
            async for event in stream.noack().events():
                await stage.add(event)
        finally:
            log.info("groups summary: %s", stage.summary())

    app.timer(stage.tick_interval, name="groups-watermarks")(stage.send_watermarks)
    app.task(stage.keep_going)
    source = stage.groups_topic.get_topic_name()
    for suffix, read in outputs(settings.groups, separator(settings.format)).items():
        files = msgspec.structs.replace(settings.sink, prefix=f"{settings.sink.prefix}.{suffix}")
        output = sink.Output(f"{suffix}-sink", source, files, read)
        sink.attach(app, topics, settings, metrics, output)
    return stage
