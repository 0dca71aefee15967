"""One runtime for every stateful stage, without Faust: positions and gaps, batch
ends, the persist order and acknowledgement.

A stage (the assembler, the groups stage) supplies only its :class:`Logic`: what
one message, one tick and one batch end do to a partition's state, what a persist
writes, and how the state is rebuilt from its tables. :class:`Stage` owns the
rest, and the worker runs it against Kafka (:mod:`.runner`) while the unit tests
run the very same object against dicts (``tests/support/stage_sim.py``): the
crash and rebalance tests check the code that runs.

Order of a persist, each step waiting for the previous one's delivery:

1. every record and dead letter the stage sent so far is delivered (``Outbox``);
2. the stage's writes to each of its tables, in the order of :attr:`Logic.tables`
   (the assembler: the closed markers, then the open chunks; the groups stage:
   the closed markers, the open groups, the clock), so each table's state implies
   that everything decided before it is durable. One table's writes of every
   partition handled since the last persist go out together and are awaited
   together: partitions are independent (each has its own changelog partition,
   state and offset), so only the order between tables matters, and a persist
   waits for one delivery per table instead of one per table and partition
   (with 4 partitions, 3 round trips instead of 9 while intake waits);
3. only then is each such partition acknowledged up to its position: an offset
   can be committed only once all of its effects are in Kafka.

A crash anywhere replays the unacknowledged messages onto tables that hold part
of their effects; each stage's logic recognises them by offset.

The position of a partition is the offset after the last message handled, and
it only moves over messages that were handled: when a fetched batch starts past
it (a gap: records a seek or a dropped fetch skipped, also right after a
rebuild, when the position is the committed offset), the messages in between are
read again and handled first. So an acknowledged offset never covers a message
that was not handled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

#: A control message (never data): its header, and the value of a tick's header.
CONTROL_HEADER: Final = "x-stream-export-control"
TICK: Final = b"tick"

#: One table write: a key and its value, or None to delete it.
Write = tuple[Any, bytes | None]
#: A window of the open tables, (start, end).
Window = tuple[float, float]


class TableWriter(Protocol):
    async def write(self, writes: Mapping[int, Sequence[Write]]) -> None:
        """Write (value) or delete (None) each key of each partition of ``writes``:
        every partition's writes delivered to the table's changelog first, then
        applied to the local store."""


class Table(TableWriter, Protocol):
    """A stage's table: written through its changelog, read from the local store."""

    def read(self, partition: int, key: Any) -> bytes | None:
        """The whole value of ``key`` in ``partition`` (None: absent)."""

    def items(self) -> Iterator[tuple[Any, bytes, list[Any]]]:
        """Every (key, whole value, keys of its pieces) stored for this worker."""

    def expire_only(self, keys: Iterable[tuple[int, Any]]) -> None:
        """Track exactly these (partition, key) pairs for window expiry (a rebuild)."""


