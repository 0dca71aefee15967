"""The writer's memory of recent record ids, so a record published twice is
written once, also across restarts and when its partition moved to another
writer of the same output in the directory.

The ids file ``.<prefix>.ids`` holds one line per flush, the ids in the order
written with the source partition of each: ``{"ids": [...], "partitions": [...]}``
(a line that is a bare array of ids is from a version that did not record
partitions: theirs are unknown). The checkpoint names its good length
(``Checkpoint.ids_length``), and a longer file is cut back to it on load. Once
the checkpoint names more than twice the window, the file is rewritten with just
the window and checkpointed again; as every id in it was checkpointed before, a
crash in between leaves a file that holds only written ids, which is all
recovery needs.

Another writer's file is read (``recent_ids``) up to the length its checkpoint
names, while that writer may still be appending or compacting: only complete
lines are used, and only the ids of the partitions taken over, which that
writer no longer writes (it flushed and checkpointed them when they were revoked,
or died), so whatever it does meanwhile concerns other ids. The I/O methods take
the ``os`` module as ``fs`` (see durable.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from types import ModuleType
from typing import Final

import msgspec

from stream_export.output.durable import atomic_write, cut, pwrite_all
from stream_export.output.layout import ids_path, shared_checkpoints

log = logging.getLogger(__name__)

#: The partition of an id logged before partitions were recorded.
UNKNOWN: Final = -1


class Line(msgspec.Struct):
    """One line of the ids file: ids in the order written, the partition of each."""

    ids: list[str]
    partitions: list[int]


_decode = msgspec.json.Decoder(list[str] | Line).decode
_encode = msgspec.json.Encoder().encode


def _entries(line: bytes) -> Iterable[tuple[str, int]]:
    decoded = _decode(line)
    if isinstance(decoded, list):
        return ((i, UNKNOWN) for i in decoded)
    if len(decoded.ids) != len(decoded.partitions):
        raise msgspec.ValidationError("ids and partitions differ in length")
    return zip(decoded.ids, decoded.partitions, strict=True)


def _complete(path: Path, length: int) -> bytes:
    """The file's complete lines within its first ``length`` bytes."""
    try:
        with path.open("rb") as fh:
            data = fh.read(length)
    except FileNotFoundError:
        return b""
    return data[: data.rfind(b"\n") + 1]


def recent_ids(path: Path, length: int, window: int, partitions: Collection[int]) -> set[str]:
    """The ids among the last ``window`` in another writer's file (read up to the
    ``length`` its checkpoint names) that it wrote to ``partitions`` (or to a
    partition it did not record). A line torn by that writer's concurrent
    compaction is skipped."""
    entries: deque[tuple[str, int]] = deque(maxlen=window)
    for line in _complete(path, length).splitlines():
        try:
            entries.extend(_entries(line))
        except msgspec.DecodeError:
            log.warning("%s: skipped a line being rewritten while it was read", path)
    return {i for i, p in entries if p in partitions or p == UNKNOWN}


def others_ids(
    root: Path,
    topic: str,
    output: str | None,
    prefix: str,
    window: int,
    partitions: Collection[int],
) -> frozenset[str]:
    """The ids that the other writers in ``root`` of ``output`` for ``topic`` wrote
    to ``partitions``, among the last ``window`` each wrote: what the writer of
    ``prefix`` must know when it takes these partitions over, so that a record
    published again after its partition moved (a killed worker's assembler
    publishes its last episodes again) is still written once. Only writers of
    strictly the same output count: a sibling output's ids name other records."""
    ids: set[str] = set()
    if window:
        for other, ckpt in shared_checkpoints(root, topic):
            if other != prefix and ckpt.output == output:
                ids |= recent_ids(ids_path(root, other), ckpt.ids_length, window, partitions)
    return frozenset(ids)


class SeenIds:
    """The last ``window`` ids written here (0: remember none), and the ids other
    writers of the output wrote to the partitions this one took over from them."""

    def __init__(self, path: Path, window: int) -> None:
        self.path = path
        self.window = window
        #: The window: id -> its partition, and the ids oldest first.
        self._ids: dict[str, int] = {}
        self._order: deque[str] = deque(maxlen=window or None)
        #: Other writers' ids of the partitions held (``others_ids``), set on assignment.
        self.others: frozenset[str] = frozenset()
        #: Ids added since the last write (and their partitions): the next line.
        self._new: list[str] = []
        self._new_partitions: list[int] = []
        #: How many ids the file holds.
        self._count = 0
        self.fd: int | None = None
        #: Good length of the file: what the next checkpoint names.
        self.length = 0

    def __contains__(self, record_id: str) -> bool:
        return record_id in self._ids or record_id in self.others

    def add(self, record_id: str, partition: int) -> None:
        if not self.window:
            return
        if len(self._order) == self.window:
            self._ids.pop(self._order[0], None)
        self._order.append(record_id)
        self._ids[record_id] = partition
        self._new.append(record_id)
        self._new_partitions.append(partition)

    def load(self, length: int, *, fs: ModuleType) -> None:
        """Read the file up to the checkpointed ``length`` and cut off the rest."""
        data = _complete(self.path, length)
        cut(self.path, len(data), fs=fs)
        entries = [e for line in data.splitlines() for e in _entries(line)]
        self._count = len(entries)
        self.length = len(data)
        if self.window:
            for record_id, partition in entries[-self.window :]:
                self._order.append(record_id)
                self._ids[record_id] = partition

    def write(self, *, fs: ModuleType) -> None:
        """Append the ids added since the last write as one line."""
        if not self._new:
            return
        if self.fd is None:
            self.fd = fs.open(self.path, fs.O_WRONLY | fs.O_CREAT, 0o644)
        if fs.fstat(self.fd).st_size != self.length:
            fs.ftruncate(self.fd, self.length)
        line = _encode(Line(self._new, self._new_partitions)) + b"\n"
        self.length = pwrite_all(self.fd, line, self.length, fs=fs)
        self._count += len(self._new)
        self._new, self._new_partitions = [], []

    def compact(self, *, fsync: Callable[[int], None], fs: ModuleType) -> bool:
        """Rewrite the file with just the window once it holds more than twice as
        many ids; call only when the checkpoint names the whole file. True if it
        did: the checkpoint must then name the new length."""
        if self._new or self._count <= 2 * self.window:
            return False
        ids = list(self._order)
        data = _encode(Line(ids, [self._ids.get(i, UNKNOWN) for i in ids])) + b"\n"
        atomic_write(self.path, data, sync_dir=False, fsync=fsync, fs=fs)
        self.close(fs=fs)
        self._count = len(ids)
        self.length = len(data)
        return True

    def close(self, *, fs: ModuleType) -> None:
        if self.fd is not None:
            fs.close(self.fd)
            self.fd = None
