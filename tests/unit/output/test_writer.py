"""The writer on real files: rotation, manifest, recovery after a crash at every
file-system call, dedupe, partition folders, retention, disk errors."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_export.errors import ConfigError, SinkError
from stream_export.output.layout import folder_for, read_checkpoint, read_manifest
from stream_export.output.writer import Writer
from stream_export.rows import schema
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings
from tests.support.sinkfiles import all_lines, record, sink_settings
from tests.support.writer_faults import Crash, FaultyOs, abandon, produce, resume_at


def test_rotation_by_records_writes_a_manifest_that_matches_the_files(tmp_path: Path) -> None:
    metrics = Metrics()
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=3), worker_id="w1", topic="t", metrics=metrics
    )
    produce(w, 0, 10)
    w.close()
    assert all_lines(tmp_path) == [record(i) for i in range(10)]
    entries = read_manifest(tmp_path, "training-data")
    assert [e.records for e in entries] == [3, 3, 3]
    assert [e.offsets for e in entries] == [{0: [0, 2]}, {0: [3, 5]}, {0: [6, 8]}]
    assert (entries[0].first_event_time, entries[0].last_event_time) == (0.0, 2.0)
    assert sorted(e.name for e in entries) == [e.name for e in entries]
    assert all(e.name.endswith("-w1.jsonl") and e.reason == "records" for e in entries)
    assert (tmp_path / "training-data.jsonl").read_bytes() == record(9) + b"\n"
    assert metrics.files_rotated.labels("records")._value.get() == 3
    assert metrics.records_written._value.get() == 10


def test_rotation_by_size_keeps_an_episode_whole(tmp_path: Path) -> None:
    metrics = Metrics()
    w = Writer.open(
        sink_settings(tmp_path, rotate_bytes=100), worker_id="w1", topic="t", metrics=metrics
    )
    episodes = [[b"a" * 30, b"b" * 30], [b"c" * 30, b"d" * 30], [b"e" * 200]]
    for i, lines in enumerate(episodes):
        w.append(f"e{i}", lines, partition=0, offset=i, event_time=0.0)
    w.close()
    entries = read_manifest(tmp_path, "training-data")
    assert [e.records for e in entries] == [2, 2]
    assert all_lines(tmp_path) == [line for lines in episodes for line in lines]
    assert metrics.files_rotated.labels("size")._value.get() == 2


def test_an_idle_file_rotates_when_it_reaches_its_age(tmp_path: Path) -> None:
    now = [1000.0]
    metrics = Metrics()
    settings = sink_settings(tmp_path, rotate_age_s=60)
    w = Writer.open(settings, worker_id="w1", topic="t", metrics=metrics, clock=lambda: now[0])
    w.append("e0", [record(0)], partition=0, offset=0, event_time=0.0)
    w.tick()
    now[0] += 59
    w.tick()
    assert read_manifest(tmp_path, "training-data") == []
    now[0] += 1
    w.tick()
    assert [e.records for e in read_manifest(tmp_path, "training-data")] == [1]
    assert metrics.files_rotated.labels("age")._value.get() == 1
    w.tick()
    assert len(read_manifest(tmp_path, "training-data")) == 1


def open_writer(out: Path, **fields: Any) -> Writer:
    """A writer of ``record`` lines (the text format's columns, for Parquet)."""
    columns = (
        schema.episode_schema(FormatSettings()) if fields.get("encoding") == "parquet" else None
    )
    settings = sink_settings(out, **fields)
    return Writer.open(settings, worker_id="w", topic="t", metrics=Metrics(), columns=columns)


def count_fs_calls(tmp_path: Path, faulty: Callable[..., FaultyOs], **fields: Any) -> int:
    w = open_writer(tmp_path / "count", **fields)
    fake = faulty(10**9)
    produce(w, 0, 14)
    calls = fake.calls
    w.close()
    return calls


@pytest.mark.parametrize(
    ("compression", "window"),
    # A window of 3 compacts the ids log every few flushes.
    [("none", 100_000), ("gzip", 100_000), ("zstd", 100_000), ("none", 3), ("parquet", 100_000)],
)
def test_a_crash_at_any_file_system_call_loses_and_repeats_nothing(
    tmp_path: Path, faulty: Callable[..., FaultyOs], compression: str, window: int
) -> None:
    """Parquet: sealed files read back as the JSON lines of their rows, which are
    the very bytes of ``record`` (text columns, msgspec's spelling)."""
    fields: dict[str, Any] = {"rotate_records": 4, "fsync": "flush", "dedupe_window": window}
    if compression == "parquet":
        fields["encoding"] = "parquet"
    else:
        fields["compression"] = compression
    total = count_fs_calls(tmp_path, faulty, **fields)
    assert total > 50
    for n in range(1, total + 1):
        out = tmp_path / f"crash-{n}"
        w = open_writer(out, **fields)
        fake = faulty(n)
        with pytest.raises(Crash):
            produce(w, 0, 14)
        abandon(w)
        fake.times = 0
        w = open_writer(out, **fields)
        written = resume_at(w)
        # What was written before the crash, published again (as an assembler killed
        # before its persist does): repeats, dropped by the ids the writer remembers.
        for i in range(max(0, written - window), written):
            assert not w.append(f"e{i}", [record(i)], partition=1, offset=i, event_time=0.0), (
                f"crash at call {n}: e{i} written again"
            )
        produce(w, written, 14)
        w.close()
        assert all_lines(out) == [record(i) for i in range(14)], f"crash at call {n}"
        names = [e.name for e in read_manifest(out, "training-data")]
        assert len(names) == len(set(names)) == 3
        assert not list(out.glob("*.tmp"))


def test_an_active_file_without_a_checkpoint_is_sealed_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "training-data.jsonl").write_bytes(b'{"old": 1}\n{"old": 2}\n')
    w = Writer.open(sink_settings(tmp_path), worker_id="w", topic="t", metrics=Metrics())
    produce(w, 0, 2)
    w.close()
    [adopted] = read_manifest(tmp_path, "training-data")
    assert (adopted.records, adopted.reason) == (2, "adopted")
    assert all_lines(tmp_path) == [b'{"old": 1}', b'{"old": 2}', record(0), record(1)]


