"""A broker-free model of Kafka around the stage runtime, for the unit tests.

Each simulated :class:`Worker` runs the real :class:`stream_export.runtime.stage.Stage`
with a stage's real logic (the assembler's, the groups stage's), over tables and
topics held by one :class:`Broker`. Every effect (a table write, a message sent)
is an :class:`Op` in the broker's log, applied at once and tagged with its
worker's delivery segment: a worker's delivery barrier (``outbox.delivered``, the
end of a table write) closes a segment. A kill -9 (:meth:`World.kill`, also in the
middle of a persist: ``Worker.budget``) keeps of the segment in flight only a
prefix per stream, as Kafka orders messages only per partition, and everything
the worker acknowledged but Faust had not committed is read again by whoever owns
the partition next. A rebalance (:meth:`World.rebalance`) drains every live
worker (persist, then commit), moves partitions and rebuilds every worker's
states from the tables, as Faust's recovery does.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from stream_export.assemble.agent import Assembler
from stream_export.groups import judge
from stream_export.groups.stage import GroupStage
from stream_export.groups.state import OpenGroup
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.stage import Logic, Stage, Write
from stream_export.settings import Settings

#: The window every open-table key is filed under (Faust's window expiry is not modelled).
WINDOW = (0.0, 3599.9)


@dataclass(frozen=True)
class Msg:
    """A message of the input topic, as aiokafka's ConsumerRecord."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0
    topic: str = "input"


@dataclass(frozen=True)
class Op:
    """One effect of ``worker``: a table write (``table`` set) or a message sent."""

    worker: int
    segment: int
    stream: str
    key: Any
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    table: str | None = None


class Killed(Exception):
    """The worker was killed (kill -9) at this point of its work."""


@dataclass
class Broker:
    """The topics and tables all workers share; ``log`` is the input topic."""

    log: dict[int, list[Msg]]
    ops: list[Op] = field(default_factory=list)
    #: Indexes of ops a kill lost (never delivered).
    lost: set[int] = field(default_factory=set)
    tables: dict[str, dict[Any, bytes]] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)

    def table(self, name: str) -> dict[Any, bytes]:
        return self.tables.setdefault(name, {})

    def apply(self, op: Op) -> None:
        if op.table is None:
            return
        table = self.table(op.table)
        if op.value is None:
            table.pop(op.key, None)
        else:
            table[op.key] = op.value

    def lose(self, worker: int, segment: int, rng: random.Random) -> None:
        """Worker ``worker`` died with ``segment`` in flight: of each stream, a random
        prefix of that segment's ops was delivered; the tables are replayed."""
        flight = [
            i for i, op in enumerate(self.ops) if (op.worker, op.segment) == (worker, segment)
        ]
        self.lost.update(lost_in_flight(self.ops, flight, rng))
        self.tables = {}
        for i, op in enumerate(self.ops):
            if i not in self.lost:
                self.apply(op)

    def delivered(self, stream: str) -> list[Op]:
        """The messages sent to ``stream`` (a topic) and delivered, in order."""
        return [
            op
            for i, op in enumerate(self.ops)
            if op.table is None and op.stream.split("/")[0] == stream and i not in self.lost
        ]


def lost_in_flight(ops: Sequence[Op], flight: Sequence[int], rng: random.Random) -> set[int]:
    """Which of the ops in flight (their indexes, in order) a kill -9 lost: each
    stream delivered a random prefix of its own, as Kafka orders messages only per
    partition."""
    keep = {
        stream: rng.randint(0, n) for stream, n in Counter(ops[i].stream for i in flight).items()
    }
    lost = set()
    for i in flight:
        stream = ops[i].stream
        if keep[stream] > 0:
            keep[stream] -= 1
        else:
            lost.add(i)
    return lost


