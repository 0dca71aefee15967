"""The follow reader against a writer rotating quickly in another thread."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest

from stream_export.output.follow import Follower, Position, lines
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from tests.support.sinkfiles import record, sink_settings


def write_in_thread(out: Path, total: int, **fields: object) -> threading.Thread:
    def run() -> None:
        w = Writer.open(sink_settings(out, **fields), worker_id="w", topic="t", metrics=Metrics())
        for i in range(total):
            folder = ("a", "b")[i % 2]
            w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder=folder)
            if i % 5 == 0:
                w.flush()
        w.flush()
        w.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "fields",
    [
        {"rotate_records": 7},
        {"rotate_records": 3, "compression": "gzip", "partition_by": "domain"},
        {"rotate_bytes": 200, "compression": "zstd"},
    ],
)
def test_a_tailing_reader_sees_every_record_once_and_never_a_partial_line(
    tmp_path: Path, fields: dict[str, object]
) -> None:
    total = 1500
    writer = write_in_thread(tmp_path, total, fsync="never", **fields)
    follower = Follower(tmp_path, poll_s=0.001, stop=lambda: not writer.is_alive())
    got = []
    for line in follower:
        msgspec.json.decode(line)  # a partial line would not parse
        got.append(line)
    seen_while_writing = len(got)
    got += Follower(tmp_path, position=follower.position, wait=False)
    assert seen_while_writing > total // 2
    assert sorted(got) == sorted(record(i) for i in range(total))
    if "partition_by" not in fields:
        assert got == [record(i) for i in range(total)]


def test_a_saved_position_resumes_exactly_after_the_last_record(tmp_path: Path) -> None:
    write_in_thread(tmp_path, 50, rotate_records=4).join()
    first = Follower(tmp_path, wait=False)
    got = []
    for line in first:
        got.append(line)
        if len(got) == 22:  # inside a sealed file
            break
    saved = tmp_path / "pos.json"
    first.position.save(saved)
    rest = list(Follower(tmp_path, position=Position.load(saved), wait=False))
    assert got + rest == [record(i) for i in range(50)]
    assert list(Follower(tmp_path, position=Position.load(tmp_path / "none"), wait=False))


def test_lines_hold_back_a_partial_last_line() -> None:
    data = io.BytesIO(b"a\nbb\nccc")
    assert list(lines(data)) == [(b"a", 2), (b"bb", 5)]
    assert list(lines(data, 2, limit=4)) == []
    assert list(lines(data, 2, limit=5)) == [(b"bb", 5)]


def test_follow_command_prints_records_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_in_thread(out, 20, rotate_records=6).join()
    pos = tmp_path / "pos.json"
    cmd = [
        sys.executable,
        "-m",
        "stream_export",
        "follow",
        str(out),
        "--once",
        "--position",
        str(pos),
    ]
    first = subprocess.run(cmd, capture_output=True, check=True).stdout
    assert first.splitlines() == [record(i) for i in range(20)]
    assert subprocess.run(cmd, capture_output=True, check=True).stdout == b""
