"""Uploads to a real S3-compatible server (SeaweedFS) from real workers: two
workers share one bucket prefix, one is killed with -9 while it uploads, and
``datasets`` reads every record from the bucket exactly once; storage that is
down, then a bucket that does not exist (a real NoSuchBucket, for a key that is no
admin's), pause the uploads, never the sink, and show on /readyz."""

from __future__ import annotations

import importlib
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.output import upload
from stream_export.output.layout import read_manifest, uploaded
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings
from stream_export.settings.sink import SinkSettings
from tests.support.monitoring import free_port, get, labelled
from tests.support.processes import Worker
from tests.support.seaweedfs import S3Server, dev_seaweedfs
from tests.support.sinkkafka import episode, message, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
UPLOAD_ERRORS = "stream_export_upload_errors_total"


def uploaded_records(s3: S3Server, bucket: str, prefix: str) -> Counter[str]:
    """Records per manifest entry uploaded under ``prefix`` (by file name)."""
    client = s3.client()
    found: Counter[str] = Counter()
    for key in s3.keys(bucket, f"{prefix}/{upload.MANIFEST_DIR}/"):
        entry = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        found[entry["name"]] = entry["records"]
    return found


def readiness(url: str) -> Any:
    """/readyz's answer, ready (200) or not (503)."""
    return json.loads(get(url)[1])


def etags(s3: S3Server, bucket: str) -> dict[str, Any]:
    client = s3.client()
    return {k: client.head_object(Bucket=bucket, Key=k)["ETag"] for k in s3.keys(bucket)}


