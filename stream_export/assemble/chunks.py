"""The stored form of open episodes: chunks (the open-episodes table, windowed) and
closed markers (the closed-episodes table), with their keys and codecs.

* A chunk holds the events one episode accepted since the last flush, as columns,
  under the windowed key ``(episode key + 0x00 + chunk number, window)``. The
  window is the one the I/O layer names at the episode's first flush and all its
  chunks share it, so the table's window expiry frees an abandoned episode as a
  whole. A chunk is written once and deleted when the episode closes.
* A marker is one small record per closed episode, under the episode key, kept for
  ``closed_retention_s`` to recognise late and replayed events.
"""

from __future__ import annotations

from typing import Final, NamedTuple, Protocol

import msgspec

from stream_export.contract.events import StepEvent

START: Final = 0
STEP: Final = 1
END: Final = 2
SCORE: Final = 3
_CHUNK_SUFFIX: Final = 5

#: A windowed-table key: (key, (window start, window end)), as Faust shapes them.
Window = tuple[float, float]
ChunkKey = tuple[bytes, Window]


class ScoreTag(msgspec.Struct, array_like=True, frozen=True):
    """What the summary of an open episode keeps of a score: its name, its id and
    a digest of its content (without its time), to recognise it again."""

    name: str
    score_id: str
    digest: int


class Part(NamedTuple):
    """One accepted event: what it is, when, where from, and its original bytes.

    ``num`` is the seq of a step, the announced step count of an end, 0 for a start
    or a score (``score`` names it). ``event`` is the decoded event while it is
    still in memory (not read back).
    """

    kind: int
    num: int
    time: float
    offset: int
    raw: bytes
    event: StepEvent | None = None
    score: ScoreTag | None = None


class _Columns(msgspec.Struct, array_like=True):
    partition: int
    offsets: list[int]
    kinds: list[int]
    nums: list[int]
    times: list[float]
    sizes: list[int]


class ChunkIndex(_Columns, array_like=True):
    """A chunk without its event bytes: decoding skips them (used to rebuild)."""

    raws: msgspec.Raw
    #: One per part when the chunk holds a score (None for the other parts).
    scores: list[ScoreTag | None] = []


class Chunk(_Columns, array_like=True, omit_defaults=True):
    """The stored form of the parts one batch added to one episode (columns); a
    chunk without scores is stored as before scores existed."""

    raws: list[bytes]
    scores: list[ScoreTag | None] = []


class Seen(msgspec.Struct, array_like=True, frozen=True):
    """A score a closed episode has had (in its record or in the scores output)."""

    score_id: str
    offset: int
    digest: int


class Closed(msgspec.Struct, array_like=True, omit_defaults=True):
    """Marker of a closed episode.

    Every event of the partition at or below ``offset`` had been processed when
    the episode closed, so such an event arriving again is a replay after a crash
    or rebalance (ignored), and a later one is a late event (a later score goes
    to the scores output once: ``scores`` are those it has had).
    """

    partition: int
    offset: int
    reason: str | None = None
    scores: list[Seen] = []


def clock_key(partition: int) -> bytes:
    """The markers-table key of a partition's clock: not UTF-8, so never an
    episode's; with the partition, as a memory store shares keys across them."""
    return b"\xff\xfeclock" + partition.to_bytes(4, "big")


_chunk_decoder: Final = msgspec.msgpack.Decoder(Chunk)
_index_decoder: Final = msgspec.msgpack.Decoder(ChunkIndex)
_closed_decoder: Final = msgspec.msgpack.Decoder(Closed)
_encoder: Final = msgspec.msgpack.Encoder()


def chunk_key(key: bytes, number: int) -> bytes:
    return key + b"\x00" + number.to_bytes(4, "big")


def split_chunk_key(key: bytes) -> tuple[bytes, int]:
    return key[:-_CHUNK_SUFFIX], int.from_bytes(key[-4:], "big")


def encode_chunk(partition: int, parts: list[Part]) -> bytes:
    scores = [p.score for p in parts]
    return _encoder.encode(
        Chunk(
            partition,
            [p.offset for p in parts],
            [p.kind for p in parts],
            [p.num for p in parts],
            [p.time for p in parts],
            [len(p.raw) for p in parts],
            [p.raw for p in parts],
            scores if any(scores) else [],
        )
    )


def decode_chunk(data: bytes) -> list[Part]:
    c = _chunk_decoder.decode(data)
    scores = c.scores or [None] * len(c.kinds)
    return [
        Part(kind, num, time, offset, raw, None, score)
        for kind, num, time, offset, raw, score in zip(
            c.kinds, c.nums, c.times, c.offsets, c.raws, scores, strict=True
        )
    ]


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
