"""Sealing the active files: compression, the write-ahead log in the checkpoint,
the manifest and retention (the protocol is described in writer.py).

The I/O methods take the ``os`` module as ``fs`` (see durable.py).
"""

from __future__ import annotations

import gzip
import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, cast

import msgspec

from stream_export.errors import ConfigError
from stream_export.output import parquet
from stream_export.output.durable import append_durably, chunks, fsync_dir, sha256_file
from stream_export.output.layout import (
    PARQUET,
    SUFFIX,
    ActiveFile,
    Checkpoint,
    ManifestEntry,
    PendingSeal,
    manifest_path,
    read_manifest,
    uploaded,
    zstd_module,
)
from stream_export.settings.sink import SinkSettings

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Fsync = Callable[[int], None]


class Sealing:
    """The sealed files of one writer: what the manifest names, and what is still on disk."""

    def __init__(
        self,
        root: Path,
        prefix: str,
        worker_id: str,
        topic: str,
        settings: SinkSettings,
        columns: pa.Schema | None,
        *,
        clock: Callable[[], float],
    ) -> None:
        """``columns``: the output's schema, which Parquet files need."""
        if settings.compression == "zstd":
            zstd_module()
        if settings.encoding == "parquet" and columns is None:
            raise ConfigError(
                f"sink.encoding=parquet needs a typed output: {prefix!r} has no schema (the "
                "episode format, a custom formatter, or metadata fields of the agents' own)"
            )
        self.root, self.prefix, self.worker_id, self.topic = root, prefix, worker_id, topic
        self.settings, self.columns, self.clock = settings, columns, clock
        self.sync = settings.fsync != "never"
        #: Names in the manifest (each is appended once).
        self.names: set[str] = set()
        #: Manifested files still on disk, oldest first, with their manifest line
        #: numbers: what retention deletes (with upload on, only lines the uploader
        #: has done: it uploads in manifest order).
        self.manifested: list[tuple[int, ManifestEntry]] = []
        #: Lines in the manifest.
        self.lines = 0

    def load_manifest(self, *, fs: ModuleType) -> None:
        """Read the manifest, cutting off a torn last line."""
        path = manifest_path(self.root, self.prefix)
        if path.exists():
            data = path.read_bytes()
            good = data.rfind(b"\n") + 1
            if good < len(data):
                fs.truncate(path, good)
        entries = read_manifest(self.root, self.prefix)
        self.names = {e.name for e in entries}
        self.lines = len(entries)
        self.manifested = [(n, e) for n, e in enumerate(entries) if (self.root / e.name).exists()]

    def sealed_name(self, st: ActiveFile) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(st.opened))
        name = f"{self.prefix}-{stamp}-{st.seq:08d}-{self.worker_id}"
        if self.settings.encoding == "parquet":
            name += PARQUET
        else:
            name += ".jsonl" + SUFFIX[self.settings.compression]
        folder = st.path.rpartition("/")[0]
        return f"{folder}/{name}" if folder else name

    def pend(
        self, ckpt: Checkpoint, st: ActiveFile, hasher: Any, reason: str, *, fsync: Fsync
    ) -> ActiveFile:
        """Steps 1 and 2 of a seal (compress; name it pending in ``ckpt``, not yet
        saved); return the fresh active file that takes st's place."""
        dst = self.sealed_name(st)
        parquet = self.settings.encoding == "parquet"
        if not parquet and self.settings.compression == "none":
            digest, size = hasher.hexdigest(), st.length
        else:
            digest, size = self._compress(self.root / st.path, self.root / (dst + ".tmp"), fsync)
        entry = ManifestEntry(
            name=dst,
            seq=st.seq,
            worker_id=self.worker_id,
            topic=self.topic,
            records=st.records,
            bytes=size,
            sha256=digest,
            compression=self.settings.parquet_compression if parquet else self.settings.compression,
            encoding=self.settings.encoding,
            first_event_time=st.first_time,
            last_event_time=st.last_time,
            offsets=st.ranges,
            sealed_at=self.clock(),
            reason=reason,
            epoch=ckpt.epoch,
            topic_id=ckpt.topic_id,
            weight_version_min=st.weight_version_min,
            weight_version_max=st.weight_version_max,
        )
        ckpt.pending.append(PendingSeal(src=st.path, dst=dst, length=st.length, entry=entry))
        fresh = ActiveFile(seq=ckpt.next_seq, path=st.path)
        ckpt.next_seq += 1
        ckpt.active[st.path.rpartition("/")[0]] = fresh
        return fresh

    def _compress(self, src: Path, tmp: Path, fsync: Fsync) -> tuple[str, int]:
        """Compress (or transcode to Parquet) src into tmp (synced); return the
        sha256 and size of tmp."""
        with src.open("rb") as inp, tmp.open("wb") as raw:
            if self.columns is not None and self.settings.encoding == "parquet":
                parquet.transcode(src, raw, self.columns, self.settings.parquet_compression)
            else:
                with self._compressor(raw) as z:
                    for chunk in chunks(inp):
                        z.write(chunk)
            raw.flush()
            if self.sync:
                fsync(raw.fileno())
        return sha256_file(tmp).hexdigest(), tmp.stat().st_size

    def _compressor(self, raw: IO[bytes]) -> IO[bytes]:
        if self.settings.compression == "gzip":
            return cast(IO[bytes], gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0))
        return zstd_module().ZstdCompressor().stream_writer(raw, closefd=False)  # type: ignore[no-any-return]

    def resolve(
        self, ckpt: Checkpoint, *, save: Callable[..., None], fsync: Fsync, fs: ModuleType
    ) -> None:
        """Steps 3 to 5, also of interrupted seals: move into place, manifest once,
        checkpoint (``save``, with ``durable=True`` before anything moves)."""
        if not ckpt.pending:
            return
        # Nothing moves before the checkpoint that names the move is on disk.
        save(durable=True)
        manifest = manifest_path(self.root, self.prefix)
        folders, lines = set(), []
        for p in ckpt.pending:
            src, dst = self.root / p.src, self.root / p.dst
            tmp = dst.with_name(dst.name + ".tmp")
            if p.entry.compression == "none" and p.entry.encoding == "jsonl":
                if src.exists() and not dst.exists():
                    fs.truncate(src, p.length)
                    fs.replace(src, dst)
            else:
                if tmp.exists():
                    fs.replace(tmp, dst)
                if dst.exists():
                    src.unlink(missing_ok=True)
            folders.add(dst.parent)
            if p.dst not in self.names:
                lines.append(msgspec.json.encode(p.entry) + b"\n")
                self.names.add(p.dst)
                self.manifested.append((self.lines, p.entry))
                self.lines += 1
        if self.sync:  # the renames are durable before the manifest names them
            for folder in folders:
                fsync_dir(folder, fs=fs)
        if lines:
            append_durably(manifest, b"".join(lines), sync=self.sync, fsync=fsync, fs=fs)
        ckpt.pending = []
        save()

    def retain(self) -> None:
        """Delete the oldest manifested sealed files beyond the retention limits."""
        keep_files, keep_bytes = self.settings.retention_files, self.settings.retention_bytes
        if not keep_files and not keep_bytes:
            return
        total = sum(e.bytes for _, e in self.manifested)
        done = None
        if self.settings.upload_url is not None:  # only uploaded files may go
            done = uploaded(self.root, self.prefix)
        while self.manifested and (
            (keep_files and len(self.manifested) > keep_files)
            or (keep_bytes and total > keep_bytes)
        ):
            if done is not None and self.manifested[0][0] >= done:
                break
            _, oldest = self.manifested.pop(0)
            total -= oldest.bytes
            (self.root / oldest.name).unlink(missing_ok=True)
            log.info("retention: deleted %s", oldest.name)
