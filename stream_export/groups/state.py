"""GRPO groups as a pure state machine: no Kafka, no Faust, no clock of its own.

Rollouts of one task share a group id. After they are re-keyed by group id, one
partition owns each group, and one :class:`GroupBook` per partition gathers its
groups' finished rollouts (:class:`Member`) and says when each group closes:

* when ``expected`` members have arrived (reason ``size``; ``expected`` comes from
  the first rollout's ``group_size`` or the ``default_size`` setting), or
* when the partition's event-time clock (moved by :meth:`GroupBook.watermark`, or
  :meth:`GroupBook.advance`: never by a rollout, whose end time says nothing of the
  rollouts other sources still hold) reaches ``timeout_s`` after the group's
  earliest rollout ended (reason ``timeout``). A
  timed-out group is emitted ``complete=false`` with the count still missing if it
  holds at least ``min_members`` scored rollouts, else dropped (``too_small``).

Truncated rollouts count towards the size (they ended) but not towards the
statistics; a group without any scored rollout is dropped too. The same episode id
twice counts once: a copy from another position of the episodes topic is a
:class:`Duplicate`, the same position forwarded again (a crash's replay of the
regroup step) is nothing. A closed group never reopens: its marker
(:class:`ClosedGroup`, kept ``closed_retention_s`` of event time after the group's
close and the latest end of its rollouts) turns a later rollout into :class:`Late`
(a member's or a late one's id again into :class:`Duplicate`, or nothing, by the
same rule). A rollout that ended ``closed_retention_s`` or more before the clock
opens no group either: its group may have closed and been forgotten (a crash
forwarding its members again would otherwise publish a second version of its
record under the same id), so it is :class:`Late` too.

A crash replays messages whose effects the stored state already holds. Each group's
state (open or closed) keeps the offset of the last message applied to it, so a
message at or below it is recognised as a replay and changes nothing: a group
emitted again after a crash is the same record, field for field (its ``closed_at``
is event time of its own, not the partition clock). Of a group forgotten since,
the book keeps :attr:`Clock.forgotten` instead.

With a judge (``with_judge``), a group that closes with enough rollouts is not emitted
but *judged*: it stays in :attr:`GroupBook.open`, flagged (:attr:`OpenGroup.closing`),
never times out, and takes later rollouts as a closed group does (late); the first
verdict read for it (:meth:`GroupBook.judged`) closes it, and any other verdict is
:class:`Ignored` (:mod:`.judge`).

State that must survive a crash is :attr:`GroupBook.open`, :attr:`GroupBook.closed`
and the book's :class:`Clock`; :meth:`GroupBook.take_changes` says which keys to
write or delete, :meth:`GroupBook.take_clock` whether the clock moved, and
:meth:`GroupBook.restore` rebuilds the book from them. A group found both open and
closed in stored state is closed (its marker is written first; the open entry is
stale and is deleted).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.groups import rollout_reward

CloseReason = Literal["size", "timeout"]


class Member(msgspec.Struct, array_like=True, frozen=True):
    """One finished rollout of a group; ``record`` is opaque here (the episode),
    ``source`` the publication it came from (:func:`publication`; -1: unknown):
    two copies from one publication are one rollout forwarded again, never a
    duplicate."""

    episode_id: str
    time: float
    reward: float
    truncated: bool
    record: bytes = b""
    source: int = -1


class OpenGroup(msgspec.Struct, array_like=True):
    group_id: str
    #: Event time of the earliest member's end: the timeout counts from it.
    opened: float
    expected: int | None
    members: list[Member] = []
    duplicates: int = 0
    #: Offset of the last message applied (-1: none known, or state stored before
    #: offsets were).
    offset: int = -1
    #: Digest of the first rollout's prompt (:func:`.keys.prompt_digest`; "" unchecked).
    prompt: str = ""
    #: Sources of the copies counted in ``duplicates`` (at most MAX_COPIES), so the
    #: same copy forwarded again is not counted again.
    copies: list[int] = []
    #: While judged: why and when it closed ("": open); its late rollouts, as
    #: :attr:`ClosedGroup.late` and :attr:`ClosedGroup.late_sources`.
    closing: CloseReason | Literal[""] = ""
    closed_at: float = 0.0
    late: list[str] = []
    late_sources: list[int] = []

    def copy_of(self, member: Member) -> bool | None:
        """As :meth:`ClosedGroup.copy_of`, for a judged group."""
        ids, sources = [m.episode_id for m in self.members], [m.source for m in self.members]
        return _copy_of(member, ((ids, sources), (self.late, self.late_sources)), self.copies)


class ClosedGroup(msgspec.Struct, array_like=True):
    """Marker of a closed (emitted or dropped) group: its members' and its late
    rollouts' episode ids, so that a repeat of either is recognised."""

    #: Event time its retention counts from: the group's close, or the end of one
    #: of its rollouts if later (each is forgotten only once it is too old to open
    #: a group).
    closed: float
    reason: str
    episode_ids: list[str]
    late: list[str] = []
    #: Offset of the last message applied, as :attr:`OpenGroup.offset`.
    offset: int = -1
    #: The sources (:attr:`Member.source`) of ``episode_ids`` and of ``late``, aligned
    #: (empty in markers stored before they were kept: every repeat is a duplicate).
    sources: list[int] = []
    late_sources: list[int] = []
    #: As :attr:`OpenGroup.prompt` and :attr:`OpenGroup.copies`.
    prompt: str = ""
    copies: list[int] = []

    def copy_of(self, member: Member) -> bool | None:
        """Whether ``member`` repeats a member or late rollout of this group: True
        for a copy not seen yet (noted), False for one forwarded again, None if new."""
        pairs = ((self.episode_ids, self.sources), (self.late, self.late_sources))
        return _copy_of(member, pairs, self.copies)


