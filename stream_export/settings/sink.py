"""The ``sink.*`` settings section (``Settings.sink``): the output files (rotation,
sealing, compression, encoding, partition folders, retention, upload)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from stream_export.contract.widths import INT32_MAX
from stream_export.errors import ConfigError
from stream_export.settings.values import YEAR, NonEmpty, SafeName


class SinkSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Where the output files go.
    output_dir: NonEmpty = "."
    #: File-name prefix: 1-128 of [A-Za-z0-9._-], starting with a letter or digit.
    prefix: SafeName = "training-data"
    #: Seal the active file at this size: 0 (no size limit) to 1 TiB.
    rotate_bytes: Annotated[int, Meta(ge=0, le=1 << 40)] = 256 * 1024 * 1024
    #: Seal the active file at this many records: 0 (no limit) to 2**31 - 1.
    rotate_records: Annotated[int, Meta(ge=0, le=INT32_MAX)] = 0
    #: Seal the active file when it is this old, idle files too: 0 (disabled) to 10 years.
    rotate_age_s: Annotated[float, Meta(ge=0, le=10 * YEAR)] = 3600.0
    #: How often buffered lines reach the file (tailers see them then): 1 to 60000 ms.
    flush_interval_ms: Annotated[int, Meta(ge=1, le=60_000)] = 200
    #: When to fsync: every flush, at rotation only, or never.
    fsync: Literal["flush", "rotation", "never"] = "rotation"
    #: Sealed JSON-lines files compressed as a whole.
    compression: Literal["none", "gzip", "zstd"] = "none"
    #: How sealed files are written: JSON lines, or Parquet (one file per rotation,
    #: the output's typed schema; the active file stays JSON lines).
    encoding: Literal["jsonl", "parquet"] = "jsonl"
    #: The codec inside Parquet files.
    parquet_compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    #: Ship each sealed file and its manifest entry to S3-compatible storage:
    #: s3://bucket[/prefix] (credentials from the AWS environment). Empty: off.
    upload_url: Annotated[str, Meta(pattern=r"^s3://[^/]+(/.*)?$")] | None = None
    #: The S3 endpoint for another S3-compatible server (e.g. http://host:8333).
    upload_endpoint: Annotated[str, Meta(pattern=r"^https?://")] | None = None
    #: Keep a sealed file on disk once uploaded (retention still applies).
    keep_uploaded: bool = True
    #: Optional metadata field whose value names a sub-folder, Hive-style
    #: ``<field>=<value>/`` (an unsafe value: ``<field>=_rejected/``): a safe name.
    partition_by: SafeName | None = None
    #: With partition_by: active files kept open at once, 1 to 100,000; the least
    #: recently written one is closed first (and opened again when written to).
    max_open_files: Annotated[int, Meta(ge=1, le=100_000)] = 64
    #: With partition_by: partition folders with an active file at once (each is an
    #: entry of the checkpoint), 1 to 100,000; beyond it the least recently written
    #: one is sealed (reason "evicted").
    max_active_files: Annotated[int, Meta(ge=1, le=100_000)] = 256
    #: Keep at most this many sealed files / bytes (0: no limit); only manifested
    #: sealed files are ever deleted, oldest first. Files: 0 to 10,000,000;
    #: bytes: 0 to 2**62.
    retention_files: Annotated[int, Meta(ge=0, le=10_000_000)] = 0
    retention_bytes: Annotated[int, Meta(ge=0, le=1 << 62)] = 0
    #: How many recent episode ids the sink remembers to drop re-emitted episodes:
    #: 0 (no deduplication) to 10,000,000.
    dedupe_window: Annotated[int, Meta(ge=0, le=10_000_000)] = 100_000
    #: Longest pause between retries while the output is not writable: > 0, at most 3600 s.
    retry_max_s: Annotated[float, Meta(gt=0, le=3600)] = 5.0
    #: When a topic is not the one whose offsets were kept (deleted and created
    #: again, or the broker's data wiped). "stop": stop with an error saying what to
    #: do. "new_epoch": the sink seals its files and writes the new episodes topic
    #: from its beginning as a new epoch (in the manifest and checkpoint). The
    #: assembler then discards its stale local table state (its open episodes are lost).
    on_topic_reset: Literal["stop", "new_epoch"] = "stop"

    def __post_init__(self) -> None:
        if self.encoding == "parquet" and self.compression != "none":
            raise ConfigError(
                f"invalid setting sink.compression={self.compression}: Parquet files "
                "compress inside (sink.parquet_compression); leave it none"
            )
