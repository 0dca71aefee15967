"""Episode assembly as a pure state machine: no Kafka, no Faust, no clock of its own.

One :class:`PartitionState` per steps-topic partition keeps the partition's open
episodes. The Faust agent around it (``assemble.py``) feeds it decoded events in
offset order, asks it which episodes are finished, and writes what it returns to
the tables. Everything here is deterministic given the events, their offsets and
the wall-clock readings passed in, so the rules are tested without a broker.

State that must survive a crash lives in two key/value stores, read through
:class:`Store`:

* chunks (the open-episodes table, windowed): the events one episode accepted
  since the last :meth:`PartitionState.flush`, under the windowed key
  ``(episode key + 0x00 + chunk number, window)``. The window is the one the I/O
  layer names at the episode's first flush and all its chunks share it, so the
  table's window expiry frees an abandoned episode as a whole. A chunk is
  written once and deleted when the episode closes, so the state work for one
  event is proportional to its own size, never to the episode's size.
* markers (the closed-episodes table): one small record per closed episode,
  under the episode key, kept for ``closed_retention_s`` to recognise late and
  replayed events.

In memory each open episode has a fixed-size summary plus 4 bytes per step
(which chunk holds it); its events stay in memory only until the next flush.
After a restart or rebalance :meth:`PartitionState.load` rebuilds the summaries, the
deadlines and the partition clock from the chunks.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final, NamedTuple, Protocol, cast

import msgspec

from stream_export.config import AssembleSettings
from stream_export.errors import DecodeError
from stream_export.events import (
    Episode,
    EpisodeEnd,
    EpisodeStart,
    SourceOffset,
    Step,
    StepEvent,
    decode_event,
)
from stream_export.reasons import DeadLetterReason

START: Final = 0
STEP: Final = 1
END: Final = 2
_KIND_NAMES: Final = ("start", "step", "end")
_CHUNK_SUFFIX: Final = 5
#: Seqs an episode may run ahead of its step count before they leave the array.
_SLACK: Final = 64


#: A windowed-table key: (key, (window start, window end)), as Faust shapes them.
Window = tuple[float, float]
ChunkKey = tuple[bytes, Window]


class Part(NamedTuple):
    """One accepted event: what it is, when, where from, and its original bytes.

    ``num`` is the seq of a step, the announced step count of an end, 0 for a start.
    ``event`` is the decoded event while it is still in memory (not read back).
    """

    kind: int
    num: int
    time: float
    offset: int
    raw: bytes
    event: StepEvent | None = None


class ChunkIndex(msgspec.Struct, array_like=True):
    """A chunk without its event bytes: decoding skips them (used to rebuild)."""

    partition: int
    offsets: list[int]
    kinds: list[int]
    nums: list[int]
    times: list[float]
    sizes: list[int]


class Chunk(ChunkIndex, array_like=True):
    """The stored form of the parts one batch added to one episode (columns)."""

    raws: list[bytes]


class Closed(msgspec.Struct, array_like=True):
    """Marker of a closed episode.

    Every event of the partition at or below ``offset`` had been processed when
    the episode closed, so such an event arriving again is a replay after a crash
    or rebalance (ignored), and a later one is a late event.
    """

    partition: int
    offset: int
    reason: str | None = None


_chunk_decoder: Final = msgspec.msgpack.Decoder(Chunk)
_index_decoder: Final = msgspec.msgpack.Decoder(ChunkIndex)
_closed_decoder: Final = msgspec.msgpack.Decoder(Closed)
_encoder: Final = msgspec.msgpack.Encoder()


def chunk_key(key: bytes, number: int) -> bytes:
    return key + b"\x00" + number.to_bytes(4, "big")


def split_chunk_key(key: bytes) -> tuple[bytes, int]:
    return key[:-_CHUNK_SUFFIX], int.from_bytes(key[-4:], "big")


def decode_index(data: bytes) -> ChunkIndex:
    return _index_decoder.decode(data)


def encode_closed(closed: Closed) -> bytes:
    return _encoder.encode(closed)


def decode_closed(data: bytes) -> Closed:
    return _closed_decoder.decode(data)


class Store(Protocol):
    """Read access to the persisted state (the two Faust tables, or dicts in tests)."""

    def chunk(self, key: ChunkKey) -> bytes | None: ...

    def marker(self, key: bytes) -> bytes | None: ...


class Verdict(Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    #: The very same message (same offset) again, after a crash or rebalance.
    REPLAYED = "replayed"


@dataclass(frozen=True, slots=True)
class Rejected:
    """An event that goes to the dead-letter topic, with a machine-readable reason."""

    reason: str
    detail: str


LATE: Final = DeadLetterReason.LATE_EVENT
CONFLICT: Final = DeadLetterReason.CONFLICTING_DUPLICATE
#: Part of an open episode's state was removed by the table's window expiry (a
#: backstop that never reaches an episode closing on time; see AssembleSettings).
EXPIRED: Final = DeadLetterReason.STATE_EXPIRED
#: The worker failed on this one message (a bug): it is dead-lettered, not retried.
INTERNAL: Final = DeadLetterReason.INTERNAL_ERROR


class OpenEpisode:
    """Fixed-size summary of an open episode; its events are in chunks/pending."""

    __slots__ = (
        "chunks",
        "close_offset",
        "close_reason",
        "closing",
        "eid",
        "end",
        "expected",
        "far",
        "first",
        "key",
        "last",
        "max_seq",
        "pending",
        "size",
        "slots",
        "start",
        "steps",
        "window",
    )

    def __init__(self, eid: str, key: bytes) -> None:
        self.eid = eid
        self.key = key
        #: Chunk numbers holding the start and end events (-1: not received).
        self.start = -1
        self.end = -1
        #: Step count announced by the end event (-1: not known yet).
        self.expected = -1
        #: seq -> chunk number (-1: not received), for seqs below len(slots); the
        #: array grows to at most twice the steps received (plus 64), so a step with
        #: a huge seq cannot make a small episode large: such seqs go to ``far``.
        self.slots: array[int] = array("i")
        self.far: dict[int, int] | None = None
        self.steps = 0
        self.max_seq = -1
        self.size = 0
        self.first = math.inf
        self.last = -math.inf
        #: Chunks persisted so far; parts accepted in this batch go to chunk ``chunks``.
        self.chunks = 0
        #: The window every chunk of this episode is stored under (set at its first).
        self.window: Window = (0.0, 0.0)
        self.pending: list[Part] = []
        self.closing = False
        self.close_reason: str | None = None
        self.close_offset = -1

    def slot(self, kind: int, num: int) -> int:
        if kind == STEP:
            if num < len(self.slots):
                return self.slots[num]
            return self.far.get(num, -1) if self.far else -1
        return self.start if kind == START else self.end

    def add(self, part: Part, size: int, chunk: int) -> None:
        """Count one part, filed under chunk number ``chunk``."""
        if part.kind == STEP:
            seq, slots = part.num, self.slots
            if seq < len(slots):
                slots[seq] = chunk
            elif seq < 2 * self.steps + _SLACK:
                slots.extend([-1] * (seq + 1 - len(slots)))
                slots[seq] = chunk
                if self.far:
                    for s in [s for s in self.far if s <= seq]:
                        slots[s] = self.far.pop(s)
            else:
                if self.far is None:
                    self.far = {}
                self.far[seq] = chunk
            self.steps += 1
            self.max_seq = max(self.max_seq, seq)
        elif part.kind == START:
            self.start = chunk
        else:
            self.end = chunk
            self.expected = part.num
        self.size += size
        self.first = min(self.first, part.time)
        self.last = max(self.last, part.time)

    @property
    def complete(self) -> bool:
        return (
            self.start >= 0
            and self.end >= 0
            and self.steps == self.expected
            and self.max_seq == self.expected - 1
        )


@dataclass(frozen=True, slots=True)
class Finished:
    """A closed episode with all its parts, ready to be emitted or dead-lettered."""

    episode: OpenEpisode
    parts: list[Part]


class PartitionState:
    """All open episodes of one steps-topic partition, and its event-time clock."""

    def __init__(self, partition: int, settings: AssembleSettings, store: Store) -> None:
        self.partition = partition
        self.settings = settings
        self.store = store
        #: Newest event time seen (possibly advanced by the quiet-partition fallback).
        self.clock = -math.inf
        #: Clock and wall time at the last real event, for the quiet fallback.
        self.quiet_clock = -math.inf
        self.quiet_wall = -math.inf
        #: Offset of the last processed message of this partition.
        self.last_offset = -1
        #: Open episodes, including closed ones whose marker is not durable yet.
        self.open: dict[str, OpenEpisode] = {}
        self._closing = 0
        self._heap: list[tuple[float, str]] = []
        self._dirty: list[OpenEpisode] = []
        self._ready: list[OpenEpisode] = []
        #: Chunk keys of episodes found closed (or expired) while rebuilding, to delete.
        self.garbage: list[ChunkKey] = []
        #: Episodes being rebuilt by load_chunk, opened by loaded.
        self._loading: dict[bytes, OpenEpisode] = {}
        self._idle = settings.idle_timeout_s + settings.grace_s

    @property
    def open_count(self) -> int:
        """Episodes still open (not closed)."""
        return len(self.open) - self._closing

    # -- events ---------------------------------------------------------------

    def apply(
        self, event: StepEvent, key: bytes, raw: bytes, offset: int, wall: float
    ) -> Verdict | Rejected:
        """Apply one decoded event (``key`` is its episode id as bytes)."""
        s = self.settings
        if event.time > wall + s.max_future_s:
            return Rejected(
                DeadLetterReason.FUTURE_TIME,
                f"event time {event.time} is {event.time - wall:.0f}s ahead of the worker clock",
            )
        self.last_offset = offset
        if event.time > self.clock:
            self.clock = event.time
        self.quiet_clock, self.quiet_wall = self.clock, wall
        eid = event.episode_id
        ep = self.open.get(eid)
        if ep is None:
            found = self.store.marker(key)
            if found is not None:
                closed = decode_closed(found)
                return _after_close(eid, closed.offset, closed.reason, offset)
            ep = OpenEpisode(eid, key)
        elif ep.closing:
            return _after_close(eid, ep.close_offset, ep.close_reason, offset)

        if isinstance(event, Step):
            kind, num = STEP, event.seq
            if num >= s.max_steps:
                return self._over_limit(
                    ep,
                    DeadLetterReason.MAX_STEPS,
                    f"step seq {num} is beyond the limit of {s.max_steps} steps",
                )
            if 0 <= ep.expected <= num:
                return Rejected(
                    DeadLetterReason.SEQ_OUT_OF_RANGE,
                    f"step seq {num} but the end event announced {ep.expected} steps",
                )
        elif isinstance(event, EpisodeStart):
            kind, num = START, 0
        else:
            kind, num = END, event.steps
            if ep.end < 0 and ep.max_seq >= num:
                return Rejected(
                    DeadLetterReason.SEQ_OUT_OF_RANGE,
                    f"end event announces {num} steps but step seq {ep.max_seq} was received",
                )

        slot = ep.slot(kind, num)
        if slot >= 0:
            stored = self._find(ep, kind, num, slot)
            if stored is None:
                return Rejected(EXPIRED, f"episode {eid!r} lost stored events to the expiry")
            if stored.offset == offset:
                return Verdict.REPLAYED
            if _same_content(stored.raw, event):
                return Verdict.DUPLICATE
            what = f"step seq {num}" if kind == STEP else f"{_KIND_NAMES[kind]} event"
            return Rejected(
                CONFLICT,
                f"{what} of episode {eid!r} differs from the one received at "
                f"{self.partition}/{stored.offset}",
            )
        if ep.size + len(raw) > s.max_episode_bytes:
            return self._over_limit(
                ep, DeadLetterReason.MAX_BYTES, f"episode would exceed {s.max_episode_bytes} bytes"
            )
        if max(ep.last, event.time) - min(ep.first, event.time) > s.max_duration_s:
            return self._over_limit(
                ep,
                DeadLetterReason.MAX_DURATION,
                f"episode would span more than {s.max_duration_s}s",
            )

        new = ep.size == 0
        part = Part(kind, num, event.time, offset, raw, event)
        if not ep.pending:
            self._dirty.append(ep)
        ep.pending.append(part)
        ep.add(part, len(raw), ep.chunks)
        if new:
            self.open[eid] = ep
            heapq.heappush(self._heap, (self._deadline(ep), eid))
        if kind == END and num > s.max_steps:
            self._close(ep, "max_steps")
        elif ep.complete:
            self._close(ep, None)
        return Verdict.ACCEPTED

    def _over_limit(self, ep: OpenEpisode, reason: str, detail: str) -> Rejected:
        if ep.size:
            self._close(ep, reason)
            detail += "; the episode was closed truncated"
        return Rejected(reason, detail)

    def _find(self, ep: OpenEpisode, kind: int, num: int, slot: int) -> Part | None:
        parts = ep.pending if slot == ep.chunks else self._read_chunk(ep, slot) or []
        return next((p for p in parts if p.kind == kind and (kind != STEP or p.num == num)), None)

    def _read_chunk(self, ep: OpenEpisode, number: int) -> list[Part] | None:
        """The parts of one stored chunk; None if the window expiry removed it."""
        data = self.store.chunk((chunk_key(ep.key, number), ep.window))
        if data is None:
            return None
        c = _chunk_decoder.decode(data)
        return [
            Part(*fields)
            for fields in zip(c.kinds, c.nums, c.times, c.offsets, c.raws, strict=True)
        ]

    # -- closing ----------------------------------------------------------------

    def _deadline(self, ep: OpenEpisode) -> float:
        return min(ep.last + self._idle, ep.first + self.settings.max_duration_s)

    def _close(self, ep: OpenEpisode, reason: str | None) -> None:
        ep.closing = True
        ep.close_reason = reason
        ep.close_offset = self.last_offset
        self._closing += 1
        self._ready.append(ep)

    def tick(self, offset: int, wall: float) -> None:
        """A control tick reached the partition: every event produced before it was seen.

        So a silence measured here is real, not consumer lag: once the partition has
        been quiet for ``quiet_partition_s``, its clock follows the wall clock.
        ``wall`` is when the tick was sent: a tick read late (after a rebalance or
        any pause in consuming) must not count the pause as silence, since events
        sent during the pause come after the tick.
        """
        self.last_offset = offset
        silence = wall - self.quiet_wall
        if silence >= self.settings.quiet_partition_s:
            self.clock = max(self.clock, self.quiet_clock + silence)

    def sweep(self) -> None:
        """Close the episodes whose deadline has passed on the partition clock."""
        heap = self._heap
        while heap and heap[0][0] <= self.clock:
            due, eid = heapq.heappop(heap)
            found = self.open.get(eid)
            if found is None or found.closing:
                continue
            deadline = self._deadline(found)
            if deadline > due:
                heapq.heappush(heap, (deadline, eid))
                continue
            timed_out = found.last + self._idle <= found.first + self.settings.max_duration_s
            self._close(found, "timeout" if timed_out else "max_duration")
        if len(heap) > 2 * len(self.open) + 64:
            self._heap = [(self._deadline(ep), eid) for eid, ep in self.open.items()]
            heapq.heapify(self._heap)

    def take_finished(self) -> list[Finished]:
        """Episodes closed since the last call, with all their parts (reads chunks)."""
        ready, self._ready = self._ready, []
        finished = []
        for ep in ready:
            parts = []
            for n in range(ep.chunks):
                chunk = self._read_chunk(ep, n)
                if chunk is None:
                    ep.close_reason = EXPIRED
                else:
                    parts += chunk
            parts += ep.pending
            ep.pending = []
            finished.append(Finished(ep, parts))
        return finished

    def marker(self, ep: OpenEpisode) -> bytes:
        return encode_closed(Closed(self.partition, ep.close_offset, ep.close_reason))

    def forget(self, ep: OpenEpisode) -> list[ChunkKey]:
        """Drop a closed episode whose marker is durable; returns its chunk keys to delete."""
        if self.open.get(ep.eid) is ep:
            del self.open[ep.eid]
            self._closing -= 1
        return [(chunk_key(ep.key, n), ep.window) for n in range(ep.chunks)]

    def flush(self, window: Window) -> list[tuple[ChunkKey, bytes]]:
        """The chunks to write now: one per open episode that gained parts. An
        episode's first chunk files it under ``window``."""
        writes = []
        for ep in self._dirty:
            parts = ep.pending
            if not parts:
                continue
            chunk = Chunk(
                self.partition,
                [p.offset for p in parts],
                [p.kind for p in parts],
                [p.num for p in parts],
                [p.time for p in parts],
                [len(p.raw) for p in parts],
                [p.raw for p in parts],
            )
            if not ep.chunks:
                ep.window = window
            writes.append(((chunk_key(ep.key, ep.chunks), ep.window), _encoder.encode(chunk)))
            ep.chunks += 1
            ep.pending = []
        self._dirty.clear()
        return writes

    def wants_tick(self, wall: float) -> bool:
        """Whether a control tick would let this partition make progress now."""
        if self._ready or self.garbage:
            return True
        if not self._heap:
            return False
        silence = wall - self.quiet_wall
        return (
            silence >= self.settings.quiet_partition_s
            and self._heap[0][0] <= self.quiet_clock + silence
        )

    # -- rebuild ----------------------------------------------------------------

    def load(self, chunks: Iterable[tuple[ChunkKey, ChunkIndex]], wall: float) -> None:
        """Rebuild the open episodes of this partition from its stored chunks.

        Chunks of an episode that has a closed marker are left over from a close
        interrupted by a crash: they become :attr:`garbage`. The clock restarts at
        the newest event time found (which can only delay timeouts, never hasten
        them) and the quiet fallback counts from ``wall``. :meth:`load_chunk` and
        :meth:`loaded` do the same one chunk at a time, so a rebuild never holds
        every chunk's index at once.
        """
        for key, index in chunks:
            self.load_chunk(key, index)
        self.loaded(wall)

    def load_chunk(self, key: ChunkKey, c: ChunkIndex) -> None:
        """Add one stored chunk to the episodes being rebuilt."""
        (chunk, window) = key
        ekey, number = split_chunk_key(chunk)
        ep = self._loading.get(ekey)
        if ep is None:
            ep = self._loading[ekey] = OpenEpisode(ekey.decode(), ekey)
            ep.window = window
        ep.chunks = max(ep.chunks, number + 1)
        for kind, num, time, offset, size in zip(
            c.kinds, c.nums, c.times, c.offsets, c.sizes, strict=True
        ):
            ep.add(Part(kind, num, time, offset, b""), size, number)

    def loaded(self, wall: float) -> None:
        """Every stored chunk was added: open the rebuilt episodes."""
        loading, self._loading = self._loading, {}
        for ekey, ep in loading.items():
            if self.store.marker(ekey) is not None:
                self.garbage += [(chunk_key(ekey, n), ep.window) for n in range(ep.chunks)]
                continue
            self.open[ep.eid] = ep
            self.clock = max(self.clock, ep.last)
            self._heap.append((self._deadline(ep), ep.eid))
        heapq.heapify(self._heap)
        self.quiet_clock, self.quiet_wall = self.clock, wall


