"""The sink: consume the episodes topic, format each episode, append it with the Writer.

It is an aiokafka consumer run as a task inside the Faust worker, not a Faust
agent: exactly-once output needs the consumer to start each partition right after
the offset checkpointed with the files, and to stop writing a partition the moment
it is revoked; aiokafka gives both directly (seek on assignment, a rebalance
listener), where Faust's own commits and acks would have to be worked around.
File I/O runs in a thread so rotation, fsync and compression never block the
worker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import faust
import mode
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from stream_export.contract.calls import WeightVersion
from stream_export.contract.decoding import decode_episode
from stream_export.errors import (
    DecodeError,
    FormatError,
    SinkError,
    StreamExportError,
    TopicResetError,
)
from stream_export.kafka import lag as broker_lag
from stream_export.kafka import reset, topic_ids
from stream_export.kafka.connection import COMMIT_TIMEOUT_S, STOP_FLUSH_TIMEOUT_S, worker_options
from stream_export.output import formatter, upload
from stream_export.output.formatter import Formatter
from stream_export.output.layout import checkpointed_offsets
from stream_export.output.writer import Writer
from stream_export.rows import schema, tokens
from stream_export.runtime import dlq, lag, shutdown
from stream_export.runtime.app import Topics
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings
from stream_export.settings.sink import SinkSettings

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: First pause after an output error; doubles up to sink.retry_max_s.
RETRY_START_S = 0.1


@dataclass
class SinkStatus:
    """What readiness checks need to know about the sink (one per worker).

    ``paused`` is true while the output is not writable (disk full, I/O or
    permission error): consuming is paused and the write is retried with backoff.
    """

    running: bool = False
    paused: bool = False
    #: The last output error while paused, e.g. "no_space: No space left ...".
    error: str | None = None
    partitions: frozenset[int] = field(default_factory=frozenset)

    @property
    def writable(self) -> bool:
        return self.running and not self.paused


#: One consumed record, ready to write: (episode_id or None to skip, lines,
#: partition, offset, end time, partition-folder value, weight-version range).
Item = tuple[str | None, list[bytes], int, int, float, object, tuple[Any, Any] | None]


class Read(NamedTuple):
    """What a sink makes of one message."""

    record_id: str
    lines: list[bytes]
    end_time: float
    #: The partition-folder value (``sink.partition_by``).
    folder: object = None
    #: Lowest and highest weight version of the model calls behind the lines
    #: (None: none), for the manifest.
    versions: tuple[WeightVersion, WeightVersion] | None = None


#: What a sink reads a message with; raises DecodeError (not a record) or FormatError.
Reader = Callable[[bytes | None], Read]


@dataclass(frozen=True)
class Output:
    """What one sink consumes and where it writes: its topic, its file settings
    (prefix and all), the name of its consumer group (``<app_id>-<name>``) and how
    a message becomes lines, and their schema (None: untyped, see ``schema``)."""

    name: str
    topic: str
    files: SinkSettings
    read: Reader
    columns: Callable[[], pa.Schema | None]


def episode_reader(format_episode: Formatter, partition_by: str | None) -> Reader:
    """The episodes topic's reader: decode the episode, format it."""

    def read(value: bytes | None) -> Read:
        episode = decode_episode(value)
        folder = episode.metadata.get(partition_by) if partition_by else None
        lines = format_episode(episode)
        versions = tokens.weight_range([episode]) if lines else None
        return Read(episode.episode_id, lines, episode.end_time, folder, versions)

    return read


