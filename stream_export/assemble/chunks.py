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

from stream_export.events import StepEvent

START: Final = 0
STEP: Final = 1
END: Final = 2
_CHUNK_SUFFIX: Final = 5

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


def encode_chunk(partition: int, parts: list[Part]) -> bytes:
    return _encoder.encode(
        Chunk(
            partition,
            [p.offset for p in parts],
            [p.kind for p in parts],
            [p.num for p in parts],
            [p.time for p in parts],
            [len(p.raw) for p in parts],
            [p.raw for p in parts],
        )
    )


def decode_chunk(data: bytes) -> list[Part]:
    c = _chunk_decoder.decode(data)
    return [
        Part(*fields) for fields in zip(c.kinds, c.nums, c.times, c.offsets, c.raws, strict=True)
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
