"""The groups stage: episodes -> regrouped by group id -> closed GRPO groups.

Rollouts of one group finish on different episodes-topic partitions, and on
different workers. Two steps bring them together, at least once and idempotent at
every step (the rules live in :mod:`stream_export.groups.state`):

1. ``groups-regroup`` (:mod:`.regroup`) re-keys every finished episode that has a
   group by its group id onto the repartition topic ``<app_id>-groups-by-group``,
   so one partition, and one worker, owns each group;
2. the groups stage, run by the stage runtime like the assembler
   (:mod:`stream_export.runtime.stage`, :mod:`stream_export.runtime.runner`: batch
   intake, gaps, persist order, acknowledgement, rebuild), keeps one
   :class:`~stream_export.groups.state.GroupBook` per repartition partition and
   publishes each closed group (and each late rollout on its own) to
   ``<app_id>-groups`` as a :class:`~stream_export.contract.groups.GroupRecord`,
   keyed by its record id (:mod:`.publish`).

A persist first waits for every record and dead letter sent so far, then writes
the closed markers (table ``groups-closed``), then the open groups (``groups-open``,
a windowed table: a group is filed under the window of its first persist, whose
expiry is only a backstop for abandoned state; each group as a summary plus one
entry per member, :mod:`.storage`), then the clock, and only then acknowledges
the rollouts. A crash replays the unacknowledged rollouts onto tables that hold
part of their effects; the book recognises a replayed message by its offset, and
a re-published group is the same record with the same record id (sinks drop it).

Groups time out on event time. A book's clock follows the earliest of the
regroup agents' watermarks less ``assemble.quiet_partition_s``
(:meth:`~stream_export.groups.state.GroupBook.watermark`), so a quiet partition
still closes its groups on time, and no group times out while a source partition
is stalled (its worker dead, say). This assumes rollouts reach the episodes topic
within that slack of their end time: a backfill of old rollouts into a running
app finds its groups' timeouts already passed (use a new ``worker.app_id`` for it).

With a judge (``groups.judge_url``), a group that closes is judged first
(:mod:`.judge`, :mod:`.judging`): it stays stored as an open group, flagged, while a
task of this worker asks the judge and sends the verdict onto the repartition
topic, to the group's partition (header ``x-stream-export-verdict``). The stage
applies the first verdict it reads for the group: the group record, and the
judge's ``score`` events to the steps topic (the assembler puts them in the scores
output, each once by its score id). A rebuild starts the judging again of every
group still being judged on the partitions it now owns.

The repartition and closed-groups topics are created with the others
(``stream_export.kafka.topics``, with ``groups.enabled``), before the worker subscribes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol

import faust
import msgspec
from faust.types import TP

from stream_export.contract.decoding import decode_episode, decode_record
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.errors import DecodeError, FormatError
from stream_export.groups import judge, storage
from stream_export.groups.judging import JudgeTasks
from stream_export.groups.keys import prompt_digest
from stream_export.groups.publish import GroupPublisher
from stream_export.groups.regroup import FROM_HEADER, SOURCE_HEADER, Regroup
from stream_export.groups.state import (
    GroupBook,
    Judging,
    OpenGroup,
    Result,
    member_of,
    publication,
)
from stream_export.output import sink
from stream_export.output.sink import Read, Reader
from stream_export.rows import formats, schema, tokens
from stream_export.rows.formats import separator
from stream_export.rows.groups import (
    Row,
    group_row,
    kto_rows,
    preference_rows,
    prompt_rows,
    rollout_rows,
    scored_rollouts,
)
from stream_export.runtime import runner
from stream_export.runtime.app import RAW, Topics
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.outbox import KafkaOutbox, Sender
from stream_export.runtime.stage import Send, Table, Window, Write
from stream_export.runtime.tables import Changelog, state_tables
from stream_export.settings import Settings
from stream_export.settings.groups import GroupSettings

log = logging.getLogger(__name__)

OPEN_TABLE: Final = "groups-open"
CLOSED_TABLE: Final = "groups-closed"


class Judges(Protocol):
    """Who judges groups (:class:`.judging.JudgeTasks` in the worker)."""

    def start(self, partition: int, group: OpenGroup) -> None:
        """Judge ``group`` of ``partition`` (its verdict comes back as a message)."""

    def keep(self, partitions: Iterable[int]) -> None:
        """Stop judging the groups of every partition but ``partitions``."""


class GroupStage:
    """The groups stage's logic (:class:`.stage.Logic`) over its two tables."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        open_groups: Table,
        closed_groups: Table,
        records: Send,
        dead_letters: Send,
        topic: str,
        steps: Send | None = None,
        judges: Judges | None = None,
    ) -> None:
        self.settings, self.metrics = settings, metrics
        self.open_groups, self.closed_groups = open_groups, closed_groups
        #: A persist writes the markers, then the open groups, then the clock.
        self.tables = (closed_groups, open_groups, closed_groups)
        self.publisher = GroupPublisher(settings, metrics, records, dead_letters, topic, steps)
        self.judges = judges
        #: What is stored of the open groups (windows, member entries).
        self.entries = storage.OpenEntries()
        self.partitions: Sequence[int] = ()

    async def handle(self, partition: int, book: GroupBook, message: Any) -> None:
        """Apply one rollout (decoded once, here), or a judge's verdict."""
        if _header(message, judge.VERDICT_HEADER):
            await self._verdict(partition, book, message)
            return
        try:
            episode = decode_episode(message.value)
        except DecodeError:  # the regroup agent forwards only valid episodes
            return
        m = self.metrics
        m.group_rollouts.inc()
        if episode.truncated:
            m.group_rollouts_truncated.inc()
        partition_from, _, offset = _header(message, FROM_HEADER).partition(b":")
        where = (int(partition_from), int(offset)) if offset.isdigit() else (0, -1)
        member = member_of(episode, message.value, publication(episode, *where))
        checked = self.settings.groups.mixed_prompts == "dead_letter"
        prompt = prompt_digest(episode.prompt) if checked else ""
        key = message.key.decode()
        results = book.add(key, member, episode.group_size, message.offset, prompt)
        await self._results(partition, results, message.offset)

    async def _verdict(self, partition: int, book: GroupBook, message: Any) -> None:
        try:
            verdict = judge.decode_verdict(message.value)
        except DecodeError:  # not written by a worker: no group's verdict
            self.metrics.group_verdicts.labels("ignored").inc()
            return
        for result in book.judged(verdict.group_id, message.offset):
            await self.publisher.handle(result, partition, message.offset, verdict)

    async def _results(self, partition: int, results: list[Result], offset: int) -> None:
        for result in results:
            if isinstance(result, Judging):
                if self.judges is not None:
                    self.judges.start(partition, result.group)
            else:
                await self.publisher.handle(result, partition, offset)

    async def tick(self, partition: int, book: GroupBook, message: Any) -> None:
        """A regroup agent's watermark."""
        s = self.settings
        results = book.watermark(
            int(_header(message, SOURCE_HEADER)),
            float(message.value),
            s.topics.partitions,
            s.assemble.quiet_partition_s,
            message.offset,
        )
        await self._results(partition, results, message.offset)

    async def end_batch(self, partition: int, book: GroupBook) -> None:
        """Nothing: a book closes groups as their messages arrive."""

    def writes(self, partition: int, book: GroupBook, window: Window) -> list[list[Write]]:
        opened, closed = book.take_changes()
        markers = storage.marker_writes(partition, closed)
        groups = self.entries.writes(partition, opened, window)
        clock = storage.clock_writes(partition, book.take_clock())
        self._gauges(partition, book)
        return [markers, groups, clock]

    def _gauges(self, partition: int, book: GroupBook) -> None:
        self.metrics.groups_open.labels(str(partition)).set(len(book.open) - len(book.judging))
        self.metrics.groups_judging.labels(str(partition)).set(len(book.judging))

    def rebuild(self, partitions: Sequence[int], wall: float) -> dict[int, GroupBook]:
        """The books of ``partitions``, from the groups stored."""
        for p in set(self.partitions) - set(partitions):
            self.metrics.groups_open.remove(str(p))
            self.metrics.groups_judging.remove(str(p))
        if self.judges is not None:
            self.judges.keep(partitions)
        self.partitions = partitions
        found, expiring = self.entries.restore(
            self.open_groups.items(), self.closed_groups.items(), partitions
        )
        self.open_groups.expire_only(expiring)
        g, books = self.settings.groups, {}
        for p in partitions:
            book = books[p] = GroupBook(
                timeout_s=self.settings.group_timeout_s(),
                min_members=g.min_members,
                default_size=g.default_size,
                closed_retention_s=g.closed_retention_s,
                with_judge=g.judge_url is not None,
            )
            book.restore(found[p].open, found[p].closed, found[p].clock)
            self._gauges(p, book)
            for group_id in sorted(book.judging):
                if self.judges is not None:
                    self.judges.start(p, book.open[group_id])
        count = sum(len(b.open) for b in books.values())
        judging = sum(len(b.judging) for b in books.values())
        log.info(
            "groups: %d open groups on partitions %s rebuilt (%d being judged)",
            count,
            list(partitions),
            judging,
        )
        return books


