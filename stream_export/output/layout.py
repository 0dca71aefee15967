"""The sink's on-disk format and its readers: what ``follow``, ``export`` and the
status page read, and what the Writer writes (see writer.py for the protocol).

Files in ``output_dir`` (prefix ``training-data``, worker id ``w1``)::

    training-data.jsonl                                active file (stable name)
    training-data-20250101T120000Z-00000042-w1.jsonl   sealed (``.gz`` / ``.zst``)
    training-data.manifest.jsonl                       one line per sealed file
    .training-data.checkpoint.json                     offsets + active lengths
    .training-data.ids                                 recent record ids (dedupe.py)
    .training-data.lock                                one writer per prefix
    domain=math/training-data.jsonl ...                with ``partition_by=domain``

Partition folders are Hive-style, ``<field>=<value>`` (as Kafka Connect and Spark
lay them out): a name with ``=``, which no file of a writer has (prefixes are safe
names), so no partition value can name a file the writer keeps at the top.
"""

from __future__ import annotations

import fcntl
import gzip
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final, cast

import msgspec

from stream_export.contract.calls import WeightVersion, version_key
from stream_export.errors import ConfigError
from stream_export.output import parquet
from stream_export.settings.values import SAFE_NAME

CHECKPOINT_VERSION: Final = 1
#: The value part of the folder of a missing partition field, and of an unsafe value
#: (no value is either: a safe value starts with a letter or digit).
UNSET_VALUE: Final = "_unset"
REJECTED_VALUE: Final = "_rejected"
SAFE_NAME_RE: Final = re.compile(SAFE_NAME)
SUFFIX: Final = {"none": "", "gzip": ".gz", "zstd": ".zst"}
PARQUET: Final = ".parquet"


class ActiveFile(msgspec.Struct, kw_only=True):
    """Checkpointed state of one active file (one per output folder)."""

    seq: int
    path: str
    length: int = 0
    records: int = 0
    #: Wall time of its first record (0: empty); the age for rotation.
    opened: float = 0.0
    first_time: float | None = None
    last_time: float | None = None
    #: Kafka partition -> [first, last] source offset written into it.
    ranges: dict[int, list[int]] = {}
    #: Lowest and highest weight version of the model calls behind its records.
    weight_version_min: WeightVersion | None = None
    weight_version_max: WeightVersion | None = None

    def note(
        self,
        partition: int,
        offset: int,
        event_time: float,
        versions: tuple[WeightVersion, WeightVersion] | None,
    ) -> None:
        """Take a record's source offset, event time and weight versions in."""
        self.last_time = event_time
        span = self.ranges.get(partition)
        if span is None:
            self.ranges[partition] = [offset, offset]
        else:
            span[1] = offset
        if versions is not None:
            low, high = self.weight_version_min, self.weight_version_max
            if low is None or version_key(versions[0]) < version_key(low):
                self.weight_version_min = versions[0]
            if high is None or version_key(versions[1]) > version_key(high):
                self.weight_version_max = versions[1]


class ManifestEntry(msgspec.Struct, kw_only=True):
    """One line of the manifest: a sealed, finished file."""

    name: str
    seq: int
    worker_id: str
    topic: str
    records: int
    bytes: int
    sha256: str
    compression: str
    first_event_time: float | None
    last_event_time: float | None
    offsets: dict[int, list[int]]
    sealed_at: float
    reason: str
    #: The epoch the file belongs to: 0, then one more each time the source topic
    #: was found reset (see Checkpoint); its topic id, if the broker told it.
    epoch: int = 0
    topic_id: str | None = None
    #: Lowest and highest weight version of the model calls behind the file's
    #: records (None: none had calls), see ``calls.version_key``.
    weight_version_min: WeightVersion | None = None
    weight_version_max: WeightVersion | None = None
    #: "jsonl", or "parquet" (then ``compression`` is the codec inside the file).
    encoding: str = "jsonl"