class Clock(msgspec.Struct, array_like=True):
    """A book's event-time clock and its sources' watermarks: stored with its groups,
    so that a restored book closes each group when the original did."""

    clock: float
    marks: dict[int, float] = {}
    #: The offset of the last message that made the book forget a closed group
    #: (-1: none): a message at or before it that finds no group is a replay.
    forgotten: int = -1


@dataclass(frozen=True, slots=True)
class Emitted:
    group: OpenGroup
    reason: CloseReason
    complete: bool
    #: Expected members that never arrived (None when the size is unknown).
    missing: int | None
    #: Event time the group closed at: its latest member's end (size) or its
    #: deadline (timeout), the same however often the group is replayed.
    closed_at: float


@dataclass(frozen=True, slots=True)
class Dropped:
    group: OpenGroup
    reason: Literal["too_small"] = "too_small"


@dataclass(frozen=True, slots=True)
class Judging:
    """A group closed, to be judged before it is emitted."""

    group: OpenGroup


@dataclass(frozen=True, slots=True)
class Ignored:
    """A verdict for a group not being judged (judged already, or never)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class Late:
    group_id: str
    member: Member


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A rollout whose prompt is not its group's: left out of the group."""

    group_id: str
    member: Member


@dataclass(frozen=True, slots=True)
class Duplicate:
    group_id: str
    episode_id: str


Result = Emitted | Dropped | Late | Duplicate | Mismatch | Judging | Ignored


def member_of(episode: Episode, record: bytes = b"", source: int = -1) -> Member:
    """The member an episode makes; without a reward, its outcome scores it."""
    reward = rollout_reward(episode)
    return Member(episode.episode_id, episode.end_time, reward, episode.truncated, record, source)


def source_position(partition: int, offset: int) -> int:
    """One number for an episodes-topic position (:attr:`Member.source`)."""
    return partition << 48 | offset


#: Set in the :attr:`Member.source` of an episode the assembler built.
ASSEMBLED: Final = 1 << 62


def publication(episode: Episode, partition: int, offset: int) -> int:
    """The publication an episode forwarded from episodes-topic ``partition`` and
    ``offset`` (-1: unknown) belongs to, the same for each of its copies.

    An episode the assembler built names the steps it was built from (its
    ``sources``): the assembler publishes each episode once, and what it publishes
    again after a crash (at another position) is the same episode from the same
    steps, so the steps-topic position of its first event is the publication. Any
    other episode is its own publication at each position of the episodes topic
    (a producer's second copy is a duplicate)."""
    if episode.sources:
        first = episode.sources[0]
        return ASSEMBLED | source_position(first.partition, first.offset)
    return source_position(partition, offset) if offset >= 0 else -1


