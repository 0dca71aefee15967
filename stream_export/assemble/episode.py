"""An open episode's fixed-size summary, and the finished episode built from its parts.

In memory each open episode has a fixed-size summary plus 4 bytes per step (which
chunk holds it); its events stay in memory only until the next flush.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Final

import msgspec

from stream_export.assemble.chunks import SCORE, START, STEP, Part, ScoreTag, Window
from stream_export.assemble.tokens import token_plane, tokens_upto
from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.episode import Episode, SourceOffset
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import EpisodeError

#: Seqs an episode may run ahead of its step count before they leave the array.
_SLACK: Final = 64


class OpenEpisode:
    """Fixed-size summary of an open episode; its events are in chunks/pending."""

    __slots__ = (
        "chunks",
        "close_offset",
        "close_reason",
        "closing",
        "done",
        "eid",
        "end",
        "expected",
        "far",
        "first",
        "held",
        "key",
        "last",
        "max_seq",
        "pending",
        "scores",
        "since",
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
        #: Its scores: score_id -> (tag, offset); None until the first one.
        self.scores: dict[str, tuple[ScoreTag, int]] | None = None
        #: Complete, and waiting for its required scores (scores.hold_s).
        self.held = False
        #: Offsets of its first and last event but scores: a score before ``since``
        #: came before the episode, one before ``done`` while it was open (what a
        #: rebuild from chunks written past the acknowledged offset must not hide).
        self.since = 1 << 62
        self.done = -1

    def names(self) -> set[str]:
        """The names of the scores it has."""
        return {tag.name for tag, _ in self.scores.values()} if self.scores else set()

    def slot(self, kind: int, num: int) -> int:
        if kind == STEP:
            if num < len(self.slots):
                return self.slots[num]
            return self.far.get(num, -1) if self.far else -1
        return self.start if kind == START else self.end

    def add(self, part: Part, size: int, chunk: int) -> None:
        """Count one part, filed under chunk number ``chunk``. A score counts in the
        size, never in the times (it does not keep an episode open)."""
        if part.kind == SCORE:
            assert part.score is not None
            if self.scores is None:
                self.scores = {}
            self.scores[part.score.score_id] = (part.score, part.offset)
            self.size += size
            return
        self.since = min(self.since, part.offset)
        self.done = max(self.done, part.offset)
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
        elif isinstance(event, EpisodeEnd):
            end, end_offset = event, part.offset
    if start is None:
        return None
    steps.sort(key=lambda item: item[0])
    ordered = [step for _, step, _ in steps]
    plane = token_plane(ordered)
    tokens = None
    if plane is not None:
        ordered, tokens = plane.steps, plane.tokens
        if tokens.base_missing:
            gone = set(tokens.base_missing)
            steps = [item for item in steps if item[0] not in gone]
    sources = [SourceOffset(partition, start_offset)]
    sources += [SourceOffset(partition, offset) for _, _, offset in steps]
    if end is not None:
        sources.append(SourceOffset(partition, end_offset))
    return Episode(
        episode_id=ep.eid,
        agent_id=start.agent_id,
        prompt=start.prompt,
        steps=ordered,
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
        tokens=tokens,
    )


def token_outcome(
    finished: Finished, episode: Episode
) -> tuple[list[str], list[tuple[Finished, EpisodeError]]]:
    """For a published ``episode``: why each of its token segments after the first
    started, and the events of the calls it went out without (their prompt base
    is missing), one by one with why, for their dead letters."""
    if episode.tokens is None:
        return [], []
    segments, missing = episode.tokens.segments, set(episode.tokens.base_missing)
    breaks = [s.break_reason for s in segments if s.break_reason is not None]
    rejects = []
    for part in finished.parts:
        if part.kind == STEP and part.num in missing:
            event = part.event or decode_event(part.raw)
            base = event.call.prompt_base if isinstance(event, Step) and event.call else None
            detail = (
                f"step seq {part.num} of episode {episode.episode_id!r} sent its prompt ids "
                f"as a delta against step {base}, which the episode does not have as an "
                "llm_call step with all its tokens"
            )
            error = EpisodeError(detail, reason=DeadLetterReason.TOKEN_BASE_MISSING)
            rejects.append((Finished(finished.episode, [part]), error))
    return breaks, rejects


def fitted(episode: Episode, limit: int) -> tuple[Episode, bytes] | None:
    """The episode and its encoding within ``limit`` bytes: whole if it fits, else
    with as many of its first steps as fit (and the tokens of their calls),
    truncated (``max_bytes``). Its events fit ``assemble.max_episode_bytes``, but
    the record adds a little per step (the source offsets): the last steps of an
    episode at that limit may not fit. None when not even the episode without
    steps fits."""
    value = encode(episode)
    if len(value) <= limit:
        return episode, value
    steps, sources = episode.steps, episode.sources
    ended = len(sources) > len(steps) + 1  # the last source is the end event's

    def cut(k: int) -> tuple[Episode, bytes]:
        kept = [*sources[: 1 + k], *sources[len(sources) - 1 :]] if ended else sources[: 1 + k]
        tokens = episode.tokens
        if tokens is not None:
            tokens = tokens_upto(tokens, steps[k - 1].seq if k else -1)
        short = msgspec.structs.replace(
            episode,
            steps=steps[:k],
            sources=kept,
            tokens=tokens,
            truncated=True,
            truncated_reason=DeadLetterReason.MAX_BYTES,
        )
        return short, encode(short)

    best = cut(0)
    if len(best[1]) > limit:
        return None
    low, high = 0, len(steps) - 1  # cut(low) fits; no cut(k) with k > high does
    while low < high:
        mid = (low + high + 1) // 2
        candidate = cut(mid)
        if len(candidate[1]) <= limit:
            low, best = mid, candidate
        else:
            high = mid - 1
    return best