def _header(message: Any, name: str) -> bytes:
    return next((value for key, value in message.headers or () if key == name), b"")


def _attach_regroup(
    app: faust.App,
    settings: Settings,
    metrics: Metrics,
    episodes: Any,
    by_group: Any,
    window: Any,
    table: Any,
) -> None:
    """Run the regroup stage, and send its watermarks."""
    outbox = KafkaOutbox(app)
    logic = Regroup(settings, Sender(outbox, by_group))
    run = runner.Runner(
        app,
        settings,
        metrics,
        logic,
        outbox,
        name="groups-regroup",
        topic=episodes,
        window=window.current,
        changelogs=[],
    )
    runner.attach(app, run, table)
    topic, name = episodes.get_topic_name(), by_group.get_topic_name()

    async def send_watermarks() -> None:
        """Behind the copies forwarded so far (one outbox keeps their order)."""
        consumer = app.consumer
        async with run.lock:
            assigned = consumer.assignment()
            ends: dict[int, int | None] = {
                p: consumer.highwater(TP(topic, p)) if TP(topic, p) in assigned else None
                for p in run.stage.states
            }
            for mark in logic.watermarks(run.stage.states, ends):
                for q in range(settings.topics.partitions):
                    await outbox.put(name, q, b"", mark.value, mark.headers)
            await outbox.delivered()

    app.timer(run.tick_interval, name="groups-watermarks")(send_watermarks)


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> GroupStage:
    """Declare the regroup and groups stages: tables, runners, sinks."""
    n = settings.topics.partitions
    by_group_name, groups = topic_names(settings.worker.app_id)
    by_group = app.topic(by_group_name, schema=RAW, partitions=n, internal=True)
    groups_topic = app.topic(groups, schema=RAW, partitions=n, internal=True)
    open_table, closed_table, window = state_tables(
        app,
        settings,
        metrics,
        names=(OPEN_TABLE, CLOSED_TABLE),
        closed_retention_s=storage.backstop_s(settings.groups.closed_retention_s),
        episodes=None,
    )
    outbox = KafkaOutbox(app)
    judges = None
    if settings.groups.judge_url is not None:

        async def post(
            partition: int, key: bytes, value: bytes, headers: list[tuple[str, bytes]]
        ) -> None:
            sent = await by_group.send(key=key, value=value, partition=partition, headers=headers)
            await sent

        judges = JudgeTasks(settings, metrics, post)
        app.task(judges.run)
    stage = GroupStage(
        settings,
        metrics,
        open_groups=Changelog(app, open_table),
        closed_groups=Changelog(app, closed_table),
        records=Sender(outbox, groups_topic),
        dead_letters=Sender(outbox, topics.dead_letters),
        topic=by_group_name,
        steps=Sender(outbox, topics.steps),
        judges=judges,
    )
    run = runner.Runner(
        app,
        settings,
        metrics,
        stage,
        outbox,
        name="groups",
        topic=by_group,
        window=window.current,
        changelogs=[open_table.changelog_topic.get_topic_name()],
    )
    run.summary = stage.publisher.summary
    runner.attach(app, run, open_table)
    _attach_regroup(app, settings, metrics, topics.episodes, by_group, window, open_table)
    source = groups_topic.get_topic_name()
    for suffix, read in outputs(settings.groups, separator(settings.format)).items():
        files = msgspec.structs.replace(settings.sink, prefix=f"{settings.sink.prefix}.{suffix}")
        columns = functools.partial(schema.group_schema, suffix)
        output = sink.Output(f"{suffix}-sink", source, files, read, columns)
        sink.attach(app, topics, settings, metrics, output)
    return stage