class Worker:
    """One simulated worker: the real Stage and a stage's real logic, whose ports
    (tables, senders, outbox) record into the broker."""

    def __init__(
        self,
        number: int,
        broker: Broker,
        make_logic: Callable[[Worker], Logic[Any]],
        rng: random.Random,
    ) -> None:
        self.number, self.broker, self.rng = number, broker, rng
        self.segment = 0
        #: Ops this worker may still do before it is killed (None: not planned).
        self.budget: int | None = None
        self.acked: dict[int, int] = {}
        #: (ops so far, offset acknowledged on partition 0) at the last acknowledgement.
        self.last_ack = (0, 0)
        self.fetch: dict[int, int] = {}
        self.refetched = 0
        self.wall = 0.0
        self.stage: Stage[Any] = Stage(make_logic(self), self, self._acknowledge)

    # -- the ports ----------------------------------------------------------------

    def record(self, op: Op) -> None:
        """One effect, at a moment when Faust's commit loop may commit too (it runs
        whenever the stage waits for Kafka)."""
        if self.rng.random() < 0.1:
            self.commit()
        if self.budget is not None:
            if self.budget <= 0:
                raise Killed
            self.budget -= 1
        self.broker.ops.append(op)
        self.broker.apply(op)

    def table(self, name: str) -> SimTable:
        return SimTable(self, name)

    def sender(self, topic: str) -> SimSend:
        return SimSend(self, topic)

    async def send(self) -> None:
        """The outbox sends its batches (what is recorded is on its way already)."""

    async def delivered(self) -> None:
        self.segment += 1

    def _acknowledge(self, offsets: Mapping[int, int]) -> None:
        self.acked.update(offsets)
        self.last_ack = (len(self.broker.ops), self.acked.get(0, 0))

    # -- driving it ---------------------------------------------------------------

    def assign(self, partitions: Sequence[int], wall: float) -> None:
        """Rebuild the states of ``partitions`` from the tables, at their committed offsets."""
        positions = {p: self.broker.committed.get(p, 0) for p in partitions}
        self.acked = {p: at for p, at in self.acked.items() if p in positions}
        self.fetch = dict(positions)
        self.wall = wall
        self.stage.rebuild(list(partitions), wall, positions)

    def work(self, drop: float) -> bool:
        """Fetch a few messages of one partition (each missing from the fetch with
        probability ``drop``), end the batch or persist now and then; whether there
        was anything left to fetch."""
        ready = [p for p, at in self.fetch.items() if at < len(self.broker.log[p])]
        if not ready:
            return False
        p = self.rng.choice(ready)
        start = self.fetch[p]
        batch = self.broker.log[p][start : start + self.rng.randint(1, 4)]
        self.fetch[p] = start + len(batch)
        fetched = [m for m in batch if self.rng.random() >= drop]
        run(self.stage.take(p, fetched, self.refetch))
        if self.rng.random() < 0.5:
            run(self.stage.end_batch())
        if self.rng.random() < 0.3:
            self.persist()
        return True

    def persist(self) -> None:
        run(self.stage.end_batch())
        run(self.stage.persist(WINDOW))

    def commit(self) -> None:
        """Faust's commit loop: what was acknowledged becomes the committed offset."""
        self.broker.committed.update(self.acked)

    async def refetch(self, partition: int, start: int, end: int) -> list[Msg]:
        found = [m for m in self.broker.log[partition] if start <= m.offset < end]
        self.refetched += len(found)
        return found


class SimTable:
    """A stage's table (stage.Table) in the broker, keyed per partition as each
    partition of a Faust table is a store of its own (a partition's clock key is
    not another's); every write (all its partitions) is one delivery."""

    def __init__(self, worker: Worker, name: str) -> None:
        self.worker, self.name = worker, name

    async def write(self, writes: Mapping[int, Sequence[Write]]) -> None:
        w = self.worker
        for partition, items in writes.items():
            for key, value in items:
                stream = f"{self.name}/{partition}"
                w.record(Op(w.number, w.segment, stream, (partition, key), value, table=self.name))
        w.segment += 1

    def read(self, partition: int, key: Any) -> bytes | None:
        return self.worker.broker.table(self.name).get((partition, key))

    def items(self) -> Iterator[tuple[Any, bytes, list[Any]]]:
        for (_partition, key), value in list(self.worker.broker.table(self.name).items()):
            yield key, value, []

    def expire_only(self, keys: Any) -> None:
        """Faust's window expiry is not modelled."""