def test_a_torn_manifest_line_is_repaired(tmp_path: Path) -> None:
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=2), worker_id="w", topic="t", metrics=Metrics()
    )
    produce(w, 0, 5)
    w.close()
    manifest = tmp_path / "training-data.manifest.jsonl"
    good = manifest.read_bytes()
    manifest.write_bytes(good + b'{"name": "trunc')
    Writer.open(
        sink_settings(tmp_path, rotate_records=2), worker_id="w", topic="t", metrics=Metrics()
    ).close()
    assert manifest.read_bytes() == good


def test_a_repeated_episode_is_dropped_also_after_a_restart(tmp_path: Path) -> None:
    metrics = Metrics()
    w = Writer.open(sink_settings(tmp_path), worker_id="w", topic="t", metrics=metrics)
    assert w.append("a", [b"1"], partition=0, offset=0, event_time=0.0)
    assert not w.append("a", [b"1"], partition=0, offset=1, event_time=0.0)
    w.close()
    w = Writer.open(sink_settings(tmp_path), worker_id="w", topic="t", metrics=metrics)
    assert not w.append("a", [b"1"], partition=0, offset=2, event_time=0.0)
    assert w.append("b", [b"2"], partition=0, offset=3, event_time=0.0)
    w.close()
    assert all_lines(tmp_path) == [b"1", b"2"]
    assert metrics.episodes_repeated._value.get() == 2
    assert read_checkpoint(tmp_path, "training-data").offsets == {0: 3}  # type: ignore[union-attr]


def test_the_ids_log_is_compacted_to_the_window(tmp_path: Path) -> None:
    settings = sink_settings(tmp_path, dedupe_window=10)
    w = Writer.open(settings, worker_id="w", topic="t", metrics=Metrics())
    for i in range(100):
        w.append(f"e{i}", [b"x"], partition=0, offset=i, event_time=0.0)
        w.flush()
    w.close()
    w = Writer.open(settings, worker_id="w", topic="t", metrics=Metrics())
    assert not w.append("e99", [b"x"], partition=0, offset=100, event_time=0.0)
    assert w.append("e0", [b"x"], partition=0, offset=101, event_time=0.0)
    assert (tmp_path / ".training-data.ids").stat().st_size < 600
    w.close()


