"""Manual export (the seed's exportAllTrainingData): replay the episodes topic.

Reads every partition of the episodes topic from the beginning up to the end
offsets seen at start, formats each episode like the sink does, and writes one
file (through a ``.partial`` name, renamed when complete) or, for a directory, a
rotated set with a manifest through the sink's Writer. Episodes are deduplicated
by id; undecodable or unformattable ones are counted and skipped (the worker has
already dead-lettered them). Reads with no consumer group, so it never disturbs
the running worker.

A ``.parquet`` target gets verl's prompt dataset instead: the rollouts are grouped
by the groups stage's own rules (:class:`~stream_export.groups.state.GroupBook`, with no
timeout: a group still open at the end closes as timed out) and each task the
``prompts`` output would keep becomes one :func:`~stream_export.rows.groups.verl_row`.
The groups stage need not run for this.

``--with-scores`` first reads the scores topic (``scores.enabled``) and joins each
episode with the scores that came after it was published, as the worker would
have joined them in time (``stream_export.assemble.scoring.with_late``): a person's score
hours later reaches the training set without reprocessing the stream.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream_export.assemble.scoring import with_late
from stream_export.contract.decoding import decode_episode
from stream_export.contract.episode import Episode
from stream_export.contract.scores import ScoreRecord, score_record
from stream_export.contract.topics import scores_topic
from stream_export.errors import ConfigError, DecodeError, FormatError, StreamExportError
from stream_export.groups.keys import group_key
from stream_export.groups.records import closed_record
from stream_export.groups.state import (
    Dropped,
    Duplicate,
    Emitted,
    GroupBook,
    Late,
    Result,
    member_of,
)
from stream_export.kafka.connection import kafka_options
from stream_export.output import formatter, score_rows
from stream_export.output.durable import commit
from stream_export.output.writer import Writer
from stream_export.rows import groups
from stream_export.rows.schema import verl_schema
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings

#: An episode joined with what came after it (``--with-scores``), or as it is.
Join = Callable[[Episode], Episode]
#: (since, until) of the episodes' end times, each None for unbounded.
Window = tuple[float | None, float | None]


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


async def _replay(settings: Settings, progress: bool, topic: str = "") -> AsyncIterator[Any]:
    """Every message of ``topic`` (the episodes topic) up to the end offsets seen at start."""
    topic = topic or settings.topics.episodes
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
        bar = Progress(sum(end[tp] - begin[tp] for tp in tps), sys.stderr if progress else None)
        done = 0
        pending = {tp for tp in tps if end[tp] > begin[tp]}
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=500, max_records=5000)
            for tp, messages in batches.items():
                for msg in messages:
                    if msg.offset >= end[tp]:
                        break
                    done += 1
                    yield msg
            for tp in list(pending):
                if await consumer.position(tp) >= end[tp]:
                    pending.discard(tp)
                    consumer.pause(tp)
            bar.update(done)
        bar.update(done, final=True)
    finally:
        await consumer.stop()


async def run(
    settings: Settings,
    to: str,
    *,
    since: float | None = None,
    until: float | None = None,
    progress: bool = True,
    with_scores: bool = False,
) -> int:
    """Export every episode published so far; return the exit code (0 when caught up).
    A ``.parquet`` target gets verl's prompt rows of the groups instead. With
    ``with_scores`` each episode first gets the scores that came after it was
    published (the scores topic)."""
    window = (since, until)
    join = await _late_scores(settings, progress) if with_scores else _unchanged
    if to.endswith(".parquet"):
        return await _run_verl(settings, Path(to), window, progress, join)
    metrics = Metrics()
    format_episode = formatter.build(settings.format, metrics)
    out = _open_output(settings, to, metrics)
    counts = {"episodes": 0, "records": 0, "filtered": 0, "repeated": 0, "bad": 0}
    async for msg in _replay(settings, progress):
        _export_one(msg, format_episode, out, window, counts, join)
    out.finish()
    print(
        f"stream-export export: {counts['records']} records from {counts['episodes']} episodes "
        f"to {to} ({counts['filtered']} outside the time range, {counts['repeated']} "
        f"repeated, {counts['bad']} invalid{left_out(metrics)})",
        file=sys.stderr,
    )
    return 0


def left_out(metrics: Metrics) -> str:
    """The episodes the format left out, by reason (``format.*`` filters; ``empty``:
    nothing to write, e.g. no agent step; ``custom``: a custom formatter wrote
    nothing), as ``, left out: empty 2, not_success 1`` ("" for none)."""
    counted = {
        sample.labels["reason"]: int(sample.value)
        for metric in metrics.episodes_filtered.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.value
    }
    if not counted:
        return ""
    return ", left out: " + ", ".join(f"{r} {n}" for r, n in sorted(counted.items()))


async def _late_scores(settings: Settings, progress: bool) -> Join:
    """Joins an episode with the rows of the scores topic for it."""
    late: dict[str, list[ScoreRecord]] = {}
    async for msg in _replay(settings, progress, scores_topic(settings.worker.app_id)):
        try:
            row = score_rows.decode_row(msg.value)
        except DecodeError:
            continue
        late.setdefault(row.episode_id, []).append(score_record(row))
    return lambda e: with_late(e, late.get(e.episode_id, []), settings.scores)


def _unchanged(episode: Episode) -> Episode:
    return episode


def _decoded(
    msg: Any, window: Window, counts: dict[str, int], join: Join = _unchanged
) -> Episode | None:
    """The message's episode (joined with its later scores) if valid and ended in the
    time window, else None (counted)."""
    since, until = window
    try:
        episode = decode_episode(msg.value)
    except DecodeError:
        counts["bad"] += 1
        return None
    if (since is not None and episode.end_time < since) or (
        until is not None and episode.end_time >= until
    ):
        counts["filtered"] += 1
        return None
    return join(episode)


def _export_one(
    msg: Any,
    format_episode: formatter.Formatter,
    out: _Output,
    window: Window,
    counts: dict[str, int],
    join: Join,
) -> None:
    episode = _decoded(msg, window, counts, join)
    if episode is None:
        return
    try:
        lines = format_episode(episode)
    except FormatError:
        counts["bad"] += 1
        return
    if not lines:
        return  # counted by the formatter, by reason
    if out.append(
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


async def _run_verl(
    settings: Settings, path: Path, window: Window, progress: bool, join: Join
) -> int:
    """Regroup the replayed rollouts with the worker's rules (every group still open
    at the end closes as timed out), then write verl rows of their prompts."""
    g = settings.groups
    book = GroupBook(
        timeout_s=math.inf,
        min_members=g.min_members,
        default_size=g.default_size,
        closed_retention_s=math.inf,
    )
    counts = {"episodes": 0, "filtered": 0, "repeated": 0, "bad": 0, "late": 0, "small": 0}
    closed: list[Emitted] = []
    async for msg in _replay(settings, progress):
        episode = _decoded(msg, window, counts, join)
        if episode is None:
            continue
        key = group_key(episode, g.fallback_id)
        if key is None:
            counts["filtered"] += 1
            continue
        results = book.add(key, member_of(episode, msg.value), episode.group_size)
        closed += _tally(results, counts)
    closed += _tally(book.advance(math.inf), counts)
    closed.sort(key=lambda e: e.group.group_id)  # the same topic, the same file
    records = [
        closed_record(e.group, e.reason, e.complete, e.missing, e.closed_at, g) for e in closed
    ]
    rows = groups.verl_rows(records, g)
    _write_parquet(path, rows)
    untrue = sum(1 for row in rows if not row["reward_model"]["ground_truth"])
    print(
        f"stream-export export: {len(rows)} verl rows from {len(records)} groups of "
        f"{counts['episodes']} episodes to {path} ({counts['filtered']} outside the time "
        f"range or in no group, {counts['repeated']} repeated, {counts['late']} late, "
        f"{counts['bad']} invalid; {counts['small']} groups too small); {untrue} rows "
        "without a ground_truth, which stream_export.trainers.verl_reward scores only "
        "for responses the fleet recorded",
        file=sys.stderr,
    )
    return 0


def _tally(results: list[Result], counts: dict[str, int]) -> list[Emitted]:
    """Count a book's results; return the groups it emitted."""
    for result in results:
        if isinstance(result, Duplicate):
            counts["repeated"] += 1
        elif isinstance(result, Late):
            counts["late"] += 1
        elif isinstance(result, Dropped):
            counts["small"] += 1
        elif isinstance(result, Emitted):
            counts["episodes"] += len(result.group.members)
    return [r for r in results if isinstance(r, Emitted)]


def _write_parquet(path: Path, rows: list[groups.Row]) -> None:
    """The rows as one parquet file, under a temporary name until complete."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=verl_schema()), tmp)
    with tmp.open("rb+") as written:
        os.fsync(written.fileno())
    commit(tmp, path)
