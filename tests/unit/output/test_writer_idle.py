"""An idle writer's flushes (every sink.flush_interval_ms, per output) save no
checkpoint: the same bytes again cost a write, a rename and an fsync each time,
most of an idle worker's CPU at the live loop's 20 ms."""

from __future__ import annotations

from pathlib import Path

from stream_export.output.layout import checkpoint_path, read_checkpoint
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from tests.support.sinkfiles import sink_settings


def fsyncs(metrics: Metrics) -> float:
    samples = [s for m in metrics.fsync_seconds.collect() for s in m.samples]
    return next(s.value for s in samples if s.name.endswith("_count"))


def test_a_flush_with_nothing_new_leaves_the_checkpoint_as_it_is(tmp_path: Path) -> None:
    metrics = Metrics()
    w = Writer.open(sink_settings(tmp_path), worker_id="w", topic="t", metrics=metrics)
    path = checkpoint_path(tmp_path, "training-data")
    w.append("a", [b"1"], partition=0, offset=0, event_time=0.0)
    w.flush()
    saved = path.stat().st_ino  # each save replaces the file (a new inode)
    syncs = fsyncs(metrics)
    for _ in range(3):
        w.flush()
    assert path.stat().st_ino == saved
    assert fsyncs(metrics) == syncs
    w.skip(0, 1)  # a source record done without output: a new offset to save
    w.flush()
    assert path.stat().st_ino != saved
    assert read_checkpoint(tmp_path, "training-data").offsets == {0: 1}  # type: ignore[union-attr]
    w.close()