def reader(rows_of: Callable[[GroupRecord], list[Row]]) -> Reader:
    """A groups-topic sink reader writing ``rows_of`` each record; the record id
    dedupes a re-emitted group. The manifest gets the weight versions of the
    scored rollouts."""

    def read(value: bytes | None) -> Read:
        record = decode_record(value)
        try:
            lines = [formats.encode(row) for row in rows_of(record)]
        except Exception as exc:  # a bug must cost one record, never the worker
            raise FormatError(f"rows of group {record.record_id!r} failed: {exc!r}") from exc
        versions = tokens.weight_range(e for e, _ in scored_rollouts(record)) if lines else None
        return Read(record.record_id, lines, record.closed_at, None, versions)

    return read


def outputs(settings: GroupSettings, separator: str) -> dict[str, Reader]:
    """Every group output, by the file-name suffix of its prefix; ``separator`` starts
    each continuation of a prompt (``format.text_separator``)."""
    margin = settings.preference_margin
    return {
        "groups": reader(lambda r: [row] if (row := group_row(r)) is not None else []),
        "rollouts": reader(lambda r: rollout_rows(r, separator)),
        "preference": reader(lambda r: preference_rows(r, margin, separator)),
        "kto": reader(lambda r: kto_rows(r, separator)),
        "prompts": reader(
            lambda r: prompt_rows(r, settings.prompts_min_pass_rate, settings.prompts_max_pass_rate)
        ),
    }