def test_two_workers_upload_to_one_prefix_through_a_kill9_every_record_once(
    settings_for: Callable[..., Settings],
    tmp_path: Path,
    s3_server: S3Server,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = [
        "sink.encoding=parquet",
        "sink.rotate_records=40",
        "sink.rotate_age_s=3",  # the last, partly filled files are sealed too
        "sink.flush_interval_ms=20",
        f"sink.upload_url=s3://{bucket}/run-1",
        f"sink.upload_endpoint={s3_server.url}",
    ]
    w1, w2 = (
        settings_for(
            *common,
            f"sink.prefix=td-{w}",
            f"worker.worker_id={w}",
            f"worker.data_dir={tmp_path / f'state-{w}'}",
        )
        for w in ("w1", "w2")
    )
    total = 1200
    publish(w1, [message(episode(i)) for i in range(total)])
    out = Path(w1.sink.output_dir)
    env = s3_server.env()
    settings = {"w1": w1, "w2": w2}
    workers = {w: Worker(s, tmp_path / f"{w}-0.log", env=env).start() for w, s in settings.items()}
    stopped: list[Worker] = []
    try:
        # kill -9 whichever worker is uploading (the partitions are the broker's choice)
        first = wait_for(
            lambda: next((w for w in settings if uploaded(out, f"td-{w}") >= 2), ""),
            timeout=120,
            interval=0.02,
            what=lambda: f"an upload\n{workers['w1'].log()[-2000:]}",
        )
        workers[first].kill9()
        stopped.append(workers[first])
        workers[first] = Worker(settings[first], tmp_path / f"{first}-1.log", env=env).start()

        def all_uploaded() -> bool:
            done = uploaded_records(s3_server, bucket, "run-1")
            return sum(done.values()) >= total

        wait_for(all_uploaded, timeout=180, what=lambda: workers[first].log()[-3000:])
    finally:
        for worker in [*stopped, *workers.values()]:
            worker.stop()
    local = {e.name for p in ("td-w1", "td-w2") for e in read_manifest(out, p)}
    assert set(uploaded_records(s3_server, bucket, "run-1")) == local
    datasets = importlib.import_module("datasets")
    # other tests load local files with the hub off, which datasets reads once at import
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    loaded = datasets.load_dataset(
        "parquet",
        data_files=f"s3://{bucket}/run-1/*.parquet",
        storage_options=s3_server.storage_options(),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    prompts = Counter(loaded["prompt"])
    assert prompts == Counter(f"task {i}" for i in range(total))


def test_storage_down_then_a_missing_bucket_pause_uploads_not_the_sink_and_readyz_says_so(
    settings_for: Callable[..., Settings], tmp_path: Path, s3_server: S3Server
) -> None:
    """The storage is not there at first (nothing listens at its endpoint); then a
    second SeaweedFS on this machine (beside ``s3_server``'s) answers there, but the
    bucket does not exist and the worker's key is no admin's: a real NoSuchBucket.
    All along the sink seals its files, the uploads pause (counted by kind) and
    /readyz fails uploads_flowing; once the bucket is created, every file is
    uploaded and the worker is ready again."""
    s3_port, port = free_port(), free_port()
    later = S3Server(f"http://127.0.0.1:{s3_port}")
    settings = settings_for(
        "sink.rotate_records=10",
        "sink.rotate_age_s=2",
        "sink.flush_interval_ms=20",
        "sink.retry_max_s=1",
        "sink.upload_url=s3://later/p",
        f"sink.upload_endpoint={later.url}",
        "http.enabled=true",
        f"http.port={port}",
    )
    publish(settings, [message(episode(i)) for i in range(50)])
    out = Path(settings.sink.output_dir)
    state = tmp_path / "s3"
    env = {**os.environ, "SEAWEEDFS_STATE_DIR": str(state)}
    with Worker(settings, tmp_path / "w.log", env=later.env(writer=True)) as worker:
        wait_for(lambda: len(read_manifest(out, "training-data")) == 5, timeout=60, what=worker.log)
        readyz = f"http://127.0.0.1:{port}/readyz"
        wait_for(
            lambda: not readiness(readyz)["checks"]["uploads_flowing"],
            timeout=60,
            what="readyz to show the paused uploads",
        )
        status = readiness(readyz)
        assert status["checks"]["output_writable"] and not status["ready"]
        assert uploaded(out, "training-data") == 0
        started = dev_seaweedfs("start", "--port", str(s3_port), env=env)
        try:
            assert started.returncode == 0, started.stderr
            s3_server.client().list_buckets()  # the other SeaweedFS is up beside this one,
            log = (state / "log").read_text(errors="replace")  # and no listener collided
            assert "address already in use" not in log, log[-3000:]
            wait_for(
                lambda: labelled(port, UPLOAD_ERRORS, "kind", "NoSuchBucket") >= 2,
                timeout=30,
                what=lambda: f"NoSuchBucket in /metrics\n{worker.log()[-2000:]}",
            )
            assert not readiness(readyz)["ready"] and uploaded(out, "training-data") == 0
            later.client().create_bucket(Bucket="later")  # by the admin
            wait_for(lambda: uploaded(out, "training-data") == 5, timeout=90, what=worker.log)
            wait_for(lambda: readiness(readyz)["ready"], timeout=30, what="ready again")
            assert len(later.keys("later", "p/training-data-")) == 5
            # dev/seaweedfs restarted on its state keeps the objects and grows volumes
            # for a new bucket (its master used to lose its state at each start)
            assert dev_seaweedfs("stop", env=env).returncode == 0
            again = dev_seaweedfs("start", "--port", str(s3_port), env=env)
            assert again.returncode == 0, again.stderr
            assert len(later.keys("later", "p/training-data-")) == 5
            client = later.client()
            client.create_bucket(Bucket="after-restart")
            client.put_object(Bucket="after-restart", Key="k", Body=b"x")
            assert later.keys("after-restart") == ["k"]
        finally:
            dev_seaweedfs("stop", env=env)


def test_a_second_upload_puts_the_same_objects_and_retention_waits_for_uploads(
    tmp_path: Path, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a crash between a put and its count, the same files go again: same keys,
    same bytes, nothing more; a local file is deleted only once uploaded."""
    from stream_export.output.writer import Writer
    from tests.support.sinkfiles import record

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    sink = SinkSettings(
        output_dir=str(tmp_path),
        rotate_records=2,
        retention_files=1,
        upload_url=f"s3://{bucket}/x",
        upload_endpoint=s3_server.url,
    )
    writer = Writer.open(sink, worker_id="w", topic="t", metrics=Metrics())
    for i in range(6):
        writer.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0)
    writer.flush()
    names = [e.name for e in read_manifest(tmp_path, "training-data")]
    assert len(names) == 2 and all((tmp_path / n).exists() for n in names)  # none uploaded yet
    uploader = upload.Uploader(sink, Metrics())
    assert uploader.step() == 2
    first = etags(s3_server, bucket)
    (tmp_path / ".training-data.uploaded").write_text("0")  # the count lost in a crash
    assert uploader.step() == 2
    assert etags(s3_server, bucket) == first and len(first) == 4  # 2 files, 2 entries
    writer.append("e6", [record(6)], partition=0, offset=6, event_time=0.0)
    writer.append("e7", [record(7)], partition=0, offset=7, event_time=0.0)
    writer.flush()  # a third seal: retention may now delete the uploaded ones
    writer.close()
    last = read_manifest(tmp_path, "training-data")[-1].name
    assert [n for n in [*names, last] if (tmp_path / n).exists()] == [last]
