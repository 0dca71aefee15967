"""Writers of one output sharing a directory (one sink.prefix per worker): where a
partition that moved resumes, and which record ids the new owner knows."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from stream_export.output.layout import (
    checkpoint_path,
    checkpointed_offsets,
    ids_path,
    read_checkpoint,
)
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from tests.support.sinkfiles import all_lines, record, sink_settings
from tests.support.writer_faults import Crash, FaultyOs, abandon, produce


def open_writer(out: Path, prefix: str, output: str | None = "sink", **fields: object) -> Writer:
    return Writer.open(
        sink_settings(out, prefix=prefix, **fields),
        worker_id=prefix,
        topic="t",
        metrics=Metrics(),
        output=output,
    )


def repeated(w: Writer) -> float | None:
    return w.metrics.registry.get_sample_value("stream_export_episodes_repeated_total")


def test_a_record_published_again_after_its_partition_moved_is_written_once(
    tmp_path: Path,
) -> None:
    """Issue 25 item 6: the assembler of a killed worker publishes its last episodes
    again (same id, later offset); the worker that took the partition over wrote
    each of them a second time, as its id log knew only its own ids."""
    a = open_writer(tmp_path, "a")
    a.append("x", [record(0)], partition=0, offset=5, event_time=0.0)
    a.flush()
    abandon(a)  # kill -9 after the checkpoint covered x
    b = open_writer(tmp_path, "b")
    assert checkpointed_offsets(tmp_path, "t", output="sink") == {0: 5}
    b.take_over({0})
    assert b.append("y", [record(1)], partition=0, offset=6, event_time=0.0)
    assert not b.append("x", [record(0)], partition=0, offset=9, event_time=0.0)
    assert repeated(b) == 1
    b.close()  # the partition moves back to a, restarted
    a = open_writer(tmp_path, "a")
    a.take_over({0})
    assert not a.append("y", [record(1)], partition=0, offset=12, event_time=0.0)
    a.close()
    assert all_lines(tmp_path, "a") + all_lines(tmp_path, "b") == [record(0), record(1)]


@pytest.mark.parametrize("window", [100_000, 3])
def test_the_new_owner_knows_exactly_the_ids_its_predecessor_checkpointed(
    tmp_path: Path, faulty: Callable[..., FaultyOs], window: int
) -> None:
    """Kill the first writer at every file-system call, the next takes the partition
    over: ids logged but not checkpointed (records it will write, not repeats)
    must not be taken, nor those of a compaction cut short (window 3 compacts every
    few flushes); the checkpointed ids in the window must be. Every record once."""
    n = 0
    while True:
        n += 1
        out = tmp_path / f"crash-{n}"
        a = open_writer(out, "a", dedupe_window=window)
        fake = faulty(n)
        try:
            produce(a, 0, 14)
        except Crash:
            pass
        else:
            break
        finally:
            abandon(a)
            fake.times = 0
        b = open_writer(out, "b", dedupe_window=window)
        b.take_over({0})
        start = checkpointed_offsets(out, "t", output="sink").get(0, -1) + 1
        produce(b, start, 14)
        again = range(max(0, start - window), start)
        for offset, i in enumerate(again, 14):
            assert not b.append(f"e{i}", [record(i)], partition=0, offset=offset, event_time=0.0)
        b.close()
        open_writer(out, "a", dedupe_window=window).close()  # restarted: its files recovered
        got = all_lines(out, "a") + all_lines(out, "b")
        assert sorted(got) == sorted(record(i) for i in range(14)), f"crash at call {n}"
    assert n > 30  # the run made that many file-system calls


def test_only_the_same_output_and_the_partitions_taken_over_count(tmp_path: Path) -> None:
    """A sibling output of the topic (the group outputs share one) has other records
    under the same ids; the ids of partitions not held are let go."""
    for prefix, output, partition in [("g1", "groups-sink", 0), ("r1", "rollouts-sink", 1)]:
        w = open_writer(tmp_path, prefix, output)
        w.append(f"{prefix}-p{partition}", [record(0)], partition=partition, offset=0, event_time=0)
        w.append(f"{prefix}-p2", [record(1)], partition=2, offset=0, event_time=0.0)
        w.close()
    g2 = open_writer(tmp_path, "g2", "groups-sink")
    g2.take_over({0, 1})
    assert not g2.append("g1-p0", [b"1"], partition=0, offset=1, event_time=0.0)
    assert g2.append("r1-p1", [b"2"], partition=1, offset=1, event_time=0.0)
    g2.take_over({2})  # a rebalance: partitions 0 and 1 went elsewhere
    assert not g2.append("g1-p2", [b"3"], partition=2, offset=1, event_time=0.0)
    assert g2.append("g1-p0", [b"4"], partition=0, offset=2, event_time=0.0)  # let go
    g2.close()
    off = open_writer(tmp_path, "g3", "groups-sink", dedupe_window=0)
    off.take_over({0, 1, 2})
    assert off.append("g1-p0", [b"5"], partition=0, offset=3, event_time=0.0)
    off.close()


def test_an_ids_log_without_partitions_still_counts(tmp_path: Path) -> None:
    """Lines of bare ids (written before partitions were logged) count for every
    partition, for their own writer and for one that takes a partition over."""
    old = open_writer(tmp_path, "old")
    old.close()
    (tmp_path / ".old.ids").write_bytes(b'["a","b"]\n')
    ckpt = read_checkpoint(tmp_path, "old")
    assert ckpt is not None
    ckpt.ids_length = 10
    checkpoint_path(tmp_path, "old").write_bytes(msgspec.json.encode(ckpt))
    old = open_writer(tmp_path, "old")
    assert not old.append("a", [b"1"], partition=3, offset=0, event_time=0.0)
    old.close()
    new = open_writer(tmp_path, "new")
    new.take_over({7})
    assert not new.append("b", [b"1"], partition=7, offset=0, event_time=0.0)
    new.close()


def test_shared_checkpoints_of_another_topic_incarnation_do_not_count(tmp_path: Path) -> None:
    for worker_id, topic_id, offset in [("w1", "id-1", 50), ("w2", "id-2", 7), ("w3", None, 9)]:
        w = Writer.open(
            sink_settings(tmp_path, prefix=f"p-{worker_id}"),
            worker_id=worker_id,
            topic="t",
            metrics=Metrics(),
        )
        if topic_id:
            w.bind_topic(topic_id)
        w.append("e", [record(0)], partition=0, offset=offset, event_time=0.0)
        w.close()
    assert checkpointed_offsets(tmp_path, "t") == {0: 50}
    assert checkpointed_offsets(tmp_path, "t", "id-2") == {0: 9}
    assert checkpointed_offsets(tmp_path, "other") == {}


def test_outputs_sharing_a_topic_resume_only_where_the_same_output_stopped(
    tmp_path: Path,
) -> None:
    """The group outputs of every worker sharing a directory read one topic: each
    resumes after its own output's furthest checkpoint, never a sibling's (which
    skipped the records the sibling wrote first and it had not)."""
    writers = [("w1", "groups-sink", 7), ("w1", "rollouts-sink", 10), ("w2", "groups-sink", 4)]
    for worker_id, output, offset in [*writers, ("w0", None, 2)]:
        w = Writer.open(
            sink_settings(tmp_path, prefix=f"{worker_id}.{output}"),
            worker_id=worker_id,
            topic="t",
            metrics=Metrics(),
            output=output,
        )
        w.append("e", [record(0)], partition=0, offset=offset, event_time=0.0)
        w.close()
    assert checkpointed_offsets(tmp_path, "t", output="groups-sink") == {0: 7}
    assert checkpointed_offsets(tmp_path, "t", output="rollouts-sink") == {0: 10}
    assert checkpointed_offsets(tmp_path, "t", output="kto-sink") == {0: 2}  # the unnamed one
    assert checkpointed_offsets(tmp_path, "t") == {0: 10}


def test_with_fsync_flush_the_id_log_is_on_disk_before_the_checkpoint_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a power loss the checkpoint must not name ids the log lost: a record
    published again would then be written twice."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    w = open_writer(tmp_path, "a", fsync="flush")
    w.append("x", [record(0)], partition=0, offset=5, event_time=0.0)
    synced.clear()
    w.flush()
    ids, checkpoint = ids_path(tmp_path, "a").name, checkpoint_path(tmp_path, "a").name
    assert ids in synced
    saved = next(i for i, name in enumerate(synced) if name.startswith(checkpoint))
    assert synced.index(ids) < saved, synced
    w.close()
