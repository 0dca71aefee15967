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
import os
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench.report import (
    Heading,
    Results,
    Spread,
    cells,
    heading,
    num,
    page,
    results_json,
    results_option,
    round_ratios,
    row,
    spread,
    title,
)
from stream_export.output import upload
from stream_export.output.layout import read_manifest, uploaded_path
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from stream_export.settings.sink import SinkSettings
from tests.support.seaweedfs import S3Server, dev_seaweedfs

PROG: Final = "python -m bench.upload"


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


class UploadReport(Heading, kw_only=True):
    #: The S3 server the files went to.
    s3: str
    files: int
    bytes: int
    rounds: int
    #: System -> MB/s in each round.
    mb_per_s: dict[str, list[float]]


def ratios(report: UploadReport) -> dict[str, Spread]:
    """The uploader's MB/s over boto3's, per round."""
    figures = {(s, n): v for s, values in report.mb_per_s.items() for n, v in enumerate(values)}
    return round_ratios(figures, "uploader", ["boto3"])


def run(s3: S3Server, files: int, megabytes: int, rounds: int) -> dict[str, Any]:
    """The files' count and bytes, and every round's MB/s per system."""
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
    return {"files": files, "bytes": total, "rounds": rounds, "mb_per_s": rates}


def to_json(report: UploadReport) -> bytes:
    return results_json(report, ratios=ratios(report))


def markdown(report: UploadReport) -> str:
    lines = [
        *title("Upload throughput to a local SeaweedFS", report, f"S3: {report.s3}"),
        "",
        f"{report.files} files, {num(report.bytes / 1e6)} MB in all, {report.rounds} rounds; "
        "server and clients on the same shared machine.",
        "",
        row("system", "MB/s (min / median / max)"),
        row("---", "---"),
        *(row(name, cells(spread(rates))) for name, rates in report.mb_per_s.items()),
        *(row(f"{name}, per round", cells(s)) for name, s in ratios(report).items()),
    ]
    return page(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=raw)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--megabytes", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--endpoint", help="an S3 endpoint to use instead of starting SeaweedFS")
    results_option(p)
    args = p.parse_args(argv)
    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as state:
        env = {**os.environ, "SEAWEEDFS_STATE_DIR": state}
        url, where = args.endpoint, f"given, {args.endpoint}"
        if url is None:
            started = dev_seaweedfs("start", env=env)
            if started.returncode != 0:
                raise SystemExit(started.stderr)
            url = started.stdout.strip()
            where = f"its own dev/seaweedfs at {url}"
        try:
            measured = run(S3Server(url), args.files, args.megabytes, args.rounds)
        finally:
            if args.endpoint is None:
                dev_seaweedfs("stop", env=env)
    report = UploadReport(**heading(PROG, argv, now), s3=where, **measured)
    Results(args.results, now, "upload").write(markdown(report), to_json(report))


if __name__ == "__main__":
    main()
