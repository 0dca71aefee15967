"""The gateway's write-ahead log: what a restarted gateway needs to continue its open
episodes without renumbering or reordering their steps.

One JSON object per line in ``{state_dir}/episodes.wal``:

* ``{"op": "state", "id", "state", "events"}``: an episode's small state
  (``OpenEpisode.state``: next seq, the digest its next delta needs, unanswered
  tool calls, its client, when it was last active, its next batch of agent steps
  and the last one's answer) and the events added to its
  outbox since the last line, appended and fsync'd *before* those events are
  produced, so no event reaches Kafka with a seq the log does not hold;
* ``{"op": "acked", "id"}``: the episode's outbox was acknowledged (not fsync'd:
  losing it only sends those events again, and the worker drops identical copies);
* ``{"op": "closed", "id", "closed"}``: the episode was closed (ended and
  acknowledged, or expired); the gateway remembers it for a while;
* ``{"op": "forgotten", "id"}``: the gateway no longer remembers that closed episode.

The last line may be torn by a crash; it was never fsync'd, so its events were
never produced, and it is skipped. All file work runs on one writer thread, never
on the event loop: it writes what was queued since its last round in one go and
fsyncs once for all of it (group commit), and rewrites the log with the live
state only (a new file, fsync'd, renamed over the old one) at start and whenever
the file is past ``compact_bytes`` and twice the live state, so a rewrite costs
at most the bytes appended since the last one: a call's cost stays flat however
many episodes are open. A call waiting for its fsync waits for a rewrite under
way too, which at the default bounds is a few MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from stream_export.client.recorder import DeltaBase
from stream_export.errors import StartupError
from stream_export.gateway import wire
from stream_export.telemetry import logs

log = logging.getLogger(__name__)

FILE_NAME: Final = "episodes.wal"
COMPACT_BYTES: Final = 64 << 20

Op = Literal["state", "acked", "closed", "forgotten"]


#: A line without a state (``_Line.state``'s default).
_NO_STATE: Final = msgspec.Raw(b"null")


class _Line(msgspec.Struct, omit_defaults=True):
    op: Op
    id: str
    state: msgspec.Raw = _NO_STATE
    events: list[msgspec.Raw] = []
    closed: dict[str, Any] | None = None


_decode_line = msgspec.json.Decoder(_Line).decode
_encode_line = msgspec.json.Encoder().encode


@dataclass
class Logged:
    """What the log holds of one open episode: its state and outbox."""

    state: bytes
    events: list[bytes] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.state) + sum(map(len, self.events))


@dataclass
class Restored:
    """What the log held at start: the open episodes (their state and outbox) and
    the closed episodes remembered, each in the order the log had them."""

    episodes: dict[str, tuple[dict[str, Any], list[bytes]]]
    closed: dict[str, dict[str, Any]]


@dataclass
class _Entry:
    """A line for the writer thread, and the call waiting for its fsync (if any)."""

    line: _Line
    data: bytes
    waiter: asyncio.Future[None] | None = None


class EpisodeLog:
    """The append-only log; its file is the writer thread's alone once open."""

    def __init__(self, state_dir: str | os.PathLike[str], compact_bytes: int = COMPACT_BYTES):
        self.dir = Path(state_dir)
        self.path = self.dir / FILE_NAME
        self.compact_bytes = compact_bytes
        #: The writer thread's view of the file: what a rewrite keeps.
        self._live: dict[str, Logged] = {}
        self._closed: dict[str, bytes] = {}
        #: The bytes of ``_live`` and ``_closed``, and of the file.
        self._live_bytes = 0
        self._size = 0
        self._file: Any = None
        #: A write failed: the file may end in a partial line, so rewrite it first.
        self._damaged = False
        self._queue: list[_Entry] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def open(self) -> Restored:
        """Read the log, rewrite it with the live state and start the writer thread."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for number, line, last in self._lines():
                try:
                    self._apply(_parse(line))
                except (msgspec.DecodeError, msgspec.ValidationError, ValueError, KeyError):
                    logs.event(log, "gateway.wal.skipped", logging.WARNING, line=number, torn=last)
            self._compact()
        except OSError as exc:
            raise StartupError(f"cannot read the gateway's state in {self.dir}: {exc}") from None
        self._thread = threading.Thread(target=self._write_forever, name="gateway-wal", daemon=True)
        self._thread.start()
        return Restored(
            {k: (wire.decode(v.state), list(v.events)) for k, v in self._live.items()},
            {k: wire.decode(v) for k, v in self._closed.items()},
        )

    def _lines(self) -> Iterator[tuple[int, bytes, bool]]:
        """The log's lines one at a time (number, bytes, whether it is the last):
        restoring never holds more than the live state and one line."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as file:
            number, previous = 0, None
            for line in file:
                if previous is not None:
                    yield number, previous, False
                number, previous = number + 1, line
            if previous is not None:
                yield number, previous, True

    async def state(self, episode_id: str, state: dict[str, Any], events: list[bytes]) -> None:
        """Log an episode's state and the events added to its outbox; return once it
        is on disk (OSError when it cannot be): await it before producing them."""
        line = _Line("state", episode_id, msgspec.Raw(wire.encode(state)))
        line.events = [msgspec.Raw(e) for e in events]
        waiter = asyncio.get_running_loop().create_future()
        self._put(_Entry(line, _encode_line(line) + b"\n", waiter))
        await waiter

    def acked(self, episode_id: str) -> None:
        self._put_line(_Line("acked", episode_id))

    def closed(self, episode_id: str, closed: dict[str, Any]) -> None:
        self._put_line(_Line("closed", episode_id, closed=closed))

    def forgotten(self, episode_id: str) -> None:
        self._put_line(_Line("forgotten", episode_id))

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _put_line(self, line: _Line) -> None:
        self._put(_Entry(line, _encode_line(line) + b"\n"))

    def _put(self, entry: _Entry) -> None:
        with self._wake:
            self._queue.append(entry)
            self._wake.notify()

    # --- the writer thread ---------------------------------------------------------

    def _write_forever(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()
                batch, self._queue = self._queue, []
                stopping = self._stopping
            if batch:
                self._write(batch)
            if stopping and not batch:
                return

    def _write(self, batch: list[_Entry]) -> None:
        """Append ``batch``, fsync once if a call waits for it, rewrite when due."""
        failure: OSError | None = None
        try:
            if self._damaged:
                self._compact()
            data = b"".join(e.data for e in batch)
            self._file.write(data)
            self._file.flush()
            if any(e.waiter is not None for e in batch):
                os.fsync(self._file.fileno())
            self._size += len(data)
        except Exception as exc:  # a full disk, or a bug: the calls waiting are told
            failure = exc if isinstance(exc, OSError) else OSError(f"the log failed: {exc!r}")
            self._damaged = True
            logs.event(log, "gateway.wal.failed", logging.ERROR, error=repr(exc))
        else:
            for entry in batch:
                self._apply(entry.line)
        for entry in batch:
            if entry.waiter is not None:
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    entry.waiter.get_loop().call_soon_threadsafe(_settle, entry.waiter, failure)
        if failure is None and self._size > max(self.compact_bytes, 2 * self._live_bytes):
            try:
                self._compact()
            except OSError as exc:
                self._damaged = True
                logs.event(log, "gateway.wal.failed", logging.ERROR, error=repr(exc))

    def _apply(self, line: _Line) -> None:
        """Take ``line`` into the live state, keeping its size."""
        key = line.id
        logged = self._live.get(key)
        if line.op == "state" and line.state != _NO_STATE:
            logged = self._live[key] = logged or Logged(b"")
            self._live_bytes -= logged.size
            logged.state = bytes(line.state)
            logged.events += [bytes(e) for e in line.events]
            self._live_bytes += logged.size
        elif line.op == "acked" and logged is not None:
            self._live_bytes -= logged.size - len(logged.state)
            logged.events = []
        elif line.op == "closed" and line.closed is not None:
            self._live_bytes -= self._live.pop(key).size if logged is not None else 0
            self._forget(key)
            self._closed[key] = wire.encode(line.closed)
            self._live_bytes += len(self._closed[key])
        elif line.op == "forgotten":
            self._forget(key)

    def _forget(self, key: str) -> None:
        self._live_bytes -= len(self._closed.pop(key, b""))

    def _compact(self) -> None:
        """Rewrite the log with the live state only."""
        if self._file is not None:
            self._file.close()
        fresh = self.path.with_suffix(".tmp")
        size = 0
        with open(fresh, "wb") as out:
            for key, logged in self._live.items():
                line = _Line("state", key, msgspec.Raw(logged.state))
                line.events = [msgspec.Raw(e) for e in logged.events]
                size += out.write(_encode_line(line) + b"\n")
            for key, closed in self._closed.items():
                size += out.write(_encode_line(_Line("closed", key, closed=wire.decode(closed))))
                size += out.write(b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(fresh, self.path)
        directory = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open across rounds)
        self._size, self._damaged = size, False


def _settle(waiter: asyncio.Future[None], failure: OSError | None) -> None:
    if waiter.done():  # its call was cancelled meanwhile
        return
    if failure is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(failure)


def _parse(data: bytes) -> _Line:
    """One line; a line of the earlier layout (the whole state, the previous call's
    ids and the outbox in one object) is converted."""
    line = _decode_line(data)
    if line.op != "state" or line.state != _NO_STATE:
        return line
    old = wire.decode(data)
    last = old["last_call"]
    base = None if last is None else DeltaBase.of(last[0], last[1])
    state = {
        "agent_id": old["agent_id"],
        "steps": old["steps"],
        "ended": old["ended"],
        "base": None if base is None else [base.seq, base.length, base.digest.hex()],
        "tools": old["tools"],
        "client": old.get("client", ""),
        "at": time.time(),  # not logged: from now
    }
    line.state = msgspec.Raw(wire.encode(state))
    line.events = [msgspec.Raw(e.encode()) for e in old["outbox"]]
    return line