class Sink:
    """Consumes one topic into one Writer; ``run`` until cancelled."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        format_episode: Formatter,
        dead_letters: Callable[..., Awaitable[Awaitable[Any]]],
        status: SinkStatus | None = None,
        output: Output | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.dead_letters = dead_letters
        self.status = status or SinkStatus()
        self.output = output or Output(
            "sink",
            settings.topics.episodes,
            settings.sink,
            episode_reader(format_episode, settings.sink.partition_by),
            lambda: schema.episode_schema(settings.format),
        )
        self.topic = self.output.topic
        #: Each sink (episodes, and every group output) pauses on its own.
        self._paused = metrics.sink_paused.labels(self.output.files.prefix)
        self._paused.set(0)
        self._lock = asyncio.Lock()
        #: Per assigned partition, the group's committed offset (the next to read),
        #: as read at the assignment or committed since: commits only move it on.
        self._committed: dict[int, int] = {}
        self._busy: asyncio.Future[Any] | None = None
        #: Per partition, the next offset to write (set on assignment).
        self._next: dict[int, int] = {}
        #: Per assigned partition, the offset it started at (for the lag).
        self._start: dict[int, int] = {}
        self._lag = lag.Shown(metrics)
        #: Set when a topic reset stops the worker: nothing more is written or committed.
        self._halted = False

    async def run(self) -> None:
        self.writer = writer = await self._open()
        self.consumer = AIOKafkaConsumer(
            **worker_options(self.settings),
            group_id=f"{self.settings.worker.app_id}-{self.output.name}",
            # Static membership: a restarted worker (same id) gets its partitions
            # back at once instead of waiting out the dead member's session.
            group_instance_id=f"{self.settings.worker.worker_id}-{self.output.name}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # Notice a topic deleted and created again within 30 s, not 5 min.
            metadata_max_age_ms=30_000,
        )
        self.consumer.subscribe([self.topic], listener=_Rebalance(self))
        await self.consumer.start()
        self.status.running = True
        log.info("sink: %s -> %s", self.topic, writer.root / f"{writer.prefix}.jsonl")
        try:
            await self._loop()
        finally:
            self.status.running = False
            if self._busy is not None:
                await asyncio.wait([self._busy])
            async with self._lock:
                writer.close()
                with contextlib.suppress(KafkaError, TimeoutError):
                    async with asyncio.timeout(COMMIT_TIMEOUT_S):
                        await self._commit(self.consumer.assignment())
            try:
                # Static membership: nothing to leave, and the checkpoint holds.
                async with asyncio.timeout(STOP_FLUSH_TIMEOUT_S):
                    await self.consumer.stop()
            except TimeoutError:
                log.warning("sink: the consumer's stop gave up after %.0fs", STOP_FLUSH_TIMEOUT_S)

    async def _open(self) -> Writer:
        """Open the writer; while the output cannot be opened (a disk or permission
        error, a damaged file of its own) wait and retry, paused and saying why, as
        a write error does: the rest of the worker goes on."""
        delay = RETRY_START_S
        while True:
            try:
                writer = await asyncio.to_thread(
                    Writer.open,
                    self.output.files,
                    worker_id=self.settings.worker.worker_id,
                    topic=self.topic,
                    metrics=self.metrics,
                    output=self.output.name,
                    columns=self.output.columns()
                    if self.output.files.encoding == "parquet"
                    else None,
                )
            except SinkError as exc:
                if not self.status.paused:
                    log.error("sink: cannot open the output, retrying: %s", exc)
                self._pause(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.output.files.retry_max_s)
                continue
            self._resume()
            return writer

    def _pause(self, exc: SinkError) -> None:
        self._paused.set(1)
        self.status.paused, self.status.error = True, str(exc)

    def _resume(self) -> None:
        self._paused.set(0)
        self.status.paused, self.status.error = False, None

    async def _loop(self) -> None:
        wait_ms = max(10, self.output.files.flush_interval_ms)
        while True:
            batches = await self.consumer.getmany(timeout_ms=wait_ms, max_records=5000)
            async with self._lock:
                if self._halted:
                    continue
                owned = self.consumer.assignment()
                for tp, messages in batches.items():
                    if tp in owned:
                        acks: list[Awaitable[Any]] = []
                        items = [await self._item(m, acks) for m in self._new(tp, messages)]
                        # a bad message's offset enters the checkpoint with the write:
                        # its dead letter must be on the topic by then, not in the
                        # producer's buffer, which a stop may not flush
                        await asyncio.gather(*acks)
                        await self._write(items)
                await self._retry(self.writer.tick)
                await self._commit(owned)

    def _new(self, tp: TopicPartition, messages: list[Any]) -> list[Any]:
        """The messages after the last one written for ``tp``.

        A second guard behind the seek in ``assigned``: records fetched from an
        older position (the group's committed offset, if the consumer's fetcher
        raced the seek) are dropped here rather than written twice.
        """
        expected = self._next.get(tp.partition, 0)
        if messages[0].offset > expected and tp.partition in self._next:
            log.warning(
                "sink: partition %d jumps from %d to %d", tp.partition, expected, messages[0].offset
            )
        fresh = [m for m in messages if m.offset >= expected]
        if fresh:
            self._next[tp.partition] = fresh[-1].offset + 1
        return fresh

    async def _item(self, msg: Any, acks: list[Awaitable[Any]]) -> Item:
        """Decode and format one message; bad ones go to the dead-letter topic (the
        broker's acknowledgement of each added to ``acks``)."""
        source = dlq.Source(msg.topic, msg.partition, msg.offset)
        try:
            read = self.output.read(msg.value)
        except DecodeError as exc:
            self.metrics.events_invalid.labels(exc.reason).inc()
            acks.append(await self.dead_letters(msg, exc, source, "sink"))
            return (None, [], msg.partition, msg.offset, 0.0, None, None)
        except FormatError as exc:
            self.metrics.format_errors.inc()
            acks.append(await self.dead_letters(msg, exc, source, "format"))
            return (None, [], msg.partition, msg.offset, 0.0, None, None)
        return (read.record_id, read.lines, msg.partition, msg.offset, *read[2:5])

    async def _write(self, items: list[Item]) -> None:
        done = 0
        while done < len(items):
            done = await self._retry(self._append_from, items, done)
        now = time.time()
        for episode_id, lines, *_, end_time, _folder, _versions in items:
            if episode_id is not None and lines:
                self.metrics.end_to_end_seconds.observe(max(0.0, now - end_time))

    def _append_from(self, items: list[Item], start: int) -> int:
        """Append items[start:] (in a thread); return how many are done before an error."""
        writer = self.writer
        for i in range(start, len(items)):
            episode_id, lines, partition, offset, end_time, folder, versions = items[i]
            try:
                if episode_id is None:
                    writer.skip(partition, offset)
                else:
                    writer.append(
                        episode_id,
                        lines,
                        partition=partition,
                        offset=offset,
                        event_time=end_time,
                        folder=folder,
                        versions=versions,
                    )
            except SinkError:
                if i == start:
                    raise
                return i
        return len(items)

    async def _retry(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a writer call in a thread; while it fails, pause consuming and back off."""
        delay = RETRY_START_S
        while True:
            # Shielded: a cancelled sink (worker stopping) waits for the thread in
            # run()'s cleanup instead of closing the writer under it.
            self._busy = asyncio.ensure_future(asyncio.to_thread(fn, *args))
            try:
                result = await asyncio.shield(self._busy)
            except SinkError as exc:
                if not self.status.paused:
                    log.error("sink: output not writable, pausing consumption: %s", exc)
                    self.consumer.pause(*self.consumer.assignment())
                self._pause(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.output.files.retry_max_s)
                continue
            if self.status.paused:
                log.warning("sink: output writable again, resuming")
                self.consumer.resume(*self.consumer.assignment())
                self._resume()
            return result

    async def _commit(self, owned: set[TopicPartition]) -> None:
        """Commit what the checkpoint covers (lag metrics, and where a worker with
        a folder of its own starts), never behind the group's committed offset:
        this writer's checkpoint may be older than another worker's rows, and a
        commit of it would make the next owner write them again."""
        if self._halted:
            return
        written = self.writer.checkpointed
        offsets = {
            tp: written[tp.partition] + 1
            for tp in owned
            if tp.partition in written
            and written[tp.partition] + 1 > self._committed.get(tp.partition, 0)
        }
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:
            log.warning("sink: offset commit failed (the checkpoint still holds): %s", exc)
            return
        for tp, offset in offsets.items():
            self._committed[tp.partition] = offset

    async def _check_topic(self) -> dict[int, int] | None:
        """Make sure the topic is the one the checkpoint was written for (same id,
        every checkpointed offset still in it) and return its end offsets; on a
        reset, start a new epoch or stop the worker (None) by sink.on_topic_reset."""
        partitions = self.consumer.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = {tp.partition: end for tp, end in (await self.consumer.end_offsets(tps)).items()}
        ids = await topic_ids.fetch(self.settings, [self.topic])
        current = ids.get(self.topic) if ids else None
        writer = self.writer
        found = reset.detect(
            self.topic, done=writer.offsets, ends=ends, known_id=writer.topic_id, current_id=current
        )
        if found is None:
            if current is not None and writer.topic_id != current:
                await self._retry(writer.bind_topic, current)
            return ends
        policy = self.settings.sink.on_topic_reset
        self.metrics.topic_resets.labels("sink", policy).inc()
        if policy == reset.STOP:
            self._halted = True
            self.consumer.pause(*self.consumer.assignment())
            shutdown.stop(
                TopicResetError(
                    found.explain(
                        f"the sink's checkpoint in {writer.root}",
                        "nothing was written. Set sink.on_topic_reset=new_epoch to seal the "
                        "current files and write the new topic from its beginning as a new "
                        "epoch, or use a new sink.output_dir",
                    )
                )
            )
            return None
        log.warning(
            "sink: %s; sealing the current files and writing the new topic from its "
            "beginning as epoch %d",
            found,
            writer.epoch + 1,
        )
        await self._retry(writer.new_epoch, current, found.detail)
        self._committed.clear()
        return ends

    def positions(self) -> dict[int, int]:
        """Per assigned partition, the next offset not yet in the checkpoint on disk."""
        saved = dict(self.writer.checkpointed)
        return {p: max(start, saved.get(p, -1) + 1) for p, start in self._start.items()}

    async def update_lag(self) -> None:
        """Publish the sink's consumer lag (skipped before start and while halted)."""
        if not self.status.running or self._halted:
            return
        try:
            found = await broker_lag.sink_lag(self.consumer, self.topic, self.positions())
        except lag.ERRORS as exc:
            broker_lag.unavailable(exc)
            return
        self._lag.publish(found)

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self._start.pop(tp.partition, None)
        async with self._lock:
            await self._retry(self.writer.flush)
            with contextlib.suppress(KafkaError):
                await self._commit(revoked)

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """Start each partition right after the last offset written to this output
        by any worker sharing its directory, or the group's committed offset if
        later, once the topic is known to be the one checkpointed; the ids those
        workers wrote to the partitions count as seen."""
        async with self._lock:
            # Nothing is assigned while the topic is missing (deleted, say).
            ends = await self._check_topic() if assigned else {}
            if ends is None:
                return
            root = Path(self.output.files.output_dir)
            shared = await asyncio.to_thread(
                checkpointed_offsets, root, self.topic, self.writer.topic_id, self.output.name
            )
            owned = {tp.partition for tp in self.consumer.assignment()}
            await self._retry(self.writer.take_over, owned)
            own = self.writer.offsets
            for tp in assigned:
                last = max(shared.get(tp.partition, -1), own.get(tp.partition, -1))
                committed = await self.consumer.committed(tp) or 0
                if committed > ends.get(tp.partition, 0):
                    committed = 0  # committed on an earlier incarnation of the topic
                start = max(last + 1, committed)
                self._committed[tp.partition] = committed
                if start > 0:
                    self.consumer.seek(tp, start)
                self._next[tp.partition] = self._start[tp.partition] = start
                log.info("sink: partition %d starts at offset %d", tp.partition, start)
            self.status.partitions = frozenset(tp.partition for tp in self.consumer.assignment())


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.sink.revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.sink.assigned(assigned)


def attach(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    metrics: Metrics,
    output: Output | None = None,
) -> SinkStatus:
    """Run a sink inside the worker (of the episodes topic unless ``output`` says
    otherwise); return its status for readiness checks."""
    status = SinkStatus()
    format_episode = formatter.build(settings.format, metrics)

    async def dead_letter(
        msg: Any, exc: StreamExportError, source: dlq.Source, stage: str
    ) -> Awaitable[Any]:
        return await dlq.send(
            topics.dead_letters,
            metrics,
            key=msg.key,
            value=msg.value,
            error=exc,
            source=source,
            stage=stage,
        )

    sink = Sink(settings, metrics, format_episode, dead_letter, status, output)
    app.add_dependency(_SinkService(sink, app))
    if sink.output.files.upload_url is not None:
        app.add_dependency(upload.UploadService(upload.Uploader(sink.output.files, metrics)))
    return status


class _SinkService(mode.Service):
    """Starts with the app, not after Faust's own group join and table recovery, so
    a restarted worker writes again as soon as its sink partitions are back; stops
    as soon as the app begins to, every sink at once: each ends with a commit and its
    consumer's stop, which one sink after another would, without the broker, make
    the worker outlast the README's bound."""

    def __init__(self, sink: Sink, app: faust.App) -> None:
        super().__init__()
        self.sink = sink
        self.app = app

    @mode.Service.task
    async def _run(self) -> None:
        run = asyncio.ensure_future(self.sink.run())
        stopping = asyncio.ensure_future(self.app.wait_until_stopped())
        try:
            await asyncio.wait({run, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not run.done():
                run.cancel()
                await asyncio.wait({run})
        if not run.cancelled():
            run.result()

    @mode.Service.timer(lag.INTERVAL_S)
    async def _update_lag(self) -> None:
        await self.sink.update_lag()
