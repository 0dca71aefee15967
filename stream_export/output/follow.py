"""Follow the sink's output: every record once, across rotations, resumable.

Reads sealed files in manifest order, then each active file up to the length
named in the writer's checkpoint, so it never yields a partial line nor a line a
crashed writer will truncate and write again. The position (manifest lines done
and bytes read in files not yet in the manifest, by file sequence number) can be
saved and passed back to continue where a previous reader stopped.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import msgspec

from stream_export.errors import StartupError
from stream_export.output import parquet
from stream_export.output.durable import CHUNK, atomic_write
from stream_export.output.layout import (
    Checkpoint,
    ManifestEntry,
    manifest_lines,
    open_sealed,
    read_checkpoint,
    read_manifest,
)

log = logging.getLogger(__name__)


class Position(msgspec.Struct, kw_only=True):
    """Where a follower is: ``sealed`` manifest entries read, and ``partial`` bytes
    and ``records`` read of files (by sequence number) that are not in the manifest
    yet or were being read when it stopped (a file sealed as Parquet is taken up
    again by its records: its bytes are not the JSON lines')."""

    sealed: int = 0
    partial: dict[int, int] = {}
    records: dict[int, int] = {}

    def copy(self) -> Position:
        return Position(sealed=self.sealed, partial=dict(self.partial), records=dict(self.records))

    def read(self, seq: int, end: int) -> None:
        """One more record of file ``seq`` read, up to byte ``end``."""
        self.partial[seq] = end
        self.records[seq] = self.records.get(seq, 0) + 1

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically and durably, so a crash leaves the previous position."""
        atomic_write(Path(path), msgspec.json.encode(self))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Position:
        """The saved position, or the start when there is none."""
        try:
            return msgspec.json.decode(Path(path).read_bytes(), type=cls)
        except FileNotFoundError:
            return cls()


def lines(fh: IO[bytes], start: int = 0, limit: int | None = None) -> Iterator[tuple[bytes, int]]:
    """Complete lines (without newline) from byte ``start`` up to ``limit``, each with
    the byte position after it; a trailing partial line is held back."""
    fh.seek(start)
    pos, rest = start, b""
    while True:
        want = CHUNK if limit is None else min(CHUNK, limit - pos - len(rest))
        chunk = fh.read(want) if want > 0 else b""
        if not chunk:
            return
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        if not cut:
            rest = data
            continue
        for line in data[: cut - 1].split(b"\n"):
            pos += len(line) + 1
            yield line, pos
        rest = data[cut:]


class Follower:
    """Iterate over the records in ``root`` written under ``prefix``.

    ``position`` is always the position after the last yielded record. With
    ``wait`` the iterator polls for new records forever (until ``stop()`` is true);
    without it, it ends when it has caught up.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        prefix: str = "training-data",
        position: Position | None = None,
        *,
        wait: bool = True,
        poll_s: float = 0.2,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.root = Path(root)
        self.prefix = prefix
        self.position = position.copy() if position else Position()
        self.wait = wait
        self.poll_s = poll_s
        self.stop = stop

    def __iter__(self) -> Iterator[bytes]:
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[Iterator[bytes]]:
        """One ``available()`` per poll; consume each fully before the next."""
        while not self.stop():
            yield self.available()
            if not self.wait:
                return
            time.sleep(self.poll_s)

    def available(self) -> Iterator[bytes]:
        """Every record written so far that has not been yielded yet."""
        pos = self.position
        while True:
            for entry in read_manifest(self.root, self.prefix, start=pos.sealed):
                yield from self._sealed(entry)
                pos.sealed += 1
                pos.partial.pop(entry.seq, None)
                pos.records.pop(entry.seq, None)
            ckpt = read_checkpoint(self.root, self.prefix)
            if ckpt is None:
                return
            if manifest_lines(self.root, self.prefix) != pos.sealed:
                continue  # a seal finished since the manifest was read
            # Sealed files come first: while a seal is under way (or was cut short
            # by a crash, until the writer restarts) the active files wait.
            if not ckpt.pending:
                yield from self._active(ckpt)
            return

    def _sealed(self, entry: ManifestEntry) -> Iterator[bytes]:
        path = self.root / entry.name
        try:
            if entry.encoding == "parquet":
                rows = parquet.lines(path)
            else:
                fh = open_sealed(path)
        except FileNotFoundError:
            log.warning("follow: %s is gone (retention); skipped", path)
            return
        if entry.encoding == "parquet":
            done = self.position.records.get(entry.seq, 0)
            for line in itertools.islice(rows, done, None):
                self.position.read(entry.seq, 0)
                yield line
            return
        with fh:
            for line, end in lines(fh, self.position.partial.get(entry.seq, 0)):
                self.position.read(entry.seq, end)
                yield line

    def _active(self, ckpt: Checkpoint) -> Iterator[bytes]:
        for folder, state in ckpt.active.items():
            start = self.position.partial.get(state.seq, 0)
            if state.length <= start:
                continue
            try:
                fh = (self.root / state.path).open("rb")
            except FileNotFoundError:
                continue
            with fh:
                # The file at this path is the checkpointed generation only if the
                # checkpoint still names it now that it is open (see writer.py).
                again = read_checkpoint(self.root, self.prefix)
                now = again.active.get(folder) if again else None
                if now is None or now.seq != state.seq:
                    continue
                for line, end in lines(fh, start, state.length):
                    self.position.read(state.seq, end)
                    yield line


def main(root: str, prefix: str, position_file: str | None, *, wait: bool) -> int:
    """``stream-export follow``: records to stdout, position saved after each batch."""
    if not Path(root).is_dir():
        raise StartupError(
            f"{root} is not a directory (follow reads a sink.output_dir)", reason="output_dir"
        )
    follower = Follower(
        root, prefix, Position.load(position_file) if position_file else None, wait=wait
    )
    out = sys.stdout.buffer
    try:
        for batch in follower.batches():
            for line in batch:
                out.write(line + b"\n")
            out.flush()
            if position_file:
                follower.position.save(position_file)
    except BrokenPipeError:
        pass
    return 0
