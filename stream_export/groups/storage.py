"""The groups stage's stored form: what a persist writes to its two tables and how a
rebuild reads it back (pure: the stage does the I/O).

* ``groups-open`` (windowed) holds each open group as a summary (its members
  without their episodes) under ``(group key, window)``, and each member's episode
  in an entry of its own under ``(group key + 0xc1 "m" + member number, window)``,
  written once. A change to a group rewrites its small summary and adds the new
  members' entries, so the state work for a rollout is its own size, never its
  group's. The window is the one of the group's first persist; its expiry is only a
  backstop for abandoned state. A group being judged (``groups.judge_url``) is
  stored so too, its summary marked (:attr:`~.state.OpenGroup.closing`), until its
  verdict closes it.
* ``groups-closed`` holds one marker per closed group under the group key, and the
  book's clock under :data:`CLOCK_KEY`.

A persist writes the markers, then the open groups, then the clock.

Member entries are written before their summary, on one changelog partition, so a
summary implies its members' entries. A crash in between leaves entries numbered
past their group's summary (or of a group with none): a rebuild ignores them and
the next persist deletes them. Values of any size are split by the changelog writer
(:mod:`stream_export.runtime.pieces`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from stream_export.groups.state import Clock, ClosedGroup, OpenGroup

#: What the closed table's wall-clock expiry (RocksDB's TTL, the changelog's
#: retention) adds to groups.closed_retention_s, at least: the book forgets its
#: markers itself, on event time, which lags the wall clock by quiet_partition_s
#: and any stall of a source; a marker dropped first would let a rebuild open its
#: group anew.
BACKSTOP_S: Final = 86_400.0

#: The closed-table key of a partition's clock: not UTF-8, so never a group id's key.
CLOCK_KEY: Final = b"\xff"
#: Between a group's key and a member's number in a member entry's key (0xc1 never
#: occurs in UTF-8, so no group id's key looks like it).
MEMBER_TAG: Final = b"\xc1m"

Window = tuple[float, float]
Write = tuple[Any, bytes | None]


class Stored(msgspec.Struct, array_like=True):
    """A table value: the repartition partition it belongs to, and one of: an open
    group's summary, a member's episode (``record``), a closed marker, the clock."""

    partition: int
    open: OpenGroup | None = None
    closed: ClosedGroup | None = None
    clock: Clock | None = None
    record: bytes | None = None


_decoder: Final = msgspec.msgpack.Decoder(Stored)
_encoder: Final = msgspec.msgpack.Encoder()


def backstop_s(retention_s: float) -> float:
    """How long the closed table keeps what the book keeps ``retention_s``: twice
    that, and a day more at least (only abandoned markers are left to it)."""
    return retention_s + max(retention_s, BACKSTOP_S)


def member_key(group_key: bytes, number: int) -> bytes:
    return group_key + MEMBER_TAG + number.to_bytes(4, "big")


def split_member_key(key: bytes) -> tuple[bytes, int] | None:
    """(group key, member number) of a member entry's key; None for a summary's."""
    if key[-6:-4] != MEMBER_TAG:
        return None
    return key[:-6], int.from_bytes(key[-4:], "big")


def marker_writes(partition: int, closed: Mapping[str, ClosedGroup | None]) -> list[Write]:
    """The closed table's writes for changed markers (None: forgotten)."""
    return [
        (k.encode(), None if v is None else _encoder.encode(Stored(partition, closed=v)))
        for k, v in closed.items()
    ]


def clock_writes(partition: int, clock: Clock | None) -> list[Write]:
    """The closed table's write of a moved clock: the last of a persist (see
    :meth:`~stream_export.groups.state.GroupBook.restore`)."""
    return [] if clock is None else [(CLOCK_KEY, _encoder.encode(Stored(partition, clock=clock)))]


