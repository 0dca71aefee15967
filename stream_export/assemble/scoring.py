"""The assembler's rules for ``score`` events: join, hold, late scores, and how an
episode's scores combine into its ``rewards`` and ``reward`` (``scores.reward``),
in the stream and offline (``export --with-scores``, the group judge).

A score joins its episode while the episode is open or held: it is stored with
the episode's events (a part of kind SCORE) and published in its record. An
ended episode waits, held, for the names of ``scores.required`` until the
partition clock passes its last event time plus ``scores.hold_s``; it is
published once, when the last required name arrives or the hold is over. A score
for an episode already closed goes to the scores output once
(:class:`~stream_export.assemble.verdicts.LateScore`): the closed marker lists
every score an episode has had (``Closed.scores``), so a resend is a duplicate
and another value under the same ``score_id`` a conflict, also after a restart.

Whether a score is in time depends only on the order of the partition's
messages: a held episode whose deadline the clock has passed is closed before a
score is applied, whatever the batch, and the clock is stored with the markers
(:func:`~stream_export.assemble.chunks.clock_key`), written last, so a rebuilt partition
decides as the lost worker would have.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from typing import Final

import msgspec

from stream_export.assemble.chunks import (
    SCORE,
    Closed,
    Part,
    ScoreTag,
    Seen,
    Store,
    clock_key,
    decode_closed,
    encode_closed,
)
from stream_export.assemble.episode import OpenEpisode
from stream_export.assemble.verdicts import CONFLICT, LateScore, Rejected, Result, Verdict
from stream_export.contract.decoding import decode_event
from stream_export.contract.episode import Episode
from stream_export.contract.events import END_REWARD, Score
from stream_export.contract.reasons import DeadLetterReason
from stream_export.contract.scores import ScoreRecord, late_row, record_of, row_key
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.scores import ScoreSettings

#: Most scores one episode may have (in its record and in the scores output):
#: its closed marker lists them all.
MAX_SCORES: Final = 1000
_encoder: Final = msgspec.msgpack.Encoder()
_clock_decoder: Final = msgspec.msgpack.Decoder(float)


class ScoreRules:
    """The score rules of :class:`~stream_export.assemble.state.PartitionState`."""

    partition: int
    settings: AssembleSettings
    scores: ScoreSettings
    store: Store
    clock: float
    open: dict[str, OpenEpisode]
    _heap: list[tuple[float, str]]
    _dirty: list[OpenEpisode]
    #: Markers changed by late scores since the last persist, by episode key.
    _late: dict[bytes, Closed]
    #: The clock as last stored (None: not stored since the rebuild).
    _stored_clock: float | None
    #: How many episodes are held now.
    held: int

    def _close(self, ep: OpenEpisode, reason: str | None) -> None:
        raise NotImplementedError

    @property
    def holds(self) -> bool:
        """Whether ended episodes wait for required scores."""
        return bool(self.scores.required) and self.scores.hold_s > 0

    def missing(self, ep: OpenEpisode) -> list[str]:
        """The required score names ``ep`` does not have."""
        names = ep.names()
        return [name for name in self.scores.required if name not in names]

    def replayed(self, ep: OpenEpisode, offset: int) -> None:
        """The event at ``offset`` of ``ep`` was read again after a restart: if it
        completed ``ep`` (held since the rebuild), it is closed now when its scores
        are in, as it was then."""
        if ep.held and offset == ep.done and not self.missing(ep):
            self._close(ep, None)

    def finish(self, ep: OpenEpisode) -> None:
        """``ep`` is complete: close it, or hold it for its required scores."""
        if self.holds and self.missing(ep):
            ep.held = True
            self.held += 1
            heapq.heappush(self._heap, (ep.last + self.scores.hold_s, ep.eid))
        else:
            self._close(ep, None)

    def score(self, event: Score, key: bytes, raw: bytes, offset: int) -> Result:
        eid = event.episode_id
        ep = self.open.get(eid)
        tag = ScoreTag(event.name, event.score_id, digest(event))
        if ep is not None and not ep.closing and offset < ep.since:
            return _unknown(eid)  # read again after a restart: it came first
        # held when this score came (not only in the future a rebuild may see)
        held = ep is not None and ep.held and not ep.closing and offset > ep.done
        if held and ep is not None and ep.last + self.scores.hold_s <= self.clock:
            self._close(ep, None)  # its hold is over, whatever the batch
            ep.close_offset = offset - 1  # closed before this score
        if ep is None or ep.closing:
            return self._late_score(ep, key, event, tag, offset)
        known = ep.scores.get(tag.score_id) if ep.scores else None
        if known is not None:
            return _again(known[0].digest, known[1], tag, offset, eid)
        if ep.scores and len(ep.scores) >= MAX_SCORES:
            return _too_many(eid)
        if ep.size + len(raw) > self.settings.max_episode_bytes:
            return Rejected(
                DeadLetterReason.MAX_BYTES,
                f"episode {eid!r} would exceed {self.settings.max_episode_bytes} bytes",
            )
        part = Part(SCORE, 0, event.time, offset, raw, event, tag)
        if not ep.pending:
            self._dirty.append(ep)
        ep.pending.append(part)
        ep.add(part, len(raw), ep.chunks)
        if held and not self.missing(ep):
            self._close(ep, None)
        return Verdict.ACCEPTED

    def _late_score(
        self, ep: OpenEpisode | None, key: bytes, event: Score, tag: ScoreTag, offset: int
    ) -> Result:
        eid = event.episode_id
        closed = self._late.get(key)
        if closed is None and ep is not None:
            closed = self.closed_marker(ep)
        if closed is None:
            found = self.store.marker(key)
            if found is None:
                return _unknown(eid)
            closed = decode_closed(found)
        if offset <= closed.offset:
            return Verdict.REPLAYED
        for seen in closed.scores:
            if seen.score_id == tag.score_id:
                return _again(seen.digest, seen.offset, tag, offset, eid)
        if not self.scores.enabled:
            return Rejected(
                DeadLetterReason.LATE_SCORE,
                f"score {tag.score_id!r} for episode {eid!r}, already published "
                "(scores.enabled=false: no scores output)",
            )
        if len(closed.scores) >= MAX_SCORES:
            return _too_many(eid)
        seen = Seen(tag.score_id, offset, tag.digest)
        self._late[key] = msgspec.structs.replace(closed, scores=[*closed.scores, seen])
        return LateScore(row_key(eid, tag.score_id), late_row(event))

    def closed_marker(self, ep: OpenEpisode) -> Closed:
        """The marker of closed ``ep``, with every score it has had."""
        late = self._late.get(ep.key)
        if late is not None:
            return late
        scores = [Seen(sid, at, tag.digest) for sid, (tag, at) in (ep.scores or {}).items()]
        return Closed(self.partition, ep.close_offset, ep.close_reason, scores)

    def marker(self, ep: OpenEpisode) -> bytes:
        return encode_closed(self.closed_marker(ep))

    def marker_writes(self, taken: list[OpenEpisode]) -> list[tuple[bytes, bytes]]:
        """The markers a persist writes: those of ``taken`` (closed and delivered),
        and the markers changed by late scores. A late score for an episode closed
        but not yet delivered waits for the episode's own marker."""
        writes = [(ep.key, self.marker(ep)) for ep in taken]
        done = {ep.key for ep in taken}
        late, self._late = self._late, {}
        for key, closed in late.items():
            if key in done:
                continue
            ep = self.open.get(key.decode())
            if ep is not None and ep.key == key:  # closed, not delivered yet
                self._late[key] = closed
            else:
                writes.append((key, encode_closed(closed)))
        return writes

    def clock_writes(self) -> list[tuple[bytes, bytes]]:
        """The clock, when held episodes depend on it and it moved: the last write of
        a persist, so a stored clock is never ahead of the stored chunks."""
        if not self.holds or self.clock == self._stored_clock or not math.isfinite(self.clock):
            return []
        self._stored_clock = self.clock
        return [(clock_key(self.partition), _encoder.encode(self.clock))]

    def stored_clock(self) -> float | None:
        data = self.store.marker(clock_key(self.partition)) if self.holds else None
        return None if data is None else _clock_decoder.decode(data)


