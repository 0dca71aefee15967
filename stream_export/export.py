"""Manual export (the seed's exportAllTrainingData): replay the episodes topic.

Reads every partition of the episodes topic from the beginning up to the end
offsets seen at start, formats each episode like the sink does, and writes one
file (through a ``.partial`` name, renamed when complete) or, for a directory, a
rotated set with a manifest through the sink's Writer. Episodes are deduplicated
by id; undecodable or unformattable ones are counted and skipped (the worker has
already dead-lettered them). Reads with no consumer group, so it never disturbs
the running worker.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream_export import formats
from stream_export.config import Settings
from stream_export.connection import kafka_options
from stream_export.durable import commit
from stream_export.errors import ConfigError, DecodeError, FormatError, StreamExportError
from stream_export.events import decode_episode
from stream_export.metrics import Metrics
from stream_export.writer import Writer


def parse_time(text: str | None) -> float | None:
    """ISO 8601 (naive means UTC) or Unix seconds -> Unix seconds."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"not a time: {text!r} (use ISO 8601 or Unix seconds)") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


class Progress:
    """A one-line progress bar on a stream, redrawn at most ten times a second."""

    def __init__(self, total: int, stream: IO[str] | None, width: int = 30) -> None:
        self.total, self.stream, self.width = total, stream, width
        self.started = self.shown = time.monotonic()

    def update(self, done: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if self.stream is None or (not final and now - self.shown < 0.1):
            return
        self.shown = now
        share = done / self.total if self.total else 1.0
        bar = "#" * int(share * self.width)
        rate = done / max(now - self.started, 1e-6)
        self.stream.write(
            f"\rexport [{bar:<{self.width}}] {share:4.0%} {done}/{self.total} messages "
            f"{rate:,.0f}/s" + ("\n" if final else "")
        )
        self.stream.flush()


class _Output(Protocol):
    def append(
        self, episode_id: str, lines: list[bytes], *, partition: int, offset: int, event_time: float
    ) -> bool: ...

    def finish(self) -> None: ...


class _FileOutput:
    """One file, written under a temporary name and renamed when complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = self.tmp.open("wb")
        self.seen: set[str] = set()

    def append(
        self, episode_id: str, lines: list[bytes], *, partition: int, offset: int, event_time: float
    ) -> bool:
        if episode_id in self.seen:
            return False
        self.seen.add(episode_id)
        for line in lines:
            self.out.write(line + b"\n")
        return True

    def finish(self) -> None:
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        commit(self.tmp, self.path)


class _DirOutput:
    """A rotated set with a manifest, through the sink's Writer."""

    def __init__(self, settings: Settings, path: Path, metrics: Metrics) -> None:
        if path.exists() and any(path.iterdir()):
            raise ConfigError(f"export directory {path} is not empty")
        sink = msgspec.structs.replace(settings.sink, output_dir=str(path), partition_by=None)
        self.writer = Writer.open(
            sink,
            worker_id=settings.worker.worker_id,
            topic=settings.topics.episodes,
            metrics=metrics,
            dedupe_window=2**62,
        )

    def append(
        self, episode_id: str, lines: list[bytes], *, partition: int, offset: int, event_time: float
    ) -> bool:
        return self.writer.append(
            episode_id, lines, partition=partition, offset=offset, event_time=event_time
        )

    def finish(self) -> None:
        self.writer.seal_all("final")
        self.writer.close()


def _open_output(settings: Settings, to: str, metrics: Metrics) -> _Output:
    target = Path(to)
    if to.endswith(os.sep) or target.is_dir():
        return _DirOutput(settings, target, metrics)
    return _FileOutput(target)


async def _partitions(settings: Settings, topic: str) -> list[TopicPartition]:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        [found] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if found["error_code"] or not found["partitions"]:
        raise StreamExportError(f"topic {topic!r} does not exist", reason="no_topic")
    return [TopicPartition(topic, p["partition"]) for p in found["partitions"]]


async def run(
    settings: Settings,
    to: str,
    *,
    since: float | None = None,
    until: float | None = None,
    progress: bool = True,
) -> int:
    """Export every episode published so far; return the exit code (0 when caught up)."""
    metrics = Metrics()
    format_episode = formats.build(settings.format, metrics)
    topic = settings.topics.episodes
    # "earliest" also for the reset that assign() starts, which could otherwise
    # finish after seek_to_beginning and leave the consumer at the end.
    consumer = AIOKafkaConsumer(
        **kafka_options(settings), enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tps = await _partitions(settings, topic)
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        total = sum(end[tp] - begin[tp] for tp in tps)
        out = _open_output(settings, to, metrics)
        bar = Progress(total, sys.stderr if progress else None)
        counts = {"episodes": 0, "records": 0, "filtered": 0, "repeated": 0, "bad": 0}
        done = 0
        pending = {tp for tp in tps if end[tp] > begin[tp]}
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=500, max_records=5000)
            for tp, messages in batches.items():
                for msg in messages:
                    if msg.offset >= end[tp]:
                        break
                    done += 1
                    _export_one(msg, format_episode, out, since, until, counts)
            for tp in list(pending):
                if await consumer.position(tp) >= end[tp]:
                    pending.discard(tp)
                    consumer.pause(tp)
            bar.update(done)
        bar.update(done, final=True)
        out.finish()
    finally:
        await consumer.stop()
    print(
        f"stream-export export: {counts['records']} records from {counts['episodes']} episodes "
        f"to {to} ({counts['filtered']} outside the time range or filtered, "
        f"{counts['repeated']} repeated, {counts['bad']} invalid)",
        file=sys.stderr,
    )
    return 0


def _export_one(
    msg: Any,
    format_episode: formats.Formatter,
    out: _Output,
    since: float | None,
    until: float | None,
    counts: dict[str, int],
) -> None:
    try:
        episode = decode_episode(msg.value)
        if (since is not None and episode.end_time < since) or (
            until is not None and episode.end_time >= until
        ):
            counts["filtered"] += 1
            return
        lines = format_episode(episode)
    except (DecodeError, FormatError):
        counts["bad"] += 1
        return
    if not lines:
        counts["filtered"] += 1
    elif out.append(
        episode.episode_id,
        lines,
        partition=msg.partition,
        offset=msg.offset,
        event_time=episode.end_time,
    ):
        counts["episodes"] += 1
        counts["records"] += len(lines)
    else:
        counts["repeated"] += 1