class Outcome(NamedTuple):
    """What became of one steps-topic message.

    ``kind`` is the event type when the message decoded; ``stage`` is where a
    rejection happened: "decode" (not a valid event) or "assemble" (valid, but not
    for this episode's state).
    """

    kind: str | None
    result: Verdict | Rejected
    stage: str


def receive(
    state: PartitionState, key: bytes | None, raw: bytes | None, offset: int, wall: float
) -> Outcome:
    """Decode one message of ``state``'s partition and apply it: the whole per-message
    rule set, from the message's bytes to its verdict (the caller does the I/O)."""
    try:
        event = decode_event(raw, max_bytes=state.settings.max_event_bytes)
    except DecodeError as exc:
        return Outcome(None, Rejected(exc.reason, exc.detail), "decode")
    kind = cast(str, event.__struct_config__.tag)
    if key != event.episode_id.encode():
        return Outcome(
            kind,
            Rejected(DeadLetterReason.KEY_MISMATCH, f"message key {key!r} is not the episode_id"),
            "assemble",
        )
    # decode_event accepted it, so raw holds the bytes of a valid event.
    return Outcome(kind, state.apply(event, key, cast(bytes, raw), offset, wall), "assemble")


def _after_close(
    eid: str, close_offset: int, reason: str | None, offset: int
) -> Verdict | Rejected:
    if offset <= close_offset:
        return Verdict.REPLAYED
    how = f"truncated: {reason}" if reason else "complete"
    return Rejected(LATE, f"episode {eid!r} was already closed ({how})")