class Send(Protocol):
    async def send(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Send one message to the topic through the stage's outbox."""


class Outbox(Protocol):
    async def send(self) -> None:
        """Send what is gathered now (its delivery is awaited by :meth:`delivered`)."""

    async def delivered(self) -> object:
        """Return once every message sent so far is acknowledged by Kafka."""


class Record(Protocol):
    """A message of a stage's input topic (an aiokafka ``ConsumerRecord``)."""

    @property
    def offset(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


S = TypeVar("S")
R = TypeVar("R", bound=Record)

#: Reads a partition's messages ``start`` to ``end - 1`` again.
Refetch = Callable[[int, int, int], Awaitable[Sequence[R]]]
#: Lets the consumer commit each partition up to the offset given (exclusive).
Acknowledge = Callable[[Mapping[int, int]], None]


class Logic(Protocol[S]):
    """What a stateful stage supplies: per-partition rules and its writes."""

    @property
    def tables(self) -> Sequence[TableWriter]:
        """The stage's tables, in the order a persist writes them."""

    async def handle(self, partition: int, state: S, record: Any) -> None:
        """Apply one data message; what it publishes goes through the stage's outbox."""

    async def tick(self, partition: int, state: S, record: Any) -> None:
        """Apply one control tick (handled in log order, like data)."""

    async def end_batch(self, partition: int, state: S) -> None:
        """The batch ends: close what is due and publish it."""

    def writes(self, partition: int, state: S, window: Window) -> Sequence[Sequence[Write]]:
        """What a persist stores of ``partition`` now, one list per table of
        :attr:`tables`; new keys are filed under ``window``."""

    def rebuild(self, partitions: Sequence[int], wall: float) -> dict[int, S]:
        """The states of ``partitions`` read back from the tables' local stores."""


def is_tick(record: Record) -> bool:
    headers = record.headers
    return bool(headers) and (CONTROL_HEADER, TICK) in headers


class Stage(Generic[S]):
    """The partition states of one stage on one worker, what it handled since the
    last persist, and the protocol that makes it durable."""

    def __init__(self, logic: Logic[S], outbox: Outbox, acknowledge: Acknowledge) -> None:
        self.logic, self.outbox, self.acknowledge = logic, outbox, acknowledge
        self.states: dict[int, S] = {}
        #: Per partition, the offset after the last message handled (None: not
        #: known, the first message read starts the partition).
        self.positions: dict[int, int | None] = {}
        #: Partitions with messages since the last end of batch.
        self.batch: set[int] = set()
        #: How many messages were handled since the last persist, and where.
        self.pending = 0
        self.touched: set[int] = set()

    def reset(self, states: dict[int, S], positions: Mapping[int, int | None]) -> None:
        """Start over with rebuilt states (after recovery or a rebalance) at
        ``positions`` (the committed offsets); whatever was handled and not
        acknowledged will be read again."""
        self.states, self.positions = states, dict(positions)
        self.batch, self.pending, self.touched = set(), 0, set()

    def rebuild(
        self, partitions: Sequence[int], wall: float, positions: Mapping[int, int | None]
    ) -> None:
        """Rebuild the states of ``partitions`` (this worker's after a rebalance)."""
        self.reset(self.logic.rebuild(partitions, wall), positions)

    async def take(self, partition: int, records: Sequence[R], refetch: Refetch[R]) -> None:
        """Handle fetched ``records`` of ``partition`` (in offset order): those
        before its position were handled already and are skipped, and those missing
        before a record past it are read with ``refetch(partition, start, end)`` and
        handled first."""
        state = self.states.get(partition)
        if state is None:
            # Fetched before this partition was rebuilt here; its position is then
            # the committed offset, and the records are read again.
            return
        position, handled = self.positions.get(partition), 0
        # Bound once: this loop runs for every message (no frame of its own either).
        handle, tick = self.logic.handle, self.logic.tick
        for record in records:
            offset = record.offset
            if position is not None and offset < position:
                continue
            if position is not None and offset > position:
                for missed in await refetch(partition, position, offset):
                    await (tick if is_tick(missed) else handle)(partition, state, missed)
                    handled += 1
            await (tick if is_tick(record) else handle)(partition, state, record)
            handled += 1
            position = offset + 1
        if handled:
            self.positions[partition] = position
            self.batch.add(partition)
            self.touched.add(partition)
            self.pending += handled

    async def end_batch(self) -> None:
        """Close what is due in the partitions of the batch and publish it."""
        batch, self.batch = self.batch, set()
        for p in sorted(batch):
            await self.logic.end_batch(p, self.states[p])
        # On their way now, not at the persist: the sinks can write them while the
        # persist interval runs (the persist still awaits their delivery).
        await self.outbox.send()

    async def persist(self, window: Window) -> Iterable[int]:
        """Make everything handled so far durable, in order, then acknowledge it.
        Returns the partitions persisted."""
        touched = self.touched
        self.pending, self.touched = 0, set()
        acknowledged = {p: self.positions[p] for p in touched}
        await self.outbox.delivered()
        tables = self.logic.tables
        per_table: list[dict[int, Sequence[Write]]] = [{} for _ in tables]
        for p in sorted(touched):
            writes = self.logic.writes(p, self.states[p], window)
            for by_partition, items in zip(per_table, writes, strict=True):
                if items:
                    by_partition[p] = items
        for table, by_partition in zip(tables, per_table, strict=True):
            if by_partition:
                await table.write(by_partition)
        self.acknowledge({p: at for p, at in acknowledged.items() if at is not None})
        return touched
