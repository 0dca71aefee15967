"""Episode assembly as a pure state machine: no Kafka, no Faust, no clock of its own.

One :class:`PartitionState` per steps-topic partition keeps the partition's open
episodes. The Faust agent around it (``assemble/agent.py``) feeds it decoded events in
offset order, asks it which episodes are finished, and writes what it returns to
the tables. Everything here is deterministic given the events, their offsets and
the wall-clock readings passed in, so the rules are tested without a broker.

State that must survive a crash lives in two key/value stores, read through
:class:`~stream_export.assemble.chunks.Store`: the chunks of open episodes (the
events one episode accepted since the last :meth:`PartitionState.flush`, written
once and deleted when the episode closes, so the state work for one event is
proportional to its own size, never to the episode's size) and one marker per
closed episode (see ``episode_chunks``). In memory each open episode is a
fixed-size :class:`~stream_export.assemble.episode.OpenEpisode` summary.
After a restart or rebalance :meth:`PartitionState.load` rebuilds the summaries, the
deadlines and the partition clock from the chunks.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final, NamedTuple, cast

import msgspec

from stream_export.assemble.chunks import (
    END,
    START,
    STEP,
    ChunkIndex,
    ChunkKey,
    Closed,
    Part,
    Store,
    Window,
    chunk_key,
    decode_chunk,
    decode_closed,
    encode_chunk,
    split_chunk_key,
)
from stream_export.assemble.episode import Finished, OpenEpisode
from stream_export.assemble.scoring import ScoreRules
from stream_export.assemble.verdicts import (
    CONFLICT,
    EXPIRED,
    Rejected,
    Result,
    Verdict,
    after_close,
)
from stream_export.contract.decoding import decode_event
from stream_export.contract.events import EpisodeStart, Score, Step, StepEvent
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import DecodeError
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.scores import ScoreSettings

_KIND_NAMES: Final = ("start", "step", "end")
ChunkWrite = tuple[ChunkKey, bytes | None]
#: Event bytes of the stored chunks kept decoded (PartitionState._found).
FOUND_CACHE_BYTES: Final = 32 * 1024 * 1024


class PartitionState(ScoreRules):
    """All open episodes of one steps-topic partition, and its event-time clock."""

    def __init__(
        self,
        partition: int,
        settings: AssembleSettings,
        store: Store,
        scores: ScoreSettings | None = None,
    ) -> None:
        self.partition = partition
        self.settings = settings
        self.scores = scores or ScoreSettings()
        self.store = store
        self._late: dict[bytes, Closed] = {}
        self.held = 0
        self._stored_clock: float | None = None
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
        #: Episodes taken finished since the last persist: their markers come next.
        self._taken: list[OpenEpisode] = []
        #: Chunk keys of episodes found closed (or expired) while rebuilding, to delete.
        self.garbage: list[ChunkKey] = []
        #: Episodes being rebuilt by load_chunk, opened by loaded.
        self._loading: dict[bytes, OpenEpisode] = {}
        self._idle = settings.idle_timeout_s + settings.grace_s
        #: Stored chunks read back to check repeats, by (episode key, chunk number):
        #: a replay after a restart repeats a chunk's events in a row, and reading
        #: the chunk for each of them made replaying an episode quadratic.
        self._found: OrderedDict[tuple[bytes, int], dict[tuple[int, int], Part]] = OrderedDict()
        self._found_bytes = 0

    @property
    def open_count(self) -> int:
        """Episodes still open (not closed), held ones included."""
        return len(self.open) - self._closing

    # -- events ---------------------------------------------------------------

    def apply(self, event: StepEvent, key: bytes, raw: bytes, offset: int, wall: float) -> Result:
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
        if isinstance(event, Score):
            return self.score(event, key, raw, offset)
        eid = event.episode_id
        ep = self.open.get(eid)
        if ep is None:
            found = self.store.marker(key)
            if found is not None:
                closed = decode_closed(found)
                return after_close(eid, closed.offset, closed.reason, offset)
            ep = OpenEpisode(eid, key)
        elif ep.closing:
            return after_close(eid, ep.close_offset, ep.close_reason, offset)

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
                self.replayed(ep, offset)
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
            self.finish(ep)
        return Verdict.ACCEPTED

    def _over_limit(self, ep: OpenEpisode, reason: str, detail: str) -> Rejected:
        if ep.size:
            self._close(ep, reason)
            detail += "; the episode was closed truncated"
        return Rejected(reason, detail)

    def _find(self, ep: OpenEpisode, kind: int, num: int, slot: int) -> Part | None:
        if slot == ep.chunks:
            return next((p for p in ep.pending if p.kind == kind and p.num == num), None)
        where = (ep.key, slot)
        found = self._found.get(where)
        if found is None:
            parts = self._read_chunk(ep, slot) or []
            found = {(p.kind, p.num): p for p in parts}
            self._found_bytes += sum(len(p.raw) for p in parts)
            while self._found and self._found_bytes > FOUND_CACHE_BYTES:
                _, dropped = self._found.popitem(last=False)
                self._found_bytes -= sum(len(p.raw) for p in dropped.values())
        self._found[where] = found
        self._found.move_to_end(where)
        return found.get((kind, num))

    def _read_chunk(self, ep: OpenEpisode, number: int) -> list[Part] | None:
        """The parts of one stored chunk; None if the window expiry removed it."""
        data = self.store.chunk((chunk_key(ep.key, number), ep.window))
        return None if data is None else decode_chunk(data)

    # -- closing ----------------------------------------------------------------

    def _deadline(self, ep: OpenEpisode) -> float:
        if ep.held:
            return ep.last + self.scores.hold_s
        return min(ep.last + self._idle, ep.first + self.settings.max_duration_s)

    def _close(self, ep: OpenEpisode, reason: str | None) -> None:
        ep.closing = True
        ep.close_reason = reason
        ep.close_offset = self.last_offset
        self._closing += 1
        self.held -= ep.held
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
        heap, later = self._heap, []
        while heap and heap[0][0] <= self.clock:
            due, eid = heapq.heappop(heap)
            found = self.open.get(eid)
            if found is None or found.closing:
                continue
            deadline = self._deadline(found)
            if deadline > due:
                heapq.heappush(heap, (deadline, eid))
                continue
            if found.held:
                if found.done > self.last_offset:  # rebuilt ahead of the replay
                    later.append((due, eid))
                else:
                    self._close(found, None)  # the hold is over: published as it is
                continue
            timed_out = found.last + self._idle <= found.first + self.settings.max_duration_s
            self._close(found, "timeout" if timed_out else "max_duration")
        for item in later:
            heapq.heappush(heap, item)
        if len(heap) > 2 * len(self.open) + 64:
            self._heap = [(self._deadline(ep), eid) for eid, ep in self.open.items()]
            heapq.heapify(self._heap)

    def take_finished(self) -> list[Finished]:
        """Episodes closed since the last call, with all their parts (reads chunks)."""
        ready, self._ready = self._ready, []
        self._taken += ready
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

    def writes(self, window: Window) -> tuple[list[tuple[bytes, bytes]], list[ChunkWrite]]:
        """What a persist stores, once the episodes taken finished are delivered:
        their markers, then the chunk writes (their chunks and the garbage deleted,
        one new chunk per episode that gained parts: :meth:`flush`)."""
        taken, self._taken = self._taken, []
        markers = self.marker_writes(taken)
        chunks: list[ChunkWrite] = [(key, None) for ep in taken for key in self.forget(ep)]
        chunks += [(key, None) for key in self.garbage]
        chunks += self.flush(window)
        self.garbage.clear()
        return markers, chunks

    def forget(self, ep: OpenEpisode) -> list[ChunkKey]:
        """Drop a closed episode whose marker is durable; returns its chunk keys to delete."""
        for n in range(ep.chunks):
            dropped = self._found.pop((ep.key, n), None)
            if dropped is not None:
                self._found_bytes -= sum(len(p.raw) for p in dropped.values())
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
            if not ep.chunks:
                ep.window = window
            key = (chunk_key(ep.key, ep.chunks), ep.window)
            writes.append((key, encode_chunk(self.partition, parts)))
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
        them), or with held episodes (``scores``) at the stored clock, and the
        quiet fallback counts from ``wall``. :meth:`load_chunk` and :meth:`loaded`
        do the same one chunk at a time, so a rebuild never holds every chunk's
        index at once.
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
        scores = c.scores or [None] * len(c.kinds)
        for kind, num, time, offset, size, score in zip(
            c.kinds, c.nums, c.times, c.offsets, c.sizes, scores, strict=True
        ):
            ep.add(Part(kind, num, time, offset, b"", None, score), size, number)

    def loaded(self, wall: float) -> None:
        """Every stored chunk was added: open the rebuilt episodes."""
        loading, self._loading = self._loading, {}
        # With held episodes the clock is the stored one: chunks of a persist cut
        # short by a crash may hold events past it, which are read again.
        stored = self.stored_clock()
        for ekey, ep in loading.items():
            if self.store.marker(ekey) is not None:
                self.garbage += [(chunk_key(ekey, n), ep.window) for n in range(ep.chunks)]
                continue
            self.open[ep.eid] = ep
            if not self.holds:
                self.clock = max(self.clock, ep.last)
            ep.held = ep.complete and self.holds and bool(self.missing(ep))
            self.held += ep.held
            self._heap.append((self._deadline(ep), ep.eid))
        heapq.heapify(self._heap)
        if stored is not None:
            self.clock = self._stored_clock = stored
        self.quiet_clock, self.quiet_wall = self.clock, wall


class Outcome(NamedTuple):
    """What became of one steps-topic message.

    ``kind`` is the event type when the message decoded; ``stage`` is where a
    rejection happened: "decode" (not a valid event) or "assemble" (valid, but not
    for this episode's state).
    """

    kind: str | None
    result: Result
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


def _same_content(raw: bytes, event: StepEvent) -> bool:
    """Same content means equal in every field but ``time`` (a resend may restamp it)."""
    stored = decode_event(raw)
    return (
        type(stored) is type(event) and msgspec.structs.replace(event, time=stored.time) == stored
    )
