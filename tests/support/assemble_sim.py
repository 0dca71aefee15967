"""The assemble stage on one partition, broker-free, for the unit tests.

:class:`Pipeline` drives the real :class:`stream_export.assemble.agent.Assembler`
through the real stage runtime (:class:`stream_export.runtime.stage.Stage`) on one
simulated worker of ``tests/support/stage_sim.py``: positions and gaps, batch ends,
persists and acknowledgements, every message through ``assemble.state.receive``;
gaps are read back from :attr:`Pipeline.log`, the topic as a dict. Every effect is
appended to ``ops``, each delivery barrier starts a new segment; a crash keeps
only what was durable (see :func:`crash`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from stream_export.assemble.agent import Assembler
from stream_export.assemble.chunks import ChunkKey
from stream_export.assemble.verdicts import CONFLICT, LATE
from stream_export.contract.decoding import decode_episode, encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.stage import CONTROL_HEADER
from stream_export.runtime.stage import TICK as TICK_VALUE
from stream_export.settings import Settings
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.scores import ScoreSettings
from tests.support.stage_sim import (
    WINDOW,
    Broker,
    Msg,
    Op,
    Worker,
    assembler,
    lost_in_flight,
    run,
)

TICK = "tick"
#: A message as the agent gets it: (key, value) bytes, whatever they hold.
Message = tuple[bytes | None, bytes | None]
Item = tuple[int, StepEvent | str | Message]

__all__ = ["WINDOW", "Memory", "Pipeline", "crash", "episode_events"]


@dataclass
class Memory:
    """The two tables, keyed by (partition, key) as the simulator's are."""

    chunks: dict[tuple[int, ChunkKey], bytes] = field(default_factory=dict)
    markers: dict[tuple[int, bytes], bytes] = field(default_factory=dict)


def _message(offset: int, item: StepEvent | str | Message, wall: float) -> Msg:
    if isinstance(item, str):
        return Msg(0, offset, b"", b"", ((CONTROL_HEADER, TICK_VALUE),), int(wall * 1000))
    key, raw = item if isinstance(item, tuple) else (item.episode_id.encode(), encode(item))
    return Msg(0, offset, key, raw)


class Pipeline:
    """Partition 0 of the assemble stage, over dict tables whose every effect is
    appended to ``ops``."""

    def __init__(
        self,
        settings: AssembleSettings,
        memory: Memory | None = None,
        *,
        position: int | None = None,
        log: Mapping[int, StepEvent | str | Message] | None = None,
        scores: ScoreSettings | None = None,
    ) -> None:
        #: The topic, from which gaps are read back (empty: nothing is found).
        self.log = log or {}
        self.memory = memory or Memory()
        self.metrics = Metrics()
        topic = [_message(o, item, 0.0) for o, item in sorted(self.log.items())]
        self.broker = Broker(
            {0: topic}, tables={"chunks": self.memory.chunks, "markers": self.memory.markers}
        )
        whole = Settings(assemble=settings, scores=scores or ScoreSettings())
        self.worker = Worker(0, self.broker, self._assembler(whole), random.Random(0))
        self.worker.stage.reset({0: self.state}, {0: position})

    def _assembler(self, settings: Settings) -> Any:
        def make(worker: Worker) -> Assembler:
            made = assembler(worker, settings, self.metrics, ("chunks", "markers"))
            self.state = made.rebuild([0], 0.0)[0]
            return made

        return make

    @property
    def refetched(self) -> int:
        return self.worker.refetched

    @property
    def ops(self) -> list[Op]:
        return self.broker.ops

    @property
    def acked(self) -> int:
        return self.worker.acked.get(0, 0)

    @property
    def last_ack(self) -> tuple[int, int]:
        """(ops so far, acked) when the last message was acknowledged: Faust may
        commit at any moment after an acknowledgement."""
        return self.worker.last_ack

    @property
    def emitted(self) -> list[Episode]:
        return [op_episode(op) for op in self.broker.delivered("episodes")]

    @property
    def late_scores(self) -> list[dict[str, Any]]:
        """The rows sent to the scores output."""
        return [msgspec.json.decode(op.value or b"") for op in self.broker.delivered("scores")]

    @property
    def dead(self) -> list[tuple[str, int]]:
        """(reason, source offset) of each dead letter."""
        found = []
        for op in self.broker.delivered("dead"):
            headers = dict(op.headers)
            offset = int(headers["x-source"].rsplit(b"/", 1)[1])
            found.append((headers["x-reason"].decode(), offset))
        return found

    @property
    def verdicts(self) -> Counter[str]:
        """How many messages got each verdict, or each reason of rejection."""
        m, counts = self.metrics, Counter[str]()
        for name, metric in (
            ("accepted", m.steps_accepted),
            ("duplicate", m.steps_duplicate),
            ("replayed", m.events_replayed),
            (str(LATE), m.events_late),
            (str(CONFLICT), m.steps_conflicting),
            ("", m.events_invalid),
        ):
            for family in metric.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        counts[name or sample.labels["reason"]] += int(sample.value)
        return +counts

    @classmethod
    def rebuilt(
        cls, settings: AssembleSettings, memory: Memory, wall: float, **kwargs: Any
    ) -> Pipeline:
        pipeline = cls(settings, memory, **kwargs)
        position = kwargs.get("position")
        pipeline.worker.wall = wall
        pipeline.worker.stage.rebuild([0], wall, {0: position})
        pipeline.state = pipeline.worker.stage.states[0]
        return pipeline

    def batch(self, items: list[Item], wall: float, *, persist: bool = True) -> None:
        """One batch; with ``persist`` it is followed by :meth:`persist`, after
        which every event so far is acknowledged (may be committed)."""
        self.worker.wall = wall
        records = [_message(offset, event, wall) for offset, event in items]
        run(self.worker.stage.take(0, records, self.worker.refetch))
        run(self.worker.stage.end_batch())
        if persist:
            self.persist()

    def persist(self) -> None:
        run(self.worker.stage.persist(WINDOW))


def op_episode(op: Op) -> Episode:
    assert op.value is not None
    return decode_episode(op.value)


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
    flight = [i for i in range(durable_upto, cut) if ops[i].segment == ops[cut - 1].segment]
    lost = lost_in_flight(ops, flight, rng)
    for i, op in enumerate(ops[:cut]):
        if i in lost:
            continue
        if op.table is None:
            if op.stream.startswith("episodes/"):
                delivered.append(op_episode(op))
            continue
        table: dict[Any, bytes] = memory.chunks if op.table == "chunks" else memory.markers
        if op.value is None:
            table.pop(op.key, None)
        else:
            table[op.key] = op.value
    return memory, delivered


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
