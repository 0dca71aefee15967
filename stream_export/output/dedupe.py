"""The writer's memory of recent episode ids, so an episode published twice is
written once, also across restarts.

The ids file ``.<prefix>.ids`` holds one JSON array of ids per flush; the
checkpoint names its good length (``Checkpoint.ids_length``), and a longer file
is cut back to it on load. Once the checkpoint names more than twice the window,
the file is rewritten with just the window and checkpointed again; as every id
in it was checkpointed before, a crash in between leaves a file that holds only
written ids, which is all recovery needs. The I/O methods take the ``os`` module
as ``fs`` (see durable.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import msgspec

from stream_export.output.durable import atomic_write, cut, pwrite_all


class SeenIds:
    """The last ``window`` episode ids (0: remember none)."""

    def __init__(self, path: Path, window: int) -> None:
        self.path = path
        self.window = window
        self._ids: set[str] = set()
        self._order: deque[str] = deque(maxlen=window or None)
        #: Ids added since the last write; each write appends them as one line.
        self._buf: list[str] = []
        self._count = 0
        self.fd: int | None = None
        #: Good length of the file: what the next checkpoint names.
        self.length = 0

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._ids

    def add(self, episode_id: str) -> None:
        if not self.window:
            return
        if len(self._order) == self.window:
            self._ids.discard(self._order[0])
        self._order.append(episode_id)
        self._ids.add(episode_id)
        self._buf.append(episode_id)

    def load(self, length: int, *, fs: ModuleType) -> None:
        """Read the file up to the checkpointed ``length`` and cut off the rest."""
        data = self.path.read_bytes()[:length] if self.path.exists() else b""
        cut(self.path, len(data), fs=fs)
        ids = [
            i for line in data.split(b"\n")[:-1] for i in msgspec.json.decode(line, type=list[str])
        ]
        self._count = len(ids)
        self.length = len(data)
        if self.window:
            self._order.extend(ids[-self.window :])
            self._ids.update(self._order)

    def write(self, *, fs: ModuleType) -> None:
        """Append the ids added since the last write as one line."""
        if not self._buf:
            return
        if self.fd is None:
            self.fd = fs.open(self.path, fs.O_WRONLY | fs.O_CREAT, 0o644)
        if fs.fstat(self.fd).st_size != self.length:
            fs.ftruncate(self.fd, self.length)
        data = msgspec.json.encode(self._buf) + b"\n"
        self.length = pwrite_all(self.fd, data, self.length, fs=fs)
        self._count += len(self._buf)
        self._buf.clear()

    def compact(self, *, fsync: Callable[[int], None], fs: ModuleType) -> bool:
        """Rewrite the file with just the window once it holds more than twice as
        many ids; call only when the checkpoint names the whole file. True if it
        did: the checkpoint must then name the new length."""
        if self._buf or self._count <= 2 * self.window:
            return False
        data = msgspec.json.encode(list(self._order)) + b"\n"
        atomic_write(self.path, data, sync_dir=False, fsync=fsync, fs=fs)
        self.close(fs=fs)
        self._count = len(self._order)
        self.length = len(data)
        return True

    def close(self, *, fs: ModuleType) -> None:
        if self.fd is not None:
            fs.close(self.fd)
            self.fd = None