def joined(episode: Episode, parts: list[Part], settings: ScoreSettings) -> Episode:
    """``episode`` with the scores among ``parts``, in arrival order
    (:func:`combine`)."""
    scored = sorted((p for p in parts if p.kind == SCORE), key=lambda p: p.offset)
    events = [p.event or decode_event(p.raw) for p in scored]
    records = [record_of(e) for e in events if isinstance(e, Score)]
    if not records and not settings.required and settings.expression() is None:
        return episode
    return combine(episode, records, episode.reward, settings)


def _again(stored: int, at: int, tag: ScoreTag, offset: int, eid: str) -> Result:
    if at == offset:
        return Verdict.REPLAYED
    if stored == tag.digest:
        return Verdict.DUPLICATE
    return Rejected(
        CONFLICT,
        f"score {tag.score_id!r} of episode {eid!r} differs from the one received at offset {at}",
    )


def _unknown(eid: str) -> Rejected:
    return Rejected(
        DeadLetterReason.UNKNOWN_EPISODE,
        f"score for episode {eid!r}, which is not open and not closed within "
        "assemble.closed_retention_s (a score must follow its episode's events)",
    )


def _too_many(eid: str) -> Rejected:
    return Rejected(
        DeadLetterReason.TOO_MANY_SCORES, f"episode {eid!r} already has {MAX_SCORES} scores"
    )


def digest(score: Score) -> int:
    """The score's content without its time (a resend may restamp it)."""
    data = msgspec.json.encode(msgspec.structs.replace(score, time=0.0))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def combine(
    episode: Episode, records: list[ScoreRecord], end_reward: float | None, settings: ScoreSettings
) -> Episode:
    """``episode`` with ``records`` (in arrival order) as its scores: ``rewards`` by
    name (the last of a name, and ``end_reward``, the end event's reward), the
    required names it lacks, and its reward from ``scores.reward``."""
    rewards = {r.name: r.value for r in records}
    if end_reward is not None:
        rewards[END_REWARD] = end_reward
    expression = settings.expression()
    return msgspec.structs.replace(
        episode,
        rewards=rewards,
        scores=records,
        scores_missing=[name for name in settings.required if name not in rewards],
        reward=end_reward if expression is None else expression.evaluate(rewards),
    )


def with_late(episode: Episode, late: list[ScoreRecord], settings: ScoreSettings) -> Episode:
    """A published ``episode`` joined offline with the scores that came after it
    (the scores output's rows, each once): ``export --with-scores``."""
    had, added = {s.score_id for s in episode.scores}, []
    for record in late:  # each score once (a row may be there twice)
        if record.score_id not in had:
            had.add(record.score_id)
            added.append(record)
    if not added:
        return episode
    fallback = None if settings.expression() is not None else episode.reward
    end_reward = episode.rewards.get(END_REWARD, fallback)
    return combine(episode, [*episode.scores, *added], end_reward, settings)