class PendingSeal(msgspec.Struct, kw_only=True):
    src: str
    dst: str
    #: Uncompressed length of src when it was sealed.
    length: int
    entry: ManifestEntry


class Checkpoint(msgspec.Struct, kw_only=True):
    version: int = CHECKPOINT_VERSION
    worker_id: str
    topic: str
    next_seq: int = 0
    #: Kafka partition -> last source offset whose output is in the files.
    offsets: dict[int, int] = {}
    #: Output folder ("" for the top level) -> its active file.
    active: dict[str, ActiveFile] = {}
    pending: list[PendingSeal] = []
    ids_length: int = 0
    #: The source topic's id (None: not known yet, or the broker cannot say).
    topic_id: str | None = None
    #: Bumped when the topic is found reset (sink.on_topic_reset=new_epoch): the
    #: offsets then start over on the new topic; epoch_reason says what was found.
    epoch: int = 0
    epoch_reason: str | None = None
    #: The output this writer serves (the sink's name: ``sink``, ``groups-sink``
    #: ...): outputs of one topic resume only where the same output stopped.
    #: None in checkpoints written before it was recorded.
    output: str | None = None

    def moved(self, old: str, new: str) -> None:
        """Follow a folder of the output renamed from ``old`` to ``new`` (see
        :func:`set_aside`) in every path the checkpoint names."""

        def follow(path: str) -> str:
            return new + path[len(old) :] if path.startswith(old + "/") else path

        self.active = {
            follow(f"{folder}/")[:-1] if folder else folder: state
            for folder, state in self.active.items()
        }
        for state in self.active.values():
            state.path = follow(state.path)
        for p in self.pending:
            p.src, p.dst, p.entry.name = follow(p.src), follow(p.dst), follow(p.entry.name)


def checkpoint_path(root: Path, prefix: str) -> Path:
    return root / f".{prefix}.checkpoint.json"


def manifest_path(root: Path, prefix: str) -> Path:
    return root / f"{prefix}.manifest.jsonl"


def ids_path(root: Path, prefix: str) -> Path:
    return root / f".{prefix}.ids"


def own_names(prefix: str) -> list[str]:
    """The names of the files a writer keeps at the top of its output folder (with
    the temporary names they are replaced through)."""
    names = [
        f".{prefix}.lock",
        checkpoint_path(Path(), prefix).name,
        manifest_path(Path(), prefix).name,
        ids_path(Path(), prefix).name,
        uploaded_path(Path(), prefix).name,
        f"{prefix}.jsonl",
    ]
    return names + [f"{name}.tmp" for name in names]


def set_aside(root: Path, prefix: str, stamp: str) -> list[tuple[str, str]]:
    """Rename whatever stands where a file of the writer goes but is not a file (a
    folder, say one an older version made for a partition value) to
    ``<name>.misplaced-<stamp>``, so that it neither stops the writer nor is lost;
    return the (old, new) names."""
    moved = []
    for name in own_names(prefix):
        path = root / name
        if path.is_file() or not os.path.lexists(path):
            continue
        new = f"{name}.misplaced-{stamp}"
        n = 1
        while os.path.lexists(root / new):
            n += 1
            new = f"{name}.misplaced-{stamp}-{n}"
        os.rename(path, root / new)
        moved.append((name, new))
    return moved


def read_checkpoint(root: Path, prefix: str) -> Checkpoint | None:
    """The checkpoint of the writer that owns ``prefix`` in ``root``, if any."""
    try:
        data = checkpoint_path(root, prefix).read_bytes()
    except FileNotFoundError:
        return None
    return msgspec.json.decode(data, type=Checkpoint)


def shared_checkpoints(root: Path, topic: str) -> Iterator[tuple[str, Checkpoint]]:
    """The prefix and checkpoint of every writer in ``root`` for ``topic`` (an
    unreadable checkpoint, say one being replaced, is passed over)."""
    for path in root.glob(".*.checkpoint.json"):
        try:
            ckpt = msgspec.json.decode(path.read_bytes(), type=Checkpoint)
        except (OSError, msgspec.MsgspecError):
            continue
        if ckpt.topic == topic:
            yield path.name[1 : -len(".checkpoint.json")], ckpt


