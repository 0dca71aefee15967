"""The regroup agent: every finished episode with a group, re-keyed by its group id
onto the repartition topic ``<app_id>-groups-by-group`` (value: the episode
unchanged), so that one partition, and one worker, owns each group; and the
watermarks that let the groups stage time groups out.

Episodes are acknowledged once their copies are delivered. Each copy carries the
episodes-topic position it came from (:data:`FROM_HEADER`), so the same position
forwarded again after a crash is recognised, not taken for a duplicate.

Each worker's timer sends, for every episodes partition it regroups and has caught
up on, a control tick (the runtime's tick header, plus the source partition) to
every repartition partition, behind the rollouts it forwarded; the groups stage's
clock follows the earliest of these watermarks (see ``groups/stage.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import faust
from faust.types import TP

from stream_export.config import Settings
from stream_export.errors import DecodeError
from stream_export.events import decode_episode
from stream_export.groups.state import group_key
from stream_export.runtime import adapter, shutdown
from stream_export.runtime.app import Topics
from stream_export.runtime.outbox import KafkaOutbox, Sender
from stream_export.runtime.runner import tick_interval
from stream_export.runtime.stage import CONTROL_HEADER, TICK

log = logging.getLogger(__name__)

#: On a watermark tick: the episodes partition it speaks for (its value: the wall
#: time by which that partition's rollouts were all forwarded).
SOURCE_HEADER: Final = "x-stream-export-source"
#: On a forwarded rollout: the episodes-topic position it came from ("partition:offset").
FROM_HEADER: Final = "x-stream-export-from"


class Regroup:
    def __init__(self, app: faust.App, settings: Settings, episodes: str, by_group: Any) -> None:
        self.app, self.settings, self.episodes = app, settings, episodes
        self.by_group = by_group.get_topic_name()
        self.outbox = KafkaOutbox(app)
        self.regrouped = Sender(self.outbox, by_group)
        self.held: list[Any] = []
        self.lock = asyncio.Lock()
        #: Episodes partitions this worker regroups: the last offset handled (None:
        #: none since the partition was assigned).
        self.sources: dict[int, int | None] = {}
        #: When the consumer first knew each episodes partition's end offset, and
        #: when the partitions were assigned (monotonic).
        self.ends_known: dict[int, float] = {}
        self.assigned_at = 0.0

    async def regroup(self, event: Any) -> None:
        """Re-key one finished episode by its group id (held until delivered)."""
        try:
            episode = decode_episode(event.value)
        except DecodeError:  # the sink dead-letters it
            key = None
        else:
            key = group_key(episode, self.settings.groups.fallback_id)
        async with self.lock:
            if key is not None:
                where = f"{event.message.partition}:{event.message.offset}".encode()
                headers = [(FROM_HEADER, where)]
                await self.regrouped.send(key=key.encode(), value=event.value, headers=headers)
            self.held.append(event)
            self.sources[event.message.partition] = event.message.offset

    async def deliver(self) -> None:
        """Acknowledge the episodes whose copies are delivered."""
        async with self.lock:
            held, self.held = self.held, []
            await self.outbox.delivered()
            for event in held:
                event.ack()

    def assigned(self) -> None:
        """The episodes partitions were (re)assigned: none is caught up yet."""
        self.ends_known, self.assigned_at = {}, time.monotonic()
        self.sources = {
            tp.partition: None
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self.episodes
        }

    def _caught_up(self, partition: int, offset: int | None) -> bool:
        """Whether every episode of an episodes partition it can see was forwarded:
        up to the end offset its consumer last heard of, or, with none handled since
        the partition was assigned, nothing arrived for quiet_partition_s after that
        end was known (a backlog arrives without pause). Only cached offsets are
        read: asking the broker here stalls Faust's consumer."""
        tp = TP(self.episodes, partition)
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
        """For each episodes partition caught up on, a control tick to every groups
        partition, behind the rollouts forwarded so far (the same outbox keeps
        their order)."""
        n = self.settings.topics.partitions
        async with self.lock:
            caught_up = [p for p, offset in self.sources.items() if self._caught_up(p, offset)]
            wall = str(time.time()).encode()
            for p in caught_up:
                headers = [(CONTROL_HEADER, TICK), (SOURCE_HEADER, str(p).encode())]
                for q in range(n):
                    await self.outbox.put(self.by_group, q, b"", wall, headers)
            await self.outbox.delivered()


def attach(
    app: faust.App, settings: Settings, topics: Topics, by_group: Any, table: Any
) -> Regroup:
    """Declare the regroup agent, its deliveries and watermarks; ``table`` is the
    groups stage's open table, whose recovery follows every assignment."""
    regroup = Regroup(app, settings, topics.episodes.get_topic_name(), by_group)

    async def assigned() -> None:
        regroup.assigned()

    table.on_recover(assigned)
    # Before Faust commits (a rebalance, the worker stopping): deliver the copies.
    adapter.on_drain(app, lambda: shutdown.drained(app, "groups-regroup", regroup.deliver))

    @app.agent(topics.episodes, name="groups-regroup")
    async def regroup_agent(stream: Any) -> None:
        async for event in stream.noack().events():
            await regroup.regroup(event)

    async def deliver() -> None:
        interval = min(settings.assemble.persist_interval_s, 1.0) / 4
        try:
            while True:
                await asyncio.sleep(interval)
                if regroup.held:
                    await regroup.deliver()
        except Exception as exc:
            log.exception("groups: delivering regrouped episodes failed")
            await app.crash(exc)

    app.task(deliver)
    app.timer(tick_interval(settings), name="groups-watermarks")(regroup.send_watermarks)
    return regroup
