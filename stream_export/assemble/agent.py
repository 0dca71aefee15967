"""The assemble stage: steps topic -> open episodes in Faust tables -> episodes topic.

The rules live in :mod:`stream_export.assemble.state`, the batches, persist order,
gaps, ticks and rebuilds in the stage runtime (:mod:`stream_export.runtime.stage`,
run on Faust by :mod:`stream_export.runtime.runner`); this module is what the
assembler adds to them:

1. each message is decoded (undecodable input -> dead-letter topic, stage
   ``decode``) and applied to its partition's state; rejected events ->
   dead-letter topic;
2. at the end of a batch, due episodes close and the finished ones are published
   to the episodes topic (:mod:`.publish`);
3. a persist writes the markers of the published episodes (closed-episodes
   table), then deletes their chunks and writes one chunk per episode that gained
   events (open-episodes table). An episode that finishes within one persist
   interval never reaches the open-episodes table.

A partition that goes quiet still closes its episodes: the runtime's ticks reach
each partition whose state asks for one (:meth:`PartitionState.wants_tick`).

The open-episodes table is a Faust tumbling-window table (``assemble.window_s``,
expiring ``window_expires_s`` after the window ends): an episode's chunks are
filed under the window of its first persist, on the wall clock. The expiry is
only a backstop for abandoned state; episodes are closed by the state machine
long before. The closed-episodes table is a plain table whose RocksDB TTL and
changelog retention forget markers after ``closed_retention_s``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

import faust

from stream_export.assemble.chunks import ChunkKey, decode_index, split_chunk_key
from stream_export.assemble.publish import Publisher
from stream_export.assemble.state import PartitionState, receive
from stream_export.assemble.verdicts import CONFLICT, INTERNAL, LATE, LateScore, Rejected, Verdict
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Score, Step
from stream_export.contract.reasons import DeadLetterReason
from stream_export.contract.topics import scores_topic
from stream_export.errors import DecodeError, EpisodeError
from stream_export.runtime import pieces, runner
from stream_export.runtime.app import RAW, Topics
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.outbox import KafkaOutbox, Sender
from stream_export.runtime.stage import Send, Table, Window, Write
from stream_export.runtime.tables import Changelog, state_tables
from stream_export.settings import Settings

log = logging.getLogger(__name__)

OPEN_TABLE: Final = "assemble-open"
CLOSED_TABLE: Final = "assemble-closed"


class _TableStore:
    """One partition's view of the two tables (assemble.chunks.Store)."""

    def __init__(self, chunks: Table, markers: Table, partition: int) -> None:
        self._chunks, self._markers, self.partition = chunks, markers, partition

    def chunk(self, key: ChunkKey) -> bytes | None:
        return self._chunks.read(self.partition, key)

    def marker(self, key: bytes) -> bytes | None:
        return self._markers.read(self.partition, key)