def checkpointed_offsets(
    root: Path, topic: str, topic_id: str | None = None, output: str | None = None
) -> dict[int, int]:
    """Highest checkpointed offset per partition over every writer in ``root`` of
    ``output`` for ``topic``: where a partition that moved between workers sharing a
    directory must resume. Checkpoints of another output of the topic (the group
    outputs share one), or of another incarnation of the topic (another known
    ``topic_id``), do not count; one that names no output counts for all."""
    best: dict[int, int] = {}
    for _, ckpt in shared_checkpoints(root, topic):
        other = topic_id is not None and ckpt.topic_id not in (None, topic_id)
        elsewhere = output is not None and ckpt.output not in (None, output)
        if not other and not elsewhere:
            for partition, offset in ckpt.offsets.items():
                best[partition] = max(offset, best.get(partition, -1))
    return best


def manifest_lines(root: Path, prefix: str) -> int:
    """How many complete lines (sealed files) the manifest has."""
    try:
        return manifest_path(root, prefix).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def uploaded_path(root: Path, prefix: str) -> Path:
    """How many manifest lines were uploaded (``sink.upload_url``, upload.py)."""
    return root / f".{prefix}.uploaded"


def uploaded(root: Path, prefix: str) -> int:
    try:
        return int(uploaded_path(root, prefix).read_text() or 0)
    except FileNotFoundError:
        return 0


def read_manifest(root: Path, prefix: str, start: int = 0) -> list[ManifestEntry]:
    """Complete manifest lines from line ``start`` on (a torn last line is skipped)."""
    try:
        data = manifest_path(root, prefix).read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")[:-1]
    return [msgspec.json.decode(line, type=ManifestEntry) for line in lines[start:]]


def folder_for(field: str, value: object) -> tuple[str, bool]:
    """Sub-folder ``<field>=<value>`` for a partition value and whether the value was
    rejected as unsafe.

    Only values of letters, digits, ``.``, ``_`` and ``-`` that start with a letter
    or digit are used as they are, so no value can name a path outside the output
    directory (no separators, no ``..``, no absolute paths, no hidden names); the
    ``=`` keeps every folder apart from the writer's own files.
    """
    if value is None:
        return f"{field}={UNSET_VALUE}", False
    if isinstance(value, bool | int | float | str) and SAFE_NAME_RE.fullmatch(str(value)):
        return f"{field}={value}", False
    return f"{field}={REJECTED_VALUE}", True


def lock_output(root: Path, prefix: str, worker_id: str) -> int:
    """Take the one-writer-per-prefix lock of ``root`` for ``worker_id``; return its
    descriptor (closing it releases the lock). ConfigError names the holder."""
    path = root / f".{prefix}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = path.read_text(errors="replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(
            f"{root}/{prefix}.* is in use by {owner}; give each worker its own "
            "sink.output_dir or sink.prefix",
            reason="output_in_use",
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{worker_id} pid {os.getpid()}\n".encode())
    return fd


def open_sealed(path: Path) -> IO[bytes]:
    """Open a sealed file for reading, decompressing by its suffix (a Parquet file
    reads as the JSON lines of its rows, see parquet.lines)."""
    if path.name.endswith(PARQUET):
        return io.BytesIO(b"".join(line + b"\n" for line in parquet.lines(path)))
    if path.name.endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    if path.name.endswith(".zst"):
        zstd = zstd_module()
        return zstd.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)  # type: ignore[no-any-return]
    return path.open("rb")


def zstd_module() -> Any:
    try:
        import zstandard
    except ImportError:
        raise ConfigError(
            "sink.compression=zstd needs the zstandard package: pip install 'stream-export[zstd]'"
        ) from None
    return zstandard
