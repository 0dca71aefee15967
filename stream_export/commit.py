"""The assembler's commit protocol, without Faust: what ending a batch does, and in
which order a persist makes everything handled durable before acknowledging it.

The worker (``assemble.py``) runs it against Kafka through the small interfaces
below; the unit tests run the very same object against dicts
(``tests/unit/assemble_sim.py``), so the crash property tests check the code
that runs.

Order of a persist, each step waiting for the previous one's delivery:

1. every episode and dead letter sent so far is delivered (``Outbox``);
2. the markers of the episodes published since the last persist are written
   (closed-episodes table), so a marker implies its episode was delivered;
3. per partition, the published episodes' chunks are deleted and one new chunk
   per episode that gained events is written (open-episodes table), so a
   stored chunk implies that everything decided before it is durable;
4. only then is every handled message acknowledged: an offset can be committed
   only once all of its effects are in Kafka.

A crash anywhere replays the unacknowledged messages onto tables that hold part
of their effects; the state machine recognises them by offset.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from stream_export.episode_state import Finished, OpenEpisode, PartitionState, Window


class TableWriter(Protocol):
    async def write(self, partition: int, items: Sequence[tuple[Any, bytes | None]]) -> None:
        """Write (value) or delete (None) each key of ``partition``: delivered to the
        table's changelog first, then applied to the local store."""


class Outbox(Protocol):
    async def delivered(self) -> object:
        """Return once every message sent so far is acknowledged by Kafka."""


class Ack(Protocol):
    def ack(self) -> None:
        """Let the consumer commit past this message."""


#: Publishes one closed episode (or dead-letters it), through the outbox.
Publish = Callable[[int, Finished], Awaitable[None]]


class Commit:
    """The partition states of one worker, what it handled since the last persist,
    and the protocol that makes it durable."""

    def __init__(
        self, outbox: Outbox, markers: TableWriter, chunks: TableWriter, publish: Publish
    ) -> None:
        self.outbox, self.markers, self.chunks, self.publish = outbox, markers, chunks, publish
        self.states: dict[int, PartitionState] = {}
        #: Partitions with messages since the last end of batch.
        self.batch: set[int] = set()
        #: Messages handled since the last persist, and their partitions.
        self.held: list[Ack] = []
        self.touched: set[int] = set()
        #: Episodes published since the last persist, to mark closed, per partition.
        self.closed: dict[int, list[OpenEpisode]] = {}

    def reset(self, states: dict[int, PartitionState]) -> None:
        """Start over with rebuilt states (after recovery or a rebalance); whatever
        was held is not acknowledged and will be read again."""
        self.states = states
        self.batch, self.held, self.touched, self.closed = set(), [], set(), {}

    def handled(self, partition: int, message: Ack) -> None:
        """``message`` of ``partition`` was applied to its state."""
        self.batch.add(partition)
        self.touched.add(partition)
        self.held.append(message)

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
        held, touched, closed = self.held, self.touched, self.closed
        self.held, self.touched, self.closed = [], set(), {}
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
        for message in held:
            message.ack()
        return touched
