"""Upload throughput to a local SeaweedFS (issue 29): the worker's uploader against
the S3 client library's own bulk upload, on the same sealed files.

    python -m bench.upload [--files 8] [--megabytes 16] [--rounds 5] [--endpoint URL]

The files are sealed by the real Writer (JSON lines of incompressible text, so
every byte goes over the wire). Per round, alternating which goes first:

  uploader   stream_export.output.upload.Uploader.step(): each file, then its
             manifest entry, one after another (what the worker does)
  boto3      boto3's S3Transfer ``upload_file`` (multipart, 10 threads) of every
             file, 4 files at a time: the library's bulk upload, no manifest

MB/s is the files' bytes over wall time; min / median / max over the rounds. A
SeaweedFS of its own (dev/seaweedfs) unless --endpoint names one that takes
dev/seaweedfs's default credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import RESULTS, write_results
from stream_export.output import upload
from stream_export.output.layout import read_manifest, uploaded_path
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from stream_export.settings.sink import SinkSettings
from tests.support.seaweedfs import S3Server, dev_seaweedfs


def sealed_files(root: Path, files: int, megabytes: int) -> int:
    """Seal ``files`` files of about ``megabytes`` MB each; their total bytes."""
    settings = SinkSettings(output_dir=str(root), rotate_bytes=megabytes << 20, fsync="never")
    writer = Writer.open(settings, worker_id="bench", topic="t", metrics=Metrics())
    line = 64 << 10
    i = 0
    while len(read_manifest(root, "training-data")) < files:
        text = secrets.token_hex(line // 2)
        writer.append(
            f"r{i}", [b'{"prompt": "%s"}' % text.encode()], partition=0, offset=i, event_time=0.0
        )
        i += 1
    writer.close()
    return sum(e.bytes for e in read_manifest(root, "training-data")[:files])


def by_uploader(root: Path, s3: S3Server, bucket: str) -> None:
    settings = SinkSettings(
        output_dir=str(root), upload_url=f"s3://{bucket}/uploader", upload_endpoint=s3.url
    )
    uploaded_path(root, "training-data").unlink(missing_ok=True)
    upload.Uploader(settings, Metrics(), client=s3.client()).step()


def by_boto3(root: Path, s3: S3Server, bucket: str) -> None:
    from boto3.s3.transfer import S3Transfer, TransferConfig

    transfer = S3Transfer(s3.client(), TransferConfig(max_concurrency=10))
    names = [e.name for e in read_manifest(root, "training-data")]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: transfer.upload_file(str(root / n), bucket, f"boto3/{n}"), names))


def spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def run(s3: S3Server, files: int, megabytes: int, rounds: int) -> tuple[list[str], dict[str, Any]]:
    """The Markdown table, and every round's MB/s per system."""
    bucket = f"bench-{os.getpid()}"
    s3.client().create_bucket(Bucket=bucket)
    systems: dict[str, Any] = {"uploader": by_uploader, "boto3": by_boto3}
    rates: dict[str, list[float]] = {name: [] for name in systems}
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as tmp:
        root = Path(tmp)
        total = sealed_files(root, files, megabytes)
        for r in range(rounds):
            for name in list(systems) if r % 2 == 0 else list(systems)[::-1]:
                started = time.perf_counter()
                systems[name](root, s3, bucket)
                rates[name].append(total / (time.perf_counter() - started) / 1e6)
    ratios = [u / b for u, b in zip(rates["uploader"], rates["boto3"], strict=True)]
    table = [
        f"{files} files, {total / 1e6:.0f} MB in all, {rounds} rounds.",
        "",
        "| system | MB/s (min / median / max) |",
        "| --- | --- |",
        *(f"| {name} | {spread(rates[name])} |" for name in systems),
        f"| uploader / boto3, per round | {min(ratios):.2f} / {statistics.median(ratios):.2f} / "
        f"{max(ratios):.2f} |",
    ]
    return table, {"files": files, "bytes": total, "mb_per_s": rates, "ratios": ratios}


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--megabytes", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--endpoint", help="an S3 endpoint to use instead of starting SeaweedFS")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as state:
        env = {**os.environ, "SEAWEEDFS_STATE_DIR": state}
        url = args.endpoint
        if url is None:
            started = dev_seaweedfs("start", env=env)
            if started.returncode != 0:
                raise SystemExit(started.stderr)
            url = started.stdout.strip()
        try:
            table, data = run(S3Server(url), args.files, args.megabytes, args.rounds)
        finally:
            if args.endpoint is None:
                dev_seaweedfs("stop", env=env)
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H%MZ")
    body = "\n".join(
        [
            "# Upload throughput to a local SeaweedFS (`python -m bench.upload`)",
            "",
            f"{stamp}; {os.cpu_count()} cores, shared machine; server and clients on it.",
            "",
            *table,
        ]
    )
    write_results(args.results, now, "upload", body + "\n", json.dumps(data, indent=1).encode())


if __name__ == "__main__":
    main()