def scored(members: Sequence[Member]) -> list[Member]:
    """The members that count in the statistics (not truncated)."""
    return [m for m in members if not m.truncated]


class GroupBook:
    """The open and recently closed groups of one partition."""

    def __init__(
        self,
        *,
        timeout_s: float,
        min_members: int,
        default_size: int | None,
        closed_retention_s: float,
        with_judge: bool = False,
    ) -> None:
        self.timeout_s = timeout_s
        self.with_judge = with_judge
        #: The ids of the groups being judged.
        self.judging: set[str] = set()
        self.min_members = min_members
        self.default_size = default_size
        self.closed_retention_s = closed_retention_s
        self.open: dict[str, OpenGroup] = {}
        self.closed: dict[str, ClosedGroup] = {}
        self.clock = -math.inf
        #: Source partition -> the latest wall time it has forwarded everything by.
        self._marks: dict[int, float] = {}
        #: As :attr:`Clock.forgotten`.
        self.forgotten = -1
        #: Markers forgotten since the last persist, and before it: they are deleted
        #: from the stored state only by the persist after the one that stores
        #: ``forgotten`` (stored last), so a crash never leaves a group's marker
        #: deleted, nor its open entry, without it.
        self._forgetting: dict[str, ClosedGroup] = {}
        self._forget: set[str] = set()
        # (due time, group id); an entry whose group changed since is skipped.
        self._deadlines: list[tuple[float, str]] = []
        self._expiries: list[tuple[float, str]] = []
        self._changed_open: set[str] = set()
        self._changed_closed: set[str] = set()
        self._clock_changed = False

    def add(
        self,
        group_id: str,
        member: Member,
        expected: int | None = None,
        offset: int | None = None,
        prompt: str = "",
    ) -> list[Result]:
        """One finished rollout of ``group_id`` (``expected``: its start's group_size),
        from the message at ``offset`` of this partition (None: offsets unknown, no
        replay is recognised), with the digest of its ``prompt`` ("": unchecked)."""
        results: list[Result] = []
        marker: ClosedGroup | OpenGroup | None = self.closed.get(group_id)
        if marker is None and group_id in self.judging:
            marker = self.open[group_id]
        if marker is not None:
            if offset is not None:
                if offset <= marker.offset:
                    return results  # a replay
                marker.offset = offset
            changed = self._changed_open if group_id in self.judging else self._changed_closed
            changed.add(group_id)
            copy = marker.copy_of(member)
            if _differ(marker.prompt, prompt):
                results.append(Mismatch(group_id, member))
            elif copy:
                results.append(Duplicate(group_id, member.episode_id))
            elif copy is None:
                marker.late.append(member.episode_id)
                marker.late_sources.append(member.source)
                if isinstance(marker, ClosedGroup) and member.time > marker.closed:
                    marker.closed = member.time
                    self._expire(group_id, marker)
                results.append(Late(group_id, member))
            return results
        group = self.open.get(group_id)
        if group is not None and offset is not None and offset <= group.offset:
            return results  # a replay
        if group is None and offset is not None and offset <= self.forgotten:
            return results  # a replay: applied to a group forgotten since
        if group is None and member.time + self.closed_retention_s <= self.clock:
            return [Late(group_id, member)]  # its group may be closed and forgotten
        if group is None:
            size = expected if expected is not None else self.default_size
            group = self.open[group_id] = OpenGroup(group_id, member.time, size, [], prompt=prompt)
            self._schedule(group)
        self._changed_open.add(group_id)
        if offset is not None:
            group.offset = offset
        if _differ(group.prompt, prompt):
            results.append(Mismatch(group_id, member))
            return results
        kept = next((m for m in group.members if m.episode_id == member.episode_id), None)
        if kept is not None:
            forwarded_again = member.source >= 0 and kept.source == member.source
            if not forwarded_again and _new_copy(group.copies, member.source):
                group.duplicates += 1
                results.append(Duplicate(group_id, member.episode_id))
            return results
        group.members.append(member)
        if member.time < group.opened:
            group.opened = member.time
            self._schedule(group)
        if group.expected is not None and len(group.members) >= group.expected:
            results.append(self._close(group, "size"))
        return results

    def advance(self, now: float, offset: int | None = None) -> list[Result]:
        """Move the clock to ``now`` (never back) and close the groups due by then,
        as the message at ``offset`` (None: whatever their offsets).

        A group or marker whose stored offset is at or past ``offset`` is left for a
        later move: this message is replayed, and the run that applied it first had
        not closed (or forgotten) that group then, since it applied more to it."""
        if now > self.clock:
            self.clock = now
            self._clock_changed = True
        results: list[Result] = []
        later: list[tuple[float, str]] = []
        while self._deadlines and self._deadlines[0][0] <= self.clock:
            due, group_id = heapq.heappop(self._deadlines)
            group = self.open.get(group_id)
            if group is None or group.closing or group.opened + self.timeout_s != due:
                continue
            if offset is not None and group.offset >= offset:
                later.append((due, group_id))
            else:
                results.append(self._close(group, "timeout", due))
        for entry in later:
            heapq.heappush(self._deadlines, entry)
        later = []
        while self._expiries and self._expiries[0][0] <= self.clock:
            due, group_id = heapq.heappop(self._expiries)
            marker = self.closed.get(group_id)
            if marker is None or marker.closed + self.closed_retention_s != due:
                continue
            if offset is not None and marker.offset >= offset:
                later.append((due, group_id))
            else:
                self._forgetting[group_id] = self.closed.pop(group_id)
                if offset is not None and offset > self.forgotten:
                    self.forgotten = offset
                    self._clock_changed = True
        for entry in later:
            heapq.heappush(self._expiries, entry)
        return results

    def watermark(
        self, source: int, wall: float, sources: int, slack: float, offset: int | None = None
    ) -> list[Result]:
        """Source partition ``source`` (of ``sources``) had forwarded every rollout it
        had by wall time ``wall`` (said by the message at ``offset``). Once every
        source has said so, the clock follows the earliest of them, less ``slack``
        (rollouts reach the episodes topic within that of their end time), so groups
        close on time on a quiet partition, but never while a source is stalled (its
        worker dead, say)."""
        if wall > self._marks.get(source, -math.inf):
            self._marks[source] = wall
            self._clock_changed = True
        if len(self._marks) < sources:
            return []
        return self.advance(min(self._marks.values()) - slack, offset)

    def restore(
        self,
        open_groups: Iterable[OpenGroup],
        closed: dict[str, ClosedGroup],
        clock: Clock | None = None,
    ) -> None:
        """Rebuild from stored state (after a restart or rebalance).

        The clock is the stored one only, never derived from the groups: it is
        stored last in a persist, so a persist cut short by a crash may have stored
        groups its clock never saw, and the replay that follows moves the clock
        through the same times again. A clock ahead of the replay would time out
        groups the replay re-creates before their members are back. A marker the
        clock is past the retention of was forgotten before that clock was stored
        (its deletion was still to come): it is forgotten again, not restored."""
        if clock is not None:
            self.clock, self._marks = clock.clock, dict(clock.marks)
            self.forgotten = clock.forgotten
        for group_id, marker in closed.items():
            if marker.closed + self.closed_retention_s <= self.clock:
                self._forget.add(group_id)
                continue
            self.closed[group_id] = marker
            self._expire(group_id, marker)
        for group in open_groups:
            if group.group_id in self.closed or group.group_id in self._forget:
                self._changed_open.add(group.group_id)  # a crash between the two writes
                continue
            self.open[group.group_id] = group
            if group.closing:
                self.judging.add(group.group_id)
            else:
                self._schedule(group)

    def judged(self, group_id: str, offset: int | None = None) -> list[Result]:
        """A verdict for ``group_id`` (the message at ``offset``): the group, if being
        judged, closes as it would have without a judge."""
        marker = self.closed.get(group_id)
        if marker is not None and offset is not None and offset <= marker.offset:
            return []  # a replay of the verdict that closed it
        group = self.open.get(group_id)
        if group is None or not group.closing:  # not being judged
            return [Ignored(group_id)]
        if offset is not None:
            group.offset = offset
        self.judging.discard(group_id)
        return [self._finish(group, group.closing, group.closed_at)]

    def take_changes(self) -> tuple[dict[str, OpenGroup | None], dict[str, ClosedGroup | None]]:
        """Open groups and closed markers changed since the last call (None: deleted;
        a forgotten marker only at the call after the one that forgot it)."""
        opened = {g: self.open.get(g) for g in self._changed_open}
        closed = {g: self.closed.get(g, self._forgetting.get(g)) for g in self._changed_closed}
        closed |= {g: None for g in self._forget if g not in self.closed}
        self._forget, self._forgetting = set(self._forgetting), {}
        self._changed_open.clear()
        self._changed_closed.clear()
        return opened, closed

    def take_clock(self) -> Clock | None:
        """The clock to store, if it moved since the last call."""
        if not self._clock_changed:
            return None
        self._clock_changed = False
        return Clock(self.clock, dict(self._marks), self.forgotten)

    def _schedule(self, group: OpenGroup) -> None:
        heapq.heappush(self._deadlines, (group.opened + self.timeout_s, group.group_id))

    def _expire(self, group_id: str, marker: ClosedGroup) -> None:
        heapq.heappush(self._expiries, (marker.closed + self.closed_retention_s, group_id))

    def _close(
        self, group: OpenGroup, reason: CloseReason, deadline: float = math.inf
    ) -> Emitted | Dropped | Judging:
        """Close ``group``: at its ``deadline`` (a timeout), or where there is none
        (its size, or an infinite timeout) at its latest member's end."""
        at = deadline if math.isfinite(deadline) else max(m.time for m in group.members)
        kept = len(scored(group.members))
        dropped = kept == 0 or (reason == "timeout" and kept < self.min_members)
        if self.with_judge and not dropped:
            group.closing, group.closed_at = reason, at
            self.judging.add(group.group_id)
            self._changed_open.add(group.group_id)
            return Judging(group)
        return self._finish(group, reason, at)

    def _finish(self, group: OpenGroup, reason: CloseReason, at: float) -> Emitted | Dropped:
        """Forget ``group`` (closed at ``at``) for a marker, and say what to publish."""
        del self.open[group.group_id]
        self._changed_open.add(group.group_id)
        ids = [m.episode_id for m in group.members]
        sources = [m.source for m in group.members]
        marker = ClosedGroup(
            max(at, *(m.time for m in group.members)),
            reason,
            ids,
            group.late,
            offset=group.offset,
            sources=sources,
            late_sources=group.late_sources,
            prompt=group.prompt,
            copies=group.copies,
        )
        self.closed[group.group_id] = marker
        self._changed_closed.add(group.group_id)
        self._expire(group.group_id, marker)
        kept = len(scored(group.members))
        if kept == 0 or (reason == "timeout" and kept < self.min_members):
            return Dropped(group)
        if reason == "size":
            return Emitted(group, reason, complete=True, missing=0, closed_at=at)
        missing = None if group.expected is None else group.expected - len(group.members)
        return Emitted(group, reason, complete=False, missing=missing, closed_at=at)


def _differ(kept: str, prompt: str) -> bool:
    """Whether two prompt digests are known and differ."""
    return bool(kept and prompt and kept != prompt)


#: Copies a group remembers (beyond, one forwarded again may count twice).
MAX_COPIES: Final = 1024


def _copy_of(
    member: Member, pairs: Iterable[tuple[list[str], list[int]]], copies: list[int]
) -> bool | None:
    """Whether ``member`` repeats one of the (ids, sources) ``pairs``: True for a copy
    not seen yet (noted in ``copies``), False for one forwarded again, None if new."""
    for ids, sources in pairs:
        if member.episode_id in ids:
            i = ids.index(member.episode_id)
            if member.source >= 0 and i < len(sources) and sources[i] == member.source:
                return False
            return _new_copy(copies, member.source)
    return None


def _new_copy(copies: list[int], source: int) -> bool:
    """Whether a copy from ``source`` was not seen yet; notes it (unknown sources,
    -1, are always new: nothing tells them apart)."""
    if source >= 0 and source in copies:
        return False
    if source >= 0 and len(copies) < MAX_COPIES:
        copies.append(source)
    return True
