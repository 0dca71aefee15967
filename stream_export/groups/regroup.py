"""The regroup stage: every finished episode with a group, re-keyed by its group id
onto the repartition topic ``<app_id>-groups-by-group`` (value: the episode
unchanged), so that one partition, and one worker, owns each group; and the
watermarks that let the groups stage time groups out.

It runs on the stage runtime like the other stages (:mod:`stream_export.runtime.stage`),
with no table: an episode is acknowledged once its copy is delivered, and an
episodes-topic offset is acknowledged only when every episode before it was
forwarded (gaps in a fetch are read back, which Faust's per-message path would
have committed over). Each copy carries the episodes-topic position it came from
(:data:`FROM_HEADER`), so the same position forwarded again after a crash is
recognised, not taken for a duplicate.

For every episodes partition it regroups and has caught up on, a timer sends a
control tick (the runtime's tick header, plus the source partition) to every
repartition partition, behind the rollouts it forwarded; the groups stage's
clock follows the earliest of these watermarks (see ``groups/stage.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from stream_export.contract.decoding import decode_episode
from stream_export.errors import DecodeError
from stream_export.groups.keys import group_key
from stream_export.runtime.stage import CONTROL_HEADER, TICK, Send, Window, Write
from stream_export.settings import Settings

#: On a watermark tick: the episodes partition it speaks for (its value: the wall
#: time by which that partition's rollouts were all forwarded).
SOURCE_HEADER: Final = "x-stream-export-source"
#: On a forwarded rollout: the episodes-topic position it came from ("partition:offset").
FROM_HEADER: Final = "x-stream-export-from"


class Source:
    """One episodes partition: the offset of the last episode forwarded (None: none
    since the partition was assigned here) and when its end offset became known."""

    __slots__ = ("end_known", "last")

    def __init__(self) -> None:
        self.last: int | None = None
        self.end_known: float | None = None


class Watermark:
    """The control tick that says a source partition forwarded all it had by a wall time."""

    def __init__(self, source: int, wall: float) -> None:
        self.headers = [(CONTROL_HEADER, TICK), (SOURCE_HEADER, str(source).encode())]
        self.value = str(wall).encode()


class Regroup:
    """The regroup stage's logic (:class:`.stage.Logic`); it has no table."""

    tables: tuple[()] = ()

    def __init__(
        self, settings: Settings, copies: Send, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings, self.copies, self.clock = settings, copies, clock
        #: When the partitions were last assigned (the clock's time).
        self.assigned_at = 0.0

    async def handle(self, partition: int, source: Source, message: Any) -> None:
        """Forward one finished episode, keyed by its group (none: not forwarded)."""
        try:
            episode = decode_episode(message.value)
        except DecodeError:  # the sinks dead-letter it
            key = None
        else:
            key = group_key(episode, self.settings.groups.fallback_id)
        if key is not None:
            headers = [(FROM_HEADER, f"{partition}:{message.offset}".encode())]
            await self.copies.send(key=key.encode(), value=message.value, headers=headers)
        source.last = message.offset

    async def tick(self, partition: int, source: Source, message: Any) -> None:
        """No one sends ticks to the episodes topic; a foreign one changes nothing."""

    async def end_batch(self, partition: int, source: Source) -> None:
        """Nothing: the runtime sends the copies at the end of each batch."""

    def writes(self, partition: int, source: Source, window: Window) -> list[list[Write]]:
        return []

    def rebuild(self, partitions: Sequence[int], wall: float) -> dict[int, Source]:
        self.assigned_at = self.clock()
        return {p: Source() for p in partitions}

    def caught_up(self, source: Source, end: int | None) -> bool:
        """Whether every episode of a source partition was forwarded: up to ``end``,
        the end offset the consumer last heard of (None: not yet), or, with none
        forwarded since the partition was assigned, nothing arrived for
        quiet_partition_s after that end was known (a backlog arrives without pause)."""
        if end is None:
            return False
        if source.last is not None:
            return source.last + 1 >= end
        if source.end_known is None:
            source.end_known = self.clock()
        quiet = self.clock() - max(self.assigned_at, source.end_known)
        return quiet >= self.settings.assemble.quiet_partition_s

    def watermarks(
        self, sources: Mapping[int, Source], ends: Mapping[int, int | None]
    ) -> list[Watermark]:
        """A watermark for each source partition caught up on."""
        wall = time.time()
        return [
            Watermark(p, wall)
            for p, source in sources.items()
            if self.caught_up(source, ends.get(p))
        ]
