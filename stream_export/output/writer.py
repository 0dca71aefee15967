"""Rotating JSONL output with a checkpoint and a manifest: the sink's file I/O.

The Writer orchestrates small parts: the file names and formats (layout.py),
sealing and retention (sealing.py), the episode-id log (dedupe.py), atomic
writes (durable.py) and what it finds on disk at start (recovery.py). It hands
each part the ``os`` module it calls through, so a test can fail any one
file-system call (tests/unit/output/test_writer.py). ``Writer.open`` takes the
output's lock and recovers the files; ``__init__`` only assembles parts.

The checkpoint is the single source of truth. It is replaced atomically (temp,
fsync, rename) only after every buffered line has been written, and it records,
together, the last source offset per Kafka partition and the length of every
active file. Recovery truncates each active file to its checkpointed length, so
the records after it are consumed and written again exactly once.

Sealing is a small write-ahead protocol: (1) compress (or transcode to Parquet)
to a temporary name if asked, (2) checkpoint the seal as *pending* with its
manifest entry and a fresh empty active file, (3) rename into place, (4) append
the manifest entry unless present, (5) checkpoint without the pending seal. A
crash anywhere is finished by ``Sealing.resolve`` on the next start (or the next
retry after a disk error). A new active file is created only after a checkpoint
names it, so a reader that reads up to the checkpointed length (``follow``) never
reads a partial line, an uncommitted line, or the wrong generation of the active
file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from stream_export.contract.calls import WeightVersion
from stream_export.errors import ConfigError, SinkError
from stream_export.output import recovery
from stream_export.output.dedupe import SeenIds, others_ids
from stream_export.output.durable import atomic_write, pwrite_all
from stream_export.output.layout import (
    SAFE_NAME_RE,
    ActiveFile,
    Checkpoint,
    ManifestEntry,
    checkpoint_path,
    folder_for,
    ids_path,
    lock_output,
    read_checkpoint,
    set_aside,
)
from stream_export.output.sealing import Sealing
from stream_export.runtime.metrics import Metrics
from stream_export.settings.sink import SinkSettings

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Reason = Literal["size", "records", "age", "final", "adopted", "topic_reset", "evicted"]


def _error_kind(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "permission"
    return "io"


@contextlib.contextmanager
def _sink_errors(metrics: Metrics, root: Path) -> Iterator[None]:
    """Raise an OSError as SinkError with its kind as the reason, and count it."""
    try:
        yield
    except OSError as exc:
        kind = _error_kind(exc)
        metrics.sink_errors.labels(kind).inc()
        raise SinkError(f"{exc.strerror or exc} ({exc.filename or root})", reason=kind) from exc
    except msgspec.DecodeError as exc:  # a damaged checkpoint or manifest: kept, not read
        metrics.sink_errors.labels("io").inc()
        raise SinkError(f"a file of the output in {root} is damaged: {exc}", reason="io") from exc


class _Open:
    """Runtime state of one active file: checkpointed state plus what is not yet written."""

    __slots__ = ("buf", "fd", "hasher", "state", "written")

    def __init__(self, state: ActiveFile) -> None:
        self.buf: list[bytes] = []
        self.reset(state)

    def reset(self, state: ActiveFile) -> None:
        """Start a new (empty) generation of the active file."""
        self.state = state
        self.fd: int | None = None
        self.written = 0
        self.hasher: Any = hashlib.sha256()


class Writer:
    """Appends formatted lines for one worker; call from one thread at a time.

    ``append`` only buffers (and seals a full file first); ``flush`` writes the
    buffers and the checkpoint; ``tick`` flushes when the interval has passed and
    seals files that reached their age. Every I/O failure is raised as SinkError
    (``reason`` = no_space, permission or io) and leaves the writer able to retry
    the same call later without losing or tearing anything.
    """

    def __init__(
        self,
        settings: SinkSettings,
        *,
        worker_id: str,
        topic: str,
        metrics: Metrics,
        clock: Callable[[], float],
        checkpoint: Checkpoint,
        seen: SeenIds,
        sealing: Sealing,
        lock_fd: int,
    ) -> None:
        """Put the parts together; ``Writer.open`` makes them and recovers the files."""
        self.settings = settings
        self.worker_id = worker_id
        self.topic = topic
        self.metrics = metrics
        self.clock = clock
        self.root = Path(settings.output_dir)
        self.prefix = settings.prefix
        self._max_records = settings.rotate_records or float("inf")
        self._max_bytes = settings.rotate_bytes or float("inf")
        self._sync_flush = settings.fsync == "flush"
        self._sync_seal = settings.fsync != "never"
        self._ckpt = checkpoint
        self._saved = dict(checkpoint.offsets)
        #: The checkpoint's bytes as last saved: an idle flush with nothing new skips
        #: the write and its fsync (every sink.flush_interval_ms, per output).
        self._saved_bytes: bytes | None = None
        #: Active files by folder, least recently written first.
        self._files: OrderedDict[str, _Open] = OrderedDict()
        self._single: _Open | None = None
        self._seen = seen
        self._sealing = sealing
        self._last_flush = clock()
        self._lock_fd = lock_fd

    @classmethod
    def open(
        cls,
        settings: SinkSettings,
        *,
        worker_id: str,
        topic: str,
        metrics: Metrics,
        dedupe_window: int | None = None,
        clock: Callable[[], float] = time.time,
        output: str | None = None,
        columns: pa.Schema | None = None,
    ) -> Writer:
        """Take the output's lock, bring its files back to the checkpoint and return
        a writer ready to append (recorded as serving ``output``, see
        :func:`.layout.checkpointed_offsets`). Raises ConfigError (names, another
        topic's checkpoint, the lock held) or SinkError, and then holds nothing."""
        if not SAFE_NAME_RE.fullmatch(worker_id):
            raise ConfigError(f"worker id {worker_id!r} is not a safe file-name part")
        if not SAFE_NAME_RE.fullmatch(settings.prefix):
            raise ConfigError(f"sink.prefix {settings.prefix!r} is not a safe file-name part")
        root, prefix = Path(settings.output_dir), settings.prefix
        with _sink_errors(metrics, root):
            root.mkdir(parents=True, exist_ok=True)
            moved = set_aside(root, prefix, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock())))
            lock_fd = lock_output(root, prefix, worker_id)
        for old, new in moved:
            metrics.sink_errors.labels("misplaced").inc()
            log.warning("%s is not a file, and the writer keeps one there: renamed %s", old, new)
        try:
            with _sink_errors(metrics, root):
                found = read_checkpoint(root, prefix)
            for old, new in moved:
                if found is not None:
                    found.moved(old, new)
            if found is not None and found.topic != topic:
                raise ConfigError(
                    f"{checkpoint_path(root, prefix)} belongs to topic {found.topic!r}, "
                    f"not {topic!r}; use another sink.output_dir or sink.prefix"
                )
            checkpoint = found or Checkpoint(worker_id=worker_id, topic=topic)
            checkpoint.worker_id, checkpoint.output = worker_id, output
            window = settings.dedupe_window if dedupe_window is None else dedupe_window
            writer = cls(
                settings,
                worker_id=worker_id,
                topic=topic,
                metrics=metrics,
                clock=clock,
                checkpoint=checkpoint,
                seen=SeenIds(ids_path(root, prefix), window),
                sealing=Sealing(root, prefix, worker_id, topic, settings, columns, clock=clock),
                lock_fd=lock_fd,
            )
            writer._io(writer._recover, found is None, bool(moved))
        except Exception:
            os.close(lock_fd)
            raise
        return writer

    # -- public API -------------------------------------------------------------

    @property
    def offsets(self) -> dict[int, int]:
        """Last source offset per Kafka partition covered by the files (incl. buffered)."""
        return dict(self._ckpt.offsets)

    @property
    def checkpointed(self) -> dict[int, int]:
        """Last source offset per Kafka partition in the checkpoint on disk."""
        return self._saved

    @property
    def topic_id(self) -> str | None:
        """The id of the source topic the offsets belong to (None: not known)."""
        return self._ckpt.topic_id

    @property
    def epoch(self) -> int:
        return self._ckpt.epoch

    def bind_topic(self, topic_id: str) -> None:
        """Record the source topic's id once it is known to match the offsets."""
        if self._ckpt.topic_id != topic_id:
            self._ckpt.topic_id = topic_id
            self.flush()

    def new_epoch(self, topic_id: str | None, reason: str) -> None:
        """Seal every active file and start over on a new incarnation of the source
        topic: offsets forgotten, epoch + 1. Episode ids stay remembered, so one
        published again is still written once. A crash in between repeats it on the
        next start (the seals are done by then, so only the epoch moves on)."""
        self.seal_all("topic_reset")
        ckpt = self._ckpt
        ckpt.epoch += 1
        ckpt.topic_id, ckpt.epoch_reason, ckpt.offsets = topic_id, reason, {}
        self.flush()

    def append(
        self,
        episode_id: str,
        lines: list[bytes],
        *,
        partition: int,
        offset: int,
        event_time: float,
        folder: object = None,
        versions: tuple[WeightVersion, WeightVersion] | None = None,
    ) -> bool:
        """Buffer one episode's lines (without newlines); False if it is a repeat.

        The episode goes whole into one file: a file that cannot take it is sealed
        first. A filtered episode (no lines) still advances the offset.
        ``versions``: the weight-version range of its model calls, for the manifest.
        """
        if episode_id in self._seen:
            self.metrics.episodes_repeated.inc()
            self._ckpt.offsets[partition] = offset
            return False
        if lines:
            f = self._single or self._file(folder)
            st = f.state
            n = len(lines)
            size = (len(lines[0]) if n == 1 else sum(map(len, lines))) + n
            if st.records and (
                st.records + n > self._max_records or st.length + size > self._max_bytes
            ):
                self._io(self._seal, f, self._rotation_reason(st, n))
                st = f.state
            if not st.records:
                st.opened = self.clock()
                st.first_time = event_time
            st.records += n
            st.length += size
            st.note(partition, offset, event_time, versions)
            f.buf.extend(lines)
        self._seen.add(episode_id, partition)
        self._ckpt.offsets[partition] = offset
        return True

    def take_over(self, partitions: Collection[int]) -> None:
        """Know the ids the other writers of this output in the directory wrote to
        ``partitions`` (:func:`.dedupe.others_ids`), before writing them."""
        with _sink_errors(self.metrics, self.root):
            self._seen.others = others_ids(
                self.root, self.topic, self._ckpt.output, self.prefix, self._seen.window, partitions
            )

    def skip(self, partition: int, offset: int) -> None:
        """Mark a source record as done without output (dead-lettered, undecodable)."""
        self._ckpt.offsets[partition] = offset

    def flush(self) -> None:
        """Write everything buffered, then the checkpoint."""
        self._io(self._flush)

    def tick(self) -> None:
        """Flush when the interval has passed; seal files that reached their age."""
        now = self.clock()
        if (now - self._last_flush) * 1000 >= self.settings.flush_interval_ms:
            self.flush()
        age = self.settings.rotate_age_s
        if age > 0:
            for folder, f in list(self._files.items()):
                if f.state.records and now - f.state.opened >= age:
                    if self._partitioned:
                        self._io(self._retire, [folder], "age")
                    else:
                        self._io(self._seal, f, "age")

    def seal_all(self, reason: Reason = "final") -> None:
        """Seal every non-empty active file (e.g. at the end of an export)."""
        self.flush()
        for f in list(self._files.values()):
            if f.state.records:
                self._io(self._seal, f, reason)

    def close(self) -> None:
        """Flush and release the files (the active files stay for the next start)."""
        with contextlib.suppress(SinkError):
            self.flush()
        for f in self._files.values():
            self._close_fd(f)
        self._seen.close(fs=os)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def sealed(self) -> list[ManifestEntry]:
        """Manifest entries of the sealed files still on disk, oldest first."""
        return [e for _, e in self._sealing.manifested]

    # -- start and recovery -------------------------------------------------------

    def _recover(self, fresh: bool, moved: bool) -> None:
        """Finish an interrupted seal, cut the active files and the ids to the
        checkpoint; with no checkpoint yet (``fresh``), adopt what is there. A
        checkpoint that names a folder set aside (``moved``) is saved first."""
        # The ids first: finishing a seal saves the checkpoint, which names the ids'
        # length as loaded (before the load: none, and the ids were cut to nothing).
        self._seen.load(self._ckpt.ids_length, fs=os)
        if moved and not fresh:
            self._save_checkpoint(durable=True)
        self._sealing.load_manifest(fs=os)
        self._resolve_pending()
        recovery.remove_interrupted_compressions(self.root, self.prefix)
        for folder, state in self._ckpt.active.items():
            self._files[folder] = self._recover_active(state)
        self._make_room(0)
        if fresh:
            self._adopt()
            # From now on an active file without a checkpoint is never ours.
            self._save_checkpoint()

    def _adopt(self) -> None:
        """Seal an active file that has no checkpoint as it is, instead of overwriting it."""
        state = recovery.unclaimed_active_file(self.root, self.prefix, self._ckpt.next_seq)
        if state is None:
            return
        self._ckpt.next_seq += 1
        self._ckpt.active[""] = state
        f = self._files[""] = self._recover_active(state)
        log.warning("%s has no checkpoint: sealing it as it is", self.root / state.path)
        self._seal(f, "adopted")

    def _recover_active(self, state: ActiveFile) -> _Open:
        f = _Open(state)
        hasher = recovery.cut_to_checkpoint(self.root / state.path, state, self.metrics)
        if hasher is not None:
            f.hasher = hasher
        f.written = state.length
        return f

    # -- writing ------------------------------------------------------------------

    def _io(self, fn: Callable[..., None], *args: Any) -> None:
        with _sink_errors(self.metrics, self.root):
            fn(*args)

    @property
    def _partitioned(self) -> bool:
        return self.settings.partition_by is not None

    def _file(self, value: object) -> _Open:
        """The active file of ``value``'s folder, now the most recently written."""
        folder = self._folder(value) if self._partitioned else ""
        f = self._files.get(folder)
        if f is not None:
            self._files.move_to_end(folder)
            return f
        self._io(self._make_room, 1)
        path = f"{folder}/{self.prefix}.jsonl" if folder else f"{self.prefix}.jsonl"
        state = ActiveFile(seq=self._ckpt.next_seq, path=path)
        self._ckpt.next_seq += 1
        self._ckpt.active[folder] = state
        f = self._files[folder] = _Open(state)
        if not folder:
            self._single = f  # the only file without partition_by: skip the lookup
        return f

    def _folder(self, value: object) -> str:
        assert self.settings.partition_by is not None
        folder, rejected = folder_for(self.settings.partition_by, value)
        if rejected:
            self.metrics.paths_rejected.inc()
        return folder

    def _make_room(self, new: int) -> None:
        """With partition_by, retire the least recently written active files until
        ``new`` more fit within sink.max_active_files (an eighth of it at once, so
        that their seals share the checkpoint and manifest writes): the checkpoint
        stays bounded."""
        bound = self.settings.max_active_files
        if self._partitioned and len(self._files) + new > bound:
            keep = max(0, bound - new - bound // 8)
            self._retire(list(self._files)[: len(self._files) - keep], "evicted")

    def _retire(self, folders: list[str], reason: Reason) -> None:
        """Seal partition folders' active files (those with records) and forget
        them: the next record for a folder starts a new one."""
        files = [self._files[folder] for folder in folders]
        if sealed := [f for f in files if f.state.records]:
            self._seal_many(sealed, reason)
        for folder, f in zip(folders, files, strict=True):
            self._close_fd(f)
            del self._files[folder]
            del self._ckpt.active[folder]

    def _rotation_reason(self, st: ActiveFile, n: int) -> Reason:
        return "records" if st.records + n > self._max_records else "size"

    def _flush(self) -> None:
        self._resolve_pending()
        started = time.perf_counter()
        records = written = 0
        for f in self._files.values():
            if f.buf:
                records += len(f.buf)
                written += self._write(f)
        self._seen.write(fs=os)
        if written:
            self.metrics.write_seconds.observe(time.perf_counter() - started)
            self.metrics.records_written.inc(records)
            self.metrics.bytes_written.inc(written)
            self.metrics.last_write_timestamp_seconds.set(self.clock())
            if self._sync_flush:  # the files, and the ids the checkpoint names
                for fd in (*(f.fd for f in self._files.values()), self._seen.fd):
                    if fd is not None:
                        self._fsync(fd)
        self._save_checkpoint()
        if self._seen.compact(fsync=self._fsync, fs=os):
            self._save_checkpoint()
        self._last_flush = self.clock()

    def _write(self, f: _Open) -> int:
        """Write f's buffer at its good length (overwriting the rest of a failed try)."""
        path = self.root / f.state.path
        if f.fd is None:
            self._close_least_recent(self.settings.max_open_files - 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            f.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        if os.fstat(f.fd).st_size != f.written:
            os.ftruncate(f.fd, f.written)
        f.buf.append(b"")  # join then ends with a newline, without another copy
        data = b"\n".join(f.buf)
        f.buf.pop()
        start = f.written
        f.written = pwrite_all(f.fd, data, start, fs=os)
        if self._sync_seal and not self._sync_flush:
            # Start writing back now (as PostgreSQL's flush_after does), so the
            # fsync at rotation finds little left to do instead of stalling.
            os.posix_fadvise(f.fd, start, len(data), os.POSIX_FADV_DONTNEED)
        f.hasher.update(data)
        f.buf.clear()
        return len(data)

    def _fsync(self, fd: int) -> None:
        started = time.perf_counter()
        os.fsync(fd)
        self.metrics.fsync_seconds.observe(time.perf_counter() - started)

    def _save_checkpoint(self, *, durable: bool = False) -> None:
        self._ckpt.ids_length = self._seen.length
        encoded = msgspec.json.encode(self._ckpt)
        if encoded == self._saved_bytes and not durable:
            return
        path = checkpoint_path(self.root, self.prefix)
        atomic_write(
            path,
            encoded,
            sync=self._sync_seal,
            sync_dir=durable and self._sync_seal,
            fsync=self._fsync,
            fs=os,
        )
        self._saved = dict(self._ckpt.offsets)
        self._saved_bytes = encoded

    def _close_fd(self, f: _Open) -> None:
        if f.fd is not None:
            os.close(f.fd)
            f.fd = None

    def _close_least_recent(self, keep: int) -> None:
        """Close active files, least recently written first, until at most ``keep``
        are open (sink.max_open_files): they are opened again when written to."""
        open_files = [f for f in self._files.values() if f.fd is not None]
        for f in open_files[: max(0, len(open_files) - keep)]:
            assert f.fd is not None
            if self._sync_flush:  # this flush's fsync goes through the open files only
                self._fsync(f.fd)
            self._close_fd(f)

    def _sync_file(self, f: _Open) -> None:
        """fsync f's file, through a descriptor of its own if it was closed."""
        if f.fd is not None:
            self._fsync(f.fd)
        elif f.written:
            fd = os.open(self.root / f.state.path, os.O_RDONLY)
            try:
                self._fsync(fd)
            finally:
                os.close(fd)

    # -- sealing ------------------------------------------------------------------

    def _seal(self, f: _Open, reason: Reason) -> None:
        self._seal_many([f], reason)

    def _seal_many(self, files: list[_Open], reason: Reason) -> None:
        """Seal the files through the write-ahead protocol of the module docstring,
        together: one checkpoint names every seal, one manifest write lists them."""
        self._flush()
        for f in files:
            if self._sync_seal:
                self._sync_file(f)
            self._close_fd(f)
            f.reset(self._sealing.pend(self._ckpt, f.state, f.hasher, reason, fsync=self._fsync))
        self._resolve_pending()
        self.metrics.files_rotated.labels(reason).inc(len(files))
        self._sealing.retain()

    def _resolve_pending(self) -> None:
        self._sealing.resolve(self._ckpt, save=self._save_checkpoint, fsync=self._fsync, fs=os)