def _same_content(raw: bytes, event: StepEvent) -> bool:
    """Same content means equal in every field but ``time`` (a resend may restamp it)."""
    stored = decode_event(raw)
    return (
        type(stored) is type(event) and msgspec.structs.replace(event, time=stored.time) == stored
    )


def build_episode(partition: int, finished: Finished) -> Episode | None:
    """The episode to publish, steps in seq order; None when its start never arrived."""
    ep = finished.episode
    start: EpisodeStart | None = None
    end: EpisodeEnd | None = None
    steps: list[tuple[int, Step, int]] = []
    start_offset = end_offset = -1
    for part in finished.parts:
        event = part.event or decode_event(part.raw)
        if isinstance(event, Step):
            steps.append((event.seq, event, part.offset))
        elif isinstance(event, EpisodeStart):
            start, start_offset = event, part.offset
        else:
            end, end_offset = event, part.offset
    if start is None:
        return None
    steps.sort(key=lambda item: item[0])
    sources = [SourceOffset(partition, start_offset)]
    sources += [SourceOffset(partition, offset) for _, _, offset in steps]
    if end is not None:
        sources.append(SourceOffset(partition, end_offset))
    return Episode(
        episode_id=ep.eid,
        agent_id=start.agent_id,
        prompt=start.prompt,
        steps=[step for _, step, _ in steps],
        start_time=start.time,
        end_time=end.time if end is not None else ep.last,
        outcome=end.outcome if end is not None else "other",
        group_id=start.group_id,
        group_size=start.group_size,
        reward=end.reward if end is not None else None,
        metadata={**start.metadata, **(end.metadata if end is not None else {})},
        truncated=ep.close_reason is not None,
        truncated_reason=ep.close_reason,
        sources=sources,
    )