class SimSend:
    """A stage's sender (stage.Send) to one topic of the broker."""

    def __init__(self, worker: Worker, topic: str) -> None:
        self.worker, self.topic = worker, topic

    async def send(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        w = self.worker
        # Each key may go to another partition of the topic: a stream of its own.
        stream = f"{self.topic}/{key!r}"
        w.record(Op(w.number, w.segment, stream, key, value, tuple(headers or ())))


@dataclass
class World:
    """Workers sharing a broker, with kills and rebalances between them."""

    broker: Broker
    make_logic: Callable[[Worker], Logic[Any]]
    rng: random.Random
    workers: dict[int, Worker] = field(default_factory=dict)
    born: int = 0
    wall: float = 0.0

    def start(self) -> Worker:
        """A new worker joins (it owns nothing until the next rebalance)."""
        self.born += 1
        worker = Worker(self.born, self.broker, self.make_logic, self.rng)
        worker.wall = self.wall
        self.workers[self.born] = worker
        return worker

    def rebalance(self) -> None:
        """Every live worker persists and commits (Faust's wait for acknowledgements
        before it commits), then the partitions are dealt anew and every worker
        rebuilds its states, as Faust's recovery does after each rebalance."""
        for worker in self.workers.values():
            worker.persist()
            worker.commit()
        live = list(self.workers.values())
        if not live:
            return
        partitions = sorted(self.broker.log)
        self.rng.shuffle(partitions)
        owned: dict[int, list[int]] = {w.number: [] for w in live}
        for i, p in enumerate(partitions):
            owned[live[i % len(live)].number].append(p)
        for worker in live:
            worker.assign(sorted(owned[worker.number]), self.wall)

    def rebalance_safely(self) -> None:
        """A rebalance; a worker killed on its way is gone, and the rest rebalance again."""
        while True:
            try:
                self.rebalance()
                return
            except Killed:
                for worker in list(self.workers.values()):
                    if worker.budget == 0:
                        self.kill(worker)

    def kill(self, worker: Worker) -> None:
        """kill -9: the segment in flight is partly lost, nothing more is committed."""
        self.broker.lose(worker.number, worker.segment, self.rng)
        del self.workers[worker.number]

    def step(self, drop: float) -> bool:
        """One worker works; whether any had something to fetch."""
        workers = list(self.workers.values())
        self.rng.shuffle(workers)
        for worker in workers:
            try:
                if worker.work(drop):
                    if self.rng.random() < 0.2:
                        worker.commit()
                    return True
            except Killed:
                self.kill(worker)
                return True
        return False


def assembler(
    worker: Worker, settings: Settings, metrics: Metrics, tables: tuple[str, str]
) -> Assembler:
    """The real assembler on ``worker``'s ports: ``tables`` are its (chunks, markers)."""
    return Assembler(
        settings,
        metrics,
        chunks=worker.table(tables[0]),
        markers=worker.table(tables[1]),
        episodes=worker.sender("episodes"),
        dead_letters=worker.sender("dead"),
        steps_topic="steps",
        stale=lambda end, wall: False,
        clock=lambda: worker.wall,
        scores=worker.sender("scores"),
    )


@dataclass
class SimJudges:
    """A judge that answers at once: each judging asked for appends a verdict with
    random scores (another each time) to the group's partition of the input topic."""

    worker: Worker

    def start(self, partition: int, group: OpenGroup) -> None:
        log, rng = self.worker.broker.log[partition], self.worker.rng
        ids = [group.members[i].episode_id for i in judge.judged_members(group)]
        scores = None if rng.random() < 0.2 else {e: rng.randint(0, 10) / 10 for e in ids}
        verdict = judge.Verdict(
            group_id=group.group_id, time=self.worker.wall, scores=scores, attempts=1
        )
        headers = ((judge.VERDICT_HEADER, b"1"),)
        key, value = group.group_id.encode(), msgspec.json.encode(verdict)
        log.append(Msg(partition, len(log), key, value, headers))

    def keep(self, partitions: Iterable[int]) -> None:
        """Verdicts are on the topic at once: nothing to stop."""


def group_stage(worker: Worker, settings: Settings) -> GroupStage:
    """The real groups stage on ``worker``'s ports (with :class:`SimJudges` when
    ``groups.judge_url`` is set)."""
    return GroupStage(
        settings,
        Metrics(),
        open_groups=worker.table("groups-open"),
        closed_groups=worker.table("groups-closed"),
        records=worker.sender("groups"),
        dead_letters=worker.sender("dead"),
        topic="by-group",
        steps=worker.sender("steps"),
        judges=SimJudges(worker) if settings.groups.judge_url is not None else None,
    )


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits (the simulation's I/O completes at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the stage waited for something the simulation lacks")
