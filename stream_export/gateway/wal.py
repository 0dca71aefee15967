"""The gateway's write-ahead log: what a restarted gateway needs to continue its open
episodes without renumbering or reordering their steps.

One JSON object per line in ``{state_dir}/episodes.wal``:

* ``{"op": "state", ...}``: an episode's whole state (``OpenEpisode.state``: next
  seq, the last call's prompt + completion ids, unanswered tool calls, the events
  not acknowledged yet), appended and fsync'd *before* those events are produced,
  so no event reaches Kafka with a seq the log does not hold;
* ``{"op": "acked", "id"}``: the outbox of the episode's last state was acknowledged
  (not fsync'd: losing it only sends those events again, and the worker ignores
  identical copies);
* ``{"op": "closed", "id"}``: the episode's end was acknowledged; it is forgotten.

The last line may be torn by a crash; it was never fsync'd, so its events were
never produced, and it is skipped. The log is rewritten with the open episodes
only (a new file, fsync'd, renamed over the old one) at start and whenever it
grows past ``compact_bytes``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any, Final

from stream_export.errors import StartupError
from stream_export.gateway import wire
from stream_export.runtime import logs

log = logging.getLogger(__name__)

FILE_NAME: Final = "episodes.wal"
COMPACT_BYTES: Final = 64 << 20


class EpisodeLog:
    """The append-only log, written on the event loop; only fsyncs run in a thread."""

    def __init__(self, state_dir: str | os.PathLike[str], compact_bytes: int = COMPACT_BYTES):
        self.dir = Path(state_dir)
        self.path = self.dir / FILE_NAME
        self.compact_bytes = compact_bytes
        self._lock = threading.Lock()
        #: Lines written, lines an fsync covered, and the fsync under way.
        self._written = 0
        self._synced = 0
        self._fsync: asyncio.Future[None] | None = None
        self._file: Any = None
        #: The newest state of each episode not closed (what a compaction keeps).
        self._live: dict[str, dict[str, Any]] = {}

    def open(self) -> dict[str, dict[str, Any]]:
        """Read the log and compact it: the state of every episode not closed, by id."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            lines = self.path.read_bytes().splitlines() if self.path.exists() else []
        except OSError as exc:
            raise StartupError(f"cannot read the gateway's state in {self.dir}: {exc}") from None
        for number, line in enumerate(lines, 1):
            try:
                self._apply(wire.decode(line))
            except (ValueError, KeyError, TypeError):
                logs.event(
                    log,
                    "gateway.wal.skipped",
                    logging.WARNING,
                    line=number,
                    torn=number == len(lines),
                )
        self._compact()
        return {key: dict(state) for key, state in self._live.items()}

    async def state(self, state: dict[str, Any]) -> None:
        """Log an episode's state and return once it is on disk: await it before
        producing the episode's outbox. Group commit: an fsync runs in a thread,
        without the lock (``acked`` on the event loop never waits on the disk), and
        covers every line written before it began; calls that come meanwhile share
        the next one."""
        self._append({"op": "state", **state})
        line = self._written
        while self._synced < line:
            fsync = self._fsync
            if fsync is None or fsync.done():
                fsync = self._fsync = asyncio.ensure_future(asyncio.to_thread(self._sync))
            await asyncio.shield(fsync)

    def _sync(self) -> None:
        """fsync every line written so far (in a thread)."""
        with self._lock:
            upto = self._written
            fd = os.dup(self._file.fileno())  # a compaction may close the file meanwhile
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._synced = max(self._synced, upto)

    def acked(self, episode_id: str) -> None:
        self._append({"op": "acked", "id": episode_id})

    def closed(self, episode_id: str) -> None:
        self._append({"op": "closed", "id": episode_id})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _apply(self, record: dict[str, Any]) -> None:
        op, key = record["op"], record["id"]
        if op == "state":
            self._live[key] = {k: v for k, v in record.items() if k != "op"}
        elif op == "acked" and key in self._live:
            self._live[key]["outbox"] = []
        elif op == "closed":
            self._live.pop(key, None)

    def _append(self, record: dict[str, Any]) -> None:
        line = wire.encode(record) + b"\n"
        with self._lock:
            self._apply(record)
            self._file.write(line)
            self._file.flush()
            self._written += 1
            if self._file.tell() > self.compact_bytes:
                self._compact()

    def _compact(self) -> None:
        """Rewrite the log with the live states only (called with the lock held)."""
        if self._file is not None:
            self._file.close()
        fresh = self.path.with_suffix(".tmp")
        with open(fresh, "wb") as out:
            for state in self._live.values():
                out.write(wire.encode({"op": "state", **state}))
                out.write(b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(fresh, self.path)
        directory = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open across calls)
        self._synced = self._written  # the fresh file holds every live state, fsync'd
