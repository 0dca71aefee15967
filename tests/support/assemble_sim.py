"""A broker-free model of the assemble agent's batch protocol, for the unit tests.

:class:`Pipeline` drives one :class:`PartitionState` with exactly the ordering of
``stream_export.assemble.agent.Assembler``, by running the same code: each batch of
records goes through the real :class:`stream_export.assemble.commit.Commit` (positions and
gaps, batch ends, persists and acknowledgements), each message through
``assemble.state.receive``; gaps are read back from :attr:`Pipeline.log`, the
topic as a dict. Every effect is appended to ``ops``, each
delivery barrier starts a new segment; a crash keeps only what was durable (see
:func:`crash`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_export.assemble.chunks import ChunkKey
from stream_export.assemble.commit import Commit
from stream_export.assemble.episode import Finished, build_episode, token_outcome
from stream_export.assemble.state import PartitionState, Rejected, receive
from stream_export.config import AssembleSettings
from stream_export.events import Episode, EpisodeEnd, EpisodeStart, Step, StepEvent, encode

TICK = "tick"
#: A message as the agent gets it: (key, value) bytes, whatever they hold.
Message = tuple[bytes | None, bytes | None]
Item = tuple[int, StepEvent | str | Message]


@dataclass(frozen=True)
class Record:
    """A message of the topic at ``offset`` (as aiokafka's ConsumerRecord, for Commit)."""

    offset: int
    event: StepEvent | str | Message


#: The window every chunk is filed under (the window expiry is Faust's, not modelled).
WINDOW = (0.0, 3599.9)


@dataclass
class Memory:
    """The two tables."""

    chunks: dict[ChunkKey, bytes] = field(default_factory=dict)
    markers: dict[bytes, bytes] = field(default_factory=dict)

    def chunk(self, key: ChunkKey) -> bytes | None:
        return self.chunks.get(key)

    def marker(self, key: bytes) -> bytes | None:
        return self.markers.get(key)


@dataclass(frozen=True)
class Op:
    """One effect: ``stream`` is where it goes; ``segment`` counts delivery barriers."""

    stream: str
    segment: int
    key: bytes | ChunkKey
    value: bytes | None = None
    episode: Episode | None = None


class Pipeline:
    """One partition of the assemble agent: the real per-message rules
    (``assemble.state.receive``) and the real :class:`~stream_export.assemble.commit.Commit`,
    over dict tables whose every effect is appended to ``ops``."""

    def __init__(
        self,
        settings: AssembleSettings,
        memory: Memory | None = None,
        *,
        position: int | None = None,
        log: Mapping[int, StepEvent | str | Message] | None = None,
    ) -> None:
        self.settings = settings
        #: The topic, from which gaps are read back (empty: nothing is found).
        self.log = log or {}
        self.refetched = 0
        self.memory = memory or Memory()
        self.state = PartitionState(0, settings, self.memory)
        self.emitted: list[Episode] = []
        self.dead: list[tuple[str, int]] = []
        self.verdicts: Counter[str] = Counter()
        self.ops: list[Op] = []
        self.segment = 0
        #: Offset after the last acknowledged message: a commit can reach this far.
        self.acked = 0
        #: (ops so far, acked) when the last message was acknowledged: Faust may
        #: commit at any moment after an acknowledgement.
        self.last_ack = (0, 0)
        self.commit = Commit(
            self, _Table(self, "markers"), _Table(self, "chunks"), self._publish, self._acknowledge
        )
        self.commit.reset({0: self.state}, {0: position})
        self.wall = 0.0

    @classmethod
    def rebuilt(
        cls, settings: AssembleSettings, memory: Memory, wall: float, **kwargs: Any
    ) -> Pipeline:
        from stream_export.assemble.chunks import decode_index

        pipeline = cls(settings, memory, **kwargs)
        items = [(k, decode_index(v)) for k, v in memory.chunks.items()]
        pipeline.state.load(items, wall)
        return pipeline

    def batch(self, items: list[Item], wall: float, *, persist: bool = True) -> None:
        """One batch; with ``persist`` it is followed by :meth:`persist`, after
        which every event so far is acknowledged (may be committed)."""
        self.wall = wall
        records = [Record(offset, event) for offset, event in items]
        _run(self.commit.take(0, records, self._refetch, self._handle))
        _run(self.commit.end_batch())
        if persist:
            self.persist()

    async def _handle(self, state: PartitionState, record: Record) -> None:
        offset, event, wall = record.offset, record.event, self.wall
        if isinstance(event, str):
            state.tick(offset, wall)
            return
        key, raw = event if isinstance(event, tuple) else (event.episode_id.encode(), encode(event))
        _, result, _ = receive(state, key, raw, offset, wall)
        if isinstance(result, Rejected):
            self.verdicts[result.reason] += 1
            self.dead.append((result.reason, offset))
        else:
            self.verdicts[result.value] += 1

    async def _refetch(self, partition: int, start: int, end: int) -> list[Record]:
        found = [Record(o, self.log[o]) for o in range(start, end) if o in self.log]
        self.refetched += len(found)
        return found

    def _acknowledge(self, offsets: Mapping[int, int]) -> None:
        self.acked = max(self.acked, offsets.get(0, 0))
        self.last_ack = (len(self.ops), self.acked)

    def persist(self) -> None:
        _run(self.commit.persist(WINDOW))

    async def delivered(self) -> None:
        """The outbox: everything sent so far is delivered."""
        self.segment += 1

    async def _publish(self, partition: int, item: Finished) -> None:
        episode = build_episode(partition, item)
        if episode is None:
            self.dead += [("missing_start", p.offset) for p in item.parts]
        else:
            self.emitted.append(episode)
            self.ops.append(Op("episodes", self.segment, item.episode.key, episode=episode))
            _, rejects = token_outcome(item, episode)
            self.dead += [(e.reason, p.offset) for gone, e in rejects for p in gone.parts]

    def record(self, stream: str, key: bytes | ChunkKey, value: bytes | None) -> None:
        """Apply one table write to the dicts and append it to ``ops``."""
        _apply(self.memory, Op(stream, self.segment, key, value))
        self.ops.append(Op(stream, self.segment, key, value))


def _key(event: StepEvent) -> bytes:
    return event.episode_id.encode()


class _Table:
    """A table writer whose write returns once delivered (a delivery barrier)."""

    def __init__(self, pipeline: Pipeline, stream: str) -> None:
        self.pipeline, self.stream = pipeline, stream

    async def write(self, partition: int, items: Sequence[tuple[Any, bytes | None]]) -> None:
        for key, value in items:
            self.pipeline.record(self.stream, key, value)
        self.pipeline.segment += 1


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits (the simulation's I/O completes at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the commit protocol waited for something the simulation lacks")


def crash(
    ops: list[Op], durable_upto: int, cut: int, rng: random.Random
) -> tuple[Memory, list[Episode]]:
    """The tables and the delivered episodes after a crash at ``ops[cut]``.

    ``ops[:durable_upto]`` were flushed by a commit. Of the later ops, whole
    delivery segments before the one in progress were delivered (the agent waited
    for them); of the segment in progress, each stream (one topic partition)
    delivered a prefix of its own, as Kafka orders messages only per partition.
    """
    memory, delivered = Memory(), []
    cut = max(cut, durable_upto)
    in_flight = [op for op in ops[durable_upto:cut] if op.segment == ops[cut - 1].segment]
    streams = Counter(_stream(op) for op in in_flight)
    keep = {stream: rng.randint(0, n) for stream, n in streams.items()}
    for i, op in enumerate(ops[:cut]):
        if i >= durable_upto and op.segment == ops[cut - 1].segment:
            stream = _stream(op)
            if keep[stream] == 0:
                continue
            keep[stream] -= 1
        if op.episode is not None:
            delivered.append(op.episode)
            continue
        _apply(memory, op)
    return memory, delivered


def _apply(memory: Memory, op: Op) -> None:
    table: dict[Any, bytes] = memory.chunks if op.stream == "chunks" else memory.markers
    if op.value is None:
        table.pop(op.key, None)
    else:
        table[op.key] = op.value


def _stream(op: Op) -> str:
    # Each episode may go to a different partition of the episodes topic.
    return op.stream if op.episode is None else f"episodes/{op.key!r}"


def episode_events(
    rng: random.Random, eid: str, steps: int, t0: float, *, end: bool = True
) -> list[StepEvent]:
    events: list[StepEvent] = [
        EpisodeStart(episode_id=eid, time=t0, agent_id="agent", prompt=f"task {eid}")
    ]
    events += [
        Step(episode_id=eid, time=t0 + 1 + i, seq=i, kind="thought", content=f"{eid}/{i}")
        for i in range(steps)
    ]
    if end:
        events.append(
            EpisodeEnd(episode_id=eid, time=t0 + steps + 1, steps=steps, outcome="success")
        )
    rng.shuffle(events)
    return events
