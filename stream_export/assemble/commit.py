"""The assembler's commit protocol, without Faust: what ending a batch does, and in
which order a persist makes everything handled durable before acknowledging it.

The worker (``assemble/agent.py``) runs it against Kafka through the small interfaces
below; the unit tests run the very same object against dicts
(``tests/support/assemble_sim.py``), so the crash property tests check the code
that runs.

Order of a persist, each step waiting for the previous one's delivery:

1. every episode and dead letter sent so far is delivered (``Outbox``);
2. the markers of the episodes published since the last persist are written
   (closed-episodes table), so a marker implies its episode was delivered;
3. per partition, the published episodes' chunks are deleted and one new chunk
   per episode that gained events is written (open-episodes table), so a
   stored chunk implies that everything decided before it is durable;
4. only then is each touched partition acknowledged up to its position: an
   offset can be committed only once all of its effects are in Kafka.

A crash anywhere replays the unacknowledged messages onto tables that hold part
of their effects; the state machine recognises them by offset.

The position of a partition is the offset after the last message handled, and
it only moves over messages that were handled: when a fetched batch starts past
it (a gap: records a seek or a dropped fetch skipped, also right after a
rebuild, when the position is the committed offset), the messages in between are
read again and handled first. So an acknowledged offset never covers a message
that was not handled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from stream_export.assemble.chunks import Window
from stream_export.assemble.episode import Finished, OpenEpisode
from stream_export.assemble.state import PartitionState


class TableWriter(Protocol):
    async def write(self, partition: int, items: Sequence[tuple[Any, bytes | None]]) -> None:
        """Write (value) or delete (None) each key of ``partition``: delivered to the
        table's changelog first, then applied to the local store."""


class Outbox(Protocol):
    async def delivered(self) -> object:
        """Return once every message sent so far is acknowledged by Kafka."""


class Record(Protocol):
    """A message of the steps topic (an aiokafka ``ConsumerRecord``)."""

    @property
    def offset(self) -> int: ...


R = TypeVar("R", bound=Record)

#: Publishes one closed episode (or dead-letters it), through the outbox.
Publish = Callable[[int, Finished], Awaitable[None]]
#: Lets the consumer commit each partition up to the offset given (exclusive).
Acknowledge = Callable[[Mapping[int, int]], None]


class Commit:
    """The partition states of one worker, what it handled since the last persist,
    and the protocol that makes it durable."""

    def __init__(
        self,
        outbox: Outbox,
        markers: TableWriter,
        chunks: TableWriter,
        publish: Publish,
        acknowledge: Acknowledge,
    ) -> None:
        self.outbox, self.markers, self.chunks = outbox, markers, chunks
        self.publish, self.acknowledge = publish, acknowledge
        self.states: dict[int, PartitionState] = {}
        #: Per partition, the offset after the last message handled (None: not
        #: known, the first message read starts the partition).
        self.positions: dict[int, int | None] = {}
        #: Partitions with messages since the last end of batch.
        self.batch: set[int] = set()
        #: How many messages were handled since the last persist, and where.
        self.pending = 0
        self.touched: set[int] = set()
        #: Episodes published since the last persist, to mark closed, per partition.
        self.closed: dict[int, list[OpenEpisode]] = {}

    def reset(self, states: dict[int, PartitionState], positions: Mapping[int, int | None]) -> None:
        """Start over with rebuilt states (after recovery or a rebalance) at
        ``positions`` (the committed offsets); whatever was handled and not
        acknowledged will be read again."""
        self.states, self.positions = states, dict(positions)
        self.batch, self.pending, self.touched, self.closed = set(), 0, set(), {}

    async def take(
        self,
        partition: int,
        records: Sequence[R],
        refetch: Callable[[int, int, int], Awaitable[Sequence[R]]],
        handle: Callable[[PartitionState, R], Awaitable[None]],
    ) -> None:
        """Handle fetched ``records`` of ``partition`` (in offset order) with
        ``handle``: those before its position were handled already and are
        skipped, and those missing before a record past it are read with
        ``refetch(partition, start, end)`` and handled first."""
        state, position = self.states[partition], self.positions.get(partition)
        handled = 0
        for record in records:
            offset = record.offset
            if position is not None and offset < position:
                continue
            if position is not None and offset > position:
                for missed in await refetch(partition, position, offset):
                    await handle(state, missed)
                    handled += 1
            await handle(state, record)
            handled += 1
            position = offset + 1
        if handled:
            self.positions[partition] = position
            self.batch.add(partition)
            self.touched.add(partition)
            self.pending += handled

    async def end_batch(self) -> None:
        """Close the due episodes of the partitions in the batch and publish them."""
        batch, self.batch = self.batch, set()
        for p in sorted(batch):
            state = self.states[p]
            state.sweep()
            finished = state.take_finished()
            for item in finished:
                await self.publish(p, item)
            if finished:
                self.closed.setdefault(p, []).extend(item.episode for item in finished)

    async def persist(self, window: Window) -> Iterable[int]:
        """Make everything handled so far durable, in order, then acknowledge it.
        Returns the partitions whose open state changed."""
        touched, closed = self.touched, self.closed
        self.pending, self.touched, self.closed = 0, set(), {}
        acknowledged = {p: self.positions[p] for p in touched}
        await self.outbox.delivered()
        for p, episodes in closed.items():
            state = self.states[p]
            await self.markers.write(p, [(ep.key, state.marker(ep)) for ep in episodes])
        for p in sorted(touched):
            state = self.states[p]
            gone = [key for ep in closed.get(p, ()) for key in state.forget(ep)]
            writes: list[tuple[Any, bytes | None]] = [(k, None) for k in gone + state.garbage]
            writes += state.flush(window)
            state.garbage.clear()
            await self.chunks.write(p, writes)
        self.acknowledge({p: at for p, at in acknowledged.items() if at is not None})
        return touched
