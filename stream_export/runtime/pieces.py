"""Table values of any size, stored as entries no changelog record can outgrow.

A Kafka record is bounded by the topic's ``max.message.bytes`` (the broker's
default, 1,048,588 bytes, on the changelogs Faust creates) and by the producer's
request size. A stage's state is not: an episode's chunk, a group's marker. So a
value over :data:`PIECE_BYTES` is stored as numbered pieces under keys of their
own, followed by a small pointer under the value's key; readers see the whole
value or nothing (:func:`join`).

Tags and keys cannot be mistaken for state:

* a pointer starts with ``0xc1 0x00`` and a piece with ``0xc1 0x01``; 0xc1 is the
  one byte MessagePack never uses, and every value the stages store is MessagePack,
  so no plain value starts with it (:func:`split` stores one that does as pieces);
* a piece's key is its value's key plus ``0xc1 "p"``, the value's generation and the
  piece's number (4 bytes each). The keys
  of the stages' tables are UTF-8 ids (0xc1 never occurs in UTF-8), optionally
  followed by a 5- or 6-byte suffix that never has 0xc1 where this one has it
  (the assembler's chunk suffix starts with 0x00, the groups' member suffix is
  below), so a piece key equals no state key.

Pieces are written before their pointer, on the same changelog partition, so a
pointer that was delivered implies its pieces were; a value written again gets
the next generation, so its pieces never overwrite those the stored pointer still
names, and the old generation's pieces are deleted after the new pointer. A crash
between them leaves pieces no pointer names: never read, and removed with their
table's retention (the window expiry of the open tables, the closed tables').
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

#: The largest value stored as it is, and the size of each piece of a larger one:
#: half the broker's default max.message.bytes, with room for key and framing.
PIECE_BYTES: Final = 512 * 1024
POINTER: Final = b"\xc1\x00"
PIECE: Final = b"\xc1\x01"
_KEY_TAG: Final = b"\xc1p"
_HEADER: Final = len(POINTER) + 4 + 4 + 8


def piece_key(key: Any, generation: int, number: int) -> Any:
    """The key of piece ``number`` of generation ``generation`` of the value under
    ``key`` (bytes, or a windowed ``(bytes, window)``: the window stays, so pieces
    expire with their value)."""
    suffix = _KEY_TAG + generation.to_bytes(4, "big") + number.to_bytes(4, "big")
    if isinstance(key, tuple):
        return (key[0] + suffix, key[1])
    return key + suffix


def is_piece(value: bytes) -> bool:
    return value[:2] == PIECE


def is_key(key: bytes) -> bool:
    """Whether ``key`` (the bytes of a table key) is a piece's."""
    return key[-10:-8] == _KEY_TAG


def pieces_of(key: Any, value: bytes | None) -> list[Any]:
    """The keys of the pieces the stored ``value`` of ``key`` points to (none for a
    plain value or none)."""
    if value is None or value[:2] != POINTER:
        return []
    generation, count = int.from_bytes(value[2:6], "big"), int.from_bytes(value[6:10], "big")
    return [piece_key(key, generation, i) for i in range(count)]


def write(
    key: Any, value: bytes | None, stored: bytes | None, piece_bytes: int = PIECE_BYTES
) -> list[tuple[Any, bytes | None]]:
    """The entries that replace ``stored`` (the key's stored entry) with ``value``
    (None: delete), in the order to write them (None: delete that key); pieces hold
    ``piece_bytes`` each."""
    old = pieces_of(key, stored)
    if value is None:
        return [(key, None), *((k, None) for k in old)]
    if len(value) <= piece_bytes and value[:1] != b"\xc1":
        return [(key, value), *((k, None) for k in old)]
    generation = (int.from_bytes(stored[2:6], "big") + 1) % (1 << 32) if old and stored else 0
    starts = range(0, len(value), piece_bytes)
    entries: list[tuple[Any, bytes | None]] = [
        (piece_key(key, generation, i), PIECE + value[at : at + piece_bytes])
        for i, at in enumerate(starts)
    ]
    header = generation.to_bytes(4, "big") + len(entries).to_bytes(4, "big")
    entries.append((key, POINTER + header + len(value).to_bytes(8, "big")))
    return entries + [(k, None) for k in old]


def small(value: bytes | None) -> bytes | None:
    """``value``, checked to be one that is stored as it is (no pieces)."""
    if value is not None and (len(value) > PIECE_BYTES or value[:1] == b"\xc1"):
        raise ValueError(f"a value of {len(value)} bytes does not fit one entry")
    return value


def entries(
    items: Iterable[tuple[Any, bytes | None]],
    get: Callable[[Any], bytes | None],
    piece_bytes: int = PIECE_BYTES,
) -> list[tuple[Any, bytes | None]]:
    """The entries that write ``items`` (value, or None: delete) over a store read
    with ``get``, in order: a key written twice replaces what the first write
    stored, not what the store held."""
    out: list[tuple[Any, bytes | None]] = []
    now: dict[Any, bytes | None] = {}
    for key, value in items:
        before = now[key] if key in now else get(key)
        written = write(key, value, before, piece_bytes)
        now[key] = next(v for k, v in reversed(written) if k == key)
        out += written
    return out


def join(key: Any, value: bytes | None, get: Callable[[Any], bytes | None]) -> bytes | None:
    """The whole value stored under ``key`` (its stored entry ``value``), reading its
    pieces with ``get``; None when it is missing or a piece is."""
    keys = pieces_of(key, value)
    if not keys or value is None:
        return value
    parts = []
    for k in keys:
        piece = get(k)
        if piece is None or not is_piece(piece):
            return None
        parts.append(piece[len(PIECE) :])
    whole = b"".join(parts)
    return whole if len(whole) == int.from_bytes(value[10:_HEADER], "big") else None


def whole_items(
    items: Iterator[tuple[Any, bytes]], get: Callable[[Any], bytes | None]
) -> Iterator[tuple[Any, bytes, list[Any]]]:
    """(key, whole value, its pieces' keys) for each value among a store's raw
    ``items``: pieces are read through their pointers, and a value whose pieces are
    incomplete is left out."""
    for key, value in items:
        if is_piece(value):
            continue
        whole = join(key, value, get)
        if whole is not None:
            yield key, whole, pieces_of(key, value)