@pytest.mark.parametrize(
    ("value", "folder", "rejected"),
    [
        ("math", "domain=math", False),
        ("text-adventure_v1.2", "domain=text-adventure_v1.2", False),
        (7, "domain=7", False),
        ("training-data.manifest.jsonl", "domain=training-data.manifest.jsonl", False),
        (None, "domain=_unset", False),
        ("../../outside", "domain=_rejected", True),
        ("/etc", "domain=_rejected", True),
        ("..", "domain=_rejected", True),
        (".hidden", "domain=_rejected", True),
        ("a/b", "domain=_rejected", True),
        ("a\\b", "domain=_rejected", True),
        ("x\x00y", "domain=_rejected", True),
        ("", "domain=_rejected", True),
        ("a=b", "domain=_rejected", True),
        (["math"], "domain=_rejected", True),
    ],
)
def test_partition_values_become_safe_hive_style_folder_names(
    value: object, folder: str, rejected: bool
) -> None:
    assert folder_for("domain", value) == (folder, rejected)


def test_path_traversal_through_the_partition_field_writes_nothing_outside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    metrics = Metrics()
    w = Writer.open(
        sink_settings(out, partition_by="domain", rotate_records=1),
        worker_id="w",
        topic="t",
        metrics=metrics,
    )
    values = ["math", "../escaped", "/tmp/abs", "..", "math", None]
    for i, value in enumerate(values):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder=value)
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not (tmp_path / "escaped").exists()
    assert metrics.paths_rejected._value.get() == 3
    folders = {p.name for p in out.iterdir() if p.is_dir()}
    assert folders == {"domain=math", "domain=_rejected", "domain=_unset"}
    assert len(list((out / "domain=_rejected").glob("training-data*"))) == 3
    assert sorted(all_lines(out)) == sorted(record(i) for i in range(6))


def test_retention_deletes_only_old_manifested_files(tmp_path: Path) -> None:
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=1, retention_files=2),
        worker_id="w",
        topic="t",
        metrics=Metrics(),
    )
    produce(w, 0, 6)
    assert len(w.sealed()) == 2
    w.close()
    entries = read_manifest(tmp_path, "training-data")
    present = [e.name for e in entries if (tmp_path / e.name).exists()]
    assert present == [entries[-2].name, entries[-1].name]
    assert (tmp_path / "training-data.jsonl").read_bytes() == record(5) + b"\n"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EACCES])
def test_a_disk_error_is_typed_counted_and_retried_without_a_torn_line(
    tmp_path: Path, faulty: Callable[..., FaultyOs], code: int
) -> None:
    metrics = Metrics()
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=3), worker_id="w", topic="t", metrics=metrics
    )
    produce(w, 0, 4)
    faulty(1, OSError(code, os.strerror(code)), times=3)
    w.append("e4", [record(4)], partition=0, offset=4, event_time=0.0)
    kind = {errno.ENOSPC: "no_space", errno.EIO: "io", errno.EACCES: "permission"}[code]
    for _ in range(3):
        with pytest.raises(SinkError) as info:
            w.flush()
        assert info.value.reason == kind and info.value.retriable
    w.flush()
    produce(w, 5, 8)
    w.close()
    assert all_lines(tmp_path) == [record(i) for i in range(8)]
    assert metrics.sink_errors.labels(kind)._value.get() == 3


def test_an_error_while_sealing_is_finished_by_the_next_call(
    tmp_path: Path, faulty: Callable[..., FaultyOs]
) -> None:
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=2), worker_id="w", topic="t", metrics=Metrics()
    )
    produce(w, 0, 2)
    faulty(4, OSError(errno.ENOSPC, "full"), times=1)
    with pytest.raises(SinkError):
        w.append("e2", [record(2)], partition=0, offset=2, event_time=0.0)
    produce(w, 2, 6)
    w.close()
    assert all_lines(tmp_path) == [record(i) for i in range(6)]


def test_two_writers_never_share_files(tmp_path: Path) -> None:
    w = Writer.open(sink_settings(tmp_path), worker_id="w1", topic="t", metrics=Metrics())
    with pytest.raises(ConfigError, match="in use by w1"):
        Writer.open(sink_settings(tmp_path), worker_id="w2", topic="t", metrics=Metrics())
    w.close()
    Writer.open(sink_settings(tmp_path), worker_id="w2", topic="t", metrics=Metrics()).close()


def test_a_refused_open_holds_nothing(tmp_path: Path) -> None:
    """Writer.open either returns a writer or raises without keeping the lock."""
    Writer.open(sink_settings(tmp_path), worker_id="w1", topic="t", metrics=Metrics()).close()
    with pytest.raises(ConfigError, match="belongs to topic 't'"):
        Writer.open(sink_settings(tmp_path), worker_id="w1", topic="other", metrics=Metrics())
    Writer.open(sink_settings(tmp_path), worker_id="w2", topic="t", metrics=Metrics()).close()