class Assembler:
    """The assemble stage's logic (:class:`.stage.Logic`) over its two tables."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        chunks: Table,
        markers: Table,
        episodes: Send,
        dead_letters: Send,
        steps_topic: str,
        stale: Callable[[float, float], bool],
        clock: Callable[[], float] = time.time,
        scores: Send | None = None,
    ) -> None:
        self.settings, self.metrics, self.clock = settings, metrics, clock
        self.chunks, self.markers = chunks, markers
        #: A persist writes the markers, the chunks, then the clock (with held episodes).
        self.tables = (markers, chunks, markers)
        #: Whether a window ending at the first time is past expiry at the second.
        self.stale = stale
        self.publisher = Publisher(settings, metrics, episodes, dead_letters, steps_topic)
        #: The scores output's topic (scores.enabled): scores after publication.
        self.scores = scores
        self._consumed = {
            t.__struct_config__.tag: metrics.events_consumed.labels(t.__struct_config__.tag)
            for t in (EpisodeStart, Step, EpisodeEnd, Score)
        }
        self._verdicts = {
            Verdict.ACCEPTED: metrics.steps_accepted,
            Verdict.DUPLICATE: metrics.steps_duplicate,
            Verdict.REPLAYED: metrics.events_replayed,
        }
        #: Counts of the batch being handled, added to their counters at its end
        #: (a counter's inc takes a lock: once a batch, not once an event).
        self.tally: Counter[Any] = Counter()
        self.partitions: Sequence[int] = ()

    async def handle(self, partition: int, state: PartitionState, message: Any) -> None:
        key, raw, m = message.key, message.value, self.metrics
        try:
            kind, result, stage = receive(state, key, raw, message.offset, self.clock())
        except Exception as exc:  # a bug must cost one message, never the worker
            log.exception("assemble: partition %d offset %d", partition, message.offset)
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
        elif isinstance(result, LateScore):
            assert self.scores is not None  # LateScore only with scores.enabled
            await self.scores.send(key=result.key, value=result.row)
            m.scores_late.inc()
        elif isinstance(result, Rejected):
            if result.reason == LATE:
                m.events_late.inc()
            elif result.reason == CONFLICT:
                m.steps_conflicting.inc()
            elif result.reason == DeadLetterReason.LATE_SCORE:
                m.scores_late.inc()
            else:
                m.events_invalid.labels(result.reason).inc()
            error = (DecodeError if stage == "decode" else EpisodeError)(
                result.detail, reason=result.reason
            )
            await self.publisher.dead_letter(partition, message.offset, key, raw, error, stage)

    async def tick(self, partition: int, state: PartitionState, message: Any) -> None:
        state.tick(message.offset, min(self.clock(), message.timestamp / 1000))  # its send time

    async def end_batch(self, partition: int, state: PartitionState) -> None:
        state.sweep()
        for item in state.take_finished():
            await self.publisher.publish(partition, item)
        for counter, n in self.tally.items():
            counter.inc(n)
        self.tally.clear()

    def writes(self, partition: int, state: PartitionState, window: Window) -> list[list[Write]]:
        markers, chunks = state.writes(window)
        self.metrics.open_episodes.labels(str(partition)).set(state.open_count)
        self.metrics.held_episodes.labels(str(partition)).set(state.held)
        return [list(markers), list(chunks), list(state.clock_writes())]

    @staticmethod
    def wants_tick(state: PartitionState, wall: float) -> bool:
        return state.wants_tick(wall)

    def rebuild(self, partitions: Sequence[int], wall: float) -> dict[int, PartitionState]:
        """The open episodes of ``partitions``, from the chunks stored; chunks past
        the window expiry are deleted at the next persist."""
        for p in set(self.partitions) - set(partitions):
            self.metrics.open_episodes.remove(str(p))
            self.metrics.held_episodes.remove(str(p))
        self.partitions = partitions
        a = self.settings.assemble
        states = {
            p: PartitionState(p, a, _TableStore(self.chunks, self.markers, p), self.settings.scores)
            for p in partitions
        }
        expired: dict[int, list[ChunkKey]] = {p: [] for p in partitions}
        windows: dict[Window, Window] = {}
        tracked: list[tuple[int, Any]] = []
        for key, value, parts in self.chunks.items():
            # one tuple per window, not one per episode (see the README's figures)
            key = (key[0], windows.setdefault(key[1], key[1]))
            index = decode_index(value)
            p = index.partition
            state = states.get(p)
            if state is None:
                continue
            if self.stale(key[1][1], wall):
                expired[p].append(key)
            else:
                state.load_chunk(key, index)
                tracked += [(p, stored) for stored in (key, *parts)]
        self.chunks.expire_only(tracked)
        for p, state in states.items():
            state.loaded(wall)
            state.garbage += expired[p]
            self.metrics.open_episodes.labels(str(p)).set(state.open_count)
            self.metrics.held_episodes.labels(str(p)).set(state.held)
            if expired[p]:
                self.metrics.state_expired.inc(len(expired[p]))
                log.warning(
                    "assemble: partition %d: %d chunks of abandoned open episodes were past "
                    "the window expiry; deleted",
                    p,
                    len(expired[p]),
                )
        count = sum(s.open_count for s in states.values())
        log.info("assemble: %d open episodes on partitions %s rebuilt", count, list(partitions))
        return states

    def stored_episodes(self) -> int:
        """How many episodes have chunks in this worker's open-episodes table."""
        keys = (key for key, _value, _parts in self.chunks.items())
        return len({split_chunk_key(key[0])[0] for key in keys if not pieces.is_key(key[0])})


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> Assembler:
    """Declare the assemble stage: its tables, its runner (batches, ticks, recovery)."""
    a = settings.assemble
    counted: list[Assembler] = []
    open_table, closed_table, window = state_tables(
        app,
        settings,
        metrics,
        names=(OPEN_TABLE, CLOSED_TABLE),
        closed_retention_s=a.closed_retention_s,
        episodes=lambda: counted[0].stored_episodes(),
    )
    #: Episodes and dead letters, awaited at each persist.
    outbox = KafkaOutbox(app)
    steps = topics.steps.get_topic_name()
    assembler = Assembler(
        settings,
        metrics,
        chunks=Changelog(app, open_table),
        markers=Changelog(app, closed_table, small=True),
        episodes=Sender(outbox, topics.episodes),
        dead_letters=Sender(outbox, topics.dead_letters),
        steps_topic=steps,
        stale=window.stale,
    )
    counted.append(assembler)
    if settings.scores.enabled:  # its sink: stream_export.output.score_rows
        name, n = scores_topic(settings.worker.app_id), settings.topics.partitions
        scores = app.topic(name, schema=RAW, partitions=n, internal=True)
        assembler.scores = Sender(outbox, scores)
    run = runner.Runner(
        app,
        settings,
        metrics,
        assembler,
        outbox,
        name="assemble",
        topic=topics.steps,
        window=window.current,
        changelogs=[open_table.changelog_topic.get_topic_name()],
        wants_tick=assembler.wants_tick,
    )
    run.summary = assembler.publisher.summary
    runner.attach(app, run, open_table)
    return assembler
