"""Durable file writes and chunked reads shared by the writer, ``follow`` and ``export``.

The helpers take the ``os`` module as ``fs`` so that the writer can hand them the
one it calls through, in which tests/unit/output/test_writer.py fails a chosen call to
show that a crash at any file-system call loses and repeats nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Final

CHUNK: Final = 1 << 20


def chunks(fh: IO[bytes], size: int = CHUNK) -> Iterator[bytes]:
    """The rest of ``fh`` in pieces of at most ``size`` bytes."""
    return iter(lambda: fh.read(size), b"")


def fsync_dir(path: Path, *, fs: ModuleType = os) -> None:
    """Make the names in a directory (a rename, a new file) durable."""
    fd = fs.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)


def atomic_write(
    path: Path,
    data: bytes,
    *,
    sync: bool = True,
    sync_dir: bool = True,
    fsync: Callable[[int], None] | None = None,
    fs: ModuleType = os,
) -> None:
    """Replace ``path`` by ``data`` so that a crash leaves the old or the new file.

    Temp file, fsync (with ``sync``, through ``fsync`` when it is timed), rename,
    fsync of the directory (with ``sync_dir``, so the rename itself survives).
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, data, 0, fs=fs)
        if sync:
            (fsync or fs.fsync)(fd)
    finally:
        fs.close(fd)
    commit(tmp, path, sync_dir=sync_dir, fs=fs)


def commit(tmp: Path, path: Path, *, sync_dir: bool = True, fs: ModuleType = os) -> None:
    """Rename a complete, synced temporary file into place (see ``atomic_write``)."""
    fs.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent, fs=fs)


def pwrite_all(fd: int, data: bytes, pos: int, *, fs: ModuleType = os) -> int:
    """Write all of data at pos; return the position after it."""
    view = memoryview(data)
    while view:
        n = fs.pwrite(fd, view, pos)
        pos += n
        view = view[n:]
    return pos


def cut(path: Path, length: int, *, fs: ModuleType = os) -> None:
    """Truncate ``path`` to ``length`` if it is longer: drop a torn or uncommitted tail."""
    if path.exists() and path.stat().st_size > length:
        fs.truncate(path, length)


def sha256_file(path: Path) -> Any:
    """A sha256 hasher fed with the whole file (update it to go on)."""
    hasher = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in chunks(fh):
            hasher.update(chunk)
    return hasher


def append_durably(
    path: Path, data: bytes, *, sync: bool, fsync: Callable[[int], None], fs: ModuleType = os
) -> None:
    """Append data to path; with ``sync`` fsync it (and its directory if it is new)."""
    created = not path.exists()
    with path.open("ab") as out:
        out.write(data)
        out.flush()
        if sync:
            fsync(out.fileno())
    if created and sync:
        fsync_dir(path.parent, fs=fs)
