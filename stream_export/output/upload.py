"""Shipping sealed files to S3-compatible object storage (``sink.upload_url``).

Each output's uploader follows its manifest: for every sealed file, in order, it
puts the file under ``<url>/<name>`` and then the file's manifest entry under
``<url>/_manifest/<name>.json``, and only then counts it uploaded in
``.<prefix>.uploaded`` (the number of manifest lines done, replaced atomically).
A put is atomic in S3 (a reader sees no object or the whole one) and every name
is unique (time, sequence and worker id), so a restart that puts a file again
puts the same bytes under the same key: no duplicate, never a partial object.
Many workers share one prefix; the dataset is the union of their entries.

The uploader never touches the sink's exactly-once state: a bucket that is
unreachable, refuses or is full pauses the uploads (retried with backoff, counted,
``/readyz`` not ready) while the sink goes on writing locally. With upload on,
local retention deletes only uploaded files (``sink.retention_*``), and
``sink.keep_uploaded = false`` deletes each one as soon as it is uploaded.

Credentials and region come from the environment as for any AWS client
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, profiles);
``sink.upload_endpoint`` points at another S3-compatible server.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import mode
import msgspec

from stream_export.errors import ConfigError
from stream_export.output.durable import atomic_write
from stream_export.output.layout import ManifestEntry, read_manifest, uploaded, uploaded_path
from stream_export.runtime.metrics import Metrics
from stream_export.settings.sink import SinkSettings
from stream_export.telemetry import logs

log = logging.getLogger(__name__)
#: Where, under the upload prefix, the manifest entries go.
MANIFEST_DIR: Final = "_manifest"
POLL_S: Final = 1.0
_FIRST_RETRY_S: Final = 0.5


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes at its ends)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError(f"sink.upload_url {url!r} is not s3://bucket[/prefix]")
    return parts.netloc, parts.path.strip("/")


def error_kind(exc: Exception) -> str:
    """A bounded label for an upload failure: the S3 error code, or the exception."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)[:40]
    return type(exc).__name__


class Uploader:
    """The uploads of one output (one file prefix under ``settings.output_dir``)."""

    def __init__(self, settings: SinkSettings, metrics: Metrics, client: Any = None) -> None:
        assert settings.upload_url is not None
        self.settings = settings
        self.root = Path(settings.output_dir)
        self.prefix = settings.prefix
        self.bucket, key_prefix = split_url(settings.upload_url)
        self.key_prefix = f"{key_prefix}/" if key_prefix else ""
        self.metrics = metrics
        self.client = client
        self.paused = metrics.upload_paused.labels(self.prefix)
        self.pending = metrics.upload_pending_files.labels(self.prefix)

    def _client(self) -> Any:
        if self.client is None:
            import boto3  # imported on use: only workers that upload need it

            endpoint = self.settings.upload_endpoint
            self.client = boto3.client("s3", endpoint_url=endpoint)
        return self.client

    def key(self, name: str) -> str:
        return f"{self.key_prefix}{name}"

    def step(self) -> int:
        """Upload every sealed file not uploaded yet, in manifest order; return how
        many. Raises what the storage raised (the caller backs off and retries)."""
        done = uploaded(self.root, self.prefix)
        entries = read_manifest(self.root, self.prefix, start=done)
        self.pending.set(len(entries))
        for entry in entries:
            self._put(entry)
            done += 1
            atomic_write(uploaded_path(self.root, self.prefix), str(done).encode())
            self.pending.dec()
            self._retain(entry)
        return len(entries)

    def _put(self, entry: ManifestEntry) -> None:
        client = self._client()
        path = self.root / entry.name
        if path.exists():
            with path.open("rb") as body:
                client.put_object(
                    Bucket=self.bucket,
                    Key=self.key(entry.name),
                    Body=body,
                    Metadata={"sha256": entry.sha256, "records": str(entry.records)},
                )
            self.metrics.upload_bytes.inc(entry.bytes)
        else:  # deleted before it was uploaded (by hand): its entry says so
            logs.event(log, "upload.missing", logging.WARNING, file=str(path))
        client.put_object(
            Bucket=self.bucket,
            Key=self.key(f"{MANIFEST_DIR}/{entry.name}.json"),
            Body=msgspec.json.encode(entry),
            ContentType="application/json",
        )
        self.metrics.upload_files.inc()

    def _retain(self, entry: ManifestEntry) -> None:
        if not self.settings.keep_uploaded:
            (self.root / entry.name).unlink(missing_ok=True)


class UploadService(mode.Service):
    """Runs an Uploader beside the sink: polls its manifest, backs off on errors."""

    def __init__(self, uploader: Uploader) -> None:
        super().__init__()
        self.uploader = uploader

    @mode.Service.task
    async def _run(self) -> None:
        delay = _FIRST_RETRY_S
        while not self.should_stop:
            try:
                await asyncio.to_thread(self.uploader.step)
            except Exception as exc:  # any storage failure pauses; none stops the worker
                kind = error_kind(exc)
                self.uploader.metrics.upload_errors.labels(kind).inc()
                self.uploader.paused.set(1)
                logs.event(log, "upload.paused", logging.WARNING, error=kind, retry_s=delay)
                await self.sleep(delay)
                delay = min(delay * 2, self.uploader.settings.retry_max_s)
                continue
            self.uploader.paused.set(0)
            delay = _FIRST_RETRY_S
            await self.sleep(POLL_S)
