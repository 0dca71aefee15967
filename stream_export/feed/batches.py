"""The feed's pure rules: what a message gives a trainer, which messages it skips,
and which offsets an acknowledgement may commit.

A message becomes zero or more items: a closed group (``groups``), a finished
episode (``episodes``) or the ``tokens`` rows of an episode's model calls
(``tokens``). It gives none when it is a late rollout (no group to train on), a
record already delivered (a re-emission after a worker's crash), stale with the
``drop`` policy (its oldest weight version lags the trainer's by more than
``max_weight_lag``; with ``flag``, the default, it is delivered with its lag, so
the trainer can weight it), or not a record at all; each skip has a reason the
feed counts.

Order: ``arrival`` takes the messages as fetched; ``oldest`` and ``ready`` take
next, among the first message held of each partition, the one with the oldest
weight version or the earliest publish time. A partition's own order is always
kept: its commit advances over acknowledged messages in offset order.

Offsets: each batch holds, per partition, the messages it consumed (skipped ones
too). A partition's commit advances over the longest run of acknowledged batches
from its start, so acknowledging out of order never commits a batch that is not
acknowledged, and what was not acknowledged is delivered again after a crash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

import msgspec

from stream_export.contract.calls import version_key
from stream_export.contract.decoding import decode_episode, decode_record
from stream_export.contract.episode import Episode
from stream_export.errors import DecodeError
from stream_export.rows import tokens

Source = Literal["groups", "episodes", "tokens"]
#: What the feed does with a stale item: deliver it with its lag, or skip it.
Stale = Literal["flag", "drop"]
#: Which held message goes into a batch next (see the module doc).
Order = Literal["arrival", "oldest", "ready"]
SOURCES: Final = ("groups", "episodes", "tokens")
#: Why a message gives no item (the metrics' FEED_SKIPS).
Skip = Literal["late", "duplicate", "stale", "undecodable"]
Partition = tuple[str, int]


def _oldest(episodes: Iterable[Episode]) -> int | None:
    """The oldest integer weight version behind ``episodes`` (None: none has one)."""
    found = []
    for episode in episodes:
        low = episode.tokens.weight_version_min if episode.tokens is not None else None
        if low is not None:
            kind, value, _ = version_key(low)
            if kind == 0:
                found.append(value)
    return min(found, default=None)


class Read(NamedTuple):
    """What one message gives: its items (or why none), its oldest integer weight
    version and its lag behind the trainer's (None: unknown)."""

    items: list[Any]
    skip: Skip | None
    oldest: int | None = None
    lag: int | None = None


class _RecordId(msgspec.Struct):
    record_id: str


class _EpisodeId(msgspec.Struct):
    episode_id: str


_record_id = msgspec.json.Decoder(_RecordId).decode
_episode_id = msgspec.json.Decoder(_EpisodeId).decode


@dataclass
class Reader:
    """Turns the source's messages into items, skipping what a trainer must not get
    twice or at all. ``current_version`` gives the trainer's policy version."""

    source: Source
    max_weight_lag: int | None = None
    current_version: Callable[[], int] | None = None
    window: int = 100_000
    stale: Stale = "flag"
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def read(self, value: bytes | None) -> Read:
        try:
            if self.source == "groups":
                record = decode_record(value)
                if record.close_reason == "late":
                    return Read([], "late")
                return self._fresh(record.record_id, record.rollouts, [record])
            episode = decode_episode(value)
        except DecodeError:
            return Read([], "undecodable")
        items = [episode] if self.source == "episodes" else tokens.token_records(episode)
        return self._fresh(episode.episode_id, [episode], items)

    def remember(self, values: Iterable[bytes | None]) -> None:
        """Count these messages' records as delivered, without reading them whole:
        the messages a restarted feed resumes after (``Feed``'s look-back), among
        which a worker's re-emission may have its first copy."""
        for value in values:
            if value is None:
                continue
            try:
                key = (
                    _record_id(value).record_id
                    if self.source == "groups"
                    else _episode_id(value).episode_id
                )
            except msgspec.DecodeError:  # not a record: never delivered
                continue
            self._note(key)

    def _note(self, key: str) -> None:
        self._seen[key] = None
        self._seen.move_to_end(key)
        if len(self._seen) > self.window:
            self._seen.popitem(last=False)

    def _fresh(self, key: str, episodes: list[Episode], items: list[Any]) -> Read:
        if key in self._seen:
            return Read([], "duplicate")
        self._note(key)
        oldest = _oldest(episodes)
        current = self.current_version() if self.current_version is not None else None
        lag = None if oldest is None or current is None else current - oldest
        stale = lag is not None and self.max_weight_lag is not None and lag > self.max_weight_lag
        if stale and self.stale == "drop":
            return Read([], "stale", oldest, lag)
        return Read(items, None, oldest, lag)


@dataclass
class Held:
    """A fetched message not yet in a batch: where it is, when it was published
    (ms), what it gives."""

    tp: Partition
    offset: int
    timestamp: int
    read: Read

    @property
    def items(self) -> list[Any]:
        return self.read.items

    @property
    def lag(self) -> int | None:
        return self.read.lag


def next_held(held: list[Held], order: Order) -> int:
    """The index of the held message to batch next: the first one (``arrival``), or
    among each partition's first, the one with the oldest weight version (unknown
    last; ``oldest``) or the earliest publish time (``ready``); ties by position."""
    if order == "arrival":
        return 0
    heads: dict[Partition, int] = {}
    for index, message in enumerate(held):
        heads.setdefault(message.tp, index)

    def key(index: int) -> tuple[float, int]:
        message = held[index]
        if order == "ready":
            return (message.timestamp, index)
        oldest = message.read.oldest
        return (float("inf") if oldest is None else oldest, index)

    return min(heads.values(), key=key)


@dataclass
class Ledger:
    """Delivered and acknowledged batches, per partition, in delivery order."""

    #: Per partition: [batch number, next offset after its messages, acknowledged].
    _open: dict[Partition, list[list[Any]]] = field(default_factory=dict)
    _acked: set[int] = field(default_factory=set)

    def deliver(self, number: int, ends: dict[Partition, int]) -> None:
        """Batch ``number`` consumed each partition up to (not including) its end."""
        for tp, end in ends.items():
            self._open.setdefault(tp, []).append([number, end])

    def acknowledge(self, number: int) -> dict[Partition, int]:
        """Mark a batch acknowledged; return the offsets to commit now (per
        partition: after the longest acknowledged run from its oldest batch)."""
        self._acked.add(number)
        commits = {}
        for tp, batches in self._open.items():
            while batches and batches[0][0] in self._acked:
                commits[tp] = batches.pop(0)[1]
        still = {b[0] for batches in self._open.values() for b in batches}
        self._acked &= still
        return commits

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Partitions gone to another trainer: their batches are delivered there again."""
        for tp in partitions:
            self._open.pop(tp, None)

    @property
    def unacknowledged(self) -> int:
        return len({b[0] for batches in self._open.values() for b in batches} - self._acked)