@dataclass
class Restored:
    """One partition's stored groups, read back."""

    open: list[OpenGroup] = field(default_factory=list)
    closed: dict[str, ClosedGroup] = field(default_factory=dict)
    clock: Clock | None = None


@dataclass
class OpenEntries:
    """What this worker has stored of its open groups: the window each is filed
    under and how many of its members' entries exist, so a persist writes only the
    new ones and a close deletes them all."""

    windows: dict[str, Window] = field(default_factory=dict)
    members: dict[str, int] = field(default_factory=dict)
    #: Per partition, entries a rebuild found orphaned, deleted at the next persist.
    garbage: dict[int, list[Any]] = field(default_factory=dict)

    def writes(
        self, partition: int, opened: Mapping[str, OpenGroup | None], window: Window
    ) -> list[Write]:
        """The open table's writes for changed groups (None: closed): the new
        members' entries, then the summaries; a closed group's summary, then its
        entries."""
        writes: list[Write] = [(key, None) for key in self.garbage.pop(partition, [])]
        for group_id, group in opened.items():
            key = group_id.encode()
            stored = self.members.get(group_id, 0)
            if group is None:
                where = self.windows.pop(group_id, None)
                self.members.pop(group_id, None)
                if where is not None:
                    writes.append(((key, where), None))
                    writes += [((member_key(key, i), where), None) for i in range(stored)]
                continue
            where = self.windows.setdefault(group_id, window)
            for i in range(stored, len(group.members)):
                value = Stored(partition, record=group.members[i].record)
                writes.append(((member_key(key, i), where), _encoder.encode(value)))
            self.members[group_id] = max(stored, len(group.members))
            members = [msgspec.structs.replace(m, record=b"") for m in group.members]
            summary = msgspec.structs.replace(group, members=members)
            writes.append(((key, where), _encoder.encode(Stored(partition, open=summary))))
        return writes

    def restore(
        self,
        open_items: Iterable[tuple[Any, bytes, list[Any]]],
        closed_items: Iterable[tuple[Any, bytes, list[Any]]],
        partitions: Iterable[int],
    ) -> tuple[dict[int, Restored], list[tuple[int, Any]]]:
        """Read the tables' (key, whole value, piece keys) items back for
        ``partitions``: per partition its groups, and every (partition, key) of the
        open table to keep under window expiry."""
        found: dict[int, Restored] = {p: Restored() for p in partitions}
        self.windows, self.members, self.garbage = {}, {}, {}
        records: dict[tuple[int, bytes], dict[int, tuple[Any, bytes, list[Any]]]] = {}
        expiring: list[tuple[int, Any]] = []
        for key, value, parts in open_items:
            stored = _decoder.decode(value)
            p = stored.partition
            if p not in found:
                continue
            expiring += [(p, k) for k in (key, *parts)]
            numbered = split_member_key(key[0])
            if numbered is not None and stored.record is not None:
                records.setdefault((p, numbered[0]), {})[numbered[1]] = (key, stored.record, parts)
            elif stored.open is not None:
                found[p].open.append(stored.open)
                self.windows[stored.open.group_id] = key[1]
        for p, restored in found.items():
            for group in restored.open:
                entries = records.pop((p, group.group_id.encode()), {})
                for i, member in enumerate(group.members):  # stored before entries: kept
                    record = entries[i][1] if i in entries else member.record
                    group.members[i] = msgspec.structs.replace(member, record=record)
                self.members[group.group_id] = max(entries, default=-1) + 1
        for (p, _group), entries in records.items():  # of groups with no summary
            self.garbage.setdefault(p, []).extend(key for key, _r, _parts in entries.values())
        for key, value, _parts in closed_items:
            stored = _decoder.decode(value)
            if stored.partition not in found:
                continue
            if stored.clock is not None:
                found[stored.partition].clock = stored.clock
            elif stored.closed is not None:
                found[stored.partition].closed[key.decode()] = stored.closed
        return found, expiring