def test_unsafe_worker_ids_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Writer.open(sink_settings(tmp_path), worker_id="../w", topic="t", metrics=Metrics())


def sealed_names(out: Path) -> Iterator[str]:
    return (e.name for e in read_manifest(out, "training-data"))


def test_sealed_names_carry_time_sequence_and_worker(tmp_path: Path) -> None:
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=1, compression="gzip"),
        worker_id="pod-0",
        topic="t",
        metrics=Metrics(),
        clock=lambda: 1_700_000_000.0,
    )
    produce(w, 0, 3)
    w.close()
    assert list(sealed_names(tmp_path)) == [
        "training-data-20231114T221320Z-00000000-pod-0.jsonl.gz",
        "training-data-20231114T221320Z-00000001-pod-0.jsonl.gz",
    ]
    assert all_lines(tmp_path) == [record(i) for i in range(3)]


def test_a_new_epoch_seals_the_files_and_starts_the_offsets_over(tmp_path: Path) -> None:
    metrics = Metrics()
    w = Writer.open(sink_settings(tmp_path), worker_id="w1", topic="t", metrics=metrics)
    w.bind_topic("id-1")
    produce(w, 0, 5)
    w.new_epoch("id-2", "its topic id changed from id-1 to id-2")
    assert (w.offsets, w.checkpointed, w.epoch, w.topic_id) == ({}, {}, 1, "id-2")
    for i in range(3):  # the new topic's offsets start at 0 again
        w.append(f"n{i}", [record(100 + i)], partition=0, offset=i, event_time=0.0)
    w.append("e1", [record(1)], partition=0, offset=3, event_time=0.0)  # repeat: dropped
    w.close()
    [sealed] = read_manifest(tmp_path, "training-data")
    assert (sealed.reason, sealed.epoch, sealed.topic_id, sealed.records) == (
        "topic_reset",
        0,
        "id-1",
        5,
    )
    ckpt = read_checkpoint(tmp_path, "training-data")
    assert ckpt is not None
    assert (ckpt.epoch, ckpt.topic_id, ckpt.offsets) == (1, "id-2", {0: 3})
    assert ckpt.epoch_reason == "its topic id changed from id-1 to id-2"
    assert all_lines(tmp_path) == [record(i) for i in range(5)] + [
        record(100 + i) for i in range(3)
    ]
    assert metrics.files_rotated.labels("topic_reset")._value.get() == 1
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=3), worker_id="w1", topic="t", metrics=metrics
    )
    w.seal_all()
    w.close()
    assert [(e.epoch, e.topic_id) for e in read_manifest(tmp_path, "training-data")] == [
        (0, "id-1"),
        (1, "id-2"),
    ]


def test_a_crash_during_a_new_epoch_is_finished_by_doing_it_again(
    tmp_path: Path, faulty: Callable[..., FaultyOs]
) -> None:
    def before_reset(out: Path) -> Writer:
        w = Writer.open(sink_settings(out), worker_id="w", topic="t", metrics=Metrics())
        w.bind_topic("id-1")
        produce(w, 0, 6)
        return w

    w = before_reset(tmp_path / "count")
    counter = faulty(10**9)
    w.new_epoch("id-2", "reset")
    calls = counter.calls
    w.close()
    assert calls > 5
    for n in range(1, calls + 1):
        out = tmp_path / f"crash-{n}"
        w = before_reset(out)
        fake = faulty(n)
        with pytest.raises(Crash):
            w.new_epoch("id-2", "reset")
        abandon(w)
        fake.times = 0
        w = Writer.open(sink_settings(out), worker_id="w", topic="t", metrics=Metrics())
        if w.topic_id != "id-2":  # what the sink finds on its next start
            w.new_epoch("id-2", "reset")
        w.append("n0", [record(100)], partition=0, offset=0, event_time=0.0)
        w.close()
        assert all_lines(out) == [record(i) for i in range(6)] + [record(100)], f"call {n}"
        entries = read_manifest(out, "training-data")
        assert [(e.records, e.epoch) for e in entries] == [(6, 0)], f"call {n}"
        ckpt = read_checkpoint(out, "training-data")
        assert ckpt is not None and (ckpt.epoch, ckpt.offsets) == (1, {0: 0}), f"call {n}"
